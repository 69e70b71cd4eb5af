"""Sampling a GRPO group on a CPU without wasted work: the same policy, fewer passes over the weights.

GRPO samples ``num_generations`` completions of every prompt. Plain ``generate`` reads each copy of the prompt
again, streams the weights through torch's default product, and runs each LoRA adapter through five module calls
and ops at each new token. On a CPU, where generation is most of a training step, all of it costs time that
changes nothing in what is sampled:

- each distinct prompt is read once, and its key/value cache is copied to the rows of its group
  (:mod:`course_utils.cpu_speed.prompt_cache`);
- the linear layers compute through weights packed once (:mod:`course_utils.cpu_speed.packed_linear`); during training,
  where the base weights are frozen, their packs are kept from one call to the next (:class:`KeptPacks`);
- in each decoder layer, the layers that read one input are one stacked product (q/k/v, gate/up), the query and
  key heads are rotated in one call, and an fp32 RMS norm is one op (:mod:`course_utils.cpu_speed.lean_decoder`);
- fp32 LoRA adapters are merged into a packed copy of their base weights once per call, so a new token costs
  one product per layer, not three; bf16 adapters are added beside the base product in fp32, as PEFT does
  (:mod:`course_utils.cpu_speed.adapters`);
- attention for one new token reads each key/value head with its group of query heads as rows
  (:mod:`course_utils.cpu_speed.attention`);
- each token is drawn from the cumulative probabilities, one uniform number per row and step of a two-step
  draw, where ``torch.multinomial`` draws an exponential number for every entry of the vocabulary
  (:mod:`course_utils.cpu_speed.sampling`);
- it runs in ``torch.inference_mode``, without autograd's bookkeeping on each op.

Sampling itself stays transformers' ``generate`` with the trainer's generation config, so the completions
come from the current policy, with the same probabilities. This module puts the parts together:
:func:`install` routes a model's ``generate`` through :func:`group_generate` for the length of a ``with`` block
(``course_utils.cpu_speed.enabled`` uses it for a ``GRPOTrainer``, ``for_generation`` for evaluation).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from course_utils.cpu_speed.adapters import adapters_beside_the_base
from course_utils.cpu_speed.attention import grouped_query_decoding
from course_utils.cpu_speed.lean_decoder import lean_layers
from course_utils.cpu_speed.packed_linear import KeptPacks, packed_linears
from course_utils.cpu_speed.prompt_cache import new_token_budget, shared_prompt_cache, with_room
from course_utils.cpu_speed.sampling import sampling_by_inverse_cdf

INSTALLED_FLAG = "_course_group_generation"
KEPT_PACKS = "_course_kept_packs"  # a model attribute: the KeptPacks of the training run that owns the model


def group_generate(model: Any, generate: Callable[..., Any], **kwargs: Any) -> Any:
    """``generate(**kwargs)`` with each group's prompt read once, through packed weights with the adapters in.

    The weights are packed first, so the shared prompt reads them packed too. It runs in
    ``torch.inference_mode``, which skips autograd's bookkeeping on every op (``no_grad`` still does some), and
    returns normal tensors: the trainer computes gradients through the completions' token ids. While a training
    run keeps packs on the model (:func:`keeping_frozen_packs`), frozen layers reuse theirs.
    """
    input_ids, attention_mask = kwargs.get("input_ids"), kwargs.get("attention_mask")
    rows = input_ids.shape[0] if input_ids is not None else 1
    kept = getattr(model, KEPT_PACKS, None)
    with (
        torch.inference_mode(),
        adapters_beside_the_base(model) as idle,
        grouped_query_decoding(model),
        lean_layers(model, rows, kept) as lean,
        packed_linears(model, rows, skip=[*idle, *lean.stood_for], keep=kept),
        sampling_by_inverse_cdf(),
    ):
        if input_ids is not None and attention_mask is not None and not {"cache", "past_key_values"} & kwargs.keys():
            cache = shared_prompt_cache(model, input_ids, attention_mask)
            if cache is not None:
                kwargs["cache"] = with_room(cache, 1 + (new_token_budget(model, kwargs) or input_ids.shape[1]))
        output = generate(**kwargs)
    return normal_tensors(output)


@contextmanager
def keeping_frozen_packs(model: Any) -> Iterator[KeptPacks]:
    """Inside: the model's ``generate`` keeps its frozen layers' packed copies between calls (:class:`KeptPacks`).

    For a training run (or a benchmark of one), where the base weights do not change. Each use starts with no
    packs and drops them on exit.
    """
    before, kept = getattr(model, KEPT_PACKS, None), KeptPacks()
    setattr(model, KEPT_PACKS, kept)
    try:
        yield kept
    finally:
        kept.clear()
        setattr(model, KEPT_PACKS, before)


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


@contextmanager
def install(model: Any) -> Iterator[Any]:
    """Inside: ``model.generate`` samples through :func:`group_generate`; on exit the model's own ``generate``
    attribute is back (none on the instance if it had none). Installing inside an install changes nothing."""
    if getattr(model, INSTALLED_FLAG, False):
        yield model
        return
    missing = object()
    own = model.__dict__.get("generate", missing)
    original = model.generate

    def generate(input_ids: torch.Tensor | None = None, **kwargs: Any) -> Any:
        return group_generate(model, original, input_ids=input_ids, **kwargs)

    model.generate = generate
    setattr(model, INSTALLED_FLAG, True)
    try:
        yield model
    finally:
        model.__dict__.pop(INSTALLED_FLAG, None)
        if own is missing:
            model.__dict__.pop("generate", None)
        else:
            model.generate = own
