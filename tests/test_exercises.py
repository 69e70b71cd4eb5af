"""The exercise checks: right answers pass, wrong and unanswered ones do not, and no check ever raises."""

from __future__ import annotations

import inspect

import pytest

from course_utils import exercises
from course_utils.profiles import get_profile


def _takes_only_the_answer(function) -> bool:
    required = [p for p in inspect.signature(function).parameters.values() if p.default is inspect.Parameter.empty]
    return len(required) == 1


# checks that also need context (a dataset, statistics) are tested beside their module
CHECKS = [
    f
    for name, f in inspect.getmembers(exercises, inspect.isfunction)
    if name.startswith("check_") and _takes_only_the_answer(f)
]


@pytest.mark.parametrize("check", CHECKS, ids=lambda f: f.__name__)
def test_unanswered_exercise_is_reported_not_failed(check, capsys):
    assert check(None) is False
    assert "not answered" in capsys.readouterr().out


@pytest.mark.parametrize("check", CHECKS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("wrong", ["nonsense", -987654, object()])
def test_wrong_answers_fail_without_raising(check, wrong):
    assert check(wrong) is False


def test_setup_exercises_accept_the_right_answers():
    assert exercises.check_00_profile_variable("COURSE_PROFILE")
    assert exercises.check_00_completions_per_step(get_profile("colab-t4").effective_batch_size)


def test_close_to_handles_non_numbers():
    assert exercises.close_to("3.0", 3) and not exercises.close_to("three", 3) and not exercises.close_to(None, 3)
