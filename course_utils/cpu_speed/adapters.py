"""LoRA adapters in decoding: added beside a packed base product, or merged into a packed copy of its weight.

PEFT runs each LoRA adapter through five module calls and ops at each new token. For plain LoRA on a plain linear
layer (:func:`plain_lora`), the same sum costs two small fp32 products beside the base product
(:func:`adapters_beside_the_base`), or, for fp32 weights, nothing at all once merged into a copy of the weight
(:func:`merged_stack`). The model's own weights and adapters are never changed.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

import torch
from peft.tuners.lora import LoraLayer

from course_utils.cpu_speed.packed_linear import StackedLinear


def lora_layers(model: Any) -> list[Any]:
    """The model's LoRA layers that have an active adapter (none for a model without adapters)."""
    return [module for module in model.modules() if isinstance(module, LoraLayer) and module.active_adapters]


def plain_lora(layer: Any) -> bool:
    """Whether a LoRA layer's output is exactly ``x @ W.T + b + scaling * (x @ A.T) @ B.T`` on a plain CPU weight.

    Plain LoRA on an fp32 or bf16 ``nn.Linear``, adapters on and not merged, no dropout at work. Not a quantized
    base (4-bit on a GPU), DoRA or another variant, a bias on B, or dropout in training mode.
    """
    base = layer.get_base_layer()
    if type(base) is not torch.nn.Linear or base.weight.dtype not in (torch.float32, torch.bfloat16):
        return False
    if layer.disable_adapters or layer.merged or getattr(layer, "fan_in_fan_out", False):
        return False
    for name in layer.active_adapters:
        if name not in layer.lora_A or name in getattr(layer, "lora_variant", {}):
            return False
        if layer.lora_B[name].bias is not None:
            return False
        dropout = layer.lora_dropout[name]
        if not isinstance(dropout, torch.nn.Identity) and dropout.training:
            return False
    return True


def adapter_products(layer: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each active adapter's ``A.T`` and ``scaling * B.T`` in fp32, contiguous, from their current values."""
    return [
        (
            layer.lora_A[name].weight.detach().float().t().contiguous(),
            (layer.lora_B[name].weight.detach().float() * layer.scaling[name]).t().contiguous(),
        )
        for name in layer.active_adapters
    ]


def _base_plus_adapters(
    layer: Any,
    base: torch.nn.Module,
    products: list[tuple[torch.Tensor, torch.Tensor]],
    x: torch.Tensor,
    *args: Any,
    **kwargs: Any,
) -> torch.Tensor:
    if torch.is_autocast_enabled(x.device.type):  # the trainer's autocast: LoRA as PEFT computes it there
        return type(layer).forward(layer, x, *args, **kwargs)
    base_output = base(x)
    rows = x.reshape(-1, x.shape[-1]).float()
    total = base_output.reshape(-1, base_output.shape[-1]).float()
    for down, up in products:
        total = torch.addmm(total, rows @ down, up)
    return total.to(base_output.dtype).view(base_output.shape)


def adapter_modules(layer: Any) -> list[torch.nn.Module]:
    """A LoRA layer's active adapters' A and B modules."""
    names = layer.active_adapters
    return [*(layer.lora_A[n] for n in names), *(layer.lora_B[n] for n in names)]


@contextmanager
def adapters_beside_the_base(model: Any) -> Iterator[list[torch.nn.Module]]:
    """Inside: each plain LoRA layer adds its adapters to its base layer's output in two small fp32 products each.

    ``base(x) + (x @ A.T) @ (scaling * B.T)``, the second product fused with the sum (``addmm``): what PEFT
    computes without autocast, in 2 ops per adapter instead of PEFT's 5 module calls and ops. The base layer
    stays a plain ``nn.Linear``, so :func:`packed_linears` packs it, and, its weight frozen, a training run keeps
    that pack (:class:`KeptPacks`): nothing as large as a weight is copied per call. Yields the adapters'
    modules, idle until exit. Other layers, and any call under autocast, run their adapters as usual.
    """
    layers = [layer for layer in lora_layers(model) if plain_lora(layer)]
    try:
        with torch.no_grad():
            for layer in layers:
                layer.forward = partial(_base_plus_adapters, layer, layer.get_base_layer(), adapter_products(layer))
        yield [module for layer in layers for module in adapter_modules(layer)]
    finally:
        for layer in layers:
            layer.__dict__.pop("forward", None)


def base_layer(module: Any) -> Any:
    """A LoRA layer's base layer; any other module itself."""
    return module.get_base_layer() if lora_layers(module) else module


def merges_into_a_copy(layer: Any) -> bool:
    """Whether a plain LoRA layer's adapters go into a copy of its base weight for decoding: fp32 bases.

    In fp32, ``x @ (W + s B A).T`` is ``x @ W.T + s (x @ A.T) @ B.T`` up to rounding, in one product per token
    instead of three. A bf16 weight cannot hold so small an update, so bf16 bases keep their adapters beside.
    """
    return base_layer(layer).weight.dtype == torch.float32


def merged_stack(modules: list[Any]) -> StackedLinear:
    """The modules' base layers stacked by rows, each LoRA layer's active adapters added into its rows (W + s B A).

    A copy: the model's own weights and adapters are left as they are.
    """
    stacked = StackedLinear([base_layer(m) for m in modules])
    start = 0
    for module, size in zip(modules, stacked.sizes, strict=True):
        for down, up in adapter_products(module) if lora_layers(module) else []:
            stacked.weight[start : start + size].addmm_(up.t(), down.t())  # += (scaling * B) @ A
        start += size
    return stacked


def stacked_adapters(modules: list[Any]) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The adapters of layers that read one input, as one pair: their ``A.T`` side by side, ``scaling * B.T``
    block-diagonal (zero elsewhere), so ``(x @ down) @ up`` is every layer's adapter output, stacked like their
    base outputs. None if no layer has adapters."""
    pairs = [adapter_products(m) if lora_layers(m) else [] for m in modules]
    if not any(pairs):
        return None
    sizes = [base_layer(m).out_features for m in modules]
    down = torch.cat([d for layer_pairs in pairs for d, _ in layer_pairs], dim=1)
    up = down.new_zeros(down.shape[1], sum(sizes))
    row, column = 0, 0
    for layer_pairs, size in zip(pairs, sizes, strict=True):
        for d, u in layer_pairs:
            up[row : row + d.shape[1], column : column + size] = u
            row += d.shape[1]
        column += size
    return down, up
