"""Attention for one new token with its query heads stacked per key/value head, registered with transformers.

For one query token and no mask, transformers hands SDPA every query head with ``enable_gqa``, which torch's CPU
kernel runs slower than the same queries stacked as rows of their key/value head. :func:`grouped_query_sdpa` does
the stacking, and :func:`grouped_query_decoding` makes a model attend through it for the length of a block.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from transformers import AttentionInterface, AttentionMaskInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import sdpa_mask

GROUPED_SDPA = "course_grouped_sdpa"  # the attention implementation generate runs under (grouped_query_sdpa)


def grouped_query_sdpa(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' SDPA attention, with a single new token's query heads stacked as rows of their key/value head.

    For one query token and no mask, transformers passes SDPA every query head with ``enable_gqa``; torch's CPU
    kernel then runs slower than on the same queries stacked per key/value head (what transformers
    itself does when there is a mask). Everything else goes to transformers' ``sdpa_attention_forward``.
    """
    groups = getattr(module, "num_key_value_groups", 1)
    shared_mask = attention_mask is None or attention_mask.shape[1] == 1
    plain = not dropout and kwargs.get("position_bias") is None and kwargs.get("softcap") is None
    if query.shape[2] != 1 or groups == 1 or not shared_mask or not plain or kwargs.get("output_attentions"):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
    batch, heads, _, dim = query.shape
    stacked = query.reshape(batch, heads // groups, groups, dim)
    output = F.scaled_dot_product_attention(stacked, key, value, attn_mask=attention_mask, scale=scaling)
    return output.reshape(batch, heads, 1, value.shape[-1]).transpose(1, 2).contiguous(), None


_MISSING = object()


@contextmanager
def grouped_attention_registered() -> Iterator[None]:
    """Inside: transformers' attention and mask registries know :data:`GROUPED_SDPA` (:func:`grouped_query_sdpa`
    with SDPA's mask). On exit the key is removed again, or any entry it had before is put back."""
    registries = [(AttentionInterface, grouped_query_sdpa), (AttentionMaskInterface, sdpa_mask)]
    before = [registry._global_mapping.get(GROUPED_SDPA, _MISSING) for registry, _ in registries]
    try:
        for registry, function in registries:
            registry.register(GROUPED_SDPA, function)
        yield
    finally:
        for (registry, _), entry in zip(registries, before, strict=True):
            if entry is _MISSING:
                registry._global_mapping.pop(GROUPED_SDPA, None)
            else:
                registry._global_mapping[GROUPED_SDPA] = entry


@contextmanager
def grouped_query_decoding(model: Any) -> Iterator[None]:
    """Inside: a model that attends through SDPA attends through :func:`grouped_query_sdpa`; others as before."""
    generating = model.get_base_model() if hasattr(model, "get_base_model") else model
    config = getattr(generating, "config", None)
    if getattr(config, "_attn_implementation", None) != "sdpa" or not hasattr(generating, "set_attn_implementation"):
        yield
        return
    with grouped_attention_registered():
        generating.set_attn_implementation(GROUPED_SDPA)
        try:
            yield
        finally:
            generating.set_attn_implementation("sdpa")
