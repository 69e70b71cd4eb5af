"""Notebook 06's checks, three ways each: the course's solution passes, the learner's stub reads "not answered
yet" (and the notebook continues with the package's function), and plausible wrong answers fail.

06.2 is the diagnosis of a flat reward; its bank has means exactly on each threshold, so ``>=`` for ``>`` fails.
"""

from __future__ import annotations

import pytest
from notebook_code import exercise

from course_utils.exercises import nb06_troubleshooting as nb06
from course_utils.training.memory import OOM_BASE, OOM_FIXES, memory_table, what_if_table
from course_utils.training.monitoring import flat_reward_cause as package_cause

# --- 06.1 and 06.3: values -------------------------------------------------------------------------------------

VALUES = {  # name in the notebook, its check, plausible wrong answers
    "smallest_batch": (nb06.check_06_batch_size, "06.1", [1, 3, 4, 6, "2"]),  # 3, 9 completions; not smallest; text
    "biggest_saving": (
        nb06.check_06_biggest_saving,
        "06.3",
        ["all: colab-t4 profile", "as configured", "batch 4 x accumulation 4", "Gradient checkpointing", 11.6],
    ),
}


@pytest.mark.parametrize("name", sorted(VALUES))
def test_06_values_solution_passes_and_stub_reads_not_answered(name, capsys):
    check, label, _ = VALUES[name]
    assert check(exercise("06", name)) is True
    assert capsys.readouterr().out.startswith(f"✅ {label} ")
    assert exercise("06", name, copy="notebooks") is None
    assert check(None) is False
    assert capsys.readouterr().out.startswith(f"⏳ {label} ")


@pytest.mark.parametrize(("name", "wrong"), [(n, w) for n, (_, _, ws) in VALUES.items() for w in ws])
def test_06_values_wrong_answers_fail(name, wrong, capsys):
    check, label, _ = VALUES[name]
    assert check(wrong) is False
    assert capsys.readouterr().out.startswith(f"❌ {label} ")


def test_06_3_exactly_one_single_fix_is_accepted():
    accepted = [label for label in OOM_FIXES if not label.startswith("all") and nb06.check_06_biggest_saving(label)]
    assert len(accepted) == 1


# --- 06.2: the diagnosis of a flat reward --------------------------------------------------------------------


def diagnosis(log_history, window=5, truncation_first=True, above=lambda mean, threshold: mean > threshold):
    """The right diagnosis, or one of the learner's slips (each keyword is one)."""
    logs = [entry for entry in log_history if "reward" in entry]
    logs = logs[-window:] if window else logs

    def high(key, threshold):
        values = [e[key] for e in logs if key in e]
        return bool(values) and above(sum(values) / len(values), threshold)

    checks = [("truncated", "completions/clipped_ratio", 0.3), ("no_signal", "frac_reward_zero_std", 0.5)]
    for cause, key, threshold in checks if truncation_first else checks[::-1]:
        if high(key, threshold):
            return cause
    return "ok"


def at_or_above(log_history):  # the wrong answer: >= for >
    return diagnosis(log_history, above=lambda mean, threshold: mean >= threshold)


def no_signal_first(log_history):
    return diagnosis(log_history, truncation_first=False)


def whole_run(log_history):  # the mean over every training entry, not the last five
    return diagnosis(log_history, window=None)


def last_five_entries_of_the_log(log_history):  # slices before keeping the training entries: the summary is one
    return diagnosis(log_history[-5:])


def missing_metric_crashes(log_history):
    logs = [entry for entry in log_history if "reward" in entry][-5:]
    clipped = sum(e["completions/clipped_ratio"] for e in logs) / max(len(logs), 1)
    zero_std = sum(e["frac_reward_zero_std"] for e in logs) / max(len(logs), 1)
    return "truncated" if clipped > 0.3 else "no_signal" if zero_std > 0.5 else "ok"


WRONG_CAUSES = {  # the slip, a case it must be caught on
    at_or_above: "clipped mean exactly 0.3",
    no_signal_first: "clipped 40%, equal groups 60%",
    whole_run: "cut off early, fine later",
    last_five_entries_of_the_log: "cut off five steps from the end",
    missing_metric_crashes: "clipped ratio never logged",
}


def test_06_2_solution_passes_and_is_handed_back(capsys):
    solution = exercise("06", "flat_reward_cause")
    assert nb06.check_06_flat_reward_cause(solution) is solution
    out = capsys.readouterr().out
    assert out.startswith("✅ 06.2 flat_reward_cause") and "continues with yours" in out
    assert nb06.check_06_flat_reward_cause(diagnosis) is diagnosis  # the tests' own version is right too


def test_06_2_stub_reads_not_answered_and_the_package_takes_over(capsys):
    stub = exercise("06", "flat_reward_cause", copy="notebooks")
    assert nb06.check_06_flat_reward_cause(stub) is package_cause
    out = capsys.readouterr().out
    assert out.startswith("⏳ 06.2 flat_reward_cause: not answered yet")
    assert "continues with the package's monitoring.flat_reward_cause" in out


@pytest.mark.parametrize("wrong", sorted(WRONG_CAUSES, key=lambda f: f.__name__), ids=lambda f: f.__name__)
def test_06_2_wrong_diagnoses_fail_naming_the_case(wrong, capsys):
    assert nb06.check_06_flat_reward_cause(wrong) is package_cause
    out = capsys.readouterr().out
    assert out.startswith("❌ 06.2 flat_reward_cause: differs from the reference")
    assert f"- {WRONG_CAUSES[wrong]}" in out


def test_06_2_at_or_above_fails_on_each_threshold():
    """``>=`` differs from the reference exactly where a mean sits on a threshold: on both thresholds."""
    differing = {c.label for c in nb06.flat_reward_cases() if at_or_above(*c.args) != package_cause(*c.args)}
    assert {"clipped mean exactly 0.3", "equal groups mean exactly 0.5"} <= differing
    assert all("exactly" in label for label in differing)


def test_06_2_a_string_or_the_package_s_own_function_is_not_an_answer(capsys):
    assert nb06.check_06_flat_reward_cause("ok") is package_cause
    assert nb06.check_06_flat_reward_cause(package_cause) is package_cause
    out = capsys.readouterr().out
    assert out.count("❌ 06.2 flat_reward_cause") == 2 and "the package's own" in out


def test_06_2_the_check_takes_real_histories_too():
    history = [{"step": 1, "reward": 0.0, "completions/clipped_ratio": 1.0}]
    cases = nb06.flat_reward_cases(history)
    assert cases[-1].label == "real run 1" and cases[-1].args == (history,)


def test_06_the_what_if_colab_t4_row_is_the_profile_s_run():
    """All fixes at once is the colab-t4 profile: its sizes (512 completion tokens), the memory table's figure."""
    row = what_if_table(OOM_BASE, OOM_FIXES).loc["all: colab-t4 profile"]
    profile_row = memory_table().iloc[0]
    assert profile_row["setup"].startswith("colab-t4 profile") and row["total_gb"] == profile_row["total_gb"]
    assert OOM_FIXES["all: colab-t4 profile"]["max_completion_length"] == 512
