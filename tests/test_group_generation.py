"""Group generation samples what plain ``generate`` samples, and leaves the trained weights as they were."""

from __future__ import annotations

import contextlib
import copy
from types import MethodType

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import GenerationConfig
from transformers.cache_utils import DynamicLayer

from course_utils.cpu_speed import adapters as ad
from course_utils.cpu_speed import attention as at
from course_utils.cpu_speed import group_generation as gg
from course_utils.cpu_speed import lean_decoder as ld
from course_utils.cpu_speed import packed_linear as pl
from course_utils.cpu_speed import prompt_cache as pc
from course_utils.cpu_speed import sampling as sm
from course_utils.lesson.models import build_tiny_random_model

PAD = 0
_INSTALLED = contextlib.ExitStack()  # group generation installed by a test, put back after it (autouse fixture)


@pytest.fixture(autouse=True)
def put_back_after_each_test():
    yield
    _INSTALLED.close()


def install(model):
    """``model`` sampling through group generation until the test ends (``gg.install`` is a context manager)."""
    _INSTALLED.enter_context(gg.install(model))
    return model


def lora_model(dtype: torch.dtype = torch.float32, seed: int = 0):
    """A tiny random Qwen2 with LoRA whose B matrices are not zero, so the adapters change the output."""
    base = build_tiny_random_model(vocab_size=128, hidden_size=32, num_layers=2, seed=seed).to(dtype)
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "up_proj"], lora_dropout=0.0)
    model = get_peft_model(base, config).eval()
    torch.manual_seed(seed)
    for name, parameter in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(parameter, std=0.5)
    return model


def grouped_prompts() -> dict[str, torch.Tensor]:
    """Two groups of three rows: a 6-token prompt, and a 4-token prompt left-padded to 6."""
    first, second = [5, 17, 23, 42, 7, 9], [PAD, PAD, 11, 13, 19, 3]
    ids = torch.tensor([first] * 3 + [second] * 3)
    return {"input_ids": ids, "attention_mask": (ids != PAD).long()}


def generate(model, inputs, **kwargs):
    with torch.no_grad():
        return model.generate(**inputs, max_new_tokens=8, min_new_tokens=8, pad_token_id=PAD, **kwargs)


def test_group_sizes_follow_runs_of_identical_rows():
    ids = torch.tensor([[1, 2], [1, 2], [3, 4], [1, 2]])
    assert pc.group_sizes(ids) == [2, 1, 1]
    mask = torch.tensor([[1, 1], [0, 1], [1, 1], [1, 1]])
    assert pc.group_sizes(ids, mask) == [1, 1, 1, 1]


@pytest.mark.parametrize("bad", [torch.tensor([1, 2, 3]), torch.zeros(0, 4, dtype=torch.long)])
def test_group_sizes_refuse_a_tensor_that_is_not_rows_of_tokens(bad):
    with pytest.raises(ValueError, match="non-empty \\(rows, tokens\\)"):
        pc.group_sizes(bad)


@pytest.mark.parametrize(
    "rows",
    [
        [[5, 6, 7], [8, 9, 10]],  # no two rows alike
        [[5, 6, 7], [5, 6, 7], [8, 9, 10]],  # groups of unequal size
        [[5], [5]],  # nothing before the last prompt token
    ],
)
def test_nothing_to_share_falls_back_to_plain_generate(rows):
    ids = torch.tensor(rows)
    assert pc.shared_prompt_cache(lora_model(), ids, torch.ones_like(ids)) is None


def test_shared_cache_holds_every_prompt_token_but_the_last_for_every_row():
    inputs = grouped_prompts()
    with torch.no_grad():
        cache = pc.shared_prompt_cache(lora_model(), inputs["input_ids"], inputs["attention_mask"])
    assert cache.get_seq_length() == inputs["input_ids"].shape[1] - 1
    assert cache.layers[0].keys.shape[0] == inputs["input_ids"].shape[0]


def test_greedy_completions_equal_plain_generate_with_adapters_and_padding():
    inputs = grouped_prompts()
    model = lora_model()
    plain = generate(model, inputs, do_sample=False)
    with torch.no_grad():
        base_only = model.disable_adapter()
        with base_only:
            without_adapters = model.generate(**inputs, max_new_tokens=8, pad_token_id=PAD, do_sample=False)
    assert not torch.equal(plain, without_adapters), "the test needs adapters that change the completions"
    install(model)
    assert torch.equal(generate(model, inputs, do_sample=False), plain)


def test_next_token_logits_match_plain_generate_at_every_step():
    inputs = grouped_prompts()
    model = lora_model()
    plain = generate(model, inputs, do_sample=False, output_logits=True, return_dict_in_generate=True)
    install(model)
    grouped = generate(model, inputs, do_sample=False, output_logits=True, return_dict_in_generate=True)
    for step, (expected, got) in enumerate(zip(plain.logits, grouped.logits, strict=True)):
        assert torch.allclose(got, expected, atol=1e-5), f"logits differ at new token {step}"


def test_sampled_completions_are_drawn_from_the_policys_probabilities():
    """Each sampled token's logits are the policy's logits for that prefix, computed again by a plain forward."""
    inputs = grouped_prompts()
    model = install(lora_model())
    torch.manual_seed(3)
    sampled = generate(model, inputs, do_sample=True, output_logits=True, return_dict_in_generate=True)
    prompt_length = inputs["input_ids"].shape[1]
    mask = torch.cat([inputs["attention_mask"], torch.ones_like(sampled.sequences[:, prompt_length:])], 1)
    with torch.no_grad():
        rescored = model(input_ids=sampled.sequences, attention_mask=mask).logits
    for step, logits in enumerate(sampled.logits):
        assert torch.allclose(logits, rescored[:, prompt_length - 1 + step], atol=1e-4), f"new token {step}"


def test_the_sampler_draws_each_entry_as_often_as_its_probability():
    probs = torch.tensor([[0.5, 0.0, 0.2, 0.3], [0.0, 2.0, 0.0, 6.0]])  # the second row is not normalised
    generator = torch.Generator().manual_seed(0)
    draws = torch.cat([sm.inverse_cdf_sample(probs, generator) for _ in range(20_000)], 1)
    expected = probs / probs.sum(-1, keepdim=True)
    for row in range(2):
        counts = torch.bincount(draws[row], minlength=4).double() / draws.shape[1]
        assert torch.allclose(counts, expected[row].double(), atol=0.015), f"row {row}: {counts.tolist()}"
        assert counts[expected[row] == 0].sum() == 0, "an entry of probability 0 was drawn"


def test_the_two_step_draw_over_many_blocks_draws_each_entry_as_often_as_its_probability():
    """A vocabulary of 3 blocks and a part: empty blocks, a lone entry, entries spread over every block."""
    vocabulary = 2 * sm.SAMPLING_BLOCK + sm.SAMPLING_BLOCK // 2 + 7
    probs = torch.zeros(2, vocabulary)
    probs[0, [3, sm.SAMPLING_BLOCK - 1, 2 * sm.SAMPLING_BLOCK + 5, vocabulary - 1]] = torch.tensor([0.1, 0.2, 0.3, 0.4])
    probs[1] = torch.rand(vocabulary, generator=torch.Generator().manual_seed(1))
    probs[1, sm.SAMPLING_BLOCK : 2 * sm.SAMPLING_BLOCK] = 0.0  # the second block is empty
    generator = torch.Generator().manual_seed(0)
    draws = torch.cat([sm.inverse_cdf_sample(probs, generator) for _ in range(20_000)], 1)
    assert draws.min() >= 0 and draws.max() < vocabulary
    expected = (probs / probs.sum(-1, keepdim=True)).double()
    counts = torch.stack([torch.bincount(row, minlength=vocabulary) for row in draws]).double() / draws.shape[1]
    assert counts[expected == 0].sum() == 0, "an entry of probability 0 was drawn"
    assert torch.allclose(counts[0], expected[0], atol=0.015)
    blocks = -(-vocabulary // sm.SAMPLING_BLOCK)
    padded = torch.nn.functional.pad(counts[1] - expected[1], (0, blocks * sm.SAMPLING_BLOCK - vocabulary))
    assert padded.view(blocks, -1).sum(-1).abs().max() < 0.015, "each block drawn as often as its total"
    by_half = padded.view(-1, sm.SAMPLING_BLOCK // 2).sum(-1)
    assert by_half.abs().max() < 0.015, "within a block, each part drawn as often as its share"


def test_the_sampler_replaces_multinomial_only_for_one_cpu_draw_per_row():
    probs, multinomial = torch.tensor([[0.1, 0.9], [0.7, 0.3]]), torch.multinomial
    with sm.sampling_by_inverse_cdf():
        assert torch.multinomial(probs, 1).shape == (2, 1)
        assert torch.multinomial(probs, 2).shape == (2, 2)  # several draws: torch's own multinomial
        with pytest.raises(RuntimeError, match="probability tensor contains"):
            torch.multinomial(torch.tensor([[0.5, float("nan")]]), 1)  # torch's error, unchanged
        with pytest.raises(RuntimeError):
            torch.multinomial(torch.tensor([[-0.5, 1.0]]), 1)
        with pytest.raises(RuntimeError, match="probability tensor contains"):
            torch.multinomial(torch.tensor([[float("inf"), 1.0]]), 1)
        with pytest.raises(RuntimeError, match="sum of probabilities <= 0"):
            torch.multinomial(torch.tensor([[0.0, 0.0]]), 1)
        with pytest.raises(RuntimeError):
            torch.multinomial(torch.zeros(1, 0), 1)  # an empty vocabulary
        assert torch.multinomial(torch.zeros(0, 3), 1).shape == (0, 1)  # no rows: torch's own answer
    assert torch.multinomial is multinomial, "torch.multinomial is put back on exit"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_trained_weights_and_adapters_are_untouched_after_generation(dtype):
    inputs = grouped_prompts()
    model = install(lora_model(dtype))
    before = copy.deepcopy(model.state_dict())
    with torch.no_grad():
        logits_before = model(**inputs).logits
    generate(model, inputs, do_sample=True)
    after = model.state_dict()
    assert before.keys() == after.keys()
    assert all(torch.equal(before[name], after[name]) for name in before), "weights changed bit for bit"
    with torch.no_grad():
        assert torch.equal(model(**inputs).logits, logits_before), "the adapters are active again"


def test_installing_twice_wraps_once_and_exit_puts_back_the_models_own_generate():
    model = lora_model()
    assert "generate" not in model.__dict__
    with gg.install(model):
        wrapped = model.generate
        with gg.install(model):
            assert model.generate is wrapped
        assert model.generate is wrapped, "the inner install changed nothing, so its exit changes nothing"
    assert "generate" not in model.__dict__ and not getattr(model, gg.INSTALLED_FLAG, False)
    own = model.generate = lambda **kwargs: "own"  # an instance attribute of its own is put back as it was
    with gg.install(model):
        assert model.generate is not own
    assert model.generate is own


def test_the_grouped_attention_is_registered_only_while_generating():
    from transformers import AttentionInterface, AttentionMaskInterface

    registries = (AttentionInterface._global_mapping, AttentionMaskInterface._global_mapping)
    assert all(at.GROUPED_SDPA not in registry for registry in registries)
    with at.grouped_attention_registered():
        assert all(at.GROUPED_SDPA in registry for registry in registries)
    assert all(at.GROUPED_SDPA not in registry for registry in registries)
    AttentionInterface.register(at.GROUPED_SDPA, print)  # an entry there before is put back
    try:
        with at.grouped_attention_registered():
            assert AttentionInterface._global_mapping[at.GROUPED_SDPA] is at.grouped_query_sdpa
        assert AttentionInterface._global_mapping[at.GROUPED_SDPA] is print
    finally:
        AttentionInterface._global_mapping.pop(at.GROUPED_SDPA)


def test_a_model_without_adapters_generates_as_before():
    inputs = grouped_prompts()
    model = build_tiny_random_model(vocab_size=128, hidden_size=32, num_layers=2).eval()
    plain = generate(model, inputs, do_sample=False)
    assert torch.equal(generate(install(model), inputs, do_sample=False), plain)


def small_update_model(dtype: torch.dtype):
    """LoRA as after a few steps: B small, so the adapters move the logits by about 1/200 of a weight's size."""
    model = lora_model(dtype)
    for name, parameter in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(parameter, std=1e-3)
    return model


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_small_adapter_update_reaches_the_sampler(dtype):
    """The sampler follows the policy from the first small update on, as closely as the model's own forward.

    "Exact" is the same weights and adapters computed in fp32. Sampled in bf16, the logits may differ from it by
    bf16 rounding, as the model's own bf16 forward does, but must be much closer to it than the base model is.
    """
    inputs = grouped_prompts()
    model = small_update_model(dtype)
    exact_model = copy.deepcopy(model).float()
    torch.manual_seed(0)
    sampled = generate(install(model), inputs, do_sample=True, output_logits=True, return_dict_in_generate=True)
    prompt_length = inputs["input_ids"].shape[1]
    mask = torch.cat([inputs["attention_mask"], torch.ones_like(sampled.sequences[:, prompt_length:])], 1)

    def rescored(scorer) -> torch.Tensor:
        with torch.no_grad():
            logits = scorer(input_ids=sampled.sequences, attention_mask=mask).logits
        return logits[:, prompt_length - 1 : -1].float()

    exact = rescored(exact_model)
    with model.disable_adapter():
        base_gap = (rescored(model) - exact).abs().mean().item()
    forward_gap = (rescored(model) - exact).abs().mean().item()
    sampler_gap = (torch.stack(sampled.logits, 1).float() - exact).abs().mean().item()
    assert sampler_gap <= 1.25 * forward_gap + 1e-6, f"sampler {sampler_gap:.1e}, model's forward {forward_gap:.1e}"
    assert sampler_gap < 0.75 * base_gap, f"the sampler misses the update: {sampler_gap:.1e} vs base {base_gap:.1e}"


def adapters_of(layers):
    """Each layer's adapters' A and B: what runs beside the base layer while generating."""
    return [m for layer in layers for m in (*layer.lora_A.values(), *layer.lora_B.values())]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_adapters_run_beside_the_base_as_peft_computes_them_and_the_model_is_restored(dtype):
    """fp32 adapters added to the base output: PEFT's own output without autocast (a bf16 base to bf16 rounding)."""
    model = lora_model(dtype)
    layers = ad.lora_layers(model)
    assert layers and all(ad.plain_lora(layer) for layer in layers)
    assert layers[0].lora_A["default"].weight.dtype == torch.float32, "peft keeps the adapters in fp32"
    x = torch.randn(2, 3, layers[0].in_features, generator=torch.Generator().manual_seed(0)).to(dtype)
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    with torch.no_grad():
        expected = [layer(x) for layer in layers[:2]]
        base = layers[0].get_base_layer()(x)
        with ad.adapters_beside_the_base(model) as idle:
            assert idle == adapters_of(layers)
            got = [layer(x) for layer in layers[:2]]
    for g, e in zip(got, expected, strict=True):
        assert g.dtype == dtype and g.shape == e.shape
        assert torch.allclose(g.float(), e.float(), atol=tolerance, rtol=tolerance), (g.float() - e.float()).abs().max()
    assert (got[0].float() - base.float()).abs().max() > 0.1, "the adapters change the output"
    assert all("forward" not in layer.__dict__ for layer in layers)


def test_layers_that_are_not_plain_lora_run_their_adapters_as_usual():
    model = lora_model()
    quantized, dropping, disabled, biased = ad.lora_layers(model)[:4]
    quantized.get_base_layer().weight.data = quantized.get_base_layer().weight.data.to(torch.int8)
    dropping.lora_dropout["default"] = torch.nn.Dropout(0.1).train()
    disabled.enable_adapters(False)
    biased.lora_B["default"].bias = torch.nn.Parameter(torch.ones(biased.out_features))
    assert not any(ad.plain_lora(layer) for layer in (quantized, dropping, disabled, biased))
    with ad.adapters_beside_the_base(model) as idle:
        unchanged = (quantized, dropping, disabled, biased)
        assert not {id(m) for layer in unchanged for m in ad.adapter_modules(layer)} & set(map(id, idle))
        assert all("forward" not in layer.__dict__ for layer in unchanged)


def test_a_layer_keeps_its_base_bias_and_adds_every_active_adapter():
    base = torch.nn.Linear(8, 6).bfloat16()
    wrapper = torch.nn.Sequential(base)
    config = LoraConfig(r=2, target_modules=["0"], lora_dropout=0.0, init_lora_weights=False)
    model = get_peft_model(wrapper, config)
    model.add_adapter("second", LoraConfig(r=3, target_modules=["0"], init_lora_weights=False))
    layer = ad.lora_layers(model)[0]
    layer.set_adapter(["default", "second"])
    x = torch.randn(4, 8).bfloat16()
    with torch.no_grad():
        exact = base(x).float() + sum(
            (x.float() @ layer.lora_A[n].weight.float().t()) @ layer.lora_B[n].weight.float().t() * layer.scaling[n]
            for n in ("default", "second")
        )
        with ad.adapters_beside_the_base(model) as idle:
            assert len(idle) == 4, "two adapters, each with A and B"
            got = layer(x)
    assert torch.allclose(got.float(), exact, atol=5e-2, rtol=2e-2), (got.float() - exact).abs().max()


def test_under_autocast_a_layer_computes_as_peft_does():
    """Under the trainer's autocast the adapters run as PEFT runs them there."""
    model = lora_model()
    layer = ad.lora_layers(model)[0]
    x = torch.randn(3, layer.in_features)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        expected = layer(x)
        with ad.adapters_beside_the_base(model):
            got = layer(x)
    assert torch.equal(got, expected)


def attention_inputs(rows: int, kv_heads: int, groups: int, tokens: int, queries: int = 1):
    generator = torch.Generator().manual_seed(rows + tokens)
    query = torch.randn(rows, kv_heads * groups, queries, 8, generator=generator)
    key = torch.randn(rows, kv_heads, tokens + 4, 8, generator=generator)[:, :, :tokens]  # a view, as in the cache
    value = torch.randn(rows, kv_heads, tokens + 4, 8, generator=generator)[:, :, :tokens]
    return query, key, value


class Attention(torch.nn.Module):
    def __init__(self, groups: int) -> None:
        super().__init__()
        self.num_key_value_groups, self.is_causal = groups, True


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("groups", [1, 3])
def test_grouped_query_attention_equals_transformers_sdpa_for_one_new_token(masked, groups):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    query, key, value = attention_inputs(rows=4, kv_heads=2, groups=groups, tokens=7)
    mask = None
    if masked:  # the first row's first two positions are padding
        mask = torch.ones(4, 1, 1, 7, dtype=torch.bool)
        mask[0, ..., :2] = False
    expected, _ = sdpa_attention_forward(Attention(groups), query, key, value, mask, scaling=0.3)
    got, weights = at.grouped_query_sdpa(Attention(groups), query, key, value, mask, scaling=0.3)
    assert weights is None and got.shape == expected.shape == (4, 1, 2 * groups, 8)
    assert torch.allclose(got, expected, atol=1e-6)


def test_grouped_query_attention_leaves_a_prompt_to_transformers(monkeypatch):
    """Several query tokens (the prompt) go to transformers' own sdpa attention, unchanged."""
    query, key, value = attention_inputs(rows=2, kv_heads=2, groups=3, tokens=5, queries=5)
    calls = []
    monkeypatch.setattr(at, "sdpa_attention_forward", lambda *args, **kwargs: calls.append(args) or ("theirs", None))
    assert at.grouped_query_sdpa(Attention(3), query, key, value, None, scaling=0.3) == ("theirs", None)
    assert len(calls) == 1


def test_generate_attends_grouped_and_the_model_is_put_back_to_sdpa(monkeypatch):
    model = install(lora_model())
    base = model.get_base_model()
    assert base.config._attn_implementation == "sdpa"
    seen = []
    real = at.grouped_query_sdpa
    monkeypatch.setattr(at, "grouped_query_sdpa", lambda *a, **k: seen.append(a[1].shape[2]) or real(*a, **k))
    generate(model, grouped_prompts(), do_sample=False)
    assert at.GROUPED_SDPA not in at.AttentionInterface._global_mapping, "registered only while generating"
    assert 1 in seen, "one new token at a time went through the grouped attention"
    assert base.config._attn_implementation == "sdpa"


def test_a_model_on_another_attention_is_left_on_it():
    model = build_tiny_random_model(vocab_size=128, hidden_size=32, num_layers=2).eval()
    model.set_attn_implementation("eager")
    with at.grouped_query_decoding(model):
        assert model.config._attn_implementation == "eager"
    assert model.config._attn_implementation == "eager"


def packing_kernel(dtype: torch.dtype) -> str:
    """oneDNN's packed kernel, or plain ``F.linear`` for bf16 where this CPU has no packed bf16 kernel (AVX2)."""
    try:
        torch.ops.mkldnn._reorder_linear_weight(torch.zeros(4, 4, dtype=dtype), 2)
    except RuntimeError:
        return "linear"
    return "mkldnn"


def every_layer_packed(monkeypatch, kernel_for=packing_kernel):
    """Every layer and stack computes through ``kernel_for(dtype)`` (oneDNN's packed kernel where this CPU has it),
    whatever this machine measures fastest."""

    def each_layer(layers, rows):
        return {(tuple(layer.weight.shape), layer.weight.dtype): kernel_for(layer.weight.dtype) for layer in layers}

    monkeypatch.setattr(pl, "fastest_kernels", each_layer)
    monkeypatch.setattr(ld, "stacked_kernels", lambda groups, rows: [kernel_for(g[0].weight.dtype) for g in groups])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_training_run_keeps_the_frozen_packs_and_drops_them_at_its_end(dtype, monkeypatch):
    every_layer_packed(monkeypatch)
    model = lora_model(dtype)
    run = contextlib.ExitStack()  # what cpu_speed.enabled holds open while a trainer trains
    run.enter_context(gg.install(model))
    kept = run.enter_context(gg.keeping_frozen_packs(model))
    inputs = grouped_prompts()
    first = generate(model, inputs, do_sample=False)
    groups = [group for layer in ld.decoder_layers_of(model) for group in ld.stacked_groups(layer).values()]
    merged = [group for group in groups if dtype == torch.float32 and any(ad.lora_layers(m) for m in group)]
    assert len(merged) == (4 if dtype == torch.float32 else 0), "fp32: q/k/v and gate/up have adapters to merge"
    fresh = {id(ad.base_layer(m)) for group in merged for m in group}  # packed again at each call, adapters merged in
    in_groups = {id(ad.base_layer(m)) for group in groups for m in group}
    head_packed = packing_kernel(dtype) != "linear"  # F.linear needs no pack, so none is kept for the output head
    frozen = [
        layer
        for layer in pl.packable_layers(model)
        if not layer.weight.requires_grad and id(layer) not in fresh and (id(layer) in in_groups or head_packed)
    ]
    stacked_members = [member for members, *_ in kept._stacks.values() for member in members]
    covered = [layer for layer, *_ in kept._kept.values()] + stacked_members
    assert sorted(map(id, covered)) == sorted(map(id, frozen)), "every other frozen layer's pack is kept"
    assert len(kept) == len(groups) - len(merged) + head_packed, "one pack per group of each layer, and the head's"
    products, stacked = dict(kept._kept), dict(kept._stacks)
    assert torch.equal(generate(model, inputs, do_sample=False), first)
    assert all(kept._kept[key][3] is products[key][3] for key in products), "the second call packs nothing again"
    assert all(kept._stacks[key][3] is stacked[key][3] for key in stacked) and stacked
    run.close()
    assert len(kept) == 0 and getattr(model, gg.KEPT_PACKS) is None


def test_a_changed_adapter_reaches_generation_while_the_base_packs_are_kept(monkeypatch):
    every_layer_packed(monkeypatch)
    inputs = grouped_prompts()
    model = install(lora_model())
    with gg.keeping_frozen_packs(model):
        before = generate(model, inputs, do_sample=False, output_logits=True, return_dict_in_generate=True)
        with torch.no_grad():
            for name, parameter in model.named_parameters():
                if "lora_B" in name:
                    parameter.mul_(-1.0)  # what an optimizer step does: the adapters change, the base does not
        after = generate(model, inputs, do_sample=False, output_logits=True, return_dict_in_generate=True)
    with torch.no_grad():
        expected = model(**inputs).logits[:, -1]
    assert not torch.allclose(before.logits[0], after.logits[0])
    assert torch.allclose(after.logits[0], expected, atol=1e-4)


def random_states(tokens: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(2, 3, tokens, 4, generator=generator), torch.randn(2, 3, tokens, 4, generator=generator)


def test_a_preallocated_layer_holds_what_a_dynamic_layer_holds_past_its_room():
    dynamic = DynamicLayer()
    dynamic.update(*random_states(5, seed=0))
    roomy = pc.PreallocatedLayer(dynamic.keys.clone(), dynamic.values.clone(), room=2)
    for step in range(1, 6):  # the third new token overflows the room: the buffers double
        new = random_states(1, seed=step)
        expected, got = dynamic.update(*new), roomy.update(*new)
        assert all(torch.equal(a, b) for a, b in zip(expected, got, strict=True)), f"step {step}"
    assert roomy.get_seq_length() == 10 and roomy._key_buffer.shape[-2] >= 10


def test_a_preallocated_layer_concatenates_states_of_another_dtype_as_a_dynamic_layer_does():
    keys, values = random_states(4, seed=0)
    roomy, dynamic = pc.PreallocatedLayer(keys.bfloat16(), values.bfloat16(), room=8), DynamicLayer()
    dynamic.update(keys.bfloat16(), values.bfloat16())
    new = random_states(1, seed=5)
    expected, got = dynamic.update(*new), roomy.update(*new)
    assert got[0].dtype == expected[0].dtype == torch.float32
    assert all(torch.equal(a, b) for a, b in zip(expected, got, strict=True))


def test_a_preallocated_layer_holds_what_a_dynamic_layer_holds_after_a_crop_or_a_batch_selection():
    keys, values = random_states(4, seed=0)
    for change in (lambda layer: layer.crop(-1), lambda layer: layer.batch_select_indices(torch.tensor([1]))):
        roomy, dynamic = pc.PreallocatedLayer(keys, values, room=8), DynamicLayer()
        dynamic.update(keys, values)
        change(roomy), change(dynamic)
        new = random_states(1, seed=5)
        new = tuple(state[: dynamic.keys.shape[0]] for state in new)
        assert all(torch.equal(a, b) for a, b in zip(dynamic.update(*new), roomy.update(*new), strict=True))


def test_the_shared_cache_gets_room_for_the_new_token_budget():
    inputs = grouped_prompts()
    model = lora_model()
    with torch.no_grad():
        cache = pc.with_room(pc.shared_prompt_cache(model, inputs["input_ids"], inputs["attention_mask"]), 9)
    assert all(type(layer) is pc.PreallocatedLayer for layer in cache.layers)
    assert cache.layers[0]._key_buffer.shape[-2] == inputs["input_ids"].shape[1] - 1 + 9
    assert pc.new_token_budget(model, {"max_new_tokens": 7}) == 7
    assert pc.new_token_budget(model, {"generation_config": GenerationConfig(max_new_tokens=5)}) == 5


def test_the_prompt_is_read_as_generate_reads_it_when_the_trainer_wraps_forward_in_autocast():
    """accelerate wraps the trained model's ``forward`` in bf16 autocast; ``generate`` runs the inner model."""
    inputs = grouped_prompts()
    model = lora_model()
    model.forward = MethodType(torch.autocast("cpu", dtype=torch.bfloat16)(type(model).forward), model)
    settings = {"do_sample": False, "output_logits": True, "return_dict_in_generate": True}
    plain = generate(model, inputs, **settings)
    grouped = generate(install(model), inputs, **settings)
    for step, (expected, got) in enumerate(zip(plain.logits, grouped.logits, strict=True)):
        assert torch.allclose(got, expected, atol=1e-5), f"logits differ at new token {step}"


def test_completions_come_back_as_normal_tensors_the_trainer_can_train_through():
    """Sampled in inference mode, the token ids are returned as normal tensors: an embedding saves them for backward."""
    inputs = grouped_prompts()
    model = install(lora_model())
    completions = generate(model, inputs, do_sample=True)
    assert not completions.is_inference()
    loss = model(input_ids=completions, attention_mask=torch.ones_like(completions)).logits.float().mean()
    loss.backward()
    assert any(p.grad is not None for p in model.parameters() if p.requires_grad)
    returned = generate(model, inputs, do_sample=False, output_logits=True, return_dict_in_generate=True)
    assert not returned.sequences.is_inference() and not any(step.is_inference() for step in returned.logits)


def test_normal_tensors_clones_inference_tensors_wherever_they_sit_and_leaves_the_rest():
    normal = torch.ones(2)
    with torch.inference_mode():
        made = torch.arange(3)
    output = gg.normal_tensors({"sequences": made, "logits": (made, [made]), "normal": normal, "name": "kept"})
    assert not output["sequences"].is_inference() and torch.equal(output["sequences"], made)
    assert not output["logits"][0].is_inference() and not output["logits"][1][0].is_inference()
    assert isinstance(output["logits"], tuple) and isinstance(output["logits"][1], list)
    assert output["normal"] is normal and output["name"] == "kept"
    assert not gg.normal_tensors(made).is_inference() and gg.normal_tensors(None) is None


def decode_calls(monkeypatch) -> list[int]:
    """The token count of every call to a decoder layer's own forward from now on."""
    from transformers.models.qwen2.modeling_qwen2 import Qwen2DecoderLayer

    calls, forward = [], Qwen2DecoderLayer.forward

    def counted(self, hidden_states, *args, **kwargs):
        calls.append(hidden_states.shape[1])
        return forward(self, hidden_states, *args, **kwargs)

    monkeypatch.setattr(Qwen2DecoderLayer, "forward", counted)
    return calls


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_lean_layers_give_the_layers_own_logits(dtype, monkeypatch):
    every_layer_packed(monkeypatch)
    inputs = grouped_prompts()
    model = install(lora_model(dtype))
    calls = decode_calls(monkeypatch)
    lean = generate(model, inputs, do_sample=False, output_logits=True, return_dict_in_generate=True)
    assert calls == [], "the shared prompt and every new token run through the lean layers"
    monkeypatch.setattr(gg, "lean_layers", lambda *args, **kwargs: contextlib.nullcontext(ld.LeanLayers([], {})))
    own = generate(model, inputs, do_sample=False, output_logits=True, return_dict_in_generate=True)
    assert 1 in calls and calls[0] > 1, "without lean layers the layers' own forward reads the prompt and decodes"
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    for step, (expected, got) in enumerate(zip(own.logits, lean.logits, strict=True)):
        assert torch.allclose(got.float(), expected.float(), atol=tolerance), f"logits differ at new token {step}"


def test_lean_layers_leave_other_calls_and_layers_to_their_own_forward(monkeypatch):
    every_layer_packed(monkeypatch)
    model = lora_model()
    layers = ld.decoder_layers_of(model)
    sentinel = layers[0].forward
    layers[0].forward = sentinel  # a forward of its own (the training pass's), given back on exit
    dora = get_peft_model(
        build_tiny_random_model(vocab_size=128, hidden_size=32, num_layers=1),
        LoraConfig(r=4, target_modules=["q_proj"], use_dora=True),
    )
    assert ld.stacked_groups(ld.decoder_layers_of(dora)[0]) is None, "DoRA: not plain LoRA"
    assert ld.stacked_groups(torch.nn.Linear(2, 2)) is None, "not a decoder layer"
    assert ld.decoder_layers_of(torch.nn.Linear(2, 2)) == []
    with torch.no_grad(), gg.lean_layers(model, rows=2) as lean:
        assert len(lean.stood_for) == 7 * len(layers), "q, k, v, o, gate, up and down of every layer"
        intermediate = layers[0].mlp.down_proj.in_features
        assert {shape for shape, _ in lean.kernels} == {(64, 32), (32, 32), (2 * intermediate, 32), (32, intermediate)}
        assert all("forward" in layer.__dict__ for layer in layers) and layers[0].forward is not sentinel
        calls = decode_calls(monkeypatch)
        ids = torch.tensor([[5, 17, 23], [5, 17, 23]])
        model(input_ids=ids, use_cache=True)  # a prompt of three tokens: lean
        model(input_ids=torch.tensor([[5], [17], [23]]), use_cache=True)  # 3 rows, not the 2 packed for: lean
        assert calls == []
        model(input_ids=ids, use_cache=False)  # no cache to write to
        with torch.autocast("cpu", dtype=torch.bfloat16):
            model(input_ids=ids[:, :1], use_cache=True)  # one token, under the trainer's autocast
        handle = layers[1].self_attn.register_forward_hook(lambda *args: None)  # as output_attentions hooks it
        model(input_ids=ids[:, :1], use_cache=True)
        handle.remove()
    assert calls == [3, 3, 1, 1, 1], "the other calls ran both layers' own forward, the last one layer 1's"
    assert layers[0].__dict__["forward"] is sentinel and "forward" not in layers[1].__dict__


@pytest.mark.parametrize("kernel", pl.ROWS_ONLY_WHEN_STACKED)
def test_a_stacked_product_of_a_rows_only_kernel_runs_only_the_rows_it_is_packed_for(kernel, monkeypatch):
    if pl._seconds_for_one_pass(kernel, [torch.nn.Linear(32, 32)], rows=2) is None:
        pytest.skip(f"{kernel} is not built into this torch")
    every_layer_packed(monkeypatch, kernel_for=lambda dtype: kernel)
    model = lora_model()
    calls = decode_calls(monkeypatch)
    ids = torch.tensor([[5, 17, 23], [5, 17, 23]])
    with torch.no_grad(), gg.lean_layers(model, rows=2):
        own_prompt = model(input_ids=ids, use_cache=True)  # three tokens per row: the layers' own forward
        assert calls == [3, 3]
        step = model(input_ids=ids[:, 2:], past_key_values=copy.deepcopy(own_prompt.past_key_values), use_cache=True)
        assert calls == [3, 3], "one new token for each of the 2 rows packed for: lean"
        model(input_ids=torch.tensor([[5], [17], [23]]), use_cache=True)  # 3 rows: the stand-in weight cannot
    assert calls == [3, 3, 1, 1]
    with torch.no_grad():
        reference = model(input_ids=torch.tensor([[5, 17, 23, 23], [5, 17, 23, 23]])).logits[:, -1]
    assert torch.allclose(step.logits[:, -1], reference, atol=1e-4)


def test_a_stacked_linear_holds_its_layers_weights_and_biases_by_rows():
    with_bias, without = torch.nn.Linear(4, 3), torch.nn.Linear(4, 2, bias=False)
    stacked = pl.StackedLinear([with_bias, without])
    x = torch.randn(5, 4)
    assert stacked.sizes == [3, 2] and stacked.in_features == 4
    first, second = torch.nn.functional.linear(x, stacked.weight, stacked.bias).split(stacked.sizes, dim=1)
    assert torch.allclose(first, with_bias(x)) and torch.allclose(second, without(x))
    assert pl.StackedLinear([without, without]).bias is None
    with pytest.raises(ValueError, match="one input size"):
        pl.StackedLinear([with_bias, torch.nn.Linear(5, 2)])
    with pytest.raises(ValueError, match="one or more"):
        pl.StackedLinear([])


@pytest.mark.parametrize("kernel", pl.KERNELS)
def test_a_stacked_product_equals_its_layers_products_for_the_rows_it_is_packed_for(kernel):
    layers = [torch.nn.Linear(16, 12), torch.nn.Linear(16, 8, bias=False)]
    x = torch.randn(4, 16)
    try:
        product = pl.pack_stacked(kernel, pl.StackedLinear(layers), rows=4)
        first, second = product(x).split([12, 8], dim=1)
    except (RuntimeError, AttributeError, NotImplementedError):
        pytest.skip(f"{kernel} is not built into this torch")
    with torch.no_grad():
        assert torch.allclose(first, layers[0](x), atol=1e-5) and torch.allclose(second, layers[1](x), atol=1e-5)


def test_kept_stacked_products_are_reused_until_a_layers_weight_changes():
    layers = [torch.nn.Linear(4, 3).requires_grad_(False), torch.nn.Linear(4, 2).requires_grad_(False)]
    kept = pl.KeptPacks()
    product = kept.stacked_product("linear", layers, rows=2)
    assert kept.stacked_product("linear", layers, rows=2) is product, "the same unchanged weights: the same pack"
    assert kept.stacked_product("linear", layers, rows=3) is not product, "packed for another row count"
    with torch.no_grad():
        layers[1].weight.mul_(2.0)  # an in-place write moves the version counter
    changed = kept.stacked_product("linear", layers, rows=3)
    x = torch.randn(3, 4)
    with torch.no_grad():
        assert torch.allclose(changed(x)[:, 3:], layers[1](x)), "packed from the new values"
    layers[0].weight = torch.nn.Parameter(torch.zeros(3, 4), requires_grad=False)
    assert kept.stacked_product("linear", layers, rows=3) is not changed, "another tensor"
    assert len(kept) == 1
    kept.clear()
    assert len(kept) == 0


def test_stacked_kernels_measure_each_stacked_shape_once(monkeypatch, tmp_path):
    monkeypatch.setattr(pl, "_MEASURED", {})
    monkeypatch.setattr(pl, "kernel_cache_path", lambda: tmp_path / "kernels.json")
    groups = [[torch.nn.Linear(16, 12), torch.nn.Linear(16, 4)] for _ in range(3)] + [[torch.nn.Linear(16, 8)]]
    kernels = pl.stacked_kernels(groups, rows=4)
    assert len(kernels) == 4 and set(kernels) <= set(pl.KERNELS) and len(set(kernels[:3])) == 1
    assert {key[0] for key in pl._MEASURED} == {(16, 16), (8, 16)}, "one entry per stacked shape"

    def no_copies(layers):
        raise AssertionError("a shape measured already needs no stacked copy")

    monkeypatch.setattr(pl, "StackedLinear", no_copies)
    assert pl.stacked_kernels(groups, rows=4) == kernels


@pytest.mark.parametrize("kernel", pl.ROWS_ONLY_WHEN_STACKED)
def test_a_rows_only_stacked_product_refuses_other_row_counts(kernel):
    stacked = pl.StackedLinear([torch.nn.Linear(16, 12), torch.nn.Linear(16, 4)])
    try:
        product = pl.pack_stacked(kernel, stacked, rows=4)
    except (RuntimeError, AttributeError, NotImplementedError):
        pytest.skip(f"{kernel} is not built into this torch")
    assert product(torch.randn(4, 16)).shape == (4, 16)
    with pytest.raises(ValueError, match="packed for 4 rows, got 3"):
        product(torch.randn(3, 16))
