"""Preflight's memory check: a planned run's estimate, read from its config and model, against the machine.

``preflight`` reads the config (``config_values``, ``generation_batch``); this module turns those values and the
model (an object, a ``ModelSpec`` or a model id) into ``training.memory.estimate_memory``'s settings, and the
estimate into a finding: an error above the memory available, a warning close to it.
"""

from __future__ import annotations

from typing import Any

from course_utils.core.findings import Finding
from course_utils.core.hardware import Hardware
from course_utils.training.memory import MemoryEstimate, estimate_memory
from course_utils.training.model_shape import QWEN25_05B, ModelSpec, spec_from_config

MEMORY_TIGHT_FRACTION = 0.9


def looks_like_tokenizer(obj: Any) -> bool:
    """Whether ``obj`` is a tokenizer (passed where a model was expected)."""
    return hasattr(obj, "convert_tokens_to_ids")


def model_settings(model: Any, values: dict[str, Any], hardware: Hardware) -> dict[str, Any] | None:
    """Spec, dtype, LoRA and 4-bit for the estimator, from a model object, a ModelSpec or a model name."""
    half = "bfloat16" if values["bf16"] else "float16"
    dtype = "float32" if hardware.device == "cpu" or not (values["bf16"] or values.get("fp16")) else half
    if isinstance(model, ModelSpec):
        return {"spec": model, "dtype": dtype, "use_lora": False, "load_in_4bit": False}
    if isinstance(model, str):
        if "Qwen2.5-0.5B" in model:
            return {"spec": QWEN25_05B, "dtype": dtype, "use_lora": False, "load_in_4bit": False}
        return None
    config = getattr(model, "config", None)
    if config is None or looks_like_tokenizer(model):
        return None
    parameter = next(model.parameters(), None)
    dtype_name = str(getattr(parameter, "dtype", "torch.float32")).replace("torch.", "")
    is_4bit = bool(getattr(model, "is_loaded_in_4bit", False))
    settings = {
        "spec": spec_from_config(config),
        "dtype": dtype_name if dtype_name in ("float32", "float16", "bfloat16") else dtype,
        "use_lora": hasattr(model, "peft_config"),
        "load_in_4bit": is_4bit,
    }
    if settings["use_lora"]:
        adapter = next(iter(model.peft_config.values()))
        targets = adapter.target_modules  # a set of names, or a regex string
        known = settings["spec"].module_shapes()
        settings["lora_r"] = adapter.r
        settings["lora_target_modules"] = tuple(name for name in known if name in targets)
        layers = adapter.layers_to_transform
        if layers is not None:  # the backward pass runs down to the lowest adapted layer
            lowest = min(layers) if isinstance(layers, list) else int(layers)
            settings["lora_top_layers"] = settings["spec"].num_layers - lowest
    return settings


def vllm_reservation(values: dict[str, Any], hardware: Hardware) -> float:
    """GB a colocated vLLM takes on this GPU: ``vllm_gpu_memory_utilization`` of its memory."""
    if not values.get("use_vllm") or values.get("vllm_mode", "colocate") != "colocate" or hardware.device != "cuda":
        return 0.0
    return float(values.get("vllm_gpu_memory_utilization") or 0.0) * hardware.total_memory_gb


def estimate_for_config(
    values: dict[str, Any], model: Any, hardware: Hardware, prompt_tokens: int | None, steps: int, speedups: bool
) -> MemoryEstimate | None:
    """``estimate_memory`` for a config's values (``steps`` generation batches per optimizer step) and the model;
    None when the model cannot be read."""
    settings = model_settings(model, values, hardware)
    if settings is None:
        return None
    optim = str(values.get("optim", "adamw_torch"))
    return estimate_memory(
        **settings,
        optimizer="adamw_8bit" if "8bit" in optim else "adamw",
        per_device_train_batch_size=values["per_device_train_batch_size"],
        steps_per_generation=steps,
        max_completion_length=values.get("max_completion_length") or 256,
        **({"prompt_tokens": prompt_tokens} if prompt_tokens else {}),
        gradient_checkpointing=bool(values.get("gradient_checkpointing")),
        beta=values.get("beta", 0.0),
        device=hardware.device,
        vllm_reserved_gb=vllm_reservation(values, hardware),
        cpu_speedups=speedups,
    )


def memory_findings(estimate: MemoryEstimate, hardware: Hardware) -> list[Finding]:
    """An error when the estimate exceeds the memory available, a warning above ``MEMORY_TIGHT_FRACTION`` of it."""
    need, have = estimate.total_gb, hardware.available_memory_gb
    parts = (
        f"weights {estimate.weights_gb:.2f}, gradients {estimate.gradients_gb:.2f}, optimizer "
        f"{estimate.optimizer_gb:.2f}, activations {estimate.activations_gb:.2f}, log-softmax workspace "
        f"{estimate.logprob_gb:.2f}" + (f", vLLM {estimate.vllm_gb:.2f}" if estimate.vllm_gb else "") + " GB"
    )
    fix = (
        "Lower per_device_train_batch_size and raise gradient_accumulation_steps (same completions per step), "
        "turn on gradient_checkpointing, train LoRA adapters (use_lora), load in 4-bit, use bf16/fp16 on a GPU, "
        "or shorten max_completion_length."
    )
    if need > have:
        return [
            Finding(
                "error",
                "memory-too-high",
                f"Estimated peak memory {need:.1f} GB > {have:.1f} GB available on the {hardware.label} "
                f"({parts}): expect an out-of-memory error.",
                fix,
            )
        ]
    if need > MEMORY_TIGHT_FRACTION * have:
        return [
            Finding(
                "warning",
                "memory-tight",
                f"Estimated peak memory {need:.1f} GB is over {MEMORY_TIGHT_FRACTION:.0%} of the {have:.1f} GB "
                f"available on the {hardware.label} ({parts}).",
                fix,
            )
        ]
    return []
