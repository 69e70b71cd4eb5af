"""A planned GRPO run's settings read as the installed TRL reads them, before anything is built.

``config_values`` fills a ``GRPOConfig`` or a dict of its arguments with TRL's own defaults (a misspelt key is an
error naming the closest real one); ``generation_batch`` derives the generation batch as ``GRPOConfig`` does;
``trl_choices`` reads the values TRL documents for a field; ``on_policy`` says whether an update can differ from
the policy that sampled. ``preflight``'s checks read a config through these.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from typing import Any

from trl import GRPOConfig


def _grpo_defaults() -> dict[str, Any]:
    """GRPOConfig's field defaults, read without building one (building one runs the checks we explain)."""
    defaults = {}
    for f in dataclasses.fields(GRPOConfig):
        if f.default is not dataclasses.MISSING:
            defaults[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            defaults[f.name] = f.default_factory()
    return defaults


def config_values(config: Any) -> dict[str, Any]:
    """The settings of ``config`` (a ``GRPOConfig`` or a dict of its arguments) with GRPOConfig's defaults filled in.

    A dict key GRPOConfig does not know is an error naming the closest real argument, because a
    misspelt ``num_generation`` would otherwise silently leave the default in place.
    """
    defaults = _grpo_defaults()
    if isinstance(config, dict):
        unknown = sorted(set(config) - set(defaults))
        if unknown:
            hints = {k: difflib.get_close_matches(k, list(defaults), n=1) for k in unknown}
            listed = ", ".join(f"{k!r}" + (f" (did you mean {h[0]!r}?)" if h else "") for k, h in hints.items())
            raise ValueError(f"Not a GRPOConfig argument: {listed}")
        values = {**defaults, **config}
    elif hasattr(config, "to_dict") and hasattr(config, "num_generations"):
        values = {name: getattr(config, name) for name in defaults if hasattr(config, name)}
    else:
        raise TypeError(f"config must be a trl.GRPOConfig or a dict of its arguments, got {type(config).__name__}")
    if values.get("bf16") is None:  # TRL's rule: bf16 unless fp16 is set
        values["bf16"] = not values.get("fp16", False)
    return values


def generation_batch(
    values: dict[str, Any], num_processes: int = 1, *, built: bool = False
) -> tuple[int | None, int | None, str | None]:
    """(generation_batch_size, steps_per_generation, problem) the way GRPOConfig derives them.

    Default: steps_per_generation = gradient_accumulation_steps and generation batch = per-device batch
    x processes x steps_per_generation. ``problem`` is a message when the two were both set, or the
    generation batch is not a whole number of global batches. ``built=True`` for the values of a
    ``GRPOConfig`` object, which carries both settings, filled in consistently by its ``__post_init__``.
    """
    per_step = values["per_device_train_batch_size"] * num_processes
    size, steps = values.get("generation_batch_size"), values.get("steps_per_generation")
    if size is not None and steps is not None:
        if built and size == per_step * steps:
            return size, steps, None
        return None, None, "generation_batch_size and steps_per_generation are both set"
    if size is None:
        steps = steps if steps is not None else values["gradient_accumulation_steps"]
        return per_step * steps, steps, None
    if size % per_step:
        return None, None, f"generation_batch_size ({size}) is not a multiple of the global batch ({per_step})"
    return size, size // per_step, None


def trl_choices(field_name: str) -> tuple[str, ...]:
    """The values the installed TRL documents for a ``GRPOConfig`` field (its "Supported values are ..." help).

    Read from the installed TRL, not copied here, so a TRL release that adds a loss type is known at once. TRL
    writes the values two ways: in one sentence (``'grpo', 'dr_grpo', ...``), or each in backticks with its
    description (`` `'sum_then_normalize'` (default): ...``, where sentences end inside the list). An empty tuple
    when the field's help lists no values.
    """
    spec = GRPOConfig.__dataclass_fields__.get(field_name)
    help_text = spec.metadata.get("help", "") if spec is not None else ""
    match = re.search(r"Supported values are(.*)", help_text, re.S)
    if not match:
        return ()
    listed = re.findall(r"`'?([a-z_]+)'`", match.group(1))  # `group'` too: one of TRL's values lacks its quote
    if listed:
        return tuple(dict.fromkeys(listed))
    sentence = re.match(r"(.*?)\.(?:\s|$)", match.group(1), re.S)
    return tuple(dict.fromkeys(re.findall(r"'([a-z_]+)'", sentence.group(1) if sentence else match.group(1))))


def on_policy(values: dict[str, Any], num_processes: int = 1, *, built: bool = False) -> bool:
    """True when every update uses completions of the current policy (TRL then sets the old log-probs to the new).

    That is ``num_iterations == 1`` and no more generation steps than accumulation steps: the importance ratio is
    exactly 1, so clipping, clip-higher and sequence-level ratios cannot change anything.
    """
    _, steps, problem = generation_batch(values, num_processes, built=built)
    if problem:
        return False
    return values.get("num_iterations", 1) == 1 and steps <= values["gradient_accumulation_steps"]
