"""Sampling a GRPO group on a CPU without wasted work: the same policy, fewer passes over the weights.

GRPO samples ``num_generations`` completions of every prompt. Plain ``generate`` reads each copy of the prompt
again, and with LoRA it runs every adapter as two extra small products at each new token. On a CPU, where
generation is most of a training step, both cost time that changes nothing in what is sampled:

- each distinct prompt is read once, and its key/value cache is copied to the rows of its group;
- on fp32 weights, the adapters are folded into a copy of the weights they modify, for the length of the call,
  and the original weights are put back afterwards (the trained model never sees the copy). bf16 weights keep
  their adapters: folding would round small updates away;
- the linear layers compute through weights packed once per call (:mod:`course_utils.packed_linear`);
- each token is drawn from the cumulative probabilities, one uniform number per row, where
  ``torch.multinomial`` draws an exponential number for every entry of the vocabulary.

Sampling itself stays transformers' ``generate`` with the trainer's generation config, so the completions
come from the current policy, with the same probabilities. :class:`GroupGeneration` installs this in a
``GRPOTrainer`` as a callback.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from transformers import TrainerCallback

from course_utils.packed_linear import packed_linears

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
    reads only the last prompt token, then samples.
    """
    sizes = group_sizes(input_ids, attention_mask)
    if len(set(sizes)) != 1 or sizes[0] == 1 or input_ids.shape[1] < 2:
        return None
    firsts = torch.arange(0, input_ids.shape[0], sizes[0])  # the first row of each (equal-sized) group
    ids, mask = input_ids[firsts, :-1], attention_mask[firsts, :-1]
    positions = (mask.long().cumsum(-1) - 1).clamp(min=0)
    output = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, logits_to_keep=1)
    cache = output.cache
    cache.batch_repeat_interleave(sizes[0])
    return cache


def lora_layers(model: Any) -> list[Any]:
    """The model's LoRA layers that have an active adapter (none for a model without adapters)."""
    from peft.tuners.lora import LoraLayer

    return [module for module in model.modules() if isinstance(module, LoraLayer) and module.active_adapters]


def foldable(layer: Any) -> bool:
    """Whether a LoRA layer's delta can be added into a copy of its base weight without changing the policy.

    Only an fp32 ``nn.Linear``: a bf16 weight keeps about 3 significant digits, so an early adapter update (a
    small fraction of a weight) would round away and the sampler would lag behind the policy being trained;
    a quantized base (4-bit on a GPU) cannot take a delta at all. Elsewhere the adapters run as usual.
    """
    base = layer.get_base_layer()
    return type(base) is torch.nn.Linear and base.weight.dtype == torch.float32


@contextmanager
def adapters_folded_in(model: Any) -> Iterator[Any]:
    """Inside: the adapters added into copies of their base weights, and ``model`` run without adapters.

    Yields the model to call. The base weights are swapped back on exit, so what trains is untouched and
    nothing is lost to rounding (folding then unfolding bf16 weights would not give them back exactly).
    """
    layers = lora_layers(model)
    if not layers or not all(map(foldable, layers)) or not hasattr(model, "disable_adapter"):
        yield model
        return
    originals = []
    try:
        with torch.no_grad():
            for layer in layers:
                weight = layer.get_base_layer().weight
                delta = sum(layer.get_delta_weight(name) for name in layer.active_adapters)
                originals.append((weight, weight.data))
                weight.data = (weight.data.float() + delta.float()).to(weight.dtype)
        with model.disable_adapter():
            yield model
    finally:
        for weight, data in originals:
            weight.data = data


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
    """``generate(**kwargs)`` with the adapters folded in, each group's prompt read once, the weights packed."""
    input_ids, attention_mask = kwargs.get("input_ids"), kwargs.get("attention_mask")
    with adapters_folded_in(model) as plain, torch.no_grad():
        if input_ids is not None and attention_mask is not None and not {"cache", "past_key_values"} & kwargs.keys():
            cache = shared_prompt_cache(plain, input_ids, attention_mask)
            if cache is not None:
                kwargs["cache"] = cache
        rows = input_ids.shape[0] if input_ids is not None else 1
        with packed_linears(plain, rows), sampling_by_inverse_cdf():
            return generate(**kwargs)


def install(model: Any) -> Any:
    """Route ``model.generate`` through :func:`group_generate`; installing twice changes nothing."""
    if getattr(model, INSTALLED_FLAG, False):
        return model
    original = model.generate

    def generate(input_ids: torch.Tensor | None = None, **kwargs: Any) -> Any:
        return group_generate(model, original, input_ids=input_ids, **kwargs)

    model.generate = generate
    setattr(model, INSTALLED_FLAG, True)
    return model


class GroupGeneration(TrainerCallback):
    """A ``GRPOTrainer`` callback: the trainer's model samples its groups through :func:`group_generate`.

    Installed at ``on_train_begin``, when the trainer has wrapped the model in its adapters.
    """

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        if model is None:
            raise ValueError("GroupGeneration needs the trainer's model; pass it in GRPOTrainer(callbacks=[...]).")
        install(model)
