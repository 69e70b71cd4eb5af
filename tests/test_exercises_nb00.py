"""Notebook 00's checks, three ways: the course's answers pass, the learner's untouched ``None`` reads "not
answered yet", and plausible wrong answers fail."""

from __future__ import annotations

import pytest
from notebook_code import exercise

from course_utils.core.profiles import get_profile
from course_utils.exercises import nb00_setup as nb00

T4 = get_profile("colab-t4")
VALUES = {  # name in the notebook, its check, plausible wrong answers
    "profile_variable": (
        nb00.check_00_profile_variable,
        "00.1",
        ["course_profile", "PROFILE", "COURSE_CPU_PRECISION", "$COURSE_PROFILE", "cpu"],
    ),
    "completions_per_step": (
        nb00.check_00_completions_per_step,
        "00.2",
        [T4.per_device_train_batch_size, T4.gradient_accumulation_steps, T4.prompts_per_step,
         get_profile("gpu").effective_batch_size, "many"],
    ),
}


def test_00_the_wrong_answers_really_differ_from_the_right_one():
    assert T4.effective_batch_size not in VALUES["completions_per_step"][2]


@pytest.mark.parametrize("name", sorted(VALUES))
def test_00_solution_passes_and_stub_reads_not_answered(name, capsys):
    check, label, _ = VALUES[name]
    assert check(exercise("00", name)) is True
    assert capsys.readouterr().out.startswith(f"✅ {label} ")
    assert exercise("00", name, copy="notebooks") is None
    assert check(None) is False
    assert capsys.readouterr().out.startswith(f"⏳ {label} ")


@pytest.mark.parametrize(("name", "wrong"), [(n, w) for n, (_, _, ws) in VALUES.items() for w in ws])
def test_00_wrong_answers_fail(name, wrong, capsys):
    check, label, _ = VALUES[name]
    assert check(wrong) is False
    assert capsys.readouterr().out.startswith(f"❌ {label} ")
