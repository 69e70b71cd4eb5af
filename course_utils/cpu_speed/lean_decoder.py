"""The lean decoder layer: a Llama-like layer's forward in fewer calls while a group is sampled.

The same operations as transformers' layer, in its order, and the model's own cache, rotary embedding and
attention: the linear layers that read one input are one stacked product through packed weights (q/k/v, gate/up),
LoRA adapters merged into those weights (fp32) or added beside them (bf16) (:mod:`course_utils.cpu_speed.adapters`),
the query and key heads rotated in one call, and an fp32 RMS norm as one op. :func:`lean_layers` installs it;
:mod:`course_utils.cpu_speed.probe` checks it against the model's own layer before the plug-in is switched on.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from course_utils.cpu_speed.adapters import (
    base_layer,
    lora_layers,
    merged_stack,
    merges_into_a_copy,
    plain_lora,
    stacked_adapters,
)
from course_utils.cpu_speed.packed_linear import (
    ROWS_ONLY_WHEN_STACKED,
    KeptPacks,
    StackedLinear,
    pack_stacked,
    stacked_kernels,
)


def _stacked_step(product: Callable[..., torch.Tensor], adapters: Any, x: torch.Tensor) -> torch.Tensor:
    """``x``'s rows through a stacked base product plus its stacked adapters (in fp32, as PEFT adds them)."""
    base = product(x)
    if adapters is None:
        return base
    total = torch.addmm(base.float(), x.float() @ adapters[0], adapters[1])
    return total.to(base.dtype)


def lean_forward(layer: Any, stacks: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
    """A decoder layer's forward through its stacked products (the shared prompt, then one new token per row);
    anything else runs the layer's own forward."""
    hidden = args[0] if args else kwargs["hidden_states"]
    cache, embeddings = kwargs.get("cache"), kwargs.get("position_embeddings")
    attention, (rows, tokens) = layer.self_attn, hidden.shape[:2]
    plain_call = len(args) <= 1 and cache is not None and embeddings is not None
    # hooks on the attention module (transformers' output_attentions) or dropout need the module's own forward
    plain_attention = not (attention._forward_hooks or attention._forward_pre_hooks) and not (
        attention.training and getattr(attention, "attention_dropout", 0.0)
    )
    packed_for = stacks["any_rows"] or (rows == stacks["rows"] and tokens == 1)  # the rows the products take
    if not (packed_for and plain_call and plain_attention) or torch.is_autocast_enabled(hidden.device.type):
        return type(layer).forward(layer, *args, **kwargs)
    dim, (query_heads, key_heads) = attention.head_dim, stacks["heads"]
    qkv = _stacked_step(*stacks["qkv"], stacks["input_norm"](hidden).view(rows * tokens, -1)).view(rows, tokens, -1)
    query_and_key = qkv[..., : (query_heads + key_heads) * dim].view(rows, tokens, -1, dim).transpose(1, 2)
    rotated, _ = stacks["rotary"](query_and_key, stacks["no_heads"], *embeddings)  # q and k heads in one call
    query, key = rotated.split([query_heads, key_heads], dim=1)
    value = qkv[..., (query_heads + key_heads) * dim :].view(rows, tokens, -1, dim).transpose(1, 2)
    key, value = cache.update(key, value, attention.layer_idx)
    output, _ = stacks["attend"](attention, query, key, value, kwargs.get("attention_mask"), scaling=attention.scaling)
    hidden = hidden + _stacked_step(*stacks["o"], output.reshape(rows * tokens, -1)).view(rows, tokens, -1)
    x = stacks["post_attention_norm"](hidden).view(rows * tokens, -1)
    gate, up = _stacked_step(*stacks["gate_up"], x).split(stacks["gate_up_sizes"], dim=1)
    return hidden + _stacked_step(*stacks["down"], layer.mlp.act_fn(gate) * up).view(rows, tokens, -1)


LLAMA_LIKE = ("q_proj", "k_proj", "v_proj", "o_proj")


def stacked_groups(layer: Any) -> dict[str, list[Any]] | None:
    """A Llama-like decoder layer's linear modules by the input they read: q/k/v, o, gate/up and down; None for a
    layer of another shape, with a base that is not a plain linear layer, or with adapters other than plain LoRA."""
    attention, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
    if attention is None or mlp is None or not all(hasattr(attention, name) for name in LLAMA_LIKE):
        return None
    if not all(hasattr(mlp, name) for name in ("gate_proj", "up_proj", "down_proj", "act_fn")):
        return None
    if not all(hasattr(layer, name) for name in ("input_layernorm", "post_attention_layernorm")):
        return None
    groups = {
        "qkv": [attention.q_proj, attention.k_proj, attention.v_proj],
        "o": [attention.o_proj],
        "gate_up": [mlp.gate_proj, mlp.up_proj],
        "down": [mlp.down_proj],
    }
    modules = [m for group in groups.values() for m in group]
    if any(lora_layers(m) and not plain_lora(m) for m in modules):
        return None
    if any(type(base_layer(m)) is not torch.nn.Linear for m in modules):
        return None
    if getattr(sys.modules[type(attention).__module__], "apply_rotary_pos_emb", None) is None:
        return None
    if ALL_ATTENTION_FUNCTIONS.get(attention.config._attn_implementation) is None:
        return None
    return groups


def one_op_norm(norm: torch.nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    """``norm`` as the single op ``F.rms_norm`` where that is what it computes on fp32 (Llama's RMSNorm takes 7
    ops), checked on a probe; otherwise the module itself."""
    weight, eps = getattr(norm, "weight", None), getattr(norm, "variance_epsilon", None)
    if not isinstance(weight, torch.Tensor) or weight.dim() != 1 or weight.dtype != torch.float32 or eps is None:
        return norm
    if norm._forward_hooks or norm._forward_pre_hooks:
        return norm
    fused = partial(F.rms_norm, normalized_shape=(weight.shape[0],), weight=weight.detach(), eps=eps)
    probe = torch.randn(2, weight.shape[0], generator=torch.Generator().manual_seed(0))  # not the sampling RNG
    return fused if torch.allclose(fused(probe), norm(probe), rtol=1e-5, atol=1e-6) else norm


def group_product(
    kernel: str, group: list[Any], rows: int, keep: KeptPacks | None
) -> tuple[Callable[..., torch.Tensor], tuple[torch.Tensor, torch.Tensor] | None]:
    """A group's stacked product through ``kernel``, packed for ``rows`` rows, and the adapters to add to it.

    With fp32 adapters, the merged weights are packed and nothing is added (:func:`merges_into_a_copy`); without
    adapters, frozen weights reuse the pack kept in ``keep``; bf16 adapters are added beside the base product.
    """
    bases = [base_layer(m) for m in group]
    adapted = [m for m in group if lora_layers(m)]
    if adapted and merges_into_a_copy(adapted[0]):
        return pack_stacked(kernel, merged_stack(group), rows), None
    if keep is not None and all(keep.keeps(base) for base in bases):
        return keep.stacked_product(kernel, bases, rows), stacked_adapters(group)
    return pack_stacked(kernel, StackedLinear(bases), rows), stacked_adapters(group)


def lean_stacks(
    layer: Any, groups: dict[str, list[Any]], kernels: dict[str, str], rows: int, keep: KeptPacks | None
) -> dict[str, Any]:
    """What :func:`lean_forward` needs for ``layer``: each group's product (:func:`group_product`), the
    norms, the model's rotary embedding and attention, and the head counts."""
    attention = layer.self_attn
    stacks: dict[str, Any] = {
        "rows": rows,
        "rotary": sys.modules[type(attention).__module__].apply_rotary_pos_emb,
        "attend": ALL_ATTENTION_FUNCTIONS[attention.config._attn_implementation],
        "input_norm": one_op_norm(layer.input_layernorm),
        "post_attention_norm": one_op_norm(layer.post_attention_layernorm),
    }
    for name, group in groups.items():
        stacks[name] = group_product(kernels[name], group, rows, keep)
        stacks[f"{name}_sizes"] = [base_layer(m).out_features for m in group]
    query_size, key_size, _ = stacks["qkv_sizes"]
    stacks["heads"] = (query_size // attention.head_dim, key_size // attention.head_dim)
    dtype = base_layer(groups["qkv"][0]).weight.dtype
    stacks["no_heads"] = torch.empty(1, 0, 1, attention.head_dim, dtype=dtype)  # the rotary call's second input
    stacks["any_rows"] = not set(ROWS_ONLY_WHEN_STACKED) & set(kernels.values())  # see pack_stacked
    return stacks


def decoder_layers_of(model: Any) -> list[Any]:
    """The decoder layers ``generate`` runs through (``model.layers`` of a Llama-like backbone), or none."""
    generating = model.get_base_model() if hasattr(model, "get_base_model") else model
    layers = getattr(getattr(generating, "model", None), "layers", None)
    return list(layers) if isinstance(layers, torch.nn.ModuleList) else []


@dataclass
class LeanLayers:
    """What :func:`lean_layers` set up: the linear layers its stacked products stand for, and their kernels."""

    stood_for: list[torch.nn.Module]
    kernels: dict[tuple[tuple[int, ...], torch.dtype], str]


@contextmanager
def lean_layers(model: Any, rows: int, keep: KeptPacks | None = None) -> Iterator[LeanLayers]:
    """Inside: each decoder layer computes its forward in fewer calls (:func:`lean_forward`).

    The same operations as transformers' layer, in its order: q/k/v, o, gate/up and down each one stacked
    product packed for ``rows`` rows, with the adapters merged in (fp32) or added beside (bf16); the query and key
    heads rotated in one call of the model's rotary embedding; fp32 RMS norms as one op; the cache and attention
    the model's own. Any call of the products' rows and a plain cache runs so, the shared prompt's too (one new
    token per row only, where a stacked product takes only its rows); other calls run the layer's own forward.
    Yields the linear layers the stacked products stand for (which :func:`packed_linears` need not pack) and
    the kernels chosen for the stacked products.
    """
    patched, steps = [], LeanLayers([], {})  # patched: (layer, the forward it had of its own, if any)
    layers = [(layer, groups) for layer in decoder_layers_of(model) if (groups := stacked_groups(layer)) is not None]
    try:
        with torch.no_grad():
            bases = [[base_layer(m) for m in group] for _, groups in layers for group in groups.values()]
            chosen = iter(stacked_kernels(bases, rows) if bases else [])
            for layer, groups in layers:
                kernels = {name: next(chosen) for name in groups}
                stacks = lean_stacks(layer, groups, kernels, rows, keep)
                patched.append((layer, layer.__dict__.get("forward")))
                layer.forward = partial(lean_forward, layer, stacks)
                for name, group in groups.items():
                    steps.stood_for.extend(base_layer(m) for m in group)
                    sizes = stacks[f"{name}_sizes"]
                    steps.kernels[(sum(sizes), group[0].in_features), base_layer(group[0]).weight.dtype] = kernels[name]
        yield steps
    finally:
        for layer, own in patched:
            if own is None:
                layer.__dict__.pop("forward", None)
            else:
                layer.forward = own
