"""Checks of configuration values against their declared types and choices, with errors that name the fix.

Why: a profile field or a config entry of the wrong type (``--set dtype=fp8``, ``{"num_generations": "8"}``)
otherwise travels until a ``KeyError`` or ``TypeError`` deep inside the code that reads it, far from the typo.
``Profile.override`` and the pre-flight check call these before anything uses the value.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Mapping
from typing import Any

# Profile fields that take one of a few values (None included where the field allows it)
PROFILE_CHOICES: Mapping[str, tuple[Any, ...]] = types.MappingProxyType(
    {
        "model_source": ("offline", "hub"),
        "device": ("cpu", "cuda"),
        "dtype": ("float32", "float16", "bfloat16"),
        "train_dtype": (None, "auto", "float32", "float16", "bfloat16"),
        "report_to": ("none", "tensorboard", "trackio"),
        "warm_start_reasoning": ("lines", "equations"),
        "scale_rewards": ("group", "batch", "none"),
    }
)

# Profile numbers and the least each may be, and whether that least is allowed itself (fields set to None aside):
# below it a run fails deep inside a library under that library's name for it (peft's ``r``, ``max_new_tokens``),
# or means something else there (``max_steps=-1``: transformers trains 3 whole epochs)
PROFILE_MINIMUMS: Mapping[str, tuple[float, bool]] = types.MappingProxyType({
    **dict.fromkeys(("lora_r", "lora_alpha", "lora_top_layers", "per_device_train_batch_size", "max_steps",
                     "gradient_accumulation_steps", "max_completion_length", "train_size", "max_prompt_tokens",
                     "warm_start_batch_size", "tool_max_steps",
                     "tool_max_completion_length", "max_tool_calling_iterations", "logging_steps", "save_steps",
                     "eval_size", "eval_batch_size", "eval_max_new_tokens", "pass_k_problems", "pass_k_samples"),
                    (1, True)),
    "num_generations": (2, True),  # a group of one has no spread: GRPO's advantage is 0
    **dict.fromkeys(("warm_start_examples", "tool_warm_start_examples", "warm_start_reasoning_lines", "beta",
                     "warmup_steps", "max_solution_steps", "tool_max_solution_steps"), (0, True)),
    **dict.fromkeys(("learning_rate", "warm_start_learning_rate", "tool_learning_rate", "temperature",
                     "warm_start_epochs", "max_grad_norm", "vllm_gpu_memory_utilization"), (0, False)),
})  # fmt: skip


# What a value below the minimum would do instead, said with the refusal where it is not a plain crash
RANGE_CONSEQUENCES: Mapping[str, str] = types.MappingProxyType({
    "max_steps": ("transformers reads max_steps <= 0 as 'train by epochs' and would run num_train_epochs (3) whole "
                  "passes over the data, while the course's runs, checkpoints, plots and --resume count steps; give "
                  "the number of GRPO steps, for example max_steps=50"),
})  # fmt: skip


class FieldValueError(ValueError):
    """A configuration value of the wrong type, or not one of the field's choices."""


def matches(value: Any, hint: Any) -> bool:
    """Whether ``value`` fits the type annotation ``hint`` (``int``, ``float``, ``str | None``, ``tuple[str, ...]``).

    ``bool`` is not an ``int`` here and an ``int`` is a ``float``, as a learner writing ``1`` or ``True`` means.
    """
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return any(matches(value, option) for option in typing.get_args(hint))
    if hint is None or hint is type(None):
        return value is None
    if origin is tuple:
        args = typing.get_args(hint)
        if not isinstance(value, tuple):
            return False
        if len(args) == 2 and args[1] is Ellipsis:
            return all(matches(item, args[0]) for item in value)
        return len(args) == len(value) and all(matches(v, a) for v, a in zip(value, args, strict=True))
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    return isinstance(value, hint) if isinstance(hint, type) else True


def field_problem(
    name: str, value: Any, hint: Any, choices: tuple[Any, ...] | None = None, shown: str | None = None
) -> str | None:
    """Why ``value`` cannot be field ``name`` (its type, or not one of ``choices``), or None when it can.

    ``shown``: the annotation as written in the source (``"tuple[str, ...]"``), for the message.
    """
    if not matches(value, hint):
        shown = shown or getattr(hint, "__name__", str(hint))
        return f"{name}={value!r} is a {type(value).__name__}, but {name} takes {shown}"
    if choices is not None and value not in choices:
        return f"{name}={value!r} is not one of {list(choices)}"
    return None


def range_problem(name: str, value: Any) -> str | None:
    """Why a number cannot be profile field ``name`` (not finite, or below ``PROFILE_MINIMUMS``), or None."""
    if name not in PROFILE_MINIMUMS or isinstance(value, bool) or not isinstance(value, int | float):
        return None
    low, allowed = PROFILE_MINIMUMS[name]
    if math.isfinite(value) and (value > low or (allowed and value == low)):
        return None
    why = f" ({RANGE_CONSEQUENCES[name]})" if name in RANGE_CONSEQUENCES else ""
    bound = f"{'at least' if allowed else 'above'} {low}"
    return f"{name}={value!r} is out of range: it must be a finite number {bound}{why}"


def check_dataclass_changes(cls: type, changes: Mapping[str, Any], choices: Mapping[str, tuple[Any, ...]]) -> None:
    """Raise ``FieldValueError`` naming every change that does not fit ``cls``'s annotations, the ``choices`` or
    ``PROFILE_MINIMUMS``."""
    hints = typing.get_type_hints(cls)
    written = {field.name: str(field.type) for field in dataclasses.fields(cls)}
    problems = [
        problem
        for name, value in changes.items()
        if name in hints and (problem := field_problem(name, value, hints[name], choices.get(name), written.get(name))
                              or range_problem(name, value))
    ]
    if problems:
        raise FieldValueError(f"{cls.__name__}: " + "; ".join(problems))


def check_value_types(values: Mapping[str, Any], expected: Mapping[str, Any], where: str = "config") -> None:
    """Raise ``FieldValueError`` for each entry of ``values`` whose type is not ``expected[name]`` (others pass).

    For a plain dict of settings (the pre-flight check's ``{"num_generations": 8, ...}``): ``expected`` maps a
    field to its annotation, e.g. ``{"num_generations": int, "learning_rate": float}``.
    """
    problems = [
        problem
        for name, hint in expected.items()
        if name in values and (problem := field_problem(name, values[name], hint))
    ]
    if problems:
        raise FieldValueError(f"{where}: " + "; ".join(problems) + " (write numbers without quotes: 8, not '8').")
