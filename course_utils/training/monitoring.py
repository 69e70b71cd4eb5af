"""The monitoring rules as code, read from a run's log history, and the lab's "did it learn" numbers.

- ``monitor`` / ``describe_findings``: the rules (reward_std, length jumps, KL, zero-std groups, clipping, a reward
  that rises without the task), each finding with what to do;
- ``flat_reward_cause``: why a reward stays flat (truncation, groups without signal), from those rules;
- ``reward_fifths`` / ``lab_figures``: the first fifth of the steps against the last (``make bench`` names them).

The log history itself (entries, saved and read back) lives in ``training.run_logs``; the live dashboard in
``training.run_callbacks``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import pairwise
from statistics import median
from typing import Any

from course_utils.core.findings import Finding
from course_utils.lesson.rewards.corrected import CORRECT_REWARD
from course_utils.training.run_logs import training_logs

# --- Monitoring rules -------------------------------------------------------------------------------

THRESHOLDS: dict[str, float] = {
    "reward_std_low": 0.1,  # mean reward_std (over the whole batch) below this: converged, or no signal
    "length_jump_ratio": 1.5,  # mean completion length jumps to 1.5x the recent median...
    "length_jump_tokens": 10.0,  # ...and by at least this many tokens
    "kl_rise_fraction": 0.75,  # share of KL steps that go up, for a "steadily rising" KL
    "kl_rise_factor": 2.0,  # and the last KL at least this multiple of the first
    "zero_std_high": 0.5,  # mean frac_reward_zero_std over the window above this: groups without signal
    "clipped_high": 0.3,  # mean clipped ratio over the window above this: completions truncated
    "hack_reward_gain": 0.2,  # total reward up by at least this from the first third of the run to the last...
    "format_saturated": 0.9,  # every format reward's last-fifth mean at this share of its best: the tags are learned
    "correct_gain": 0.05,  # correct share up by less than this from the first fifth to the last: flat
    "format_climb": 0.25,  # ...or the format rewards together up by this share of their ceiling: learning the tags
    "collapse_length_ratio": 0.75,  # last-fifth mean length under this share of the first fifth's: shrinking
}
# ...and another reward rose by more than the course's five together (the task: a right answer, well formatted)
TASK_REWARD_COLUMNS = tuple(
    f"rewards/{name}/mean"
    for name in (
        "correctness_reward_func",
        "int_reward_func",
        "strict_format_reward_func",
        "soft_format_reward_func",
        "xmlcount_reward_func",
    )
)
WINDOW = 5


def _finding(rule: str, step: int, message: str, advice: str) -> Finding:
    """A monitoring rule's finding: a warning about the run at ``step`` (the rule's name is its code)."""
    return Finding("warning", rule, message, advice, step=step)


def _series(logs: list[dict[str, Any]], key: str) -> list[tuple[int, float]]:
    return [(int(e.get("step", i + 1)), float(e[key])) for i, e in enumerate(logs) if e.get(key) is not None]


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def _recent(logs: list[dict[str, Any]], key: str) -> tuple[int, float] | None:
    """The last logged step of ``key`` and its mean over the last ``WINDOW`` logs (None when never logged)."""
    series = _series(logs, key)[-WINDOW:]
    return (series[-1][0], _mean([v for _, v in series])) if series else None


def _check_reward_std(logs: list[dict[str, Any]]) -> list[Finding]:
    """``reward_std`` is the std over the whole batch (every completion of every prompt), not within a group.

    A low batch std means nearly every completion of the step scored alike; whether the *groups* carry a signal
    is ``frac_reward_zero_std`` (the share of completions whose group has zero std), so the finding quotes it.
    """
    recent = _recent(logs, "reward_std")
    if recent is None or recent[1] >= THRESHOLDS["reward_std_low"]:
        return []
    step, reward_std = recent
    reward = _mean([v for _, v in _series(logs, "reward")[-WINDOW:]])
    zero_std = _recent(logs, "frac_reward_zero_std")
    groups = (
        f"; frac_reward_zero_std is {zero_std[1]:.0%}: that share of completions sit in groups whose rewards are "
        "all equal (no learning signal)"
        if zero_std is not None
        else "; frac_reward_zero_std (the within-group signal) was not logged"
    )
    return [
        _finding(
            "reward_std_low",
            step,
            f"reward_std is {reward_std:.3f} (< {THRESHOLDS['reward_std_low']}) with mean reward {reward:.2f}: "
            f"almost every completion in the batch scores the same{groups}",
            "a high reward with a flat correct share is not convergence: read the completions for a collapse "
            "(the collapse rule); a low one has no signal: warm-start the format, use a denser reward or a higher "
            "temperature",
        )
    ]


def _check_length_jump(logs: list[dict[str, Any]]) -> list[Finding]:
    series = _series(logs, "completions/mean_length")
    for i in range(3, len(series)):
        step, value = series[i]
        before = median(v for _, v in series[max(0, i - WINDOW) : i])
        if value >= THRESHOLDS["length_jump_ratio"] * before and value - before >= THRESHOLDS["length_jump_tokens"]:
            return [
                _finding(
                    "length_jump",
                    step,
                    f"mean completion length jumped from ~{before:.0f} to {value:.0f} tokens",
                    "a sudden change of behaviour (collapse, rambling or repetition): read the completions, "
                    "lower the learning rate",
                )
            ]
    return []


def _check_kl(logs: list[dict[str, Any]]) -> list[Finding]:
    series = [(s, v) for s, v in _series(logs, "kl")]
    if len(series) < 4:
        return []
    values = [v for _, v in series]
    rises = sum(b > a for a, b in pairwise(values)) / (len(values) - 1)
    grows = values[-1] > THRESHOLDS["kl_rise_factor"] * max(values[0], 1e-4)
    if rises >= THRESHOLDS["kl_rise_fraction"] and grows:
        return [
            _finding(
                "kl_rising",
                series[-1][0],
                f"kl rose steadily from {values[0]:.4f} to {values[-1]:.4f}",
                "the policy drifts away from the reference: lower the learning rate (or raise beta)",
            )
        ]
    return []


def _recent_above_threshold(
    logs: list[dict[str, Any]], key: str, rule: str, message: str, advice: str
) -> list[Finding]:
    """A ``rule`` finding when the recent mean of ``key`` exceeds ``THRESHOLDS[rule]`` (``message`` gets ``value``)."""
    recent = _recent(logs, key)
    if recent is None or recent[1] <= THRESHOLDS[rule]:
        return []
    step, value = recent
    return [_finding(rule, step, message.format(value=value), advice)]


def _check_zero_std(logs: list[dict[str, Any]]) -> list[Finding]:
    return _recent_above_threshold(
        logs,
        "frac_reward_zero_std",
        "zero_std_high",
        "{value:.0%} of the groups have identical rewards (frac_reward_zero_std)",
        "those groups give no learning signal: warm-start the format, a denser reward, more completions "
        "per group or a higher temperature",
    )


def _check_clipped(logs: list[dict[str, Any]]) -> list[Finding]:
    return _recent_above_threshold(
        logs,
        "completions/clipped_ratio",
        "clipped_high",
        "{value:.0%} of the completions hit max_completion_length (clipped ratio)",
        "truncated completions lose their </answer>: raise max_completion_length or teach shorter answers",
    )


def _check_reward_without_task(logs: list[dict[str, Any]]) -> list[Finding]:
    """The total reward rises, mostly through a reward outside the task: a bonus is being gamed.

    Fires when a reward outside the task rose by more than the task's rewards together: the policy found a
    cheaper way to earn than solving the problem. Compares the first third of the logged steps with the last
    third (at least 6 logs), so one lucky step does not fire it. The task is the course's five rewards
    (``TASK_REWARD_COLUMNS``); a run with only those never fires.
    """
    rewards = _series(logs, "reward")
    columns = sorted({k for e in logs for k in e if k.startswith("rewards/") and k.endswith("/mean")})
    task = [c for c in columns if c in TASK_REWARD_COLUMNS]
    others = [c for c in columns if c not in TASK_REWARD_COLUMNS]
    if len(rewards) < 6 or not task or not others:
        return []
    third = len(rewards) // 3

    def gain(key: str) -> float:
        values = [v for _, v in _series(logs, key)]
        return _mean(values[-third:]) - _mean(values[:third])

    reward_gain, task_gain = gain("reward"), sum(gain(c) for c in task)
    grower = max(others, key=gain)
    if reward_gain < THRESHOLDS["hack_reward_gain"] or gain(grower) <= max(task_gain, 0.0):
        return []
    return [
        _finding(
            "reward_without_task",
            rewards[-1][0],
            f"the total reward rose by {reward_gain:+.2f} over the run and {grower.split('/')[1]} by "
            f"{gain(grower):+.2f}, more than the task rewards (the course's five) together, {task_gain:+.2f}: the "
            "policy earns its reward somewhere else",
            "suspect reward hacking: read the logged completions (log_completions=True), then gate or cap the "
            "reward that grows",
        )
    ]


# The format rewards (the course's four besides correctness) and the best each returns: saturated near it
FORMAT_REWARD_MAX = {
    "rewards/int_reward_func/mean": 0.5,
    "rewards/strict_format_reward_func/mean": 0.5,
    "rewards/soft_format_reward_func/mean": 0.5,
    "rewards/xmlcount_reward_func/mean": 0.5,
}
COLLAPSE_FIX = (
    "this is a collapse, not convergence: read the completions (training.collapse.collapse_report on the ones "
    "logged with log_completions=True). The format rewards pay a bare number in tags, and a warm start that reasons "
    "only some of the time lets GRPO drift to it: warm-start on reasoning the answer follows from "
    "(warm_start_reasoning='equations') until it writes it nearly every time (warm_start_epochs); the lab's "
    "moderate rate and strong KL (3e-4, beta=0.2) did not prevent it (notebook 06, section 9; make bench-collapse "
    "measures a change seed by seed)"
)


def _fifths(logs: list[dict[str, Any]], key: str) -> tuple[float, float] | None:
    values = [v for _, v in _series(logs, key)]
    if len(values) < 10:
        return None
    n = len(values) // 5
    return _mean(values[:n]), _mean(values[-n:])


def _check_collapse(logs: list[dict[str, Any]]) -> list[Finding]:
    """The format rewards saturate (or climb far) while the correct share stays flat and the completions shrink, or
    they saturate and the groups stop differing.

    The reward curve of such a run climbs and then flattens like a converged one; what it learned is the tags
    around a guess. A run held near its start (a KL penalty) may still be climbing at its last step, its reasoning
    already shrunk: that is the same drift, caught before the tags are at their ceiling. At least 10 logged steps,
    first fifth against last.
    """
    formats = {key: _fifths(logs, key) for key in FORMAT_REWARD_MAX}
    correct, length = _fifths(logs, CORRECTNESS_KEY), _fifths(logs, "completions/mean_length")
    if correct is None or length is None or any(f is None for f in formats.values()):
        return []
    saturated = all(f[1] >= THRESHOLDS["format_saturated"] * FORMAT_REWARD_MAX[k] for k, f in formats.items())
    learned_tags = not all(f[0] >= THRESHOLDS["format_saturated"] * FORMAT_REWARD_MAX[k] for k, f in formats.items())
    flat = correct[1] - correct[0] < THRESHOLDS["correct_gain"] * CORRECT_REWARD
    ceiling = sum(FORMAT_REWARD_MAX.values())
    pairs = [f for f in formats.values() if f is not None]
    before, after = sum(f[0] for f in pairs), sum(f[1] for f in pairs)
    climbed = after - before >= THRESHOLDS["format_climb"] * ceiling
    shrank = length[1] < THRESHOLDS["collapse_length_ratio"] * length[0]
    no_signal = (_fifths(logs, "frac_reward_zero_std") or (0.0, 0.0))[1] > THRESHOLDS["zero_std_high"]
    # Groups alike count only in a run that climbed to the format: one that started there (a warm start that always
    # writes it) and kept its lengths has no signal to learn from (zero_std_high), which is not a collapse
    if not (flat and (((saturated or climbed) and shrank) or (saturated and no_signal and learned_tags))):
        return []
    tags = "saturated" if saturated else f"climbed ({before:.2f} -> {after:.2f} of their {ceiling:.1f})"
    zero_std = _fifths(logs, "frac_reward_zero_std")
    groups = f", {zero_std[1]:.0%} of the groups without signal" if zero_std else ""
    return [
        _finding(
            "collapse",
            _series(logs, "reward")[-1][0],
            f"the format rewards {tags} while the correct share stayed flat ({correct[0] / CORRECT_REWARD:.0%} "
            f"-> {correct[1] / CORRECT_REWARD:.0%}, first fifth to last) and the completions went from "
            f"{length[0]:.0f} to {length[1]:.0f} tokens{groups}: the model learned the tags around a guess",
            COLLAPSE_FIX,
        )
    ]


RULES = (
    _check_collapse,
    _check_reward_std,
    _check_length_jump,
    _check_kl,
    _check_zero_std,
    _check_clipped,
    _check_reward_without_task,
)


def monitor(log_history: Sequence[Mapping[str, Any]]) -> list[Finding]:
    """Apply the monitoring rules to a log history (``trainer.state.log_history`` or a CSV read back).

    Rules: ``collapse`` (format saturated or climbing, correctness flat, completions shrinking or alike),
    ``reward_std`` (the whole batch's std) under 0.1, a sudden completion-length jump, ``kl`` rising
    steadily, a high ``frac_reward_zero_std``, a high clipped ratio, the total reward rising without the task
    rewards (``reward_without_task``, a reward hack). An empty list means nothing to report.
    """
    logs = training_logs(log_history)
    return [finding for rule in RULES for finding in rule(logs)]


def describe_findings(findings: Sequence[Finding]) -> str:
    """The findings as readable lines (or a line saying all rules passed)."""
    if not findings:
        return "Monitoring: no rule fired (reward_std, length, kl, zero-std groups, clipping all look fine)."
    return "\n".join(["Monitoring findings:", *(f"  - {finding}" for finding in findings)])


def flat_reward_cause(log_history: Sequence[Mapping[str, Any]]) -> str:
    """Why a reward stays flat, from the last ``WINDOW`` training logs: ``"truncated"``, ``"no_signal"`` or ``"ok"``.

    Truncation first: completions cut off before ``</answer>`` all score alike, so it is the cause of the
    equal groups, not a second problem. A metric that was never logged counts as fine.
    """
    codes = {finding.code for finding in monitor(log_history)}
    if "clipped_high" in codes:
        return "truncated"
    if "zero_std_high" in codes:
        return "no_signal"
    return "ok"


# --- Reward summary for the lab ---------------------------------------------------------------------


CORRECTNESS_KEY = "rewards/correctness_reward_func/mean"
CORRECTNESS_STD_KEY = "rewards/correctness_reward_func/std"


def metric_fifths(log_history: Sequence[Mapping[str, Any]], key: str = "reward") -> tuple[float, float]:
    """Mean of a logged metric over the first and the last fifth of the steps that logged it (at least one each)."""
    values = [float(e[key]) for e in training_logs(log_history) if key in e]
    if not values:
        logged = sorted({k for e in training_logs(log_history) for k in e})
        raise ValueError(f"No training step logged {key!r}: did the run log anything? Logged: {logged}")
    n = max(1, len(values) // 5)
    return _mean(values[:n]), _mean(values[-n:])


def reward_fifths(log_history: Sequence[Mapping[str, Any]]) -> tuple[float, float]:
    """Mean total reward over the first and the last fifth of the logged steps (at least one step each)."""
    return metric_fifths(log_history, "reward")


def correct_share_fifths(log_history: Sequence[Mapping[str, Any]], right: float = 2.0) -> tuple[float, float]:
    """The share of completions the correctness reward called right, over the first and the last fifth of steps.

    The lab's correctness reward pays ``right`` (2.0) or 0, so its mean over a step divided by ``right`` is the
    share of that step's completions with the gold answer: what the lab learns to *solve*, apart from the format.
    """
    first, last = metric_fifths(log_history, CORRECTNESS_KEY)
    return first / right, last / right


def correct_share_per_step(log_history: Sequence[Mapping[str, Any]], right: float = 2.0) -> list[float]:
    """Each logged step's share of completions the correctness reward called right (its mean over ``right``)."""
    shares = [float(e[CORRECTNESS_KEY]) / right for e in training_logs(log_history) if CORRECTNESS_KEY in e]
    if not shares:
        raise ValueError(f"No training step logged {CORRECTNESS_KEY!r}: is correctness_reward_func among the "
                         "reward functions?")  # fmt: skip
    return shares


def varied_correctness_share(log_history: Sequence[Mapping[str, Any]]) -> float:
    """The share of steps whose completions were not all scored alike by the correctness reward.

    With one group a step (the ``cpu`` lab), that is the share of groups the correctness reward gives any
    advantage: ``1 - frac_reward_zero_std`` for correctness alone.
    """
    stds = [float(e[CORRECTNESS_STD_KEY]) for e in training_logs(log_history) if CORRECTNESS_STD_KEY in e]
    if not stds:
        raise ValueError(f"No training step logged {CORRECTNESS_STD_KEY!r}: is correctness_reward_func among the "
                         "reward functions?")  # fmt: skip
    return sum(std > 0 for std in stds) / len(stds)


def lab_figures(log_history: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """What a lab run showed, as ``make bench`` names it: reward and correct share, first fifth against last, and KL.

    ``kl_last`` is the last logged ``kl`` (NaN when ``beta`` was 0 and TRL logged none).
    """
    reward = reward_fifths(log_history)
    correct = correct_share_fifths(log_history)
    kl = [float(e["kl"]) for e in training_logs(log_history) if "kl" in e]
    return {
        "reward_first_fifth": reward[0],
        "reward_last_fifth": reward[1],
        "correctness_first_fifth": correct[0],
        "correctness_last_fifth": correct[1],
        "correctness_varied_steps": varied_correctness_share(log_history),
        "kl_last": kl[-1] if kl else float("nan"),
    }
