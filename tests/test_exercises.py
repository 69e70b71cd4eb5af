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


def test_precision_rule_accepts_a_right_rule_and_names_a_wrong_ones_cases(capsys):
    def right(capability, flags):
        native = capability == "AVX512" and bool({"avx512_bf16", "amx_bf16"} & flags)
        return "bf16" if native else "fp32"

    def flags_only(capability, flags):  # forgets that torch's AVX2 kernels emulate bf16
        return "bf16" if {"avx512_bf16", "amx_bf16"} & flags else "fp32"

    def crashes(capability, flags):
        raise KeyError(capability)

    assert exercises.check_99_precision_rule(right)
    assert not exercises.check_99_precision_rule(flags_only)
    assert "AVX2 with ['avx2', 'avx512_bf16', 'avx512f']: yours 'bf16'" in capsys.readouterr().out
    assert not exercises.check_99_precision_rule(lambda capability, flags: "fp32")
    assert not exercises.check_99_precision_rule(crashes)
    assert not exercises.check_99_precision_rule(lambda capability, flags: ...)
    assert "not answered" in capsys.readouterr().out
