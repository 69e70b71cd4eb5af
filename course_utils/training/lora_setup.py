"""LoRA from a profile: the target layers checked against the model, the top decoder layers, the ``LoraConfig``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from peft import LoraConfig

from course_utils.core.profiles import Profile, get_profile


def lora_targets_in(model: Any, wanted: Sequence[str]) -> list[str]:
    """The names in ``wanted`` that are ``nn.Linear`` layers of ``model`` (sorted); an error names what is missing.

    Why check: a LoRA config naming modules the architecture does not have trains nothing (peft
    raises late, or silently adapts fewer layers); Qwen2 and Llama share the ``*_proj`` names.
    """
    present = {name.rsplit(".", 1)[-1] for name, module in model.named_modules() if isinstance(module, torch.nn.Linear)}
    found = sorted(set(wanted) & present)
    missing = sorted(set(wanted) - present)
    if not found or missing:
        raise ValueError(
            f"LoRA targets {missing or list(wanted)} are not linear layers of {type(model).__name__}; "
            f"its linear layers are {sorted(present)}. Set lora_target_modules to some of those."
        )
    return found


def make_lora_config(profile: Profile | str | None = None, model: Any = None) -> Any:
    """A ``peft.LoraConfig`` from the profile (None when the profile fine-tunes all weights).

    With ``model`` given, the target modules are checked against its layers first.
    """
    p = get_profile(profile)
    if not p.use_lora:
        return None
    targets = list(p.lora_target_modules)
    if model is not None:
        targets = lora_targets_in(model, targets)
    layers = None
    if p.lora_top_layers is not None:
        if model is None:
            raise ValueError(f"Profile {p.name!r} sets lora_top_layers: pass the model, whose depth picks the layers.")
        layers = top_layer_indices(model, p.lora_top_layers)
    return LoraConfig(
        r=p.lora_r,
        lora_alpha=p.lora_alpha,
        lora_dropout=0.0,
        target_modules=targets,
        layers_to_transform=layers,
        task_type="CAUSAL_LM",
    )


def top_layer_indices(model: Any, count: int) -> list[int]:
    """Indices of the top ``count`` decoder layers of ``model`` (for ``LoraConfig(layers_to_transform=...)``).

    Why only the top layers: gradients flow from the loss down to the lowest trained parameter and stop
    there, so adapting the top half halves the backward pass through the decoder layers and the
    activations kept for it (the output head's share stays). The appendix notebook explains the choice.
    """
    depth = getattr(getattr(model, "config", None), "num_hidden_layers", None)
    if not isinstance(depth, int):
        raise ValueError(f"{type(model).__name__} has no config.num_hidden_layers: cannot pick its top layers")
    if not isinstance(count, int) or not 1 <= count <= depth:
        raise ValueError(f"lora_top_layers must be an integer from 1 to {depth} (the model's depth), got {count!r}")
    return list(range(depth - count, depth))
