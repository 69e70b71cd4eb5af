"""scripts/train_grpo.py: notebook 04's training from a profile, in one process or several (DDP on CPUs, gloo)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "train_grpo.py"


@pytest.fixture(scope="module")
def script(load_script):
    return load_script("train_grpo")


def test_values_on_the_command_line_become_python_values(script):
    assert script.parse_assignments(["max_steps=5", "learning_rate=2e-4", "report_to=tensorboard"], "--set") == {
        "max_steps": 5,
        "learning_rate": 2e-4,
        "report_to": "tensorboard",
    }
    assert script.parse_value("None") is None and script.parse_value("(1.0, 0.5)") == (1.0, 0.5)


@pytest.mark.parametrize("bad", ["max_steps", "=5", ""])
def test_an_assignment_without_a_field_says_how_to_write_it(script, bad):
    with pytest.raises(SystemExit, match="takes FIELD=VALUE"):
        script.parse_assignments([bad], "--set")


def test_profile_overrides_are_checked_against_the_profile_fields(script):
    changed = script.profile_from_args("ci", {"max_steps": 7, "lora_target_modules": ["q_proj", "v_proj"]})
    assert changed.max_steps == 7 and changed.lora_target_modules == ("q_proj", "v_proj")
    with pytest.raises(SystemExit, match="no field"):
        script.profile_from_args("ci", {"max_step": 7})


def test_a_vllm_server_turns_on_server_mode(script):
    args = script.build_parser().parse_args(["--profile", "gpu", "--vllm-server", "http://10.0.0.2:8000"])
    assert script.config_overrides(args) == {
        "use_vllm": True,
        "vllm_mode": "server",
        "vllm_server_base_url": "http://10.0.0.2:8000",
    }


def test_an_unknown_profile_is_refused_by_the_parser(script, capsys):
    with pytest.raises(SystemExit):
        script.build_parser().parse_args(["--profile", "tpu"])
    assert "invalid choice" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["ddp.yaml", "zero2.yaml"])
def test_accelerate_configs_are_valid(name):
    from accelerate.commands.config.config_args import ClusterConfig

    path = REPO / "configs" / "accelerate" / name
    config = ClusterConfig.from_yaml_file(str(path))
    assert config.num_processes >= 2 and not config.use_cpu
    raw = yaml.safe_load(path.read_text())
    if name == "zero2.yaml":
        assert raw["distributed_type"] == "DEEPSPEED" and raw["deepspeed_config"]["zero_stage"] == 2
    else:
        assert raw["distributed_type"] == "MULTI_GPU"


@pytest.mark.multiprocess
def test_two_processes_train_the_ci_profile_and_save_a_model_that_loads(gsm8k_env):
    """DDP on two CPU processes (torchrun, gloo): the same profile and functions as notebook 04."""
    from course_utils.training.trained_model import load_trained_model

    run_dir = gsm8k_env / "run"
    command = [
        str(Path(sys.executable).parent / "torchrun"),
        "--standalone",
        "--nproc_per_node",
        "2",
        str(SCRIPT),
        "--profile",
        "ci",
        "--set",
        "max_steps=2",
        "--set",
        "warm_start_examples=0",
        "--config",
        "save_strategy=no",
        "--output-dir",
        str(run_dir),
    ]
    started = time.perf_counter()
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=900, env={**os.environ, "OMP_NUM_THREADS": "1"}
    )
    print(f"two-process run: {time.perf_counter() - started:.0f} s")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "trained 2 steps on 2 process(es)" in done.stdout
    final = run_dir / "final"
    assert json.loads((final / "course_run.json").read_text())["global_step"] == 2
    assert (run_dir / "log_history.csv").is_file()
    model, tokenizer = load_trained_model("ci", final)
    assert hasattr(model, "peft_config") and tokenizer.padding_side == "left"


def test_readme_gives_the_multi_gpu_commands_with_files_that_exist():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    section = readme.split("## When one GPU is not enough", 1)[1].split("\n## ", 1)[0]
    for config in re.findall(r"--config_file (\S+)", section):
        assert (REPO / config).is_file(), config
    assert "configs/accelerate/ddp.yaml" in section and "configs/accelerate/zero2.yaml" in section
    assert "trl vllm-serve --model" in section and "--vllm-server http://" in section
    assert "torchrun --standalone --nproc_per_node 2 scripts/train_grpo.py --profile ci" in section
    assert "make test-slow" in readme and re.search(r"^test-slow:", (REPO / "Makefile").read_text(), re.M)
