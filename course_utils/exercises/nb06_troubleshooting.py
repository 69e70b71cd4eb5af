"""Notebook 06 (troubleshooting): the batch a preflight accepts, a flat reward's cause, the biggest memory saving.

06.2 is the diagnosis function the lesson is about: its check runs it next to ``monitoring.flat_reward_cause`` on
log histories made for each diagnosis (including means that sit exactly on a threshold) and on the notebook's
runs, and hands back the function the notebook continues with. 06.1 and 06.3 are values.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from course_utils.exercises.comparison import Case, check_against_reference
from course_utils.exercises.verdicts import hand_back, report_name, report_number
from course_utils.training.memory import OOM_BASE, OOM_FIXES, what_if_table
from course_utils.training.monitoring import THRESHOLDS, WINDOW, flat_reward_cause
from course_utils.training.preflight import check


def check_06_batch_size(answer: Any) -> bool:
    """06.1: the smallest ``per_device_train_batch_size`` for ``gradient_accumulation_steps=3`` and 6 generations."""
    def accepted(batch: int) -> bool:
        config = {"per_device_train_batch_size": batch, "gradient_accumulation_steps": 3, "num_generations": 6}
        return "batch-not-divisible" not in {f.code for f in check(config, hardware={"device": "cuda", "bf16": True})}

    expected = next(b for b in range(1, 100) if accepted(b))
    hint = "the generation batch is batch x accumulation steps; it must be a multiple of num_generations"
    return report_number("06.1 smallest batch", answer, expected, hint)


def _log_history(steps: int = 10, **series: list[float]) -> list[dict[str, Any]]:
    """A ``trainer.state.log_history``: one entry per step with the given metrics, then the run's summary."""
    logs = [{"step": i + 1, "reward": 0.0} | {key: values[i] for key, values in series.items()} for i in range(steps)]
    return [*logs, {"step": steps, "train_runtime": 12.5, "train_loss": 0.0}]


ON_CLIPPED = [0.5, 0.25, 0.0, 0.5, 0.25] * 2  # every window of 5 consecutive steps: mean 1.5 / 5 = 0.3

# label, the metrics per step (10 steps unless the lists are shorter)
FLAT_REWARD_HISTORIES: tuple[tuple[str, dict[str, list[float]]], ...] = (
    ("healthy run", {"completions/clipped_ratio": [0.05] * 10, "frac_reward_zero_std": [0.1] * 10}),
    ("every completion cut off", {"completions/clipped_ratio": [1.0] * 10, "frac_reward_zero_std": [1.0] * 10}),
    ("equal groups, none cut off", {"completions/clipped_ratio": [0.0] * 10, "frac_reward_zero_std": [0.9] * 10}),
    (
        "cut off early, fine later",
        {"completions/clipped_ratio": [1.0] * 5 + [0.0] * 5, "frac_reward_zero_std": [0.2] * 10},
    ),
    ("signal lost late", {"completions/clipped_ratio": [0.0] * 10, "frac_reward_zero_std": [0.0] * 5 + [1.0] * 5}),
    ("clipped 35%, equal groups 45%", {"completions/clipped_ratio": [0.35] * 10, "frac_reward_zero_std": [0.45] * 10}),
    ("clipped 25%, equal groups 55%", {"completions/clipped_ratio": [0.25] * 10, "frac_reward_zero_std": [0.55] * 10}),
    ("clipped 40%, equal groups 60%", {"completions/clipped_ratio": [0.4] * 10, "frac_reward_zero_std": [0.6] * 10}),
    ("clipped ratio never logged", {"frac_reward_zero_std": [0.8] * 10}),
    ("three steps only", {"completions/clipped_ratio": [0.0] * 3, "frac_reward_zero_std": [0.6] * 3}),
    ("only the reward logged", {}),
    ("cut off five steps from the end", {"completions/clipped_ratio": [0.0] * 5 + [1.0] + [0.25] * 4}),  # mean 0.4
    # means exactly on a threshold are not above it (values exact in binary, so every way of averaging agrees)
    ("clipped mean exactly 0.3", {"completions/clipped_ratio": ON_CLIPPED, "frac_reward_zero_std": [0.0] * 10}),
    ("equal groups mean exactly 0.5", {"completions/clipped_ratio": [0.0] * 10, "frac_reward_zero_std": [0.5] * 10}),
    ("clipped exactly 0.3, equal groups 0.75", {"completions/clipped_ratio": ON_CLIPPED,
                                                "frac_reward_zero_std": [0.75] * 10}),
    ("both exactly on their thresholds", {"completions/clipped_ratio": ON_CLIPPED, "frac_reward_zero_std": [0.5] * 10}),
)


def flat_reward_cases(*real_histories: Any) -> list[Case]:
    """Log histories made for each diagnosis, then any real ones (the notebook's runs)."""
    cases = [
        Case(label, (_log_history(min((len(v) for v in series.values()), default=10), **series),))
        for label, series in FLAT_REWARD_HISTORIES
    ]
    cases.append(Case("empty log history", ([],)))
    return cases + [Case(f"real run {i + 1}", (list(history),)) for i, history in enumerate(real_histories)]


def check_06_flat_reward_cause(learner: Any, *real_histories: Any) -> Callable[[Any], str]:
    """06.2: ``flat_reward_cause(log_history)`` against ``monitoring.flat_reward_cause``; hands back the one to use.

    The learner's function when it agrees on every case (``real_histories`` are the notebook's runs), else the
    package's.
    """
    exercise = "06.2 flat_reward_cause"
    hint = (
        f"keep the entries with a 'reward', the last {WINDOW}; 'truncated' if the mean completions/clipped_ratio "
        f"is above {THRESHOLDS['clipped_high']} (a mean exactly on it is not), else 'no_signal' if the mean "
        f"frac_reward_zero_std is above {THRESHOLDS['zero_std_high']}, else 'ok' (a metric never logged counts as fine)"
    )
    cases = flat_reward_cases(*real_histories)
    passed = check_against_reference(exercise, learner, flat_reward_cause, cases, hint=hint)
    return hand_back(exercise, passed, learner, flat_reward_cause, "monitoring.flat_reward_cause")


def check_06_biggest_saving(answer: Any) -> bool:
    """06.3: which single fix in ``memory.OOM_FIXES`` lowers the estimated peak memory of ``OOM_BASE`` the most?"""
    singles = {label: change for label, change in OOM_FIXES.items() if not label.startswith("all")}
    table = what_if_table(OOM_BASE, singles).drop(index="as configured")
    expected = str(table["total_gb"].idxmin())
    hint = "run what_if_table(OOM_BASE, OOM_FIXES) and compare total_gb; answer with the row's label"
    return report_name("06.3 biggest memory saving", answer, {expected}, hint)
