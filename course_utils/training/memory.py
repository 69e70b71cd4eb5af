"""How much memory a GRPO run needs, estimated from the model's shape and the profile, before loading anything.

Training memory has six parts, and each fix for "out of memory" shrinks a different one:

- **weights**: parameters x bytes per parameter (4 in fp32, 2 in fp16/bf16, about 0.5 in 4-bit);
- **gradients**: one per *trained* parameter (LoRA trains only the small adapters);
- **optimizer state**: AdamW keeps two fp32 numbers per trained parameter (8 bytes), an 8-bit AdamW two bytes;
- **activations**: what the forward pass keeps for the backward pass, proportional to the tokens in one
  micro-batch (``per_device_train_batch_size`` x (prompt + completion) tokens); gradient checkpointing keeps
  only each layer's input and recomputes the rest; LoRA in the top layers only keeps nothing below them;
- **log-softmax workspace**: TRL's chunked log-softmax over the output head, fp32 tiles of positions x
  vocabulary chunk at the start of the backward pass (on the CPU TRL scores every position, prompt included,
  unless the CPU speed-ups score the completion tokens only: the estimate takes whether they run as an input,
  ``course_utils.core.speedups.switched_on`` by default);
- **generation KV cache**: keys and values of every generated token, for the whole generation batch.

The phases do not overlap: generation (KV cache), the backward pass (activations + workspace, plus the
gradients when accumulation already holds them) and the optimizer step (gradients). The estimate adds the
largest phase to the parts that stay (weights, reference model, optimizer state). The numbers come from the
model's shape only (``course_utils.training.model_shape``): nothing is downloaded. Each part is counted in
``memory_parts``; this module adds them up by phase (``MemoryEstimate``) and reads them from a profile.

``course_utils.training.memory_measurement`` checks the estimate against real ``GRPOTrainer`` steps on the CPU
(``tests/test_memory.py`` holds it within +-30%; ``benchmarks/bench_memory.py`` prints both). GPU figures are
estimates until ``make gpu-check --full-size`` measures them beside ``full_size_estimates``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass, field
from typing import Any

import pandas as pd

from course_utils.core.hardware import GPU_MEMORY_GB
from course_utils.core.profiles import Profile, get_profile
from course_utils.core.speedups import switched_on
from course_utils.training.memory_parts import (
    DEFAULT_PROMPT_TOKENS,
    FP32_BYTES,
    GB,
    OPTIMIZER_BYTES_PER_PARAM,
    RUNTIME_OVERHEAD_GB,
    RunSettings,
    activation_bytes,
    kv_cache_bytes,
    logprob_bytes,
    packed_weight_bytes,
    trainable_parameters,
    unchunked_logits_bytes,
    weight_bytes,
)
from course_utils.training.model_shape import QWEN25_05B, ModelSpec, spec_for_profile


@dataclass(frozen=True)
class MemoryEstimate:
    """The estimated peak memory of a GRPO run, by part, in GB (1 GB = 2**30 bytes)."""

    label: str
    parameters: int
    trainable_parameters: int
    weights_gb: float
    reference_model_gb: float
    gradients_gb: float
    optimizer_gb: float
    activations_gb: float
    kv_cache_gb: float
    overhead_gb: float
    logprob_gb: float = 0.0
    accumulates_gradients: bool = False
    notes: tuple[str, ...] = field(default_factory=tuple)
    vllm_gb: float = 0.0  # what a colocated vLLM reserves (its weights and KV cache) for generation
    # group generation on a CPU: packed copies made for one sampling call (the trained weights without LoRA, the
    # layers with fp32 adapters merged in with LoRA)
    generation_copies_gb: float = 0.0
    # group generation on a CPU with LoRA: packed copies of the other frozen weights, kept for the whole run
    kept_packs_gb: float = 0.0
    # freed memory the process keeps until the step ends (the CPU speed-ups): the training pass starts above it
    kept_after_generation_gb: float = 0.0

    @property
    def training_phase_gb(self) -> float:
        """The start of a backward pass: kept activations, the output head's log-softmax workspace, and the
        gradients when an earlier micro-batch of the same step already holds them (gradient accumulation)."""
        held = self.gradients_gb if self.accumulates_gradients else 0.0
        return self.activations_gb + self.logprob_gb + held

    @property
    def total_gb(self) -> float:
        """What always stays, plus the largest phase: backward pass, optimizer step (gradients), or generation
        (its key/value cache, and on a CPU with group generation the packed copies made for the call). With freed
        memory kept in the process until the step ends (the CPU speed-ups), those copies still take their
        pages when the training pass starts: the training pass does not reuse them. With LoRA the packed
        copies of the frozen weights without adapters stay for the whole run (``kept_packs_gb``).

        Gradients are freed after each optimizer step (``zero_grad`` sets them to None), so without
        gradient accumulation they never meet the activations: by the end of the backward pass, the
        activations are gone. Counting both at once would overstate the measured peak
        (``memory_measurement.measure_grpo_step_peak``) well beyond the phases' sum.
        """
        persistent = self.weights_gb + self.reference_model_gb + self.optimizer_gb + self.vllm_gb + self.kept_packs_gb
        generation = self.kv_cache_gb + self.generation_copies_gb
        after_generation = self.kept_after_generation_gb + max(self.training_phase_gb, self.gradients_gb)
        return persistent + max(after_generation, generation) + self.overhead_gb

    def as_row(self) -> dict[str, Any]:
        """One table row: the parts rounded to 0.01 GB, plus the total."""
        skip = ("notes", "accumulates_gradients")
        row = {k: (round(v, 2) if isinstance(v, float) else v) for k, v in asdict(self).items() if k not in skip}
        row["total_gb"] = round(self.total_gb, 2)
        return row


# --- The estimate ----------------------------------------------------------------------------------


def estimate_memory(
    spec: ModelSpec, settings: RunSettings | None = None, *, label: str | None = None, **overrides: Any
) -> MemoryEstimate:
    """Peak memory of one GRPO training process: ``spec`` trained with ``settings``, changed by ``overrides``.

    ``overrides`` are ``RunSettings`` fields, e.g. ``estimate_memory(QWEN25_05B, dtype="float16", use_lora=True)``;
    ``estimate_for_profile`` reads them from a course profile. Each part is computed on its own; ``MemoryEstimate``
    adds them up by phase.
    """
    run = dataclasses.replace(settings or RunSettings(), **overrides)
    layers = run.trained_layers(spec)
    trainable = trainable_parameters(spec, run, layers)
    weights = weight_bytes(spec, run, trainable)
    generation_copies, kept_packs = packed_weight_bytes(spec, run, layers)
    keeps_reference = run.beta > 0 and not run.use_lora
    notes = ("beta > 0 with LoRA: no reference copy, TRL switches the adapter off instead",)
    return MemoryEstimate(
        label=label or spec.name,
        parameters=spec.num_parameters,
        trainable_parameters=trainable,
        weights_gb=weights / GB,
        reference_model_gb=(weights if keeps_reference else 0.0) / GB,
        gradients_gb=trainable * (FP32_BYTES if run.use_lora else run.width) / GB,
        optimizer_gb=trainable * OPTIMIZER_BYTES_PER_PARAM[run.optimizer] / GB,
        activations_gb=activation_bytes(spec, run, layers) / GB,
        kv_cache_gb=kv_cache_bytes(spec, run) / GB,
        overhead_gb=RUNTIME_OVERHEAD_GB[run.device],
        logprob_gb=logprob_bytes(spec, run) / GB,
        accumulates_gradients=(run.gradient_accumulation_steps or run.steps_per_generation) > 1,
        notes=notes if run.beta > 0 and run.use_lora else (),
        vllm_gb=float(run.vllm_reserved_gb),
        generation_copies_gb=generation_copies / GB,
        kept_packs_gb=kept_packs / GB,
        kept_after_generation_gb=(generation_copies if run.speedups else 0.0) / GB,
    )


def estimate_for_profile(
    profile: Profile | str | None = None,
    spec: ModelSpec | None = None,
    *,
    optimizer: str = "adamw",
    prompt_tokens: int | None = None,
    label: str | None = None,
    gpu_memory_gb: float | None = None,
    speedups: bool | None = None,
) -> MemoryEstimate:
    """The estimate for a course profile (sizes read from ``course_utils.core.profiles``).

    ``speedups``: whether the CPU plug-in runs; None reads the switch (``core.speedups.switched_on``: the
    profile's flag and ``COURSE_CPU_SPEEDUPS``), so ``COURSE_CPU_SPEEDUPS=0`` gives plain TRL's figure.

    ``gpu_memory_gb``: the GPU's memory, for a profile that colocates vLLM (``use_vllm``): vLLM then reserves
    ``vllm_gpu_memory_utilization`` of it. Without it the estimate assumes generation without vLLM.

    The weights' dtype is the one the profile trains in on this machine (``Profile.training_dtype``: the CPU
    lab trains a bf16 copy only where the CPU computes bf16 natively). ``prompt_tokens`` defaults to the
    profile's prompt cap (``max_prompt_tokens``) when it has one, else to a generous GSM8K prompt.
    """
    p = get_profile(profile)
    settings = profile_settings(p, optimizer, prompt_tokens, gpu_memory_gb, speedups)
    return estimate_memory(spec or spec_for_profile(p), settings, label=label or p.name)


def profile_settings(
    profile: Profile,
    optimizer: str = "adamw",
    prompt_tokens: int | None = None,
    gpu_memory_gb: float | None = None,
    speedups: bool | None = None,
) -> RunSettings:
    """The ``RunSettings`` a profile trains with (``estimate_for_profile`` says what each argument does)."""
    return RunSettings(
        dtype=profile.training_dtype,
        use_lora=profile.use_lora,
        lora_r=profile.lora_r,
        lora_target_modules=profile.lora_target_modules,
        lora_top_layers=profile.lora_top_layers,
        load_in_4bit=profile.load_in_4bit,
        optimizer=optimizer,
        per_device_train_batch_size=profile.per_device_train_batch_size,
        steps_per_generation=profile.gradient_accumulation_steps,
        gradient_accumulation_steps=profile.gradient_accumulation_steps,
        max_completion_length=profile.max_completion_length,
        prompt_tokens=prompt_tokens or profile.max_prompt_tokens or DEFAULT_PROMPT_TOKENS,
        gradient_checkpointing=profile.gradient_checkpointing,
        beta=profile.beta,
        device=profile.device,
        vllm_reserved_gb=vllm_reservation_gb(profile, gpu_memory_gb),
        cpu_speedups=switched_on(profile) if speedups is None else speedups,
    )


def vllm_reservation_gb(profile: Profile | str | None, gpu_memory_gb: float | None) -> float:
    """GB a colocated vLLM reserves for the profile on a GPU of ``gpu_memory_gb`` (0 without vLLM or a GPU size)."""
    p = get_profile(profile)
    if not (p.use_vllm and p.device == "cuda" and gpu_memory_gb):
        return 0.0
    return p.vllm_gpu_memory_utilization * gpu_memory_gb


# --- Tables for the notebooks ----------------------------------------------------------------------


def _qwen_setups() -> list[tuple[str, str, MemoryEstimate]]:
    """``memory_table``'s Qwen2.5-0.5B rows: (hardware, set-up, estimate)."""
    t4, gpu = get_profile("colab-t4"), get_profile("gpu")
    full_fp16 = t4.override(use_lora=False, load_in_4bit=False, gradient_checkpointing=False)
    vllm = f"vLLM colocated ({gpu.vllm_gpu_memory_utilization:.0%} of the GPU)"
    full_bf16 = gpu.override(use_lora=False, use_vllm=False)
    return [
        ("T4", "colab-t4 profile: 4-bit + LoRA, fp16, checkpointing", estimate_for_profile(t4)),
        ("T4", "full fine-tuning fp16, AdamW, no checkpointing", estimate_for_profile(full_fp16)),
        (
            "T4",
            "same, 8-bit AdamW + checkpointing",
            estimate_for_profile(full_fp16.override(gradient_checkpointing=True), optimizer="adamw_8bit"),
        ),
        ("A100-40GB", "gpu profile: bf16 + LoRA r=32, no vLLM", estimate_for_profile(gpu.override(use_vllm=False))),
        *(
            (hardware, f"gpu profile: bf16 + LoRA r=32, {vllm}", estimate_for_profile(gpu, gpu_memory_gb=size))
            for hardware, size in (("A100-40GB", GPU_MEMORY_GB["A100-40GB"]), ("H100-80GB", GPU_MEMORY_GB["H100-80GB"]))
        ),
        ("A100-40GB", "gpu profile, full fine-tuning bf16, no vLLM", estimate_for_profile(full_bf16)),
        ("A800-80GB", "gpu profile, full fine-tuning bf16, no vLLM", estimate_for_profile(full_bf16)),
    ]


def _lab_record() -> dict[str, Any]:
    """``memory_table``'s row for the CPU lab's SmolLM2, as the ``cpu`` profile trains it (no memory figure)."""
    cpu = get_profile("cpu")
    layers = f" in the top {cpu.lora_top_layers} layers" if cpu.lora_top_layers else ""
    setup = f"cpu profile: {cpu.training_dtype}, " + (f"LoRA r={cpu.lora_r}{layers}" if cpu.use_lora else "full")
    row = estimate_for_profile(cpu).as_row()
    return {"hardware": "CPU (laptop)", "model": "SmolLM2-135M-Instruct", "setup": setup, **row, "available_gb": None}


def memory_table() -> pd.DataFrame:
    """Qwen2.5-0.5B on T4 / A100 / H100 / A800 (several set-ups) and the CPU lab's SmolLM2, as a DataFrame.

    Each row: the parts in GB, the total, the memory the hardware offers, and whether it fits.
    """
    records = [
        {"hardware": hardware, "model": QWEN25_05B.name, "setup": setup, **est.as_row()}
        | {"available_gb": GPU_MEMORY_GB[hardware]}
        for hardware, setup, est in _qwen_setups()
    ]
    records.append(_lab_record())
    table = pd.DataFrame(records).drop(columns=["label"])
    table["fits"] = [
        None if a is None or pd.isna(a) else t <= a for t, a in zip(table.total_gb, table.available_gb, strict=True)
    ]
    return table


def what_if_table(
    profile: Profile | str, changes: dict[str, dict[str, Any]], spec: ModelSpec | None = None
) -> pd.DataFrame:
    """How each fix changes the estimate: one row per named set of profile overrides (plus ``optimizer``).

    ``changes`` maps a label to overrides, e.g. ``{"LoRA": {"use_lora": True}, "8-bit Adam": {"optimizer":
    "adamw_8bit"}}``; every row starts again from ``profile``.
    """
    base = get_profile(profile)
    rows = []
    for label, overrides in {"as configured": {}, **changes}.items():
        overrides = dict(overrides)
        optimizer = overrides.pop("optimizer", "adamw")
        est = estimate_for_profile(base.override(**overrides), spec, optimizer=optimizer, label=label)
        rows.append(est.as_row())
    return pd.DataFrame(rows).set_index("label")


# The GPU profiles at full size, beside the GPUs they are planned for (``make gpu-check --full-size`` measures them)
GPU_PROFILES = ("colab-t4", "gpu")
FULL_SIZE_HARDWARE = ("T4", "A100-40GB", "A100-80GB")
FULL_SIZE_PARTS = ["weights_gb", "activations_gb", "kv_cache_gb", "logprob_gb", "overhead_gb", "total_gb"]


def full_size_estimates(hardware: tuple[str, ...] = FULL_SIZE_HARDWARE) -> pd.DataFrame:
    """Each GPU profile's estimate on Qwen2.5-0.5B's full shape, one row per profile, and whether it fits each GPU.

    As ``make gpu-check --full-size`` runs it: transformers generates (no vLLM reservation), every completion at the
    cap. ``logprob_gb`` is the chunked log-softmax the estimate counts; ``unchunked_logits_gb`` is what one
    micro-batch's fp32 logits over the 151,936-token vocabulary would take at once, which TRL never holds.
    """
    unknown = sorted(set(hardware) - set(GPU_MEMORY_GB))
    if unknown:
        raise ValueError(f"Unknown GPU(s) {unknown}; known: {sorted(GPU_MEMORY_GB)} (core.hardware.GPU_MEMORY_GB)")
    rows = {}
    for name in GPU_PROFILES:
        settings = profile_settings(get_profile(name).override(use_vllm=False))
        estimate = estimate_memory(QWEN25_05B, settings, label=name)
        row = {part: estimate.as_row()[part] for part in FULL_SIZE_PARTS}
        row["unchunked_logits_gb"] = round(unchunked_logits_bytes(QWEN25_05B, settings) / GB, 2)
        rows[name] = row | {f"fits {gpu} ({GPU_MEMORY_GB[gpu]:g} GB)": estimate.total_gb <= GPU_MEMORY_GB[gpu]
                            for gpu in hardware}  # fmt: skip
    return pd.DataFrame.from_dict(rows, orient="index").rename_axis("profile")


# The troubleshooting notebook's out-of-memory example: Qwen2.5-0.5B fully fine-tuned in fp32 on a T4 with
# a large batch and long completions, and the fixes one at a time (each row of what_if_table starts afresh).
OOM_BASE = get_profile("colab-t4").override(
    name="oom-example",
    dtype="float32",
    use_lora=False,
    load_in_4bit=False,
    gradient_checkpointing=False,
    per_device_train_batch_size=16,
    gradient_accumulation_steps=1,
    max_completion_length=512,
)
OOM_FIXES: dict[str, dict[str, Any]] = {
    "batch 4 x accumulation 4": {"per_device_train_batch_size": 4, "gradient_accumulation_steps": 4},
    "gradient checkpointing": {"gradient_checkpointing": True},
    "fp16 weights": {"dtype": "float16"},
    "8-bit AdamW": {"optimizer": "adamw_8bit"},
    "LoRA": {"use_lora": True},
    "4-bit + LoRA": {"use_lora": True, "load_in_4bit": True},
    "all: colab-t4 profile": {  # every fix at once, with the colab-t4 profile's own sizes
        "dtype": "float16",
        "use_lora": True,
        "load_in_4bit": True,
        "gradient_checkpointing": True,
        "per_device_train_batch_size": get_profile("colab-t4").per_device_train_batch_size,
        "gradient_accumulation_steps": get_profile("colab-t4").gradient_accumulation_steps,
        "max_completion_length": get_profile("colab-t4").max_completion_length,
    },
}
