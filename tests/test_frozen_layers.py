"""The frozen layers taken from sampling: the training pass starts at the first trained layer, same results."""

from __future__ import annotations

import contextlib

import pytest
import torch
from trl.trainer.utils import add_fused_lm_head

from course_utils.cpu_speed import frozen_layers as fl
from course_utils.cpu_speed.group_generation import install
from course_utils.cpu_speed.shared_prefix import decoder_backbone, prefix_read_once
from course_utils.lesson.models import build_tiny_random_model

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
    assert fl.first_trained_layer(top_lora_model(layers=3, trained=(2,))) == 2
    assert fl.first_trained_layer(top_lora_model(layers=3, trained=(1, 2))) == 1
    assert fl.first_trained_layer(top_lora_model(layers=3, trained=(0, 1, 2))) == 0
    trained_embeddings = top_lora_model()
    trained_embeddings.get_input_embeddings().weight.requires_grad_(True)
    assert fl.first_trained_layer(trained_embeddings) == 0, "the embeddings feed every layer"
    dropout = top_lora_model()
    dropout.get_base_model().config.attention_dropout = 0.1
    assert fl.first_trained_layer(dropout) == 0, "dropout makes two passes differ"
    full = build_tiny_random_model(vocab_size=128, hidden_size=32, num_layers=2)
    assert fl.first_trained_layer(full) == 0, "full fine-tuning trains every layer"


@pytest.mark.parametrize("group", [False, True], ids=["plain generate", "group generation"])
@pytest.mark.parametrize("read_once", [False, True], ids=["every row", "prefix read once"])
def test_the_training_pass_from_sampled_states_gives_the_same_log_probs_and_gradients(group, read_once, monkeypatch):
    model = installed(top_lora_model()) if group else top_lora_model()  # as cpu_speed.enabled: group generation first
    with fl.frozen_layers_from_sampling(model) as sampled:
        ids, mask, labels = sampled_batch(model)
        assert sampled.hidden is not None and sampled.hidden.shape == (4, 13, 32)
        assert bool(sampled.filled[:, :12].all()), "every position but the last sampled token was read"
        calls = layer_calls(monkeypatch)
        with prefix_read_once(model) if read_once else contextlib.nullcontext():
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
    with fl.frozen_layers_from_sampling(model) as sampled:
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
    with fl.frozen_layers_from_sampling(model) as sampled:
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
    with fl.frozen_layers_from_sampling(model) as sampled, torch.no_grad():
        model.generate(input_ids=prompt, attention_mask=mask, do_sample=True, max_new_tokens=3, eos_token_id=None)
        assert sampled.hidden is None and sampled.calls is None


def test_nothing_is_replayed_without_frozen_layers_and_everything_is_undone_on_exit():
    all_trained = top_lora_model(trained=(0, 1, 2))
    generate = all_trained.generate
    with fl.frozen_layers_from_sampling(all_trained) as sampled:
        assert all_trained.generate == generate and sampled.hidden is None
    model = installed(top_lora_model())
    grouped = model.__dict__["generate"]
    layers = fl.decoder_layers(model)
    with fl.frozen_layers_from_sampling(model):
        assert model.__dict__["generate"] is not grouped
        assert all("forward" in layers[i].__dict__ for i in (0, 1)) and "forward" not in layers[2].__dict__
    assert model.__dict__["generate"] is grouped, "group generation's generate is given back"
    assert not any("forward" in layer.__dict__ for layer in layers)
    assert not decoder_backbone(model)._forward_pre_hooks and not layers[2]._forward_pre_hooks
    no_layers = torch.nn.Module()
    no_layers.base_model = torch.nn.Linear(2, 2)
    with pytest.raises(ValueError, match="leave the part frozen_layers_from_sampling out"):
        fl.decoder_layers(no_layers)
