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
  unless the CPU speed-ups score the completion tokens only: ``course_utils.cpu_speed``);
- **generation KV cache**: keys and values of every generated token, for the whole generation batch.

The phases do not overlap: generation (KV cache), the backward pass (activations + workspace, plus the
gradients when accumulation already holds them) and the optimizer step (gradients). The estimate adds the
largest phase to the parts that stay (weights, reference model, optimizer state). The numbers come from the
model's config only: nothing is downloaded (``QWEN25_05B`` is written out below).

Checked against reality with ``measure_grpo_step_peak``: two real ``GRPOTrainer`` steps in a fresh
subprocess on the CPU, whose peak resident memory increase must fall within +-30% of the estimate
(``tests/test_memory.py``; measured with TRL 1.16: full fine-tuning +9%, the CPU lab's LoRA +9%, ci LoRA +5%;
``benchmarks/bench_memory.py`` prints them). GPU figures are estimates: no GPU measured them here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from course_utils import cpu_speed
from course_utils.core.profiles import OFFLINE_MODEL_ID, Profile, get_profile
from course_utils.cpu_speed.logit_tiles import kept_tiles_bytes, tiles_fit
from course_utils.lesson.data import load_gsm8k
from course_utils.lesson.models import materialize_offline_model
from course_utils.training.run import build_trainer, load_model_for_training, make_grpo_config

GB = 1024**3
# A GSM8K chat prompt (system format instruction + question, through the chat template) is about
# 100-200 tokens; prompts in a batch are left-padded to the longest, so we take the upper end.
DEFAULT_PROMPT_TOKENS = 200
# TRL scores completions with a chunked log-softmax over the output head (trl/kernels/chunked_logprob.py):
# tiles of at most TOKEN_CHUNK_SIZE positions x _CHUNKED_LOGPROB_CHUNK_SIZE vocabulary entries, in fp32.
LOGPROB_TOKEN_CHUNK = 4096
LOGPROB_VOCAB_CHUNK = 32768
# At the peak of the backward pass, on the CPU, where PyTorch ops fold the tiles: about 8 fp32 tiles of
# positions x vocabulary chunk (7.7-8.3 measured), plus up to 3.3 fp32 copies of one vocabulary chunk of the
# output head, which depend on the machine's matrix library: none on an AVX-512 Xeon (kernel high-water mark,
# bf16 and fp32, 400 and 1,000 positions), 3.3 in an earlier measurement with TRL 1.16 (857 MB at 600 positions,
# 1,465 MB at 1,200). The estimate counts them: it plans for the larger. Measured by ``measure_logprob_workspace``
# with SmolLM2's head. On a GPU a Triton kernel folds the tiles, only completion tokens are scored and the
# product is accumulated in fp32 directly: 2 tiles and no copies is our assumption there, not a measurement.
LOGPROB_BACKWARD_TILES = {"cpu": 8.0, "cuda": 2.0}
LOGPROB_WEIGHT_COPIES = {"cpu": 3.3, "cuda": 0.0}
# Runtime memory that no tensor accounts for: the CUDA context and allocator slack on a GPU.
RUNTIME_OVERHEAD_GB = {"cuda": 0.6, "cpu": 0.0}
BYTES_PER_DTYPE = {"float32": 4.0, "float16": 2.0, "bfloat16": 2.0}
# NF4 stores 4 bits per weight plus one (double-quantised) scale per 64 weights: ~0.53 bytes per weight.
BYTES_PER_4BIT_WEIGHT = 0.53
OPTIMIZER_BYTES_PER_PARAM = {"adamw": 8.0, "adamw_8bit": 2.0, "sgd": 0.0}
# Usable memory of the GPUs the course talks about (the card's size minus what the driver keeps).
GPU_MEMORY_GB = {"T4": 15.0, "A100-40GB": 39.5, "A100-80GB": 79.3, "A800-80GB": 79.3, "H100-80GB": 79.1}


@dataclass(frozen=True)
class ModelSpec:
    """The shape of a decoder-only transformer (Llama / Qwen2 style): all the estimator needs.

    ``attention_bias``: Qwen2 has biases on the q/k/v projections, Llama does not.
    """

    name: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    vocab_size: int
    tie_embeddings: bool
    head_dim: int | None = None
    attention_bias: bool = False

    def __post_init__(self) -> None:
        for name in ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "intermediate_size", "vocab_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"ModelSpec.{name} must be a positive integer, got {value!r}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})")

    @property
    def dim_per_head(self) -> int:
        return self.head_dim or self.hidden_size // self.num_heads

    @property
    def kv_dim(self) -> int:
        """Width of the key (and of the value) projection: grouped-query attention makes it small."""
        return self.num_kv_heads * self.dim_per_head

    def module_shapes(self) -> dict[str, tuple[int, int]]:
        """(in, out) features of each linear layer in one decoder block, by the names LoRA targets."""
        h, kv, i, q = self.hidden_size, self.kv_dim, self.intermediate_size, self.num_heads * self.dim_per_head
        return {
            "q_proj": (h, q),
            "k_proj": (h, kv),
            "v_proj": (h, kv),
            "o_proj": (q, h),
            "gate_proj": (h, i),
            "up_proj": (h, i),
            "down_proj": (i, h),
        }

    @property
    def embedding_parameters(self) -> int:
        """Input embeddings plus the output head (counted once when they are tied)."""
        return self.vocab_size * self.hidden_size * (1 if self.tie_embeddings else 2)

    @property
    def linear_parameters(self) -> int:
        """Weights of every linear layer in the decoder blocks (what 4-bit quantisation shrinks)."""
        return self.num_layers * sum(a * b for a, b in self.module_shapes().values())

    @property
    def num_parameters(self) -> int:
        """Every parameter: embeddings, linear layers, q/k/v biases, RMSNorm weights (2 per block + final)."""
        biases = self.num_layers * (self.num_heads * self.dim_per_head + 2 * self.kv_dim) if self.attention_bias else 0
        norms = (2 * self.num_layers + 1) * self.hidden_size
        return self.embedding_parameters + self.linear_parameters + biases + norms

    def lora_parameters(self, r: int, target_modules: tuple[str, ...] | list[str]) -> int:
        """Adapter parameters: each targeted linear layer gains A (in x r) and B (r x out)."""
        shapes = self.module_shapes()
        unknown = sorted(set(target_modules) - set(shapes))
        if unknown:
            raise ValueError(f"Unknown LoRA target module(s) {unknown}; this model has {sorted(shapes)}")
        if r < 1:
            raise ValueError(f"LoRA rank r must be >= 1, got {r}")
        return self.num_layers * sum(r * (shapes[m][0] + shapes[m][1]) for m in target_modules)


# Qwen2.5-0.5B(-Instruct), from its config.json on the Hub (written out so that nothing is downloaded):
# hidden_size 896, num_hidden_layers 24, num_attention_heads 14, num_key_value_heads 2,
# intermediate_size 4864, vocab_size 151936, tie_word_embeddings true, q/k/v projections with bias.
# That makes 494,032,768 parameters, the "0.49B" of the model card.
QWEN25_05B = ModelSpec(
    name="Qwen2.5-0.5B-Instruct",
    hidden_size=896,
    num_layers=24,
    num_heads=14,
    num_kv_heads=2,
    intermediate_size=4864,
    vocab_size=151936,
    tie_embeddings=True,
    attention_bias=True,
)


def spec_from_config(config: Any, name: str | None = None) -> ModelSpec:
    """A ``ModelSpec`` from a transformers config object, a config dict, or a folder holding ``config.json``."""
    if isinstance(config, (str, Path)):
        path = Path(config)
        path = path / "config.json" if path.is_dir() else path
        if not path.is_file():
            raise FileNotFoundError(f"No config.json at {path}: pass a model folder, a config file or a config object")
        config = json.loads(path.read_text())
    values = config if isinstance(config, dict) else config.to_dict()
    required = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size")
    missing = [key for key in required if key not in values]
    if missing:
        raise ValueError(f"The model config lacks {missing}: the estimator needs a decoder-only (Llama/Qwen) config")
    return ModelSpec(
        name=name or values.get("_name_or_path") or values.get("model_type", "model"),
        hidden_size=values["hidden_size"],
        num_layers=values["num_hidden_layers"],
        num_heads=values["num_attention_heads"],
        num_kv_heads=values.get("num_key_value_heads") or values["num_attention_heads"],
        intermediate_size=values["intermediate_size"],
        vocab_size=values["vocab_size"],
        tie_embeddings=bool(values.get("tie_word_embeddings", False)),
        head_dim=values.get("head_dim"),
        attention_bias=bool(values.get("attention_bias", values.get("model_type") == "qwen2")),
    )


def smollm2_spec() -> ModelSpec:
    """The offline SmolLM2-135M-Instruct's shape, read from the materialized model's ``config.json``."""
    return spec_from_config(materialize_offline_model(), name="SmolLM2-135M-Instruct")


def spec_for_profile(profile: Profile | str | None = None) -> ModelSpec:
    """The profile's model shape: SmolLM2 offline, Qwen2.5-0.5B from the constant above otherwise."""
    p = get_profile(profile)
    if p.model_id == OFFLINE_MODEL_ID:
        return smollm2_spec()
    if p.model_id.split("/")[-1].startswith("Qwen2.5-0.5B"):
        return QWEN25_05B
    raise ValueError(f"No built-in shape for {p.model_id!r}: pass spec=spec_from_config(model.config)")


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
        pages when the training pass starts: measured, the training pass does not reuse them. With LoRA the packed
        copies of the frozen weights without adapters stay for the whole run (``kept_packs_gb``).

        Gradients are freed after each optimizer step (``zero_grad`` sets them to None), so without
        gradient accumulation they never meet the activations: by the end of the backward pass, the
        activations are gone. Measured on the CPU (``measure_grpo_step_peak``, ci sizes): counting both at
        once put full fine-tuning 28% over the measured peak, the phases 9%.
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


# the linear layers that group generation computes as one stacked product (course_utils.cpu_speed.group_generation)
STACKED_GROUPS = (("q_proj", "k_proj", "v_proj"), ("o_proj",), ("gate_proj", "up_proj"), ("down_proj",))


def merged_group_parameters(spec: ModelSpec, target_modules: tuple[str, ...] | list[str]) -> int:
    """Weights per decoder layer in the stacked groups that hold a LoRA target: the ones group generation packs
    afresh, adapters merged in, at each call on fp32 weights."""
    shapes = spec.module_shapes()
    groups = [group for group in STACKED_GROUPS if set(group) & set(target_modules)]
    return sum(shapes[name][0] * shapes[name][1] for group in groups for name in group)


def _activation_values_per_token(spec: ModelSpec, gradient_checkpointing: bool, use_lora: bool = False) -> float:
    """Numbers kept per token per decoder block for the backward pass.

    Counted for a Llama/Qwen block: two RMSNorms (input and output each: 4h), q and attention output
    (2h), the o_proj input (h), k and v (2 kv), the MLP's gate, SiLU(gate), up and their product (4 x
    intermediate), plus the residual stream (h). With frozen MLP weights (LoRA on the attention
    projections) the inputs kept only for weight gradients go: 2 x intermediate instead of 4. With
    gradient checkpointing only the block input (h) is kept, and one block's full set is rebuilt during
    the backward pass (added separately). Checked with ``saved_tensors_hooks`` on SmolLM2 (fp32): full
    fine-tuning 11,206 values measured vs 11,136 counted; LoRA 7,967 vs 8,064.
    """
    if gradient_checkpointing:
        return float(spec.hidden_size)
    mlp = 2.0 if use_lora else 4.0
    return 8.0 * spec.hidden_size + 2.0 * spec.kv_dim + mlp * spec.intermediate_size


def _fp32_bytes_per_token(spec: ModelSpec, use_lora: bool) -> float:
    """Extra fp32 copies kept per token per block when the weights are 16-bit.

    RMSNorm computes in fp32 (both norms keep an fp32 copy of their input), and LoRA adapters are fp32,
    so peft casts their inputs up (the attention input, shared by q/k/v, and the o_proj input). Measured
    on SmolLM2 in bf16 with LoRA on q/k/v/o: 26,453 bytes per token per block, counted 25,344.
    """
    return 4.0 * spec.hidden_size * (2 + (2 if use_lora else 0))


def logprob_workspace_bytes(spec: ModelSpec, scored_positions: int, device: str = "cpu") -> float:
    """Peak memory of TRL's chunked log-softmax over the output head during the backward pass, in bytes."""
    chunk = min(spec.vocab_size, LOGPROB_VOCAB_CHUNK)
    tile = min(scored_positions, LOGPROB_TOKEN_CHUNK) * chunk * 4.0
    return LOGPROB_BACKWARD_TILES[device] * tile + LOGPROB_WEIGHT_COPIES[device] * chunk * spec.hidden_size * 4.0


def estimate_memory(
    spec: ModelSpec,
    *,
    dtype: str = "float32",
    use_lora: bool = False,
    lora_r: int = 16,
    lora_target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj"),
    lora_top_layers: int | None = None,
    load_in_4bit: bool = False,
    optimizer: str = "adamw",
    per_device_train_batch_size: int = 8,
    steps_per_generation: int = 1,
    gradient_accumulation_steps: int | None = None,
    max_completion_length: int = 256,
    prompt_tokens: int = DEFAULT_PROMPT_TOKENS,
    gradient_checkpointing: bool = False,
    beta: float = 0.0,
    device: str = "cpu",
    label: str | None = None,
    vllm_reserved_gb: float = 0.0,
    cpu_speedups: bool = False,
) -> MemoryEstimate:
    """Peak memory of one GRPO training process, from explicit settings (see ``estimate_for_profile``).

    ``dtype`` is the dtype the weights are loaded in (fp32 on the CPU). A reference model is counted
    only where TRL builds one: ``beta > 0`` without LoRA (with LoRA, TRL disables the adapter instead).
    LoRA adapters are kept in fp32; ``lora_top_layers`` puts them in the top layers only, and the layers
    below then keep no activations. Activations assume memory-efficient attention (no seq x seq scores).
    ``vllm_reserved_gb``: what a colocated vLLM reserves (``vllm_gpu_memory_utilization`` x the GPU's memory);
    it then generates in its own reservation, so the training model keeps no generation KV cache.
    ``cpu_speedups`` (on the CPU; ``course_utils.cpu_speed``): the log-softmax scores the completion tokens only
    and keeps its logits (scored positions x vocabulary) for the backward where they fit its budget; a
    micro-batch's rows read their shared prompt once (each row still keeps its keys and values); sampling packs
    a copy of every linear weight and of the output head (with LoRA the packs of the frozen weights are kept for
    the run, the layers with fp32 adapters packed afresh at each call); and the process keeps what it frees
    until the step ends.
    """
    if dtype not in BYTES_PER_DTYPE:
        raise ValueError(f"dtype must be one of {sorted(BYTES_PER_DTYPE)}, got {dtype!r}")
    if optimizer not in OPTIMIZER_BYTES_PER_PARAM:
        raise ValueError(f"optimizer must be one of {sorted(OPTIMIZER_BYTES_PER_PARAM)}, got {optimizer!r}")
    if device not in RUNTIME_OVERHEAD_GB:
        raise ValueError(f"device must be one of {sorted(RUNTIME_OVERHEAD_GB)}, got {device!r}")
    for name, value in [
        ("per_device_train_batch_size", per_device_train_batch_size),
        ("steps_per_generation", steps_per_generation),
        ("max_completion_length", max_completion_length),
        ("prompt_tokens", prompt_tokens),
    ]:
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if not isinstance(vllm_reserved_gb, (int, float)) or vllm_reserved_gb < 0:
        raise ValueError(f"vllm_reserved_gb must be a number >= 0, got {vllm_reserved_gb!r}")
    if load_in_4bit and not use_lora:
        raise ValueError("A 4-bit model cannot be fine-tuned directly: set use_lora=True (QLoRA) or load_in_4bit=False")
    trained_layers = spec.num_layers
    if use_lora and lora_top_layers is not None:
        if not isinstance(lora_top_layers, int) or not 1 <= lora_top_layers <= spec.num_layers:
            raise ValueError(f"lora_top_layers must be an integer from 1 to {spec.num_layers}, got {lora_top_layers!r}")
        trained_layers = lora_top_layers

    speedups = cpu_speedups and device == "cpu"
    width = BYTES_PER_DTYPE[dtype]
    params = spec.num_parameters
    notes: list[str] = []
    if load_in_4bit:
        weights = spec.linear_parameters * BYTES_PER_4BIT_WEIGHT + (params - spec.linear_parameters) * width
    else:
        weights = params * width
    if use_lora:
        trainable = spec.lora_parameters(lora_r, lora_target_modules) * trained_layers // spec.num_layers
        weights += trainable * 4.0
        gradients = trainable * 4.0
    else:
        trainable = params
        gradients = params * width
    optimizer_bytes = trainable * OPTIMIZER_BYTES_PER_PARAM[optimizer]
    reference = weights if beta > 0 and not use_lora else 0.0
    if beta > 0 and use_lora:
        notes.append("beta > 0 with LoRA: no reference copy, TRL switches the adapter off instead")

    sequence = prompt_tokens + max_completion_length
    tokens = per_device_train_batch_size * sequence
    act_width = width  # activations come out in the weights' dtype
    per_token = _activation_values_per_token(spec, gradient_checkpointing, use_lora) * act_width * trained_layers
    repeated_prompt_kv = 0.0
    if speedups and per_device_train_batch_size > 1:
        tokens = prompt_tokens + per_device_train_batch_size * max_completion_length
        repeated_prompt_kv = per_device_train_batch_size * prompt_tokens * 2 * spec.kv_dim * act_width * trained_layers
    if width < 4 and not gradient_checkpointing:
        per_token += _fp32_bytes_per_token(spec, use_lora) * trained_layers
    if gradient_checkpointing:
        per_token += _activation_values_per_token(spec, False, use_lora) * act_width  # the block being recomputed
    # On the CPU TRL scores every position of the micro-batch (unless told otherwise); on a GPU only the completions.
    every_position = device == "cpu" and not speedups
    scored = per_device_train_batch_size * (sequence if every_position else max_completion_length)
    logprob = logprob_workspace_bytes(spec, scored, device)
    if speedups and tiles_fit(scored, spec.vocab_size, width):
        logprob += kept_tiles_bytes(scored, spec.vocab_size, width)
    if not use_lora:
        logprob += spec.vocab_size * spec.hidden_size * 4.0  # fp32 gradient of the trained output head
    embeddings_out = tokens * spec.hidden_size * 2  # embedding output and final norm
    activations = tokens * per_token + embeddings_out * act_width + repeated_prompt_kv
    generation_batch = per_device_train_batch_size * steps_per_generation
    kv_cache = 0.0 if vllm_reserved_gb else 2 * spec.num_layers * spec.kv_dim * width * generation_batch * sequence
    generation_copies = kept_packs = 0.0
    if speedups and not load_in_4bit:
        packs = (spec.linear_parameters + spec.vocab_size * spec.hidden_size) * width
        if use_lora:
            # fp32 adapters are merged into fresh packs of their layers' groups at each call; every other weight
            # is frozen, and a training run keeps its pack between calls
            merged = merged_group_parameters(spec, lora_target_modules) * trained_layers * width if width == 4 else 0
            generation_copies, kept_packs = merged, packs - merged
        else:
            generation_copies = packs
    return MemoryEstimate(
        label=label or spec.name,
        parameters=params,
        trainable_parameters=trainable,
        weights_gb=weights / GB,
        reference_model_gb=reference / GB,
        gradients_gb=gradients / GB,
        optimizer_gb=optimizer_bytes / GB,
        activations_gb=activations / GB,
        kv_cache_gb=kv_cache / GB,
        overhead_gb=RUNTIME_OVERHEAD_GB[device],
        logprob_gb=logprob / GB,
        accumulates_gradients=(gradient_accumulation_steps or steps_per_generation) > 1,
        notes=tuple(notes),
        vllm_gb=float(vllm_reserved_gb),
        generation_copies_gb=generation_copies / GB,
        kept_packs_gb=kept_packs / GB,
        kept_after_generation_gb=(generation_copies if speedups else 0.0) / GB,
    )


def estimate_for_profile(
    profile: Profile | str | None = None,
    spec: ModelSpec | None = None,
    *,
    optimizer: str = "adamw",
    prompt_tokens: int | None = None,
    label: str | None = None,
    gpu_memory_gb: float | None = None,
) -> MemoryEstimate:
    """The estimate for a course profile (sizes read from ``course_utils.core.profiles``).

    ``gpu_memory_gb``: the GPU's memory, for a profile that colocates vLLM (``use_vllm``): vLLM then reserves
    ``vllm_gpu_memory_utilization`` of it. Without it the estimate assumes generation without vLLM.

    The weights' dtype is the one the profile trains in on this machine (``Profile.training_dtype``: the CPU
    lab trains a bf16 copy only where the CPU computes bf16 natively). ``prompt_tokens`` defaults to the
    profile's prompt cap (``max_prompt_tokens``) when it has one, else to a generous GSM8K prompt.
    """
    p = get_profile(profile)
    prompt_tokens = prompt_tokens or p.max_prompt_tokens or DEFAULT_PROMPT_TOKENS
    return estimate_memory(
        spec or spec_for_profile(p),
        dtype=p.training_dtype,
        use_lora=p.use_lora,
        lora_r=p.lora_r,
        lora_target_modules=p.lora_target_modules,
        lora_top_layers=p.lora_top_layers,
        load_in_4bit=p.load_in_4bit,
        optimizer=optimizer,
        per_device_train_batch_size=p.per_device_train_batch_size,
        steps_per_generation=p.gradient_accumulation_steps,
        gradient_accumulation_steps=p.gradient_accumulation_steps,
        max_completion_length=p.max_completion_length,
        prompt_tokens=prompt_tokens,
        gradient_checkpointing=p.gradient_checkpointing,
        beta=p.beta,
        device=p.device,
        label=label or f"{p.name}",
        vllm_reserved_gb=vllm_reservation_gb(p, gpu_memory_gb),
        cpu_speedups=p.cpu_speedups,
    )


def vllm_reservation_gb(profile: Profile | str | None, gpu_memory_gb: float | None) -> float:
    """GB a colocated vLLM reserves for the profile on a GPU of ``gpu_memory_gb`` (0 without vLLM or a GPU size)."""
    p = get_profile(profile)
    if not (p.use_vllm and p.device == "cuda" and gpu_memory_gb):
        return 0.0
    return p.vllm_gpu_memory_utilization * gpu_memory_gb


def memory_table() -> Any:
    """Qwen2.5-0.5B on T4 / A100 / H100 / A800 (several set-ups) and the CPU lab's SmolLM2, as a DataFrame.

    Each row: the parts in GB, the total, the memory the hardware offers, and whether it fits.
    """
    import pandas as pd

    t4, gpu, cpu = get_profile("colab-t4"), get_profile("gpu"), get_profile("cpu")
    layers = f" in the top {cpu.lora_top_layers} layers" if cpu.lora_top_layers else ""
    lab_setup = f"cpu profile: {cpu.training_dtype}, " + (f"LoRA r={cpu.lora_r}{layers}" if cpu.use_lora else "full")
    full_fp16 = t4.override(use_lora=False, load_in_4bit=False, gradient_checkpointing=False)
    vllm = f"vLLM colocated ({gpu.vllm_gpu_memory_utilization:.0%} of the GPU)"
    rows = [
        ("T4", "colab-t4 profile: 4-bit + LoRA, fp16, checkpointing", estimate_for_profile(t4)),
        ("T4", "full fine-tuning fp16, AdamW, no checkpointing", estimate_for_profile(full_fp16)),
        (
            "T4",
            "same, 8-bit AdamW + checkpointing",
            estimate_for_profile(full_fp16.override(gradient_checkpointing=True), optimizer="adamw_8bit"),
        ),
        ("A100-40GB", "gpu profile: bf16 + LoRA r=32, no vLLM", estimate_for_profile(gpu.override(use_vllm=False))),
        (
            "A100-40GB",
            f"gpu profile: bf16 + LoRA r=32, {vllm}",
            estimate_for_profile(gpu, gpu_memory_gb=GPU_MEMORY_GB["A100-40GB"]),
        ),
        (
            "H100-80GB",
            f"gpu profile: bf16 + LoRA r=32, {vllm}",
            estimate_for_profile(gpu, gpu_memory_gb=GPU_MEMORY_GB["H100-80GB"]),
        ),
        (
            "A100-40GB",
            "gpu profile, full fine-tuning bf16, no vLLM",
            estimate_for_profile(gpu.override(use_lora=False, use_vllm=False)),
        ),
        (
            "A800-80GB",
            "gpu profile, full fine-tuning bf16, no vLLM",
            estimate_for_profile(gpu.override(use_lora=False, use_vllm=False)),
        ),
    ]
    records = []
    for hardware, setup, est in rows:
        record = {"hardware": hardware, "model": QWEN25_05B.name, "setup": setup, **est.as_row()}
        record["available_gb"] = GPU_MEMORY_GB[hardware]
        records.append(record)
    lab = estimate_for_profile(cpu)
    records.append(
        {
            "hardware": "CPU (laptop)",
            "model": "SmolLM2-135M-Instruct",
            "setup": lab_setup,
            **lab.as_row(),
            "available_gb": None,
        }
    )
    table = pd.DataFrame(records).drop(columns=["label"])
    table["fits"] = [
        None if a is None or pd.isna(a) else t <= a for t, a in zip(table.total_gb, table.available_gb, strict=True)
    ]
    return table


def what_if_table(profile: Profile | str, changes: dict[str, dict[str, Any]], spec: ModelSpec | None = None) -> Any:
    """How each fix changes the estimate: one row per named set of profile overrides (plus ``optimizer``).

    ``changes`` maps a label to overrides, e.g. ``{"LoRA": {"use_lora": True}, "8-bit Adam": {"optimizer":
    "adamw_8bit"}}``; every row starts again from ``profile``.
    """
    import pandas as pd

    base = get_profile(profile)
    rows = []
    for label, overrides in {"as configured": {}, **changes}.items():
        overrides = dict(overrides)
        optimizer = overrides.pop("optimizer", "adamw")
        est = estimate_for_profile(base.override(**overrides), spec, optimizer=optimizer, label=label)
        rows.append(est.as_row())
    return pd.DataFrame(rows).set_index("label")


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
    "all: colab-t4 profile": {
        "dtype": "float16",
        "use_lora": True,
        "load_in_4bit": True,
        "gradient_checkpointing": True,
        "per_device_train_batch_size": 8,
        "gradient_accumulation_steps": 2,
        "max_completion_length": 256,
    },
}


# --- Measuring the real thing ---------------------------------------------------------------------


def _rss_gb() -> float:
    import psutil

    return psutil.Process().memory_info().rss / GB


def peak_rss_gb() -> float:
    """Peak resident memory of this process's address space in GB: ``VmHWM`` from ``/proc/self/status``.

    Not ``getrusage().ru_maxrss``: Linux carries the *parent's* peak into a child started with fork or
    vfork + exec, so a measurement subprocess of a 2.8 GB pytest process reported at least 2.8 GB whatever
    it did. ``VmHWM`` belongs to the address space the child got at exec. Falls back to ``ru_maxrss`` where
    there is no ``/proc`` (macOS reports it in bytes, Linux in kilobytes).
    """
    import resource

    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024 / GB
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / GB if sys.platform == "darwin" else peak * 1024 / GB


def _run_measurement(profile_json: str, steps: int) -> dict[str, Any]:
    """Inside the fresh subprocess: one real GRPOTrainer run; peak RSS above the post-import baseline."""
    import torch
    import trl  # noqa: F401  (imported before the baseline: its own memory is not the run's)

    p = Profile(**{k: tuple(v) if isinstance(v, list) else v for k, v in json.loads(profile_json).items()})
    torch.manual_seed(0)
    rows = p.per_device_train_batch_size * p.gradient_accumulation_steps * steps // p.num_generations
    dataset = load_gsm8k("train", formatted=True, limit=max(rows, 1), verbose=False)
    baseline = _rss_gb()
    model, tokenizer = load_model_for_training(p)  # the lab's own loading: its train_dtype and all
    after_load = _rss_gb()
    prompts = [tokenizer.apply_chat_template(r, add_generation_prompt=True, tokenize=False) for r in dataset["prompt"]]
    prompt_tokens = max(len(tokenizer(text)["input_ids"]) for text in prompts)

    def length_reward(completions: list, **_: Any) -> list[float]:
        return [len(c[0]["content"]) / 100 for c in completions]

    config = make_grpo_config(
        p,
        output_dir=Path(os.environ.get("TMPDIR", "/tmp")) / "course-memory-measure",
        max_steps=steps,
        save_strategy="no",
        reward_weights=None,
        generation_kwargs={"min_new_tokens": p.max_completion_length},  # full-length completions: the worst case
    )
    trainer = build_trainer(model, tokenizer, p, train_dataset=dataset, config=config, reward_funcs=[length_reward])
    with cpu_speed.enabled(trainer, profile=p):
        trainer.train()
    peak = peak_rss_gb()
    return {
        "baseline_gb": baseline,
        "peak_gb": peak,
        "increase_gb": peak - baseline,
        "after_load_gb": after_load - baseline,
        "prompt_tokens": prompt_tokens,
        "training_dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
    }


def measure_grpo_step_peak(profile: Profile | str = "ci", steps: int = 2, timeout: float = 900) -> dict[str, Any]:
    """Run ``steps`` real GRPOTrainer steps on the CPU in a fresh Python process; compare with the estimate.

    Two steps by default: the optimizer state only exists after the first step, so the second step is
    the first to hold weights, optimizer state, activations and gradients together (the estimate's peak).

    A fresh process so that nothing this process already allocated hides in the peak. The peak resident
    set size (``VmHWM``, see ``peak_rss_gb``) minus the resident size after the imports is the training
    run's own memory.
    Completions are forced to full length (the estimate's worst case). Returns the measurement, the
    estimate for the same settings and the error in percent.
    """
    p = get_profile(profile)
    if p.device != "cpu" or p.model_source != "offline":
        raise ValueError(
            f"Measuring needs a CPU profile with the offline model; {p.name!r} is {p.device}/{p.model_source}"
        )
    code = (
        "import sys, json; from course_utils.training.memory import _run_measurement as run; "
        "print(json.dumps(run(sys.argv[1], int(sys.argv[2]))))"
    )
    # A fixed mmap threshold makes glibc return every large freed block to the OS at once, so the resident
    # size follows the live tensors instead of the allocator's cache (otherwise it only ever grows).
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "MALLOC_MMAP_THRESHOLD_": "131072"}
    done = subprocess.run(
        [sys.executable, "-c", code, json.dumps(p.as_dict()), str(steps)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"The measurement subprocess failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    measured = json.loads(done.stdout.strip().splitlines()[-1])
    estimate = estimate_for_profile(p, prompt_tokens=measured["prompt_tokens"])
    error = 100 * (estimate.total_gb - measured["increase_gb"]) / measured["increase_gb"]
    return {**measured, "profile": p.name, "estimate_gb": estimate.total_gb, "error_pct": error, "estimate": estimate}


def _run_logprob_workspace(positions: int, hidden_size: int, vocab_size: int, dtype: str) -> dict[str, float]:
    """Inside the fresh subprocess: TRL's chunked log-softmax forward and backward, peak RSS of each phase."""
    import threading
    import time

    import torch
    from trl.kernels import ChunkedLogProbFunction

    page = os.sysconf("SC_PAGE_SIZE")

    def resident() -> int:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * page

    def high_water_mark() -> int | None:
        """The kernel's peak resident memory since the last reset (VmHWM), reset now; None where it can't be."""
        try:
            with open("/proc/self/status") as status:
                peak = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmHWM:"))
            with open("/proc/self/clear_refs", "w") as clear:
                clear.write("5")  # Linux: start a new high-water mark from the current resident size
        except (OSError, StopIteration, ValueError):
            return None
        return peak

    def peak_while(run: Any) -> int:
        """Peak resident memory above the start while ``run()`` works.

        The kernel's own high-water mark where Linux lets it be reset (exact); elsewhere sampled every millisecond,
        which can miss a short peak while both cores compute.
        """
        start = resident()
        if high_water_mark() is not None:
            run()
            return max((high_water_mark() or start) - start, 0)
        peak, running = [0], [True]

        def sample() -> None:
            while running[0]:
                peak[0] = max(peak[0], resident() - start)
                time.sleep(0.001)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        try:
            run()
        finally:
            running[0] = False
            sampler.join()
        return peak[0]

    torch.manual_seed(0)
    weight = torch.randn(vocab_size, hidden_size, dtype=getattr(torch, dtype)) * 0.02
    hidden = torch.randn(positions, hidden_size, dtype=weight.dtype, requires_grad=True)
    labels = torch.randint(0, vocab_size, (positions,))
    outputs: dict[str, Any] = {}

    def forward() -> None:
        outputs["logps"], outputs["entropy"], *_ = ChunkedLogProbFunction.apply(
            hidden, weight, None, labels, 1.0, LOGPROB_VOCAB_CHUNK, None, 1.0, ("log_probs", "entropy")
        )

    forward_peak = peak_while(forward)
    backward_peak = peak_while(lambda: outputs["logps"].sum().backward())
    tile = min(positions, LOGPROB_TOKEN_CHUNK) * min(vocab_size, LOGPROB_VOCAB_CHUNK) * 4
    return {"forward_gb": forward_peak / GB, "backward_gb": backward_peak / GB, "tile_gb": tile / GB}


def measure_logprob_workspace(
    positions: int = 800, spec: ModelSpec | None = None, dtype: str = "bfloat16", timeout: float = 300
) -> dict[str, float]:
    """Peak memory of TRL's chunked log-softmax (forward, backward) over ``positions`` positions, on the CPU.

    Runs TRL's own ``ChunkedLogProbFunction`` (random weights of the model's output-head shape, SmolLM2 by
    default) in a fresh process, so that ``logprob_workspace_bytes`` stays a measurement of the installed TRL.
    """
    if not isinstance(positions, int) or positions < 1:
        raise ValueError(f"positions must be a positive integer, got {positions!r}")
    if dtype not in BYTES_PER_DTYPE:
        raise ValueError(f"dtype must be one of {sorted(BYTES_PER_DTYPE)}, got {dtype!r}")
    spec = spec or smollm2_spec()
    code = (
        "import sys, json; from course_utils.training.memory import _run_logprob_workspace as run; "
        "print(json.dumps(run(*map(int, sys.argv[1:4]), sys.argv[4])))"
    )
    args = [str(positions), str(spec.hidden_size), str(spec.vocab_size), dtype]
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072"}  # freed tiles go back to the OS at once
    done = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=timeout, env=env, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"The measurement subprocess failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])
