"""Notebook 00 (set-up): the profile variable and the completions one optimizer step trains on."""

from __future__ import annotations

from typing import Any

from course_utils.core.profiles import get_profile
from course_utils.exercises.comparison import close_to, report


def check_00_profile_variable(answer: Any) -> bool:
    """Which environment variable chooses the hardware profile?"""
    correct = isinstance(answer, str) and answer.strip() == "COURSE_PROFILE"
    return report("00.1 profile variable", correct, "look at course_utils.core.profiles.PROFILE_ENV_VAR", answer)


def check_00_completions_per_step(answer: Any) -> bool:
    """How many completions does one optimizer step of the ``colab-t4`` profile train on?"""
    expected = get_profile("colab-t4").effective_batch_size
    return report(
        "00.2 completions per step",
        close_to(answer, expected),
        "per-device batch x gradient accumulation steps (see profiles_table())",
        answer,
    )
