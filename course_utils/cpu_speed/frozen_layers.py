"""TRL's training pass on a CPU: the frozen layers taken from sampling.

With LoRA in the top layers only, the layers below them are frozen, and sampling has just computed their output
for the same tokens: :func:`frozen_layers_from_sampling` records it while ``generate`` runs and starts the training
pass at the first trained layer.

It is a context manager; ``course_utils.cpu_speed.enabled`` holds it open while a ``GRPOTrainer`` trains.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

import torch

from course_utils.cpu_speed.lean_decoder import decoder_layers_of
from course_utils.cpu_speed.shared_prefix import decoder_backbone, scoring_positions


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
