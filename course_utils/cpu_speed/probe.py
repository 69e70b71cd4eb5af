"""Does group generation's rewritten decoder layer compute what the model's own layer computes?

:func:`course_utils.cpu_speed.lean_decoder.lean_layers` replaces each Llama-like decoder layer's forward with
stacked products, a one-op norm and one rotary call. It recognises a layer by the names of its modules, so a layer
with an op it does not reproduce (Qwen3's per-head ``q_norm``/``k_norm``, say) would sample from another
distribution without any error. :func:`lean_layer_mismatch` runs both on one small input before the plug-in is
switched on, and says why not when they differ.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from peft.tuners.lora import LoraLayer
from transformers.cache_utils import DynamicCache
from transformers.masking_utils import create_causal_mask

from course_utils.cpu_speed.adapters import lora_layers
from course_utils.cpu_speed.attention import grouped_query_decoding
from course_utils.cpu_speed.lean_decoder import decoder_layers_of, lean_forward, lean_stacks, stacked_groups

PROBE_ROWS, PROBE_PROMPT = 2, 4  # two rows (the second left-padded by one token), a prompt of four, one new token
PROBE_KERNEL = "linear"  # the packed kernels are checked against F.linear where they are chosen (fastest_kernels)

# Largest difference allowed between the two layers' updates (output minus input), relative to the largest entry
# of the own layer's update. Both compute the same ops on the same values; they differ only in summation order
# (stacked products, LoRA merged into the weight as W + sBA) and in fused ops (F.rms_norm, one rotary call), so
# each result differs by a few roundings of its dtype: ~1e-6 relative in fp32, a few ulps (~1e-2) in bf16/fp16,
# whose outputs are rounded after every op. An op left out or a wrong weight changes the update at order 1
# (Qwen3 without q/k norms: ~1e-1). These bounds sit between the two, with room on both sides.
TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 5e-2, torch.float16: 5e-2}

LayerForward = Callable[..., torch.Tensor]


def lean_layer_mismatch(model: Any) -> str | None:
    """None if every kind of decoder layer that group generation rewrites gives the model's own results, within
    :data:`TOLERANCE`; else a one-line reason naming the layer class and the largest relative difference.

    Checks the first layer of each kind (class, and which of its linear layers carry LoRA adapters): layers of a
    kind run the same code. Layers the rewrite does not recognise keep their own forward and need no check. Runs
    a prompt through the layer, then one new token per row, with the mask, positions, rotary embeddings and cache
    the model's backbone passes its layers during ``generate``. The model, its caches and the RNG are left as
    they were.
    """
    backbone = _backbone(model)
    if backbone is None:
        return None
    for layer in _one_layer_per_kind(model):
        reason = _layer_mismatch(backbone, layer)
        if reason is not None:
            return reason
    return None


def probe_key(model: Any) -> tuple[Any, ...]:
    """What :func:`lean_layer_mismatch`'s answer depends on, cheap to compute: the attention implementation, the
    parameters' dtypes, every module's name and class, and each LoRA layer's active adapters, ranks and state.

    The probe takes seconds; a caller keeps its answer under this key and probes again when the key changes (an
    adapter added, enabled or merged after a first probe, say). Trained values change no key: the rewrite runs the
    same ops on any values.
    """
    generating = model.get_base_model() if hasattr(model, "get_base_model") else model
    attention = getattr(getattr(generating, "config", None), "_attn_implementation", None)
    dtypes = tuple(sorted({str(parameter.dtype) for parameter in model.parameters()}))
    return attention, dtypes, tuple(_module_key(name, module) for name, module in model.named_modules())


def _module_key(name: str, module: torch.nn.Module) -> tuple[Any, ...]:
    if not isinstance(module, LoraLayer):
        return name, type(module).__name__
    active = tuple(module.active_adapters)
    ranks = tuple(module.r.get(adapter) for adapter in active)
    variants = tuple(sorted(getattr(module, "lora_variant", {})))
    return name, type(module).__name__, active, ranks, variants, module.merged, module.disable_adapters


def _backbone(model: Any) -> Any | None:
    """The module that owns the decoder layers, the embeddings and the rotary embedding (``model.model``)."""
    generating = model.get_base_model() if hasattr(model, "get_base_model") else model
    backbone = getattr(generating, "model", None)
    needed = ("embed_tokens", "rotary_emb", "config")
    return backbone if backbone is not None and all(hasattr(backbone, n) for n in needed) else None


def _one_layer_per_kind(model: Any) -> list[Any]:
    """The first rewritten layer of each (class, adapted linear layers) kind."""
    kinds: dict[tuple[Any, ...], Any] = {}
    for layer in decoder_layers_of(model):
        groups = stacked_groups(layer)
        if groups is not None:
            adapted = tuple(bool(lora_layers(m)) for group in groups.values() for m in group)
            kinds.setdefault((type(layer), adapted), layer)
    return list(kinds.values())


def _layer_mismatch(backbone: Any, layer: Any) -> str | None:
    """The reason ``layer``'s rewrite differs from its own forward on the probe input, or None."""
    with _evaluating(layer), torch.inference_mode():
        own = _updates(backbone, partial_forward(type(layer).forward, layer))
        with grouped_query_decoding(backbone):  # generate attends through it while the layers are rewritten
            groups = stacked_groups(layer)
            if groups is None:
                return None
            kernels = dict.fromkeys(groups, PROBE_KERNEL)
            stacks = lean_stacks(layer, groups, kernels, PROBE_ROWS, None)
            lean = _updates(backbone, partial_forward(lean_forward, layer, stacks))
    dtype = own[0].dtype
    worst = max(_relative_difference(a, b) for a, b in zip(lean, own, strict=True))
    if worst <= TOLERANCE.get(dtype, TOLERANCE[torch.bfloat16]):
        return None
    return (
        f"group generation's rewrite of {type(layer).__name__} differs from the layer's own forward: largest "
        f"difference {worst:.2g} of the update's scale in {str(dtype).removeprefix('torch.')} "
        f"(allowed {TOLERANCE.get(dtype, TOLERANCE[torch.bfloat16]):.0e})"
    )


def partial_forward(forward: Callable[..., Any], *bound: Any) -> LayerForward:
    """``forward`` with its first arguments bound, returning the hidden states (older layers return a tuple)."""

    def call(*args: Any, **kwargs: Any) -> torch.Tensor:
        output = forward(*bound, *args, **kwargs)
        return output[0] if isinstance(output, tuple) else output

    return call


def _relative_difference(candidate: torch.Tensor, reference: torch.Tensor) -> float:
    scale = reference.float().abs().max().clamp(min=torch.finfo(torch.float32).tiny)
    return float((candidate.float() - reference.float()).abs().max() / scale)


def _updates(backbone: Any, forward: LayerForward) -> list[torch.Tensor]:
    """What ``forward`` adds to its input on the probe's prompt, then on one new token per row (its own cache)."""
    config = backbone.config
    ids = torch.randint(config.vocab_size, (PROBE_ROWS, PROBE_PROMPT + 1), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1:, 0] = 0  # left padding, as a batch of prompts of unequal length has
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    cache, updates = DynamicCache(config=config), []
    for span in (slice(0, PROBE_PROMPT), slice(PROBE_PROMPT, PROBE_PROMPT + 1)):
        hidden = backbone.embed_tokens(ids[:, span])
        causal = create_causal_mask(
            config=config, inputs_embeds=hidden, attention_mask=mask[:, : span.stop], cache=cache,
            position_ids=positions[:, span],
        )  # fmt: skip
        embeddings = backbone.rotary_emb(hidden, position_ids=positions[:, span])
        output = forward(
            hidden, attention_mask=causal, position_embeddings=embeddings, position_ids=positions[:, span],
            cache=cache, use_cache=True,
        )  # fmt: skip
        updates.append(output - hidden)
    return updates


@contextmanager
def _evaluating(module: torch.nn.Module) -> Iterator[None]:
    """Inside: ``module`` in eval mode (no dropout, which would make the two runs differ); its modes restored."""
    modes = [(m, m.training) for m in module.modules()]
    module.eval()
    try:
        yield
    finally:
        for m, training in modes:
            m.training = training
