"""Speed of the data pipeline on the full GSM8K train split: prints ``name: value`` lines.

Run: ``GSM8K_DIR=../shared/data/gsm8k HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/bench_data.py``
(falls back to the bundled sample when GSM8K is not available).
"""

from __future__ import annotations

import time

from transformers import AutoTokenizer

from course_utils.lesson.data import load_gsm8k, measure_dataset_vs_dicts
from course_utils.lesson.data_checks import pitfall_report
from course_utils.lesson.formatting import format_gsm8k
from course_utils.lesson.offline_model import materialize_offline_model
from course_utils.lesson.token_lengths import token_length_stats


def seconds(function) -> float:
    started = time.perf_counter()
    function()
    return time.perf_counter() - started


def main() -> None:
    raw = load_gsm8k("train", verbose=False)
    print(f"rows: {len(raw)}")
    print(f"format_gsm8k_s: {seconds(lambda: format_gsm8k(raw)):.3f}")
    print(f"pitfall_report_s: {seconds(lambda: pitfall_report(raw)):.3f}")
    for row in measure_dataset_vs_dicts(raw, repeats=3):
        key = row["job"].replace(" ", "_").replace(",", "")
        print(f"{key}_dataset_s: {row['Dataset_s']:.5f}")
        print(f"{key}_dicts_s: {row['dicts_s']:.5f}")
    tokenizer = AutoTokenizer.from_pretrained(materialize_offline_model())
    print(f"token_length_stats_s: {seconds(lambda: token_length_stats(raw, tokenizer)):.3f}")


if __name__ == "__main__":
    main()
