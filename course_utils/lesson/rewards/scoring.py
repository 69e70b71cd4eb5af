"""Score completions into a table, and switch between the classic and corrected reward sets."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import pandas as pd

from course_utils.lesson.rewards.classic import REWARD_FUNCS as CLASSIC_REWARD_FUNCS
from course_utils.lesson.rewards.corrected import REWARD_FUNCS, REWARD_NAMES, RewardFunc, completion_text
from course_utils.lesson.rewards.shaping import STAGES, make_staged_format_reward
from course_utils.lesson.rewards.weights import Weights, resolve_weights

VARIANTS = ("corrected", "classic")
TOTAL_COLUMN = "total"
PREVIEW_CHARS = 60


def get_reward_funcs(variant: str = "corrected") -> list[RewardFunc]:
    """The five rewards, ``"corrected"`` (default) or ``"classic"``, in the same order and under the same names."""
    if variant == "corrected":
        return list(REWARD_FUNCS)
    if variant == "classic":
        return list(CLASSIC_REWARD_FUNCS)
    raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")


def preview(completion: Any, width: int = PREVIEW_CHARS) -> str:
    """A one-line excerpt of a completion, newlines shown as ``⏎``, for table rows."""
    text = completion_text(completion).replace("\n", "⏎")
    return text if len(text) <= width else text[: width - 1] + "…"


def _resolve(funcs: Sequence[RewardFunc] | None, weights: Weights, variant: str, stage: str | None):
    funcs = get_reward_funcs(variant) if funcs is None else list(funcs)
    if stage is not None:
        if stage not in STAGES:
            raise ValueError(f"stage must be one of {STAGES} or None, got {stage!r}")
        # The staged reward takes the strict-format slot: lenient = tags in order, strict = exact layout.
        slot = REWARD_NAMES.index("strict_format_reward_func")
        staged = make_staged_format_reward()
        funcs[slot] = lambda **kw: staged(stage=stage, **kw)
        funcs[slot].__name__ = "strict_format_reward_func"
    if len(funcs) == len(REWARD_NAMES):
        values = resolve_weights(weights)
    else:
        values = tuple(float(w) for w in weights)  # custom function list: weights given explicitly
        if len(values) != len(funcs):
            raise ValueError(f"{len(funcs)} reward functions need {len(funcs)} weights, got {len(values)}")
    return funcs, values


def reward_table(
    completions: Sequence[Any],
    answer: Sequence[Any] | str | None = None,
    weights: Weights = "initial",
    variant: str = "corrected",
    funcs: Sequence[RewardFunc] | None = None,
    stage: str | None = None,
    prompts: Sequence[Any] | None = None,
) -> pd.DataFrame:
    """One row per completion: a preview, each reward function's value, and the weighted ``total``.

    ``answer`` is the gold answer per completion, or one string for a whole group. ``stage``
    (``"lenient"``/``"strict"``) scores the strict-format slot with the staged format reward instead.
    The total is what TRL sums with ``reward_weights`` before computing advantages; a reward that returns None
    for a completion shows NaN there, as TRL reads it.
    """
    completions = list(completions)
    if not completions:
        raise ValueError("no completions to score: pass a non-empty list")
    if isinstance(answer, str) or answer is None:
        answer = [answer] * len(completions)
    funcs, values = _resolve(funcs, weights, variant, stage)
    kwargs = {"prompts": prompts, "completions": completions, "answer": list(answer)}
    table = pd.DataFrame({"completion": [preview(c) for c in completions]})
    for func in funcs:
        table[func.__name__] = [math.nan if r is None else float(r) for r in func(**kwargs)]
    names = [f.__name__ for f in funcs]
    # TRL's sum: a None (NaN) adds nothing; a completion no reward could score has no total (NaN)
    table[TOTAL_COLUMN] = (table[names] * list(values)).sum(axis=1, min_count=1)
    return table


def compare_variants(
    completions: Sequence[Any],
    answer: Sequence[Any] | str,
    weights: Weights = "initial",
    labels: Sequence[str] | None = None,
) -> pd.DataFrame:
    """Classic and corrected side by side: one row per completion and reward, both values and ``differs``.

    ``labels`` name the completions (default: a preview of each); they must be unique so the table can
    be pivoted to one row per completion.
    """
    tables = {v: reward_table(completions, answer, weights, variant=v) for v in VARIANTS}
    names = list(labels) if labels is not None else tables["corrected"]["completion"].tolist()
    if len(names) != len(tables["corrected"]):
        raise ValueError(f"got {len(names)} labels for {len(tables['corrected'])} completions")
    rows = []
    for name in [*REWARD_NAMES, TOTAL_COLUMN]:
        for i, label in enumerate(names):
            c, k = tables["corrected"].at[i, name], tables["classic"].at[i, name]
            rows.append(
                {"completion": label, "reward": name, "classic": k, "corrected": c, "differs": abs(c - k) > 1e-9}
            )
    return pd.DataFrame(rows)


__all__ = ["TOTAL_COLUMN", "VARIANTS", "compare_variants", "get_reward_funcs", "preview", "reward_table"]
