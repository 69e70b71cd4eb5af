"""Several rewards made into one advantage, by hand: TRL's two ``multi_objective_aggregation`` values (notebook 07).

Why: the course's rewards live on different scales (correctness pays 2.0, the format rewards a few tenths), and
notebook 03's weights decide how much each counts. ``weighted_sum_advantages`` is TRL's default,
``"sum_then_normalize"``: the weighted rewards are summed, then the sum is normalised within its group, so a
reward that varies a lot in a group drowns one that varies a little. ``gdpo_advantages`` is GDPO's
``"normalize_then_sum"``: each reward is normalised within its group first, so every reward that tells a
group's completions apart speaks at the scale its weight gives it, then the weighted sum is normalised over the
batch. Both follow ``GRPOTrainer._generate_and_score_completions`` in TRL 1.16, NaN (a reward that returned
``None``) included; a test compares them with the advantages TRL logs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

# TRL adds this to every standard deviation before dividing by it
STD_EPSILON = 1e-4
SCALES = ("group", "batch", "none")


def reward_matrix(rewards: Any, weights: Sequence[float], group_size: int) -> tuple[np.ndarray, np.ndarray]:
    """``rewards`` as a (completions, reward functions) float array and ``weights`` as an array, both checked.

    Completions come group by group, ``group_size`` (TRL's ``num_generations``) consecutive rows a prompt.
    """
    matrix = np.asarray(rewards, dtype=float)
    if matrix.ndim != 2:
        raise ValueError(f"rewards: expected rows of one value per reward function (2-D), got shape {matrix.shape}")
    if isinstance(group_size, bool) or not isinstance(group_size, (int, np.integer)) or group_size < 2:
        raise ValueError(f"group_size {group_size!r}: give num_generations, a whole number of at least 2")
    if len(matrix) == 0 or len(matrix) % group_size:
        raise ValueError(f"{len(matrix)} completions do not make whole groups of {group_size}: pass every group whole")
    weight = np.asarray(weights, dtype=float)
    if weight.shape != (matrix.shape[1],):
        raise ValueError(f"{weight.size} weight(s) for {matrix.shape[1]} reward function(s): give one per function")
    return matrix, weight


def _std(values: np.ndarray, axis: int | None = None) -> np.ndarray:
    """TRL's ``nanstd``: NaNs ignored, Bessel's correction (divide by n - 1)."""
    count = np.sum(~np.isnan(values), axis=axis, keepdims=True)
    mean = np.nanmean(values, axis=axis, keepdims=True)
    variance = np.nanmean((values - mean) ** 2, axis=axis, keepdims=True)
    return np.sqrt(variance * count / (count - 1))


def _unscorable(matrix: np.ndarray) -> np.ndarray:
    """Rows where every reward function returned ``None``: TRL gives them no advantage."""
    return np.isnan(matrix).all(axis=1)


def weighted_sum_advantages(
    rewards: Any, weights: Sequence[float], group_size: int, scale: str = "group"
) -> np.ndarray:
    """TRL's default (``"sum_then_normalize"``): sum the weighted rewards, then normalise the sum within its group.

    ``scale`` is ``scale_rewards``: ``"group"`` divides by the group's standard deviation, ``"batch"`` by the
    batch's, ``"none"`` only subtracts the group's mean.
    """
    if scale not in SCALES:
        raise ValueError(f"scale {scale!r}: one of {SCALES} (GRPOConfig's scale_rewards)")
    matrix, weight = reward_matrix(rewards, weights, group_size)
    unscorable = _unscorable(matrix)
    total = np.nansum(matrix * weight, axis=1)
    total[unscorable] = np.nan
    groups = total.reshape(-1, group_size)
    advantages = (groups - np.nanmean(groups, axis=1, keepdims=True)).reshape(-1)
    if scale == "group":
        advantages = advantages / (np.repeat(_std(groups, axis=1), group_size) + STD_EPSILON)
    elif scale == "batch":
        advantages = advantages / (_std(total).reshape(()) + STD_EPSILON)
    return np.nan_to_num(advantages, nan=0.0)


def gdpo_advantages(rewards: Any, weights: Sequence[float], group_size: int) -> np.ndarray:
    """GDPO (``"normalize_then_sum"``): normalise each reward within its group, sum them weighted, normalise the sum.

    A reward that is the same for every completion of a group adds nothing to that group (it is 0 after
    normalising); ``scale_rewards`` plays no part.
    """
    matrix, weight = reward_matrix(rewards, weights, group_size)
    unscorable = _unscorable(matrix)
    groups = matrix.reshape(-1, group_size, matrix.shape[1])
    normalised = (groups - np.nanmean(groups, axis=1, keepdims=True)) / (_std(groups, axis=1) + STD_EPSILON)
    total = np.nansum(normalised.reshape(matrix.shape) * weight, axis=1)
    total[unscorable] = np.nan
    advantages = (total - np.nanmean(total)) / (_std(total).reshape(()) + STD_EPSILON)
    return np.nan_to_num(advantages, nan=0.0)
