"""TRL's training pass on a CPU: each group's prompt read once, forward and backward.

The rows of a micro-batch are completions of the same prompt, and the model reads that prompt again for each row,
forward and backward. A token's keys, values and hidden state depend only on the tokens before it, so where
every row starts with the same tokens, :func:`prefix_read_once` runs them once and continues the rows from their
cache: the same log-probabilities and gradients (the gradient through the shared prefix is summed over the rows,
as it would be over its copies). The rows end at different lengths, so padded to the longest many of their
positions would be padding; their real tokens run packed as one sequence instead, each attending to the prefix and
its own row.

It is a context manager; ``course_utils.cpu_speed.enabled`` holds it open while a ``GRPOTrainer`` trains.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

import torch
from transformers.modeling_outputs import BaseModelOutputWithPast


def common_prefix_length(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> int:
    """How many leading positions have the same token and mask in every row (all of them if the rows are equal)."""
    if input_ids.dim() != 2 or input_ids.shape != attention_mask.shape:
        raise ValueError(
            f"input_ids and attention_mask must be (rows, tokens) tensors of one shape, got "
            f"{tuple(input_ids.shape)} and {tuple(attention_mask.shape)}"
        )
    same = (input_ids == input_ids[:1]).all(0) & (attention_mask == attention_mask[:1]).all(0)
    differing = (~same).nonzero()
    return int(differing[0]) if len(differing) else input_ids.shape[1]


# A training-pass call may share its prefix only without these (the trainer's scoring call passes none of them)
_OWN_ARGUMENTS = ("cache", "past_key_values", "position_ids", "inputs_embeds")


def scoring_positions(attention_mask: torch.Tensor, start: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The positions after ``start`` whose hidden state scores a token (the next one is real), row by row.

    Returns the row and the column of each, in that order: the layout of the packed sequence
    :func:`shared_prefix_forward` runs, and the order :func:`frozen_layers_from_sampling` replays it in.
    """
    scores = attention_mask[:, start:-1].bool() & attention_mask[:, start + 1 :].bool()
    rows, columns = scores.nonzero(as_tuple=True)
    return rows, columns + start


def packed_rows_mask(prefix_mask: torch.Tensor, rows: torch.Tensor, columns: torch.Tensor) -> torch.Tensor:
    """The attention mask of the packed sequence: each token sees the real prefix, and its own row up to itself."""
    own_row = (rows[:, None] == rows[None, :]) & (columns[:, None] >= columns[None, :])
    prefix = prefix_mask.bool()[None, :].expand(len(rows), -1)
    return torch.cat([prefix, own_row], dim=1)[None, None]


# Attention functions that read a boolean (batch, 1, queries, keys) mask as given
_PACKABLE_ATTENTION = ("sdpa",)


def shared_prefix_forward(
    forward: Callable[..., Any],
    input_ids: torch.Tensor | None = None,
    attention_mask: torch.Tensor | None = None,
    config: Any = None,
    **kwargs: Any,
) -> Any:
    """A decoder backbone's ``forward`` that runs the prefix common to all rows once, then the rows' other tokens.

    Only for a training-pass call (``use_cache=False``, two rows or more, no cache or positions of its own) with at
    least 2 common tokens; any other call is ``forward`` itself. After the prefix, the rows' tokens that score one
    (:func:`scoring_positions`) run as one packed sequence, each attending to the prefix and its own row, so no
    padding is computed (with SDPA attention, ``config._attn_implementation``; otherwise the rows run padded).
    Returns the hidden states of every position, as ``forward`` does: the prefix's are the one row's, expanded
    over the rows (a view, so its gradient sums); positions that score no token are zero.
    """
    shareable = (
        input_ids is not None
        and attention_mask is not None
        and input_ids.shape[0] > 1
        and kwargs.get("use_cache") is False
        and all(kwargs.get(name) is None for name in _OWN_ARGUMENTS)
    )
    shared = min(common_prefix_length(input_ids, attention_mask), input_ids.shape[1] - 1) if shareable else 0
    if shared < 2:
        return forward(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
    rows, cached = input_ids.shape[0], {**kwargs, "use_cache": True}
    prefix = forward(input_ids=input_ids[:1, :shared], attention_mask=attention_mask[:1, :shared], **cached)
    packable = getattr(config, "_attn_implementation", None) in _PACKABLE_ATTENTION
    rest = packed_rows_forward(forward, input_ids, attention_mask, prefix.cache, **cached) if packable else None
    if rest is None:
        prefix.cache.batch_repeat_interleave(rows)
        rest = forward(input_ids=input_ids[:, shared:], attention_mask=attention_mask, cache=prefix.cache, **cached)
        rest = rest.last_hidden_state
    hidden = torch.cat([prefix.last_hidden_state.expand(rows, -1, -1), rest], dim=1)
    return BaseModelOutputWithPast(last_hidden_state=hidden)


def packed_rows_forward(
    forward: Callable[..., Any], input_ids: torch.Tensor, attention_mask: torch.Tensor, cache: Any, **kwargs: Any
) -> torch.Tensor | None:
    """The hidden states of the rows after the prefix in ``cache``, their scoring positions run as one sequence.

    Returns (rows, tokens after the prefix, hidden size), zero where a position scores no token; None if none does.
    """
    shared = cache.get_seq_length()
    row_of, column_of = scoring_positions(attention_mask, shared)
    if not len(row_of):
        return None
    packed = forward(
        input_ids=input_ids[row_of, column_of][None],
        attention_mask=packed_rows_mask(attention_mask[0, :shared], row_of, column_of),
        position_ids=column_of[None],
        cache=cache,
        **kwargs,
    ).last_hidden_state[0]
    rest = packed.new_zeros(input_ids.shape[0], input_ids.shape[1] - shared, packed.shape[-1])
    return rest.index_put((row_of, column_of - shared), packed)


def decoder_backbone(model: Any) -> torch.nn.Module:
    """The decoder stack TRL's fused log-prob forward calls (``LlamaModel`` in a ``LlamaForCausalLM``)."""
    causal_lm = model.get_base_model() if hasattr(model, "get_base_model") else model
    backbone = getattr(causal_lm, "base_model", None)
    if backbone is None or backbone is causal_lm:
        raise ValueError(
            f"{type(causal_lm).__name__} has no decoder backbone under base_model: prefix_read_once is for a "
            "causal LM (a ...ForCausalLM model): leave the part score_shared_prefix_once out "
            "(cpu_speed.enabled's parts=)."
        )
    return backbone


@contextmanager
def prefix_read_once(model: Any) -> Iterator[None]:
    """Inside: ``model``'s training-pass calls read the prefix all rows share once (:func:`shared_prefix_forward`)."""
    backbone = decoder_backbone(model)
    own_forward = type(backbone).forward.__get__(backbone)
    backbone.forward = partial(shared_prefix_forward, own_forward, config=getattr(backbone, "config", None))
    try:
        yield
    finally:
        backbone.__dict__.pop("forward", None)
