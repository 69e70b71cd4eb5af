"""Sampling a GRPO group on a CPU without wasted work: the same policy, fewer passes over the weights.

GRPO samples ``num_generations`` completions of every prompt. Plain ``generate`` reads each copy of the prompt
again, streams the weights through torch's default product, and runs each LoRA adapter through five module calls
and ops at each new token. On a CPU, where generation is most of a training step, all of it costs time that
changes nothing in what is sampled:

- each distinct prompt is read once, and its key/value cache is copied to the rows of its group;
- the linear layers compute through weights packed once (:mod:`course_utils.cpu_speed.packed_linear`); during training,
  where the base weights are frozen, their packs are kept from one call to the next (:class:`KeptPacks`);
- in each decoder layer, the layers that read one input are one stacked product (q/k/v, gate/up), the query and
  key heads are rotated in one call, and an fp32 RMS norm is one op (:func:`lean_layers`);
- fp32 LoRA adapters are merged into a packed copy of their base weights once per call, so a new token costs
  one product per layer, not three; bf16 adapters are added beside the base product in fp32, as PEFT does;
- attention for one new token reads each key/value head with its group of query heads as rows
  (:func:`grouped_query_sdpa`);
- each token is drawn from the cumulative probabilities, one uniform number per row and step of a two-step
  draw, where ``torch.multinomial`` draws an exponential number for every entry of the vocabulary;
- it runs in ``torch.inference_mode``, without autograd's bookkeeping on each op.

Sampling itself stays transformers' ``generate`` with the trainer's generation config, so the completions
come from the current policy, with the same probabilities. :func:`install` routes a model's ``generate`` through
:func:`group_generate` for the length of a ``with`` block (``course_utils.cpu_speed.enabled`` uses it for a
``GRPOTrainer``, ``for_generation`` for evaluation).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
from transformers import AttentionInterface, AttentionMaskInterface
from transformers.cache_utils import DynamicLayer
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import sdpa_mask
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from course_utils.cpu_speed.packed_linear import (
    ROWS_ONLY_WHEN_STACKED,
    KeptPacks,
    StackedLinear,
    pack_stacked,
    packed_linears,
    stacked_kernels,
)

INSTALLED_FLAG = "_course_group_generation"
KEPT_PACKS = "_course_kept_packs"  # a model attribute: the KeptPacks of the training run that owns the model
GROUPED_SDPA = "course_grouped_sdpa"  # the attention implementation generate runs under (grouped_query_sdpa)


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


def _base(module: Any) -> Any:
    return module.get_base_layer() if lora_layers(module) else module


def merges_into_a_copy(layer: Any) -> bool:
    """Whether a plain LoRA layer's adapters go into a copy of its base weight for decoding: fp32 bases.

    In fp32, ``x @ (W + s B A).T`` is ``x @ W.T + s (x @ A.T) @ B.T`` up to rounding, in one product per token
    instead of three. A bf16 weight cannot hold so small an update, so bf16 bases keep their adapters beside.
    """
    return _base(layer).weight.dtype == torch.float32


def merged_stack(modules: list[Any]) -> StackedLinear:
    """The modules' base layers stacked by rows, each LoRA layer's active adapters added into its rows (W + s B A).

    A copy: the model's own weights and adapters are left as they are.
    """
    stacked = StackedLinear([_base(m) for m in modules])
    start = 0
    for module, size in zip(modules, stacked.sizes, strict=True):
        for down, up in adapter_products(module) if lora_layers(module) else []:
            stacked.weight[start : start + size].addmm_(up.t(), down.t())  # += (scaling * B) @ A
        start += size
    return stacked


def _stacked_adapters(modules: list[Any]) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The adapters of layers that read one input, as one pair: their ``A.T`` side by side, ``scaling * B.T``
    block-diagonal (zero elsewhere), so ``(x @ down) @ up`` is every layer's adapter output, stacked like their
    base outputs. None if no layer has adapters."""
    pairs = [adapter_products(m) if lora_layers(m) else [] for m in modules]
    if not any(pairs):
        return None
    sizes = [_base(m).out_features for m in modules]
    down = torch.cat([d for layer_pairs in pairs for d, _ in layer_pairs], dim=1)
    up = down.new_zeros(down.shape[1], sum(sizes))
    row, column = 0, 0
    for layer_pairs, size in zip(pairs, sizes, strict=True):
        for d, u in layer_pairs:
            up[row : row + d.shape[1], column : column + size] = u
            row += d.shape[1]
        column += size
    return down, up


def _stacked_step(product: Callable[..., torch.Tensor], adapters: Any, x: torch.Tensor) -> torch.Tensor:
    """``x``'s rows through a stacked base product plus its stacked adapters (in fp32, as PEFT adds them)."""
    base = product(x)
    if adapters is None:
        return base
    total = torch.addmm(base.float(), x.float() @ adapters[0], adapters[1])
    return total.to(base.dtype)


def _lean_layer(layer: Any, stacks: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
    """A decoder layer's forward through its stacked products (the shared prompt, then one new token per row);
    anything else runs the layer's own forward."""
    hidden = args[0] if args else kwargs["hidden_states"]
    cache, embeddings = kwargs.get("cache"), kwargs.get("position_embeddings")
    attention, (rows, tokens) = layer.self_attn, hidden.shape[:2]
    plain_call = len(args) <= 1 and cache is not None and embeddings is not None
    # hooks on the attention module (transformers' output_attentions) or dropout need the module's own forward
    plain_attention = not (attention._forward_hooks or attention._forward_pre_hooks) and not (
        attention.training and getattr(attention, "attention_dropout", 0.0)
    )
    packed_for = stacks["any_rows"] or (rows == stacks["rows"] and tokens == 1)  # the rows the products take
    if not (packed_for and plain_call and plain_attention) or torch.is_autocast_enabled(hidden.device.type):
        return type(layer).forward(layer, *args, **kwargs)
    dim, (query_heads, key_heads) = attention.head_dim, stacks["heads"]
    qkv = _stacked_step(*stacks["qkv"], stacks["input_norm"](hidden).view(rows * tokens, -1)).view(rows, tokens, -1)
    query_and_key = qkv[..., : (query_heads + key_heads) * dim].view(rows, tokens, -1, dim).transpose(1, 2)
    rotated, _ = stacks["rotary"](query_and_key, stacks["no_heads"], *embeddings)  # q and k heads in one call
    query, key = rotated.split([query_heads, key_heads], dim=1)
    value = qkv[..., (query_heads + key_heads) * dim :].view(rows, tokens, -1, dim).transpose(1, 2)
    key, value = cache.update(key, value, attention.layer_idx)
    output, _ = stacks["attend"](attention, query, key, value, kwargs.get("attention_mask"), scaling=attention.scaling)
    hidden = hidden + _stacked_step(*stacks["o"], output.reshape(rows * tokens, -1)).view(rows, tokens, -1)
    x = stacks["post_attention_norm"](hidden).view(rows * tokens, -1)
    gate, up = _stacked_step(*stacks["gate_up"], x).split(stacks["gate_up_sizes"], dim=1)
    return hidden + _stacked_step(*stacks["down"], layer.mlp.act_fn(gate) * up).view(rows, tokens, -1)


LLAMA_LIKE = ("q_proj", "k_proj", "v_proj", "o_proj")


def stacked_groups(layer: Any) -> dict[str, list[Any]] | None:
    """A Llama-like decoder layer's linear modules by the input they read: q/k/v, o, gate/up and down; None for a
    layer of another shape, with a base that is not a plain linear layer, or with adapters other than plain LoRA."""
    attention, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
    if attention is None or mlp is None or not all(hasattr(attention, name) for name in LLAMA_LIKE):
        return None
    if not all(hasattr(mlp, name) for name in ("gate_proj", "up_proj", "down_proj", "act_fn")):
        return None
    if not all(hasattr(layer, name) for name in ("input_layernorm", "post_attention_layernorm")):
        return None
    groups = {
        "qkv": [attention.q_proj, attention.k_proj, attention.v_proj],
        "o": [attention.o_proj],
        "gate_up": [mlp.gate_proj, mlp.up_proj],
        "down": [mlp.down_proj],
    }
    modules = [m for group in groups.values() for m in group]
    if any(lora_layers(m) and not plain_lora(m) for m in modules):
        return None
    if any(type(_base(m)) is not torch.nn.Linear for m in modules):
        return None
    if getattr(sys.modules[type(attention).__module__], "apply_rotary_pos_emb", None) is None:
        return None
    if ALL_ATTENTION_FUNCTIONS.get(attention.config._attn_implementation) is None:
        return None
    return groups


def one_op_norm(norm: torch.nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    """``norm`` as the single op ``F.rms_norm`` where that is what it computes on fp32 (Llama's RMSNorm takes 7
    ops), checked on a probe; otherwise the module itself."""
    weight, eps = getattr(norm, "weight", None), getattr(norm, "variance_epsilon", None)
    if not isinstance(weight, torch.Tensor) or weight.dim() != 1 or weight.dtype != torch.float32 or eps is None:
        return norm
    if norm._forward_hooks or norm._forward_pre_hooks:
        return norm
    fused = partial(F.rms_norm, normalized_shape=(weight.shape[0],), weight=weight.detach(), eps=eps)
    probe = torch.randn(2, weight.shape[0], generator=torch.Generator().manual_seed(0))  # not the sampling RNG
    return fused if torch.allclose(fused(probe), norm(probe), rtol=1e-5, atol=1e-6) else norm


def group_product(
    kernel: str, group: list[Any], rows: int, keep: KeptPacks | None
) -> tuple[Callable[..., torch.Tensor], tuple[torch.Tensor, torch.Tensor] | None]:
    """A group's stacked product through ``kernel``, packed for ``rows`` rows, and the adapters to add to it.

    With fp32 adapters, the merged weights are packed and nothing is added (:func:`merges_into_a_copy`); without
    adapters, frozen weights reuse the pack kept in ``keep``; bf16 adapters are added beside the base product.
    """
    bases = [_base(m) for m in group]
    adapted = [m for m in group if lora_layers(m)]
    if adapted and merges_into_a_copy(adapted[0]):
        return pack_stacked(kernel, merged_stack(group), rows), None
    if keep is not None and all(keep.keeps(base) for base in bases):
        return keep.stacked_product(kernel, bases, rows), _stacked_adapters(group)
    return pack_stacked(kernel, StackedLinear(bases), rows), _stacked_adapters(group)


def lean_stacks(
    layer: Any, groups: dict[str, list[Any]], kernels: dict[str, str], rows: int, keep: KeptPacks | None
) -> dict[str, Any]:
    """What :func:`_lean_layer` needs for ``layer``: each group's product (:func:`group_product`), the
    norms, the model's rotary embedding and attention, and the head counts."""
    attention = layer.self_attn
    stacks: dict[str, Any] = {
        "rows": rows,
        "rotary": sys.modules[type(attention).__module__].apply_rotary_pos_emb,
        "attend": ALL_ATTENTION_FUNCTIONS[attention.config._attn_implementation],
        "input_norm": one_op_norm(layer.input_layernorm),
        "post_attention_norm": one_op_norm(layer.post_attention_layernorm),
    }
    for name, group in groups.items():
        stacks[name] = group_product(kernels[name], group, rows, keep)
        stacks[f"{name}_sizes"] = [_base(m).out_features for m in group]
    query_size, key_size, _ = stacks["qkv_sizes"]
    stacks["heads"] = (query_size // attention.head_dim, key_size // attention.head_dim)
    dtype = _base(groups["qkv"][0]).weight.dtype
    stacks["no_heads"] = torch.empty(1, 0, 1, attention.head_dim, dtype=dtype)  # the rotary call's second input
    stacks["any_rows"] = not set(ROWS_ONLY_WHEN_STACKED) & set(kernels.values())  # see pack_stacked
    return stacks


def decoder_layers_of(model: Any) -> list[Any]:
    """The decoder layers ``generate`` runs through (``model.layers`` of a Llama-like backbone), or none."""
    generating = model.get_base_model() if hasattr(model, "get_base_model") else model
    layers = getattr(getattr(generating, "model", None), "layers", None)
    return list(layers) if isinstance(layers, torch.nn.ModuleList) else []


@dataclass
class LeanLayers:
    """What :func:`lean_layers` set up: the linear layers its stacked products stand for, and their kernels."""

    stood_for: list[torch.nn.Module]
    kernels: dict[tuple[tuple[int, ...], torch.dtype], str]


@contextmanager
def lean_layers(model: Any, rows: int, keep: KeptPacks | None = None) -> Iterator[LeanLayers]:
    """Inside: each decoder layer computes its forward in fewer calls (:func:`_lean_layer`).

    The same operations as transformers' layer, in its order: q/k/v, o, gate/up and down each one stacked
    product packed for ``rows`` rows, with the adapters merged in (fp32) or added beside (bf16); the query and key
    heads rotated in one call of the model's rotary embedding; fp32 RMS norms as one op; the cache and attention
    the model's own. Any call of the products' rows and a plain cache runs so, the shared prompt's too (one new
    token per row only, where a stacked product takes only its rows); other calls run the layer's own forward.
    Yields the linear layers the stacked products stand for (which :func:`packed_linears` need not pack) and
    the kernels chosen for the stacked products.
    """
    patched, steps = [], LeanLayers([], {})  # patched: (layer, the forward it had of its own, if any)
    layers = [(layer, groups) for layer in decoder_layers_of(model) if (groups := stacked_groups(layer)) is not None]
    try:
        with torch.no_grad():
            bases = [[_base(m) for m in group] for _, groups in layers for group in groups.values()]
            chosen = iter(stacked_kernels(bases, rows) if bases else [])
            for layer, groups in layers:
                kernels = {name: next(chosen) for name in groups}
                stacks = lean_stacks(layer, groups, kernels, rows, keep)
                patched.append((layer, layer.__dict__.get("forward")))
                layer.forward = partial(_lean_layer, layer, stacks)
                for name, group in groups.items():
                    steps.stood_for.extend(_base(m) for m in group)
                    sizes = stacks[f"{name}_sizes"]
                    steps.kernels[(sum(sizes), group[0].in_features), _base(group[0]).weight.dtype] = kernels[name]
        yield steps
    finally:
        for layer, own in patched:
            if own is None:
                layer.__dict__.pop("forward", None)
            else:
                layer.forward = own


SAMPLING_BLOCK = 256  # entries per block of the vocabulary in the two-step draw


def _blocks_and_totals(probs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``probs`` (rows, vocabulary) as (rows, blocks, SAMPLING_BLOCK), zero-padded, and each block's total."""
    rows, vocabulary = probs.shape
    padding = -vocabulary % SAMPLING_BLOCK
    blocks = (F.pad(probs, (0, padding)) if padding else probs).reshape(rows, -1, SAMPLING_BLOCK)
    accumulate = torch.float64 if probs.dtype == torch.float64 else torch.float32  # 256 entries: fp32 holds the sum
    return blocks, blocks.sum(-1, dtype=accumulate).double()


def _draw_from_running_sum(running: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """For each row, the first index whose running sum passes a uniform number times the row's total."""
    totals = running[:, -1:]
    drawn = torch.rand(totals.shape, dtype=torch.float64, generator=generator, device=running.device) * totals
    return torch.searchsorted(running, drawn, right=True).clamp_(max=running.shape[-1] - 1)


def _draw_in_blocks(blocks: torch.Tensor, totals: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    block = _draw_from_running_sum(totals.cumsum(-1), generator)
    chosen = blocks[torch.arange(blocks.shape[0], device=blocks.device), block.squeeze(1)]
    return block * SAMPLING_BLOCK + _draw_from_running_sum(chosen.double().cumsum(-1), generator)


def inverse_cdf_sample(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One index per row of ``probs`` (rows, vocabulary), drawn with probability proportional to each entry.

    Two draws by inverse CDF, one uniform number each: a block of ``SAMPLING_BLOCK`` entries in proportion to
    its total, then an entry of that block in proportion to its probability. P(block) x P(entry | block) is the
    entry's share of the row, so the distribution is that of one draw over the whole row, and the running sums
    cover the block totals and one block rather than the whole vocabulary. Running sums are kept in float64;
    an entry (or block) of probability 0 is never drawn.
    """
    return _draw_in_blocks(*_blocks_and_totals(probs), generator)


@contextmanager
def sampling_by_inverse_cdf() -> Iterator[None]:
    """Inside: ``torch.multinomial(probs, 1)`` on CPU rows draws through :func:`inverse_cdf_sample`.

    transformers samples each new token with ``torch.multinomial``, whose CPU kernel draws an exponential number
    for every vocabulary entry (most of a millisecond per row for 49,152 entries). Other calls (several samples,
    bad probabilities, another device) go to ``torch.multinomial`` itself, errors included. The block totals
    drawn from also check the rows, so the vocabulary is read twice per token.
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
        if one_cpu_draw_per_row and probs.numel() > 0 and bool(probs.min() >= 0):  # NaN and negatives fail
            blocks, totals = _blocks_and_totals(probs)
            row_totals = totals.sum(-1)  # finite and positive in every row: what torch.multinomial accepts
            if bool(torch.isfinite(row_totals).all() and (row_totals > 0).all()):
                return _draw_in_blocks(blocks, totals, generator)
        return multinomial(probs, num_samples, replacement, generator=generator, out=out)

    torch.multinomial = draw
    try:
        yield
    finally:
        torch.multinomial = multinomial


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
    kernel then runs about 2-3x slower than on the same queries stacked per key/value head (what transformers
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
