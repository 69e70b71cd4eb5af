"""The install-time probe passes the layers group generation rewrites faithfully and names those it does not."""

from __future__ import annotations

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

from course_utils.cpu_speed import adapters as ad
from course_utils.cpu_speed import lean_decoder as ld
from course_utils.cpu_speed import packed_linear as pl
from course_utils.cpu_speed.probe import lean_layer_mismatch, probe_key

SIZES = dict(
    vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2,
)  # fmt: skip
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
ARCHITECTURES = {
    "llama": (LlamaConfig, LlamaForCausalLM),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM),
    "qwen3": (Qwen3Config, Qwen3ForCausalLM),
}


def tiny_model(architecture: str, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """A tiny random model with LoRA in its top layer only (as the lab trains), B not zero so adapters count."""
    config_class, model_class = ARCHITECTURES[architecture]
    torch.manual_seed(0)
    base = model_class(config_class(**SIZES)).to(dtype)
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=TARGETS, layers_to_transform=[1], lora_dropout=0.0)
    model = get_peft_model(base, lora)
    for name, parameter in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(parameter, std=0.2)
    return model


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("architecture", ["llama", "qwen2"])
def test_the_rewrite_of_llama_and_qwen2_layers_agrees(architecture, dtype):
    assert lean_layer_mismatch(tiny_model(architecture, dtype)) is None


def test_a_model_without_adapters_agrees():
    assert lean_layer_mismatch(tiny_model("llama").get_base_model()) is None


def test_qwen3s_query_and_key_norms_are_reported():
    reason = lean_layer_mismatch(tiny_model("qwen3"))
    assert reason is not None and "Qwen3DecoderLayer" in reason


def test_adapters_left_out_of_the_merged_weights_are_reported(monkeypatch):
    """Only the top layer has adapters: the probe must check that kind of layer too, not just the first."""
    monkeypatch.setattr(ld, "merged_stack", lambda modules: pl.StackedLinear([ad.base_layer(m) for m in modules]))
    reason = lean_layer_mismatch(tiny_model("llama"))
    assert reason is not None and "LlamaDecoderLayer" in reason


def test_a_weight_altered_after_stacking_is_reported(monkeypatch):
    stack = pl.StackedLinear.__init__

    def stack_then_alter(self, layers):
        stack(self, layers)
        self.weight = self.weight.clone()
        self.weight[0, 0] += 0.5

    monkeypatch.setattr(pl.StackedLinear, "__init__", stack_then_alter)
    reason = lean_layer_mismatch(tiny_model("qwen2"))
    assert reason is not None and "Qwen2DecoderLayer" in reason and "largest difference" in reason


def test_the_probe_leaves_the_model_and_the_rng_as_they_were():
    model = tiny_model("llama").train()
    weights = {name: p.detach().clone() for name, p in model.named_parameters()}
    modes = [m.training for m in model.modules()]
    rng = torch.get_rng_state()
    assert lean_layer_mismatch(model) is None
    assert torch.equal(torch.get_rng_state(), rng)
    assert [m.training for m in model.modules()] == modes
    assert model.config._attn_implementation == "sdpa"
    assert not any("forward" in vars(m) for m in model.modules())
    assert all(torch.equal(p, weights[name]) for name, p in model.named_parameters())


def test_the_probe_key_changes_with_the_adapters_and_not_with_trained_values():
    model = tiny_model("llama")
    key = probe_key(model)
    with torch.no_grad():
        next(p for name, p in model.named_parameters() if "lora_B" in name).add_(1.0)
    assert probe_key(model) == key, "trained values change nothing the probe depends on"
    model.add_adapter("more", LoraConfig(r=2, target_modules=["gate_proj"], layers_to_transform=[0]))
    model.base_model.set_adapter(["default", "more"])
    assert probe_key(model) != key
    assert probe_key(tiny_model("llama", torch.bfloat16)) != key
