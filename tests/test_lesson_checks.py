"""The checks after notebook 04's and 05's learner-written constructs: the reference passes, each kind of
difference is named, field by field."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from trl import GRPOConfig, GRPOTrainer

from course_utils.core.profiles import get_profile
from course_utils.exercises import lesson_checks
from course_utils.exercises.lesson_checks import DiffersFromReference, field_differences
from course_utils.lesson.data import load_gsm8k
from course_utils.lesson.models import build_tiny_random_model
from course_utils.lesson.rewards import REWARD_FUNCS, answers_match, extract_xml_answer, load_weights
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


# --- notebook 05's evaluation loop -------------------------------------------------------------------------


def learner_loop(model, tokenizer, problems, batch_size, max_new_tokens, whole_sequence=False):
    """What notebook 05's learner writes (``whole_sequence``: the classic slip of decoding the prompt too)."""
    records = []
    for start in range(0, len(problems), batch_size):
        batch = problems.select(range(start, min(start + batch_size, len(problems))))
        texts = tokenizer.apply_chat_template(list(batch["prompt"]), add_generation_prompt=True, tokenize=False)
        inputs = tokenizer(texts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False)
        with torch.inference_mode():
            output = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False,
                                    pad_token_id=tokenizer.pad_token_id)  # fmt: skip
        new = output if whole_sequence else output[:, inputs["input_ids"].shape[1] :]
        texts = tokenizer.batch_decode(new, skip_special_tokens=True)
        for completion, gold in zip(texts, batch["answer"], strict=True):
            extracted = extract_xml_answer(completion)
            records.append({"completion": completion, "extracted": extracted,
                            "correct": bool(extracted) and bool(answers_match(extracted, gold))})  # fmt: skip
    return records


@pytest.fixture(scope="module")
def three_problems():
    return load_gsm8k("test", formatted=True, limit=3, verbose=False)


@pytest.mark.slow
def test_the_evaluation_loop_check(offline_model_and_tokenizer, three_problems):
    model, tokenizer = offline_model_and_tokenizer
    settings = {"batch_size": 2, "max_new_tokens": 6}  # two batches, the second one short
    assert lesson_checks.check_evaluation_loop(learner_loop, model, tokenizer, three_problems, **settings)

    two, short = three_problems.select(range(2)), {"batch_size": 1, "max_new_tokens": 2}  # each slip, cheaply

    def with_prompt(*args):
        return learner_loop(*args, whole_sequence=True)

    with pytest.raises(DiffersFromReference, match="problem 0, completion: yours"):
        lesson_checks.check_evaluation_loop(with_prompt, model, tokenizer, two, **short)

    def first_batch_only(*args):
        return learner_loop(*args)[:1]

    with pytest.raises(DiffersFromReference, match="records: yours 1, reference 2"):
        lesson_checks.check_evaluation_loop(first_batch_only, model, tokenizer, two, **short)

    def texts_only(*args):
        return [r["completion"] for r in learner_loop(*args)]

    with pytest.raises(DiffersFromReference, match="not a dict"):
        lesson_checks.check_evaluation_loop(texts_only, model, tokenizer, two, **short)
