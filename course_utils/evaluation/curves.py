"""A run's models along the way: its warm start, and every checkpoint scored on held-out problems.

``checkpoint_curve`` evaluates the starting model (step 0) and each saved LoRA checkpoint; ``save_curve`` /
``load_curve`` keep the curve beside the run's log history for notebook 06's overfitting plot. A falling
validation curve under a rising training reward is overfitting.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from peft import PeftModel

from course_utils.core.profiles import get_profile
from course_utils.core.speedups import NO_SPEEDUPS, SpeedUps
from course_utils.evaluation.heldout import evaluate_model, merged_unless_quantized
from course_utils.lesson.models import load_model_and_tokenizer, load_tokenizer, profile_dtype, saved_model_kind
from course_utils.lesson.offline_model import safetensors_problem
from course_utils.training.run_folder import CURVE_FILENAME
from course_utils.training.trained_model import warm_start_model_dir
from course_utils.training.warm_start import load_saved_warm_start


def checkpoint_steps(run_dir: str | Path) -> list[tuple[int, Path]]:
    """``(step, folder)`` of every ``checkpoint-N`` in ``run_dir``, by step."""
    found = []
    for folder in Path(run_dir).glob("checkpoint-*"):
        suffix = folder.name.split("-", 1)[1]
        if suffix.isdigit() and folder.is_dir():
            found.append((int(suffix), folder))
    return sorted(found)


def checkpoint_curve(
    profile: Any,
    run_dir: str | Path,
    problems: Any,
    *,
    base: Any = None,
    batch_size: int = 16,
    max_new_tokens: int | None = None,
    speedups: SpeedUps = NO_SPEEDUPS,
) -> list[dict[str, Any]]:
    """Accuracy and format rate of the starting model (step 0) and of every checkpoint of ``run_dir`` on ``problems``.

    Each checkpoint holds the LoRA adapter at that step; it is loaded onto ``base`` (the model GRPO started from:
    the warm-start cache of the run folder when there is one, else the profile's model) and merged (not into a
    4-bit base: ``heldout.merged_unless_quantized``). A falling
    validation curve under a rising training reward is overfitting. ``speedups``: the plug-in each model generates
    through (``speedups=cpu_speed``), default plain transformers.
    """
    p = get_profile(profile)
    max_new_tokens = max_new_tokens or p.eval_max_new_tokens
    base_dir = Path(base) if base is not None else warm_start_model_dir(run_dir)
    base_model, tokenizer = _starting_model(p, base_dir)
    settings = {"batch_size": batch_size, "max_new_tokens": max_new_tokens, "progress": False, "speedups": speedups}
    curve = [_curve_point(0, evaluate_model(base_model, tokenizer, problems, **settings))]
    adapters = [(step, path) for step, path in checkpoint_steps(run_dir) if saved_model_kind(path) == "lora-adapter"]
    adapters = [(step, path) for step, path in adapters if not _torn(path)]
    for index, (step, folder) in enumerate(adapters):
        if index:  # the previous adapter was merged into these weights: start again from the saved ones
            base_model, _ = _starting_model(p, base_dir)
        model = merged_unless_quantized(PeftModel.from_pretrained(base_model, folder))
        curve.append(_curve_point(step, evaluate_model(model, tokenizer, problems, **settings)))
    return curve


def _torn(checkpoint: Path) -> bool:
    """Whether a checkpoint's adapter was cut short by a kill or a full disk; said, and left out of the curve."""
    weights = checkpoint / "adapter_model.safetensors"
    problem = safetensors_problem(weights) and f"{weights.name}: {safetensors_problem(weights)}"
    if problem:
        print(f"{checkpoint} is left out of the curve: {problem} (torn by a kill or a full disk; move it aside or "
              "delete it)")  # fmt: skip
    return problem is not None


def _starting_model(profile: Any, base_dir: Path) -> tuple[Any, Any]:
    """The model GRPO started from (the saved warm start in ``base_dir``, else the profile's) and the tokenizer."""
    return _saved_warm_start(profile, base_dir) or load_model_and_tokenizer(profile)


def _saved_warm_start(profile: Any, folder: Path) -> tuple[Any, Any] | None:
    """The warm-started model saved in ``folder``, in the profile's dtype, and the profile's tokenizer; or None."""
    model = load_saved_warm_start(folder, profile_dtype(profile))
    return None if model is None else (model.eval(), load_tokenizer(profile))


def _curve_point(step: int, result: Mapping[str, Any]) -> dict[str, Any]:
    point: dict[str, Any] = {"step": step, "n": result["n"]}
    for metric in ("accuracy", "lenient_accuracy", "format_score"):
        point[metric] = result[metric]
        point[f"{metric}_ci"] = list(result[f"{metric}_ci"])
    return point


def load_warm_start_model(profile: Any, run_dir: str | Path) -> tuple[Any, Any] | None:
    """The warm-started model of a run and the profile's tokenizer (left padding), or None without a warm start.

    Evaluated on its own, it tells what the supervised warm start did before GRPO changed anything, so the
    GRPO model is compared with the model GRPO started from, not with the raw base model.
    """
    return _saved_warm_start(profile, warm_start_model_dir(run_dir))


def save_curve(curve: Sequence[Mapping[str, Any]], run_dir: str | Path) -> Path:
    """Write a ``checkpoint_curve`` next to the run's log history, for notebook 06's overfitting plot."""
    path = Path(run_dir) / CURVE_FILENAME
    path.write_text(json.dumps(list(curve), indent=1))
    return path


def load_curve(run_dir: str | Path) -> list[dict[str, Any]] | None:
    """The curve ``save_curve`` wrote for ``run_dir``, or None when notebook 05 has not evaluated the run.

    A file that is there but damaged (cut short, edited) is an error naming it, not a curve of whatever parsed.
    """
    path = Path(run_dir) / CURVE_FILENAME
    if not path.is_file():
        return None
    try:
        curve = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path} is damaged ({exc}); delete it and run notebook 05's checkpoint cell again.") from exc
    if not isinstance(curve, list) or not all(isinstance(point, dict) and "step" in point for point in curve):
        raise ValueError(f"{path} is not a validation curve (a list of points with a 'step'); delete it and rerun.")
    return curve
