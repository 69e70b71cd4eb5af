"""A ``GRPOConfig`` shown as a table, and the often-copied "golden config" translated into real fields.

Notebook 04 prints both: the fields that matter with why they matter (``config_table``), and the golden config's
settings beside the ``GRPOConfig`` fields that exist (``golden_config_table``, ``golden_config``).
"""

from __future__ import annotations

from typing import Any

import pandas as pd
from trl import GRPOConfig

from course_utils.core.hardware import cuda_available
from course_utils.core.paths import output_dir
from course_utils.training.grpo_config import check_generation_batch

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
    "scale_rewards": "advantages divided by the group's reward std ('group') or kept at the rewards' scale ('none')",
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
