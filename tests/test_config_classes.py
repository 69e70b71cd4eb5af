"""Every profile's settings built into TRL's and PEFT's real config classes, the GPU profiles included, on a CPU.

A TRL release that renames or removes a field a profile sets (as 1.16 removed ``max_prompt_length``) then fails
here, in CI, and not in a workshop's first Colab cell. The GPU profiles ask for fp16 or bf16 autocast, which
``TrainingArguments`` refuses on a machine whose GPU lacks it; the test stands in for the card's answer to that one
question (``is_torch_bf16_gpu_available``) and lets the real classes check everything else.
"""

from __future__ import annotations

import contextlib
import io

import pytest
import transformers.training_args
from peft import LoraConfig
from trl import GRPOConfig, SFTConfig

from course_utils.core.profiles import PROFILES
from course_utils.lesson.models import build_tiny_random_model
from course_utils.training.grpo_config import grpo_config_kwargs
from course_utils.training.lora_setup import make_lora_config
from course_utils.training.warm_start import make_sft_config

GPU_PROFILES = [name for name, p in PROFILES.items() if p.device == "cuda"]


@pytest.fixture
def a_bf16_gpu(monkeypatch):
    """``TrainingArguments`` told the GPU computes bf16, as an A100 answers; every other check stays real."""
    monkeypatch.setattr(transformers.training_args, "is_torch_bf16_gpu_available", lambda: True)


def grpo_kwargs(name: str, tmp_path) -> dict:
    with contextlib.redirect_stdout(io.StringIO()):  # the gpu profile's "vLLM is not installed" line
        kwargs = grpo_config_kwargs(PROFILES[name], tmp_path)
    return kwargs | {"use_vllm": PROFILES[name].use_vllm}  # the GPU run's choice, not this machine's


@pytest.fixture(scope="module")
def thirty_layers():
    """A model as deep as SmolLM2-135M (30 layers), for the profiles that adapt only the top layers."""
    return build_tiny_random_model(vocab_size=64, hidden_size=16, num_layers=30)


@pytest.mark.parametrize("name", list(PROFILES))
def test_every_profile_builds_a_real_grpo_config(name, tmp_path, a_bf16_gpu):
    kwargs = grpo_kwargs(name, tmp_path)
    config = GRPOConfig(**kwargs)
    profile = PROFILES[name]
    assert config.num_generations == profile.num_generations
    assert config.max_completion_length == profile.max_completion_length
    assert config.mask_truncated_completions == profile.mask_truncated_completions
    assert config.beta == profile.beta and config.learning_rate == profile.learning_rate
    assert config.use_vllm == profile.use_vllm
    assert config.gradient_checkpointing == profile.gradient_checkpointing  # set through activation_checkpointing
    assert config.fp16 == (profile.training_dtype == "float16")
    assert config.bf16 == (profile.training_dtype == "bfloat16")


@pytest.mark.parametrize("name", list(PROFILES))
def test_every_profile_builds_a_real_sft_config(name, tmp_path, a_bf16_gpu):
    config = make_sft_config(PROFILES[name], tmp_path)
    assert isinstance(config, SFTConfig)
    assert config.learning_rate == PROFILES[name].warm_start_learning_rate


@pytest.mark.parametrize("name", list(PROFILES))
def test_every_profile_builds_a_real_lora_config_on_its_architecture(name, thirty_layers):
    profile = PROFILES[name]
    config = make_lora_config(profile, thirty_layers)
    assert isinstance(config, LoraConfig)
    assert sorted(config.target_modules) == sorted(profile.lora_target_modules)
    assert config.r == profile.lora_r and config.lora_alpha == profile.lora_alpha
    if profile.lora_top_layers is None:
        assert config.layers_to_transform is None
    else:
        assert config.layers_to_transform == list(range(30 - profile.lora_top_layers, 30))


@pytest.mark.parametrize("name", GPU_PROFILES)
def test_a_field_trl_rejects_fails_the_gpu_profiles_config(name, tmp_path, a_bf16_gpu):
    """``max_prompt_length``, removed in TRL 1.16 (popular tutorials still set it): the build above would fail."""
    with pytest.raises(TypeError, match="max_prompt_length"):
        GRPOConfig(**grpo_kwargs(name, tmp_path), max_prompt_length=512)


def test_without_the_stand_in_a_cpu_refuses_bf16_autocast(tmp_path):
    """The stand-in answers one question only: without it, this machine's own answer decides (it has no GPU)."""
    with pytest.raises(ValueError, match="bf16"):
        GRPOConfig(**grpo_kwargs("gpu", tmp_path))
