"""Notebook 00 (set-up): the profile variable and the completions one optimizer step trains on (values)."""

from __future__ import annotations

from typing import Any

from course_utils.core.profiles import PROFILE_ENV_VAR, get_profile
from course_utils.exercises.verdicts import report_name, report_number


def check_00_profile_variable(answer: Any) -> bool:
    """00.1: which environment variable chooses the hardware profile?"""
    hint = "section 1 names it; the name is written in capitals, as environment variables are"
    return report_name("00.1 profile variable", answer, {PROFILE_ENV_VAR}, hint)


def check_00_completions_per_step(answer: Any) -> bool:
    """00.2: how many completions does one optimizer step of the ``colab-t4`` profile train on?"""
    expected = get_profile("colab-t4").effective_batch_size
    return report_number(
        "00.2 completions per step",
        answer,
        expected,
        "per-device batch x gradient accumulation steps: the effective batch of the colab-t4 profile",
    )
