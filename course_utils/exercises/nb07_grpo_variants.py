"""Notebook 07 (GRPO variants): the off-policy switch, the length-unbiased loss, a difference or noise."""

from __future__ import annotations

from typing import Any

from course_utils.evaluation.variants import real_difference
from course_utils.exercises.comparison import Case, check_against_reference, report


def check_07_off_policy_field(answer: Any) -> bool:
    """Which ``GRPOConfig`` field, set to 2, makes GSPO's sequence ratio (and clip-higher) change anything?"""
    text = answer.strip().strip("`'\"") if isinstance(answer, str) else ""
    hint = "on-policy every ratio is 1; the field that reuses each generation batch for several updates (μ)"
    return report("07.1 the off-policy switch", text == "num_iterations", hint, answer)


def check_07_constant_normaliser(answer: Any) -> bool:
    """Which ``loss_type`` divides the summed token losses by a constant (``max_completion_length``), not a count?"""
    text = answer.strip().strip("`'\"") if isinstance(answer, str) else ""
    hint = "the variant named after the paper that diagnosed GRPO's length bias (read TRL's loss_type help)"
    return report("07.2 the length-unbiased constant", text == "dr_grpo", hint, answer)


def difference_cases() -> list[Case]:
    """Per-seed values of two variants: clear gaps, overlaps, ties, single seeds (no verdict from one seed)."""
    pairs = [
        ([0.9, 1.0], [0.4, 0.5]),
        ([0.4, 0.5], [0.9, 1.0]),
        ([0.4, 0.9], [0.5, 0.6]),
        ([0.5, 0.6], [0.6, 0.7]),
        ([0.5, 0.5], [0.5, 0.5]),
        ([1.0], [0.0]),
        ([0.1, 0.2, 0.3], [0.31, 0.5, 0.4]),
        ([0.02, 0.0], [0.04, 0.06]),
    ]
    return [Case(f"{a} vs {b}", (a, b)) for a, b in pairs]


def check_07_real_difference(learner: Any) -> bool:
    """The learner's ``is_real(first, second)``: do two variants' seeds not overlap (at least 2 seeds each)?"""
    hint = "a difference is real only when every seed of one variant beats every seed of the other (2+ seeds each)"
    return check_against_reference(
        "07.3 difference or noise", learner, real_difference, difference_cases(), hint=hint, same=lambda a, b: a == b
    )
