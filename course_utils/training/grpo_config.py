"""``GRPOConfig`` from a hardware profile: precision, the generation batch, vLLM, trackers, reward weights.

The package's reference for the ``GRPOConfig(...)`` notebook 04's learner writes: ``make_grpo_config(profile)``
sets every field that matters from the profile and checks the generation batch *before* TRL would fail on it
(``check_generation_batch``); ``check_training_ranges`` refuses values that cannot train; ``max_reward`` is the
lab's reward scale under the config's weights.
"""

from __future__ import annotations

import importlib.util
import math
import os
import typing
from pathlib import Path
from typing import Any

from trl import GRPOConfig

from course_utils.core.field_checks import PROFILE_MINIMUMS, field_problem, range_problem
from course_utils.core.profiles import Profile, get_profile
from course_utils.lesson.rewards import DEFAULT_PRESET, grpo_reward_weights, max_total_reward
from course_utils.training.trained_model import default_run_dir

# --- Precision and the generation batch ------------------------------------------------------------


def precision_flags(profile: Profile) -> dict[str, bool]:
    """``bf16``/``fp16``/``use_cpu`` for ``GRPOConfig``: always explicit, because TRL defaults to ``bf16=True``.

    Both follow the dtype the model trains in: a T4 has no bf16, so ``colab-t4`` trains in fp16; a CPU
    profile uses bf16 autocast exactly when its model trains in bf16, which ``train_dtype="auto"`` picks
    only where the CPU computes bf16 natively (``course_utils.core.hardware.cpu_precision``).
    """
    dtype = profile.training_dtype
    return {"bf16": dtype == "bfloat16", "fp16": dtype == "float16", "use_cpu": profile.device == "cpu"}


class GenerationBatchError(ValueError):
    """The completions generated per step do not form whole groups of ``num_generations``."""


def check_generation_batch(
    per_device_train_batch_size: int,
    gradient_accumulation_steps: int,
    num_generations: int,
    num_processes: int = 1,
) -> int:
    """Return the generation batch (completions per generation round); raise a clear error when it is unusable.

    GRPO compares completions *within a group* of ``num_generations`` answers to one prompt, so the
    completions generated together (per-device batch x processes x accumulation steps, TRL's
    ``generation_batch_size``) must hold whole groups. TRL checks this too, deep inside ``GRPOConfig``;
    checking here first gives the learner the fix instead of a traceback.
    """
    values = {
        "per_device_train_batch_size": per_device_train_batch_size,
        "gradient_accumulation_steps": gradient_accumulation_steps,
        "num_processes": num_processes,
    }
    for name, value in values.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise GenerationBatchError(f"{name} must be a positive integer, got {value!r}")
    if not isinstance(num_generations, int) or isinstance(num_generations, bool) or num_generations < 2:
        raise GenerationBatchError(
            "num_generations must be an integer >= 2 (GRPO compares completions within a group), "
            f"got {num_generations!r}"
        )
    batch = per_device_train_batch_size * num_processes * gradient_accumulation_steps
    if batch % num_generations:
        divisors = [g for g in range(2, batch + 1) if batch % g == 0]
        multiple = -(-per_device_train_batch_size // num_generations) * num_generations
        raise GenerationBatchError(
            f"The generation batch is per_device_train_batch_size ({per_device_train_batch_size}) x processes "
            f"({num_processes}) x gradient_accumulation_steps ({gradient_accumulation_steps}) = {batch} completions, "
            f"which is not a whole number of groups of num_generations={num_generations}. Fix: set "
            f"per_device_train_batch_size to a multiple of {num_generations} (e.g. {multiple}), or num_generations "
            f"to a divisor of {batch} (one of {divisors})."
        )
    return batch



# --- GRPOConfig from a profile ---------------------------------------------------------------------

def vllm_available() -> bool:
    """True when the ``vllm`` package is importable (it is only ever installed on GPU machines)."""
    return importlib.util.find_spec("vllm") is not None


def vllm_enabled(profile: Profile) -> bool:
    """``GRPOConfig(use_vllm=...)``: the profile asks for vLLM, on a GPU, and vLLM is installed (else it says so)."""
    if not (profile.use_vllm and profile.device == "cuda"):
        return False
    if not vllm_available():
        print(f'Profile {profile.name!r}: vLLM is not installed, generating with transformers (pip install ".[vllm]").')
        return False
    return True


RUN_TRACKERS = {"tensorboard": "tensorboard", "trackio": "trackio"}  # report_to value: the package it needs


def report_to_targets(profile: Profile | str | None = None) -> list[str]:
    """``GRPOConfig(report_to=...)`` for the profile's ``report_to``: [] for "none", else the tracker, if installed.

    Why a check: transformers only fails on a missing tracker when the trainer is built; here the learner
    gets the install command at once.
    """
    p = get_profile(profile)
    if p.report_to == "none":
        return []
    if p.report_to not in RUN_TRACKERS:
        raise ValueError(f"report_to={p.report_to!r} is not one of {['none', *RUN_TRACKERS]} (profile {p.name!r})")
    package = RUN_TRACKERS[p.report_to]
    if importlib.util.find_spec(package) is None:
        raise ValueError(f"report_to={p.report_to!r} needs the {package!r} package: pip install {package}")
    return [p.report_to]


def resolve_reward_weights(weights: Any = None) -> list[float]:
    """Reward weights in ``REWARD_FUNCS`` order, from a preset name, a list or a dict; None means "initial".

    The "initial" preset is all 1.0: the rewards already return the article's first table of sizes.
    """
    return grpo_reward_weights(DEFAULT_PRESET if weights is None else weights)


def grpo_config_kwargs(profile: Profile | str | None = None, output_dir: str | Path | None = None) -> dict[str, Any]:
    """The ``GRPOConfig`` keyword arguments for a profile, as a plain dict (tests read it on any machine).

    Every field that matters is set explicitly, even when it equals TRL's default: TRL's defaults
    (``bf16=True``, ``gradient_checkpointing=True``, ``num_generations=8``) differ from ``TrainingArguments``'
    and change between releases, and a learner should see the run's real settings.
    """
    p = get_profile(profile)
    return {
        "output_dir": str(output_dir or default_run_dir(p)),
        # Group size and batch: prompts per step = batch x accumulation / num_generations
        "num_generations": p.num_generations,
        "per_device_train_batch_size": p.per_device_train_batch_size,
        "gradient_accumulation_steps": p.gradient_accumulation_steps,
        "max_completion_length": p.max_completion_length,
        "mask_truncated_completions": p.mask_truncated_completions,
        "temperature": p.temperature,
        # Optimisation
        "learning_rate": p.learning_rate,
        "lr_scheduler_type": p.lr_scheduler_type,
        "warmup_steps": p.warmup_steps,
        "max_grad_norm": p.max_grad_norm,
        "max_steps": p.max_steps,
        "beta": p.beta,  # KL coefficient; 0.0 = no reference model (less memory, faster)
        "loss_type": "dapo",
        "reward_weights": resolve_reward_weights(p.reward_weights),
        "scale_rewards": p.scale_rewards,
        # Speed and memory
        "activation_checkpointing": p.gradient_checkpointing,  # transformers 5 name of gradient_checkpointing
        **precision_flags(p),
        "use_vllm": vllm_enabled(p),
        "vllm_mode": "colocate",  # vLLM shares the training GPU: no second server to start
        "vllm_gpu_memory_utilization": p.vllm_gpu_memory_utilization,
        "dataloader_num_workers": 0,
        # Logging and checkpoints
        "logging_steps": p.logging_steps,
        "save_strategy": "steps",
        "save_steps": p.save_steps,
        "save_total_limit": 2,
        "report_to": report_to_targets(p),
        "seed": 42,
    }


def make_grpo_config(
    profile: Profile | str | None = None, output_dir: str | Path | None = None, **overrides: Any
) -> Any:
    """A ``trl.GRPOConfig`` for the profile; ``overrides`` replace single fields (unknown names are an error).

    The one place the generation batch is checked on the package's path (``check_generation_batch``), after
    the overrides, so the learner reads the fix instead of TRL's error.
    """
    kwargs = grpo_config_kwargs(profile, output_dir)
    known = set(GRPOConfig.__dataclass_fields__)
    unknown = sorted(set(overrides) - known)
    profile_fields = [name for name in unknown if name in Profile.__dataclass_fields__]
    if profile_fields:
        raise ValueError(
            f"GRPOConfig has no field(s) {profile_fields}: they are profile fields. Change them in the profile: "
            f"--set {profile_fields[0]}=... for scripts/train_grpo.py, profile.override({profile_fields[0]}=...) in "
            "a notebook."
        )
    if unknown:
        raise ValueError(f"GRPOConfig has no field(s) {unknown}. Check the spelling; see GOLDEN_CONFIG_TABLE.")
    kwargs.update(overrides)
    check_generation_batch(
        kwargs["per_device_train_batch_size"],
        kwargs["gradient_accumulation_steps"],
        kwargs["num_generations"],
        int(os.environ.get("WORLD_SIZE", "1")),  # set by torchrun / accelerate launch
    )
    return GRPOConfig(**kwargs)


# Values GRPOConfig accepts and training then fails on (a division by 0, inf or nan weights) or runs backwards with:
# the smallest allowed value, whether it is allowed itself, and what to give
TRAINING_RANGES: dict[str, tuple[float, bool, str]] = {
    "temperature": (0.0, False, "a finite number above 0 (sampling divides the logits by it; 1.0 is usual)"),
    "learning_rate": (0.0, False, "a finite number above 0 (LoRA runs use about 1e-5 to 5e-4)"),
    "beta": (0.0, True, "0 (no reference model) or a finite number above it (the KL penalty's weight; 0.04 is usual)"),
}


def check_training_ranges(config: Any) -> None:
    """Refuse a ``temperature``, ``learning_rate`` or ``beta`` that cannot train, naming the field and its range,
    and a field the profile also has (``max_steps``, lengths, batch) of another type or outside the profile's range.

    For a run about to start (the script); a learner's config in notebook 04 is judged by its check instead.
    """
    for name, (low, low_allowed, wanted) in TRAINING_RANGES.items():
        value = getattr(config, name, None)
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not number or not math.isfinite(value) or value < low or (value == low and not low_allowed):
            raise ValueError(f"{name}={value!r} cannot train: it must be {wanted}.")
    # The fields a profile also has (max_steps, batch, lengths, ...) keep the profile's types and ranges when
    # --config sets them: GRPOConfig takes max_steps=-1 (3 epochs) or max_completion_length=0 without a word
    hints = typing.get_type_hints(Profile)
    shared = [name for name in PROFILE_MINIMUMS
              if name in GRPOConfig.__dataclass_fields__ and getattr(config, name, None) is not None]  # None: unset
    problems = [problem for name in shared
                if (problem := field_problem(name, value := getattr(config, name), hints[name])
                    or range_problem(name, value))]  # fmt: skip
    if problems:
        raise ValueError("GRPOConfig: " + "; ".join(problems))


# --- The lab's reward scale ---------------------------------------------------------------------


def max_reward(config: Any = None) -> float:
    """The largest total reward one completion can get under the config's reward weights."""
    weights = getattr(config, "reward_weights", None) if config is not None else None
    return max_total_reward(resolve_reward_weights(weights))
