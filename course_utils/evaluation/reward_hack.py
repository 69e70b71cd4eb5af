"""A reward hack caught (notebook 07, ``scripts/variants.py``): a thoroughness bonus the policy can climb, and its fix.

``hack_rewards`` gives the course's five rewards plus the bonus, paid per word to any completion (exploitable) or
only to correct answers and capped (fixed); ``run_hack`` trains with them, completions logged (read them with
``variant_tables.logged_completions``); ``write_hack_results`` records the runs apart from the variants table.
"""

from __future__ import annotations

import csv
from collections.abc import Callable, Sequence
from pathlib import Path

import pandas as pd

from course_utils.core.profiles import Profile
from course_utils.core.speedups import NO_SPEEDUPS, SpeedUps
from course_utils.evaluation.variant_tables import curve_rows, logged_completions, results_table
from course_utils.evaluation.variants import StartingPoint, VariantRun, run_variant
from course_utils.lesson.rewards import REWARD_FUNCS
from course_utils.lesson.rewards.hacking import length_bonus_reward_func, paid_length_bonus_reward_func
from course_utils.training.grpo_config import resolve_reward_weights

HACK_RESULTS_CSV = "hack.csv"
HACK_LOGS_CSV = "hack_logs.csv"
HACK_COMPLETIONS_CSV = "hack_completions.csv"
HACK_TXT = "hack.txt"


def hack_rewards(fixed: bool = False) -> tuple[list[Callable[..., list[float]]], list[float]]:
    """The reward functions and weights of the reward-hack runs: the five rewards plus a thoroughness bonus.

    ``fixed=False``: ``length_bonus_reward_func``, paid per word to any completion (exploitable: write on past the
    limit); ``fixed=True``: ``paid_length_bonus_reward_func``, paid only to correct answers and capped.
    """
    bonus = paid_length_bonus_reward_func if fixed else length_bonus_reward_func
    return [*REWARD_FUNCS, bonus], [*resolve_reward_weights(None), 1.0]


def run_hack(
    fixed: bool = False,
    *,
    profile: Profile | str | None = None,
    seed: int = 0,
    max_steps: int | None = None,
    eval_size: int | None = None,
    start: StartingPoint | None = None,
    speedups: SpeedUps = NO_SPEEDUPS,
) -> VariantRun:
    """Train with the exploitable thoroughness bonus (``fixed=False``) or its fix, completions logged."""
    funcs, weights = hack_rewards(fixed)
    name = "hack_fixed" if fixed else "hack"
    return run_variant(
        name,
        {"loss_type": "dapo"},
        profile=profile,
        seed=seed,
        max_steps=max_steps,
        reward_funcs=funcs,
        reward_weights=weights,
        log_completions=True,
        eval_size=eval_size,
        start=start,
        speedups=speedups,
    )


def write_hack_results(runs: Sequence[VariantRun], folder: str | Path) -> list[Path]:
    """Record the hack runs in ``folder`` (notebook 07 reads these files); returns the paths written.

    ``hack.csv`` (one row per run), ``hack_logs.csv`` (every logged step) and ``hack_completions.csv`` (each run's
    first and last logged completions, read from its ``log_completions`` files).
    """
    if not runs:
        raise ValueError("write_hack_results needs at least one run")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    results_table(runs).to_csv(folder / HACK_RESULTS_CSV, index=False, quoting=csv.QUOTE_MINIMAL)
    curve_rows(runs).to_csv(folder / HACK_LOGS_CSV, index=False)
    samples = []
    for run in runs:
        logged = logged_completions(run.run_dir)
        ends = logged[logged["step"].isin([logged["step"].min(), logged["step"].max()])]
        samples.append(ends.drop(columns=["prompt"]).assign(variant=run.name))
    pd.concat(samples, ignore_index=True).to_csv(folder / HACK_COMPLETIONS_CSV, index=False)
    return [folder / HACK_RESULTS_CSV, folder / HACK_LOGS_CSV, folder / HACK_COMPLETIONS_CSV]
