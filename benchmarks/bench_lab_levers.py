"""The `cpu` lab's levers, each measured on its own: one whole lab run per lever, the others as the profile has them.

A lever that changes what is computed (the completion cap, the group size, the generation batch, the warm start,
the generation path) changes the run, so each is timed and its training signal read beside the unchanged lab's:

- ``baseline``: the `cpu` profile as it is;
- ``cap_64``: ``max_completion_length=64`` instead of 96 (generation runs until the longest row stops);
- ``two_grpo``: ``num_generations=2`` with the same 8 completions a step, so 4 prompts a step ("It Takes Two");
- ``generation_batch_32``: ``steps_per_generation=4``: 32 completions generated at once, spread over 4 steps;
- ``warm_start_64``: 64 warm-start examples instead of 32;
- ``continuous_batching``: ``use_transformers_continuous_batching=True``: TRL generates through transformers'
  ``generate_batch`` (paged attention, rows refilled as they finish) instead of ``generate``, so the plug-in's group
  generation does not run.

For each, ``lever_{name}_minutes`` (warm start made afresh + GRPO), ``_warm_start_seconds``, ``_step_seconds``
(the mean optimizer step, 8 completions), ``_mean_length_first_fifth`` / ``_last_fifth`` (completion tokens),
``_correct_first_fifth`` / ``_last_fifth`` (the share of completions the correctness reward called right) and
``_varied_steps`` (steps whose completions were not all alike in correctness: with several groups a step, a group
may still be all alike). The last three are read per generation round: with a generation batch of 32, one logged
round holds four steps' completions. Training signal only: whether a lever helps held-out solving is ``make
bench-heldout``'s question. About 45 minutes on 2 cores: ``make bench-levers`` writes
``benchmarks/results_levers.txt``; ``--levers cap_64 two_grpo`` runs some.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import sys
from collections.abc import Mapping, Sequence
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from course_utils import cpu_speed
from course_utils.core.profiles import get_profile
from course_utils.training import lab, monitoring, run_logs, trained_model

# name -> (profile changes, GRPOConfig overrides)
LEVERS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "baseline": ({}, {}),
    "cap_64": ({"max_completion_length": 64}, {}),
    "two_grpo": ({"num_generations": 2}, {}),
    "generation_batch_32": ({}, {"steps_per_generation": 4}),
    "warm_start_64": ({"warm_start_examples": 64}, {}),
    "continuous_batching": ({}, {"use_transformers_continuous_batching": True}),
}
# The CPU plug-in (appendix 99), as the lab trains; COURSE_CPU_SPEEDUPS=0 turns it off
SPEEDUPS = cpu_speed


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--levers", nargs="+", default=list(LEVERS), choices=list(LEVERS))
    return parser.parse_args()


def fifths(values: Sequence[float]) -> tuple[float, float]:
    """The mean of the first fifth of ``values`` and of the last fifth (at least one value each)."""
    if not values:
        raise ValueError("no values: the run logged no steps")
    size = max(1, len(values) // 5)
    return statistics.fmean(values[:size]), statistics.fmean(values[-size:])


def lever_lines(
    name: str, warm_seconds: float, train_seconds: float, history: Sequence[Mapping[str, Any]]
) -> list[str]:
    """One lever's lines from its run: times, completion lengths, the correct share and the steps with signal."""
    lengths = [float(entry["completions/mean_length"]) for entry in run_logs.training_logs(history)]
    figures = monitoring.lab_figures(history)
    lines = [f"lever_{name}_minutes: {(warm_seconds + train_seconds) / 60:.1f}",
             f"lever_{name}_warm_start_seconds: {warm_seconds:.0f}",
             f"lever_{name}_step_seconds: {train_seconds / len(run_logs.step_logs(history)):.2f}"]  # fmt: skip
    first, last = fifths(lengths)
    lines += [f"lever_{name}_mean_length_first_fifth: {first:.1f}", f"lever_{name}_mean_length_last_fifth: {last:.1f}"]
    lines += [f"lever_{name}_correct_first_fifth: {figures['correctness_first_fifth']:.3f}",
              f"lever_{name}_correct_last_fifth: {figures['correctness_last_fifth']:.3f}",
              f"lever_{name}_varied_steps: {figures['correctness_varied_steps']:.3f}"]  # fmt: skip
    return lines


def run_lever(name: str) -> list[str]:
    """One whole `cpu` lab with the lever applied, its warm start made afresh as a learner's first run makes it."""
    changes, overrides = LEVERS[name]
    profile = get_profile("cpu").override(**changes)
    shutil.rmtree(trained_model.warm_start_model_dir(trained_model.default_run_dir(profile)), ignore_errors=True)
    with contextlib.redirect_stdout(sys.stderr):  # the trainers' per-step log lines are not results
        result = lab.run_training(profile, speedups=SPEEDUPS, **overrides)
    return lever_lines(name, result.warm_start_seconds, result.train_seconds, result.trainer.state.log_history)


def main() -> None:
    args = parse_args()
    for name in args.levers:
        changes, overrides = LEVERS[name]
        print(f"lever_{name}_settings: {({**changes, **overrides}) or 'the cpu profile as it is'}", flush=True)
        print("\n".join(run_lever(name)), flush=True)


if __name__ == "__main__":
    main()
