"""Collapse, defined once (training.collapse) and named by the monitoring rules (training.monitoring)."""

from __future__ import annotations

import pytest

from course_utils.core.answer_format import format_answer
from course_utils.training import monitoring
from course_utils.training.collapse import (
    MAX_TOP_ANSWER_SHARE,
    collapse_report,
    first_fifth,
    holds_computation,
    last_fifth,
    reasoning_text,
)


def words(text: str) -> int:
    return len(text.split())


def reasoned(i: int) -> str:
    return format_answer(f"She has {i} apples and buys {i + 3} more, so {i} + {i + 3} = {2 * i + 3} apples in all.",
                         str(2 * i + 3))  # fmt: skip


COLLAPSED = format_answer("1", "1")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("48/2 = 24", True),
        ("3 x 4 = 12", True),
        ("$5 + $7", True),
        ("10-4", True),
        ("1", False),
        ("She sold some clips.", False),
        ("It costs 12 dollars.", False),
        ("", False),
    ],
)
def test_holds_computation(text: str, expected: bool) -> None:
    assert holds_computation(text) is expected


def test_reasoning_text_reads_the_block_or_what_comes_before_the_answer() -> None:
    assert reasoning_text(format_answer("a = 1 + 2", "3")) == "a = 1 + 2"
    assert reasoning_text("no tags here") == "no tags here"
    assert reasoning_text("2 + 2 = 4\n<answer>4</answer>") == "2 + 2 = 4"
    assert reasoning_text("<reasoning>\nunclosed 3*3") == "unclosed 3*3"


def test_varied_reasoned_completions_are_not_a_collapse() -> None:
    completions = [reasoned(i) for i in range(16)]
    report = collapse_report(completions, [f"p{i // 4}" for i in range(16)], words)
    assert not report.collapsed, report.summary()
    assert report.prompts == 4
    assert report.computation_share == 1.0
    assert report.top_answer_share == pytest.approx(1 / 16)
    assert report.summary().startswith("not collapsed")


def test_one_bare_answer_everywhere_is_a_collapse_on_every_measure() -> None:
    report = collapse_report([COLLAPSED] * 12, [f"p{i % 4}" for i in range(12)], words)
    assert report.collapsed
    assert report.top_answer == "1" and report.top_answer_share == 1.0
    assert report.median_reasoning_tokens == 1
    assert len(report.reasons) == 3, report.reasons
    assert "collapsed:" in report.summary()


def test_one_dominant_answer_alone_is_a_collapse() -> None:
    """Long, computed reasoning that always lands on the same answer still collapsed."""
    same = format_answer("She has 400 apples and buys 300 more, so 400 + 300 = 700 apples in all.", "700")
    share = MAX_TOP_ANSWER_SHARE + 0.1
    n_same = int(share * 20)
    completions = [same] * n_same + [reasoned(i) for i in range(20 - n_same)]
    report = collapse_report(completions, [f"p{i % 5}" for i in range(20)], words)
    assert report.collapsed
    assert report.reasons == [f"one answer in {n_same / 20:.0%} of the completions (over 30%)"]


def test_one_problem_in_the_window_cannot_judge_the_answer_share() -> None:
    """Eight right answers to the same problem are not one answer for every problem."""
    same = reasoned(2)
    report = collapse_report([same] * 8, ["p0"] * 8, words)
    assert not report.collapsed, report.reasons


def test_completions_without_an_answer_are_not_one_answer() -> None:
    """Cut or untagged completions give no answer: many of them is not a model that answers one thing."""
    completions = ["She has 4 apples and buys 7 more, so 4 + 7 ="] * 10 + [reasoned(i) for i in range(6)]
    report = collapse_report(completions, [f"p{i % 4}" for i in range(16)], words)
    assert not report.collapsed, report.reasons
    assert report.top_answer != "(none)" and report.top_answer_share == pytest.approx(1 / 16)
    assert "first fifth:" in report.summary("first fifth")


def test_short_reasoning_without_arithmetic_is_a_collapse() -> None:
    completions = [format_answer("I think so.", str(i)) for i in range(10)]
    report = collapse_report(completions, [f"p{i}" for i in range(10)], words)
    assert report.collapsed
    assert any("reasoning" in r for r in report.reasons)


def test_non_text_completions_count_as_empty() -> None:
    report = collapse_report([None, reasoned(1)], ["a", "b"], words)  # type: ignore[list-item]
    assert report.completions == 2


@pytest.mark.parametrize(("completions", "prompts", "match"), [([], [], "at least one"), (["a"], [], "pair up")])
def test_bad_input_is_refused(completions: list, prompts: list, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        collapse_report(completions, prompts, words)


def test_fifths_of_the_steps() -> None:
    steps = [1, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 10]
    assert [s for s, keep in zip(steps, last_fifth(steps), strict=True) if keep] == [9, 10, 10]
    assert [s for s, keep in zip(steps, first_fifth(steps), strict=True) if keep] == [1, 1, 2]
    assert last_fifth([3]) == [True]
    assert last_fifth([]) == first_fifth([]) == []


def history(lengths: list[float], correct: float = 0.0, fmt: float = 0.5, zero_std: float = 0.0) -> list[dict]:
    return [
        {"step": i + 1, "reward": 2.0, "reward_std": 0.3, "completions/mean_length": length,
         "frac_reward_zero_std": zero_std, monitoring.CORRECTNESS_KEY: correct,
         **dict.fromkeys(monitoring.FORMAT_REWARD_MAX, fmt)}
        for i, length in enumerate(lengths)
    ]


def collapse_codes(logs: list[dict]) -> list[str]:
    return [f.code for f in monitoring.monitor(logs) if f.code == "collapse"]


def test_monitor_names_a_collapse_when_format_saturates_and_completions_shrink() -> None:
    logs = history([50.0] * 5 + [40.0] * 10 + [24.0] * 5)
    findings = [f for f in monitoring.monitor(logs) if f.code == "collapse"]
    assert len(findings) == 1
    assert "50 to 24 tokens" in findings[0].message
    assert "not convergence" in findings[0].fix


def test_monitor_names_a_collapse_while_the_format_still_climbs_and_the_reasoning_shrinks() -> None:
    """A run held near its start by the KL: the tags not yet at their ceiling at the last step, the text already
    shrunk by a third, correctness flat (notebook 06's one-epoch warm start)."""
    logs = history([55.0] * 4 + [45.0] * 12 + [37.0] * 4)
    for i, entry in enumerate(logs):
        entry |= dict.fromkeys(monitoring.FORMAT_REWARD_MAX, 0.1 + 0.3 * i / 19)
    findings = [f for f in monitoring.monitor(logs) if f.code == "collapse"]
    assert len(findings) == 1 and "format rewards climbed" in findings[0].message
    assert "55 to 37 tokens" in findings[0].message


def test_monitor_names_a_collapse_when_groups_stop_differing() -> None:
    logs = history([40.0] * 20, zero_std=0.8)
    for entry in logs[:10]:  # the format rewards climbed: the run learned the tags
        entry |= dict.fromkeys(monitoring.FORMAT_REWARD_MAX, 0.1)
    assert collapse_codes(logs) == ["collapse"]


def test_a_run_that_started_with_the_format_and_kept_its_lengths_has_no_signal_not_a_collapse() -> None:
    """A warm start that always writes the format: many groups alike, from the start; the monitor says so."""
    logs = history([40.0] * 20, zero_std=0.8)
    assert collapse_codes(logs) == []
    assert "zero_std_high" in [f.code for f in monitoring.monitor(logs)]


@pytest.mark.parametrize(
    "logs",
    [
        history([50.0] * 20),  # format learned, lengths kept: not shrinking
        history([50.0] * 5 + [24.0] * 15, fmt=0.3),  # format neither saturated nor climbing
        [e | dict.fromkeys(monitoring.FORMAT_REWARD_MAX, 0.1 + 0.3 * e["step"] / 20)
         for e in history([50.0] * 20)],  # format climbing, lengths kept: learning the tags
        history([50.0] * 5 + [40.0] * 15),  # format learned, lengths down a fifth: not shrinking
        history([50.0] * 5 + [24.0] * 15)[:9],  # too few steps to judge
    ],
)
def test_monitor_does_not_call_a_healthy_or_short_run_a_collapse(logs: list[dict]) -> None:
    assert collapse_codes(logs) == []


def test_monitor_does_not_call_rising_correctness_a_collapse() -> None:
    logs = history([50.0] * 10 + [24.0] * 10)
    for entry in logs[-4:]:
        entry[monitoring.CORRECTNESS_KEY] = 1.0
    assert collapse_codes(logs) == []


def test_low_reward_std_advice_never_calls_it_convergence() -> None:
    logs = [dict(e, reward_std=0.01) for e in history([30.0] * 6)]
    finding = next(f for f in monitoring.monitor(logs) if f.code == "reward_std_low")
    assert "has converged" not in finding.fix
    assert "collapse" in finding.fix
