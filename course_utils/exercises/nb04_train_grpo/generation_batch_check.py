"""04.8: the learner's ``generation_batch`` function run next to ``training.check_generation_batch`` on sizes that
form whole groups, sizes that do not, and sizes that are no sizes at all.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from course_utils.exercises.comparison import Case, check_against_reference
from course_utils.exercises.verdicts import hand_back
from course_utils.training.grpo_config import check_generation_batch


def generation_batch_cases() -> list[Case]:
    """Sizes that form whole groups, sizes that do not, and sizes that are no sizes at all."""
    return [
        Case("the golden config: 8 x 16, groups of 8", (8, 16, 8)),
        Case("4 x 2, groups of 8", (4, 2, 8)),
        Case("the cpu lab: one pass of 8, groups of 8", (8, 1, 8)),
        Case("12 x 1, groups of 3", (12, 1, 3)),
        Case("the ci profile: 2 x 1, pairs", (2, 1, 2)),
        Case("4 x 3, pairs", (4, 3, 2)),
        Case("6 x 1, groups of 4: not whole groups", (6, 1, 4)),
        Case("3 x 3, groups of 2: not whole groups", (3, 3, 2)),
        Case("a group of one compares nothing", (8, 1, 1)),
        Case("batch 0", (0, 1, 2)),
        Case("accumulation 0", (4, 0, 2)),
        Case("a negative batch", (-4, 1, 2)),
        Case("two negative sizes whose product is positive", (-2, -2, 2)),
        Case("a negative group size", (4, 1, -2)),
    ]


def check_04_generation_batch(learner: Any) -> Callable[..., int]:
    """04.8: ``(batch, accumulation, num_generations) -> completions per round``, ValueError when unusable.

    Hands back the learner's function when it passed, else ``training.check_generation_batch``.
    """
    exercise = "04.8 generation batch"
    hint = ("return batch x accumulation; raise ValueError when that is not a multiple of num_generations, when "
            "num_generations < 2, or when a size is < 1")
    passed = check_against_reference(exercise, learner, check_generation_batch, generation_batch_cases(), hint=hint)
    return hand_back(exercise, passed, learner, check_generation_batch, "training.check_generation_batch")
