"""Reward shaping beyond the five classics: a length reward, weighted combinations, a staged format reward.

All functions built here keep TRL's reward signature and a readable ``__name__`` (TRL logs each
reward as ``rewards/<__name__>/mean``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from course_utils.lesson.rewards.corrected import (
    STRICT_FORMAT_REWARD,
    completion_texts,
    is_soft_format,
    is_strict_format,
)

RewardFunc = Callable[..., list[float]]

LENGTH_TARGET_CHARS = 600  # a worked GSM8K solution in the XML format: a few short reasoning lines
LENGTH_WIDTH_CHARS = 300
LENGTH_UNITS = ("chars", "tokens")
STAGES = ("lenient", "strict")


def gaussian_length_score(length: float, target: float, width: float) -> float:
    """``exp(-((length - target) / width)² / 2)``: 1 at the target, ~0.61 one width away, ~0.14 two widths away.

    Smooth on both sides, so it pushes a rambling model shorter and a terse one longer, instead of a
    hard cut-off that gives no signal until the limit is crossed.
    """
    return math.exp(-0.5 * ((length - target) / width) ** 2)


def make_length_reward(
    target: float = LENGTH_TARGET_CHARS, width: float = LENGTH_WIDTH_CHARS, unit: str = "chars"
) -> RewardFunc:
    """A reward in [0, 1] peaking when the completion is ``target`` long (in characters or tokens).

    ``unit="tokens"`` counts ``completion_ids``, which ``GRPOTrainer`` passes to every reward; that is the
    length that costs generation time. ``"chars"`` works anywhere (tables, tests, notebooks).
    """
    if unit not in LENGTH_UNITS:
        raise ValueError(f"unit must be one of {LENGTH_UNITS}, got {unit!r}")
    if not (math.isfinite(target) and target >= 0 and math.isfinite(width) and width > 0):
        raise ValueError(f"need a finite target >= 0 and width > 0, got target={target!r}, width={width!r}")

    def length_reward_func(
        prompts: Any = None, completions: Any = None, completion_ids: Any = None, **kwargs: Any
    ) -> list[float]:
        if unit == "chars":
            lengths = [len(t) for t in completion_texts(completions)]
        else:
            if completion_ids is None:
                raise ValueError("unit='tokens' needs completion_ids (GRPOTrainer passes them); else use unit='chars'")
            lengths = [len(ids) for ids in completion_ids]
        return [gaussian_length_score(n, target, width) for n in lengths]

    length_reward_func.__doc__ = f"Gaussian length reward: 1.0 at {target} {unit}, width {width} {unit}."
    return length_reward_func


length_reward_func = make_length_reward()


def combine_rewards(funcs: Sequence[RewardFunc], weights: Sequence[float], name: str | None = None) -> RewardFunc:
    """One reward function returning ``sum(w * f(...))``: e.g. 0.6 x length + 0.4 x format.

    Usually you give TRL the functions separately with ``reward_weights`` (it logs each one); a
    combined function is for when one score must be a single number, e.g. to clip or stage it.
    """
    funcs, weights = list(funcs), [float(w) for w in weights]
    if not funcs or len(funcs) != len(weights):
        raise ValueError(f"need one weight per function: got {len(funcs)} functions and {len(weights)} weights")
    if not all(callable(f) for f in funcs):
        raise TypeError("every entry of funcs must be a reward function (callable)")
    if not all(math.isfinite(w) for w in weights):
        raise ValueError(f"weights must be finite numbers, got {weights}")

    def combined_reward_func(prompts: Any = None, completions: Any = None, **kwargs: Any) -> list[float]:
        columns = [f(prompts=prompts, completions=completions, **kwargs) for f in funcs]
        return [sum(w * r for w, r in zip(weights, row, strict=True)) for row in zip(*columns, strict=True)]

    combined_reward_func.__name__ = name or "combined_" + "_".join(
        getattr(f, "__name__", "f").removesuffix("_reward_func") for f in funcs
    )
    return combined_reward_func


def format_stage(trainer_state: Any = None, switch_fraction: float = 0.5) -> str:
    """``"lenient"`` before ``switch_fraction`` of ``max_steps``, ``"strict"`` after (``trainer_state`` from TRL).

    Without a trainer state (called outside training, or before ``max_steps`` is known) the stage is
    ``"lenient"``: early in training is the safe assumption.
    """
    if not 0.0 <= switch_fraction <= 1.0:
        raise ValueError(f"switch_fraction must be in [0, 1], got {switch_fraction!r}")
    max_steps = getattr(trainer_state, "max_steps", 0) or 0
    step = getattr(trainer_state, "global_step", 0) or 0
    if max_steps <= 0:
        return "lenient"
    return "strict" if step >= switch_fraction * max_steps else "lenient"


def make_staged_format_reward(switch_fraction: float = 0.5, reward: float = STRICT_FORMAT_REWARD) -> RewardFunc:
    """A format reward lenient early (tags in order, any whitespace) and strict later (exact layout).

    Why: a fresh model rarely hits the exact layout, so a strict reward is 0 for the whole group and
    teaches nothing (``frac_reward_zero_std`` near 1). Rewarding the rough shape first, then tightening,
    keeps a learning signal at both ends. ``GRPOTrainer`` passes ``trainer_state`` (a
    ``transformers.TrainerState``) to every reward function; a ``stage="lenient"|"strict"`` keyword
    overrides it (for the slider lab and tests).
    """
    format_stage(None, switch_fraction)  # validates switch_fraction now, not mid-training

    def staged_format_reward_func(
        prompts: Any = None, completions: Any = None, trainer_state: Any = None, stage: str | None = None, **kwargs: Any
    ) -> list[float]:
        current = stage or format_stage(trainer_state, switch_fraction)
        if current not in STAGES:
            raise ValueError(f"stage must be one of {STAGES}, got {current!r}")
        check = is_soft_format if current == "lenient" else is_strict_format
        return [reward if check(t) else 0.0 for t in completion_texts(completions)]

    return staged_format_reward_func


staged_format_reward_func = make_staged_format_reward()

__all__ = [
    "LENGTH_TARGET_CHARS",
    "LENGTH_WIDTH_CHARS",
    "STAGES",
    "combine_rewards",
    "format_stage",
    "gaussian_length_score",
    "length_reward_func",
    "make_length_reward",
    "make_staged_format_reward",
    "staged_format_reward_func",
]
