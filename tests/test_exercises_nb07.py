"""Notebook 07's checks, each tested three ways: the course's solution passes (and 07.1's fields, 07.2's function are
handed back),
the learner's stub reads "not answered yet", and plausible wrong answers fail.

The solutions and stubs are the notebook's own cells (``notebook_code.exercise``).
"""

from __future__ import annotations

import numpy as np
import pytest
from notebook_code import exercise

from course_utils.core.profiles import get_profile
from course_utils.evaluation import variants
from course_utils.exercises import nb07_grpo_variants as nb07
from course_utils.lesson.multi_reward import gdpo_advantages

PROFILE = get_profile("ci")

# --- 07.1: DAPO's clip-higher as GRPOConfig fields, judged on the real config ------------------------------


def test_the_clip_higher_solution_passes_and_is_handed_back(capsys):
    solution = exercise("07", "clip_higher")
    assert nb07.check_07_clip_higher(solution, PROFILE) is solution
    out = capsys.readouterr().out
    assert "✅ 07.1 clip-higher as GRPOConfig fields:" in out
    assert "07.1 clip-higher as GRPOConfig fields: the notebook continues with yours." in out


def test_the_clip_higher_stub_reads_not_answered_and_the_package_fields_are_handed_back(capsys):
    stub = exercise("07", "clip_higher", copy="notebooks")
    assert stub is None
    assert nb07.check_07_clip_higher(stub, PROFILE) == variants.VARIANTS["clip_higher"]
    out = capsys.readouterr().out
    assert "⏳ 07.1 clip-higher as GRPOConfig fields: not answered yet." in out
    assert "continues with the package's variants.VARIANTS['clip_higher']." in out


RIGHT_CLIP_HIGHER = {
    "the package's fields": dict(variants.VARIANTS["clip_higher"]),
    "loss_type left at the profile's": {"num_iterations": 2, "epsilon_high": 0.28},
    "with log_completions": {"num_iterations": 2, "epsilon_high": 0.28, "log_completions": True},
    "the defaults written out": {"num_iterations": 2, "epsilon": 0.2, "epsilon_high": 0.28, "scale_rewards": "group"},
    "another looser upper end": {"loss_type": "dapo", "num_iterations": 2, "epsilon_high": 0.3},
}


@pytest.mark.parametrize("name", sorted(RIGHT_CLIP_HIGHER))
def test_sensible_clip_higher_fields_pass(name, capsys):
    fields = RIGHT_CLIP_HIGHER[name]
    assert nb07.check_07_clip_higher(fields, PROFILE) is fields
    assert "✅ 07.1" in capsys.readouterr().out


WRONG_CLIP_HIGHER = {  # (fields, what the verdict says)
    "on-policy": ({"epsilon_high": 0.28}, "num_iterations: yours 1, two_iterations 2: on-policy"),
    "the symmetric clip widened": ({"num_iterations": 2, "epsilon": 0.28}, "epsilon_high is not set"),
    "the upper end tighter": ({"num_iterations": 2, "epsilon_high": 0.18}, "epsilon_high 0.18 is not above epsilon"),
    "the lower end moved too": (
        {"num_iterations": 2, "epsilon_high": 0.28, "epsilon": 0.1},
        "epsilon: yours 0.1, two_iterations 0.2: that moves the lower end too",
    ),
    "another loss": ({"loss_type": "grpo", "num_iterations": 2, "epsilon_high": 0.28}, "loss_type: yours 'grpo'"),
    "three iterations": ({"num_iterations": 3, "epsilon_high": 0.28}, "num_iterations: yours 3, two_iterations 2"),
    "a misspelt field": ({"num_iterations": 2, "epsilon_hi": 0.28}, "GRPOConfig has no field(s) ['epsilon_hi']"),
    "no clip at all": ({"num_iterations": 2, "epsilon_high": 5.0}, "no clip at all"),
    "the upper end as text": ({"num_iterations": 2, "epsilon_high": "0.28"}, "not a number"),
    "a string, not a dict": ("epsilon_high=0.28", "expected a dict of GRPOConfig fields"),
}


@pytest.mark.parametrize("mistake", sorted(WRONG_CLIP_HIGHER))
def test_wrong_clip_higher_fields_fail_saying_why(mistake, capsys):
    fields, message = WRONG_CLIP_HIGHER[mistake]
    assert nb07.check_07_clip_higher(fields, PROFILE) == variants.VARIANTS["clip_higher"]
    out = capsys.readouterr().out
    assert "❌ 07.1 clip-higher as GRPOConfig fields: not yet:" in out
    assert message in out, out
    assert "continues with the package's variants.VARIANTS['clip_higher']." in out


# --- 07.2: GDPO's normalise-then-sum ----------------------------------------------------------------------


def test_the_gdpo_solution_passes_and_is_handed_back(capsys):
    solution = exercise("07", "normalize_then_sum")
    assert nb07.check_07_gdpo(solution) is solution
    out = capsys.readouterr().out
    assert "✅ 07.2 GDPO's normalise-then-sum: same result as the reference on all 7 cases." in out
    assert "07.2 GDPO's normalise-then-sum: the notebook continues with yours." in out


def test_the_gdpo_stub_reads_not_answered_and_the_package_function_is_handed_back(capsys):
    stub = exercise("07", "normalize_then_sum", copy="notebooks")
    assert nb07.check_07_gdpo(stub) is gdpo_advantages
    out = capsys.readouterr().out
    assert "⏳ 07.2 GDPO's normalise-then-sum: not answered yet" in out
    assert "continues with the package's multi_reward.gdpo_advantages." in out


def _groups(rewards, group_size):
    table = np.asarray(rewards, dtype=float)
    return table, table.reshape(-1, group_size, table.shape[1])


def _normalised(values, axis, ddof=1, epsilon=1e-4):
    spread = values.std(axis=axis, ddof=ddof, keepdims=True)
    return (values - values.mean(axis=axis, keepdims=True)) / (spread + epsilon)


def gdpo_in_loops(rewards, weights, group_size):  # plain Python, a list back
    rows = [list(map(float, row)) for row in rewards]
    columns = len(rows[0])
    totals = []
    for start in range(0, len(rows), group_size):
        group = rows[start : start + group_size]
        total = [0.0] * len(group)
        for k in range(columns):
            values = [row[k] for row in group]
            mean = sum(values) / len(values)
            std = (sum((v - mean) ** 2 for v in values) / (len(values) - 1)) ** 0.5
            total = [t + weights[k] * (v - mean) / (std + 1e-4) for t, v in zip(total, values, strict=True)]
        totals += total
    mean = sum(totals) / len(totals)
    std = (sum((t - mean) ** 2 for t in totals) / (len(totals) - 1)) ** 0.5
    return [(t - mean) / (std + 1e-4) for t in totals]


def test_gdpo_written_in_loops_returning_a_list_passes():
    assert nb07.check_07_gdpo(gdpo_in_loops) is gdpo_in_loops


def numpy_std(rewards, weights, group_size):  # NumPy's std divides by n
    table, groups = _groups(rewards, group_size)
    total = _normalised(groups, 1, ddof=0).reshape(table.shape) @ np.asarray(weights, dtype=float)
    return _normalised(total, 0, ddof=0)


def no_epsilon(rewards, weights, group_size):  # a reward constant in its group divides 0 by 0
    table, groups = _groups(rewards, group_size)
    total = _normalised(groups, 1, epsilon=0.0).reshape(table.shape) @ np.asarray(weights, dtype=float)
    return _normalised(total, 0, epsilon=0.0)


def sum_then_normalize(rewards, weights, group_size):  # TRL's default, the weighted sum
    table = np.asarray(rewards, dtype=float)
    total = (table @ np.asarray(weights, dtype=float)).reshape(-1, group_size)
    return _normalised(total, 1).reshape(-1)


def weights_first(rewards, weights, group_size):  # weighted before normalising: the weights cancel out
    table = np.asarray(rewards, dtype=float) * np.asarray(weights, dtype=float)
    groups = table.reshape(-1, group_size, table.shape[1])
    return _normalised(_normalised(groups, 1).reshape(table.shape).sum(axis=1), 0)


def no_batch_step(rewards, weights, group_size):  # the weighted sum of normalised rewards, left as it is
    table, groups = _groups(rewards, group_size)
    return _normalised(groups, 1).reshape(table.shape) @ np.asarray(weights, dtype=float)


def batch_not_group(rewards, weights, group_size):  # each reward normalised over the whole batch
    table = np.asarray(rewards, dtype=float)
    return _normalised(_normalised(table, 0) @ np.asarray(weights, dtype=float), 0)


def last_step_per_group(rewards, weights, group_size):  # the sum normalised within each group again
    table, groups = _groups(rewards, group_size)
    total = _normalised(groups, 1).reshape(table.shape) @ np.asarray(weights, dtype=float)
    return _normalised(total.reshape(-1, group_size), 1).reshape(-1)


def unweighted(rewards, weights, group_size):  # the weights forgotten
    return gdpo_advantages(rewards, [1.0] * np.shape(rewards)[1], group_size)


WRONG_GDPO = {  # (function, a case whose label the verdict names)
    "NumPy's std (n, not n - 1)": (numpy_std, "the course's rewards, one group of 4, equal weights"),
    "no 1e-4": (no_epsilon, "a group whose completions all earn the same"),
    "the weighted sum (TRL's default)": (sum_then_normalize, "the course's rewards, one group of 4"),
    "weights before normalising": (weights_first, "the same group, the tuned weights"),
    "no normalisation over the batch": (no_batch_step, "the course's rewards, one group of 4, equal weights"),
    "each reward over the batch": (batch_not_group, "two groups of 4, equal weights"),
    "the sum normalised per group": (last_step_per_group, "two groups of 4, equal weights"),
    "the weights forgotten": (unweighted, "the same group, the tuned weights"),
}


@pytest.mark.parametrize("mistake", sorted(WRONG_GDPO))
def test_a_wrong_gdpo_fails_with_the_case_named_and_the_package_function_is_handed_back(mistake, capsys):
    wrong, case = WRONG_GDPO[mistake]
    assert nb07.check_07_gdpo(wrong) is gdpo_advantages
    out = capsys.readouterr().out
    assert "❌ 07.2 GDPO's normalise-then-sum: differs from the reference" in out
    assert case in out, out


def test_gdpo_cases_use_the_course_rewards_of_real_completions():
    [first, *_] = nb07.gdpo_cases()
    rewards, _, group_size = first.args
    assert rewards.shape == (group_size, 5) and len(set(rewards[:, 0])) == 2, "right and wrong answers in the group"


# --- 07.3 and 07.4: values ----------------------------------------------------------------------------------


def test_the_value_answers_of_the_solution_pass_and_the_stubs_read_not_answered(capsys):
    assert nb07.check_07_off_policy_field(exercise("07", "off_policy_field"))
    assert nb07.check_07_constant_normaliser(exercise("07", "constant_normaliser"))
    assert not nb07.check_07_off_policy_field(exercise("07", "off_policy_field", copy="notebooks"))
    assert not nb07.check_07_constant_normaliser(exercise("07", "constant_normaliser", copy="notebooks"))
    out = capsys.readouterr().out
    assert "✅ 07.3" in out and "✅ 07.4" in out
    assert "⏳ 07.3 the off-policy switch: not answered yet" in out and "⏳ 07.4" in out


@pytest.mark.parametrize("wrong", ["importance_sampling_level", "epsilon_high", "gradient_accumulation_steps", 2, None])
def test_07_3_refuses_other_fields(wrong, capsys):
    assert not nb07.check_07_off_policy_field(wrong)
    assert ("❌ 07.3" if wrong is not None else "⏳ 07.3") in capsys.readouterr().out


RIGHT_OFF_POLICY = ["num_iterations", "steps_per_generation", "`steps_per_generation`", "'num_iterations'"]


@pytest.mark.parametrize("right", RIGHT_OFF_POLICY)
def test_07_3_both_fields_that_reuse_a_generation_batch_pass(right, capsys):
    """TRL goes off-policy either way: a batch reused (num_iterations) or spread over steps (steps_per_generation)."""
    assert nb07.check_07_off_policy_field(right)


def test_07_3_a_name_that_is_not_a_string_says_a_name_was_expected(capsys):
    assert not nb07.check_07_off_policy_field(2)
    assert "a name was expected, as a string" in capsys.readouterr().out


@pytest.mark.parametrize("wrong", ["dapo", "bnpo", "grpo", "max_completion_length", "Dr. GRPO", 2])
def test_07_4_refuses_other_losses(wrong, capsys):
    assert not nb07.check_07_constant_normaliser(wrong)
    assert "❌ 07.4" in capsys.readouterr().out


def test_07_4_accepts_the_name_quoted():
    assert nb07.check_07_constant_normaliser("'dr_grpo'") and nb07.check_07_constant_normaliser("`dr_grpo`")


# --- 07.5: non_overlapping(first, second) -------------------------------------------------------------------


def test_the_non_overlapping_solution_passes_and_the_stub_reads_not_answered(capsys):
    assert nb07.check_07_non_overlapping(exercise("07", "non_overlapping"))
    assert "✅ 07.5 non-overlapping or noise: same result as the reference" in capsys.readouterr().out
    assert not nb07.check_07_non_overlapping(exercise("07", "non_overlapping", copy="notebooks"))
    assert "⏳ 07.5 non-overlapping or noise: not answered yet" in capsys.readouterr().out


def with_numpy(first, second):  # numpy's bool is a verdict too
    if len(first) < 2 or len(second) < 2:
        return False
    a, b = np.asarray(first), np.asarray(second)
    return a.min() > b.max() or b.min() > a.max()


def test_a_numpy_verdict_passes():
    assert nb07.check_07_non_overlapping(with_numpy)


def as_numbers(first, second):  # 1 and 0: equal to True and False, but not a verdict
    if len(first) < 2 or len(second) < 2:
        return 0
    return int(min(first) > max(second) or min(second) > max(first))


def ties_count(first, second):  # `>=`: a shared value counts as no overlap
    if len(first) < 2 or len(second) < 2:
        return False
    return min(first) >= max(second) or min(second) >= max(first)


def one_seed_counts(first, second):  # forgets that one seed says nothing
    return min(first) > max(second) or min(second) > max(first)


def one_way(first, second):  # only "first beats second"
    return len(first) > 1 and len(second) > 1 and min(first) > max(second)


def means_differ(first, second):  # any gap in the means
    return sum(first) / len(first) != sum(second) / len(second)


def gap_beats_spread(first, second):  # the gap of the means beats the larger spread: not the seeds' order
    if len(first) < 2 or len(second) < 2:
        return False
    spread = max(max(first) - min(first), max(second) - min(second))
    return abs(sum(first) / len(first) - sum(second) / len(second)) > spread


WRONG_NON_OVERLAPPING = {
    "1 and 0 for True and False": (as_numbers, "the reference returns True, yours returns 1"),
    ">= lets a tie through": (ties_count, "[0.5, 0.6] vs [0.6, 0.7]"),
    "one seed counted": (one_seed_counts, "[1.0] vs [0.0]"),
    "one direction only": (one_way, "[0.4, 0.5] vs [0.9, 1.0]"),
    "means that differ": (means_differ, "[0.4, 0.9] vs [0.5, 0.6]"),
    "mean gap over the spread": (gap_beats_spread, "[0.0, 1.0] vs [1.01, 1.02]"),
}


@pytest.mark.parametrize("mistake", sorted(WRONG_NON_OVERLAPPING))
def test_a_wrong_non_overlapping_fails_with_the_case_named(mistake, capsys):
    wrong, case = WRONG_NON_OVERLAPPING[mistake]
    assert not nb07.check_07_non_overlapping(wrong)
    out = capsys.readouterr().out
    assert "❌ 07.5 non-overlapping or noise: differs from the reference" in out
    assert case in out, out
