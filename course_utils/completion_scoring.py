"""TRL's training pass on a CPU: the completion tokens scored only, and each group's prompt read once.

To train, TRL needs the log-probability of every completion token: a log-softmax over the whole vocabulary at
each position (49,152 entries for SmolLM2), the largest single cost of the training pass. The prompt's positions are
masked out of the loss. On devices with Triton, TRL first keeps the unmasked positions and scores only those.
Elsewhere it scores every position, prompt included, and zeroes the prompt's afterwards: accelerators that compile
for each tensor shape would otherwise compile again at every batch. An eager CPU compiles nothing, so there that
rule only costs time and memory.

:func:`completion_tokens_only` makes TRL take its compact path on a CPU too. The completion tokens get the same
log-probabilities and gradients; the prompt's positions are zero either way. :class:`CompletionOnlyScoring`
applies it for the length of a ``GRPOTrainer``'s training, as a callback.

The rows of a micro-batch are completions of the same prompt, and the model reads that prompt again for each row,
forward and backward. A token's keys, values and hidden state depend only on the tokens before it, so where
every row starts with the same tokens, :func:`prefix_read_once` runs them once and continues each row from their
cache: the same log-probabilities and gradients (the gradient through the shared prefix is summed over the rows,
as it would be over its copies). :class:`SharedPrefixScoring` applies it during training.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from functools import partial
from typing import Any

import torch
import trl.trainer.utils as trl_utils
from transformers import TrainerCallback
from transformers.modeling_outputs import BaseModelOutputWithPast

# The function TRL's fused log-prob forward asks whether to score only the unmasked positions
TRL_COMPACT_RULE = "_use_triton"


def trl_has_compact_rule() -> bool:
    """Whether this TRL decides compact scoring through ``trl.trainer.utils._use_triton`` (TRL 1.x does)."""
    return callable(getattr(trl_utils, TRL_COMPACT_RULE, None))


@contextmanager
def completion_tokens_only() -> Iterator[None]:
    """Inside: TRL's fused log-prob forward scores only the unmasked (completion) positions on a CPU as well."""
    if not trl_has_compact_rule():
        raise RuntimeError(
            f"This TRL has no trl.trainer.utils.{TRL_COMPACT_RULE}: install the course's pinned TRL "
            "(make setup), or set score_completions_only=False in the profile."
        )
    original = getattr(trl_utils, TRL_COMPACT_RULE)

    def compact(device: torch.device) -> bool:
        return original(device) or device.type == "cpu"

    setattr(trl_utils, TRL_COMPACT_RULE, compact)
    try:
        yield
    finally:
        setattr(trl_utils, TRL_COMPACT_RULE, original)


class CompletionOnlyScoring(TrainerCallback):
    """A trainer callback: :func:`completion_tokens_only` from the start of training to its end."""

    def __init__(self) -> None:
        self._stack = ExitStack()

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._stack.enter_context(completion_tokens_only())

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._stack.close()


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


def shared_prefix_forward(
    forward: Callable[..., Any],
    input_ids: torch.Tensor | None = None,
    attention_mask: torch.Tensor | None = None,
    **kwargs: Any,
) -> Any:
    """A decoder backbone's ``forward`` that runs the prefix common to all rows once, then each row's remainder.

    Only for a training-pass call (``use_cache=False``, two rows or more, no cache or positions of its own) with at
    least 2 common tokens; any other call is ``forward`` itself. Returns the hidden states of every position, as
    ``forward`` does: the prefix's are the one row's, expanded over the rows (a view, so its gradient sums).
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
    cache = prefix.cache
    cache.batch_repeat_interleave(rows)
    rest = forward(input_ids=input_ids[:, shared:], attention_mask=attention_mask, cache=cache, **cached)
    hidden = torch.cat([prefix.last_hidden_state.expand(rows, -1, -1), rest.last_hidden_state], dim=1)
    return BaseModelOutputWithPast(last_hidden_state=hidden)


def decoder_backbone(model: Any) -> torch.nn.Module:
    """The decoder stack TRL's fused log-prob forward calls (``LlamaModel`` in a ``LlamaForCausalLM``)."""
    causal_lm = model.get_base_model() if hasattr(model, "get_base_model") else model
    backbone = getattr(causal_lm, "base_model", None)
    if backbone is None or backbone is causal_lm:
        raise ValueError(
            f"{type(causal_lm).__name__} has no decoder backbone under base_model: prefix_read_once is for a "
            "causal LM (a ...ForCausalLM model), or set score_shared_prefix_once=False in the profile."
        )
    return backbone


@contextmanager
def prefix_read_once(model: Any) -> Iterator[None]:
    """Inside: ``model``'s training-pass calls read the prefix all rows share once (:func:`shared_prefix_forward`)."""
    backbone = decoder_backbone(model)
    backbone.forward = partial(shared_prefix_forward, type(backbone).forward.__get__(backbone))
    try:
        yield
    finally:
        backbone.__dict__.pop("forward", None)


class SharedPrefixScoring(TrainerCallback):
    """A trainer callback: :func:`prefix_read_once` on the trainer's model from the start of training to its end."""

    def __init__(self) -> None:
        self._stack = ExitStack()

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        if model is None:
            raise ValueError("SharedPrefixScoring needs the trainer's model; pass it in GRPOTrainer(callbacks=[...]).")
        self._stack.enter_context(prefix_read_once(model))

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._stack.close()
