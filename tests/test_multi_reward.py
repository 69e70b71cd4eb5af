"""Several rewards made into one advantage by hand: TRL's weighted sum and GDPO's normalise-then-sum.

That both equal what TRL computes is tested on a real step in tests/test_variants.py (TRL's logged advantages).
"""

from __future__ import annotations

import numpy as np
import pytest

from course_utils.lesson.multi_reward import STD_EPSILON, gdpo_advantages, weighted_sum_advantages

# Two groups of 4 completions, two rewards on different scales: correctness (0 or 2) and a format reward (tenths)
REWARDS = np.array([[2.0, 0.1], [0.0, 0.5], [0.0, 0.3], [2.0, 0.2], [0.0, 0.4], [0.0, 0.1], [0.0, 0.5], [2.0, 0.0]])


def test_gdpo_ignores_a_rewards_scale_and_the_weighted_sum_does_not():
    tenfold = REWARDS * [1.0, 10.0]
    np.testing.assert_allclose(gdpo_advantages(tenfold, [1, 1], 4), gdpo_advantages(REWARDS, [1, 1], 4), atol=1e-3)
    assert np.abs(weighted_sum_advantages(tenfold, [1, 1], 4) - weighted_sum_advantages(REWARDS, [1, 1], 4)).max() > 0.5


def test_gdpo_by_hand_one_group():
    rewards = np.array([[1.0, 0.0], [0.0, 0.0], [1.0, 3.0], [0.0, 3.0]])  # two rewards, each 0/1 and 0/3
    each = np.array([0.5, -0.5, 0.5, -0.5]) / (np.std([1, 0, 1, 0], ddof=1) + STD_EPSILON)
    other = np.array([-1.0, -1.0, 1.0, 1.0]) * 1.5 / (np.std([0, 0, 3, 3], ddof=1) + STD_EPSILON)
    total = 2.0 * each + 1.0 * other
    expected = (total - total.mean()) / (total.std(ddof=1) + STD_EPSILON)
    np.testing.assert_allclose(gdpo_advantages(rewards, [2.0, 1.0], 4), expected)


def test_a_reward_constant_in_its_group_adds_nothing_under_gdpo():
    with_constant = np.column_stack([REWARDS, np.full(len(REWARDS), 0.7)])
    np.testing.assert_allclose(gdpo_advantages(with_constant, [1, 1, 5], 4), gdpo_advantages(REWARDS, [1, 1], 4))


def test_the_weighted_sum_follows_scale_rewards():
    group = weighted_sum_advantages(REWARDS, [1, 1], 4, scale="group")
    none = weighted_sum_advantages(REWARDS, [1, 1], 4, scale="none")
    batch = weighted_sum_advantages(REWARDS, [1, 1], 4, scale="batch")
    total = REWARDS.sum(axis=1)
    centred = total - np.repeat(total.reshape(2, 4).mean(axis=1), 4)
    np.testing.assert_allclose(none, centred)
    np.testing.assert_allclose(batch, centred / (total.std(ddof=1) + STD_EPSILON))
    np.testing.assert_allclose(group, centred / (np.repeat(total.reshape(2, 4).std(axis=1, ddof=1), 4) + STD_EPSILON))
    with pytest.raises(ValueError, match="scale_rewards"):
        weighted_sum_advantages(REWARDS, [1, 1], 4, scale="groups")


def test_a_completion_no_reward_scored_gets_no_advantage_as_in_trl():
    rewards = REWARDS.copy()
    rewards[1] = np.nan
    for advantages in (gdpo_advantages(rewards, [1, 1], 4), weighted_sum_advantages(rewards, [1, 1], 4)):
        assert advantages[1] == 0.0 and np.isfinite(advantages).all()


@pytest.mark.parametrize(
    ("rewards", "weights", "group_size", "message"),
    [
        ([1.0, 2.0, 3.0, 4.0], [1.0], 2, "2-D"),
        (REWARDS, [1.0], 4, "1 weight"),
        (REWARDS, [1.0, 1.0], 3, "whole groups of 3"),
        (REWARDS, [1.0, 1.0], 1, "at least 2"),
        (REWARDS, [1.0, 1.0], 4.0, "whole number"),
        (np.empty((0, 2)), [1.0, 1.0], 2, "0 completions"),
    ],
)
def test_bad_input_names_what_is_wrong(rewards, weights, group_size, message):
    for function in (gdpo_advantages, weighted_sum_advantages):
        with pytest.raises(ValueError, match=message):
            function(rewards, weights, group_size)
