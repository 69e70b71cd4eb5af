"""TRL's training pass on a CPU: the completion tokens scored only, and each group's prompt read once.

To train, TRL needs the log-probability of every completion token: a log-softmax over the whole vocabulary at
each position (49,152 entries for SmolLM2), the largest single cost of the training pass. The prompt's positions are
masked out of the loss. On devices with Triton, TRL first keeps the unmasked positions and scores only those.
Elsewhere it scores every position, prompt included, and zeroes the prompt's afterwards: accelerators that compile
for each tensor shape would otherwise compile again at every batch. An eager CPU compiles nothing, so there that
rule only costs time and memory.

:func:`completion_tokens_only` makes TRL take its compact path on a CPU too. The completion tokens get the same
log-probabilities and gradients; the prompt's positions are zero either way.

The rows of a micro-batch are completions of the same prompt, and the model reads that prompt again for each row,
forward and backward. A token's keys, values and hidden state depend only on the tokens before it, so where
every row starts with the same tokens, :func:`prefix_read_once` runs them once and continues the rows from their
cache: the same log-probabilities and gradients (the gradient through the shared prefix is summed over the rows,
as it would be over its copies). The rows end at different lengths, so padded to the longest many of their
positions would be padding; their real tokens run packed as one sequence instead, each attending to the prefix and
its own row.

With LoRA in the top layers only, the layers below them are frozen, and sampling has just computed their output
for the same tokens: :func:`frozen_layers_from_sampling` records it while ``generate`` runs and starts the training
pass at the first trained layer.

Each is a context manager; ``course_utils.cpu_speed.enabled`` holds them open while a ``GRPOTrainer`` trains.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

import torch
import trl.trainer.utils as trl_utils
from transformers.modeling_outputs import BaseModelOutputWithPast

from course_utils.cpu_speed.lean_decoder import decoder_layers_of

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
            "(make setup), or run without it (cpu_speed.enabled(trainer, parts=...) or COURSE_CPU_SPEEDUPS=0)."
        )
    original = getattr(trl_utils, TRL_COMPACT_RULE)

    def compact(device: torch.device) -> bool:
        return original(device) or device.type == "cpu"

    setattr(trl_utils, TRL_COMPACT_RULE, compact)
    try:
        yield
    finally:
        setattr(trl_utils, TRL_COMPACT_RULE, original)


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


def decoder_layers(model: Any) -> list[torch.nn.Module]:
    """The decoder layers of ``model``'s backbone, in order (``model.layers`` of a ``LlamaModel``)."""
    layers = decoder_layers_of(model)
    if not layers:
        raise ValueError(
            f"{type(decoder_backbone(model)).__name__} keeps no decoder layers under .layers: leave the part "
            "frozen_layers_from_sampling out (cpu_speed.enabled's parts=)."
        )
    return layers


def first_trained_layer(model: Any) -> int:
    """How many decoder layers at the bottom are frozen, and so compute what sampling already computed.

    Those layers' outputs depend only on the tokens: nothing in them (nor in the embeddings) is trained, and no
    dropout makes two passes differ. 0 when there is no such layer.
    """
    backbone = decoder_backbone(model)
    if getattr(getattr(backbone, "config", None), "attention_dropout", 0.0):
        return 0
    embeddings = backbone.get_input_embeddings() if hasattr(backbone, "get_input_embeddings") else None
    if embeddings is not None and any(p.requires_grad for p in embeddings.parameters()):
        return 0
    for index, layer in enumerate(decoder_layers(model)):
        if any(p.requires_grad for p in layer.parameters()):
            return index
    return 0


class SampledLayerInputs:
    """The hidden states that entered one decoder layer while the policy sampled, to replay in the training pass.

    ``record`` collects what the layer reads at each call of one ``generate`` (the prompt's prefill, then one
    token per row and step); :meth:`keep` lays them out by row and position beside the sampled token ids. A
    training-pass call whose rows are those tokens (any order or subset) can then start at that layer.
    """

    def __init__(self) -> None:
        self.calls: list[tuple[torch.Tensor, torch.Tensor]] | None = None  # (positions, hidden states) per call
        self.sequences: torch.Tensor | None = None
        self.hidden: torch.Tensor | None = None
        self.filled: torch.Tensor | None = None

    def record(self, hidden: torch.Tensor, positions: torch.Tensor | None) -> None:
        if self.calls is not None and positions is not None:
            self.calls.append((positions, hidden))

    def keep(self, sequences: torch.Tensor | None, prompt_mask: torch.Tensor | None) -> None:
        """Lay the recorded calls out as (rows, positions, hidden size) for ``sequences``, the rows sampled.

        Kept only if every prompt token is real (no left padding: each position is then the token's column) and
        every call's rows are the sampled rows or one row per equal group of them. Otherwise nothing is kept.
        """
        calls, self.calls, self.hidden = self.calls or [], None, None
        if not calls or sequences is None or sequences.dim() != 2:
            return
        if prompt_mask is None or not bool(prompt_mask.all()):
            return
        rows, columns = sequences.shape
        hidden = torch.zeros(rows, columns, calls[0][1].shape[-1], dtype=calls[0][1].dtype)
        filled = torch.zeros(rows, columns, dtype=torch.bool)
        for positions, states in calls:
            if rows % states.shape[0] or int(positions.max()) >= columns:
                return
            run = rows // states.shape[0]  # each row of the call stands for a run of sampled rows (a group)
            at = torch.arange(rows)[:, None], positions.expand(states.shape[0], -1).repeat_interleave(run, 0)
            hidden[at], filled[at] = states.repeat_interleave(run, 0), True
        self.sequences, self.hidden, self.filled = sequences, hidden, filled

    def rows_for(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor | None:
        """For each row of a training-pass call, the sampled row with the same real tokens; None if any has none.

        The call's real tokens must be the first of each row (no left padding), and every position but the last
        must have been read while sampling (the last one scores no token).
        """
        if self.hidden is None or input_ids.dim() != 2 or input_ids.shape[1] > self.sequences.shape[1]:
            return None
        length = input_ids.shape[1]
        if not bool((attention_mask[:, 1:] <= attention_mask[:, :-1]).all()):
            return None
        real = attention_mask.bool()[:, None, :]
        same = ((self.sequences[None, :, :length] == input_ids[:, None, :]) | ~real).all(-1)
        if not bool(same.any(-1).all()):
            return None
        rows = same.int().argmax(-1)
        return rows if bool(self.filled[rows, : length - 1].all()) else None


def replay_index(
    call: dict[str, torch.Tensor], hidden: torch.Tensor, positions: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Where each position of a decoder layer's input lies in the sampled states: (sampled rows, columns).

    ``call`` holds the training-pass call's ``rows`` (:meth:`SampledLayerInputs.rows_for`) and attention ``mask``;
    the layer's input is then every row, the prefix all rows share (one row from column 0), or the rows' packed
    :func:`scoring_positions` (one row from a later column). None for anything else, or outside such a call.
    """
    rows, mask = call.get("rows"), call.get("mask")
    if rows is None or positions is None:
        return None
    if hidden.shape[0] == len(rows):
        return rows[:, None], positions.expand(len(rows), -1)
    if hidden.shape[0] != 1:
        return None
    start = int(positions[0, 0])
    if start == 0:
        return rows[:1, None], positions
    row_of, column_of = scoring_positions(mask, start)
    if not torch.equal(column_of, positions[0]):
        return None
    return rows[row_of][None], positions


def _hold_place_in_cache(layer: torch.nn.Module, cache: Any, hidden: torch.Tensor) -> None:
    """Zero keys and values for a skipped layer, so that the cache still counts the tokens read.

    transformers reads the cache's length (positions, mask) from its first layer; the skipped layers' entries
    are never attended to.
    """
    if cache is None:
        return
    attention = layer.self_attn
    heads = attention.config.num_key_value_heads
    zeros = hidden.new_zeros(hidden.shape[0], heads, hidden.shape[1], attention.head_dim)
    cache.update(zeros, zeros, attention.layer_idx)


def _recording_generate(generate: Callable[..., Any], inputs: SampledLayerInputs, *args: Any, **kwargs: Any) -> Any:
    inputs.calls = []
    try:
        output = generate(*args, **kwargs)
        sequences = output if isinstance(output, torch.Tensor) else getattr(output, "sequences", None)
        inputs.keep(sequences, kwargs.get("attention_mask"))
    finally:
        inputs.calls = None  # a call that failed records nothing either
    return output


def replayable_call(inputs: SampledLayerInputs, kwargs: dict[str, Any]) -> dict[str, torch.Tensor]:
    """For a backbone call that may start from the sampled states, its sampled ``rows`` and attention ``mask``.

    A training-pass call (``use_cache=False``, no cache or embeddings of its own, outside ``generate``) over the
    sampled tokens (:meth:`SampledLayerInputs.rows_for`); for any other call, nothing.
    """
    ids, mask = kwargs.get("input_ids"), kwargs.get("attention_mask")
    own = ("cache", "past_key_values", "inputs_embeds")
    if inputs.calls is not None or ids is None or mask is None or kwargs.get("use_cache") is not False:
        return {}
    if any(kwargs.get(name) is not None for name in own) or mask.dim() != 2:
        return {}
    rows = inputs.rows_for(ids, mask)
    return {} if rows is None else {"rows": rows, "mask": mask}


class _FrozenLayerReplay:
    """The hooks of :func:`frozen_layers_from_sampling`: they record the first trained layer's input while
    sampling, and replay it in place of the frozen layers during a training-pass call that allows it."""

    def __init__(self, inputs: SampledLayerInputs) -> None:
        self.inputs = inputs
        self.active: dict[str, torch.Tensor] = {}  # the backbone call running now, if it replays (replayable_call)

    def on_backbone_call(self, module: Any, args: tuple, kwargs: dict[str, Any]) -> None:
        self.active = replayable_call(self.inputs, kwargs)

    def after_backbone_call(self, module: Any, args: tuple, kwargs: dict[str, Any], output: Any) -> None:
        self.active = {}

    def replayed(self, layer: torch.nn.Module, last: bool, *args: Any, **kwargs: Any) -> Any:
        """A frozen layer's forward: its input unchanged (the recorded states from the last one) where the call
        replays; otherwise the layer's own forward."""
        hidden = args[0] if args else kwargs["hidden_states"]
        at = replay_index(self.active, hidden, kwargs.get("position_ids"))
        if at is not None:
            _hold_place_in_cache(layer, kwargs.get("cache"), hidden)
            return self.inputs.hidden[at].to(hidden.dtype) if last else hidden
        return type(layer).forward(layer, *args, **kwargs)

    def record(self, module: Any, args: tuple, kwargs: dict[str, Any]) -> None:
        hidden = args[0] if args else kwargs.get("hidden_states")
        if hidden is not None:
            self.inputs.record(hidden.detach(), kwargs.get("position_ids"))


@contextmanager
def frozen_layers_from_sampling(model: Any) -> Iterator[SampledLayerInputs]:
    """Inside: the training pass starts at the first trained layer, from the hidden states sampling computed.

    While ``model.generate`` samples, the input of the first trained decoder layer is recorded at every position.
    A training-pass call (``use_cache=False``, no cache of its own) over the sampled tokens then skips the
    frozen layers below: each returns its input unchanged, and the last of them returns the recorded states.
    They would compute the same values (up to rounding: sampling multiplies in other kernels), and nothing in
    them is trained, so log-probabilities and gradients are the same. Any other call runs every layer.
    """
    frozen = first_trained_layer(model)
    inputs = SampledLayerInputs()
    if frozen == 0:
        yield inputs
        return
    layers, backbone, replay = decoder_layers(model), decoder_backbone(model), _FrozenLayerReplay(inputs)
    handles = [
        backbone.register_forward_pre_hook(replay.on_backbone_call, with_kwargs=True),
        backbone.register_forward_hook(replay.after_backbone_call, with_kwargs=True),
        layers[frozen].register_forward_pre_hook(replay.record, with_kwargs=True),
    ]
    for index in range(frozen):
        layers[index].forward = partial(replay.replayed, layers[index], index == frozen - 1)
    own_generate = model.__dict__.get("generate")  # group generation's, if installed
    model.generate = partial(_recording_generate, model.generate, inputs)
    try:
        yield inputs
    finally:
        for handle in handles:
            handle.remove()
        for index in range(frozen):
            layers[index].__dict__.pop("forward", None)
        if own_generate is None:
            model.__dict__.pop("generate", None)
        else:
            model.generate = own_generate
