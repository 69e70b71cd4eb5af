"""Scoring the completion tokens only: TRL's own compact path, the same log-probabilities and gradients on a CPU."""

from __future__ import annotations

import contextlib

import pytest
import torch
import trl.trainer.utils as trl_utils
from trl.trainer.utils import add_fused_lm_head

from course_utils.cpu_speed import completion_scoring as cs
from course_utils.cpu_speed.group_generation import install
from course_utils.lesson.models import build_tiny_random_model


def scored(compact: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """TRL's fused log-probs, loss and one weight's gradient for a batch whose first 5 positions are the prompt."""
    model = build_tiny_random_model(vocab_size=128, hidden_size=32, num_layers=2, seed=1)
    add_fused_lm_head(model, outputs=("log_probs", "entropy"))
    ids = torch.randint(1, 128, (3, 12), generator=torch.Generator().manual_seed(0))
    labels = ids.clone()
    labels[:, :5] = -100  # the prompt: masked out of the loss
    labels[2, 9:] = -100  # a completion that ended early
    if compact:
        with cs.completion_tokens_only():
            output = model(input_ids=ids, labels=labels, fused_lm_head=True)
    else:
        output = model(input_ids=ids, labels=labels, fused_lm_head=True)
    output.loss.backward()
    gradient = model.get_output_embeddings().weight.grad
    return output.log_probs.detach(), output.loss.detach(), gradient


def test_completion_tokens_get_the_same_log_probs_loss_and_gradients(monkeypatch):
    rows_scored = []
    apply = trl_utils._ChunkedLogProbFunction.apply

    def spy(hidden, *args):  # records how many positions TRL sends to its log-softmax, then runs it
        rows_scored.append(hidden.shape[0])
        return apply(hidden, *args)

    monkeypatch.setattr(trl_utils._ChunkedLogProbFunction, "apply", spy)
    every_position, compact = scored(compact=False), scored(compact=True)
    assert rows_scored == [3 * 11, 2 * 7 + 4], "every shifted position, then the completion tokens only"
    for name, full, only in zip(("log-probs", "loss", "gradient"), every_position, compact, strict=True):
        assert torch.allclose(full, only, atol=1e-6), f"{name} differ"
    assert (compact[0][:, :4] == 0).all(), "the prompt's positions are zero, as before"


def test_the_rule_is_compact_on_a_cpu_only_inside_and_restored_after():
    original = getattr(trl_utils, cs.TRL_COMPACT_RULE)
    assert not original(torch.device("cpu"))
    with cs.completion_tokens_only():
        assert getattr(trl_utils, cs.TRL_COMPACT_RULE)(torch.device("cpu"))
    assert getattr(trl_utils, cs.TRL_COMPACT_RULE) is original


def test_a_trl_without_the_rule_gets_a_clear_error(monkeypatch):
    monkeypatch.delattr(trl_utils, cs.TRL_COMPACT_RULE)
    assert not cs.trl_has_compact_rule()
    with pytest.raises(RuntimeError, match="COURSE_CPU_SPEEDUPS=0"), cs.completion_tokens_only():
        pass


def test_common_prefix_length_stops_at_the_first_token_or_mask_that_differs():
    ids = torch.tensor([[5, 6, 7, 8], [5, 6, 7, 9], [5, 6, 7, 8]])
    assert cs.common_prefix_length(ids, torch.ones_like(ids)) == 3
    assert cs.common_prefix_length(ids[[0, 2]], torch.ones_like(ids[[0, 2]])) == 4, "equal rows share everything"
    mask = torch.ones_like(ids)
    mask[1, 1] = 0
    assert cs.common_prefix_length(ids, mask) == 1, "a masked token differs from a read one"
    assert cs.common_prefix_length(torch.tensor([[1, 2], [3, 2]]), torch.ones(2, 2)) == 0


@pytest.mark.parametrize("shapes", [((4,), (4,)), ((2, 3), (2, 4))])
def test_common_prefix_length_rejects_tensors_that_are_not_one_rows_by_tokens_shape(shapes):
    with pytest.raises(ValueError, match="rows, tokens"):
        cs.common_prefix_length(torch.zeros(shapes[0], dtype=torch.long), torch.ones(shapes[1]))


def lora_model(seed: int = 1) -> torch.nn.Module:
    """A tiny random Llama with TRL's fused head and non-zero LoRA adapters, as the trainer scores with."""
    from peft import LoraConfig, get_peft_model

    model = build_tiny_random_model(vocab_size=128, hidden_size=32, num_layers=2, seed=seed)
    add_fused_lm_head(model)
    config = LoraConfig(r=4, target_modules=["q_proj", "v_proj", "down_proj"], init_lora_weights=False)
    torch.manual_seed(seed)
    return get_peft_model(model, config)


def group_batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """4 completions of one left-padded 6-token prompt, one of them ended early (right padding)."""
    generator = torch.Generator().manual_seed(0)
    prompt = torch.randint(1, 128, (1, 6), generator=generator)
    ids = torch.cat([prompt.expand(4, -1), torch.randint(1, 128, (4, 7), generator=generator)], dim=1)
    mask = torch.ones_like(ids)
    mask[:, :2] = 0
    mask[1, 10:] = 0
    labels = ids.masked_fill(mask == 0, -100)
    labels[:, :6] = -100
    return ids, mask, labels


def scored_group(
    read_once: bool, monkeypatch, attention: str = "sdpa", dtype: torch.dtype = torch.float32, batch=None
) -> tuple[torch.Tensor, list[torch.Tensor], list[tuple[int, int]]]:
    """Log-probs and LoRA gradients of ``batch`` (:func:`group_batch`), and the (rows, tokens) of each backbone call."""
    model, (ids, mask, labels) = lora_model().to(dtype), batch or group_batch()
    model.set_attn_implementation(attention)
    calls, backbone_type = [], type(cs.decoder_backbone(model))
    forward = backbone_type.forward

    def recorded(self, *args, **kwargs):
        calls.append(tuple(kwargs["input_ids"].shape))
        return forward(self, *args, **kwargs)

    monkeypatch.setattr(backbone_type, "forward", recorded)
    with cs.prefix_read_once(model) if read_once else contextlib.nullcontext():
        output = model(input_ids=ids, attention_mask=mask, labels=labels, fused_lm_head=True)
    monkeypatch.undo()
    output.loss.backward()
    gradients = [p.grad.float() for p in model.parameters() if p.requires_grad]
    return output.log_probs.detach().float(), gradients, calls


@pytest.mark.parametrize(
    ("attention", "rest"),
    [
        # 3 rows score 6 tokens after the prompt (the 7th, their last, scores none) and the early one 3: packed
        ("sdpa", (1, 6 + 3 + 6 + 6)),
        ("eager", (4, 7)),  # an attention that is not given the packed mask: each row's 7 other tokens, padded
    ],
)
def test_reading_the_shared_prefix_once_gives_the_same_log_probs_and_gradients(attention, rest, monkeypatch):
    every_row, every_gradient, every_call = scored_group(False, monkeypatch, attention)
    once, gradients, calls = scored_group(True, monkeypatch, attention)
    assert every_call == [(4, 13)]
    assert calls == [(1, 6), rest], "the 6 prompt tokens once, then the rows' other tokens"
    assert torch.allclose(once, every_row, atol=1e-6), (once - every_row).abs().max()
    assert len(gradients) == len(every_gradient) > 0
    for shared, plain in zip(gradients, every_gradient, strict=True):
        assert torch.allclose(shared, plain, atol=1e-6), (shared - plain).abs().max()


def largest_difference(mine: list[torch.Tensor], reference: list[torch.Tensor]) -> float:
    """The largest difference between two lists of tensors, relative to each reference tensor's largest entry."""
    return max(float((a - b).abs().max() / b.abs().max()) for a, b in zip(mine, reference, strict=True))


def test_packed_rows_in_bf16_are_as_close_to_fp32_as_the_padded_rows(monkeypatch):
    exact, exact_gradients, _ = scored_group(False, monkeypatch)
    padded, padded_gradients, _ = scored_group(False, monkeypatch, dtype=torch.bfloat16)
    packed, packed_gradients, calls = scored_group(True, monkeypatch, dtype=torch.bfloat16)
    assert calls[1] == (1, 21), "the bf16 rows ran packed"
    padded_error = largest_difference([padded, *padded_gradients], [exact, *exact_gradients])
    packed_error = largest_difference([packed, *packed_gradients], [exact, *exact_gradients])
    assert packed_error <= 2 * padded_error + 1e-3, (packed_error, padded_error)


def test_rows_equal_to_the_end_score_every_token_from_the_prefix(monkeypatch):
    ids, mask, labels = group_batch()
    ids, mask, labels = ids[:1].expand(4, -1), mask[:1].expand(4, -1), labels[:1].expand(4, -1)
    plain, plain_gradients, _ = scored_group(False, monkeypatch, batch=(ids, mask, labels))
    once, gradients, calls = scored_group(True, monkeypatch, batch=(ids, mask, labels))
    assert calls == [(1, 12), (4, 1)], "no position after the prefix scores a token: the last one runs padded"
    assert torch.allclose(once, plain, atol=1e-6)
    for shared, every in zip(gradients, plain_gradients, strict=True):
        assert torch.allclose(shared, every, atol=1e-6), (shared - every).abs().max()


def test_scoring_positions_are_the_tokens_followed_by_a_real_one_row_by_row():
    mask = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1], [1, 1, 0, 0, 0]])
    rows, columns = cs.scoring_positions(mask, 2)
    assert rows.tolist() == [0, 1, 1] and columns.tolist() == [2, 2, 3]


def test_the_packed_mask_sees_the_real_prefix_and_its_own_row_up_to_itself():
    rows, columns = torch.tensor([0, 0, 1]), torch.tensor([2, 3, 2])
    mask = cs.packed_rows_mask(torch.tensor([0, 1]), rows, columns)
    assert mask.shape == (1, 1, 3, 5)
    expected = [[False, True, True, False, False], [False, True, True, True, False], [False, True, False, False, True]]
    assert mask[0, 0].tolist() == expected


def test_calls_that_are_not_a_training_pass_over_a_shared_prefix_run_as_usual():
    ids, mask, _ = group_batch()
    seen = []

    def forward(**kwargs):
        seen.append(kwargs)
        return "plain"

    assert cs.shared_prefix_forward(forward, input_ids=ids, attention_mask=mask) == "plain", "generation's calls"
    assert cs.shared_prefix_forward(forward, input_ids=ids[:1], attention_mask=mask[:1], use_cache=False) == "plain"
    distinct = ids.clone()
    distinct[1, 0] = 99
    assert cs.shared_prefix_forward(forward, input_ids=distinct, attention_mask=mask, use_cache=False) == "plain"
    positions = torch.arange(13).expand(4, -1)
    assert (
        cs.shared_prefix_forward(forward, input_ids=ids, attention_mask=mask, use_cache=False, position_ids=positions)
        == "plain"
    )
    assert len(seen) == 4 and seen[-1]["position_ids"] is positions, "arguments are passed on untouched"


def test_prefix_read_once_is_undone_on_exit_and_needs_a_causal_lm():
    model = lora_model()
    backbone = cs.decoder_backbone(model)
    with cs.prefix_read_once(model):
        assert "forward" in backbone.__dict__
    assert "forward" not in backbone.__dict__
    with pytest.raises(ValueError, match="leave the part score_shared_prefix_once out"):
        cs.decoder_backbone(torch.nn.Linear(2, 2))


_KEPT_OPEN: list = []


def installed(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` sampling through group generation (left so: the model is the test's own)."""
    context = install(model)
    context.__enter__()
    _KEPT_OPEN.append(context)  # a collected context would close, and put the model's generate back
    return model


def top_lora_model(layers: int = 3, trained: tuple[int, ...] = (2,), seed: int = 1) -> torch.nn.Module:
    """A tiny random model with TRL's fused head and non-zero LoRA adapters in the ``trained`` layers only."""
    from peft import LoraConfig, get_peft_model

    model = build_tiny_random_model(vocab_size=128, hidden_size=32, num_layers=layers, seed=seed)
    add_fused_lm_head(model)
    targets = ["q_proj", "v_proj", "down_proj"]
    config = LoraConfig(r=4, target_modules=targets, layers_to_transform=list(trained), init_lora_weights=False)
    torch.manual_seed(seed)
    return get_peft_model(model, config)


def sampled_batch(model, rows: int = 4) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``rows`` sampled completions of one 6-token prompt, the second ended early; (ids, mask, labels) to score."""
    prompt = torch.randint(1, 128, (1, 6), generator=torch.Generator().manual_seed(0)).expand(rows, -1)
    torch.manual_seed(0)
    with torch.no_grad():
        mask = torch.ones_like(prompt)
        ids = model.generate(input_ids=prompt, attention_mask=mask, do_sample=True, max_new_tokens=7, eos_token_id=None)
    mask = torch.ones_like(ids)
    mask[1, 10:] = 0
    labels = ids.masked_fill(mask == 0, -100)
    labels[:, :6] = -100
    return ids, mask, labels


def scored_rows(model, ids, mask, labels) -> tuple[torch.Tensor, list[torch.Tensor]]:
    model.zero_grad()
    output = model(input_ids=ids, attention_mask=mask, labels=labels, fused_lm_head=True)
    output.loss.backward()
    return output.log_probs.detach(), [p.grad.clone() for p in model.parameters() if p.requires_grad]


def layer_calls(monkeypatch) -> list[int]:
    """The ``layer_idx`` of every decoder layer whose own forward runs from now on."""
    from transformers.models.qwen2.modeling_qwen2 import Qwen2DecoderLayer

    calls, forward = [], Qwen2DecoderLayer.forward

    def counted(self, *args, **kwargs):
        calls.append(self.self_attn.layer_idx)
        return forward(self, *args, **kwargs)

    monkeypatch.setattr(Qwen2DecoderLayer, "forward", counted)
    return calls


def test_first_trained_layer_counts_the_frozen_layers_below_the_adapters():
    assert cs.first_trained_layer(top_lora_model(layers=3, trained=(2,))) == 2
    assert cs.first_trained_layer(top_lora_model(layers=3, trained=(1, 2))) == 1
    assert cs.first_trained_layer(top_lora_model(layers=3, trained=(0, 1, 2))) == 0
    trained_embeddings = top_lora_model()
    trained_embeddings.get_input_embeddings().weight.requires_grad_(True)
    assert cs.first_trained_layer(trained_embeddings) == 0, "the embeddings feed every layer"
    dropout = top_lora_model()
    dropout.get_base_model().config.attention_dropout = 0.1
    assert cs.first_trained_layer(dropout) == 0, "dropout makes two passes differ"
    full = build_tiny_random_model(vocab_size=128, hidden_size=32, num_layers=2)
    assert cs.first_trained_layer(full) == 0, "full fine-tuning trains every layer"


@pytest.mark.parametrize("group", [False, True], ids=["plain generate", "group generation"])
@pytest.mark.parametrize("read_once", [False, True], ids=["every row", "prefix read once"])
def test_the_training_pass_from_sampled_states_gives_the_same_log_probs_and_gradients(group, read_once, monkeypatch):
    model = installed(top_lora_model()) if group else top_lora_model()  # as cpu_speed.enabled: group generation first
    with cs.frozen_layers_from_sampling(model) as sampled:
        ids, mask, labels = sampled_batch(model)
        assert sampled.hidden is not None and sampled.hidden.shape == (4, 13, 32)
        assert bool(sampled.filled[:, :12].all()), "every position but the last sampled token was read"
        calls = layer_calls(monkeypatch)
        with cs.prefix_read_once(model) if read_once else contextlib.nullcontext():
            replayed, replayed_gradients = scored_rows(model, ids, mask, labels)
        monkeypatch.undo()
    assert set(calls) == {2}, f"only the trained layer runs, got layers {sorted(set(calls))}"
    every_layer, gradients = scored_rows(model, ids, mask, labels)
    assert torch.allclose(replayed, every_layer, atol=1e-5), (replayed - every_layer).abs().max()
    assert len(gradients) == len(replayed_gradients) > 0
    for mine, plain in zip(replayed_gradients, gradients, strict=True):
        assert torch.allclose(mine, plain, atol=1e-5), (mine - plain).abs().max()


def test_rows_in_another_order_or_a_subset_find_their_sampled_rows(monkeypatch):
    model = top_lora_model()
    with cs.frozen_layers_from_sampling(model) as sampled:
        ids, mask, labels = sampled_batch(model)
        order = torch.tensor([3, 1])
        assert sampled.rows_for(ids[order], mask[order]).tolist() == [3, 1]
        calls = layer_calls(monkeypatch)
        replayed, _ = scored_rows(model, ids[order], mask[order], labels[order])
        monkeypatch.undo()
    assert set(calls) == {2}
    every_layer, _ = scored_rows(model, ids[order], mask[order], labels[order])
    assert torch.allclose(replayed, every_layer, atol=1e-5)


def test_calls_over_other_tokens_run_every_layer(monkeypatch):
    model = top_lora_model()
    with cs.frozen_layers_from_sampling(model) as sampled:
        ids, mask, labels = sampled_batch(model)
        other = ids.clone()
        other[2, 8] = (other[2, 8] + 1) % 128
        assert sampled.rows_for(other, mask) is None, "a token that was not sampled"
        assert sampled.rows_for(ids, mask.flip(1)) is None, "left padding: positions are not the columns"
        longer = torch.cat([ids, ids[:, :1]], dim=1)
        assert sampled.rows_for(longer, torch.ones_like(longer)) is None, "past what was sampled"
        calls = layer_calls(monkeypatch)
        scored_rows(model, other, mask, labels)
        with torch.no_grad():
            model(input_ids=ids, attention_mask=mask)  # a call with a cache of its own (generation's kind)
        monkeypatch.undo()
    assert calls.count(0) == 2 and calls.count(1) == 2, "both calls ran the frozen layers"


def test_a_left_padded_prompt_keeps_nothing():
    model = top_lora_model()
    prompt = torch.randint(1, 128, (2, 6), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(prompt)
    mask[1, :2] = 0
    with cs.frozen_layers_from_sampling(model) as sampled, torch.no_grad():
        model.generate(input_ids=prompt, attention_mask=mask, do_sample=True, max_new_tokens=3, eos_token_id=None)
        assert sampled.hidden is None and sampled.calls is None


def test_nothing_is_replayed_without_frozen_layers_and_everything_is_undone_on_exit():
    all_trained = top_lora_model(trained=(0, 1, 2))
    generate = all_trained.generate
    with cs.frozen_layers_from_sampling(all_trained) as sampled:
        assert all_trained.generate == generate and sampled.hidden is None
    model = installed(top_lora_model())
    grouped = model.__dict__["generate"]
    layers = cs.decoder_layers(model)
    with cs.frozen_layers_from_sampling(model):
        assert model.__dict__["generate"] is not grouped
        assert all("forward" in layers[i].__dict__ for i in (0, 1)) and "forward" not in layers[2].__dict__
    assert model.__dict__["generate"] is grouped, "group generation's generate is given back"
    assert not any("forward" in layer.__dict__ for layer in layers)
    assert not cs.decoder_backbone(model)._forward_pre_hooks and not layers[2]._forward_pre_hooks
    no_layers = torch.nn.Module()
    no_layers.base_model = torch.nn.Linear(2, 2)
    with pytest.raises(ValueError, match="leave the part frozen_layers_from_sampling out"):
        cs.decoder_layers(no_layers)
