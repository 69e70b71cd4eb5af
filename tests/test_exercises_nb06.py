"""Notebook 06's checks: the batch size, the biggest memory saving, the diagnosis of a flat reward."""

from __future__ import annotations

from course_utils.exercises import nb06_troubleshooting as nb06


def test_value_checks_of_06_accept_the_right_answers():
    assert nb06.check_06_batch_size(2) and not nb06.check_06_batch_size(1)


def test_biggest_memory_saving_names_one_fix():
    from course_utils.training.memory import OOM_FIXES

    accepted = [
        label for label in OOM_FIXES if not label.startswith("all") and nb06.check_06_biggest_saving(label)
    ]
    assert len(accepted) == 1



# --- 06: diagnosing a flat reward from a log history ---------------------------------------------------


def flat_reward_cause(log_history):
    logs = [entry for entry in log_history if "reward" in entry][-5:]
    clipped = [e["completions/clipped_ratio"] for e in logs if "completions/clipped_ratio" in e]
    zero_std = [e["frac_reward_zero_std"] for e in logs if "frac_reward_zero_std" in e]
    if clipped and sum(clipped) / len(clipped) > 0.3:
        return "truncated"
    if zero_std and sum(zero_std) / len(zero_std) > 0.5:
        return "no_signal"
    return "ok"


def _diagnosis(log_history, window=5, truncation_first=True):
    logs = [entry for entry in log_history if "reward" in entry][-window:] if window else log_history

    def high(key, threshold):
        values = [e[key] for e in logs if key in e]
        return bool(values) and sum(values) / len(values) > threshold

    checks = [("truncated", "completions/clipped_ratio", 0.3), ("no_signal", "frac_reward_zero_std", 0.5)]
    for cause, key, threshold in checks if truncation_first else checks[::-1]:
        if high(key, threshold):
            return cause
    return "ok"


def test_check_06_flat_reward_cause(capsys):
    assert nb06.check_06_flat_reward_cause(flat_reward_cause)
    assert nb06.check_06_flat_reward_cause(_diagnosis)
    assert not nb06.check_06_flat_reward_cause(lambda h: _diagnosis(h, window=None))  # the whole run
    assert not nb06.check_06_flat_reward_cause(lambda h: _diagnosis(h, truncation_first=False))
    assert not nb06.check_06_flat_reward_cause(lambda log_history: "ok")
    assert "differs from the reference" in capsys.readouterr().out
    assert not nb06.check_06_flat_reward_cause("ok")


def test_flat_reward_check_takes_real_histories_too():
    history = [{"step": 1, "reward": 0.0, "completions/clipped_ratio": 1.0}]
    cases = nb06.flat_reward_cases(history)
    assert cases[-1].label == "real run 1" and cases[-1].args == (history,)
