"""Model loading: how long the offline model takes to load once it is materialized (target: under 2 s).

Prints `name: value` lines. Run with `make bench` or `python benchmarks/bench_models.py`.
"""

from __future__ import annotations

import time

from course_utils.lesson.models import load_model_and_tokenizer
from course_utils.lesson.offline_model import materialize_offline_model


def main() -> None:
    started = time.perf_counter()
    materialize_offline_model()
    print(f"model_materialize_seconds: {time.perf_counter() - started:.2f}")
    started = time.perf_counter()
    load_model_and_tokenizer("cpu")  # the first load in a process also imports the model classes
    print(f"model_load_seconds_first_in_process: {time.perf_counter() - started:.2f}")
    started = time.perf_counter()
    load_model_and_tokenizer("cpu")
    print(f"model_second_load_seconds: {time.perf_counter() - started:.2f}")


if __name__ == "__main__":
    main()
