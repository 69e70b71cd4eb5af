"""Weight presets for the five rewards, the helpers that read them, and the file that carries them to training.

One convention everywhere (sliders, ``GRPOConfig``, tables): a weight is the multiplier
``GRPOConfig(reward_weights=...)`` applies to a reward function's output (in ``REWARD_FUNCS`` order) before
summing. The functions already return the source article's "initial" sizes (correctness 2.0, int 0.5, strict
0.5, soft 0.5, 0.125 per tag), so the "initial" preset is all 1.0 and a table of *points* is weight x size.
The article's "tuned" sizes (3.0, 0.3, 0.8, 0.2, 0.15 per tag) are the multipliers 1.5, 0.6, 1.6, 0.4, 1.2.

Notebook 03 saves the learner's weights with ``save_weights``; notebook 04 reads them with ``load_weights``
(the "initial" preset when nothing was saved), so the weights set in the lab are the weights trained with.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import MappingProxyType

from course_utils.core.paths import output_dir
from course_utils.lesson.rewards.corrected import REWARD_MAX, REWARD_MIN, REWARD_NAMES

Weights = str | Sequence[float] | Mapping[str, float]

# Named presets (multipliers, in REWARD_FUNCS order). "initial": the article's first table, which the functions
# already return; "tuned": its second table (3.0, 0.3, 0.8, 0.2, 0.15 per tag) divided by those sizes:
# more on correctness and the strict layout, less on the easy partial credit.
DEFAULT_WEIGHTS: Mapping[str, tuple[float, ...]] = MappingProxyType(
    {
        "initial": (1.0, 1.0, 1.0, 1.0, 1.0),
        "tuned": (1.5, 0.6, 1.6, 0.4, 1.2),
    }
)
DEFAULT_PRESET = "initial"
WEIGHTS_FILENAME = "reward_weights.json"
WEIGHT_PRESETS = DEFAULT_WEIGHTS
MAX_WEIGHT = 100.0  # the presets stay within 0-2; far above, one reward drowns the rest


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


def trainable_weights(weights: Weights = "initial") -> tuple[float, ...]:
    """``resolve_weights``, refusing what cannot train (``weights_problem``); the reward lab may explore the rest."""
    values = resolve_weights(weights)
    if problem := weights_problem(values):
        raise ValueError(f"{problem}; got {dict(zip(REWARD_NAMES, values, strict=True))}")
    return values


def weights_problem(values: Sequence[float]) -> str | None:
    """Why weights cannot train (not finite, negative, all zero, above ``MAX_WEIGHT``), or None when they can.

    A negative weight turns a reward into a penalty for what the course rewards, all zeros leave every group
    without signal, and a huge one overflows the group statistics (or drowns the other rewards).
    """
    names = dict(zip(REWARD_NAMES, values, strict=True))
    if bad := [n for n, w in names.items() if not math.isfinite(w)]:
        return f"weights must be finite numbers: {bad} are not"
    if bad := [n for n, w in names.items() if w < 0]:
        return f"weights must be >= 0 (a negative weight punishes what the reward asks for): {bad} are negative"
    if bad := [n for n, w in names.items() if w > MAX_WEIGHT]:
        return f"weights must be at most {MAX_WEIGHT:g} (larger ones drown the other rewards): {bad} are larger"
    if not any(values):
        return "weights are all zero: every completion would get the same total and GRPO nothing to learn from"
    return None


def max_total_reward(weights: Weights = "initial") -> float:
    """The best weighted total one completion can earn with the corrected rewards.

    The yardstick for calibration: if the average completion already earns most of it, or almost
    none of it, the group advantages have little to work with.
    """
    return sum(max(w * hi, w * lo) for w, hi, lo in zip(resolve_weights(weights), REWARD_MAX, REWARD_MIN, strict=True))


def grpo_reward_weights(weights: Weights = "initial") -> list[float]:
    """The list for ``GRPOConfig(reward_weights=...)``, paired with ``reward_funcs=REWARD_FUNCS`` (checked to train)."""
    return list(trainable_weights(weights))


def reward_points(weights: Weights = "initial") -> dict[str, float]:
    """The most points each reward can give under ``weights`` (weight x the function's best output).

    This is the article's table: "initial" gives correctness 2.0, int 0.5, strict 0.5, soft 0.5, xmlcount 0.5
    (4 tags x 0.125); "tuned" gives 3.0, 0.3, 0.8, 0.2, 0.6 (4 x 0.15).
    """
    return {n: w * hi for n, w, hi in zip(REWARD_NAMES, resolve_weights(weights), REWARD_MAX, strict=True)}


def weights_path() -> Path:
    """Where notebook 03 saves the learner's weights and notebook 04 reads them: ``outputs/reward_weights.json``."""
    return output_dir() / WEIGHTS_FILENAME


def save_weights(weights: Weights, path: str | Path | None = None) -> Path:
    """Write ``weights`` (checked: they must be able to train) as ``{reward name: weight}`` JSON; return the file."""
    values = trainable_weights(weights)
    path = Path(path) if path is not None else weights_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(dict(zip(REWARD_NAMES, values, strict=True)), indent=1))
    return path


def load_weights(path: str | Path | None = None, default: Weights = DEFAULT_PRESET) -> list[float]:
    """The weights ``save_weights`` wrote, or ``default`` (a preset) when there is no file; said aloud.

    A file that exists but cannot be read is an error, not a silent fallback: training with weights the
    learner did not choose is the bug this file exists to prevent.
    """
    path = Path(path) if path is not None else weights_path()
    if not path.is_file():
        print(f"No saved reward weights at {path}: run notebook 03's slider lab and its lab.save() cell to choose "
              f"them. Fallback: the {default!r} preset.")  # fmt: skip
        return grpo_reward_weights(default)
    fix = "fix it, delete it, or save again with save_weights() (notebook 03)"
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: not valid JSON ({exc}); {fix}.") from exc
    try:
        values = grpo_reward_weights(saved)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"{path}: unusable reward weights ({exc}); {fix}.") from exc
    print(f"Reward weights from {path}: {values}")
    return values


__all__ = [
    "DEFAULT_PRESET",
    "DEFAULT_WEIGHTS",
    "WEIGHT_PRESETS",
    "Weights",
    "grpo_reward_weights",
    "load_weights",
    "max_total_reward",
    "resolve_weights",
    "reward_points",
    "save_weights",
    "trainable_weights",
    "weights_path",
    "weights_problem",
]
