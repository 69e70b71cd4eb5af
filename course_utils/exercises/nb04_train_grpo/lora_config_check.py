"""04.2: the learner's ``LoraConfig``: targets that are linear layers of the model, the same layers adapted as
the profile's config adapts by peft's own matching (a list, a pattern that limits the layers itself, or the top
layers as indices: an int is one layer to peft, not a count), a rank and an update scale near the profile's.
"""

from __future__ import annotations

import math
import re
from types import SimpleNamespace
from typing import Any

import torch
from peft import LoraConfig
from peft.tuners.tuners_utils import check_target_module_exists
from peft.utils import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING

from course_utils.core.profiles import Profile
from course_utils.exercises.nb04_train_grpo.judging import PEFT, judge, kind_problem, problems_of
from course_utils.exercises.nb04_train_grpo.machine_fit import LEARNING_RATE_FACTOR
from course_utils.exercises.nb04_train_grpo.run_fields import LORA_FIELDS, field_problems
from course_utils.exercises.verdicts import hand_back, report, shown
from course_utils.training.lora_setup import make_lora_config, top_layer_indices


def linear_layer_names(model: Any) -> list[str]:
    """The full names of the model's ``nn.Linear`` layers (what LoRA adapts)."""
    return [name for name, module in model.named_modules() if isinstance(module, torch.nn.Linear)]


def target_problems(targets: Any, model: Any) -> list[str]:
    """``target_modules`` names linear layers of ``model`` (a list of names, a regex, ``"all-linear"``)."""
    linear = linear_layer_names(model)
    kinds = sorted({name.rsplit(".", 1)[-1] for name in linear})
    if targets is None:
        model_type = getattr(getattr(model, "config", None), "model_type", None)
        known = model_type in TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING
        return [] if known else [f"target_modules is not set; name some of the linear layers {kinds}"]
    if isinstance(targets, str):
        if targets == "all-linear" or any(re.fullmatch(targets, name) for name in linear):
            return []
        return [f"target_modules {targets!r} matches no linear layer of the model; its linear layers are {kinds}"]
    missing = sorted(t for t in targets if not any(n == t or n.endswith(f".{t}") for n in linear))
    if missing or not targets:
        return [f"target_modules {missing or []} are not linear layers of {type(model).__name__}, "
                f"whose linear layers are {kinds}"]
    return []


def adapted_modules(config: Any, model: Any) -> set[str]:
    """The linear layers of ``model`` that peft adapts with ``config``, by peft's own matching.

    ``None`` targets are peft's default for the architecture; ``"all-linear"`` is every linear layer but the output
    head; a pattern is matched whole (peft then ignores ``layers_to_transform``); names honour the layer indices.
    """
    linear = linear_layer_names(model)
    targets = config.target_modules
    if targets is None:
        model_type = getattr(getattr(model, "config", None), "model_type", None)
        targets = TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING.get(model_type, [])
    if targets == "all-linear":
        targets = [name for name in linear if not name.endswith("lm_head")]
    probe = SimpleNamespace(
        target_modules=targets if isinstance(targets, str) else set(targets), target_parameters=None,
        exclude_modules=config.exclude_modules, modules_to_save=config.modules_to_save,
        layers_to_transform=config.layers_to_transform, layers_pattern=config.layers_pattern,
    )
    return {name for name in linear if check_target_module_exists(probe, name)}


def _kinds(names: set[str]) -> set[str]:
    return {name.rsplit(".", 1)[-1] for name in names}


def _layers(names: set[str]) -> list[int]:
    return sorted({int(match[1]) for name in names if (match := re.search(r"\.(\d+)\.", name))})


def target_kind_problems(targets: Any, given: set[str], wanted: set[str]) -> list[str]:
    """The profile's kinds of layer (``q_proj``...) adapted, however the targets are written."""
    fewer, more = sorted(wanted - given), sorted(given - wanted)
    if not (fewer or more):
        return []
    parts = [f"leaves out {fewer}" if fewer else "", f"adds {more}" if more else ""]
    return [f"target_modules={shown(targets)} {' and '.join(p for p in parts if p)}: the profile adapts "
            f"{sorted(wanted)} (profile.lora_target_modules); fewer adapted layers learn less in the run's few "
            "steps, more cost memory and time the profile did not measure"]


def adaptation_problems(config: Any, reference: Any, profile: Profile, model: Any) -> list[str]:
    """The same linear layers adapted as the profile's config adapts, however the targets and layers are written."""
    given, wanted = adapted_modules(config, model), adapted_modules(reference, model)
    if given == wanted:
        return []
    if kinds := target_kind_problems(config.target_modules, _kinds(given), _kinds(wanted)):
        return kinds
    if not isinstance(config.target_modules, str) and (layers := top_layers_problems(config.layers_to_transform,
                                                                                    profile, model)):
        return layers
    low, high = _layers(wanted)[0], _layers(wanted)[-1]
    return [f"target_modules={shown(config.target_modules)} adapts {len(given)} linear layers, in decoder layers "
            f"{shown(_layers(given))}; the profile adapts {len(wanted)}: each of {sorted(_kinds(wanted))} in layers "
            f"{low} to {high}, where the backward pass it measured stops"]


def layer_problems(layers: Any, model: Any) -> list[str]:
    """``layers_to_transform``: None (every layer) or indices of decoder layers the model has."""
    if layers is None:
        return []
    depth = getattr(getattr(model, "config", None), "num_hidden_layers", None)
    indices = [layers] if isinstance(layers, int) else list(layers)
    bad = [i for i in indices if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < (depth or 0)]
    if bad or not indices:
        return [f"layers_to_transform {layers!r}: the model has decoder layers 0 to {(depth or 1) - 1}"
                + (f"; {bad} are not among them" if bad else "; an empty list adapts nothing")]
    return []


def top_layers_problems(layers: Any, profile: Profile, model: Any) -> list[str]:
    """The profile's ``lora_top_layers`` top decoder layers, as a list of indices (None: every layer)."""
    count = profile.lora_top_layers
    if count is None:
        return []
    wanted = top_layer_indices(model, count)
    given = [layers] if isinstance(layers, int) else sorted(layers) if layers is not None else None
    if given == wanted:
        return []
    why = ("the gradient then stops at the lowest adapted layer, so the backward pass covers only the top "
           f"{count} layers: that is the time per step the profile announces")
    if layers is None:
        return [f"layers_to_transform=None adapts every layer; the profile adapts only the top {count} ({wanted[0]} "
                f"to {wanted[-1]}): {why}"]
    if isinstance(layers, int):
        return [f"layers_to_transform={layers} adapts the one layer numbered {layers}, not the top {count}: peft "
                f"reads an int as one layer index; pass the list of indices {wanted[0]} to {wanted[-1]}"]
    return [f"layers_to_transform={shown(layers)}: the profile adapts the top {count} layers, {wanted[0]} to "
            f"{wanted[-1]}: {why}"]


# LoRA's rank may be halved or doubled: the adapters' capacity changes, the run's time and memory barely do.
RANK_FACTOR = 2


def rank_problems(config: Any, profile: Profile) -> list[str]:
    """A rank within ``RANK_FACTOR`` of the profile's, with ``lora_alpha / r`` keeping the update's scale."""
    r, wanted = config.r, profile.lora_r
    if not isinstance(r, int) or r < 1:
        return [f"r={r!r}: the rank of the two small matrices must be a whole number >= 1"]
    low, high = max(1, wanted // RANK_FACTOR), wanted * RANK_FACTOR
    if not low <= r <= high:
        return [f"r={r}: the profile's rank is {wanted} (accepted: {low} to {high}); a rank far off changes what "
                "the adapters can learn in the run's few steps and the memory the profile measured"]
    return []


def update_scale(config: Any) -> float:
    """What peft multiplies the adapters' output by: ``lora_alpha / r``, or ``lora_alpha / sqrt(r)`` with rslora."""
    return config.lora_alpha / (math.sqrt(config.r) if config.use_rslora else config.r)


def scale_problems(config: Any, reference: Any) -> list[str]:
    """``lora_alpha`` > 0, and the update's scale within ``LEARNING_RATE_FACTOR`` of the profile's."""
    alpha = config.lora_alpha
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or alpha <= 0:
        return [f"lora_alpha={alpha!r}: the update is scaled by lora_alpha / r, so it must be > 0"]
    yours, wanted = update_scale(config), update_scale(reference)
    low, high = wanted / LEARNING_RATE_FACTOR, wanted * LEARNING_RATE_FACTOR
    if low <= yours <= high:
        return []
    written = "lora_alpha / sqrt(r)" if config.use_rslora else "lora_alpha / r"
    return [f"lora_alpha={alpha:g} with r={config.r}: the update is scaled by {written} = {yours:g}, the profile's by "
            f"{wanted:g} (accepted: {low:g} to {high:g}); the scale multiplies every step as the learning rate does"]


def lora_config_problems(config: Any, profile: Profile, model: Any) -> list[str]:
    """Everything a ``LoraConfig`` gets wrong for this model (None is right only where the profile has no LoRA)."""
    if not profile.use_lora:
        return [] if config is None else ["this profile trains every weight (use_lora=False): set lora = None"]
    kind = kind_problem(config, LoraConfig, "LoraConfig")
    if kind:
        return kind
    reference = make_lora_config(profile, model)
    problems = rank_problems(config, profile)
    if not problems:
        problems += scale_problems(config, reference)
    task = str(getattr(config.task_type, "value", config.task_type))
    if config.task_type is not None and task != "CAUSAL_LM":
        problems.append(f"task_type={task!r}: a language model that generates is 'CAUSAL_LM'")
    problems += field_problems(config, reference, LORA_FIELDS)
    invalid = [*target_problems(config.target_modules, model), *layer_problems(config.layers_to_transform, model)]
    return [*problems, *(invalid or adaptation_problems(config, reference, profile, model))]


LORA_HINT = ("the profile's lora_* fields give the rank, alpha and target names (print(model) lists its layers); "
             "training.top_layer_indices turns a number of top layers into indices; None only where the profile "
             "trains every weight")


def check_lora_config(config: Any, profile: Profile, model: Any) -> Any:
    """04.2: the learner's ``LoraConfig`` for ``model``; hands back it when it passed, else ``make_lora_config``."""
    exercise = "04.2 LoraConfig"
    problems = problems_of(lora_config_problems, config, profile, model)
    if config is None and not profile.use_lora:
        passed = report(exercise, True, LORA_HINT, "no LoRA")
    else:
        passed = judge(exercise, config, problems, LORA_HINT, PEFT)
    reference = None if passed else make_lora_config(profile, model)
    return hand_back(exercise, passed, config, reference, "training.make_lora_config(profile, model)")
