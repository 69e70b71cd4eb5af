"""Notebook 04's checks of the constructs the learner writes: SFTConfig, LoraConfig, GRPOConfig, GRPOTrainer."""

from __future__ import annotations

from dataclasses import replace

import pytest
from trl import GRPOConfig, GRPOTrainer

from course_utils.core.profiles import get_profile
from course_utils.exercises import nb04_train_grpo as lesson_checks
from course_utils.exercises.comparison import field_differences
from course_utils.exercises.nb04_train_grpo import DiffersFromReference
from course_utils.lesson.models import build_tiny_random_model
from course_utils.lesson.rewards import REWARD_FUNCS, load_weights
from course_utils.training import run as training
from course_utils.training.warm_start import make_sft_config


def test_field_differences_name_each_field_both_ways():
    assert field_differences({"a": 1, "b": 2}, {"a": 1, "b": 2}) == []
    assert field_differences({"a": 1, "b": 3}, {"a": 1, "b": 2}) == ["b: yours 3, reference 2"]
    assert field_differences({"a": 1}, {"a": 1, "b": 2}) == ["b: yours '(not set)', reference 2"]
    assert field_differences({"a": 1, "c": {"y", "x"}}, {"a": 1}) == ["c: yours ['x', 'y'], reference '(not set)'"]


@pytest.mark.parametrize("name", ["ci", "cpu"])  # the GPU profiles' fp16/bf16 need a GPU to build
def test_the_reference_grpo_config_passes_and_a_changed_field_is_named(name, tmp_path, capsys):
    profile = get_profile(name)
    weights = load_weights()
    config = training.make_grpo_config(profile, tmp_path, reward_weights=weights)
    assert lesson_checks.check_grpo_config(config, profile, weights)
    assert "✅ Your GRPOConfig" in capsys.readouterr().out
    changed = training.make_grpo_config(profile, tmp_path, reward_weights=weights, learning_rate=1e-3, seed=7)
    with pytest.raises(DiffersFromReference, match=r"2 place\(s\)") as raised:
        lesson_checks.check_grpo_config(changed, profile, weights)
    assert f"learning_rate: yours 0.001, reference {profile.learning_rate}" in str(raised.value)
    assert "seed: yours 7, reference 42" in str(raised.value) and "profile.override" in str(raised.value)


def test_a_grpo_config_left_at_trl_defaults_lists_what_it_forgot(tmp_path):
    profile = get_profile("ci")
    defaults = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to=[])
    with pytest.raises(DiffersFromReference) as raised:
        lesson_checks.check_grpo_config(defaults, profile)
    message = str(raised.value)
    assert "num_generations: yours 8, reference" in message and "beta" in message


def test_other_reward_weights_than_the_cell_loaded_are_a_difference(tmp_path):
    profile = get_profile("ci")
    config = training.make_grpo_config(profile, tmp_path, reward_weights=[2.0, 1.0, 1.0, 1.0, 1.0])
    with pytest.raises(DiffersFromReference, match="reward_weights"):
        lesson_checks.check_grpo_config(config, profile, None)
    assert lesson_checks.check_grpo_config(config, profile, [2.0, 1.0, 1.0, 1.0, 1.0])


def test_sft_config_check(tmp_path):
    profile = get_profile("cpu")
    assert lesson_checks.check_sft_config(make_sft_config(profile, tmp_path), profile)
    with pytest.raises(DiffersFromReference, match=r"learning_rate: yours 0\.1"):
        lesson_checks.check_sft_config(make_sft_config(profile, tmp_path, learning_rate=0.1), profile)
    with pytest.raises(TypeError, match=r"trl\.SFTConfig"):
        lesson_checks.check_sft_config({"learning_rate": 1e-3}, profile)


def test_lora_config_check(offline_model_and_tokenizer):
    model, _ = offline_model_and_tokenizer
    profile = get_profile("cpu")
    lora = training.make_lora_config(profile, model)
    assert lesson_checks.check_lora_config(lora, profile, model)
    assert lesson_checks.check_lora_config(replace(lora, target_modules=list(lora.target_modules)), profile, model)
    with pytest.raises(DiffersFromReference, match="layers_to_transform: yours None"):
        lesson_checks.check_lora_config(replace(lora, layers_to_transform=None), profile, model)
    with pytest.raises(DiffersFromReference, match="r: yours 4, reference 16"):
        lesson_checks.check_lora_config(replace(lora, r=4), profile, model)
    with pytest.raises(DiffersFromReference, match="LoRA: yours None"):
        lesson_checks.check_lora_config(None, profile, model)
    assert lesson_checks.check_lora_config(None, profile.override(use_lora=False), model)


@pytest.fixture
def tiny_setup(gsm8k_env, offline_model_and_tokenizer):
    """A profile the tiny random model fits (2 layers: LoRA in all), its config, LoRA, data and tokenizer.

    The model is saved first: without LoRA and with ``beta > 0`` TRL loads the reference model from its path.
    """
    _, tokenizer = offline_model_and_tokenizer
    profile = get_profile("ci").override(
        lora_top_layers=None, max_prompt_tokens=None, train_size=4, max_completion_length=8, max_steps=1
    )
    model = build_tiny_random_model()
    model.save_pretrained(gsm8k_env / "tiny")
    model.config._name_or_path = str(gsm8k_env / "tiny")
    lora = training.make_lora_config(profile, model)
    config = training.make_grpo_config(profile)
    data = training.training_dataset(profile)
    return profile, model, lora, config, data, tokenizer


def _trainer(model, tokenizer, config, data, lora, funcs=REWARD_FUNCS, callbacks=None):
    return GRPOTrainer(model=model, processing_class=tokenizer, reward_funcs=list(funcs), args=config,
                       train_dataset=data, peft_config=lora, callbacks=callbacks)  # fmt: skip


@pytest.mark.slow
def test_grpo_trainer_check(tiny_setup):
    profile, model, lora, config, data, tokenizer = tiny_setup
    trainer = _trainer(model, tokenizer, config, data, lora)  # a plain GRPOTrainer: no callbacks demanded
    assert lesson_checks.check_grpo_trainer(trainer, profile, config, lora, tokenizer)
    other_config = training.make_grpo_config(profile)
    with pytest.raises(DiffersFromReference, match="args: not the GRPOConfig checked above"):
        lesson_checks.check_grpo_trainer(trainer, profile, other_config, lora, tokenizer)
    with pytest.raises(DiffersFromReference, match="peft_config: the model carries no LoRA adapter as configured"):
        lesson_checks.check_grpo_trainer(trainer, profile, config, replace(lora, r=2), tokenizer)


@pytest.mark.slow
def test_grpo_trainer_check_names_rewards_and_adapters(tiny_setup):
    profile, model, lora, config, data, tokenizer = tiny_setup
    reordered = [*REWARD_FUNCS[1:], REWARD_FUNCS[0]]
    trainer = _trainer(model, tokenizer, config, data, None, funcs=reordered)
    with pytest.raises(DiffersFromReference) as raised:
        lesson_checks.check_grpo_trainer(trainer, profile, config, lora, tokenizer)
    message = str(raised.value)
    assert "reward_funcs: yours" in message and "callbacks" not in message
    assert "peft_config" in message


