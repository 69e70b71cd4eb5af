"""Training with TRL's ``GRPOTrainer``: config from a profile, warm start, live dashboard, monitoring, saving.

Notebook 04 calls these functions one per cell, so every step of a GRPO run is visible and short:

1. ``make_grpo_config(profile)``: the real ``GRPOConfig`` fields, read from the hardware profile, with
   the generation batch checked *before* TRL would crash on it (``check_generation_batch``).
2. ``warm_start(...)``: a short supervised "cold start" with TRL's ``SFTTrainer`` (as DeepSeek-R1 does)
   so a small model writes the XML format sometimes; with no format at all every reward is 0, every
   group has the same reward and GRPO has nothing to learn from.
3. ``build_trainer(...)``: ``GRPOTrainer`` with the course's rewards and their weights.
4. ``LiveDashboard``: a ``TrainerCallback`` that redraws the training curves at every log.
5. ``monitor(log_history)``: the monitoring rules as code; ``save_run_artifacts`` writes CSV and PNG.
6. ``save_final`` / ``load_trained_model``: the result, in the folder notebook 05 loads.
"""

from __future__ import annotations

import json
import re
import shutil
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from statistics import median
from typing import Any

from transformers import TrainerCallback

from course_utils.paths import output_dir
from course_utils.profiles import Profile, get_profile

FINAL_DIRNAME = "final"
WARM_START_DIRNAME = "warm_start"
RUN_INFO_FILENAME = "course_run.json"
WARM_START_MICRO_BATCH = 2  # warm-start sequences per forward pass (memory); the profile sets the effective batch
WARM_START_MARKER = "course_warm_start"  # set on model.config, so a merged or saved model says it was primed


# --- Precision and the generation batch ------------------------------------------------------------


def cpu_supports_bf16() -> bool:
    """True when this CPU computes bfloat16 natively (AVX512-BF16 or AMX): then bf16 autocast is ~2x faster.

    Why a flag check: on CPUs without these instructions bf16 is emulated and slower than fp32, so the
    course only turns bf16 autocast on where it pays off. Non-Linux machines answer False (safe default).
    """
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return bool(re.search(r"\b(avx512_bf16|amx_bf16)\b", flags))


def precision_flags(profile: Profile) -> dict[str, bool]:
    """``bf16``/``fp16``/``use_cpu`` for ``GRPOConfig``: always explicit, because TRL defaults to ``bf16=True``.

    GPU profiles follow the profile's dtype (a T4 has no bf16, so ``colab-t4`` trains in fp16). CPU
    profiles keep fp32 weights and use bf16 *autocast* when the CPU supports it natively.
    """
    if profile.device == "cuda":
        return {"bf16": profile.dtype == "bfloat16", "fp16": profile.dtype == "float16", "use_cpu": False}
    wants_bf16 = "bfloat16" in (profile.dtype, profile.train_dtype)
    return {"bf16": wants_bf16 or cpu_supports_bf16(), "fp16": False, "use_cpu": True}


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


def vllm_available() -> bool:
    """True when the ``vllm`` package is importable (it is only ever installed on GPU machines)."""
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


def resolve_reward_weights(weights: Any = None) -> list[float]:
    """Reward weights in ``REWARD_FUNCS`` order; None means every reward at its natural size (all 1.0).

    Why 1.0 by default: the rewards already carry their sizes (correctness 2.0, the rest 0.5), so the
    weights only need to change for an experiment; presets and dicts work as in ``course_utils.rewards``.
    """
    from course_utils.rewards import REWARD_FUNCS, grpo_reward_weights

    if weights is None:
        return [1.0] * len(REWARD_FUNCS)
    return grpo_reward_weights(weights)


def grpo_config_kwargs(profile: Profile | str | None = None, output_dir: str | Path | None = None) -> dict[str, Any]:
    """The ``GRPOConfig`` keyword arguments for a profile, as a plain dict (tests read it on any machine).

    Every field that matters is set explicitly, even when it equals TRL's default: TRL's defaults
    (``bf16=True``, ``gradient_checkpointing=True``, ``num_generations=8``) differ from ``TrainingArguments``'
    and change between releases, and a learner should see the run's real settings.
    """
    p = get_profile(profile)
    check_generation_batch(p.per_device_train_batch_size, p.gradient_accumulation_steps, p.num_generations)
    use_vllm = bool(p.use_vllm and p.device == "cuda" and vllm_available())
    kwargs: dict[str, Any] = {
        "output_dir": str(output_dir or default_run_dir(p)),
        # Group size and batch: prompts per step = batch x accumulation / num_generations
        "num_generations": p.num_generations,
        "per_device_train_batch_size": p.per_device_train_batch_size,
        "gradient_accumulation_steps": p.gradient_accumulation_steps,
        "max_completion_length": p.max_completion_length,
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
        "use_vllm": use_vllm,
        "dataloader_num_workers": 0,
        # Logging and checkpoints
        "logging_steps": p.logging_steps,
        "save_strategy": "steps",
        "save_steps": p.save_steps,
        "save_total_limit": 2,
        "report_to": [],
        "seed": 42,
    }
    if use_vllm:
        kwargs["vllm_mode"] = "colocate"  # vLLM shares the training GPU: no second server to start
    return kwargs


def make_grpo_config(
    profile: Profile | str | None = None, output_dir: str | Path | None = None, **overrides: Any
) -> Any:
    """A ``trl.GRPOConfig`` for the profile; ``overrides`` replace single fields (unknown names are an error)."""
    from trl import GRPOConfig

    kwargs = grpo_config_kwargs(profile, output_dir)
    known = set(GRPOConfig.__dataclass_fields__)
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise ValueError(f"GRPOConfig has no field(s) {unknown}. Check the spelling; see GOLDEN_CONFIG_TABLE.")
    kwargs.update(overrides)
    check_generation_batch(
        kwargs["per_device_train_batch_size"], kwargs["gradient_accumulation_steps"], kwargs["num_generations"]
    )
    return GRPOConfig(**kwargs)


# Fields shown in the notebook, with why they matter.
CONFIG_FIELD_NOTES: dict[str, str] = {
    "num_generations": "group size G: completions per prompt compared with each other",
    "per_device_train_batch_size": "completions per forward/backward pass on one device",
    "gradient_accumulation_steps": "passes per optimizer step; effective batch = batch x accumulation",
    "generation_batch_size": "completions generated together; must be a multiple of num_generations",
    "max_completion_length": "new tokens per completion; longer ones are cut (see the clipped ratio)",
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
    "logging_steps": "how often metrics are logged (and the dashboard redraws)",
    "save_steps": "how often a checkpoint is written (resume from the last one)",
}


def config_table(config: Any) -> Any:
    """The fields that matter of a ``GRPOConfig``, with their values and why they matter (a DataFrame)."""
    import pandas as pd

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
    import pandas as pd

    return pd.DataFrame(GOLDEN_CONFIG_TABLE, columns=["often copied", "real GRPOConfig field", "what to know"])


def golden_config(**overrides: Any) -> Any:
    """The golden config as a real ``GRPOConfig`` (fp16 off on a CPU so that it can be built anywhere)."""
    from trl import GRPOConfig

    from course_utils.profiles import cuda_available

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
    import torch

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
    from peft import LoraConfig

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
    activations kept for it (the output head's share stays). In the CPU lab the top 15 of 30 layers
    still learn the format; the top 8 alone did not (notebook 04).
    """
    depth = getattr(getattr(model, "config", None), "num_hidden_layers", None)
    if not isinstance(depth, int):
        raise ValueError(f"{type(model).__name__} has no config.num_hidden_layers: cannot pick its top layers")
    if not isinstance(count, int) or not 1 <= count <= depth:
        raise ValueError(f"lora_top_layers must be an integer from 1 to {depth} (the model's depth), got {count!r}")
    return list(range(depth - count, depth))


def load_model_for_training(profile: Profile | str | None = None) -> tuple[Any, Any]:
    """The profile's model and tokenizer, in the profile's ``train_dtype`` when it has one.

    Why a training dtype: on a CPU with bfloat16 instructions, a bf16 copy of the weights generates about
    twice as fast as fp32 and halves memory; with LoRA the trained adapter weights stay in fp32, so
    the small updates are not lost to bf16 rounding. The evaluation keeps loading the profile's ``dtype``.
    """
    import torch

    from course_utils.models import load_model_and_tokenizer

    p = get_profile(profile)
    model, tokenizer = load_model_and_tokenizer(p)
    if p.train_dtype == "bfloat16" and p.device == "cpu" and not cpu_supports_bf16():
        print("This CPU has no native bfloat16 (AVX512-BF16/AMX): training in the profile's dtype instead.")
    elif p.train_dtype and p.train_dtype != p.dtype:
        if not p.use_lora:
            raise ValueError(
                f"Profile {p.name!r}: train_dtype={p.train_dtype} without LoRA would train the {p.train_dtype} "
                "weights themselves and lose small updates to rounding; set use_lora=True or train_dtype=None."
            )
        model = model.to(getattr(torch, p.train_dtype))
    return model, tokenizer


# --- Data ------------------------------------------------------------------------------------------


def training_dataset(profile: Profile | str | None = None, folder: str | Path | None = None) -> Any:
    """The GRPO prompts: the first ``train_size`` GSM8K train problems, with ``prompt`` and gold ``answer``."""
    from course_utils.data import load_gsm8k

    p = get_profile(profile)
    return load_gsm8k("train", folder, formatted=True, limit=p.train_size)


def warm_start_target(solution: str, reasoning_lines: int = 1) -> str:
    """The assistant answer the warm start teaches: the first reference reasoning line(s) and the number, in XML.

    Short on purpose: the lesson is the *format* (and that it ends), not the arithmetic; a long target
    would teach the model to write past ``max_completion_length`` and get truncated.
    """
    from course_utils.data import extract_hash_answer, extract_reasoning

    if reasoning_lines < 0:
        raise ValueError(f"reasoning_lines must be >= 0, got {reasoning_lines}")
    lines = [re.sub(r"<<[^<>]*>>", "", line).strip() for line in extract_reasoning(solution).splitlines()]
    reasoning = "\n".join(line for line in lines if line)
    reasoning = "\n".join(reasoning.splitlines()[:reasoning_lines])
    return f"<reasoning>\n{reasoning}\n</reasoning>\n<answer>\n{extract_hash_answer(solution)}\n</answer>"


def warm_start_dataset(profile: Profile | str | None = None, folder: str | Path | None = None) -> Any:
    """Prompt/completion pairs for the warm start, taken from the *end* of the train split (no overlap with GRPO's)."""
    from datasets import Dataset

    from course_utils.data import build_prompt, load_gsm8k

    p = get_profile(profile)
    if p.warm_start_examples < 1:
        raise ValueError(f"Profile {p.name!r} has warm_start_examples={p.warm_start_examples}: no warm start to build.")
    raw = load_gsm8k("train", folder, verbose=False)
    if len(raw) < p.train_size + p.warm_start_examples:
        raise ValueError(
            f"GSM8K train has {len(raw)} rows, fewer than train_size + warm_start_examples = "
            f"{p.train_size + p.warm_start_examples}: lower one of them, or point GSM8K_DIR at the full data."
        )
    rows = raw.select(range(len(raw) - p.warm_start_examples, len(raw)))
    return Dataset.from_list(
        [
            {
                "prompt": build_prompt(row["question"]),
                "completion": [
                    {"role": "assistant", "content": warm_start_target(row["answer"], p.warm_start_reasoning_lines)}
                ],
            }
            for row in rows
        ]
    )


# --- Warm start (SFT cold start) ---------------------------------------------------------------------


def make_sft_config(
    profile: Profile | str | None = None, output_dir: str | Path | None = None, **overrides: Any
) -> Any:
    """The ``trl.SFTConfig`` of the warm start: a few steps at a high learning rate, nothing saved."""
    from trl import SFTConfig

    p = get_profile(profile)
    kwargs: dict[str, Any] = {
        "output_dir": str(output_dir or default_run_dir(p) / WARM_START_DIRNAME),
        "num_train_epochs": p.warm_start_epochs,
        # Same effective batch in micro-batches: SFT computes logits (49k vocab) for every token, and at batch
        # 8 that alone peaked above 5 GB of RAM on the cpu profile.
        "per_device_train_batch_size": min(p.warm_start_batch_size, WARM_START_MICRO_BATCH),
        "gradient_accumulation_steps": max(1, p.warm_start_batch_size // WARM_START_MICRO_BATCH),
        "learning_rate": p.warm_start_learning_rate,
        "lr_scheduler_type": "constant",
        "max_length": 512,
        "logging_steps": 1,
        "save_strategy": "no",
        "report_to": [],
        "activation_checkpointing": False,
        "dataloader_num_workers": 0,
        "seed": 42,
        **precision_flags(p),
    }
    kwargs.update(overrides)
    return SFTConfig(**kwargs)


def warm_start(
    model: Any,
    tokenizer: Any,
    profile: Profile | str | None = None,
    dataset: Any = None,
    cache: bool | Path = False,
) -> Any:
    """Prime the XML format with a short SFT run (TRL's ``SFTTrainer``); return the primed, plain model.

    With LoRA profiles the adapter is merged back so GRPO starts its own adapter on the primed
    weights. ``cache``: True (the run folder's ``warm_start/model``) or a folder; a primed model already
    there is loaded instead of retrained, so a resumed run continues on exactly the same base.
    """
    from trl import SFTTrainer

    p = get_profile(profile)
    if p.load_in_4bit:
        raise ValueError("A warm start cannot merge into a 4-bit model; use warm_start_examples=0 on 4-bit profiles.")
    folder = (default_run_dir(p) / WARM_START_DIRNAME / "model") if cache is True else (Path(cache) if cache else None)
    if folder is not None and (folder / "config.json").is_file():
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM.from_pretrained(folder, dtype=model.dtype)
    dataset = dataset if dataset is not None else warm_start_dataset(p)
    started = time.perf_counter()
    trainer = SFTTrainer(
        model=model,
        args=make_sft_config(p),
        train_dataset=dataset,
        processing_class=tokenizer,
        # Every layer, even where GRPO adapts only the top ones: a few SFT steps must move the format
        # habit wherever it lives, and the adapter is merged away before GRPO starts its own.
        peft_config=make_lora_config(p.override(lora_top_layers=None), model),
    )
    trainer.train()
    primed = trainer.model
    if hasattr(primed, "merge_and_unload"):
        primed = primed.merge_and_unload()
    losses = [round(h["loss"], 3) for h in trainer.state.log_history if "loss" in h]
    setattr(
        primed.config,
        WARM_START_MARKER,
        {
            "examples": len(dataset),
            "steps": trainer.state.global_step,
            "seconds": round(time.perf_counter() - started, 1),
        },
    )
    print(f"warm start: {len(dataset)} examples, {trainer.state.global_step} steps, losses {losses}")
    if folder is not None:
        primed.save_pretrained(folder)
    return primed


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
    """A ``GRPOTrainer`` on the course's five rewards (weights from the config), LoRA from the profile."""
    from trl import GRPOTrainer

    from course_utils.rewards import REWARD_FUNCS

    p = get_profile(profile)
    config = config if config is not None else make_grpo_config(p)
    check_generation_batch(
        config.per_device_train_batch_size,
        config.gradient_accumulation_steps,
        config.num_generations,
        config.world_size,
    )
    funcs = list(reward_funcs) if reward_funcs is not None else list(REWARD_FUNCS)
    if config.reward_weights is not None and len(config.reward_weights) != len(funcs):
        raise ValueError(
            f"{len(config.reward_weights)} reward_weights for {len(funcs)} reward functions: give one weight each."
        )
    if train_dataset is None:
        train_dataset = training_dataset(p)
    missing = {"prompt", "answer"} - set(train_dataset.column_names)
    if missing:
        raise ValueError(f"train_dataset lacks column(s) {sorted(missing)}: build it with training_dataset(profile).")
    return GRPOTrainer(
        model=model,
        reward_funcs=funcs,
        args=config,
        train_dataset=train_dataset,
        processing_class=tokenizer,
        peft_config=make_lora_config(p, model),
        callbacks=list(callbacks),
    )


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The newest ``checkpoint-N`` folder in ``run_dir`` (None when there is none)."""
    from transformers.trainer_utils import get_last_checkpoint

    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return None
    found = get_last_checkpoint(str(run_dir))
    return Path(found) if found else None


def clear_run_dir(run_dir: str | Path) -> Path:
    """Delete the checkpoints and outputs of an earlier run (a fresh start); keep the warm-start cache."""
    run_dir = Path(run_dir)
    if run_dir.is_dir():
        for child in run_dir.iterdir():
            if child.name != WARM_START_DIRNAME:
                shutil.rmtree(child) if child.is_dir() else child.unlink()
    run_dir.mkdir(parents=True, exist_ok=True)
    return run_dir


def train(trainer: Any, resume: bool | str | Path = False) -> Any:
    """Run ``trainer.train``; ``resume=True`` continues from the newest checkpoint in the run folder, if any.

    Resuming restores the weights, optimizer, scheduler, RNG state and the log history, so the run
    ends at the same ``max_steps`` as an uninterrupted one.
    """
    checkpoint: str | None = None
    if resume is True:
        found = latest_checkpoint(trainer.args.output_dir)
        checkpoint = str(found) if found else None
        print(f"resuming from {found}" if found else "no checkpoint found: starting from step 0")
    elif resume:
        checkpoint = str(resume)
        if not Path(checkpoint).is_dir():
            raise FileNotFoundError(f"No checkpoint folder {checkpoint}; use resume=True to pick the newest one.")
    return trainer.train(resume_from_checkpoint=checkpoint)


@dataclass
class RunResult:
    """What ``run_training`` did: the trainer (with its log history), where it saved, and how long each part took."""

    trainer: Any
    tokenizer: Any
    run_dir: Path
    final_dir: Path
    warm_start_seconds: float
    train_seconds: float


def run_training(
    profile: Profile | str | None = None,
    callbacks: Iterable[TrainerCallback] = (),
    before_train: Any = None,
) -> RunResult:
    """The whole of notebook 04 in one call (fresh run): load, warm start, train, save artifacts and model.

    For scripts and the benchmark; the notebook runs the same steps one cell at a time. ``before_train``
    is called with the trainer just before training (to instrument it, say).
    """
    p = get_profile(profile)
    started = time.perf_counter()
    model, tokenizer = load_model_for_training(p)
    if p.warm_start_examples:
        model = warm_start(model, tokenizer, p)
    warm_seconds = time.perf_counter() - started
    run_dir = clear_run_dir(default_run_dir(p))
    trainer = build_trainer(model, tokenizer, p, callbacks=callbacks)
    if before_train is not None:
        before_train(trainer)
    started = time.perf_counter()
    train(trainer)
    train_seconds = time.perf_counter() - started
    save_run_artifacts(trainer.state.log_history, run_dir)
    final_dir = save_final(trainer, tokenizer)
    return RunResult(trainer, tokenizer, run_dir, final_dir, warm_seconds, train_seconds)


# --- Log history, live dashboard, artifacts ---------------------------------------------------------


def training_logs(log_history: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The GRPO training entries of a log history (those with a ``reward``), without the run summary."""
    if not isinstance(log_history, Sequence) or isinstance(log_history, str):
        raise TypeError(
            f"log_history must be a list of dicts (trainer.state.log_history), got {type(log_history).__name__}"
        )
    return [dict(entry) for entry in log_history if isinstance(entry, Mapping) and "reward" in entry]


def log_history_frame(log_history: Sequence[Mapping[str, Any]]) -> Any:
    """The training logs as a DataFrame indexed by step (one column per metric)."""
    import pandas as pd

    frame = pd.DataFrame(training_logs(log_history))
    if frame.empty:
        return frame
    if "step" not in frame:
        frame["step"] = range(1, len(frame) + 1)
    return frame.set_index("step")


def reward_columns(frame: Any) -> list[str]:
    """The per-reward mean columns (``rewards/<name>/mean``) of a log frame."""
    return [c for c in frame.columns if c.startswith("rewards/") and c.endswith("/mean")]


def _in_notebook() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and "IPKernelApp" in getattr(shell, "config", {})


class LiveDashboard(TrainerCallback):
    """Redraws the training curves at every log: reward, its std, KL, lengths, clipping, each reward, zero-std groups.

    In a notebook the figure is replaced in place; elsewhere (CI, scripts) it is only redrawn, so the
    callback never needs a display. ``figure`` holds the latest drawing for saving.
    """

    def __init__(self, show: bool | None = None, title: str = "GRPO training") -> None:
        self.show = _in_notebook() if show is None else show
        self.title = title
        self.history: list[dict[str, Any]] = []
        self.figure: Any = None
        self.redraws = 0

    def on_log(self, args: Any, state: Any, control: Any, logs: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        if not logs or "reward" not in logs:
            return
        self.history.append({**logs, "step": state.global_step})
        self.redraw()

    def redraw(self) -> Any:
        """Draw the current history; in a notebook, replace the previous drawing."""
        import matplotlib.pyplot as plt

        from course_utils.plotting import plot_training_dashboard

        if self.figure is not None:
            plt.close(self.figure)
        self.figure = plot_training_dashboard(self.history, title=self.title)
        self.redraws += 1
        if self.show:
            from IPython.display import clear_output, display

            clear_output(wait=True)
            display(self.figure)
        return self.figure


def save_run_artifacts(log_history: Sequence[Mapping[str, Any]], run_dir: str | Path) -> dict[str, Path]:
    """Write the log history as ``log_history.csv`` and the dashboard as ``dashboard.png``; return both paths."""
    import matplotlib.pyplot as plt
    import pandas as pd

    from course_utils.plotting import plot_training_dashboard

    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    csv_path = run_dir / "log_history.csv"
    pd.DataFrame(list(log_history)).to_csv(csv_path, index=False)
    figure = plot_training_dashboard(training_logs(log_history))
    png_path = run_dir / "dashboard.png"
    figure.savefig(png_path, dpi=100, bbox_inches="tight")
    plt.close(figure)
    return {"csv": csv_path, "png": png_path}


def load_log_history(path: str | Path) -> list[dict[str, Any]]:
    """Read a ``log_history.csv`` back (or a ``trainer_state.json``) as a list of dicts."""
    path = Path(path)
    if path.suffix == ".json":
        return list(json.loads(path.read_text())["log_history"])
    import pandas as pd

    frame = pd.read_csv(path)
    return [{k: v for k, v in row.items() if pd.notna(v)} for row in frame.to_dict("records")]


# --- Monitoring rules -------------------------------------------------------------------------------

THRESHOLDS: dict[str, float] = {
    "reward_std_low": 0.1,  # mean reward_std over the recent window below this: converged, or no signal
    "length_jump_ratio": 1.5,  # mean completion length jumps to 1.5x the recent median...
    "length_jump_tokens": 10.0,  # ...and by at least this many tokens
    "kl_rise_fraction": 0.75,  # share of KL steps that go up, for a "steadily rising" KL
    "kl_rise_factor": 2.0,  # and the last KL at least this multiple of the first
    "zero_std_high": 0.5,  # mean frac_reward_zero_std over the window above this: groups without signal
    "clipped_high": 0.3,  # mean clipped ratio over the window above this: completions truncated
}
WINDOW = 5


@dataclass(frozen=True)
class Finding:
    """One thing the monitoring rules noticed: which rule, at which step, what it means, what to do."""

    rule: str
    step: int
    message: str
    advice: str

    def __str__(self) -> str:
        return f"[{self.rule}] step {self.step}: {self.message} -> {self.advice}"


def _series(logs: list[dict[str, Any]], key: str) -> list[tuple[int, float]]:
    return [(int(e.get("step", i + 1)), float(e[key])) for i, e in enumerate(logs) if e.get(key) is not None]


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def _recent(logs: list[dict[str, Any]], key: str) -> tuple[int, float] | None:
    """The last logged step of ``key`` and its mean over the last ``WINDOW`` logs (None when never logged)."""
    series = _series(logs, key)[-WINDOW:]
    return (series[-1][0], _mean([v for _, v in series])) if series else None


def _check_reward_std(logs: list[dict[str, Any]]) -> list[Finding]:
    recent = _recent(logs, "reward_std")
    if recent is None or recent[1] >= THRESHOLDS["reward_std_low"]:
        return []
    step, reward_std = recent
    reward = _mean([v for _, v in _series(logs, "reward")[-WINDOW:]])
    return [
        Finding(
            "reward_std_low",
            step,
            f"reward_std is {reward_std:.3f} (< {THRESHOLDS['reward_std_low']}) with mean reward "
            f"{reward:.2f}: the completions of a group all score the same",
            "if the reward is high the run has converged; if it is low there is no signal: warm-start the "
            "format, use a denser reward or a higher temperature",
        )
    ]


def _check_length_jump(logs: list[dict[str, Any]]) -> list[Finding]:
    series = _series(logs, "completions/mean_length")
    for i in range(3, len(series)):
        step, value = series[i]
        before = median(v for _, v in series[max(0, i - WINDOW) : i])
        if value >= THRESHOLDS["length_jump_ratio"] * before and value - before >= THRESHOLDS["length_jump_tokens"]:
            return [
                Finding(
                    "length_jump",
                    step,
                    f"mean completion length jumped from ~{before:.0f} to {value:.0f} tokens",
                    "a sudden change of behaviour (collapse, rambling or repetition): read the completions, "
                    "lower the learning rate",
                )
            ]
    return []


def _check_kl(logs: list[dict[str, Any]]) -> list[Finding]:
    series = [(s, v) for s, v in _series(logs, "kl")]
    if len(series) < 4:
        return []
    values = [v for _, v in series]
    rises = sum(b > a for a, b in pairwise(values)) / (len(values) - 1)
    grows = values[-1] > THRESHOLDS["kl_rise_factor"] * max(values[0], 1e-4)
    if rises >= THRESHOLDS["kl_rise_fraction"] and grows:
        return [
            Finding(
                "kl_rising",
                series[-1][0],
                f"kl rose steadily from {values[0]:.4f} to {values[-1]:.4f}",
                "the policy drifts away from the reference: lower the learning rate (or raise beta)",
            )
        ]
    return []


def _check_zero_std(logs: list[dict[str, Any]]) -> list[Finding]:
    recent = _recent(logs, "frac_reward_zero_std")
    if recent is None or recent[1] <= THRESHOLDS["zero_std_high"]:
        return []
    step, zero_std = recent
    return [
        Finding(
            "zero_std_high",
            step,
            f"{zero_std:.0%} of the groups have identical rewards (frac_reward_zero_std)",
            "those groups give no learning signal: warm-start the format, a denser reward, more completions "
            "per group or a higher temperature",
        )
    ]


def _check_clipped(logs: list[dict[str, Any]]) -> list[Finding]:
    recent = _recent(logs, "completions/clipped_ratio")
    if recent is None or recent[1] <= THRESHOLDS["clipped_high"]:
        return []
    step, clipped = recent
    return [
        Finding(
            "clipped_high",
            step,
            f"{clipped:.0%} of the completions hit max_completion_length (clipped ratio)",
            "truncated completions lose their </answer>: raise max_completion_length or teach shorter answers",
        )
    ]


RULES = (_check_reward_std, _check_length_jump, _check_kl, _check_zero_std, _check_clipped)


def monitor(log_history: Sequence[Mapping[str, Any]]) -> list[Finding]:
    """Apply the monitoring rules to a log history (``trainer.state.log_history`` or a CSV read back).

    Rules: ``reward_std`` under 0.1, a sudden completion-length jump, ``kl`` rising steadily, a high
    ``frac_reward_zero_std``, a high clipped ratio. An empty list means nothing to report.
    """
    logs = training_logs(log_history)
    return [finding for rule in RULES for finding in rule(logs)]


def describe_findings(findings: Sequence[Finding]) -> str:
    """The findings as readable lines (or a line saying all rules passed)."""
    if not findings:
        return "Monitoring: no rule fired (reward_std, length, kl, zero-std groups, clipping all look fine)."
    return "\n".join(["Monitoring findings:", *(f"  - {finding}" for finding in findings)])


# --- Reward summary for the lab ---------------------------------------------------------------------


def reward_fifths(log_history: Sequence[Mapping[str, Any]]) -> tuple[float, float]:
    """Mean total reward over the first and the last fifth of the logged steps (at least one step each)."""
    rewards = [float(e["reward"]) for e in training_logs(log_history)]
    if not rewards:
        raise ValueError("The log history has no training step with a 'reward': did the run log anything?")
    n = max(1, len(rewards) // 5)
    return _mean(rewards[:n]), _mean(rewards[-n:])


def max_reward(config: Any = None) -> float:
    """The largest total reward one completion can get under the config's reward weights."""
    from course_utils.rewards import max_total_reward

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
    if folder.exists():
        shutil.rmtree(folder)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    info = {
        "kind": "lora-adapter" if is_peft and not merge else "full-model",
        "global_step": trainer.state.global_step,
        "warm_start": getattr(model.config, WARM_START_MARKER, None),
    }
    (folder / RUN_INFO_FILENAME).write_text(json.dumps(info, indent=2))
    return folder


def load_trained_model(profile: Profile | str | None = None, folder: str | Path | None = None) -> tuple[Any, Any]:
    """The model trained in notebook 04 and its tokenizer (left padding), from ``final_model_dir(profile)``.

    A LoRA adapter is loaded on top of the profile's base model; a full model is loaded directly.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from course_utils.models import load_model_and_tokenizer

    p = get_profile(profile)
    folder = Path(folder) if folder is not None else final_model_dir(p)
    if not (folder / "config.json").is_file() and not (folder / "adapter_config.json").is_file():
        raise FileNotFoundError(
            f"No trained model in {folder}. Run notebooks/04_train_grpo.ipynb with COURSE_PROFILE={p.name} first."
        )
    if (folder / "adapter_config.json").is_file():
        from peft import PeftModel

        base, _ = load_model_and_tokenizer(p)
        model = PeftModel.from_pretrained(base, folder)
    else:
        import torch

        model = AutoModelForCausalLM.from_pretrained(folder, dtype=getattr(torch, p.dtype))
    tokenizer = AutoTokenizer.from_pretrained(folder)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return model.eval(), tokenizer
