"""Weight presets for the five rewards and the helpers that read them.

Weights are the multipliers ``GRPOConfig(reward_weights=...)`` applies to each reward function's
output (in ``REWARD_FUNCS`` order) before summing; TRL then turns that weighted total into
group-relative advantages. So the same tuple drives the slider lab and the trainer.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from types import MappingProxyType

from course_utils.rewards.corrected import REWARD_MAX, REWARD_MIN, REWARD_NAMES

Weights = str | Sequence[float] | Mapping[str, float]

# Named presets, in REWARD_FUNCS order. "initial": the popular notebook's reward sizes;
# "tuned": more weight on correctness and the strict layout, less on the easy partial credit.
DEFAULT_WEIGHTS: Mapping[str, tuple[float, ...]] = MappingProxyType(
    {
        "initial": (2.0, 0.5, 0.5, 0.5, 0.125),
        "tuned": (3.0, 0.3, 0.8, 0.2, 0.15),
    }
)
WEIGHT_PRESETS = DEFAULT_WEIGHTS


def resolve_weights(weights: Weights = "initial") -> tuple[float, ...]:
    """Weights as a tuple in ``REWARD_FUNCS`` order, from a preset name, a sequence or a name -> weight dict."""
    if isinstance(weights, str):
        if weights not in DEFAULT_WEIGHTS:
            raise ValueError(f"unknown weight preset {weights!r}; choose one of {sorted(DEFAULT_WEIGHTS)}")
        return DEFAULT_WEIGHTS[weights]
    if isinstance(weights, Mapping):
        unknown = sorted(set(weights) - set(REWARD_NAMES))
        missing = [n for n in REWARD_NAMES if n not in weights]
        if unknown or missing:
            raise ValueError(f"weights dict: unknown names {unknown}, missing names {missing}; expected {REWARD_NAMES}")
        weights = [weights[n] for n in REWARD_NAMES]
    try:
        values = tuple(float(w) for w in weights)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"weights must be a preset name, a list of numbers or a dict, got {weights!r}") from exc
    if len(values) != len(REWARD_NAMES):
        raise ValueError(f"need {len(REWARD_NAMES)} weights (one per reward in {REWARD_NAMES}), got {len(values)}")
    if not all(math.isfinite(w) for w in values):
        raise ValueError(f"weights must be finite numbers, got {values}")
    return values


def max_total_reward(weights: Weights = "initial") -> float:
    """The best weighted total one completion can earn with the corrected rewards.

    The yardstick for calibration: if the average completion already earns most of it, or almost
    none of it, the group advantages have little to work with.
    """
    return sum(max(w * hi, w * lo) for w, hi, lo in zip(resolve_weights(weights), REWARD_MAX, REWARD_MIN, strict=True))


def grpo_reward_weights(weights: Weights = "initial") -> list[float]:
    """The list for ``GRPOConfig(reward_weights=...)``, paired with ``reward_funcs=REWARD_FUNCS``."""
    return list(resolve_weights(weights))


__all__ = [
    "DEFAULT_WEIGHTS",
    "WEIGHT_PRESETS",
    "Weights",
    "grpo_reward_weights",
    "max_total_reward",
    "resolve_weights",
]
