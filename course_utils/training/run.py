"""Training with TRL's ``GRPOTrainer``: config from a profile, LoRA, the training prompts, the run, saving.

The package's reference for what notebook 04's learner writes (``GRPOConfig``, ``LoraConfig``,
``GRPOTrainer``), used by scripts, benchmarks and the checks that compare the notebook with it:

1. ``make_grpo_config(profile)``: the real ``GRPOConfig`` fields, read from the hardware profile, with
   the generation batch checked *before* TRL would fail on it (``check_generation_batch``).
2. ``load_model_for_training`` / ``make_lora_config``: the model in its training dtype, LoRA from the profile.
3. ``training_dataset(profile)``: the GRPO prompts (capped in length on the CPU, ``max_prompt_tokens``).
4. ``build_trainer(...)``: ``GRPOTrainer`` with the course's rewards and their weights.
5. ``save_final`` / ``load_trained_model``: the result, in the folder notebook 05 loads.

The warm start before GRPO lives in ``course_utils.training.warm_start``; the dashboard, the saved log history and
the monitoring rules in ``training.monitoring``; ``training.lab`` chains everything for scripts.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import shutil
import warnings
from collections.abc import Iterable, Sequence
from pathlib import Path
from statistics import fmean
from typing import Any

import pandas as pd
import torch
from peft import LoraConfig, PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
from trl import GRPOConfig, GRPOTrainer

from course_utils.core.hardware import cpu_precision, cuda_available
from course_utils.core.paths import output_dir
from course_utils.core.profiles import Profile, get_profile
from course_utils.lesson.data import from_bundled_sample, load_gsm8k
from course_utils.lesson.data_checks import solution_steps
from course_utils.lesson.models import load_model_and_tokenizer, saved_model_kind
from course_utils.lesson.rewards import DEFAULT_PRESET, REWARD_FUNCS, grpo_reward_weights, max_total_reward
from course_utils.lesson.token_lengths import prompt_token_lengths, rows_with_short_prompts
from course_utils.training import problem_choice, run_folder
from course_utils.training.run_folder import (
    FINAL_DIRNAME,
    WARM_START_DIRNAME,
    prepare_resume,  # noqa: F401  # notebook 04 resumes with training.prepare_resume
)

RUN_INFO_FILENAME = "course_run.json"
WARM_START_MARKER = "course_warm_start"  # set on model.config, so a merged or saved model says it was primed
PROMPT_BLOCK_ROWS = 512  # GSM8K prompts rendered and counted at a time while looking for the short ones


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


def default_run_dir(profile: Profile | str | None = None) -> Path:
    """Where a profile's run writes checkpoints, logs and figures: ``outputs/grpo-<profile>``."""
    return output_dir() / f"grpo-{get_profile(profile).name}"


def final_model_dir(profile: Profile | str | None = None) -> Path:
    """Where the trained model (or LoRA adapter) is saved; notebook 05 loads it from here."""
    return default_run_dir(profile) / FINAL_DIRNAME


def warm_start_model_dir(run_dir: str | Path) -> Path:
    """Where a run keeps the warm-started model its GRPO began from (notebook 05 evaluates it; a resume reloads it)."""
    return Path(run_dir) / WARM_START_DIRNAME / "model"


def find_trained_model(profile: Profile | str | None = None, path: str | Path | None = None) -> Path | None:
    """The folder of the profile's trained model or LoRA adapter (or ``path``), or None when it holds none."""
    folder = Path(path) if path is not None else final_model_dir(profile)
    return folder if saved_model_kind(folder) is not None else None


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
    "learning_rate": (0.0, False, "a finite number above 0 (LoRA runs use about 1e-5 to 2e-4)"),
    "beta": (0.0, True, "0 (no reference model) or a finite number above it (the KL penalty's weight; 0.04 is usual)"),
}


def check_training_ranges(config: Any) -> None:
    """Refuse a ``temperature``, ``learning_rate`` or ``beta`` that cannot train, naming the field and its range.

    For a run about to start (the script); a learner's config in notebook 04 is judged by its check instead.
    """
    for name, (low, low_allowed, wanted) in TRAINING_RANGES.items():
        value = getattr(config, name, None)
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not number or not math.isfinite(value) or value < low or (value == low and not low_allowed):
            raise ValueError(f"{name}={value!r} cannot train: it must be {wanted}.")


# Fields shown in the notebook, with why they matter.
CONFIG_FIELD_NOTES: dict[str, str] = {
    "num_generations": "group size G: completions per prompt compared with each other",
    "per_device_train_batch_size": "completions per forward/backward pass on one device",
    "gradient_accumulation_steps": "passes per optimizer step; effective batch = batch x accumulation",
    "generation_batch_size": "completions generated together; must be a multiple of num_generations",
    "max_completion_length": "new tokens per completion; longer ones are cut (see the clipped ratio)",
    "mask_truncated_completions": "cut completions leave the loss; their rewards still enter the group mean and std",
    "temperature": "sampling temperature: diversity inside a group is what GRPO learns from",
    "learning_rate": "step size; too high and the KL / completion length jump",
    "lr_scheduler_type": "how the learning rate changes over the run",
    "max_steps": "optimizer steps in the run",
    "beta": "KL coefficient against the reference model (0.0: no reference model is loaded)",
    "loss_type": "how token losses are averaged (TRL's default 'dapo')",
    "reward_weights": "multipliers of each reward before they are summed",
    "activation_checkpointing": "gradient checkpointing (its transformers 5 name): less memory, ~30% slower",
    "bf16": "bfloat16 mixed precision (Ampere+ GPUs, modern CPUs)",
    "fp16": "float16 mixed precision (T4 and older GPUs)",
    "use_vllm": "generate with vLLM (much faster on a GPU)",
    "report_to": "where TRL also logs the run (TensorBoard event files, to compare runs)",
    "logging_steps": "how often metrics are logged (and the dashboard redraws)",
    "save_steps": "how often a checkpoint is written (resume from the last one)",
}


def config_table(config: Any) -> Any:
    """The fields that matter of a ``GRPOConfig``, with their values and why they matter (a DataFrame)."""
    rows = [
        {"field": f, "value": getattr(config, f, None), "why it matters": note}
        for f, note in CONFIG_FIELD_NOTES.items()
    ]
    return pd.DataFrame(rows).set_index("field")


# --- The "golden config" -----------------------------------------------------------------------------

GOLDEN_CONFIG: dict[str, Any] = {
    "per_device_train_batch_size": 8,
    "gradient_accumulation_steps": 16,
    "learning_rate": 5e-6,
    "max_grad_norm": 0.3,
    "num_train_epochs": 1,
    "logging_steps": 50,
    "save_steps": 1000,
    "fp16": True,
}

GOLDEN_CONFIG_TABLE: tuple[tuple[str, str, str], ...] = (
    (
        "GRPOTrainingArguments(...)",
        "GRPOConfig(...)",
        "GRPOTrainingArguments does not exist in TRL: the class is trl.GRPOConfig (a TrainingArguments subclass).",
    ),
    ("batch 8", "per_device_train_batch_size=8", "Counts completions, not prompts: 8 completions = 1 prompt at G=8."),
    (
        "gradient accumulation 16",
        "gradient_accumulation_steps=16",
        "Effective batch 8 x 16 = 128 completions per optimizer step (16 prompts at G=8); TRL generates them in "
        "one round (generation_batch_size = 128), which must divide by num_generations.",
    ),
    ("(group size)", "num_generations=8", "The group size is num_generations (TRL default 8); old posts call it G."),
    ("lr 5e-6", "learning_rate=5e-6", "Fine for full fine-tuning of a 0.5B+ model; LoRA usually needs ~10x more."),
    ("max_grad_norm 0.3", "max_grad_norm=0.3", "Valid; a QLoRA-era habit. TRL's default is 1.0."),
    (
        "1 epoch",
        "num_train_epochs=1 (or max_steps=N)",
        "One epoch of 7,473 problems at 16 prompts per step is ~467 steps: hours on a T4. max_steps bounds it.",
    ),
    ("logging every 50 steps", "logging_steps=50", "Too coarse to watch a run; log every 1-5 steps."),
    ("save every 1000", "save_steps=1000", "Longer than the whole run (~467 steps): no checkpoint to resume from."),
    (
        "fp16",
        "fp16=True on a T4; bf16=True on A100/H100",
        "GRPOConfig defaults to bf16=True: set fp16=True AND bf16=False on a T4 (no bf16 there), bf16 on Ampere+.",
    ),
    ("KL coefficient", "beta=0.04 (TRL default 0.0)", "The KL coefficient is `beta`; TRL now defaults to 0.0 (no KL)."),
    (
        "max_prompt_length",
        "(removed)",
        "GRPOConfig has no max_prompt_length any more: keep prompts short in the dataset instead.",
    ),
)


def golden_config_table() -> Any:
    """The often-copied "golden config" translated into real ``GRPOConfig`` fields, with what is wrong (a DataFrame)."""
    return pd.DataFrame(GOLDEN_CONFIG_TABLE, columns=["often copied", "real GRPOConfig field", "what to know"])


def golden_config(**overrides: Any) -> Any:
    """The golden config as a real ``GRPOConfig`` (fp16 off on a CPU so that it can be built anywhere)."""
    kwargs: dict[str, Any] = {**GOLDEN_CONFIG, "output_dir": str(output_dir() / "golden-config"), "report_to": []}
    kwargs["bf16"] = False
    if not cuda_available():
        kwargs.update(fp16=False, use_cpu=True)
    kwargs.update(overrides)
    check_generation_batch(kwargs["per_device_train_batch_size"], kwargs["gradient_accumulation_steps"], 8)
    return GRPOConfig(**kwargs)


# --- LoRA ------------------------------------------------------------------------------------------


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


def load_model_for_training(profile: Profile | str | None = None) -> tuple[Any, Any]:
    """The profile's model and tokenizer, in the profile's training dtype (``Profile.training_dtype``).

    Why a training dtype: on a CPU with bfloat16 instructions, a bf16 copy of the weights generates faster
    than fp32 and halves memory; with LoRA the trained adapter weights stay in fp32, so the small updates
    are not lost to bf16 rounding. The evaluation keeps loading the profile's ``dtype``.
    """
    p = get_profile(profile)
    model, tokenizer = load_model_and_tokenizer(p)
    dtype = p.training_dtype
    if dtype != p.dtype:
        if not p.use_lora:
            raise ValueError(
                f"Profile {p.name!r}: train_dtype={dtype} without LoRA would train the {dtype} weights "
                "themselves and lose small updates to rounding; set use_lora=True or train_dtype=None."
            )
        model = model.to(getattr(torch, dtype))
    if p.device == "cpu" and p.train_dtype == "auto":
        print(f"CPU precision: {cpu_precision()}.")
    return model, tokenizer


# --- Data ------------------------------------------------------------------------------------------


def training_dataset(
    profile: Profile | str | None = None, folder: str | Path | None = None, tokenizer: Any = None
) -> Any:
    """The GRPO prompts: the first ``train_size`` GSM8K train problems, with ``prompt`` and gold ``answer``.

    With ``profile.problem_list`` set, the problems of that list (``training.problem_choice``), nothing else.
    With ``profile.max_solution_steps`` set, only problems whose worked solution has at most that many steps
    (``lesson.data_checks.solution_steps``). With ``profile.max_prompt_tokens`` set, the first ``train_size``
    problems whose prompt fits (the ``tokenizer`` counts them), from the rows the warm start does not use; how
    many fit is printed.
    """
    problems = load_gsm8k("train", folder, formatted=True)
    p = fit_to_data(get_profile(profile), problems)
    if p.problem_list is not None:
        return _listed_dataset(p, problems)
    if p.max_prompt_tokens is None and p.max_solution_steps is None:
        return problems.select(range(min(p.train_size, len(problems))))
    problems = problems.select(range(max(len(problems) - p.warm_start_examples, 0)))  # the warm start's rows left out
    problems = _within_solution_steps(p, problems)
    if p.max_prompt_tokens is None:
        return problems.select(range(min(p.train_size, len(problems))))
    if tokenizer is None:
        raise ValueError(
            f"Profile {p.name!r} trains on prompts of at most {p.max_prompt_tokens} tokens (max_prompt_tokens): "
            "pass the tokenizer that counts them, training_dataset(profile, tokenizer=tokenizer)."
        )
    return _short_prompt_dataset(p, problems, tokenizer)


def fit_to_data(p: Profile, train_rows: Any) -> Profile:
    """``p`` as it fits the data: unchanged for GSM8K; shrunk to the bundled sample's rows, said in one line.

    The sample (a few dozen problems, for offline rooms) holds fewer rows than a profile's warm start and GRPO
    prompts: the warm start then takes a third of them, GRPO the rest, and no problem list applies (its problems
    come from GSM8K). Other data too small for the profile stays an error (``warm_start_dataset``).
    """
    needed = p.train_size + p.warm_start_examples
    if not from_bundled_sample(train_rows) or (len(train_rows) >= needed and p.problem_list is None):
        return p
    warm = min(p.warm_start_examples, len(train_rows) // 3)
    train_size = min(p.train_size, len(train_rows) - warm)
    fitted = p.override(warm_start_examples=warm, train_size=train_size, problem_list=None)
    print(f"The bundled sample has {len(train_rows)} train problems (profile {p.name!r} wants {needed}"
          f"{f', from list {p.problem_list!r}' if p.problem_list else ''}): the warm start takes {warm} of them and "
          f"GRPO up to {fitted.train_size}. For the full lab, point GSM8K_DIR at OpenAI's GSM8K files.")  # fmt: skip
    return fitted


def _listed_dataset(p: Profile, problems: Any) -> Any:
    """The problems of the profile's ``problem_list`` (at most ``train_size``), in the list's order, said aloud."""
    listing = problem_choice.load_problem_list(p.problem_list)
    rows = problem_choice.listed_rows(problems["question"], listing)[: p.train_size]
    print(f"Training on the {len(rows)} problems of list {p.problem_list!r}: of {listing['screened']} problems "
          f"screened with {listing['samples_per_problem']} samples each, the ones the warm start solved sometimes "
          f"(data/{problem_choice.LIST_FOLDER}/{p.problem_list}.json says how it was made).")  # fmt: skip
    return problems.select(rows)


def _within_solution_steps(p: Profile, problems: Any) -> Any:
    """The problems whose worked solution has at most ``max_solution_steps`` steps (all when it is None), said aloud."""
    if p.max_solution_steps is None:
        return problems
    kept = [i for i, text in enumerate(problems["reasoning"]) if solution_steps(text) <= p.max_solution_steps]
    print(f"Problems of at most {p.max_solution_steps} solution steps: {len(kept):,} of {len(problems):,}.")
    if not kept:
        raise ValueError(f"No GSM8K train problem has at most {p.max_solution_steps} solution steps "
                         f"(max_solution_steps of profile {p.name!r}); raise it, or set it to None.")  # fmt: skip
    return problems.select(kept)


def _short_prompt_dataset(p: Profile, problems: Any, tokenizer: Any) -> Any:
    """The first ``train_size`` of ``problems`` whose prompt has at most ``max_prompt_tokens`` tokens, said aloud.

    Prompts are measured ``PROMPT_BLOCK_ROWS`` at a time, up to the block that completes ``train_size``: the
    ``cpu`` lab's 256 lie among the first ~2,300 problems, so the other ~5,000 prompts are never rendered.
    """
    candidates = problems
    lengths: list[int] = []
    kept: list[int] = []
    for start in range(0, len(candidates), PROMPT_BLOCK_ROWS):
        block = candidates.select(range(start, min(start + PROMPT_BLOCK_ROWS, len(candidates))))
        lengths += prompt_token_lengths(tokenizer, list(block["prompt"]))
        kept = rows_with_short_prompts(lengths, p.max_prompt_tokens, limit=p.train_size)
        if len(kept) == p.train_size:
            break
    if not kept:
        raise ValueError(
            f"No GSM8K train prompt has at most {p.max_prompt_tokens} tokens (max_prompt_tokens of profile "
            f"{p.name!r}); the shortest has {min(lengths, default=0)}. Raise max_prompt_tokens, or set it to None."
        )
    read = kept[-1] + 1
    print(
        f"Prompts of at most {p.max_prompt_tokens} tokens: training on the first {len(kept):,} problems that fit, "
        f"found among the first {read:,} of {len(candidates):,} (mean prompt {fmean(lengths[i] for i in kept):.0f} "
        f"tokens; {fmean(lengths[:read]):.0f} over those {read:,})."
    )
    if len(kept) < p.train_size:
        warnings.warn(
            f"Only {len(kept)} problems fit in max_prompt_tokens={p.max_prompt_tokens}, fewer than train_size="
            f"{p.train_size}: training cycles over them. Raise max_prompt_tokens for more variety.",
            stacklevel=3,
        )
    return candidates.select(kept)


# --- The trainer -----------------------------------------------------------------------------------


def build_trainer(
    model: Any,
    tokenizer: Any,
    profile: Profile | str | None = None,
    train_dataset: Any = None,
    config: Any = None,
    callbacks: Iterable[TrainerCallback] = (),
    reward_funcs: Sequence[Any] | None = None,
) -> Any:
    """A ``GRPOTrainer`` on the course's five rewards (weights from the config), LoRA from the profile.

    The same call notebook 04's learner writes out: plain TRL. The CPU speed-ups are applied around
    ``trainer.train()`` (``with cpu_speed.enabled(trainer):``), not here.
    """
    p = get_profile(profile)
    config = config if config is not None else make_grpo_config(p)
    funcs = list(reward_funcs) if reward_funcs is not None else list(REWARD_FUNCS)
    if config.reward_weights is not None and len(config.reward_weights) != len(funcs):
        raise ValueError(
            f"{len(config.reward_weights)} reward_weights for {len(funcs)} reward functions: give one weight each."
        )
    if train_dataset is None:
        train_dataset = training_dataset(p, tokenizer=tokenizer)
    missing = {"prompt", "answer"} - set(train_dataset.column_names)
    if missing:
        raise ValueError(
            f"train_dataset lacks column(s) {sorted(missing)}: "
            "build it with training_dataset(profile, tokenizer=tokenizer)."
        )
    return GRPOTrainer(
        model=model,
        reward_funcs=funcs,
        args=config,
        train_dataset=train_dataset,
        processing_class=tokenizer,
        peft_config=make_lora_config(p, model),
        callbacks=list(callbacks),
    )


def clear_run_dir(run_dir: str | Path) -> Path:
    """Delete an earlier run (a fresh start) from a folder the course made; keep the warm start.

    Only the course's own entries go, and only from a folder it marked; anything else is refused by name
    (``run_folder.clear``): a run folder given by mistake (``.``, the outputs root, a project) is never emptied.
    """
    return run_folder.clear(run_dir)


# --- The lab's reward scale ---------------------------------------------------------------------


def max_reward(config: Any = None) -> float:
    """The largest total reward one completion can get under the config's reward weights."""
    weights = getattr(config, "reward_weights", None) if config is not None else None
    return max_total_reward(resolve_reward_weights(weights))


# --- Saving and loading the result -----------------------------------------------------------------


def save_final(trainer: Any, tokenizer: Any, folder: str | Path | None = None, merge: bool | None = None) -> Path:
    """Save the trained model where notebook 05 finds it (``final_model_dir``); return the folder.

    A LoRA run saves only its adapter (megabytes), unless the base model was warm-started: then
    the adapter alone would not reproduce the model (its base exists nowhere else), so it is merged
    and the full model is saved. ``merge`` forces one or the other.
    """
    folder = Path(folder) if folder is not None else Path(trainer.args.output_dir) / FINAL_DIRNAME
    model = trainer.model
    is_peft = hasattr(model, "peft_config")
    if merge is None:
        merge = is_peft and getattr(model.config, WARM_START_MARKER, None) is not None
    if is_peft and merge:
        model = model.merge_and_unload()
    partial = folder.with_name(folder.name + ".partial")  # written aside, then renamed: never a half-saved model
    if partial.exists():
        shutil.rmtree(partial)
    model.save_pretrained(partial)
    tokenizer.save_pretrained(partial)
    info = {
        "kind": "lora-adapter" if is_peft and not merge else "full-model",
        "global_step": trainer.state.global_step,
        "warm_start": getattr(model.config, WARM_START_MARKER, None),
    }
    (partial / RUN_INFO_FILENAME).write_text(json.dumps(info, indent=2))
    return run_folder.replace_folder(partial, folder)


def load_trained_model(profile: Profile | str | None = None, folder: str | Path | None = None) -> tuple[Any, Any]:
    """The model trained in notebook 04 and its tokenizer (left padding), from ``final_model_dir(profile)``.

    A LoRA adapter is loaded on top of the profile's base model; a full model is loaded directly.
    """
    p = get_profile(profile)
    folder = Path(folder) if folder is not None else final_model_dir(p)
    kind = saved_model_kind(folder)
    if kind is None:
        raise FileNotFoundError(
            f"No trained model in {folder}. Run notebooks/04_train_grpo.ipynb with COURSE_PROFILE={p.name} first."
        )
    fix = f"Train it again (notebook 04 with COURSE_PROFILE={p.name}), or resume its run from a complete checkpoint."
    base = load_model_and_tokenizer(p)[0] if kind == "lora-adapter" else None
    with run_folder.loading(folder, "The trained model", fix):
        if base is not None:
            model = PeftModel.from_pretrained(base, folder)
        else:
            model = AutoModelForCausalLM.from_pretrained(folder, dtype=getattr(torch, p.dtype))
        tokenizer = AutoTokenizer.from_pretrained(folder)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return model.eval(), tokenizer
