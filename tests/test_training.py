"""Training: GRPOConfig from every profile, the generation-batch check, LoRA, the training prompts (and their
cap), a real short `ci` GRPO run, kill-and-resume, and the Qwen2 (GPU) code path on a tiny random model."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import matplotlib
import pytest
import torch
from peft import PeftModel, get_peft_model, get_peft_model_state_dict
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from transformers import TrainerCallback
from transformers.trainer_utils import get_last_checkpoint
from trl import GRPOConfig

from course_utils import cpu_speed
from course_utils.core import hardware
from course_utils.core.hardware import PRECISION_ENV_VAR
from course_utils.core.profiles import PROFILES, get_profile
from course_utils.lesson.data_checks import solution_steps
from course_utils.lesson.formatting import build_prompt
from course_utils.lesson.models import build_tiny_random_model, load_model_and_tokenizer
from course_utils.lesson.rewards import DEFAULT_WEIGHTS, load_weights, save_weights
from course_utils.training import config_tables, grpo_config, grpo_prompts, lora_setup, run_folder, trained_model
from course_utils.training import run as training
from course_utils.training.grpo_config import (
    GenerationBatchError,
    check_generation_batch,
    grpo_config_kwargs,
    make_grpo_config,
)
from course_utils.training.run_callbacks import LiveDashboard
from course_utils.training.run_logs import save_run_artifacts, training_logs
from course_utils.training.warm_start import warm_start, warm_start_dataset

matplotlib.use("Agg")


# --- The generation batch ----------------------------------------------------------------------------


def test_generation_batch_accepts_whole_groups():
    assert check_generation_batch(8, 1, 8) == 8
    assert check_generation_batch(4, 2, 8) == 8
    assert check_generation_batch(8, 16, 8) == 128


def test_generation_batch_error_names_the_fix():
    with pytest.raises(GenerationBatchError, match=r"not a whole number of groups.*multiple of 4.*divisor of 6"):
        check_generation_batch(6, 1, 4)


@pytest.mark.parametrize("bad", [0, -1, 2.5, "8", True])
def test_generation_batch_rejects_bad_sizes(bad):
    with pytest.raises(GenerationBatchError, match="per_device_train_batch_size must be a positive integer"):
        check_generation_batch(bad, 1, 2)


def test_group_of_one_is_refused():
    with pytest.raises(GenerationBatchError, match="num_generations must be an integer >= 2"):
        check_generation_batch(8, 1, 1)


# --- GRPOConfig per profile --------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_config_kwargs_follow_the_profile(name, tmp_path):
    profile = get_profile(name)
    kwargs = grpo_config_kwargs(profile, tmp_path)
    for field in ("num_generations", "per_device_train_batch_size", "max_completion_length", "beta", "max_steps"):
        assert kwargs[field] == getattr(profile, field)
    assert kwargs["activation_checkpointing"] is profile.gradient_checkpointing
    assert {"bf16", "fp16"} <= set(kwargs), "precision must be explicit: TRL defaults to bf16=True"
    assert not (kwargs["bf16"] and kwargs["fp16"])
    assert len(kwargs["reward_weights"]) == 5


def test_gpu_profiles_pick_their_precision():
    t4 = grpo_config_kwargs("colab-t4")
    assert (t4["fp16"], t4["bf16"], t4["use_cpu"]) == (True, False, False)
    gpu = grpo_config_kwargs("gpu")
    assert (gpu["fp16"], gpu["bf16"]) == (False, True)
    assert gpu["use_vllm"] == grpo_config.vllm_available()


@pytest.mark.parametrize("name", ["ci", "cpu"])
def test_cpu_profiles_build_a_real_grpo_config(name, tmp_path):
    config = make_grpo_config(name, tmp_path)
    profile = get_profile(name)
    assert config.use_cpu and not config.fp16
    assert config.generation_batch_size % config.num_generations == 0
    assert config.beta == profile.beta and config.learning_rate == profile.learning_rate


@pytest.mark.parametrize("name", ["colab-t4", "gpu"])
def test_gpu_profile_fields_are_real_grpo_fields(name, tmp_path):
    """Build the GPU profiles' GRPOConfig on a CPU (precision switched off): every field name must exist."""
    config = make_grpo_config(name, tmp_path, fp16=False, bf16=False, use_cpu=True, use_vllm=False)
    assert config.num_generations == get_profile(name).num_generations
    assert config.gradient_accumulation_steps == get_profile(name).gradient_accumulation_steps


def test_unknown_override_is_named(tmp_path):
    with pytest.raises(ValueError, match=r"no field\(s\) \['kl_coef'\]"):
        make_grpo_config("ci", tmp_path, kl_coef=0.1)


def test_bad_batch_override_fails_before_trl(tmp_path):
    with pytest.raises(GenerationBatchError, match="Fix"):
        make_grpo_config("ci", tmp_path, per_device_train_batch_size=3)


def test_golden_config_translation():
    table = config_tables.golden_config_table()
    assert "GRPOTrainingArguments(...)" in set(table["often copied"])
    assert any("beta" in field for field in table["real GRPOConfig field"])
    config = config_tables.golden_config()
    assert (config.gradient_accumulation_steps, config.learning_rate, config.max_grad_norm) == (16, 5e-6, 0.3)
    assert config.save_steps == 1000 and config.logging_steps == 50


def test_config_table_lists_values(tmp_path):
    table = config_tables.config_table(make_grpo_config("ci", tmp_path))
    assert table.loc["num_generations", "value"] == get_profile("ci").num_generations


def test_bf16_training_copy_needs_lora(monkeypatch):
    monkeypatch.setenv(PRECISION_ENV_VAR, "bf16")
    profile = get_profile("cpu").override(use_lora=False)
    with pytest.raises(ValueError, match="use_lora=True or train_dtype=None"):
        training.load_model_for_training(profile)


@pytest.mark.parametrize("path", ["bf16", "fp32"])
def test_cpu_precision_follows_the_precision_path(monkeypatch, path):
    monkeypatch.setenv(PRECISION_ENV_VAR, path)
    for name in ("ci", "cpu"):
        profile = get_profile(name)
        assert grpo_config.precision_flags(profile) == {"bf16": path == "bf16", "fp16": False, "use_cpu": True}
        assert profile.training_dtype == {"bf16": "bfloat16", "fp32": "float32"}[path]


def test_cpu_precision_auto_is_bf16_only_where_native(monkeypatch):
    monkeypatch.delenv(PRECISION_ENV_VAR, raising=False)
    native = hardware.cpu_supports_bf16()
    assert grpo_config.precision_flags(get_profile("cpu"))["bf16"] is native


@pytest.mark.parametrize("path", ["bf16", "fp32"])
def test_lab_model_is_loaded_in_the_precision_path(monkeypatch, path):
    monkeypatch.setenv(PRECISION_ENV_VAR, path)
    model, _ = training.load_model_for_training("ci")
    assert model.dtype == {"bf16": torch.bfloat16, "fp32": torch.float32}[path]


# --- LoRA and the training prompts ----------------------------------------------------------------------------


def test_lora_config_per_profile(offline_model_and_tokenizer):
    model, _ = offline_model_and_tokenizer
    assert lora_setup.make_lora_config(get_profile("cpu").override(use_lora=False)) is None
    config = lora_setup.make_lora_config("ci", model)
    assert set(config.target_modules) == set(get_profile("ci").lora_target_modules)


def test_lora_in_the_top_layers_only(offline_model_and_tokenizer):
    """lora_top_layers adapts the top N decoder layers; the gradients stop below them (no backward there)."""
    model, _ = offline_model_and_tokenizer
    depth = model.config.num_hidden_layers
    config = lora_setup.make_lora_config(get_profile("ci").override(lora_top_layers=3), model)
    assert config.layers_to_transform == [depth - 3, depth - 2, depth - 1]
    every_layer = get_profile("ci").override(lora_top_layers=None)
    assert lora_setup.make_lora_config(every_layer, model).layers_to_transform is None
    peft_model = get_peft_model(copy.deepcopy(model), config)
    adapted = {int(n.split(".layers.")[1].split(".")[0]) for n, p in peft_model.named_parameters() if p.requires_grad}
    assert adapted == {depth - 3, depth - 2, depth - 1}


def test_lora_top_layers_bad_values(offline_model_and_tokenizer):
    model, _ = offline_model_and_tokenizer
    depth = model.config.num_hidden_layers
    with pytest.raises(ValueError, match=f"from 1 to {depth}"):
        lora_setup.make_lora_config(get_profile("ci").override(lora_top_layers=depth + 1), model)
    with pytest.raises(ValueError, match="lora_top_layers=0 is out of range"):  # the profile refuses it first
        get_profile("ci").override(lora_top_layers=0)
    with pytest.raises(ValueError, match="lora_top_layers"):  # not a whole number: the profile refuses it first
        get_profile("ci").override(lora_top_layers=1.5)
    with pytest.raises(ValueError, match="pass the model"):
        lora_setup.make_lora_config(get_profile("ci").override(lora_top_layers=2))


def test_lora_targets_missing_are_named(offline_model_and_tokenizer):
    model, _ = offline_model_and_tokenizer
    with pytest.raises(ValueError, match=r"\['c_attn'\].*q_proj"):
        lora_setup.lora_targets_in(model, ["q_proj", "c_attn"])


def _template_length(tokenizer, messages) -> int:
    ids = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    return len(ids["input_ids"] if hasattr(ids, "keys") else ids)


def test_prompt_cap_keeps_the_first_problems_that_fit(gsm8k_env, gsm8k_dir, offline_model_and_tokenizer, capsys):
    _, tokenizer = offline_model_and_tokenizer
    profile = get_profile("cpu").override(problem_list=None, train_size=40, max_prompt_tokens=78)
    train = grpo_prompts.training_dataset(profile, tokenizer=tokenizer)
    assert "training on the first 40 problems that fit" in capsys.readouterr().out
    # Independently: walk the raw train file in order and keep the questions whose prompt fits
    expected = []
    for line in (gsm8k_dir / "train.jsonl").read_text().splitlines():
        question = json.loads(line)["question"].strip()
        if _template_length(tokenizer, build_prompt(question)) <= 78:
            expected.append(question)
        if len(expected) == 40:
            break
    assert train["question"] == expected
    assert max(_template_length(tokenizer, p) for p in train["prompt"]) <= 78
    warm = warm_start_dataset(profile)
    assert not {row["prompt"][-1]["content"] for row in warm} & set(train["question"])


def test_prompt_cap_picks_the_same_problems_in_any_block_size(gsm8k_env, offline_model_and_tokenizer, monkeypatch):
    """Prompts are measured a block at a time: blocks of 7 rows (the last kept row mid-block) pick the same rows."""
    _, tokenizer = offline_model_and_tokenizer
    profile = get_profile("cpu").override(problem_list=None, train_size=12, max_prompt_tokens=80)
    one_block = grpo_prompts.training_dataset(profile, tokenizer=tokenizer)
    monkeypatch.setattr(grpo_prompts, "PROMPT_BLOCK_ROWS", 7)
    small_blocks = grpo_prompts.training_dataset(profile, tokenizer=tokenizer)
    assert small_blocks["question"] == one_block["question"] and len(one_block) == 12


def test_prompt_cap_needs_a_tokenizer_and_a_reachable_cap(gsm8k_env, offline_model_and_tokenizer):
    _, tokenizer = offline_model_and_tokenizer
    capped = get_profile("cpu").override(problem_list=None, train_size=8, max_prompt_tokens=80)
    with pytest.raises(ValueError, match="pass the tokenizer"):
        grpo_prompts.training_dataset(capped)
    with pytest.raises(ValueError, match=r"No GSM8K train prompt has at most 20 tokens.*the shortest has \d+"):
        grpo_prompts.training_dataset(capped.override(max_prompt_tokens=20), tokenizer=tokenizer)


def test_prompt_cap_with_too_few_problems_warns(gsm8k_env, offline_model_and_tokenizer):
    _, tokenizer = offline_model_and_tokenizer
    profile = get_profile("cpu").override(problem_list=None, train_size=5000, max_prompt_tokens=72)
    with pytest.warns(UserWarning, match="fewer than train_size=5000"):
        train = grpo_prompts.training_dataset(profile, tokenizer=tokenizer)
    assert 0 < len(train) < 5000


def test_solution_steps_keep_the_easier_problems_in_file_order(
    gsm8k_env, gsm8k_dir, offline_model_and_tokenizer, capsys
):
    _, tokenizer = offline_model_and_tokenizer
    profile = get_profile("cpu").override(problem_list=None, train_size=30, max_solution_steps=2,
                                          max_prompt_tokens=None)  # fmt: skip
    train = grpo_prompts.training_dataset(profile, tokenizer=tokenizer)
    assert "Problems of at most 2 solution steps:" in capsys.readouterr().out
    expected = []  # independently: the raw file in order, counting the lines before ####
    for line in (gsm8k_dir / "train.jsonl").read_text().splitlines():
        row = json.loads(line)
        if sum(1 for text in row["answer"].split("####")[0].splitlines() if text.strip()) <= 2:
            expected.append(row["question"].strip())
        if len(expected) == 30:
            break
    assert train["question"] == expected
    both = grpo_prompts.training_dataset(profile.override(max_prompt_tokens=80), tokenizer=tokenizer)
    assert len(both) == 30
    assert all(solution_steps(text) <= 2 for text in both["reasoning"])
    warm = warm_start_dataset(profile.override(max_prompt_tokens=80))
    assert not {row["prompt"][-1]["content"] for row in warm} & set(both["question"])


def test_solution_steps_count_the_worked_lines_and_refuse_what_is_not_text():
    assert solution_steps("He has 3 + 4 = <<3+4=7>>7.\n\nSo 7 * 2 = <<7*2=14>>14.\n#### 14") == 2
    assert solution_steps("#### 5") == 0
    with pytest.raises(TypeError, match="worked solution as text"):
        solution_steps(None)


def test_an_unreachable_step_limit_is_refused(gsm8k_env):
    with pytest.raises(ValueError, match="No GSM8K train problem has at most 0 solution steps"):
        grpo_prompts.training_dataset(get_profile("ci").override(max_solution_steps=0, max_prompt_tokens=None))


def test_profile_preset_reaches_the_config(tmp_path):
    """The profile's preset is what trains: "initial" is every reward at its own size, "tuned" its multipliers."""
    assert grpo_config_kwargs("cpu", tmp_path)["reward_weights"] == [1.0] * 5
    tuned = get_profile("ci").override(reward_weights="tuned")
    config = make_grpo_config(tuned, tmp_path)
    assert list(config.reward_weights) == list(DEFAULT_WEIGHTS["tuned"])
    assert grpo_config.max_reward(config) == pytest.approx(4.9)
    with pytest.raises(ValueError, match="unknown weight preset"):
        grpo_config_kwargs(get_profile("ci").override(reward_weights="best"), tmp_path)


def test_saved_weights_reach_the_config(tmp_path, monkeypatch):
    monkeypatch.setenv("COURSE_OUTPUT_DIR", str(tmp_path))
    save_weights([2.0, 0.5, 1.0, 1.0, 0.0])
    config = make_grpo_config("ci", tmp_path / "run", reward_weights=load_weights())
    assert list(config.reward_weights) == [2.0, 0.5, 1.0, 1.0, 0.0]


def test_max_reward_follows_the_weights(tmp_path):
    assert grpo_config.max_reward() == pytest.approx(4.0)
    config = make_grpo_config("ci", tmp_path, reward_weights=[1.0, 0.0, 1.0, 0.0, 1.0])
    assert grpo_config.max_reward(config) == pytest.approx(2.0 + 0.5 + 0.5)


def test_missing_trained_model_says_which_notebook(gsm8k_env):
    with pytest.raises(FileNotFoundError, match="04_train_grpo"):
        trained_model.load_trained_model("ci")


# --- Real runs ----------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.long  # over 20 s; notebooks 02-05 run the same path in make test
def test_ci_run_end_to_end(gsm8k_env):
    """Warm start, a real 3-step GRPO run in the ci profile, dashboard, artifacts, save and reload."""
    profile = get_profile("ci")
    model, tokenizer = load_model_and_tokenizer(profile)
    model = warm_start(model, tokenizer, profile)
    assert getattr(model.config, trained_model.WARM_START_MARKER)["examples"] == profile.warm_start_examples
    dashboard = LiveDashboard(show=False)
    run_dir = training.clear_run_dir(trained_model.default_run_dir(profile))
    trainer = training.build_trainer(model, tokenizer, profile, callbacks=[dashboard])
    with cpu_speed.enabled(trainer, profile=profile) as speedups:
        assert speedups.active == cpu_speed.PARTS, "the ci profile runs the cpu lab's speed-ups"
        trainer.train()
    assert trainer.state.global_step == profile.max_steps
    assert cpu_speed.installed() == () and "generate" not in trainer.model.__dict__, "put back after training"
    assert dashboard.redraws == profile.max_steps
    logs = training_logs(trainer.state.log_history)
    assert len(logs) == profile.max_steps and all(math.isfinite(e["reward"]) for e in logs)
    paths = save_run_artifacts(trainer.state.log_history, run_dir)
    assert paths["csv"].is_file() and paths["png"].is_file()
    folder = trained_model.save_final(trainer, tokenizer)
    assert folder == trained_model.final_model_dir(profile)
    assert (folder / "model.safetensors").is_file(), "a warm-started LoRA run is merged into a full model"
    reloaded, tok = trained_model.load_trained_model(profile)
    assert tok.padding_side == "left" and not hasattr(reloaded, "peft_config")


class _Crash(TrainerCallback):
    """Simulates a killed process: raises when the given step begins (after earlier checkpoints were saved)."""

    def __init__(self, at_step: int) -> None:
        self.at_step = at_step

    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step == self.at_step:
            raise KeyboardInterrupt(f"simulated kill at step {self.at_step}")


@pytest.mark.slow
@pytest.mark.long  # over 10 s: make test-slow
def test_interrupted_run_resumes_to_the_same_final_step(gsm8k_env):
    profile = get_profile("ci").override(  # one prompt's group per step: resuming is what is tested here
        warm_start_examples=0,
        max_steps=4,
        save_steps=2,
        max_completion_length=8,
        beta=0.0,
        per_device_train_batch_size=2,
    )
    run_dir = training.clear_run_dir(trained_model.default_run_dir(profile))

    model, tokenizer = load_model_and_tokenizer(profile)
    trainer = training.build_trainer(model, tokenizer, profile, callbacks=[_Crash(at_step=3)])
    with pytest.raises(KeyboardInterrupt):
        trainer.train(resume_from_checkpoint=get_last_checkpoint(str(run_dir)))  # None: nothing to resume yet
    assert Path(get_last_checkpoint(str(run_dir))).name == "checkpoint-2"

    model, tokenizer = load_model_and_tokenizer(profile)
    resumed = training.build_trainer(model, tokenizer, profile)
    resumed.train(resume_from_checkpoint=get_last_checkpoint(str(run_dir)))  # transformers' own resume
    assert resumed.state.global_step == profile.max_steps
    steps = [e["step"] for e in training_logs(resumed.state.log_history)]
    assert steps == [1, 2, 3, 4], "log history keeps the steps before the kill, once each"


@pytest.mark.slow
def test_qwen2_gpu_path_on_a_tiny_random_model(gsm8k_env, offline_model_and_tokenizer):
    """The colab-t4 path (Qwen2 LoRA targets, config, GRPO step, adapter save/reload) on the CPU."""
    _, tokenizer = offline_model_and_tokenizer
    profile = get_profile("colab-t4").override(
        device="cpu",
        dtype="float32",
        load_in_4bit=False,
        gradient_checkpointing=False,
        num_generations=2,
        per_device_train_batch_size=2,
        gradient_accumulation_steps=1,
        max_completion_length=8,
        max_steps=1,
        train_size=4,
    )
    model = build_tiny_random_model()
    lora = lora_setup.make_lora_config(profile, model)
    assert set(lora.target_modules) == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    kwargs = grpo_config_kwargs(get_profile("colab-t4"))
    assert kwargs["fp16"] and kwargs["activation_checkpointing"]
    trainer = training.build_trainer(model, tokenizer, profile)
    callbacks = {type(callback).__name__ for callback in trainer.callback_handler.callbacks}
    assert "ReuseFreedMemory" not in callbacks, "GPU profiles leave the C allocator alone"
    trainer.train()
    folder = trained_model.save_final(trainer, tokenizer)
    assert (folder / "adapter_config.json").is_file() and not (folder / "model.safetensors").is_file()
    reloaded = PeftModel.from_pretrained(build_tiny_random_model(), folder)
    saved, loaded = get_peft_model_state_dict(trainer.model), get_peft_model_state_dict(reloaded)
    assert saved.keys() == loaded.keys() and any("q_proj" in key for key in saved)
    assert all(torch.equal(saved[key].float(), loaded[key].float()) for key in saved)


# --- GPU profile fields, vLLM colocate and run tracking ----------------------------------------------


@pytest.mark.parametrize("name", ["colab-t4", "gpu"])
def test_gpu_profiles_mask_truncated_completions_in_the_config(name, tmp_path):
    config = make_grpo_config(name, tmp_path, fp16=False, bf16=False, use_cpu=True, use_vllm=False)
    assert config.mask_truncated_completions and config.max_completion_length == get_profile(name).max_completion_length
    assert config.learning_rate == get_profile(name).learning_rate


def test_vllm_colocate_fields_are_real_grpo_fields(monkeypatch, tmp_path):
    """Where vLLM is installed the gpu profile colocates it; the field names must be GRPOConfig's (TRL 1.16)."""
    monkeypatch.setattr(grpo_config, "vllm_available", lambda: True)  # vLLM itself cannot be installed here
    kwargs = grpo_config_kwargs("gpu", tmp_path)
    assert kwargs["use_vllm"] and kwargs["vllm_mode"] == "colocate"
    assert kwargs["vllm_gpu_memory_utilization"] == get_profile("gpu").vllm_gpu_memory_utilization
    assert {"use_vllm", "vllm_mode", "vllm_gpu_memory_utilization"} <= set(GRPOConfig.__dataclass_fields__)
    assert not grpo_config_kwargs("colab-t4", tmp_path)["use_vllm"], "the T4 profile generates with transformers"


def test_missing_vllm_is_said_when_the_profile_asks_for_it(tmp_path, capsys):
    if grpo_config.vllm_available():
        pytest.skip("vllm is installed here")
    assert grpo_config_kwargs("gpu", tmp_path)["use_vllm"] is False
    assert 'pip install ".[vllm]"' in capsys.readouterr().out
    grpo_config_kwargs("ci", tmp_path)
    assert capsys.readouterr().out == ""


def test_report_to_turns_on_tensorboard_and_refuses_unknown_trackers():
    assert grpo_config.report_to_targets("ci") == []
    assert grpo_config.report_to_targets(get_profile("ci").override(report_to="tensorboard")) == ["tensorboard"]
    with pytest.raises(ValueError, match=r"not one of \['none', 'tensorboard', 'trackio'\]"):
        grpo_config.report_to_targets(get_profile("ci").override(report_to="tensorbord"))


def test_report_to_a_tracker_that_is_not_installed_names_the_install(monkeypatch):
    monkeypatch.setitem(grpo_config.RUN_TRACKERS, "trackio", "trackio_package_not_installed")
    with pytest.raises(ValueError, match="pip install trackio_package_not_installed"):
        grpo_config.report_to_targets(get_profile("ci").override(report_to="trackio"))


@pytest.mark.slow
def test_tensorboard_run_writes_event_files_that_read_back(gsm8k_env, offline_model_and_tokenizer):
    """report_to="tensorboard": TRL's own logging writes event files in the run folder, with the reward in them."""
    _, tokenizer = offline_model_and_tokenizer
    profile = get_profile("ci").override(
        report_to="tensorboard",
        lora_top_layers=None,
        max_prompt_tokens=None,
        max_steps=2,
        train_size=4,
        max_completion_length=8,
        save_steps=100,
    )
    trainer = training.build_trainer(build_tiny_random_model(), tokenizer, profile)
    trainer.train()
    events = sorted((gsm8k_env / "outputs" / "grpo-ci" / "runs").rglob("events.out.tfevents.*"))
    assert events, "no TensorBoard event files in the run folder"
    reader = EventAccumulator(str(events[0].parent))
    reader.Reload()
    assert [e.step for e in reader.Scalars("train/reward")] == [1, 2]


def test_clear_run_dir_deletes_an_earlier_run_but_keeps_the_warm_start_and_empty_folders(tmp_path):
    (tmp_path / "checkpoint-2").mkdir()
    (tmp_path / "checkpoint-2" / "model.safetensors").write_text("weights")
    (tmp_path / "log_history.csv").write_text("step,reward\n")
    (tmp_path / run_folder.WARM_START_DIRNAME).mkdir()
    (tmp_path / run_folder.WARM_START_DIRNAME / "config.json").write_text("{}")
    (tmp_path / "completions").mkdir()  # made by a GRPOTrainer with log_completions=True, before the clearing
    (tmp_path / run_folder.MARKER_FILENAME).write_text("{}")  # the course made this folder
    training.clear_run_dir(tmp_path)
    kept = [run_folder.LOCK_FILENAME, "completions", run_folder.MARKER_FILENAME, run_folder.WARM_START_DIRNAME]
    assert sorted(child.name for child in tmp_path.iterdir()) == kept
    assert (tmp_path / run_folder.WARM_START_DIRNAME / "config.json").exists()
