"""A GRPO group's prompt read once: its key/value cache computed for one row per group, then copied to the rows.

GRPO samples ``num_generations`` completions of every prompt, and plain ``generate`` reads each copy of the prompt
again. :func:`shared_prompt_cache` reads each distinct prompt once; :func:`with_room` gives the cache room for the
tokens still to come, so that each new token is written into its place instead of the whole cache being copied
(:class:`PreallocatedLayer`).
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.cache_utils import DynamicLayer


def group_sizes(input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> list[int]:
    """Lengths of the runs of identical consecutive rows (prompt tokens and mask): ``[8]`` for one group of 8."""
    if input_ids.dim() != 2 or input_ids.shape[0] == 0:
        raise ValueError(f"input_ids must be a non-empty (rows, tokens) tensor, got shape {tuple(input_ids.shape)}")
    rows = input_ids if attention_mask is None else torch.cat([input_ids, attention_mask.to(input_ids.dtype)], 1)
    same_as_previous = (rows[1:] == rows[:-1]).all(dim=1).tolist()
    sizes = [1]
    for same in same_as_previous:
        if same:
            sizes[-1] += 1
        else:
            sizes.append(1)
    return sizes


def shared_prompt_cache(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> Any | None:
    """The key/value cache of every prompt token but the last, computed once per group and repeated per row.

    None when there is nothing to share (no two consecutive rows alike, groups of unequal size, or a prompt
    of one token), and plain ``generate`` should run as usual. ``generate`` continues from this cache: it
    reads only the last prompt token, then samples. The prompt runs through the model ``generate`` runs (a
    PEFT model's base model), not through a ``forward`` the trainer may have wrapped in autocast.
    """
    sizes = group_sizes(input_ids, attention_mask)
    if len(set(sizes)) != 1 or sizes[0] == 1 or input_ids.shape[1] < 2:
        return None
    firsts = torch.arange(0, input_ids.shape[0], sizes[0])  # the first row of each (equal-sized) group
    ids, mask = input_ids[firsts, :-1], attention_mask[firsts, :-1]
    positions = (mask.long().cumsum(-1) - 1).clamp(min=0)
    generating = model.get_base_model() if hasattr(model, "get_base_model") else model
    output = generating(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, logits_to_keep=1)
    cache = output.cache
    cache.batch_repeat_interleave(sizes[0])
    return cache


class PreallocatedLayer(DynamicLayer):
    """A ``DynamicLayer`` whose keys and values are views into buffers with room for the tokens still to come.

    ``DynamicLayer`` concatenates at every token, so a step copies the whole cache again; here each new token
    is written into its place. A full buffer doubles; a crop leaves views of it, so writing goes on from the new
    end. If anything else replaced the views (a batch selection, a repeat) or new states come in another dtype,
    the layer concatenates as ``DynamicLayer`` does.
    """

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, room: int) -> None:
        super().__init__()
        self.lazy_initialization(keys, values)
        self._key_buffer, self._value_buffer = self._buffers_for(keys, values, keys.shape[-2] + max(room, 1))
        self.keys, self.values = self._filled(keys.shape[-2])

    @staticmethod
    def _buffers_for(keys: torch.Tensor, values: torch.Tensor, tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
        key_buffer = keys.new_empty(*keys.shape[:-2], tokens, keys.shape[-1])
        value_buffer = values.new_empty(*values.shape[:-2], tokens, values.shape[-1])
        key_buffer[..., : keys.shape[-2], :] = keys
        value_buffer[..., : values.shape[-2], :] = values
        return key_buffer, value_buffer

    def _filled(self, tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self._key_buffer[..., :tokens, :], self._value_buffer[..., :tokens, :]

    def _can_write(self, key_states: torch.Tensor, value_states: torch.Tensor) -> bool:
        """The keys and values are still this layer's views, and the new states have their dtypes."""
        return (
            self.keys is not None
            and self.keys.data_ptr() == self._key_buffer.data_ptr()
            and self.values.data_ptr() == self._value_buffer.data_ptr()
            and self.keys.shape[:-2] == self._key_buffer.shape[:-2]
            and (key_states.dtype, value_states.dtype) == (self.keys.dtype, self.values.dtype)
        )

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self._can_write(key_states, value_states):
            return super().update(key_states, value_states, *args, **kwargs)
        start = self.keys.shape[-2]
        end = start + key_states.shape[-2]
        if end > self._key_buffer.shape[-2]:
            self._key_buffer, self._value_buffer = self._buffers_for(self.keys, self.values, 2 * end)
        self._key_buffer[..., start:end, :] = key_states
        self._value_buffer[..., start:end, :] = value_states
        self.keys, self.values = self._filled(end)
        return self.keys, self.values


def with_room(cache: Any, tokens: int) -> Any:
    """``cache`` with each plain ``DynamicLayer`` made a :class:`PreallocatedLayer` with room for ``tokens`` more."""
    for index, layer in enumerate(cache.layers):
        if type(layer) is DynamicLayer and layer.is_initialized and layer.get_seq_length() > 0:
            cache.layers[index] = PreallocatedLayer(layer.keys, layer.values, tokens)
    return cache


def new_token_budget(model: Any, kwargs: dict[str, Any]) -> int | None:
    """How many tokens this ``generate`` call may add: ``max_new_tokens`` from its arguments or configs."""
    configs = (kwargs.get("generation_config"), getattr(model, "generation_config", None))
    for budget in (kwargs.get("max_new_tokens"), *(getattr(config, "max_new_tokens", None) for config in configs)):
        if budget:
            return int(budget)
    return None
