"""benchmarks/bench_sampling_precision.py: int8 copies, the drift of a copy's sampling, and the products' timing."""

from __future__ import annotations

import copy

import pytest
import torch


@pytest.fixture(scope="module")
def bench(load_benchmark):
    return load_benchmark("bench_sampling_precision")


@pytest.fixture(scope="module")
def model(offline_model_and_tokenizer):
    return offline_model_and_tokenizer[0]  # fp32, as the ci profile loads it


@pytest.fixture(scope="module")
def sequences(bench, model, offline_model_and_tokenizer):
    prompt = [{"role": "user", "content": "What is 7 times 6?"}]
    torch.manual_seed(0)
    return bench.sampled_sequences(model, offline_model_and_tokenizer[1], prompt, rows=2, new_tokens=6, temperature=1.0)


def test_sampled_sequences_are_the_prompt_then_exactly_the_new_tokens(sequences) -> None:
    ids, prompt_tokens = sequences
    assert ids.shape == (2, prompt_tokens + 6)


def test_a_quantized_copy_leaves_the_model_and_its_tied_head_as_they_were(bench, model) -> None:
    head_before = model.lm_head.weight.detach().clone()
    quantized = bench.quantized_copy(model, bench.linear_layer_names(model, head_only=True))
    assert type(quantized.lm_head).__name__ == "Linear" and "quantized" in type(quantized.lm_head).__module__
    assert type(model.lm_head) is torch.nn.Linear and torch.equal(model.lm_head.weight, head_before)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert type(quantized.model.layers[0].mlp.down_proj) is torch.nn.Linear  # only the named layers change


def test_a_quantized_copy_refuses_names_that_are_not_linear_layers(bench, model) -> None:
    with pytest.raises(ValueError, match=r"model\.norm"):
        bench.quantized_copy(model, ["lm_head", "model.norm"])
    with pytest.raises(ValueError, match="names of the model's linear layers"):
        bench.quantized_copy(model, [])


def test_linear_layer_names_lists_every_linear_layer_or_the_head(bench, model) -> None:
    names = bench.linear_layer_names(model)
    assert len(names) == 7 * len(model.model.layers) + 1 and "lm_head" in names
    assert bench.linear_layer_names(model, head_only=True) == ["lm_head"]


def test_next_token_logps_are_a_distribution_at_each_completion_position(bench, model, sequences) -> None:
    ids, prompt_tokens = sequences
    logps = bench.next_token_logps(model, ids, prompt_tokens)
    assert logps.shape == (2, 6, model.config.vocab_size) and logps.dtype == torch.float32
    assert torch.allclose(logps.exp().sum(-1), torch.ones(2, 6), atol=1e-4)


def test_drift_is_zero_against_the_model_itself_and_grows_with_coarser_weights(bench, model, sequences) -> None:
    ids, prompt_tokens = sequences
    expected = bench.next_token_logps(model, ids, prompt_tokens)
    kl_self, shift_self = bench.drift(expected, model, ids, prompt_tokens)
    assert kl_self.shape == shift_self.shape == (2 * 6,)
    assert kl_self.abs().max() < 1e-5 and shift_self.max() < 1e-5
    kl_bf16, _ = bench.drift(expected, copy.deepcopy(model).to(torch.bfloat16), ids, prompt_tokens)
    int8_head = bench.quantized_copy(model, ["lm_head"])
    kl_int8, shift_int8 = bench.drift(expected, int8_head, ids, prompt_tokens)
    assert 0 < kl_bf16.mean() < kl_int8.mean() and shift_int8.mean() > 0


@pytest.mark.parametrize("prompt_tokens", [0, 100])
def test_next_token_logps_refuse_sequences_without_completion_tokens(bench, model, prompt_tokens) -> None:
    with pytest.raises(ValueError, match="completion tokens"):
        bench.next_token_logps(model, torch.ones(2, 100, dtype=torch.long), prompt_tokens)


def test_next_token_logps_refuse_a_flat_tensor(bench, model) -> None:
    with pytest.raises(ValueError, match="rows, tokens"):
        bench.next_token_logps(model, torch.ones(100, dtype=torch.long), 10)


def test_int8_layers_change_only_the_named_layers(bench) -> None:
    layers = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8))
    bench.int8_layers(layers, ["1"])
    assert type(layers[0]) is torch.nn.Linear and "quantized" in type(layers[1]).__module__


def test_decode_products_time_every_linear_layer_in_both_formats(bench) -> None:
    layers = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.Linear(256, 64))
    times = bench.decode_products(layers, rows=8)
    assert set(times) == {"fp32_packed", "int8"} and all(ms > 0 for ms in times.values())


def test_products_ms_calls_each_product_once_a_pass_on_its_own_width(bench) -> None:
    widths = []
    products = [(lambda x: widths.append(x.shape), 3), (lambda x: widths.append(x.shape), 5)]
    ms = bench.products_ms(products, width={3: torch.zeros(2, 3), 5: torch.zeros(2, 5)})
    assert ms >= 0 and widths == [(2, 3), (2, 5)] * (bench.PASSES + 1)
