"""Notebook 07's checks: the variant fields and the noise rule."""

from __future__ import annotations

from course_utils.exercises import nb07_grpo_variants as nb07


def test_value_checks_of_07_accept_the_right_answers_only():
    assert nb07.check_07_off_policy_field("num_iterations")
    assert not nb07.check_07_off_policy_field("importance_sampling_level")
    assert not nb07.check_07_off_policy_field(None)
    assert nb07.check_07_constant_normaliser("dr_grpo") and nb07.check_07_constant_normaliser("'dr_grpo'")
    assert not nb07.check_07_constant_normaliser("dapo") and not nb07.check_07_constant_normaliser("bnpo")


def test_check_07_real_difference_compares_with_the_noise_rule(capsys):
    def right(first, second):
        if len(first) < 2 or len(second) < 2:
            return False
        return min(first) > max(second) or min(second) > max(first)

    def means_only(first, second):  # calls any gap in the means a difference
        return sum(first) / len(first) != sum(second) / len(second)

    def one_way(first, second):
        return len(first) > 1 and len(second) > 1 and min(first) > max(second)

    assert nb07.check_07_real_difference(right)
    assert not nb07.check_07_real_difference(means_only)
    assert "[1.0] vs [0.0]" in capsys.readouterr().out
    assert not nb07.check_07_real_difference(one_way)
    assert not nb07.check_07_real_difference(...)
