"""Notebook 04 (training): the batch arithmetic of ``GRPOConfig`` and the monitoring rules.

The checks of the constructs written out in the lesson cells are in ``lesson_checks``.
"""

from __future__ import annotations

from typing import Any

from course_utils.exercises.comparison import Case, check_against_reference, close_to, report
from course_utils.training.monitoring import monitor
from course_utils.training.run import check_generation_batch


def check_04_prompts_per_step(answer: Any) -> bool:
    """Golden config: batch 8, accumulation 16, num_generations 8: how many distinct prompts per optimizer step?"""
    hint = "completions per step = batch x accumulation; each prompt fills one group of num_generations"
    return report("04.1 prompts per step", close_to(answer, 8 * 16 / 8), hint, answer)


def check_04_group_size_field(answer: Any) -> bool:
    """Which ``GRPOConfig`` field is the group size (completions sampled per prompt)?"""
    text = answer.strip().strip("`'\"") if isinstance(answer, str) else ""
    hint = "the field that says how many completions are generated for each prompt; TRL's default is 8"
    return report("04.2 group size field", text == "num_generations", hint, answer)


def generation_batch_cases() -> list[Case]:
    """Sizes that form whole groups, sizes that do not, and sizes that are no sizes at all."""
    return [
        Case("the golden config: 8 x 16, groups of 8", (8, 16, 8)),
        Case("4 x 2, groups of 8", (4, 2, 8)),
        Case("the cpu lab: one pass of 8, groups of 8", (8, 1, 8)),
        Case("12 x 1, groups of 3", (12, 1, 3)),
        Case("6 x 1, groups of 4: not whole groups", (6, 1, 4)),
        Case("3 x 3, groups of 2: not whole groups", (3, 3, 2)),
        Case("a group of one compares nothing", (8, 1, 1)),
        Case("batch 0", (0, 1, 2)),
        Case("accumulation 0", (4, 0, 2)),
    ]


def check_04_generation_batch(learner: Any) -> bool:
    """A function ``(batch, accumulation, num_generations) -> completions per round``; ValueError when unusable."""
    hint = ("return batch x accumulation; raise ValueError when that is not a multiple of num_generations, when "
            "num_generations < 2, or when a size is < 1")
    return check_against_reference(
        "04.4 generation batch", learner, check_generation_batch, generation_batch_cases(), hint=hint
    )


def check_04_monitoring_rule(answer: Any, log_history: Any) -> bool:
    """Which monitoring rule fires on ``log_history``? (a rule name such as ``"clipped_high"``)."""
    try:
        fired = {finding.code for finding in monitor(log_history)}
    except (TypeError, ValueError) as exc:
        print(f"⚠️ 04.3: could not read the log history ({exc}); pass the one the notebook built.")
        return False
    text = answer.strip() if isinstance(answer, str) else ""
    hint = "run monitor(log_history) and read the rule names, or look at the last columns of the frame"
    return report("04.3 monitoring rule", text in fired, hint, answer)
