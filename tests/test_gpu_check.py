"""scripts/gpu_check.py (`make gpu-check`): one line and exit 0 without a GPU; its set-ups and figures."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "gpu_check.py"


@pytest.fixture(scope="module")
def gpu_check(load_script):
    return load_script("gpu_check")


def test_without_a_gpu_it_says_so_in_one_line_and_exits_0():
    done = subprocess.run(
        [sys.executable, str(SCRIPT)],
        capture_output=True,
        text=True,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "gpu-check: no CUDA GPU on this machine (torch sees none), nothing to measure; run it where a GPU is."
    ]
    assert not (REPO / "benchmarks" / "results_gpu.txt").exists() or "gpu: " in (
        REPO / "benchmarks" / "results_gpu.txt"
    ).read_text()  # no GPU: no results file written over a real one


def test_make_target_runs_the_script():
    makefile = (REPO / "Makefile").read_text()
    assert "gpu-check: setup" in makefile and "scripts/gpu_check.py" in makefile


def test_vllm_setup_only_where_vllm_is_installed(gpu_check):
    assert gpu_check.setups_to_run(False) == ["colab-t4", "gpu", "gpu-tools"]
    assert gpu_check.setups_to_run(True) == ["colab-t4", "gpu", "gpu-vllm", "gpu-tools"]


def test_the_tiny_stand_in_always_and_the_real_model_where_it_can_be_had(gpu_check):
    assert gpu_check.models_to_run(None, hub_reachable=False) == ["tiny"]
    assert gpu_check.models_to_run("/models/Qwen2.5-0.5B-Instruct", hub_reachable=False) == ["tiny", "real"]
    assert gpu_check.models_to_run(None, hub_reachable=True) == ["tiny", "real"]


@pytest.mark.parametrize("bf16", [True, False])
def test_profiles_follow_the_card_and_keep_their_own_run(gpu_check, bf16):
    from course_utils.core.profiles import PROFILES

    quantized = gpu_check.check_profile("colab-t4", bf16, steps=3)
    t4 = PROFILES["colab-t4"]
    assert quantized.load_in_4bit and quantized.use_lora and quantized.max_steps == 3
    assert quantized.dtype == ("bfloat16" if bf16 else "float16")
    assert quantized.model_id == t4.model_id and quantized.model_source == "hub"
    assert quantized.max_completion_length == t4.max_completion_length and quantized.mask_truncated_completions
    assert quantized.train_size == 3 * quantized.prompts_per_step
    vllm = gpu_check.check_profile("gpu-vllm", bf16, steps=2)
    assert vllm.use_vllm and vllm.effective_batch_size == PROFILES["gpu"].effective_batch_size


def test_step_figures_leave_the_warm_up_step_out(gpu_check):
    history = [
        {"step_time": 9.0, "completions/mean_length": 100.0, "step": 1},
        {"step_time": 2.0, "completions/mean_length": 200.0, "step": 2},
        {"step_time": 4.0, "completions/mean_length": 400.0, "step": 3},
        {"train_runtime": 15.0},
    ]
    figures = gpu_check.step_figures(history, completions_per_step=16)
    assert figures["step_time_s"] == 3.0 and figures["steps_measured"] == 2
    assert figures["completion_tokens_per_s"] == pytest.approx(300.0 * 16 / 3.0)
    with pytest.raises(ValueError, match="no step with step_time"):
        gpu_check.step_figures([{"train_runtime": 1.0}], 16)


def test_lines_are_name_value_pairs(gpu_check):
    lines = gpu_check.format_lines("gpu.tiny.", {"step_time_s": 1.23456, "use_vllm": False, "steps_measured": 2})
    assert lines == ["gpu.tiny.step_time_s: 1.235", "gpu.tiny.use_vllm: False", "gpu.tiny.steps_measured: 2"]


def test_tool_figures_read_the_last_logged_tool_step(gpu_check):
    history = [
        {"step": 1, "tools/call_frequency": 0.0, "tools/failure_frequency": 0.0},
        {"step": 2, "tools/call_frequency": 0.5, "tools/failure_frequency": 0.25},
        {"train_runtime": 3.0},
    ]
    assert gpu_check.tool_figures(history) == {"tools_call_frequency_last": 0.5, "tools_failure_frequency_last": 0.25}
    assert gpu_check.tool_figures([{"step": 1, "reward": 0.0}]) == {}


def test_the_tool_setup_trains_notebook_08s_run_on_the_tiny_qwen2(gpu_check, gsm8k_env, tmp_path, monkeypatch):
    """The ``gpu-tools`` set-up's trainer on a CPU: the ``gpu`` profile's tool run (Qwen2.5's own template, the
    calculator, the tool reward) on the tiny Qwen2 stand-in, in float32 and cut to one short step."""
    from course_utils.lesson.tiny_qwen import save_tiny_qwen

    monkeypatch.setenv("COURSE_MODEL_DIR", str(save_tiny_qwen(tmp_path / "tiny-qwen2")))
    profile = gpu_check.check_profile("gpu-tools", bf16=False, steps=1).override(
        device="cpu", dtype="float32", num_generations=2, per_device_train_batch_size=2, gradient_accumulation_steps=1,
        max_completion_length=16, max_tool_calling_iterations=1, train_size=2)  # fmt: skip
    trainer, context = gpu_check.setup_trainer("gpu-tools", profile)
    assert [f.__name__ for f in trainer.reward_funcs][-1] == "tool_use_reward"
    with context:
        trainer.train()
    figures = gpu_check.tool_figures(trainer.state.log_history)
    assert 0.0 <= figures["tools_call_frequency_last"] <= 1.0
    assert 0.0 <= figures["tools_failure_frequency_last"] <= 1.0


# --- --full-size, --emulate-t4 and --precision -----------------------------------------------------------------------


def test_the_new_options_without_a_gpu_say_so_and_fail():
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--full-size", "--emulate-t4"],
        capture_output=True,
        text=True,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
        timeout=300,
    )
    assert done.returncode == 1
    assert done.stdout == ""
    assert "gpu-check --full-size --emulate-t4: these options measure a CUDA GPU, and torch sees none" in done.stderr


def test_a_precision_asked_for_without_a_gpu_fails_too(gpu_check, capsys):
    args = gpu_check.parse_args(["--precision", "fp16"])
    assert gpu_check.without_gpu(args) == 1
    assert "gpu-check --precision fp16: these options measure a CUDA GPU" in capsys.readouterr().err
    assert gpu_check.without_gpu(gpu_check.parse_args([])) == 0, "the plain check passes: nothing to measure"


def test_an_emulated_t4_refuses_bf16_before_anything_runs(gpu_check, capsys):
    with pytest.raises(SystemExit) as exit_:
        gpu_check.main(["--emulate-t4", "--precision", "bf16", "--full-size"])
    assert exit_.value.code == 2
    assert "a T4 has no bf16" in capsys.readouterr().err


def test_precision_follows_the_card_the_request_and_the_emulated_t4(gpu_check):
    assert gpu_check.uses_bf16("colab-t4", "auto", emulate_t4=True, card_bf16=True) is False
    assert gpu_check.uses_bf16("gpu", "auto", emulate_t4=True, card_bf16=True) is True, "gpu trains as the card allows"
    assert gpu_check.uses_bf16("colab-t4", "auto", emulate_t4=False, card_bf16=True) is True
    assert gpu_check.uses_bf16("gpu", "fp16", emulate_t4=False, card_bf16=True) is False
    assert gpu_check.uses_bf16("gpu", "auto", emulate_t4=False, card_bf16=False) is False
    with pytest.raises(ValueError, match="a T4 has no bf16"):
        gpu_check.uses_bf16("colab-t4", "bf16", emulate_t4=True, card_bf16=True)
    with pytest.raises(ValueError, match="this GPU has no bf16"):
        gpu_check.uses_bf16("gpu", "bf16", emulate_t4=False, card_bf16=False)


def test_the_t4_cap_is_a_t4s_share_of_a_bigger_gpu(gpu_check):
    from course_utils.core.hardware import GPU_MEMORY_GB

    assert GPU_MEMORY_GB["T4"] == 15.0
    assert gpu_check.t4_memory_fraction(80.0) == pytest.approx(15.0 / 80.0)
    for too_small in (15.0, 14.7):
        with pytest.raises(ValueError, match="emulate on a bigger GPU"):
            gpu_check.t4_memory_fraction(too_small)


def test_full_size_trains_the_gpu_profiles_on_the_stand_in(gpu_check):
    assert gpu_check.models_to_run(None, hub_reachable=False, full_size=True) == ["tiny", "full"]
    assert gpu_check.models_to_run("/models/Qwen", hub_reachable=False, full_size=True) == ["tiny", "full", "real"]
    assert gpu_check.setups_for("full", vllm_installed=True) == ["colab-t4", "gpu"]
    assert gpu_check.setups_for("tiny", vllm_installed=False) == gpu_check.setups_to_run(False)


def test_at_full_size_every_completion_is_scored(gpu_check):
    for setup in ("colab-t4", "gpu"):
        assert gpu_check.check_profile(setup, bf16=False, steps=2).mask_truncated_completions
        full = gpu_check.check_profile(setup, bf16=False, steps=2, full_size=True)
        assert not full.mask_truncated_completions
        assert full.max_completion_length == gpu_check.check_profile(setup, False, 2).max_completion_length


def test_the_full_size_setup_runs_every_completion_to_the_cap(gpu_check, gsm8k_env, tmp_path, monkeypatch):
    """The ``gpu`` set-up at full size through the real ``GRPOTrainer`` on a CPU: the full-size stand-in's vocabulary
    (151,936 rows, sampled ids past the tokenizer decoded for the rewards) at toy hidden sizes, one short step."""
    from course_utils.lesson.tiny_qwen import full_size_config, save_full_size_qwen

    toy = full_size_config(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                           num_key_value_heads=1)  # fmt: skip
    monkeypatch.setenv("COURSE_MODEL_DIR", str(save_full_size_qwen(tmp_path / "full", config=toy)))
    profile = gpu_check.check_profile("gpu", bf16=False, steps=1, full_size=True).override(
        device="cpu", dtype="float32", num_generations=2, per_device_train_batch_size=2, gradient_accumulation_steps=1,
        max_completion_length=8, train_size=2)  # fmt: skip
    trainer, context = gpu_check.setup_trainer("gpu", profile)
    with context:
        trainer.train()
    figures = gpu_check.step_figures(trainer.state.log_history, profile.effective_batch_size)
    assert figures["completion_mean_length"] == 8
    clipped = [e["completions/clipped_ratio"] for e in trainer.state.log_history if "completions/clipped_ratio" in e]
    assert clipped == [1.0], "every completion reached the cap, and each was scored"
