"""Sampling a GRPO group on a CPU without wasted work: the same policy, fewer passes over the weights.

GRPO samples ``num_generations`` completions of every prompt. Plain ``generate`` reads each copy of the prompt
again, and with LoRA it runs every adapter as two extra small products at each new token. On a CPU, where
generation is most of a training step, both cost time that changes nothing in what is sampled:

- each distinct prompt is read once, and its key/value cache is copied to the rows of its group;
- each fp32 LoRA layer computes one product through a copy of its weight with the adapters' delta added,
  made for the length of the call, where the adapters would add two small products and a sum at every token
  (the trained weights are never written to); a bf16 layer, whose weights would round a small delta away,
  computes its base product and ``x @ A.T`` as one product instead (:func:`stacked_linear`);
- the linear layers compute through weights packed once per call (:mod:`course_utils.packed_linear`);
- each token is drawn from the cumulative probabilities, one uniform number per row, where
  ``torch.multinomial`` draws an exponential number for every entry of the vocabulary;
- it runs in ``torch.inference_mode``, without autograd's bookkeeping on each op.

Sampling itself stays transformers' ``generate`` with the trainer's generation config, so the completions
come from the current policy, with the same probabilities. :class:`GroupGeneration` installs this in a
``GRPOTrainer`` as a callback.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

import torch
from transformers import TrainerCallback
from transformers.cache_utils import DynamicLayer

from course_utils.packed_linear import GENERATE_PACKS_ITSELF, packed_linears

INSTALLED_FLAG = "_course_group_generation"


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


FOLDED = "course_folded"  # the name of the temporary layer each folded or stacked LoRA layer computes through


def lora_layers(model: Any) -> list[Any]:
    """The model's LoRA layers that have an active adapter (none for a model without adapters)."""
    from peft.tuners.lora import LoraLayer

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


def foldable(layer: Any) -> bool:
    """Whether a plain LoRA layer's adapters can be added into a copy of its weight: fp32 weights only.

    Added into bf16 weights (about 3 significant digits), an early, small update would round away, and an fp32
    copy streams twice their bytes at every token. bf16 layers are stacked instead (:func:`stacked_linear`).
    """
    return plain_lora(layer) and layer.get_base_layer().weight.dtype == torch.float32


def folded_linear(layer: Any) -> torch.nn.Linear:
    """An ``nn.Linear`` holding ``W + scaling * B @ A`` for the layer's active adapters, from their current values."""
    base = layer.get_base_layer()
    weight = base.weight.detach().clone()
    for name in layer.active_adapters:
        weight.addmm_(layer.lora_B[name].weight, layer.lora_A[name].weight, alpha=layer.scaling[name])
    return _frozen_linear(weight, base.bias)


def stacked_linear(layer: Any) -> tuple[torch.nn.Linear, list[torch.Tensor]]:
    """An ``nn.Linear`` holding ``W`` with each active adapter's ``A`` stacked under it, and each ``scaling * B.T``.

    One product then gives the base output and every ``x @ A.T`` (in the base weight's dtype, as the trainer's
    bf16 autocast computes them); each adapter then adds ``(x @ A.T) @ (scaling * B.T)`` in fp32, where a
    product this small runs several times faster than in bf16.
    """
    base = layer.get_base_layer()
    names = layer.active_adapters
    downs = (layer.lora_A[name].weight.detach().to(base.weight.dtype) for name in names)
    weight = torch.cat([base.weight.detach(), *downs])
    bias = None
    if base.bias is not None:
        bias = torch.cat([base.bias.detach(), base.bias.new_zeros(weight.shape[0] - base.out_features)])
    ups = [(layer.lora_B[name].weight.detach().float() * layer.scaling[name]).t().contiguous() for name in names]
    return _frozen_linear(weight, bias), ups


def _frozen_linear(weight: torch.Tensor, bias: torch.Tensor | None) -> torch.nn.Linear:
    linear = torch.nn.utils.skip_init(
        torch.nn.Linear, weight.shape[1], weight.shape[0], bias=bias is not None, device=weight.device
    )
    linear.weight = torch.nn.Parameter(weight, requires_grad=False)
    if bias is not None:
        linear.bias = torch.nn.Parameter(bias.detach(), requires_grad=False)
    return linear


def _through_folded(layer: Any, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    if torch.is_autocast_enabled(x.device.type):  # autocast would compute the copy in bf16: LoRA as usual
        return type(layer).forward(layer, x, *args, **kwargs)
    return layer._modules[FOLDED](x)


def _through_stacked(layer: Any, ups: list[torch.Tensor], x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    if torch.is_autocast_enabled(x.device.type):
        return type(layer).forward(layer, x, *args, **kwargs)
    both = layer._modules[FOLDED](x)
    result, start = both[..., : layer.out_features], layer.out_features
    for up in ups:
        result = result + both[..., start : start + up.shape[0]].float() @ up
        start += up.shape[0]
    return result.to(both.dtype)


def idle_while_folded(layer: Any) -> list[torch.nn.Module]:
    """The modules a folded or stacked layer's copy stands in for: its base layer and its active adapters' A and B."""
    names = layer.active_adapters
    return [layer.get_base_layer(), *(layer.lora_A[n] for n in names), *(layer.lora_B[n] for n in names)]


@contextmanager
def adapters_folded_in(model: Any) -> Iterator[list[torch.nn.Module]]:
    """Inside: each plain LoRA layer computes its base product and adapters in one product (plus B's small one).

    fp32 layers compute through :func:`folded_linear`, bf16 layers through :func:`stacked_linear`. Yields the
    layers that stay idle until exit (:func:`idle_while_folded`). The trained weights and adapters are never
    written to; the copies are registered as submodules for the length of the call (so :func:`packed_linears`
    packs them too), then dropped. Other layers, and any call under autocast (which would compute an fp32 copy
    in bf16), run their adapters as usual.
    """
    layers = [layer for layer in lora_layers(model) if plain_lora(layer)]
    try:
        with torch.no_grad():
            for layer in layers:
                if foldable(layer):
                    layer.add_module(FOLDED, folded_linear(layer))
                    layer.forward = partial(_through_folded, layer)
                else:
                    stacked, ups = stacked_linear(layer)
                    layer.add_module(FOLDED, stacked)
                    layer.forward = partial(_through_stacked, layer, ups)
        yield [idle for layer in layers for idle in idle_while_folded(layer)]
    finally:
        for layer in layers:
            layer.__dict__.pop("forward", None)
            layer._modules.pop(FOLDED, None)


def inverse_cdf_sample(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One index per row of ``probs`` (rows, vocabulary), drawn with probability proportional to each entry.

    A uniform number per row, scaled to the row's total, is located in the running sum: an entry of
    probability 0 is never drawn. The running sum is kept in float64, so rounding cannot shift the draw.
    """
    return _draw_from_running_sum(probs.double().cumsum(-1), generator)


def _draw_from_running_sum(running: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    totals = running[:, -1:]
    drawn = torch.rand(totals.shape, dtype=torch.float64, generator=generator, device=running.device) * totals
    return torch.searchsorted(running, drawn, right=True).clamp_(max=running.shape[-1] - 1)


@contextmanager
def sampling_by_inverse_cdf() -> Iterator[None]:
    """Inside: ``torch.multinomial(probs, 1)`` on CPU rows draws through :func:`inverse_cdf_sample`.

    transformers samples each new token with ``torch.multinomial``, whose CPU kernel draws an exponential number
    for every vocabulary entry (most of a millisecond per row for 49,152 entries). Other calls (several samples,
    bad probabilities, another device) go to ``torch.multinomial`` itself, errors included. The running sum
    drawn from also checks the rows, so the vocabulary is read twice per token, not four times.
    """
    multinomial = torch.multinomial

    def draw(
        probs: torch.Tensor,
        num_samples: int,
        replacement: bool = False,
        *,
        generator: torch.Generator | None = None,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        one_cpu_draw_per_row = num_samples == 1 and probs.dim() == 2 and probs.device.type == "cpu" and out is None
        if one_cpu_draw_per_row and probs.shape[-1] > 0 and bool((probs >= 0).all()):  # NaN and negatives fail
            running = probs.double().cumsum(-1)
            totals = running[:, -1]  # finite and positive in every row: what torch.multinomial accepts
            if bool(torch.isfinite(totals).all() and (totals > 0).all()):
                return _draw_from_running_sum(running, generator)
        return multinomial(probs, num_samples, replacement, generator=generator, out=out)

    torch.multinomial = draw
    try:
        yield
    finally:
        torch.multinomial = multinomial


def group_generate(model: Any, generate: Callable[..., Any], **kwargs: Any) -> Any:
    """``generate(**kwargs)`` with the adapters folded in, each group's prompt read once, the weights packed.

    It runs in ``torch.inference_mode``, which skips autograd's bookkeeping on every op (``no_grad`` still does
    some), and returns normal tensors: the trainer computes gradients through the completions' token ids.
    """
    input_ids, attention_mask = kwargs.get("input_ids"), kwargs.get("attention_mask")
    with torch.inference_mode(), adapters_folded_in(model) as idle:
        if input_ids is not None and attention_mask is not None and not {"cache", "past_key_values"} & kwargs.keys():
            cache = shared_prompt_cache(model, input_ids, attention_mask)
            if cache is not None:
                kwargs["cache"] = with_room(cache, 1 + (new_token_budget(model, kwargs) or input_ids.shape[1]))
        rows = input_ids.shape[0] if input_ids is not None else 1
        with packed_linears(model, rows, skip=idle), sampling_by_inverse_cdf():
            output = generate(**kwargs)
    return normal_tensors(output)


def normal_tensors(output: Any) -> Any:
    """``output`` with each inference-mode tensor in it (alone, in a tuple or list, or a field of a dict such as
    ``generate``'s outputs) cloned into a normal tensor, which autograd accepts. Anything else is left as it is."""
    if isinstance(output, torch.Tensor):
        return output.clone() if output.is_inference() else output
    if isinstance(output, (tuple, list)):
        return type(output)(normal_tensors(item) for item in output)
    if isinstance(output, dict):
        for key, value in output.items():
            output[key] = normal_tensors(value)
    return output


def install(model: Any) -> Any:
    """Route ``model.generate`` through :func:`group_generate`; installing twice changes nothing."""
    if getattr(model, INSTALLED_FLAG, False):
        return model
    original = model.generate

    def generate(input_ids: torch.Tensor | None = None, **kwargs: Any) -> Any:
        return group_generate(model, original, input_ids=input_ids, **kwargs)

    model.generate = generate
    setattr(model, INSTALLED_FLAG, True)
    setattr(model, GENERATE_PACKS_ITSELF, True)
    return model


class GroupGeneration(TrainerCallback):
    """A ``GRPOTrainer`` callback: the trainer's model samples its groups through :func:`group_generate`.

    Installed at ``on_train_begin``, when the trainer has wrapped the model in its adapters.
    """

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        if model is None:
            raise ValueError("GroupGeneration needs the trainer's model; pass it in GRPOTrainer(callbacks=[...]).")
        install(model)
