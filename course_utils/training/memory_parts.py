"""The parts of a GRPO run's memory, each in bytes, from the model's shape and the run's settings.

``RunSettings`` holds what the memory depends on besides the model's shape (checked when made); each function
below counts one part (weights, activations, the log-softmax workspace, the generation KV cache, the CPU plug-in's
packed copies). ``training.memory`` adds them up by phase into the estimate.
"""

from __future__ import annotations

from dataclasses import dataclass

from course_utils.core.speedups import kept_tiles_bytes, tiles_fit
from course_utils.training.model_shape import ModelSpec

GB = 1024**3
# A GSM8K chat prompt (system format instruction + question, through the chat template) is about
# 100-200 tokens; prompts in a batch are left-padded to the longest, so we take the upper end.
DEFAULT_PROMPT_TOKENS = 200
# TRL scores completions with a chunked log-softmax over the output head (trl/kernels/chunked_logprob.py):
# tiles of at most TOKEN_CHUNK_SIZE positions x _CHUNKED_LOGPROB_CHUNK_SIZE vocabulary entries, in fp32.
LOGPROB_TOKEN_CHUNK = 4096
LOGPROB_VOCAB_CHUNK = 32768
# At the peak of the backward pass, on the CPU, where PyTorch ops fold the tiles: about 8 fp32 tiles of
# positions x vocabulary chunk, plus copies of one vocabulary chunk of the output head in fp32, whose number
# depends on the machine's matrix library (none on some, a few on others): the estimate plans for the larger
# (``memory_measurement.measure_logprob_workspace`` measures both with SmolLM2's head). On a GPU a Triton kernel
# folds the tiles, only completion tokens are scored and the product is accumulated in fp32 directly: 2 tiles
# and no copies is our assumption there, not a measurement.
LOGPROB_BACKWARD_TILES = {"cpu": 8.0, "cuda": 2.0}
LOGPROB_WEIGHT_COPIES = {"cpu": 3.3, "cuda": 0.0}
# Runtime memory that no tensor accounts for: the CUDA context and allocator slack on a GPU.
RUNTIME_OVERHEAD_GB = {"cuda": 0.6, "cpu": 0.0}
BYTES_PER_DTYPE = {"float32": 4.0, "float16": 2.0, "bfloat16": 2.0}
# NF4 stores 4 bits per weight plus one (double-quantised) scale per 64 weights: ~0.53 bytes per weight.
BYTES_PER_4BIT_WEIGHT = 0.53
OPTIMIZER_BYTES_PER_PARAM = {"adamw": 8.0, "adamw_8bit": 2.0, "sgd": 0.0}
# LoRA adapters, their gradients and (on a CPU) the weights merged with them stay in fp32
FP32_BYTES = 4.0


@dataclass(frozen=True)
class RunSettings:
    """What a GRPO run's memory depends on besides the model's shape; checked when made.

    ``dtype`` is the dtype the weights are loaded in (fp32 on the CPU). LoRA adapters are kept in fp32;
    ``lora_top_layers`` puts them in the top layers only, and the layers below then keep no activations. A
    reference model is counted only where TRL builds one: ``beta > 0`` without LoRA (with LoRA, TRL disables the
    adapter instead). ``vllm_reserved_gb``: what a colocated vLLM reserves (``vllm_gpu_memory_utilization`` x the
    GPU's memory); it then generates in its own reservation, so the training model keeps no generation KV cache.
    ``cpu_speedups`` (on the CPU; ``course_utils.cpu_speed``): the log-softmax scores the completion tokens only
    and keeps its logits (scored positions x vocabulary) for the backward where they fit its budget; a
    micro-batch's rows read their shared prompt once (each row still keeps its keys and values); sampling packs
    a copy of every linear weight and of the output head (with LoRA the packs of the frozen weights are kept for
    the run, the layers with fp32 adapters packed afresh at each call); and the process keeps what it frees
    until the step ends.
    """

    dtype: str = "float32"
    use_lora: bool = False
    lora_r: int = 16
    lora_target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")
    lora_top_layers: int | None = None
    load_in_4bit: bool = False
    optimizer: str = "adamw"
    per_device_train_batch_size: int = 8
    steps_per_generation: int = 1
    gradient_accumulation_steps: int | None = None
    max_completion_length: int = 256
    prompt_tokens: int = DEFAULT_PROMPT_TOKENS
    gradient_checkpointing: bool = False
    beta: float = 0.0
    device: str = "cpu"
    vllm_reserved_gb: float = 0.0
    cpu_speedups: bool = False

    def __post_init__(self) -> None:
        for name, choices in (
            ("dtype", BYTES_PER_DTYPE),
            ("optimizer", OPTIMIZER_BYTES_PER_PARAM),
            ("device", RUNTIME_OVERHEAD_GB),
        ):
            if getattr(self, name) not in choices:
                raise ValueError(f"{name} must be one of {sorted(choices)}, got {getattr(self, name)!r}")
        for name in ("per_device_train_batch_size", "steps_per_generation", "max_completion_length", "prompt_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if not isinstance(self.vllm_reserved_gb, (int, float)) or self.vllm_reserved_gb < 0:
            raise ValueError(f"vllm_reserved_gb must be a number >= 0, got {self.vllm_reserved_gb!r}")
        if self.load_in_4bit and not self.use_lora:
            raise ValueError(
                "A 4-bit model cannot be fine-tuned directly: set use_lora=True (QLoRA) or load_in_4bit=False"
            )

    @property
    def width(self) -> float:
        """Bytes per weight, and per activation: activations come out in the weights' dtype."""
        return BYTES_PER_DTYPE[self.dtype]

    @property
    def speedups(self) -> bool:
        """The CPU speed-ups act: asked for, and on a CPU."""
        return self.cpu_speedups and self.device == "cpu"

    @property
    def sequence(self) -> int:
        """Tokens in one row: prompt plus a full-length completion."""
        return self.prompt_tokens + self.max_completion_length

    def trained_layers(self, spec: ModelSpec) -> int:
        """Decoder layers the backward pass runs through: all, or with LoRA in the top layers only, those."""
        if not (self.use_lora and self.lora_top_layers is not None):
            return spec.num_layers
        if not isinstance(self.lora_top_layers, int) or not 1 <= self.lora_top_layers <= spec.num_layers:
            raise ValueError(
                f"lora_top_layers must be an integer from 1 to {spec.num_layers}, got {self.lora_top_layers!r}"
            )
        return self.lora_top_layers


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
    the backward pass (added separately). ``saved_tensors_hooks`` on SmolLM2 (fp32) see what this counts,
    within a few percent, with and without LoRA.
    """
    if gradient_checkpointing:
        return float(spec.hidden_size)
    mlp = 2.0 if use_lora else 4.0
    return 8.0 * spec.hidden_size + 2.0 * spec.kv_dim + mlp * spec.intermediate_size


def _fp32_bytes_per_token(spec: ModelSpec, use_lora: bool) -> float:
    """Extra fp32 copies kept per token per block when the weights are 16-bit.

    RMSNorm computes in fp32 (both norms keep an fp32 copy of their input), and LoRA adapters are fp32,
    so peft casts their inputs up (the attention input, shared by q/k/v, and the o_proj input).
    """
    return FP32_BYTES * spec.hidden_size * (2 + (2 if use_lora else 0))


def logprob_workspace_bytes(spec: ModelSpec, scored_positions: int, device: str = "cpu") -> float:
    """Peak memory of TRL's chunked log-softmax over the output head during the backward pass, in bytes."""
    chunk = min(spec.vocab_size, LOGPROB_VOCAB_CHUNK)
    tile = min(scored_positions, LOGPROB_TOKEN_CHUNK) * chunk * FP32_BYTES
    return LOGPROB_BACKWARD_TILES[device] * tile + LOGPROB_WEIGHT_COPIES[device] * chunk * spec.hidden_size * FP32_BYTES


# --- The parts, in bytes ---------------------------------------------------------------------------


def trainable_parameters(spec: ModelSpec, run: RunSettings, trained_layers: int) -> int:
    """Every parameter in full fine-tuning; with LoRA, the adapters of the trained layers."""
    if not run.use_lora:
        return spec.num_parameters
    return spec.lora_parameters(run.lora_r, run.lora_target_modules) * trained_layers // spec.num_layers


def weight_bytes(spec: ModelSpec, run: RunSettings, trainable: int) -> float:
    """The loaded weights (the linear layers in 4-bit with ``load_in_4bit``), plus the fp32 LoRA adapters."""
    params, linear = spec.num_parameters, spec.linear_parameters
    quantised = linear * BYTES_PER_4BIT_WEIGHT + (params - linear) * run.width
    weights = quantised if run.load_in_4bit else params * run.width
    return weights + trainable * FP32_BYTES if run.use_lora else weights


def activation_bytes(spec: ModelSpec, run: RunSettings, trained_layers: int) -> float:
    """What one micro-batch's forward pass keeps for the backward pass (memory-efficient attention: no
    sequence x sequence scores). With the CPU speed-ups the rows read their shared prompt once, but each row
    keeps its own keys and values of it."""
    width, batch = run.width, run.per_device_train_batch_size
    tokens = batch * run.sequence
    per_token = _activation_values_per_token(spec, run.gradient_checkpointing, run.use_lora) * width * trained_layers
    repeated_prompt_kv = 0.0
    if run.speedups and batch > 1:
        tokens = run.prompt_tokens + batch * run.max_completion_length
        repeated_prompt_kv = batch * run.prompt_tokens * 2 * spec.kv_dim * width * trained_layers
    if width < FP32_BYTES and not run.gradient_checkpointing:
        per_token += _fp32_bytes_per_token(spec, run.use_lora) * trained_layers
    if run.gradient_checkpointing:
        per_token += _activation_values_per_token(spec, False, run.use_lora) * width  # the block being recomputed
    embeddings_out = tokens * spec.hidden_size * 2  # embedding output and final norm
    return tokens * per_token + embeddings_out * width + repeated_prompt_kv


def scored_positions(run: RunSettings) -> int:
    """Positions of one micro-batch the output head scores: on the CPU TRL scores every position (unless the CPU
    speed-ups score the completions only), on a GPU only the completion tokens."""
    every_position = run.device == "cpu" and not run.speedups
    return run.per_device_train_batch_size * (run.sequence if every_position else run.max_completion_length)


def unchunked_logits_bytes(spec: ModelSpec, run: RunSettings) -> float:
    """One micro-batch's fp32 logits over the whole vocabulary at once: what a log-softmax without chunks would hold
    (and as much again for its gradient), beside the tiles TRL's chunked one holds (``logprob_workspace_bytes``)."""
    return scored_positions(run) * spec.vocab_size * FP32_BYTES


def logprob_bytes(spec: ModelSpec, run: RunSettings) -> float:
    """The output head's log-softmax workspace, the logits the CPU speed-ups keep where they fit, and the head's
    fp32 gradient when it is trained."""
    scored = scored_positions(run)
    logprob = logprob_workspace_bytes(spec, scored, run.device)
    if run.speedups and tiles_fit(scored, spec.vocab_size, run.width, LOGPROB_TOKEN_CHUNK):
        logprob += kept_tiles_bytes(scored, spec.vocab_size, run.width)
    if not run.use_lora:
        logprob += spec.vocab_size * spec.hidden_size * FP32_BYTES  # fp32 gradient of the trained output head
    return logprob


def kv_cache_bytes(spec: ModelSpec, run: RunSettings) -> float:
    """Keys and values of the whole generation batch at full length; none where a colocated vLLM generates."""
    if run.vllm_reserved_gb:
        return 0.0
    generation_batch = run.per_device_train_batch_size * run.steps_per_generation
    return 2 * spec.num_layers * spec.kv_dim * run.width * generation_batch * run.sequence


def packed_weight_bytes(spec: ModelSpec, run: RunSettings, trained_layers: int) -> tuple[float, float]:
    """Group generation's packed weight copies (CPU speed-ups): (made for each sampling call, kept for the run).

    Without LoRA every linear weight and the output head are packed afresh at each call. With LoRA the frozen
    weights' packs stay between calls, and the groups holding fp32 adapters are packed afresh, merged.
    """
    if not run.speedups or run.load_in_4bit:
        return 0.0, 0.0
    packs = (spec.linear_parameters + spec.vocab_size * spec.hidden_size) * run.width
    if not run.use_lora:
        return packs, 0.0
    merged = 0.0
    if run.width == FP32_BYTES:
        merged = merged_group_parameters(spec, run.lora_target_modules) * trained_layers * run.width
    return merged, packs - merged
