"""Notebook 00's checks."""

from __future__ import annotations

from course_utils.core.profiles import get_profile
from course_utils.exercises import nb00_setup as nb00


def test_setup_exercises_accept_the_right_answers():
    assert nb00.check_00_profile_variable("COURSE_PROFILE")
    assert nb00.check_00_completions_per_step(get_profile("colab-t4").effective_batch_size)
