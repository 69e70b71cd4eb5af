"""Notebook 04's lesson exercises: ``GRPOConfig`` (04.1), ``LoraConfig`` (04.2), ``SFTConfig`` (04.3), the trainer.

For each: the course's solution (``solutions/``, through ``tests.notebook_code``) passes and is handed back;
the learner's stub (``notebooks/``) reads "not answered yet" and the package's object is handed back; wrong
answers a learner really writes fail, naming the problem; right answers that differ from the package's
(``log_completions=True``, another ``beta``...) pass. The precision is pinned to fp32
(``COURSE_CPU_PRECISION``), so the verdicts are the same on every CPU.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from types import SimpleNamespace

import pytest
from notebook_code import exercise
from peft import LoraConfig
from trl import GRPOConfig, GRPOTrainer, SFTConfig

from course_utils.core.profiles import get_profile
from course_utils.exercises import nb04_train_grpo as nb04
from course_utils.exercises.nb04_train_grpo import grpo_config_check, grpo_trainer_check, lora_config_check, machine_fit
from course_utils.lesson.data import load_gsm8k
from course_utils.lesson.models import build_tiny_random_model, load_tokenizer
from course_utils.lesson.rewards import REWARD_FUNCS, grpo_reward_weights, load_weights
from course_utils.training import grpo_config, grpo_prompts, lora_setup, run_callbacks, trained_model
from course_utils.training.warm_start import make_sft_config


@pytest.fixture(autouse=True)
def fp32_cpu(monkeypatch):
    """The CPU profiles train in fp32 here, whatever this CPU computes natively."""
    monkeypatch.setenv("COURSE_CPU_PRECISION", "fp32")


def verdict(capsys) -> str:
    return capsys.readouterr().out


# --- 04.1 GRPOConfig -----------------------------------------------------------------------------------


@pytest.fixture
def ci(gsm8k_env):
    """The ci profile, its run folder (in a private output folder) and the weights notebook 03 saved (none)."""
    profile = get_profile("ci")
    return profile, trained_model.default_run_dir(profile), load_weights()


def _grpo(profile, weights, **changes):
    """A learner's GRPOConfig: the course's, with the fields a learner changed."""
    return grpo_config.make_grpo_config(profile, **{"reward_weights": weights, **changes})


def test_04_1_the_solution_passes_and_is_handed_back(ci, capsys):
    profile, run_dir, weights = ci
    config = exercise("04", "config", profile=profile, run_dir=run_dir, reward_weights=weights)
    assert nb04.check_grpo_config(config, profile, weights) is config
    out = verdict(capsys)
    assert out.startswith("✅ 04.1 GRPOConfig: correct.")
    assert "04.1 GRPOConfig: the notebook continues with yours." in out


def test_04_1_the_stub_reads_not_answered_and_the_package_config_is_handed_back(ci, capsys):
    profile, run_dir, weights = ci
    stub = exercise("04", "config", copy="notebooks", profile=profile, run_dir=run_dir, reward_weights=weights)
    assert stub is None
    handed = nb04.check_grpo_config(stub, profile, weights)
    out = verdict(capsys)
    assert out.startswith("⏳ 04.1 GRPOConfig: not answered yet.")
    assert "continues with the package's training.make_grpo_config(profile)." in out
    assert isinstance(handed, GRPOConfig) and handed.to_dict() == _grpo(profile, weights).to_dict()


@pytest.mark.parametrize(
    "changes",
    [
        {"log_completions": True},  # notebook 07 uses it
        {"beta": 0.02, "loss_type": "dapo", "learning_rate": 5e-5, "seed": 7},
        {"per_device_train_batch_size": 1, "gradient_accumulation_steps": 2, "max_steps": 1, "temperature": 0.9},
        {"num_completions_to_print": 2, "learning_rate": 3e-4, "beta": 0.1, "logging_steps": 2},
        {"max_completion_length": 128},  # longer than the profile's 16, within what the reference answers need
        {"reward_weights": None},  # TRL weighs every reward 1.0: notebook 03's "initial" preset
        {"save_steps": 1, "optim": "adamw_torch", "lr_scheduler_type": "constant", "warmup_steps": 0},
        {"temperature": 1.1, "max_grad_norm": 0.5, "report_to": [], "save_total_limit": 1, "disable_dropout": True},
        {"epsilon_high": 0.2, "min_p": 0.0},  # TRL clips above at epsilon when unset; min_p 0 filters nothing
        {"lr_scheduler_type": "constant_with_warmup"},  # with the profile's 0 warmup steps: the constant rate
        {"scale_rewards": True, "weight_decay": 0.01},  # TRL reads True as 'group'; a decay of 1e-6 a step
        {"label_smoothing_factor": 0.1, "dataloader_drop_last": True},  # GRPO reads neither
        {"gradient_checkpointing": True, "torch_empty_cache_steps": 1, "data_seed": 3, "eval_strategy": "no"},
    ],
)
def test_04_1_right_answers_that_differ_from_the_package_pass(ci, changes, capsys):
    profile, _, weights = ci
    config = _grpo(profile, weights, **changes)
    assert nb04.check_grpo_config(config, profile, weights) is config, verdict(capsys)


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"bf16": True}, "bf16=True on this CPU, where the model trains in float32"),
        ({"fp16": True}, "fp16=True on the CPU"),
        ({"reward_weights": [2.0, 0.5, 0.5, 0.5]}, "reward_weights has 4 weights for the 5 reward functions"),
        ({"reward_weights": grpo_reward_weights("tuned")}, "are not the weights loaded above from notebook 03"),
        ({"max_completion_length": 4}, "max_completion_length=4 cuts completions short"),
        ({"max_completion_length": 4096}, "max_completion_length=4096 is longer than the profile's 16"),
        ({"output_dir": "outputs/my-run"}, "is not the run folder"),
        ({"temperature": 0.0}, "temperature=0.0"),
        ({"loss_type": "grpo"}, "loss_type='grpo': the profile's run uses 'dapo' (TRL's default); it changes the loss"),
        ({"temperature": 0.3}, "temperature=0.3: the profile's is 1.0 (accepted: 0.8 to 1.2)"),
        ({"top_p": 0.5}, "top_p=0.5: the profile's run uses 1.0"),
        ({"mask_truncated_completions": True}, "mask_truncated_completions=True: the profile's run uses False"),
        ({"lr_scheduler_type": "linear"}, "lr_scheduler_type='linear': the profile's run uses 'constant'"),
        ({"max_grad_norm": 0.0}, "max_grad_norm=0.0: the profile's is 1.0 (accepted: 0.5 to 2)"),
        ({"num_iterations": 2}, "num_iterations=2: the profile's run uses 1"),
        ({"scale_rewards": "none"}, "scale_rewards='none': the profile's run uses 'group' (profile.scale_rewards); "
                                    "'group' divides each advantage by its group's reward std"),
        ({"scale_rewards": "batch"}, "scale_rewards='batch'"),
        ({"epsilon": 0.5}, "epsilon=0.5: the profile's run uses 0.2"),
        ({"epsilon_high": 0.28}, "epsilon_high=0.28"),
        ({"multi_objective_aggregation": "normalize_then_sum"}, "multi_objective_aggregation='normalize_then_sum'"),
        ({"remove_unused_columns": True}, "remove_unused_columns=True: the profile's run uses False (TRL's default); "
                                          "TRL then drops every column but 'prompt', and the rewards lose 'answer'"),
        ({"steps_per_generation": 2}, "steps_per_generation=2 (or generation_batch_size=4)"),
        ({"shuffle_dataset": False}, "shuffle_dataset=False"),
        ({"max_steps": -1}, "max_steps is not set"),
        ({"save_strategy": "no"}, "save_strategy='no'"),
        ({"loss_type": "dpo"}, "loss_type='dpo': the profile's run uses 'dapo'"),
        ({"use_vllm": True}, "vLLM is not installed"),
        ({"learning_rate": 1e-6}, "learning_rate=1e-06: the profile's is 0.0001 (accepted: 2e-05 to 0.0005)"),
        ({"learning_rate": 0.0}, "learning_rate=0: the profile's is 0.0001"),
        ({"beta": 0.0}, "beta=0: TRL then loads no reference model and logs no kl, but the dashboard draws"),
        ({"beta": 1.0}, "beta=1: the profile's is 0.04 (accepted: above 0, up to 0.2)"),
        ({"per_device_train_batch_size": 8, "gradient_accumulation_steps": 8, "num_generations": 8},
         "8 x 8 = 64 completions per step; the profile's run is 2 (2 x 1)"),
        ({"per_device_train_batch_size": 4, "num_generations": 4}, "num_generations=4: the profile's group is 2"),
        ({"max_steps": 500}, "max_steps=500: the profile's run is 2 steps (accepted: 1 to 2)"),
        ({"top_k": 50}, "top_k=50: the profile's run uses 0 (TRL's default); it changes how completions are sampled"),
        ({"min_p": 0.1}, "min_p=0.1: the profile's run uses None"),
        ({"repetition_penalty": 1.2}, "repetition_penalty=1.2: the profile's run uses 1.0"),
        ({"generation_kwargs": {"top_k": 5}}, "generation_kwargs={'top_k': 5}: the profile's run uses None"),
        ({"importance_sampling_level": "sequence"}, "importance_sampling_level='sequence'"),
        ({"delta": 2.0}, "delta=2.0: the profile's run uses None"),
        ({"top_entropy_quantile": 0.2}, "top_entropy_quantile=0.2"),
        ({"lr_scheduler_type": "cosine"}, "lr_scheduler_type='cosine': the profile's run uses 'constant' "
                                          "(profile.lr_scheduler_type)"),
        ({"lr_scheduler_type": "constant_with_warmup", "warmup_steps": 1},
         "warmup_steps=1: the profile's run uses 0.0"),
        ({"weight_decay": 0.5}, "weight_decay=0.5: the profile's is 0.0 (accepted: 0 to 0.1)"),
        ({"adam_beta2": 0.99}, "adam_beta2=0.99: the profile's run uses 0.999 (TRL's default); it changes the "
                               "optimizer"),
        ({"optim": "sgd"}, "optim='sgd'"),
        ({"neftune_noise_alpha": 5.0}, "neftune_noise_alpha=5.0"),
        ({"max_grad_norm": 10.0}, "max_grad_norm=10.0: the profile's is 1.0 (accepted: 0.5 to 2)"),
    ],
)
def test_04_1_wrong_configs_fail_naming_the_problem(ci, changes, named, capsys):
    profile, _, weights = ci
    config = _grpo(profile, weights, **changes)
    assert isinstance(nb04.check_grpo_config(config, profile, weights), GRPOConfig)
    out = verdict(capsys)
    assert out.startswith("❌ 04.1 GRPOConfig: not yet") and named in out, out
    assert "continues with the package's training.make_grpo_config(profile)." in out


@pytest.mark.parametrize(("field", "value"), [("num_generations", 3), ("num_generations", 1),
                                              ("per_device_train_batch_size", 3)])
def test_04_1_a_generation_batch_of_broken_groups_fails(ci, field, value, capsys):
    """GRPOConfig refuses these when it is built; a config changed afterwards is checked all the same."""
    profile, _, weights = ci
    config = _grpo(profile, weights)
    setattr(config, field, value)
    handed = nb04.check_grpo_config(config, profile, weights)
    out = verdict(capsys)
    assert handed is not config and out.startswith("❌ 04.1")
    assert "num_generations=1: a group needs at least 2" in out if value == 1 else "is not whole groups" in out


@pytest.fixture
def cpu_grpo(gsm8k_env):
    """The cpu lab, whose advantages keep the rewards' own scale (``scale_rewards='none'``, TRL's is 'group')."""
    profile = get_profile("cpu")
    return profile, trained_model.default_run_dir(profile), load_weights()


def test_04_1_the_solution_passes_under_the_cpu_lab(cpu_grpo, capsys):
    profile, run_dir, weights = cpu_grpo
    config = exercise("04", "config", profile=profile, run_dir=run_dir, reward_weights=weights)
    assert config.scale_rewards == "none" and nb04.check_grpo_config(config, profile, weights) is config, (
        verdict(capsys))


@pytest.mark.parametrize(("scale", "passes"), [("none", True), (False, True), ("group", False), (True, False),
                                                ("batch", False)])
def test_04_1_scale_rewards_follows_the_cpu_lab(cpu_grpo, scale, passes, capsys):
    """A config that leaves scale_rewards out gets TRL's 'group': the std division the cpu lab turned off."""
    profile, _, weights = cpu_grpo
    config = _grpo(profile, weights, scale_rewards=scale)
    assert (nb04.check_grpo_config(config, profile, weights) is config) is passes
    out = verdict(capsys)
    said = f"scale_rewards={config.scale_rewards!r}: the profile's run uses 'none' (profile.scale_rewards)"
    assert passes or said in out, out


def test_04_1_trl_defaults_fail_on_what_they_forget(ci, capsys):
    profile, run_dir, weights = ci
    defaults = GRPOConfig(output_dir=str(run_dir), use_cpu=True, report_to=[])
    nb04.check_grpo_config(defaults, profile, weights)
    out = verdict(capsys)
    assert "bf16=True on this CPU" in out and "max_steps is not set" in out and "max_completion_length=512" in out


@pytest.mark.parametrize(
    ("name", "flags", "named"),
    [
        ("colab-t4", {"bf16": False, "fp16": True, "use_cpu": False}, None),
        ("gpu", {"bf16": True, "fp16": False, "use_cpu": False}, None),
        ("colab-t4", {"bf16": True, "fp16": False, "use_cpu": False}, "bf16=True, but this GPU has no bfloat16"),
        ("colab-t4", {"bf16": False, "fp16": False, "use_cpu": False}, "fp16=False, but the model trains in float16"),
        ("gpu", {"bf16": False, "fp16": True, "use_cpu": False}, "fp16=True, but the model trains in bfloat16"),
        ("gpu", {"bf16": True, "fp16": False, "use_cpu": True}, "this GPU profile would train on the CPU"),
    ],
)
def test_04_1_precision_on_the_gpu_profiles(name, flags, named):
    """A GPU config cannot be built without a GPU: the rule is tested on its three fields (no GPU here: no bf16)."""
    problems = machine_fit.precision_problems(SimpleNamespace(**flags), get_profile(name))
    assert problems == [] if named is None else any(named in problem for problem in problems), problems


def _raised(build, monkeypatch):
    """Run a learner's cell that raises, leaving the error where IPython leaves it (``sys.last_value``)."""
    try:
        build()
    except Exception as error:  # the learner's cell failed; the answer stays None
        monkeypatch.setattr(sys, "last_value", error, raising=False)
        monkeypatch.setattr(sys, "last_exc", error, raising=False)
        return error
    raise AssertionError("the call was expected to raise")


def test_04_1_a_config_trl_refuses_shows_trl_s_message_not_unanswered(ci, capsys, monkeypatch):
    """A batch that is no whole number of groups: GRPOConfig raises, the answer stays None."""
    profile, run_dir, weights = ci
    def cell():
        return GRPOConfig(output_dir=str(run_dir), per_device_train_batch_size=3, num_generations=2, use_cpu=True)

    error = _raised(cell, monkeypatch)
    handed = nb04.check_grpo_config(None, profile, weights)
    out = verdict(capsys)
    assert out.startswith("❌ 04.1 GRPOConfig: your call raised an error in the library"), out
    assert str(error).split()[0] in out and "trl/trainer/grpo_config.py, line" in out
    assert "not answered yet" not in out and isinstance(handed, GRPOConfig)
    nb04.check_grpo_config(None, profile, weights)  # the same error is not reported twice
    assert verdict(capsys).startswith("⏳ 04.1 GRPOConfig: not answered yet.")


def test_04_1_an_error_of_another_library_still_reads_not_answered(ci, capsys, monkeypatch):
    profile, _, weights = ci
    _raised(lambda: int("not a number"), monkeypatch)
    nb04.check_grpo_config(None, profile, weights)
    assert verdict(capsys).startswith("⏳ 04.1 GRPOConfig: not answered yet.")


def test_04_1_something_else_than_a_config_is_a_verdict_not_an_error(ci, capsys):
    profile, _, weights = ci
    handed = nb04.check_grpo_config({"num_generations": 2}, profile, weights)
    assert isinstance(handed, GRPOConfig) and "a dict, not a GRPOConfig" in verdict(capsys)


def test_04_1_the_weights_are_compared_with_the_ones_the_cell_loaded(ci):
    profile, _, _ = ci
    tuned = grpo_reward_weights("tuned")
    config = _grpo(profile, tuned)
    assert nb04.check_grpo_config(config, profile, tuned) is config
    assert nb04.check_grpo_config(config, profile, None) is not config


def test_04_1_completion_length_bounds_follow_the_profile_and_the_reference_answers(gsm8k_env):
    """The CPU profiles cut on purpose (their value is the floor); longer is fine up to what the answers need."""
    low, high, needed = grpo_config_check.completion_length_bounds(get_profile("cpu"))
    assert needed is not None and low == 96 < needed <= high
    a_gpu_like = get_profile("ci").override(max_completion_length=768, eval_max_new_tokens=768)
    low, high, _ = grpo_config_check.completion_length_bounds(a_gpu_like)
    assert low == needed and high == 768  # a GPU run must fit the answers: far below them fails


# --- 04.2 LoraConfig -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_model():
    """Qwen2's architecture at toy size (2 decoder layers): its LoRA targets are the GPU profiles'."""
    return build_tiny_random_model()


@pytest.fixture
def lora_profile():
    return get_profile("ci").override(lora_top_layers=1)  # the top one of the tiny model's two layers


def test_04_2_the_solution_passes_and_is_handed_back(lora_profile, tiny_model, capsys):
    lora = exercise("04", "lora", profile=lora_profile, model=tiny_model)
    assert lora.layers_to_transform == [1]
    assert nb04.check_lora_config(lora, lora_profile, tiny_model) is lora
    assert verdict(capsys).startswith("✅ 04.2 LoraConfig: correct.")


def test_04_2_the_stub_reads_not_answered_and_the_package_config_is_handed_back(lora_profile, tiny_model, capsys):
    stub = exercise("04", "lora", copy="notebooks", profile=lora_profile, model=tiny_model)
    handed = nb04.check_lora_config(stub, lora_profile, tiny_model)
    out = verdict(capsys)
    assert stub is None and out.startswith("⏳ 04.2 LoraConfig: not answered yet.")
    assert "continues with the package's training.make_lora_config(profile, model)." in out
    assert isinstance(handed, LoraConfig) and handed.layers_to_transform == [1]


@pytest.mark.parametrize(
    "changes",
    [
        {"layers_to_transform": 1},  # peft reads an int as one layer: here the top one, as the profile says
        {"target_modules": ["down_proj", "up_proj", "gate_proj", "o_proj", "v_proj", "k_proj", "q_proj"]},
        {"r": 4, "lora_alpha": 8},
        {"use_rslora": True, "lora_dropout": 0.05, "layers_to_transform": (1,)},
        {"target_modules": r".*layers\.1\.(self_attn|mlp)\.(q|k|v|o|gate|up|down)_proj", "layers_to_transform": None},
        {"lora_alpha": 8},  # half the profile's scale
        {"fan_in_fan_out": True, "rank_pattern": {}, "modules_to_save": []},  # peft sets it back on nn.Linear
        {"target_modules": r"model\.layers\.1\..*_proj", "layers_to_transform": None},  # one regex, the top layer
    ],
)
def test_04_2_right_answers_that_differ_from_the_package_pass(lora_profile, tiny_model, changes, capsys):
    lora = replace(lora_setup.make_lora_config(lora_profile, tiny_model), **changes)
    assert nb04.check_lora_config(lora, lora_profile, tiny_model) is lora, verdict(capsys)


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"target_modules": ["c_attn", "c_proj"]}, "['c_attn', 'c_proj'] are not linear layers of Qwen2ForCausalLM"),
        ({"target_modules": ["q_proj", "embed_tokens"]}, "['embed_tokens'] are not linear layers"),
        ({"target_modules": r".*\.attn\.query", "layers_to_transform": None}, "matches no linear layer"),
        ({"r": 0}, "r=0"),
        ({"layers_to_transform": [15, 16]}, "the model has decoder layers 0 to 1; [15, 16] are not among them"),
        ({"layers_to_transform": []}, "an empty list adapts nothing"),
        ({"task_type": "SEQ_CLS"}, "task_type='SEQ_CLS'"),
        ({"lora_alpha": 0}, "lora_alpha=0"),
        ({"layers_to_transform": None}, "layers_to_transform=None adapts every layer; the profile adapts only"),
        ({"layers_to_transform": [0, 1]}, "layers_to_transform=[0, 1]: the profile adapts the top 1 layers, 1 to 1"),
        ({"layers_to_transform": [0]}, "layers_to_transform=[0]: the profile adapts the top 1 layers"),
        ({"layers_to_transform": 0}, "layers_to_transform=0 adapts the one layer numbered 0, not the top 1"),
        ({"r": 64}, "r=64: the profile's rank is 8 (accepted: 4 to 16)"),
        ({"target_modules": ["q_proj", "v_proj"]}, "leaves out ['down_proj', 'gate_proj', 'k_proj', 'o_proj'"),
        ({"target_modules": None}, "the profile adapts ['down_proj', 'gate_proj', 'k_proj'"),
        ({"target_modules": [*get_profile("ci").lora_target_modules, "lm_head"]}, "adds ['lm_head']"),
        ({"lora_alpha": 1}, "lora_alpha=1 with r=8: the update is scaled by lora_alpha / r = 0.125"),
        ({"lora_dropout": 0.9}, "lora_dropout=0.9: the profile's is 0.0 (accepted: 0 to 0.1)"),
        ({"bias": "all"}, "bias='all': the profile's run uses 'none'"),
        ({"use_dora": True}, "use_dora=True: the profile's run uses False"),
        ({"modules_to_save": ["lm_head"]}, "modules_to_save=['lm_head']: the profile's run uses None"),
        ({"target_modules": r".*\.(q|k|v|o|gate|up|down)_proj", "layers_to_transform": None},
         "adapts 14 linear layers, in decoder layers [0, 1]; the profile adapts 7"),
        ({"target_modules": "all-linear", "layers_to_transform": None}, "adapts 14 linear layers"),
        ({"init_lora_weights": "gaussian"}, "init_lora_weights='gaussian': the profile's run uses True (peft's "
                                            "default); it changes which weights train and how they start"),
        ({"inference_mode": True}, "inference_mode=True: the profile's run uses False"),
        ({"lora_bias": True}, "lora_bias=True"),
        ({"alpha_pattern": {"q_proj": 64}}, "alpha_pattern={'q_proj': 64}"),
    ],
)
def test_04_2_wrong_configs_fail_naming_the_problem(lora_profile, tiny_model, changes, named, capsys):
    lora = replace(lora_setup.make_lora_config(lora_profile, tiny_model), **changes)
    assert nb04.check_lora_config(lora, lora_profile, tiny_model) is not lora
    out = verdict(capsys)
    assert out.startswith("❌ 04.2 LoraConfig: not yet") and named in out, out


@pytest.mark.parametrize(
    ("layers", "named"),
    [
        (15, "layers_to_transform=15 adapts the one layer numbered 15, not the top 15"),
        (list(range(15)), "the profile adapts the top 15 layers, 15 to 29"),
        (None, "layers_to_transform=None adapts every layer; the profile adapts only the top 15"),
        (list(range(30)), "the profile adapts the top 15 layers"),
        (list(range(15, 30)), None),
        (tuple(reversed(range(15, 30))), None),
    ],
)
def test_04_2_the_top_layers_of_a_30_layer_model(layers, named):
    """The ci and cpu profiles adapt the top 15 of SmolLM2's 30 layers: an int is one layer, not a count."""
    model = SimpleNamespace(config=SimpleNamespace(num_hidden_layers=30))
    problems = lora_config_check.top_layers_problems(layers, get_profile("ci"), model)
    assert problems == [] if named is None else named in problems[0], problems


@pytest.mark.parametrize(
    ("first", "passes"), [(r"1[5-9]|2\d", True), (r"\d+", False), (r"1[4-9]|2\d", False), (r"1[6-9]|2\d", False)])
def test_04_2_one_regex_that_limits_the_layers_of_a_30_layer_model(first, passes, capsys):
    """The ci and cpu profiles' top 15 of 30 layers, written as one pattern instead of layers_to_transform."""
    profile, model = get_profile("ci"), build_tiny_random_model(vocab_size=64, hidden_size=16, num_layers=30)
    kinds = "|".join(name.removesuffix("_proj") for name in profile.lora_target_modules)
    lora = replace(lora_setup.make_lora_config(profile, model), layers_to_transform=None,
                   target_modules=rf"model\.layers\.({first})\.(self_attn|mlp)\.({kinds})_proj")
    assert (nb04.check_lora_config(lora, profile, model) is lora) is passes
    out = verdict(capsys)
    assert out.startswith("✅ 04.2" if passes else "❌ 04.2"), out
    assert passes or "the profile adapts 105: each of" in out, out


def test_04_2_a_lora_config_peft_refuses_shows_peft_s_message(lora_profile, tiny_model, capsys, monkeypatch):
    """peft refuses layers_to_transform with a pattern for target_modules: the answer stays None."""
    _raised(lambda: LoraConfig(r=8, target_modules="all-linear", layers_to_transform=[1]), monkeypatch)
    handed = nb04.check_lora_config(None, lora_profile, tiny_model)
    out = verdict(capsys)
    assert out.startswith("❌ 04.2 LoraConfig: your call raised an error in the library"), out
    assert "layers_to_transform" in out and "(raised in peft/" in out and isinstance(handed, LoraConfig)


def test_04_2_no_lora_is_right_only_where_the_profile_trains_every_weight(lora_profile, tiny_model, capsys):
    full = lora_profile.override(use_lora=False)
    assert nb04.check_lora_config(None, full, tiny_model) is None
    assert verdict(capsys).startswith("✅ 04.2 LoraConfig: correct.")
    lora = lora_setup.make_lora_config(lora_profile, tiny_model)
    assert nb04.check_lora_config(lora, full, tiny_model) is None
    assert "this profile trains every weight" in verdict(capsys)


# --- 04.3 SFTConfig --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("ci")


@pytest.fixture
def cpu_lab(gsm8k_env):
    """The cpu lab's warm start: 32 examples in batches of 8 (micro-batches of 2), one epoch: 4 steps."""
    profile = get_profile("cpu")
    return profile, trained_model.default_run_dir(profile)


def test_04_3_the_solution_passes_and_is_handed_back(cpu_lab, tokenizer, capsys):
    profile, run_dir = cpu_lab
    config = exercise("04", "sft_config", profile=profile, run_dir=run_dir)
    assert nb04.check_sft_config(config, profile, tokenizer) is config
    assert verdict(capsys).startswith("✅ 04.3 SFTConfig: correct.")


def test_04_3_the_stub_reads_not_answered_and_the_package_config_is_handed_back(cpu_lab, tokenizer, capsys):
    profile, run_dir = cpu_lab
    stub = exercise("04", "sft_config", copy="notebooks", profile=profile, run_dir=run_dir)
    handed = nb04.check_sft_config(stub, profile, tokenizer)
    out = verdict(capsys)
    assert stub is None and out.startswith("⏳ 04.3 SFTConfig: not answered yet.")
    assert isinstance(handed, SFTConfig) and handed.to_dict() == make_sft_config(profile).to_dict()


@pytest.mark.parametrize(
    "changes",
    [
        {"per_device_train_batch_size": 1, "gradient_accumulation_steps": 8},  # the same batch in smaller passes
        {"max_steps": 12, "num_train_epochs": 1.0},  # the cpu profile's 12 steps (3 epochs of 4), said differently
        {"learning_rate": 5e-4, "max_length": 1024, "report_to": "none", "completion_only_loss": True},
        {"remove_unused_columns": False, "lr_scheduler_type": "constant_with_warmup"},  # SFT's collator: tokens only
        {"max_length": None, "dataset_text_field": "content", "seed": 1},  # None cuts nothing
    ],
)
def test_04_3_right_answers_that_differ_from_the_package_pass(cpu_lab, tokenizer, changes, capsys):
    profile, _ = cpu_lab
    config = make_sft_config(profile, **changes)
    assert nb04.check_sft_config(config, profile, tokenizer) is config, verdict(capsys)


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"per_device_train_batch_size": 8, "gradient_accumulation_steps": 1}, "per_device_train_batch_size=8"),
        ({"num_train_epochs": 1.0}, "4 optimizer steps"),  # one epoch of the three
        ({"gradient_accumulation_steps": 1}, "48 optimizer steps"),  # batch 2: four times the steps
        ({"max_steps": 100}, "100 optimizer steps"),
        ({"max_length": 64}, "max_length=64 cuts the longest warm-start example"),
        ({"bf16": True}, "bf16=True on this CPU"),
        ({"output_dir": "/tmp/warm_start"}, "is not in the run folder"),
        ({"learning_rate": 0.0}, "learning_rate=0: the profile's is 0.001"),
        ({"learning_rate": 2e-5}, "learning_rate=2e-05: the profile's is 0.001 (accepted: 0.0002 to 0.005)"),
        ({"completion_only_loss": False}, "completion_only_loss=False: the profile's run uses None"),
        ({"packing": True}, "packing=True: the profile's run uses False"),
        ({"lr_scheduler_type": "linear"}, "lr_scheduler_type='linear': the profile's run uses 'constant'"),
        ({"padding_free": True}, "padding_free=True: the profile's run uses False (TRL's default); it changes the "
                                 "loss"),
        ({"loss_type": "dft"}, "loss_type='dft': the profile's run uses 'nll'"),
        ({"label_smoothing_factor": 0.1}, "label_smoothing_factor=0.1: the profile's run uses 0.0"),
        ({"neftune_noise_alpha": 5.0}, "neftune_noise_alpha=5.0"),
        ({"dataloader_drop_last": True}, "dataloader_drop_last=True: the profile's run uses False"),
        ({"shuffle_dataset": True}, "shuffle_dataset=True: the profile's run uses False"),
        ({"max_grad_norm": 0.0}, "max_grad_norm=0.0: the profile's is 1.0 (accepted: 0.5 to 2)"),
    ],
)
def test_04_3_wrong_configs_fail_naming_the_problem(cpu_lab, tokenizer, changes, named, capsys):
    profile, _ = cpu_lab
    config = make_sft_config(profile, **changes)
    assert nb04.check_sft_config(config, profile, tokenizer) is not config
    out = verdict(capsys)
    assert out.startswith("❌ 04.3 SFTConfig: not yet") and named in out, out


def test_04_3_a_grpo_config_is_not_an_sft_config(cpu_lab, tokenizer, capsys):
    profile, _ = cpu_lab
    assert isinstance(nb04.check_sft_config(grpo_config.make_grpo_config("ci"), profile, tokenizer), SFTConfig)
    assert "a GRPOConfig, not a SFTConfig" in verdict(capsys)


# --- 04.4 GRPOTrainer ------------------------------------------------------------------------------------


@pytest.fixture
def pieces(gsm8k_env, tokenizer):
    """What the notebook has when it reaches 04.4, at toy size: the ci run on the tiny model (LoRA in both layers).

    The model is saved first: without LoRA and with ``beta > 0`` TRL loads the reference model from its path.
    """
    profile = get_profile("ci").override(lora_top_layers=None, max_prompt_tokens=None, train_size=4,
                                         max_completion_length=8, max_steps=1)  # fmt: skip
    model = build_tiny_random_model()
    model.save_pretrained(gsm8k_env / "tiny")
    model.config._name_or_path = str(gsm8k_env / "tiny")
    return {
        "profile": profile, "model": model, "tokenizer": tokenizer, "config": grpo_config.make_grpo_config(profile),
        "lora": lora_setup.make_lora_config(profile, model), "train_dataset": grpo_prompts.training_dataset(profile),
        "dashboard": run_callbacks.LiveDashboard(show=False),
    }  # fmt: skip


def _trainer(p, **changes):
    """A learner's GRPOTrainer call: the course's arguments, with the ones a learner changed."""
    kwargs = {"model": p["model"], "processing_class": p["tokenizer"], "reward_funcs": list(REWARD_FUNCS),
              "args": p["config"], "train_dataset": p["train_dataset"], "peft_config": p["lora"],
              "callbacks": [p["dashboard"]], **changes}  # fmt: skip
    return GRPOTrainer(**kwargs)


def _check(p, trainer):
    return nb04.check_grpo_trainer(trainer, p["profile"], model=p["model"], tokenizer=p["tokenizer"],
                                   config=p["config"], lora=p["lora"], train_dataset=p["train_dataset"],
                                   callbacks=[p["dashboard"]])  # fmt: skip


def test_04_4_the_solution_passes_and_is_handed_back(pieces, capsys):
    names = {k: pieces[k] for k in ("model", "tokenizer", "config", "train_dataset", "lora", "dashboard")}
    trainer = exercise("04", "trainer", **names)
    assert isinstance(trainer, GRPOTrainer) and _check(pieces, trainer) is trainer
    out = verdict(capsys)
    assert out.startswith("✅ 04.4 GRPOTrainer: correct.") and "continues with yours" in out


def test_04_4_the_stub_reads_not_answered_and_the_course_trainer_is_handed_back(pieces, capsys):
    names = {k: pieces[k] for k in ("model", "tokenizer", "config", "train_dataset", "lora", "dashboard")}
    stub = exercise("04", "trainer", copy="notebooks", **names)
    handed = _check(pieces, stub)
    out = verdict(capsys)
    assert stub is None and out.startswith("⏳ 04.4 GRPOTrainer: not answered yet.")
    assert isinstance(handed, GRPOTrainer) and handed.args is pieces["config"]
    assert handed.model.get_base_model() is pieces["model"] and pieces["dashboard"] in handed.callback_handler.callbacks
    problems = grpo_trainer_check.trainer_problems(handed, pieces["model"], pieces["tokenizer"], pieces["config"],
                                                   pieces["lora"])
    assert problems == []


def test_04_4_a_plain_call_without_callbacks_passes(pieces, capsys):
    trainer = _trainer(pieces, callbacks=None)
    assert _check(pieces, trainer) is trainer, verdict(capsys)


def test_04_4_training_on_the_test_split_fails_and_the_course_trainer_takes_over(pieces, capsys):
    """The issue's wrong answer: it trains on the held-out problems notebook 05 evaluates on."""
    trainer = _trainer(pieces, train_dataset=load_gsm8k("test", formatted=True))
    handed = _check(pieces, trainer)
    out = verdict(capsys)
    assert "❌ 04.4 GRPOTrainer: not yet" in out
    assert "1319 of its 1319 problems are in GSM8K's test split" in out
    assert handed is not trainer and handed.train_dataset is pieces["train_dataset"]
    assert handed.model.get_base_model() is pieces["model"]  # the learner's adapter taken out, the course's put in
    assert grpo_trainer_check.adapter_problems(handed, pieces["model"], pieces["lora"]) == []


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"args": "other config"}, "args: not the GRPOConfig checked above"),
        ({"peft_config": None}, "peft_config: the model carries no LoRA adapter"),
        ({"reward_funcs": [REWARD_FUNCS[0], *REWARD_FUNCS[:4]]}, "reward_funcs ["),
        ({"train_dataset": "a dataset without answers"}, "train_dataset has columns ['prompt']"),
        ({"processing_class": "another tokenizer"}, "processing_class: not the tokenizer"),
        ({"model": "a fresh model"}, "model: not the model loaded (and warm-started) above"),
    ],
)
def test_04_4_wrong_calls_fail_naming_the_problem(pieces, changes, named, tokenizer, capsys):
    stand_ins = {
        "other config": grpo_config.make_grpo_config(pieces["profile"]),
        "a dataset without answers": pieces["train_dataset"].remove_columns(["answer", "question", "reasoning"]),
        "another tokenizer": load_tokenizer("ci"),
        "a fresh model": build_tiny_random_model(seed=1),
    }
    trainer = _trainer(pieces, **{k: stand_ins.get(v, v) if isinstance(v, str) else v for k, v in changes.items()})
    assert _check(pieces, trainer) is not trainer
    out = verdict(capsys)
    assert out.startswith("❌ 04.4 GRPOTrainer: not yet") and named in out, out


def test_04_4_reordered_rewards_pass_only_when_each_keeps_its_weight(pieces, capsys):
    reordered = [*REWARD_FUNCS[1:], REWARD_FUNCS[0]]
    trainer = _trainer(pieces, reward_funcs=reordered)  # the "initial" weights are all 1.0: nothing changes
    assert _check(pieces, trainer) is trainer, verdict(capsys)
    weighted = grpo_config.make_grpo_config(pieces["profile"], reward_weights=grpo_reward_weights("tuned"))
    trainer = _trainer({**pieces, "config": weighted}, reward_funcs=reordered)
    assert _check({**pieces, "config": weighted}, trainer) is not trainer
    assert "each reward's weight" in verdict(capsys)


def test_04_4_a_trainer_trl_refuses_shows_trl_s_message(pieces, capsys, monkeypatch):
    """Five weights in the config, four rewards given: GRPOTrainer raises, the answer stays None."""
    weighted = grpo_config.make_grpo_config(pieces["profile"], reward_weights=grpo_reward_weights("tuned"))
    changed = {**pieces, "config": weighted}
    _raised(lambda: _trainer(changed, reward_funcs=list(REWARD_FUNCS[:4])), monkeypatch)
    handed = _check(changed, None)
    out = verdict(capsys)
    assert out.startswith("❌ 04.4 GRPOTrainer: your call raised an error in the library"), out
    assert "(raised in trl/" in out and "not answered yet" not in out
    assert isinstance(handed, GRPOTrainer) and len(handed.reward_funcs) == len(REWARD_FUNCS)
    assert grpo_trainer_check.adapter_problems(handed, pieces["model"], pieces["lora"]) == []
    assert list(handed.model.peft_config) == ["default"]  # the failed call's adapter was taken out first


def test_04_4_something_else_than_a_trainer_is_a_verdict(pieces, capsys):
    handed = _check(pieces, pieces["config"])
    assert isinstance(handed, GRPOTrainer) and "a GRPOConfig, not a GRPOTrainer" in verdict(capsys)


def test_04_4_a_trainer_on_part_of_the_training_prompts_fails(pieces, capsys):
    """The issue's wrong answer (``train_dataset.select(range(4))``), at the toy run's size: half its rows."""
    trainer = _trainer(pieces, train_dataset=pieces["train_dataset"].select(range(2)))
    assert _check(pieces, trainer) is not trainer
    out = verdict(capsys)
    assert "train_dataset: 2 rows, of which 0 are not the notebook's, and 2 of its 4 training problems are missing" in (
        out), out


def test_04_4_the_training_prompts_in_another_order_pass(pieces, capsys):
    """TRL shuffles the prompts itself: the order the learner passes them in changes nothing."""
    trainer = _trainer(pieces, train_dataset=pieces["train_dataset"].shuffle(seed=3))
    assert _check(pieces, trainer) is trainer, verdict(capsys)
