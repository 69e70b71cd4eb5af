"""The verdicts every check prints: numbers taken as numbers only, and a hint that unfolds on the second try."""

from __future__ import annotations

import pytest

from course_utils.exercises import verdicts


def test_close_to_takes_numbers_only():
    """A string or a bool is not a number, however it reads: the answer is used as a number later."""
    assert verdicts.close_to(3.0, 3) and verdicts.close_to(3, 3)
    for not_a_number in ("3.0", "three", None, True, float("nan"), [3.0]):
        assert not verdicts.close_to(not_a_number, 3 if not_a_number is not True else 1), not_a_number


@pytest.mark.parametrize("answer", ["16", "1.5", False, True])
def test_report_number_names_the_kind_expected(answer, capsys):
    assert not verdicts.report_number("00.0 value", answer, float(answer), "hint")
    assert "a number was expected (an int, a float or a 0-d tensor, no quotes)" in capsys.readouterr().out


def test_the_hint_unfolds_on_the_second_failed_try(capsys, monkeypatch):
    """The first failure points to the collapsed hint; the second prints it; not answered yet prints none."""
    monkeypatch.setattr(verdicts, "_FAILED_TRIES", {})
    verdicts.report("00.9 value", False, "the secret hint", None)
    assert "secret" not in capsys.readouterr().out
    verdicts.report("00.9 value", False, "the secret hint", 3)
    first = capsys.readouterr().out
    assert "secret" not in first and verdicts.HINT_POINTER in first
    verdicts.list_problems("00.9 value", "differs", ["a case"], "the secret hint")
    assert "Hint: the secret hint" in capsys.readouterr().out


def _docstring_only():
    """A stub the learner has not filled in."""


def _dots_only():
    """A stub."""
    ...


def _pass_only():
    pass


@pytest.mark.parametrize("answer", [None, ..., _docstring_only, _dots_only, _pass_only], ids=repr)
def test_placeholders_read_unanswered(answer):
    assert verdicts.is_unanswered(answer)


@pytest.mark.parametrize("answer", [0, "", lambda text: 0, lambda text: None if text else 1, print], ids=repr)
def test_answers_that_do_something_are_answered(answer):
    assert not verdicts.is_unanswered(answer)


def test_hand_back_says_which_version_the_notebook_continues_with(capsys):
    assert verdicts.hand_back("00.1", True, "mine", "theirs", "ref") == "mine"
    assert "continues with yours" in capsys.readouterr().out
    assert verdicts.hand_back("00.1", False, "mine", "theirs", "ref") == "theirs"
    assert "continues with the package's ref" in capsys.readouterr().out


def test_field_differences_name_each_field_that_differs_or_is_missing():
    lines = verdicts.field_differences({"lr": 1e-5, "beta": 0.04, "extra": True}, {"lr": 1e-5, "beta": 0.0})
    assert lines == ["beta: yours 0.04, reference 0.0", "extra: yours True, reference '(not set)'"]


def test_shown_sorts_sets_and_cuts_long_values():
    assert verdicts.shown({"v_proj", "q_proj"}) == "['q_proj', 'v_proj']"
    long = verdicts.shown("x" * 200)
    assert len(long) == 70 and long.endswith("...")
