"""core.rehearsal and scripts/rehearse.py: the GPU profiles on a CPU, only what a CPU cannot do changed, and said."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from course_utils.core import rehearsal
from course_utils.core.profiles import PROFILES, get_profile

REPO = Path(__file__).resolve().parents[1]
# What the rehearsal must keep as the GPU run has it: the settings a workshop's run depends on
KEPT = (
    "model_id", "model_source", "num_generations", "per_device_train_batch_size", "gradient_accumulation_steps",
    "mask_truncated_completions", "beta", "learning_rate", "temperature", "use_lora",
    "load_in_4bit", "lora_r", "lora_alpha", "lora_target_modules", "lora_top_layers", "gradient_checkpointing",
    "warm_start_examples", "reward_weights", "pass_k_samples",
)  # fmt: skip


@pytest.fixture
def rehearsing(monkeypatch):
    monkeypatch.setenv(rehearsal.REHEARSAL_ENV_VAR, "1")
    monkeypatch.setattr(rehearsal, "_SAID", set())


@pytest.mark.parametrize("value, expected", [("1", True), ("true", True), ("ON", True), ("", False), ("0", False)])
def test_the_switch_reads_on_and_off(monkeypatch, value, expected):
    monkeypatch.setenv(rehearsal.REHEARSAL_ENV_VAR, value)
    assert rehearsal.rehearsal_requested() is expected


def test_a_mistyped_switch_is_an_error_naming_it(monkeypatch):
    monkeypatch.setenv(rehearsal.REHEARSAL_ENV_VAR, "ture")
    with pytest.raises(ValueError, match=r"COURSE_REHEARSAL='ture'.*export COURSE_REHEARSAL=1"):
        rehearsal.rehearsal_requested()


@pytest.mark.parametrize("name", ["ci", "cpu", "cpu-long"])
def test_profiles_that_run_on_a_cpu_are_never_changed(name, rehearsing):
    assert rehearsal.rehearsal_changes(PROFILES[name]) == []
    assert get_profile(name) is PROFILES[name]


@pytest.mark.parametrize("name", ["colab-t4", "gpu"])
def test_a_gpu_profile_keeps_its_own_run_settings(name, rehearsing, capsys):
    rehearsed, original = get_profile(name), PROFILES[name]
    for field in KEPT:
        assert getattr(rehearsed, field) == getattr(original, field), field
    assert rehearsed.device == "cpu" and rehearsed.dtype == "float32" and not rehearsed.use_vllm
    assert rehearsed.max_steps < original.max_steps and rehearsed.save_steps == 1


def test_each_change_is_said_once_as_rehearsal_and_gpu_value(rehearsing, capsys):
    get_profile("gpu")
    lines = capsys.readouterr().out.splitlines()
    changed = {c.field for c in rehearsal.rehearsal_changes(PROFILES["gpu"])}
    assert len(lines) == len(changed) and {"device", "dtype", "use_vllm", "max_steps"} <= changed
    assert "rehearsal: dtype='float32', no bf16 autocast: a CPU trains the rehearsal in fp32 (on the GPU: " \
           "dtype='bfloat16')" in lines  # fmt: skip
    assert all(line.startswith("rehearsal: ") and "(on the GPU: " in line for line in lines)
    get_profile("gpu")
    assert capsys.readouterr().out == ""


def test_the_t4_profile_says_its_fp16_autocast(rehearsing, capsys):
    get_profile("colab-t4")
    out = capsys.readouterr().out
    assert "no fp16 autocast" in out and "use_vllm" not in out  # colab-t4 never uses vLLM: nothing to say


def test_without_the_switch_the_gpu_profiles_are_their_own(monkeypatch):
    monkeypatch.delenv(rehearsal.REHEARSAL_ENV_VAR, raising=False)
    assert get_profile("colab-t4") is PROFILES["colab-t4"]


def test_config_differences_name_only_what_the_rehearsal_changed(load_script, rehearsing):
    script = load_script("rehearse")
    differences = script.config_differences("colab-t4")
    assert differences["fp16"] == (True, False) and differences["use_cpu"] == (False, True)
    assert differences["max_steps"] == (250, 2)
    assert "num_generations" not in differences and "mask_truncated_completions" not in differences


def test_the_t4_model_loads_in_4bit_trains_its_adapters_and_generates():
    """bitsandbytes' NF4 on this CPU, from the folder make installs it into (never .venv): seconds, so in make test."""
    packages = os.environ.get("REHEARSAL_PACKAGES", str(REPO / "build" / "rehearse-packages"))
    assert (Path(packages) / "bitsandbytes").is_dir(), f"no bitsandbytes in {packages}: run `make rehearse-packages`"
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "rehearse.py"), "--quick"], capture_output=True,
                          text=True, timeout=300, env={**os.environ, "REHEARSAL_PACKAGES": packages})  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    lines = dict(line.split(": ", 1) for line in done.stdout.splitlines() if line.startswith("rehearsal_quick"))
    assert lines["rehearsal_quick"] == "passed"
    assert int(lines["rehearsal_quick_linear_4bit_layers"]) == 14  # 7 projections x 2 layers, all in NF4
    # r=16 times (inputs + outputs) of q, k, v, o (64->64, 64->32, 64->32, 64->64) and gate, up, down (64->128 x2,
    # 128->64), in each of the 2 layers
    projections = (64 + 64) + (64 + 32) * 2 + (64 + 64) + (64 + 128) * 3
    assert int(lines["rehearsal_quick_trainable_parameters"]) == 2 * 16 * projections
    assert int(lines["rehearsal_quick_adapters_with_a_gradient"]) > 0
    assert lines["rehearsal_quick_tokens_generated"] == "4"


@pytest.mark.long
def test_make_rehearse_passes_both_profiles_with_4bit_layers():
    done = subprocess.run(["make", "rehearse"], cwd=REPO, capture_output=True, text=True, timeout=900)
    lines = dict(line.split(": ", 1) for line in done.stdout.splitlines() if line.startswith("rehearsal_"))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert lines["rehearsal_colab-t4"] == "passed" and lines["rehearsal_gpu"] == "passed"
    assert int(lines["rehearsal_colab-t4_linear_4bit_layers"]) > 0
    assert int(lines["rehearsal_gpu_linear_4bit_layers"]) == 0
    for name in ("colab-t4", "gpu"):
        assert int(lines[f"rehearsal_{name}_steps"]) == 3  # two in notebook 04, one resumed
        assert int(lines[f"rehearsal_{name}_trainable_parameters"]) > 0
    evaluated = (REPO / "build" / "rehearsal" / "colab-t4" / "05_evaluate.ipynb").read_text()
    assert "Merge lora module to 4-bit" not in evaluated  # the 4-bit run is evaluated as it trained


@pytest.mark.parametrize(
    ("package", "message"),
    [(None, r"bitsandbytes, which is not in .*make rehearse-packages` installs the pinned bitsandbytes into "
            r"build/rehearse-packages \(not into .venv"),
     ("raise ImportError('libbitsandbytes_cpu.so: cannot open shared object file')",
      r"bitsandbytes in .* cannot be imported \(ImportError: libbitsandbytes_cpu.so.*rm -rf build/rehearse-packages")],
)  # fmt: skip
def test_the_rehearsal_without_a_working_bitsandbytes_says_what_to_install_and_where(tmp_path, package, message):
    if package is not None:
        (tmp_path / "bitsandbytes").mkdir()
        (tmp_path / "bitsandbytes" / "__init__.py").write_text(package)
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "rehearse.py"), "--quick"], capture_output=True,
                          text=True, timeout=300, env={**os.environ, "REHEARSAL_PACKAGES": str(tmp_path)})  # fmt: skip
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert re.search(message, done.stderr), done.stderr[-2000:]
    assert "pip install -U bitsandbytes" not in done.stderr


def test_make_rehearse_stops_at_the_first_failed_profile_with_one_summary_line(load_script, monkeypatch, tmp_path,
                                                                               capsys):
    script = load_script("rehearse")
    tried = []

    def fails(profile_name, workdir, build):
        tried.append(profile_name)
        raise RuntimeError("notebook 04 failed:\nline two\nline three")

    monkeypatch.setattr(script, "rehearse_profile", fails)
    assert script.main(["--profiles", "gpu", "gpu", "--build", str(tmp_path)]) == 1
    assert tried == ["gpu"]
    out = capsys.readouterr().out
    assert "rehearsal_gpu: failed (RuntimeError: notebook 04 failed: line two line three)\n" in out
    assert "stopped at the first failed profile (gpu)" in out


def test_without_bitsandbytes_the_rehearsal_stops_before_any_profile_naming_make_rehearse_packages(
        load_script, monkeypatch, tmp_path):  # fmt: skip
    """The check decides before minutes of notebooks: transformers' own advice would install it into .venv."""
    script = load_script("rehearse")
    find_spec = script.importlib.util.find_spec
    monkeypatch.setattr(script.importlib.util, "find_spec",
                        lambda name, *a: None if name == "bitsandbytes" else find_spec(name, *a))  # fmt: skip
    monkeypatch.setenv("REHEARSAL_PACKAGES", str(tmp_path))
    monkeypatch.setattr(sys, "path", list(sys.path))  # main puts the packages' folder first
    tried = []
    monkeypatch.setattr(script, "rehearse_profile", lambda name, *args: tried.append(name) or {})
    with pytest.raises(SystemExit) as stopped:
        script.main(["--profiles", "colab-t4", "gpu", "--build", str(tmp_path)])
    assert tried == []
    message = str(stopped.value.code)
    assert f"not in {tmp_path}" in message and "`make rehearse-packages`" in message, message
    assert "build/rehearse-packages (not into .venv" in message and "pip install -U" not in message
    assert script.main(["--profiles", "gpu", "--build", str(tmp_path)]) == 0 and tried == ["gpu"]
