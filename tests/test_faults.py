"""The fault suite: bad inputs and interrupts a hurried learner meets, each with a clear error or kept work.

Nothing lost (a typo never deletes a run, an interrupt keeps its steps), nothing silent (a wrong ``GSM8K_DIR``
never becomes the sample, a stale warm start is never reused), and every bad input named with its fix.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from course_utils.core.field_checks import FieldValueError, check_value_types
from course_utils.core.profiles import get_profile
from course_utils.evaluation.curves import load_curve, save_curve
from course_utils.lesson import offline_model
from course_utils.lesson.data import load_gsm8k
from course_utils.lesson.rewards.weights import grpo_reward_weights, load_weights, resolve_weights
from course_utils.training import preflight, run_folder
from course_utils.training import warm_start as warm
from course_utils.training.grpo_config import make_grpo_config
from course_utils.training.lab import trained_label
from course_utils.training.run_callbacks import StopOnInterrupt
from course_utils.training.run_logs import load_log_history, save_run_artifacts

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "train_grpo.py"


@pytest.fixture(scope="module")
def script(load_script):
    return load_script("train_grpo")


def checkpoint(run_dir: Path, step: int, log_rows: int | None = None) -> Path:
    """A complete checkpoint as the trainer writes it: weights, optimizer state, then ``trainer_state.json``."""
    import torch
    from safetensors.torch import save_file

    folder = run_dir / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    save_file({"w": torch.zeros(2)}, str(folder / "adapter_model.safetensors"))
    (folder / "optimizer.pt").write_bytes(b"state")
    history = [{"step": s, "reward": 0.5} for s in range(1, (step if log_rows is None else log_rows) + 1)]
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": step, "log_history": history}))
    return folder


def earlier_run(run_dir: Path) -> dict[str, str]:
    """A run folder as a finished run of the course leaves it: its marker, a checkpoint, the final model, the log."""
    checkpoint(run_dir, 2)
    run_folder.claim(run_dir)
    not_saved = ["optimizer.pt", "trainer_state.json"]  # the final model: the weights alone, as save_final leaves it
    shutil.copytree(run_dir / "checkpoint-2", run_dir / "final", ignore=lambda *_: not_saved)
    (run_dir / "final" / "course_run.json").write_text('{"kind": "lora-adapter", "global_step": 2}')
    (run_dir / "final" / "adapter_config.json").write_text("{}")
    (run_dir / "log_history.csv").write_text("step,reward\n1,0.5\n")
    return snapshot(run_dir)


def snapshot(run_dir: Path) -> dict[str, bytes]:
    """Every file of a folder and its bytes; the run lock aside (it holds no data, and a run may have held it)."""
    files = [p for p in sorted(run_dir.rglob("*")) if p.is_file() and p.name != run_folder.LOCK_FILENAME]
    return {str(p.relative_to(run_dir)): p.read_bytes() for p in files}


# --- Validate before destroying -----------------------------------------------------------------------


@pytest.mark.parametrize("flag", [[], ["--overwrite"], ["--resume"]])
def test_a_misspelled_config_field_fails_before_the_earlier_run_is_touched(script, tmp_path, flag):
    before = earlier_run(tmp_path / "run")
    with pytest.raises(SystemExit, match=r"no field\(s\) \['lerning_rate'\]"):
        script.main(["--profile", "ci", "--config", "lerning_rate=1e-4", "--output-dir", str(tmp_path / "run"), *flag])
    assert snapshot(tmp_path / "run") == before


def test_an_earlier_run_is_continued_or_deleted_only_when_asked(script, tmp_path):
    before = earlier_run(tmp_path / "run")
    with pytest.raises(SystemExit, match=r"holds an earlier run.*--resume.*--overwrite"):
        script.main(["--profile", "ci", "--output-dir", str(tmp_path / "run")])
    assert snapshot(tmp_path / "run") == before


def test_resume_and_overwrite_together_are_refused(script, capsys):
    with pytest.raises(SystemExit):
        script.build_parser().parse_args(["--profile", "ci", "--resume", "--overwrite"])
    assert "not allowed with" in capsys.readouterr().err


def test_resume_says_which_checkpoint_or_that_it_starts_at_step_0(script, tmp_path, capsys):
    assert script.checkpoint_to_resume(tmp_path / "new", resume=True) is None
    assert "starting at step 0" in capsys.readouterr().out
    earlier_run(tmp_path / "run")
    found = script.checkpoint_to_resume(tmp_path / "run", resume=True)
    assert found == tmp_path / "run" / "checkpoint-2"
    assert f"continuing from {found} (step 2)" in capsys.readouterr().out


def test_resume_without_a_checkpoint_over_an_earlier_result_is_refused(script, tmp_path):
    (tmp_path / "run" / "final").mkdir(parents=True)
    (tmp_path / "run" / "final" / "config.json").write_text("{}")
    with pytest.raises(SystemExit, match=r"no complete checkpoint-N .* --overwrite"):
        script.checkpoint_to_resume(tmp_path / "run", resume=True)


@pytest.mark.parametrize("change", ["dtype=fp8", "max_steps='ten'", "device=gpu"])
def test_a_bad_profile_value_is_a_clear_exit_before_any_work(script, tmp_path, change):
    before = earlier_run(tmp_path / "run")
    field = change.split("=")[0]
    with pytest.raises(SystemExit, match=f"error: --set: .*{field}="):
        script.main(["--profile", "ci", "--set", change, "--output-dir", str(tmp_path / "run"), "--overwrite"])
    assert snapshot(tmp_path / "run") == before


# --- The course deletes only what it wrote --------------------------------------------------------------


@pytest.fixture
def project(monkeypatch, tmp_path):
    """A learner's project folder, the current folder, with files of its own: nothing may delete them."""
    (tmp_path / "NOTES.md").write_text("my notes")
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "main.py").write_text("print(1)")
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize(
    ("output_dir", "message"),
    [("", r"--output-dir is empty \(an unset variable"), (".", r"'\.' cannot be a run folder: it is empty or '\.'")],
)
def test_an_empty_or_dot_output_dir_with_overwrite_deletes_nothing(script, project, output_dir, message):
    before = snapshot(project)
    with pytest.raises(SystemExit, match=message):
        script.main(["--profile", "ci", "--output-dir", output_dir, "--overwrite"])
    assert snapshot(project) == before


def test_the_outputs_root_is_never_a_run_folder(script, monkeypatch, tmp_path):
    monkeypatch.setenv("COURSE_OUTPUT_DIR", str(tmp_path / "outputs"))
    before = earlier_run(tmp_path / "outputs" / "grpo-ci")
    with pytest.raises(SystemExit, match=r"cannot be a run folder: it is the outputs root"):
        script.main(["--profile", "ci", "--output-dir", str(tmp_path / "outputs"), "--overwrite"])
    assert snapshot(tmp_path / "outputs" / "grpo-ci") == before


def test_a_run_folder_holding_other_files_is_refused_by_name(script, tmp_path):
    before = earlier_run(tmp_path / "run")
    (tmp_path / "run" / "slider_weights.json").write_text("{}")
    with pytest.raises(SystemExit, match=r"holds files a course run does not write \(slider_weights.json\)"):
        script.main(["--profile", "ci", "--output-dir", str(tmp_path / "run"), "--overwrite"])
    assert snapshot(tmp_path / "run") == {**before, "slider_weights.json": b"{}"}


def test_a_folder_the_course_did_not_mark_is_not_cleared(script, tmp_path):
    before = earlier_run(tmp_path / "run")
    (tmp_path / "run" / run_folder.MARKER_FILENAME).unlink()
    with pytest.raises(SystemExit, match=r"was not made by the course .* not cleared"):
        script.main(["--profile", "ci", "--output-dir", str(tmp_path / "run"), "--overwrite"])
    assert snapshot(tmp_path / "run") == {k: v for k, v in before.items() if k != run_folder.MARKER_FILENAME}


def test_a_run_folder_that_is_a_file_is_named(script, tmp_path):
    (tmp_path / "run").write_text("a file")
    with pytest.raises(SystemExit, match=r"run is a file, not a folder"):
        script.main(["--profile", "ci", "--output-dir", str(tmp_path / "run")])


@pytest.mark.parametrize("variable", ["COURSE_OUTPUT_DIR", "COURSE_CACHE_DIR"])
def test_a_course_folder_variable_that_names_a_file_is_named_with_the_fix(monkeypatch, tmp_path, variable):
    from course_utils.core import paths

    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv(variable, str(tmp_path / "a-file"))
    with pytest.raises(
        NotADirectoryError, match=rf"a-file \(set by {variable}\) is a file .*set {variable} to a folder"
    ):
        paths.output_dir() if variable == "COURSE_OUTPUT_DIR" else paths.cache_dir()


def test_the_script_names_an_outputs_folder_that_is_a_file(script, monkeypatch, tmp_path):
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("COURSE_OUTPUT_DIR", str(tmp_path / "a-file"))
    with pytest.raises(SystemExit, match=r"error: .*a-file \(set by COURSE_OUTPUT_DIR\) is a file"):
        script.main(["--profile", "ci", "--output-dir", str(tmp_path / "run")])


@pytest.mark.parametrize("flag", ["--overwrite", "--resume"])
def test_a_mistyped_cpu_speedups_switch_stops_the_run_before_it_touches_the_folder(script, monkeypatch, tmp_path, flag):
    before = earlier_run(tmp_path / "run")
    monkeypatch.setenv("COURSE_CPU_SPEEDUPS", "ture")
    no_warm_start = ["--set", "warm_start_examples=0"]  # else the warm start's training would read the switch first
    with pytest.raises(SystemExit, match=r"COURSE_CPU_SPEEDUPS='ture' is not a switch"):
        script.main(["--profile", "ci", *no_warm_start, "--output-dir", str(tmp_path / "run"), flag])
    assert snapshot(tmp_path / "run") == before


def test_a_mistyped_cpu_speedups_switch_stops_notebook_04s_fresh_start_before_it_clears(monkeypatch, tmp_path):
    """Notebook 04 and the lab clear with training.clear_run_dir; the plug-in reads the switch only later."""
    from course_utils.training.run import clear_run_dir

    before = earlier_run(tmp_path / "run")
    monkeypatch.setenv("COURSE_CPU_SPEEDUPS", "ture")
    with pytest.raises(ValueError, match=r"COURSE_CPU_SPEEDUPS='ture' is not a switch"):
        clear_run_dir(tmp_path / "run")
    assert snapshot(tmp_path / "run") == before


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--vllm-server", "http://localhost:8000"], r"needs vLLM, which is not installed"),
        (["--config", "report_to=wandb"], r"report_to='wandb' needs the 'wandb' package"),
    ],
)
def test_a_flag_whose_package_is_missing_is_refused_before_any_work(script, tmp_path, flags, message):
    package = {"--vllm-server": "vllm", "--config": "wandb"}[flags[0]]
    if _installed(package):
        pytest.skip(f"{package} is installed here: the missing-package message cannot show")
    before = earlier_run(tmp_path / "run")
    with pytest.raises(SystemExit, match=message):
        script.main(["--profile", "ci", "--output-dir", str(tmp_path / "run"), "--overwrite", *flags])
    assert snapshot(tmp_path / "run") == before


def _installed(package: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(package) is not None


def test_clearing_keeps_the_warm_start_and_the_marker_and_deletes_only_course_entries(tmp_path):
    earlier_run(tmp_path / "run")
    (tmp_path / "run" / "warm_start" / "model").mkdir(parents=True)
    save_curve([{"step": 2, "accuracy": 0.5}], tmp_path / "run")  # notebook 05 writes it into the run folder
    run_folder.clear(tmp_path / "run")
    kept = [run_folder.LOCK_FILENAME, run_folder.MARKER_FILENAME, "warm_start"]  # the lock: clearing takes it
    assert sorted(child.name for child in (tmp_path / "run").iterdir()) == kept


def test_the_final_model_is_replaced_only_once_the_new_one_is_complete(tmp_path):
    (tmp_path / "final").mkdir()
    (tmp_path / "final" / "adapter_model.safetensors").write_text("old")
    (tmp_path / "final.partial").mkdir()
    (tmp_path / "final.partial" / "adapter_model.safetensors").write_text("new")
    run_folder.replace_folder(tmp_path / "final.partial", tmp_path / "final")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["final"]
    assert snapshot(tmp_path / "final") == {"adapter_model.safetensors": b"new"}


# --- A checkpoint is complete or ignored ----------------------------------------------------------------


def tear(folder: Path, how: str) -> None:
    """Leave a checkpoint as a kill or a full disk does: only the model card, an empty state, weights cut short."""
    if how == "only README.md":
        for path in folder.iterdir():
            path.unlink()
        (folder / "README.md").write_text("model card")
    elif how == "empty trainer_state.json":
        (folder / "trainer_state.json").write_text("")
    else:
        weights = folder / "adapter_model.safetensors"
        os.truncate(weights, weights.stat().st_size // 2)


@pytest.mark.parametrize("how", ["only README.md", "empty trainer_state.json", "weights cut short"])
def test_resume_skips_a_torn_newest_checkpoint_and_names_it(script, tmp_path, capsys, how):
    earlier_run(tmp_path / "run")
    tear(checkpoint(tmp_path / "run", 3), how)
    found = script.checkpoint_to_resume(tmp_path / "run", resume=True)
    assert found == tmp_path / "run" / "checkpoint-2"
    out = capsys.readouterr().out
    assert "skipping" in out and "checkpoint-3" in out and "continuing from" in out and "(step 2)" in out


def test_a_resume_without_optimizer_state_says_what_it_loses(script, tmp_path, capsys):
    earlier_run(tmp_path / "run")
    (tmp_path / "run" / "checkpoint-2" / "optimizer.pt").unlink()
    script.checkpoint_to_resume(tmp_path / "run", resume=True)
    assert "no optimizer.pt: AdamW restarts" in capsys.readouterr().out


def test_a_finished_run_says_so_and_keeps_its_final_model(script, tmp_path, capsys):
    before = earlier_run(tmp_path / "run")
    final = script.main(["--profile", "ci", "--set", "max_steps=2", "--output-dir", str(tmp_path / "run"), "--resume"])
    assert final == tmp_path / "run" / "final"
    assert "the run is finished (step 2 of max_steps=2)" in capsys.readouterr().out
    assert snapshot(tmp_path / "run") == before


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        (["lora_r=16"], "lora_r"),
        (["num_generations=4", "per_device_train_batch_size=4"], "num_generations"),
        (["warm_start_examples=4"], "warm_start_examples"),
        (["model_id='HuggingFaceTB/SmolLM2-360M-Instruct'"], "model_id"),
        (["per_device_train_batch_size=4"], "per_device_train_batch_size"),
        (["max_completion_length=32"], "max_completion_length"),
        (["train_size=64"], "train_size"),
    ],
)
def test_a_resume_under_other_settings_is_refused_naming_both_values(script, tmp_path, changes, field):
    earlier_run(tmp_path / "run")
    run_folder.claim(tmp_path / "run", run_folder.run_settings(get_profile("ci")))
    before = snapshot(tmp_path / "run")
    old = getattr(get_profile("ci"), field)
    with pytest.raises(SystemExit, match=rf"{field}: the run used {old!r}, this command asks for .*--overwrite"):
        sets = [arg for change in changes for arg in ("--set", change)]
        script.main(["--profile", "ci", *sets, "--output-dir", str(tmp_path / "run"), "--resume"])
    assert snapshot(tmp_path / "run") == before


@pytest.mark.parametrize("how", ["only README.md", "empty trainer_state.json", "weights cut short"])
def test_notebook_04s_resume_sets_a_torn_checkpoint_aside_for_get_last_checkpoint(tmp_path, capsys, how):
    from transformers.trainer_utils import get_last_checkpoint

    earlier_run(tmp_path)
    tear(checkpoint(tmp_path, 3), how)
    assert run_folder.prepare_resume(tmp_path, max_steps=4) == tmp_path / "checkpoint-2"
    assert get_last_checkpoint(str(tmp_path)) == str(tmp_path / "checkpoint-2")
    assert (tmp_path / "checkpoint-3.torn").is_dir()  # kept, under a name the trainer does not resume from
    assert "set aside as torn" in capsys.readouterr().out
    assert run_folder.foreign_entries(tmp_path) == []  # still the course's own: a fresh start clears it


def test_notebook_04s_resume_of_a_finished_run_is_refused(tmp_path):
    earlier_run(tmp_path)
    with pytest.raises(run_folder.RunFolderError, match=r"is finished \(checkpoint-2, step 2 of max_steps=2\)"):
        run_folder.prepare_resume(tmp_path, max_steps=2)
    assert (tmp_path / "final" / "course_run.json").is_file()


def test_notebook_04s_resume_of_a_finished_run_with_a_torn_final_names_the_rebuild(tmp_path, monkeypatch):
    monkeypatch.setenv("COURSE_PROFILE", "cpu")
    run_dir = tmp_path / "grpo-ci"  # notebook 04's folder for the ci profile: the command names that profile
    earlier_run(run_dir)
    (run_dir / "final").rename(run_dir / "final.partial")  # killed while the final model was saved
    with pytest.raises(run_folder.RunFolderError) as refused:
        run_folder.prepare_resume(run_dir, max_steps=2)
    said = str(refused.value)
    assert "is kept" not in said and "only final.partial on disk" in said
    assert re.search(rf"Rebuild final/ from checkpoint-2: (\w+=\S+ )*python scripts/train_grpo.py --profile ci "
                     rf"--output-dir {run_dir} --resume$", said), said  # fmt: skip


def test_a_resume_without_recorded_settings_says_they_are_not_checked(script, tmp_path, capsys):
    earlier_run(tmp_path / "run")  # marked without settings, as notebook 04's clear_run_dir leaves it
    script.check_resume_settings(tmp_path / "run", get_profile("ci"))
    assert "recorded no settings" in capsys.readouterr().out


# --- The log is never shortened ---------------------------------------------------------------------------


def test_a_shorter_log_never_replaces_a_longer_one(tmp_path, capsys):
    rows = [{"step": step, "reward": 0.5} for step in (1, 2, 3)]
    save_run_artifacts(rows, tmp_path)
    before = (tmp_path / "log_history.csv").read_bytes()
    save_run_artifacts(rows[:1], tmp_path)
    assert (tmp_path / "log_history.csv").read_bytes() == before
    assert "kept" in capsys.readouterr().out
    save_run_artifacts([*rows, {"step": 4, "reward": 1.0}], tmp_path)
    assert len(load_log_history(tmp_path / "log_history.csv")) == 4


def test_a_failure_before_any_step_leaves_the_log_and_says_a_way_forward(script, tmp_path, capsys):
    earlier_run(tmp_path / "run")
    before = (tmp_path / "run" / "log_history.csv").read_bytes()
    trainer = SimpleNamespace(state=SimpleNamespace(global_step=0, max_steps=0, log_history=[]), model=object())
    resumed = tmp_path / "run" / "checkpoint-2"
    script.keep_what_was_done(trainer, tmp_path / "run", is_main=True, resumed_from=resumed)
    script.explain_failure(RuntimeError("bad optimizer.pt"), 0, resumed, tmp_path / "run")
    assert (tmp_path / "run" / "log_history.csv").read_bytes() == before
    out = capsys.readouterr().out
    assert "RuntimeError: bad optimizer.pt" in out and "move it out of the run folder" in out


def test_the_log_history_can_be_rebuilt_from_the_newest_complete_checkpoint(tmp_path):
    folder = checkpoint(tmp_path, 3)
    assert [row["step"] for row in run_folder.checkpoint_history(folder)] == [1, 2, 3]


# --- One run per folder -------------------------------------------------------------------------------------


def test_a_run_holds_its_own_lock_again_when_it_clears_its_folder(tmp_path):
    with run_folder.locked(tmp_path), run_folder.locked(tmp_path):
        run_folder.clear(tmp_path)
    with run_folder.locked(tmp_path):  # released when the run ends
        pass


def test_a_killed_run_leaves_no_stuck_lock(tmp_path):
    holder = "import sys, time; from course_utils.training import run_folder as f; from pathlib import Path\n"
    holder += "with f.locked(Path(sys.argv[1])):\n    print('held', flush=True); time.sleep(60)"
    process = subprocess.Popen([sys.executable, "-c", holder, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout.readline().strip() == "held"
        with pytest.raises(run_folder.RunFolderError), run_folder.locked(tmp_path):
            pass
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
    finally:
        process.kill()
    with run_folder.locked(tmp_path):
        pass


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ("temperature=0", r"temperature=0 cannot train: it must be a finite number above 0"),
        ("learning_rate=1e999", r"learning_rate=inf cannot train: it must be a finite number above 0"),
        ("beta=-1.0", r"beta=-1.0 cannot train: it must be 0 \(no reference model\) or"),
    ],
)
def test_a_value_that_cannot_train_is_refused_before_the_earlier_run_is_touched(script, tmp_path, change, message):
    before = earlier_run(tmp_path / "run")
    with pytest.raises(SystemExit, match=message):
        script.main(["--profile", "ci", "--config", change, "--output-dir", str(tmp_path / "run"), "--overwrite"])
    assert snapshot(tmp_path / "run") == before


# --- An interrupt keeps what was done ------------------------------------------------------------------


@pytest.mark.parametrize("number", [signal.SIGINT, signal.SIGTERM])
def test_the_first_ctrl_c_or_sigterm_asks_for_a_checkpoint_and_a_stop_the_second_stops_at_once(number):
    control = SimpleNamespace(should_save=False, should_training_stop=False)
    previous = signal.getsignal(number)
    with StopOnInterrupt() as stop:
        os.kill(os.getpid(), number)
        time.sleep(0.1)
        assert stop.requested
        stop.on_step_end(None, None, control)
        assert control.should_save and control.should_training_stop
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), number)
            time.sleep(0.1)
    assert signal.getsignal(number) is previous


def test_a_failure_mid_run_keeps_a_checkpoint_and_the_log_history(script, tmp_path, capsys):
    saved = []
    trainer = SimpleNamespace(
        state=SimpleNamespace(global_step=3, max_steps=10, log_history=[{"step": 1, "reward": 0.5, "loss": 0.1}]),
        model=object(),
        _save_checkpoint=lambda model, trial: saved.append(checkpoint(tmp_path, 3)),
    )
    script.keep_what_was_done(trainer, tmp_path, is_main=True)
    assert len(saved) == 1 and (tmp_path / "log_history.csv").is_file()
    out = capsys.readouterr().out
    assert "stopped at step 3 of 10" in out and "checkpoint-3" in out and "--resume" in out
    script.keep_what_was_done(trainer, tmp_path, is_main=True)
    assert len(saved) == 1  # a step already checkpointed is not saved twice


def wait_for(process: subprocess.Popen, text: str, timeout: float) -> str:
    """The process's output up to the first line holding ``text`` (fails after ``timeout`` seconds)."""
    seen, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line and process.poll() is not None:
            break
        seen.append(line)
        if text in line:
            return "".join(seen)
    raise AssertionError(f"no {text!r} within {timeout:.0f} s:\n{''.join(seen)[-3000:]}")


def signalled_run(run_dir: Path, signal_number: int) -> tuple[subprocess.Popen, str, list[str], dict[str, str]]:
    """A real 3-step ``ci`` run of the script sent ``signal_number`` once its first step is logged (step 2 running):
    the finished process, its output, and the command and environment that resume it."""
    command = [sys.executable, "-u", str(SCRIPT), "--profile", "ci", "--output-dir", str(run_dir)]
    command += ["--set", "max_steps=3", "--set", "save_steps=3", "--set", "warm_start_examples=0"]
    env = {**os.environ, "OMP_NUM_THREADS": "2", "TQDM_DISABLE": "1"}
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        wait_for(process, "'loss'", timeout=600)
        process.send_signal(signal_number)
        out, _ = process.communicate(timeout=600)
    finally:
        process.kill()
    return process, out, command, env


@pytest.mark.long
def test_a_real_ctrl_c_keeps_a_checkpoint_and_resume_continues_from_it(gsm8k_env):
    """A real ``ci`` run of the script gets SIGINT after its first step, keeps it, and ``--resume`` finishes it."""
    run_dir = gsm8k_env / "run"
    process, out, command, env = signalled_run(run_dir, signal.SIGINT)
    assert process.returncode == 130, out[-3000:]
    assert "stopped at step 2 of 3" in out and "--resume" in out
    assert (run_dir / "checkpoint-2").is_dir() and (run_dir / "log_history.csv").is_file()
    assert not (run_dir / "final").exists()

    done = subprocess.run([*command, "--resume"], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert f"--resume: continuing from {run_dir / 'checkpoint-2'} (step 2)" in done.stdout
    assert "trained 3 steps" in done.stdout
    logged = [row for row in load_log_history(run_dir / "log_history.csv") if "reward" in row]
    assert [int(row["step"]) for row in logged] == [1, 2, 3]


@pytest.mark.long
def test_sigterm_keeps_the_run_and_a_resume_past_a_torn_checkpoint_keeps_every_log_row(gsm8k_env):
    """SIGTERM after the first step keeps a checkpoint and the log; a resume whose newest checkpoint is torn (as
    ``kill -9`` during a save leaves it) or fails to load keeps every row and continues from the complete one."""
    run_dir = gsm8k_env / "run"
    process, out, command, env = signalled_run(run_dir, signal.SIGTERM)
    assert process.returncode == 143, out[-3000:]
    assert "SIGTERM: stopping after the step in progress" in out and "stopped at step 2 of 3" in out
    assert (run_dir / "checkpoint-2" / "trainer_state.json").is_file()
    log = (run_dir / "log_history.csv").read_bytes()
    steps = [int(row["step"]) for row in load_log_history(run_dir / "log_history.csv") if "reward" in row]
    assert steps == [1, 2]

    (run_dir / "checkpoint-3").mkdir()
    (run_dir / "checkpoint-3" / "README.md").write_text("model card")  # a save killed after its first file
    optimizer = run_dir / "checkpoint-2" / "optimizer.pt"
    saved_optimizer = optimizer.read_bytes()
    optimizer.write_bytes(b"not a torch file")
    failed = subprocess.run([*command, "--resume"], capture_output=True, text=True, env=env, timeout=600)
    assert failed.returncode == 1, failed.stdout[-2000:] + failed.stderr[-3000:]
    assert "skipping" in failed.stdout and "checkpoint-3" in failed.stdout
    assert "failed before any new step" in failed.stdout and "move it out of the run folder" in failed.stdout
    assert (run_dir / "log_history.csv").read_bytes() == log

    optimizer.write_bytes(saved_optimizer)
    done = subprocess.run([*command, "--resume"], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert f"continuing from {run_dir / 'checkpoint-2'} (step 2)" in done.stdout
    assert "trained 3 steps" in done.stdout
    logged = [int(row["step"]) for row in load_log_history(run_dir / "log_history.csv") if "reward" in row]
    assert logged == [1, 2, 3]


# --- Saved artefacts carry their settings --------------------------------------------------------------


def fake_sft_trainer(trained: list):
    """An ``SFTTrainer`` stand-in that records that it trained and returns its model unchanged."""

    class Trainer:
        def __init__(self, model, args, train_dataset, processing_class, peft_config):
            self.model, self.train_dataset = model, train_dataset
            self.state = SimpleNamespace(log_history=[{"loss": 1.0}], global_step=1)

        def train(self):
            trained.append(len(self.train_dataset))

    return Trainer


@pytest.fixture
def tiny_warm_start(monkeypatch, tmp_path):
    """A warm start with a tiny model and an SFT stand-in: ``run(profile)`` returns how many trainings ran."""
    from datasets import Dataset

    from course_utils.lesson.models import build_tiny_random_model

    trained: list[int] = []
    monkeypatch.setattr(warm, "SFTTrainer", fake_sft_trainer(trained))
    monkeypatch.setattr(warm, "make_sft_config", lambda profile, **overrides: None)
    monkeypatch.setattr(warm, "warm_start_lora_config", lambda profile, model: None)
    folder = tmp_path / "warm_start" / "model"

    def run(profile, examples=1):
        rows = [{"prompt": [{"role": "user", "content": f"q{i}"}], "completion": []} for i in range(examples)]
        warm.warm_start(build_tiny_random_model(hidden_size=16), None, profile, Dataset.from_list(rows), folder)
        return len(trained)

    return run


def test_a_warm_start_is_reused_only_under_the_same_settings(tiny_warm_start, capsys):
    ci = get_profile("ci")
    assert tiny_warm_start(ci) == 1
    assert tiny_warm_start(ci) == 1
    assert "reusing the warm start from" in capsys.readouterr().out
    changed = ci.override(warm_start_examples=4, warm_start_learning_rate=0.5)
    assert tiny_warm_start(changed, examples=4) == 2
    out = capsys.readouterr().out
    assert "other settings" in out and "warm_start_examples 1 -> 4" in out and "rebuilding" in out
    assert tiny_warm_start(changed, examples=4) == 2  # the rebuilt one now carries the new settings


# --- No silent fallback ---------------------------------------------------------------------------------


def test_a_gsm8k_dir_that_does_not_exist_is_an_error_naming_it(monkeypatch):
    monkeypatch.setenv("GSM8K_DIR", "/nonexistent")
    with pytest.raises(FileNotFoundError, match=r"/nonexistent \(from GSM8K_DIR"):
        load_gsm8k("train", verbose=False)


def test_a_gsm8k_dir_without_test_jsonl_is_an_error_not_the_sample(monkeypatch, tmp_path, gsm8k_dir):
    (tmp_path / "train.jsonl").write_text((gsm8k_dir / "train.jsonl").read_text().splitlines()[0] + "\n")
    monkeypatch.setenv("GSM8K_DIR", str(tmp_path))
    with pytest.raises(FileNotFoundError, match=r"No test.jsonl .*found: \['train.jsonl'\]"):
        load_gsm8k("test", verbose=False)


def test_a_wrong_gsm8k_dir_stops_the_script_before_it_deletes_the_earlier_run(script, monkeypatch, tmp_path):
    before = earlier_run(tmp_path / "run")
    monkeypatch.setenv("GSM8K_DIR", "/nonexistent")
    with pytest.raises(SystemExit, match=r"error: No train.jsonl in /nonexistent \(from GSM8K_DIR"):
        script.main(["--profile", "ci", "--output-dir", str(tmp_path / "run"), "--overwrite"])
    assert snapshot(tmp_path / "run") == before


def test_a_train_split_holding_test_problems_is_refused_before_the_earlier_run_is_touched(
    script, monkeypatch, tmp_path, gsm8k_dir
):
    before = earlier_run(tmp_path / "run")
    data = tmp_path / "gsm8k"
    data.mkdir()
    (data / "test.jsonl").write_text((gsm8k_dir / "test.jsonl").read_text())
    (data / "train.jsonl").write_text((gsm8k_dir / "test.jsonl").read_text())  # a copy of the held-out split
    monkeypatch.setenv("GSM8K_DIR", str(data))
    with pytest.raises(SystemExit, match=r"1319 of the 1319 train problems are also in the test split"):
        script.main(["--profile", "ci", "--output-dir", str(tmp_path / "run"), "--overwrite"])
    assert snapshot(tmp_path / "run") == before


def test_the_sample_is_used_only_when_nothing_was_asked_and_says_so(monkeypatch):
    monkeypatch.delenv("GSM8K_DIR", raising=False)
    with pytest.warns(UserWarning, match="no GSM8K_DIR set .* bundled gsm8k_sample.jsonl"):
        rows = load_gsm8k("test", verbose=False)
    assert "sample" in rows.info.description


# --- Clear errors ------------------------------------------------------------------------------------------


def test_a_utf16_data_file_is_named_with_its_encoding(monkeypatch, tmp_path):
    row = {"question": "1+1?", "answer": "#### 2"}
    (tmp_path / "train.jsonl").write_bytes((json.dumps(row) + "\n").encode("utf-16"))
    monkeypatch.setenv("GSM8K_DIR", str(tmp_path))
    with pytest.raises(ValueError, match=r"train.jsonl is not UTF-8 text: it is UTF-16.*Re-save it as UTF-8"):
        load_gsm8k("train", verbose=False)


def test_rows_with_other_keys_name_the_file_line_and_keys(monkeypatch, tmp_path):
    good = {"question": "1+1?", "answer": "#### 2"}
    bad = {"problem": "2+2?", "solution": "#### 4"}
    (tmp_path / "train.jsonl").write_text(json.dumps(good) + "\n" + json.dumps(bad) + "\n")
    monkeypatch.setenv("GSM8K_DIR", str(tmp_path))
    with pytest.raises(ValueError, match=r"train.jsonl:2 has keys \['problem', 'solution'\].*rename the keys"):
        load_gsm8k("train", verbose=False)


@pytest.mark.parametrize("answer", [42, ["#### 4"], None])
def test_a_row_whose_answer_is_not_text_names_the_file_line_and_key(monkeypatch, tmp_path, answer):
    good = {"question": "1+1?", "answer": "#### 2"}
    (tmp_path / "train.jsonl").write_text(json.dumps(good) + "\n" + json.dumps({"question": "2+2?", "answer": answer}))
    monkeypatch.setenv("GSM8K_DIR", str(tmp_path))
    with pytest.raises(ValueError, match=rf"train.jsonl:2 has 'answer' as a {type(answer).__name__}: .*Quote"):
        load_gsm8k("train", verbose=False)


@pytest.fixture
def cache_folder(monkeypatch, tmp_path):
    """A private offline-model cache folder; the conversion is replaced by a sentinel error that says it started."""
    folder = tmp_path / "cache" / offline_model.MATERIALIZED_NAME
    monkeypatch.setattr(offline_model, "materialized_model_dir", lambda: folder)

    def conversion_started():
        raise RuntimeError("conversion started")

    monkeypatch.setattr(offline_model, "gguf_path", conversion_started)
    return folder


@pytest.mark.parametrize("missing", ["config.json", "tokenizer.json"])
def test_a_cache_missing_a_file_is_rebuilt_not_loaded(cache_folder, missing, capsys):
    import torch
    from safetensors.torch import save_file

    cache_folder.mkdir(parents=True)
    save_file({"w": torch.zeros(2)}, str(cache_folder / "model.safetensors"))
    for name in offline_model.MATERIALIZED_FILES:
        if name not in (missing, "model.safetensors"):
            (cache_folder / name).write_text("{}")
    assert offline_model.cached_model_problem(cache_folder) == f"it is incomplete (missing {missing})"
    with pytest.raises(RuntimeError, match="conversion started"):
        offline_model.materialize_offline_model()
    assert f"missing {missing}" in capsys.readouterr().out


def test_an_unwritable_cache_says_to_set_course_cache_dir_before_any_work(monkeypatch, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    cache = blocker / "cache" / offline_model.MATERIALIZED_NAME
    monkeypatch.setattr(offline_model, "materialized_model_dir", lambda: cache)
    monkeypatch.setattr(offline_model, "gguf_path", lambda: pytest.fail("the conversion started"))
    unwritable = r"not writable.*Set COURSE_CACHE_DIR to a writable folder"
    with pytest.raises(offline_model.ModelUnavailableError, match=unwritable):
        offline_model.materialize_offline_model()


def test_the_prepared_cache_is_readable_by_every_user(tmp_path):
    (tmp_path / "sub").mkdir(mode=0o700)
    weights = tmp_path / "sub" / "model.safetensors"
    weights.write_text("x")
    weights.chmod(0o600)
    offline_model.share_with_all_users(tmp_path)
    assert weights.stat().st_mode & 0o777 == 0o644 and (tmp_path / "sub").stat().st_mode & 0o777 == 0o755


def test_the_real_offline_cache_ends_up_readable_by_every_user():
    folder = offline_model.materialize_offline_model()
    for path in folder.iterdir():
        assert path.stat().st_mode & 0o044 == 0o044, path


def test_get_profile_of_a_non_name_is_a_clear_type_error():
    with pytest.raises(TypeError, match=r"a name \(ci, .*got int 5"):
        get_profile(5)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"dtype": "fp8"}, r"dtype='fp8' is not one of \['float32', 'float16', 'bfloat16'\]"),
        ({"num_generations": "8"}, r"num_generations='8' is a str, but num_generations takes int"),
        ({"use_lora": 1}, r"use_lora=1 is a int, but use_lora takes bool"),
        ({"lora_target_modules": ("q_proj", 3)}, r"takes tuple\[str, \.\.\.\]"),
    ],
)
def test_profile_override_checks_types_and_choices(change, message):
    with pytest.raises(ValueError, match=message):
        get_profile("ci").override(**change)


def test_profile_override_accepts_what_the_fields_allow():
    changed = get_profile("ci").override(learning_rate=1, lora_top_layers=None, reward_weights=(1, 1, 1, 1, 1))
    assert changed.learning_rate == 1 and changed.lora_top_layers is None


def test_config_values_of_the_wrong_type_are_named():
    with pytest.raises(FieldValueError, match=r"config: num_generations='8' is a str, but num_generations takes int"):
        check_value_types({"num_generations": "8", "beta": 0}, {"num_generations": int, "beta": float})


def test_preflight_names_a_quoted_number_in_a_dict_config():
    with pytest.raises(FieldValueError, match=r"preflight.check config: num_generations='8' is a str"):
        preflight.check({"num_generations": "8", "per_device_train_batch_size": 8})


@pytest.mark.parametrize(
    ("weights", "message"),
    [
        ((-1.0, 1, 1, 1, 1), "must be >= 0"),
        ((0, 0, 0, 0, 0), "all zero"),
        ((1e300, 1, 1, 1, 1), "at most 100"),
        ((float("inf"), 1, 1, 1, 1), "finite"),
    ],
)
def test_weights_that_cannot_train_are_refused(weights, message):
    with pytest.raises(ValueError, match=message):
        grpo_reward_weights(weights)


def test_the_reward_lab_may_still_explore_zero_weights():
    assert resolve_weights((0, 0, 0, 0, 0)) == (0, 0, 0, 0, 0)


@pytest.mark.parametrize("content", ["[1.0, 2.0]", '{"correctness_reward_func": -2}', "{not json"])
def test_a_bad_weights_file_is_named_with_the_fix(tmp_path, content):
    path = tmp_path / "reward_weights.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=rf"{path}: (unusable reward weights|not valid JSON) .*save_weights"):
        load_weights(path)


def test_a_truncated_validation_curve_is_named_with_the_fix(tmp_path):
    path = save_curve([{"step": 0, "accuracy": 0.5}, {"step": 2, "accuracy": 0.5}], tmp_path)
    path.write_text(path.read_text()[:20])
    with pytest.raises(ValueError, match=rf"{path} is damaged .*delete it"):
        load_curve(tmp_path)


@pytest.mark.parametrize(("name", "content"), [("trainer_state.json", '{"log_hist'), ("log_history.csv", "")])
def test_a_damaged_log_history_is_named(tmp_path, name, content):
    (tmp_path / name).write_text(content)
    with pytest.raises(ValueError, match=rf"{tmp_path / name} is damaged or not a log history"):
        load_log_history(tmp_path / name)


# --- Rewards that return None, read as TRL reads them ------------------------------------------------------


def test_group_advantages_of_rewards_with_none_are_trls():
    import torch

    from course_utils.lesson.grpo import frac_reward_zero_std, group_advantages
    from course_utils.lesson.trl_grpo import trl_frac_reward_zero_std, trl_group_advantages

    rewards = [1.0, None, 0.0, 2.0, None, None, 0.5, 0.5, 0.5]
    ours = group_advantages(rewards, 3)
    assert torch.allclose(ours, trl_group_advantages(rewards, 3)) and torch.isfinite(ours).all()
    assert ours[1] == 0 and ours[4] == 0  # no reward: no advantage
    assert frac_reward_zero_std(rewards, 3) == pytest.approx(trl_frac_reward_zero_std(rewards, 3))


def test_an_infinite_reward_does_in_trl_what_check_03_8_says():
    """03.8 refuses inf and -inf for what the installed TRL does with them; None passes (TRL skips it)."""
    import torch

    from course_utils.exercises.nb03_reward_functions.own_reward import _value_problem
    from course_utils.lesson.trl_grpo import trl_group_advantages

    rewards = [math.inf, 1.0, 0.0, 0.0]
    assert torch.equal(trl_group_advantages(rewards, 4, "group"), torch.zeros(4))
    assert (trl_group_advantages(rewards, 4, "none")[1:] < -1e38).all()
    assert (trl_group_advantages([-math.inf, 1.0, 0.0, 0.0], 4, "none")[1:] > 1e38).all()
    for value, others in ((math.inf, "-3.4e38"), (-math.inf, "about 3.4e38")):
        why = _value_problem(value)
        assert why is not None and "scale_rewards='group'" in why and others in why and "finite" in why, why
    assert _value_problem(None) is None and _value_problem(math.nan) is not None


def test_the_reward_table_sums_around_a_none_as_trl_does():
    from course_utils.lesson.rewards import scoring

    def sometimes_none(completions, **kwargs):
        return [None if "skip" in c else 1.0 for c in completions]

    def always_none(completions, **kwargs):
        return [None] * len(completions)

    table = scoring.reward_table(["fine", "skip"], "2", funcs=[sometimes_none, always_none], weights=(2.0, 1.0))
    assert table["total"].iloc[0] == 2.0  # the None of always_none adds nothing
    assert math.isnan(table["total"].iloc[1])  # no reward could score it: no total, as in TRL


# --- A damaged warm start, checkpoint or final model is named -------------------------------------------------


def tiny_saved_model(folder: Path, cut_short: bool) -> Path:
    """A tiny full model as ``save_pretrained`` saves it; ``cut_short``: weights end halfway (a kill, a full disk)."""
    from course_utils.lesson.models import build_tiny_random_model

    build_tiny_random_model(vocab_size=64, hidden_size=16, num_layers=1).save_pretrained(folder)
    if cut_short:
        weights = folder / "model.safetensors"
        os.truncate(weights, weights.stat().st_size // 2)
    return folder


def test_a_warm_start_cut_short_is_named_with_the_fix(tmp_path):
    import torch

    folder = tiny_saved_model(tmp_path / "warm_start" / "model", cut_short=True)
    with pytest.raises(ValueError, match=rf"saved warm start in {folder} cannot be loaded .*Delete that folder"):
        warm.load_saved_warm_start(folder, torch.float32)


def test_the_resume_recipe_says_when_there_is_no_saved_warm_start(tmp_path):
    import torch

    with pytest.raises(FileNotFoundError, match=r"No saved warm start in .*run the warm-start cells"):
        warm.load_saved_warm_start(tmp_path / "missing", torch.float32, required=True)


def test_a_final_model_cut_short_is_named_with_the_fix(tmp_path):
    from course_utils.training.trained_model import load_trained_model

    folder = tiny_saved_model(tmp_path / "final", cut_short=True)
    with pytest.raises(ValueError, match=rf"trained model in {folder} cannot be loaded .*Train it again"):
        load_trained_model("ci", folder)


def test_a_final_model_whose_config_does_not_match_its_weights_is_named_with_the_fix(tmp_path):
    from course_utils.training.trained_model import load_trained_model

    folder = tiny_saved_model(tmp_path / "final", cut_short=False)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "intermediate_size": config["intermediate_size"] * 2}))
    with pytest.raises(ValueError, match=rf"trained model in {folder} cannot be loaded: its config.json does not "
                                         r"match its weights' shapes\. Train it again"):  # fmt: skip
        load_trained_model("ci", folder)


# --- A stand-in model is labelled as such -------------------------------------------------------------------


def test_a_stand_in_is_labelled_in_every_table_and_figure_of_notebook_05():
    assert trained_label("after GRPO", True) == "after GRPO (stand-in short run)"
    assert trained_label("after GRPO", False) == "after GRPO"
    notebook = json.loads((REPO / "notebooks" / "05_evaluate.ipynb").read_text(encoding="utf-8"))
    code = "\n".join("".join(c["source"]) for c in notebook["cells"] if c["cell_type"] == "code")
    for label in ('"after GRPO"', '"trained"'):
        uses = code.count(label)
        assert uses == code.count(f"trained_label({label}"), f"{label} used without trained_label"
    assert "is_short_run))" in code  # the validation figure's title too


# --- Round two: a model folder checked whole before any work ----------------------------------------------------


def test_a_model_folder_without_tokenizer_json_stops_the_script_before_the_run_folder_is_touched(
    script, monkeypatch, tmp_path
):
    from course_utils.lesson.tiny_qwen import save_tiny_qwen

    model_dir = save_tiny_qwen(tmp_path / "qwen")
    (model_dir / "tokenizer.json").unlink()  # AutoTokenizer then gives a 3-token tokenizer, without a word
    monkeypatch.setenv("COURSE_MODEL_DIR", str(model_dir))
    monkeypatch.setenv("COURSE_REHEARSAL", "1")  # the gpu profile rehearsed on a CPU, as make rehearse runs it
    before = earlier_run(tmp_path / "run")
    said = rf"COURSE_MODEL_DIR: the tokenizer in {re.escape(str(model_dir))} has 3 tokens .*Point COURSE_MODEL_DIR at"
    for run_dir, flags in ((tmp_path / "run", ["--overwrite"]), (tmp_path / "new", [])):
        with pytest.raises(SystemExit, match=said):
            script.main(["--profile", "gpu", "--output-dir", str(run_dir), *flags])
    assert snapshot(tmp_path / "run") == before and not (tmp_path / "run" / run_folder.LOCK_FILENAME).exists()
    assert not (tmp_path / "new").exists()


# --- Round two: every deletion locked, only the course's own files deleted ------------------------------------


@contextlib.contextmanager
def another_run_holding(run_dir: Path) -> Iterator[SimpleNamespace]:
    """A second process (``holder.py``) holding ``run_dir``'s lock, as a running ``train_grpo.py`` does."""
    holder = run_dir.parent / "holder.py"
    holder.parent.mkdir(parents=True, exist_ok=True)
    holder.write_text("import sys, time; from course_utils.training import run_folder as f; from pathlib import Path\n"
                      "with f.locked(Path(sys.argv[1])):\n    print('held', flush=True); time.sleep(60)\n")  # fmt: skip
    process = subprocess.Popen([sys.executable, str(holder), str(run_dir)], stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout.readline().strip() == "held"
        yield SimpleNamespace(run_dir=run_dir, pid=process.pid)
    finally:
        process.kill()
        process.wait(timeout=30)
        holder.unlink()


@pytest.fixture
def held_by_another_run(tmp_path):
    """``tmp_path / "run"`` held by another process, as a running ``train_grpo.py`` holds its folder."""
    with another_run_holding(tmp_path / "run") as holder:
        yield holder


def in_use_by(holder: SimpleNamespace) -> str:
    """The refusal a locked folder gives: the holder's process and command, nothing changed, the ways forward."""
    return (rf"{re.escape(str(holder.run_dir))} is in use by another run \(process {holder.pid}: holder.py "
            rf".*\); nothing in it was changed. Wait for that run to end or stop it \(kill {holder.pid}\), then try "
            r"again, or give this run another folder")  # fmt: skip


def test_notebook_04s_fresh_start_never_deletes_a_running_scripts_checkpoints(held_by_another_run):
    from course_utils.training.run import clear_run_dir

    before = earlier_run(held_by_another_run.run_dir)
    with pytest.raises(run_folder.RunFolderError, match=in_use_by(held_by_another_run)):
        clear_run_dir(held_by_another_run.run_dir)
    assert snapshot(held_by_another_run.run_dir) == before


def test_notebook_04s_resume_never_sets_aside_a_checkpoint_another_run_is_writing(held_by_another_run):
    run_dir = held_by_another_run.run_dir
    earlier_run(run_dir)
    (run_dir / "checkpoint-3").mkdir()  # the running script's save in progress: no trainer_state.json yet
    (run_dir / "checkpoint-3" / "adapter_model.safetensors").write_bytes(b"being written")
    before = snapshot(run_dir)
    with pytest.raises(run_folder.RunFolderError, match=in_use_by(held_by_another_run)):
        run_folder.prepare_resume(run_dir, max_steps=4)
    assert snapshot(run_dir) == before


@pytest.mark.parametrize("flag", [[], ["--resume"], ["--overwrite"]])
def test_a_second_run_into_a_busy_folder_is_told_it_is_in_use_not_to_resume(script, held_by_another_run, flag):
    before = earlier_run(held_by_another_run.run_dir)
    with pytest.raises(SystemExit, match=in_use_by(held_by_another_run)) as caught:
        script.main(["--profile", "ci", "--output-dir", str(held_by_another_run.run_dir), *flag])
    assert "--resume" not in str(caught.value)
    assert snapshot(held_by_another_run.run_dir) == before


def model_card(run_dir: Path) -> None:
    """The model card TRL's trainer writes at the top of a run folder at each save."""
    (run_dir / "README.md").write_text("---\nlibrary_name: transformers\ntags:\n- generated_from_trainer\n- trl\n"
                                       "- grpo\n---\n\n# Model Card for grpo-ci\n")  # fmt: skip


def test_clearing_deletes_the_course_files_by_name_and_keeps_and_names_a_learners(tmp_path, capsys):
    run_dir = tmp_path / "run"
    earlier_run(run_dir)
    model_card(run_dir)
    board = run_dir / "runs" / "Jan05_10-00-00_host"
    board.mkdir(parents=True)
    (board / "events.out.tfevents.1.host").write_bytes(b"events")
    (run_dir / "runs" / "mine").mkdir()
    (run_dir / "runs" / "mine" / "events.out.tfevents.2.host").write_bytes(b"mine")
    (run_dir / "completions").mkdir()
    (run_dir / "completions" / "completions_00001.parquet").write_bytes(b"rows")
    (run_dir / "completions" / "my_picks.csv").write_text("id\n")
    run_folder.clear(run_dir)
    assert sorted(snapshot(run_dir)) == [
        "completions/my_picks.csv", run_folder.MARKER_FILENAME, "runs/mine/events.out.tfevents.2.host"]  # fmt: skip
    assert "kept in " in (out := capsys.readouterr().out) and "completions/my_picks.csv, runs/mine/" in out


@pytest.mark.parametrize(
    ("place", "named"),
    [("README.md", "README.md"), ("checkpoint-2/my_eval.txt", "checkpoint-2/my_eval.txt"),
     ("final/notes/a.txt", "final/notes/")],
)  # fmt: skip
def test_overwrite_refuses_a_learners_file_a_run_would_overwrite_or_delete(script, tmp_path, place, named):
    before = earlier_run(tmp_path / "run")
    (tmp_path / "run" / place).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / "run" / place).write_text("mine")
    with pytest.raises(SystemExit, match=rf"does not write \({re.escape(named)}\); a run would overwrite or delete"):
        script.main(["--profile", "ci", "--output-dir", str(tmp_path / "run"), "--overwrite"])
    with pytest.raises(run_folder.RunFolderError, match=re.escape(named)):
        run_folder.clear(tmp_path / "run")
    assert snapshot(tmp_path / "run") == {**before, place: b"mine"}


def test_a_damaged_marker_under_overwrite_is_written_anew(script, tmp_path):
    earlier_run(tmp_path / "run")
    (tmp_path / "run" / run_folder.MARKER_FILENAME).write_text("{not json")
    script.check_run_dir(tmp_path / "run", script.build_parser().parse_args(["--profile", "ci", "--overwrite"]))
    run_folder.clear(tmp_path / "run")
    assert run_folder.read_marker(tmp_path / "run") == {"made_by": "grpo-course"}
    assert run_folder.earlier_entries(tmp_path / "run") == []


# --- Round two: "finished" means the final model is there and loads; a full disk is named ----------------------

ONE_STEP = ["--profile", "ci", "--set", "max_steps=1", "--set", "save_steps=1", "--set", "warm_start_examples=0",
            "--set", "max_completion_length=8"]  # fmt: skip


@pytest.fixture(scope="module")
def one_step_run(load_script, tmp_path_factory, gsm8k_dir):
    """A real one-step ``ci`` run of the script (about 20 s): its checkpoint-1, final model, log and marker."""
    run_dir = tmp_path_factory.mktemp("one_step") / "run"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("GSM8K_DIR", str(gsm8k_dir))
        load_script("train_grpo").main([*ONE_STEP, "--output-dir", str(run_dir)])
    return run_dir


@pytest.fixture
def finished_run(one_step_run, tmp_path, gsm8k_dir, monkeypatch):
    monkeypatch.setenv("GSM8K_DIR", str(gsm8k_dir))
    shutil.copytree(one_step_run, tmp_path / "run")
    return tmp_path / "run"


def run_said_command(script, said: str) -> None:
    """Run the ``... python scripts/train_grpo.py ...`` command a message gives, as a learner would paste it."""
    words = shlex.split(said.split(": ", 1)[1] if ": " in said else said)
    start = words.index("python")
    env = dict(word.split("=", 1) for word in words[:start])
    assert words[start + 1] == "scripts/train_grpo.py" and env.get("GSM8K_DIR") == os.environ.get("GSM8K_DIR")
    script.main(words[start + 2:])


def test_a_torn_final_model_is_named_and_rebuilt_by_the_command_notebook_05_gives(script, finished_run, capsys):
    from safetensors.torch import load_file

    from course_utils.training.trained_model import load_trained_model

    (finished_run / "final").rename(finished_run / "final.partial")  # a kill while final/ was saved
    with pytest.raises(FileNotFoundError, match=r"final is missing or incomplete \(only final.partial on disk: .*"
                                                r"Rebuild it from checkpoint-1: .*train_grpo.py --profile ci --set "
                                                r"max_steps=1 .*--resume") as said:  # fmt: skip
        load_trained_model("ci", finished_run / "final")  # notebook 05
    run_said_command(script, str(said.value).split("Rebuild it from ", 1)[1])  # the run's own --set values with it
    out = capsys.readouterr().out
    assert "but " in out and "final is missing or incomplete (only final.partial" in out and "rebuilt " in out
    saved = load_file(finished_run / "final" / "adapter_model.safetensors")
    trained = load_file(finished_run / "checkpoint-1" / "adapter_model.safetensors")
    assert saved.keys() == trained.keys() and all((saved[k] == trained[k]).all() for k in saved)
    load_trained_model("ci", finished_run / "final")
    assert not (finished_run / "final.partial").exists()


def test_a_final_model_older_than_the_finished_runs_last_checkpoint_is_rebuilt_by_resume(script, finished_run,
                                                                                         capsys):
    """A full disk while a run trained further saved its final model: the save's copy is removed, the old stays."""
    info = json.loads((finished_run / "final" / "course_run.json").read_text())
    (finished_run / "final" / "course_run.json").write_text(json.dumps({**info, "global_step": 0}))
    script.main([*ONE_STEP, "--output-dir", str(finished_run), "--resume"])
    out = capsys.readouterr().out
    assert "final holds the model of step 0, not of the run's last step 1" in out and "rebuilt " in out
    assert "is kept" not in out
    assert json.loads((finished_run / "final" / "course_run.json").read_text())["global_step"] == 1


def test_a_final_model_older_than_the_last_checkpoint_is_named_by_notebooks_04_and_05(tmp_path, monkeypatch, capsys):
    from course_utils.training.lab import trained_model_or_short_run
    from course_utils.training.trained_model import older_final_note

    monkeypatch.setenv("COURSE_OUTPUT_DIR", str(tmp_path))
    run_dir = tmp_path / "grpo-ci"  # the ci profile's run folder, where notebook 05 looks
    earlier_run(run_dir)  # final/ saved at step 2
    checkpoint(run_dir, 3)  # trained on to step 3, and the final model's save failed
    with pytest.raises(run_folder.RunFolderError, match=r"final/ holds the model of step 2, not of the run's last step "
                                                        r"3 .*Rebuild final/ from checkpoint-3: .*--profile ci --set "
                                                        r"max_steps=3 --output-dir"):  # fmt: skip
        run_folder.prepare_resume(run_dir, max_steps=3)
    note = older_final_note(run_dir / "final", "ci")
    assert note is not None and "holds the model of step 2" in note and "checkpoint-3 is newer" in note
    assert trained_model_or_short_run("ci") == (run_dir / "final", False)  # notebook 05 evaluates it, and says so
    assert note in capsys.readouterr().out
    shutil.rmtree(run_dir / "checkpoint-3")
    assert older_final_note(run_dir / "final", "ci") is None


def test_a_cut_short_final_model_of_a_run_is_named_with_the_rebuild_command(tmp_path):
    from course_utils.training.trained_model import load_trained_model

    run_dir = tmp_path / "grpo-ci"
    checkpoint(run_dir, 2)
    run_folder.claim(run_dir)
    folder = tiny_saved_model(run_dir / "final", cut_short=True)
    with pytest.raises(ValueError, match=rf"trained model in {folder} cannot be loaded .*Rebuild it from "
                                         r"checkpoint-2: .*train_grpo.py --profile ci --output-dir .* --resume"):
        load_trained_model("ci", folder)


@contextlib.contextmanager
def disk_full_after(size: int) -> Iterator[None]:
    """Writes past ``size`` bytes into a file fail as on a full disk (``RLIMIT_FSIZE``: ``EFBIG``, SIGXFSZ ignored)."""
    import resource

    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, handler)


def test_a_full_disk_while_saving_the_final_model_is_named_and_keeps_the_old_one(finished_run):
    from course_utils.lesson.models import build_tiny_random_model, load_tokenizer
    from course_utils.training.trained_model import save_final

    before = snapshot(finished_run / "final")
    trainer = SimpleNamespace(model=build_tiny_random_model(vocab_size=512), state=SimpleNamespace(global_step=1),
                              args=SimpleNamespace(output_dir=str(finished_run)))  # fmt: skip
    with pytest.raises(OSError, match=r"The final model could not be written to .*final \(SafetensorError: .*MiB "
                                      r"free on that disk\)\. Free space there .* --resume"), disk_full_after(4096):
        save_final(trainer, load_tokenizer("ci"), finished_run / "final")
    assert snapshot(finished_run / "final") == before and not (finished_run / "final.partial").exists()


def test_a_full_disk_while_saving_the_warm_start_is_named(tmp_path):
    from course_utils.lesson.models import build_tiny_random_model
    from course_utils.training.warm_start import finish_warm_start

    trainer = SimpleNamespace(model=build_tiny_random_model(vocab_size=512), train_dataset=[1],
                              state=SimpleNamespace(log_history=[], global_step=1))  # fmt: skip
    with pytest.raises(OSError, match=r"The warm start could not be written to .*model \(SafetensorError"), \
            disk_full_after(4096):  # fmt: skip
        finish_warm_start(trainer, tmp_path / "warm_start" / "model")
    assert not (tmp_path / "warm_start" / "model").exists() and not (tmp_path / "warm_start" / "model.partial").exists()


# --- Round two: resume compares everything that shapes the run; every number's range; the right option named ------


def test_a_resume_after_train_jsonl_changed_is_refused_naming_both_fingerprints(
    script, tmp_path, gsm8k_dir, monkeypatch
):
    data = tmp_path / "gsm8k"
    data.mkdir()
    shutil.copy(gsm8k_dir / "test.jsonl", data / "test.jsonl")
    rows = (gsm8k_dir / "train.jsonl").read_text().splitlines(keepends=True)
    (data / "train.jsonl").write_text("".join(rows))
    monkeypatch.setenv("GSM8K_DIR", str(data))
    earlier_run(tmp_path / "run")
    run_folder.claim(tmp_path / "run", run_folder.run_settings(get_profile("ci")))
    before = snapshot(tmp_path / "run")
    (data / "train.jsonl").write_text("".join(rows[:-1]))  # one problem fewer
    with pytest.raises(SystemExit, match=rf"train_data: the run used '{len(rows)} rows, sha256 \w+', this command "
                                         rf"asks for '{len(rows) - 1} rows, .*--overwrite .*--output-dir"):
        script.main(["--profile", "ci", "--output-dir", str(tmp_path / "run"), "--resume"])
    assert snapshot(tmp_path / "run") == before


def test_the_recorded_command_keeps_the_runs_settings_and_leaves_out_what_a_later_command_changes():
    argv = ["--profile", "ci", "--output-dir", "a", "--set", "max_steps=1", "--resume", "--vllm-server", "http://h:8000",
            "--overwrite", "--output-dir=b", "--vllm-server=http://h", "--config", "seed=3"]  # fmt: skip
    assert run_folder.command_args(argv) == ["--profile", "ci", "--set", "max_steps=1", "--config", "seed=3"]


def test_a_resume_of_an_unfinished_run_under_another_max_steps_is_refused_with_the_setting_to_put_back(script,
                                                                                                     tmp_path):
    earlier_run(tmp_path / "run")  # checkpoint-2 of a run of 4 steps
    run_folder.claim(tmp_path / "run", run_folder.run_settings(get_profile("ci").override(max_steps=4)))
    before = snapshot(tmp_path / "run")
    with pytest.raises(SystemExit, match=r"max_steps: the run used 4, this command asks for 6 \(put it back: --set "
                                         r"max_steps=4, and no --config of it\).*--overwrite .*--output-dir"):
        script.main(["--profile", "ci", "--set", "max_steps=6", "--output-dir", str(tmp_path / "run"), "--resume"])
    assert snapshot(tmp_path / "run") == before


def test_a_finished_run_may_train_further_and_says_what_that_does_to_the_schedule(script, tmp_path, capsys):
    earlier_run(tmp_path / "run")  # checkpoint-2 of a run of 2 steps: finished
    profile = get_profile("ci").override(lr_scheduler_type="linear")
    run_folder.claim(tmp_path / "run", run_folder.run_settings(profile))
    run_dir = tmp_path / "run"
    script.check_resume_settings(run_dir, profile.override(max_steps=5), None, run_dir / "checkpoint-2")
    out = capsys.readouterr().out
    assert "finished its max_steps=2 at step 2; it now trains on to max_steps=5: the linear learning-rate" in out


@pytest.mark.parametrize(
    ("option", "field", "old"),
    [("per_device_train_batch_size=4", "per_device_train_batch_size", 2),
     ("max_completion_length=32", "max_completion_length", 16), ("loss_type=grpo", "loss_type", "dapo"),
     ("seed=7", "seed", 42)],
)  # fmt: skip
def test_a_resume_under_another_config_value_is_refused_naming_both_values(script, tmp_path, option, field, old):
    """--config reaches the GRPOConfig past the profile: its values are compared too, under their own names."""
    earlier_run(tmp_path / "run")
    profile = get_profile("ci")
    run_folder.claim(tmp_path / "run", run_folder.run_settings(profile, make_grpo_config(profile, tmp_path / "run")))
    before = snapshot(tmp_path / "run")
    put_back = "--set" if field in run_folder.CONFIG_VALUE_FIELDS else "--config"
    with pytest.raises(SystemExit, match=rf"{field}: the run used {old!r}, this command asks for .* \(put it back: "
                                         rf"{put_back} {field}={old}[,)].*--overwrite"):  # fmt: skip
        script.main(["--profile", "ci", "--config", option, "--output-dir", str(tmp_path / "run"), "--resume"])
    assert snapshot(tmp_path / "run") == before


def test_a_resume_after_the_problem_list_file_changed_is_refused_naming_both_fingerprints(script, tmp_path,
                                                                                         monkeypatch):
    listing = tmp_path / "cpu-long.json"
    listing.write_text((REPO / "data" / "problem_lists" / "cpu-long.json").read_text())
    monkeypatch.setattr(run_folder, "problem_list_path", lambda name: tmp_path / f"{name}.json")
    earlier_run(tmp_path / "run")
    profile = get_profile("ci").override(problem_list="cpu-long")
    run_folder.claim(tmp_path / "run", run_folder.run_settings(profile))
    listing.write_text(listing.read_text().replace("{", "{ ", 1))  # rescreened: the same name, other problems
    with pytest.raises(SystemExit, match=r"problem_list_file: the run used '\d+ bytes, sha256 \w+', this command asks "
                                         r"for '\d+ bytes, .*put back the .*cpu-long.json the run read.*--overwrite"):
        script.check_resume_settings(tmp_path / "run", profile, None, tmp_path / "run" / "checkpoint-2")


@pytest.mark.parametrize(
    ("change", "field"),
    [("max_steps=-1", "max_steps"), ("eval_max_new_tokens=0", "eval_max_new_tokens"), ("lora_r=0", "lora_r"),
     ("train_size=0", "train_size"), ("eval_batch_size=0", "eval_batch_size"), ("num_generations=1", "num_generations"),
     ("max_prompt_tokens=-5", "max_prompt_tokens"), ("warm_start_epochs=1e999", "warm_start_epochs")],
)  # fmt: skip
def test_every_number_out_of_range_is_refused_under_the_profiles_own_name(script, tmp_path, change, field):
    before = earlier_run(tmp_path / "run")
    with pytest.raises(SystemExit, match=rf"error: --set: Profile: {field}=.* is out of range: it must be a finite"):
        script.main(["--profile", "ci", "--set", change, "--output-dir", str(tmp_path / "run"), "--overwrite"])
    assert snapshot(tmp_path / "run") == before


@pytest.mark.parametrize("option", ["--set", "--config"])
def test_max_steps_minus_one_is_refused_as_epochs_by_either_option(script, tmp_path, option):
    """transformers reads max_steps=-1 as 'train 3 epochs'; the course's runs and --resume count steps."""
    before = earlier_run(tmp_path / "run")
    with pytest.raises(SystemExit, match=r"max_steps=-1 is out of range: .*num_train_epochs \(3\) whole passes.*"
                                         r"count steps; give the number of GRPO steps, for example max_steps=50"):
        script.main(["--profile", "ci", option, "max_steps=-1", "--output-dir", str(tmp_path / "run"), "--overwrite"])
    assert snapshot(tmp_path / "run") == before


@pytest.mark.parametrize("change", ["max_completion_length=0", "save_steps=-2", "max_tool_calling_iterations=0"])
def test_a_profile_number_out_of_range_given_to_config_is_refused_too(script, tmp_path, change):
    """--config reaches GRPOConfig without the profile's checks; the same ranges hold there."""
    with pytest.raises(SystemExit, match=rf"error: --config / --set: GRPOConfig: {change.split('=')[0]}=.* is out "
                                         r"of range: it must be a finite number at least 1"):
        script.main(["--profile", "ci", "--config", change, "--output-dir", str(tmp_path / "run")])
    assert not (tmp_path / "run").exists()


def test_a_profile_field_given_to_config_is_sent_to_set_not_called_a_spelling_error(script, tmp_path):
    with pytest.raises(SystemExit, match=r"\['train_size'\]: they are profile fields.*--set train_size=") as caught:
        script.main(["--profile", "ci", "--config", "train_size=64", "--output-dir", str(tmp_path / "run")])
    assert "spelling" not in str(caught.value)
    with pytest.raises(SystemExit, match=r"\['weight_decay'\] are GRPOConfig fields.*--config weight_decay="):
        script.main(["--profile", "ci", "--set", "weight_decay=0.1", "--output-dir", str(tmp_path / "run")])


def test_a_reward_that_returns_inf_stops_the_run_by_name_and_nan_is_left_to_trl(offline_model_and_tokenizer):
    """TRL leaves NaN (and None) out of its nansum; an inf would make its group's advantages NaN or 0, unsaid."""
    import datasets

    from course_utils.training.run import build_trainer

    def inf_reward(completions, **kwargs):
        return [math.inf if i == 1 else 1.0 for i, _ in enumerate(completions)]

    def nan_reward(completions, **kwargs):
        return [math.nan for _ in completions]

    model, tokenizer = offline_model_and_tokenizer
    rows = datasets.Dataset.from_list([{"prompt": "2+2?", "answer": "4"}] * 2)
    trainer = build_trainer(copy.deepcopy(model), tokenizer, "ci", rows, reward_funcs=[inf_reward, nan_reward],
                            config=make_grpo_config("ci", reward_weights=None, max_steps=1))  # fmt: skip
    assert trainer.reward_func_names == ["inf_reward", "nan_reward"]
    with pytest.raises(ValueError, match=r"'inf_reward' returned inf for completion 2 of 2: a reward must be a finite"):
        trainer.reward_funcs[0](completions=["a", "b"])
    assert all(math.isnan(value) for value in trainer.reward_funcs[1](completions=["a", "b"]))


def test_a_step_finished_without_a_checkpoint_is_said_and_the_way_forward_is_not_a_refused_resume(script, tmp_path,
                                                                                                   capsys):
    """Step 1 finished, but its checkpoint could not be saved (the disk filled): no --resume advice that is refused."""

    def full_disk(model, trial):
        raise OSError(28, "No space left on device")

    trainer = SimpleNamespace(state=SimpleNamespace(global_step=1, max_steps=2, log_history=[{"step": 1, "loss": 0.1}]),
                              model=object(), _save_checkpoint=full_disk)  # fmt: skip
    script.keep_what_was_done(trainer, tmp_path, is_main=True)
    script.explain_failure(RuntimeError("step 2 failed"), 1, None, tmp_path)
    out = capsys.readouterr().out
    assert "no complete checkpoint (step 1 finished, its checkpoint could not be saved (OSError" in out
    assert "no step had finished" not in out and "--resume" not in out and "--overwrite" in out
    assert (tmp_path / "log_history.csv").is_file()


# --- Round two, audit: every deletion under the lock, a learner's files kept, the script's own way forward -------


def test_the_lab_refuses_a_folder_another_run_holds_before_it_loads_a_model(monkeypatch, tmp_path):
    """The lab's warm start replaces the folder's saved one: the lock is taken before it, not only at the clearing."""
    from course_utils.training import lab
    from course_utils.training.trained_model import default_run_dir

    monkeypatch.setenv("COURSE_OUTPUT_DIR", str(tmp_path / "outputs"))
    monkeypatch.setattr(lab, "load_model_for_training", lambda *a: pytest.fail("the model loaded before the lock"))
    with another_run_holding(default_run_dir("ci")) as holder:
        before = earlier_run(holder.run_dir)
        with pytest.raises(run_folder.RunFolderError, match=in_use_by(holder)):
            lab.run_training("ci")
        assert snapshot(holder.run_dir) == before


def test_a_save_into_a_folder_another_run_holds_replaces_nothing(held_by_another_run):
    """Notebook 04's final model and warm start replace the folder's saved ones: never a running script's."""
    from course_utils.training.trained_model import save_final, warm_start_model_dir
    from course_utils.training.warm_start import finish_warm_start

    run_dir = held_by_another_run.run_dir
    before = earlier_run(run_dir)
    model = SimpleNamespace(config=SimpleNamespace())
    trainer = SimpleNamespace(model=model, state=SimpleNamespace(global_step=3, log_history=[]), train_dataset=[1],
                              args=SimpleNamespace(output_dir=str(run_dir)))  # fmt: skip
    with pytest.raises(run_folder.RunFolderError, match=in_use_by(held_by_another_run)):
        save_final(trainer, None, run_dir / "final")
    with pytest.raises(run_folder.RunFolderError, match=in_use_by(held_by_another_run)):
        finish_warm_start(trainer, warm_start_model_dir(run_dir))
    assert snapshot(run_dir) == before


def test_a_new_model_folder_keeps_a_learners_files_of_the_old_one_and_names_them(tmp_path, capsys):
    """Only the files a save writes are deleted with the old folder (by name); a kill's leftover copy goes too."""
    final = tmp_path / "final"
    final.mkdir()
    (final / "adapter_model.safetensors").write_bytes(b"old")
    (final / "course_run.json").write_text("{}")
    (final / "my_eval.txt").write_text("mine")
    (final / "notes").mkdir()
    (final / "notes" / "a.txt").write_text("a")
    (tmp_path / "final.partial").mkdir()  # a save cut short by a kill
    (tmp_path / "final.partial" / "adapter_model.safetensors").write_bytes(b"cut")
    with run_folder.written_aside(final, "The final model", "fix") as partial:
        partial.mkdir()  # as save_pretrained makes it
        (partial / "adapter_model.safetensors").write_bytes(b"new")
    assert sorted(child.name for child in tmp_path.iterdir()) == ["final"]
    assert snapshot(final) == {"adapter_model.safetensors": b"new", "my_eval.txt": b"mine", "notes/a.txt": b"a"}
    assert f"kept in {final} (not written by the course): my_eval.txt, notes/" in capsys.readouterr().out


def test_a_damaged_marker_is_written_anew_only_where_no_earlier_run_needs_its_settings(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / run_folder.MARKER_FILENAME).write_text("{not json")  # a fresh run: nothing to check it against
    run_folder.claim(run_dir, {"lora_r": 8}, ["--profile", "ci"])
    assert run_folder.recorded_settings(run_dir) == {"lora_r": 8}
    checkpoint(run_dir, 2)
    (run_dir / run_folder.MARKER_FILENAME).write_text("{not json")
    with pytest.raises(run_folder.RunFolderError, match=r"is damaged .*delete it and pass --resume again .*pass "
                                                        r"--overwrite to start the run again"):  # fmt: skip
        run_folder.claim(run_dir, {"lora_r": 8}, ["--profile", "ci"])
    assert (run_dir / run_folder.MARKER_FILENAME).read_text() == "{not json"


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


@pytest.mark.skipif(_cuda(), reason="a machine with a GPU trains the GPU profiles")
@pytest.mark.parametrize("name", ["colab-t4", "gpu"])
def test_a_gpu_profile_on_a_machine_without_a_gpu_is_named_with_the_scripts_choices(
    script, monkeypatch, tmp_path, name
):
    monkeypatch.delenv("COURSE_REHEARSAL", raising=False)
    before = earlier_run(tmp_path / "run")
    with pytest.raises(SystemExit, match=rf"--profile {name} trains on an NVIDIA GPU .*this machine has none .*"
                                         r"--profile cpu; or rehearse .*COURSE_REHEARSAL=1"):  # fmt: skip
        script.main(["--profile", name, "--output-dir", str(tmp_path / "run"), "--overwrite"])
    assert snapshot(tmp_path / "run") == before


def test_a_hub_profile_offline_without_a_cached_copy_is_told_the_scripts_profile_cpu_before_any_work(
    script, monkeypatch, tmp_path
):
    """``COURSE_PROFILE`` is the notebooks' switch: the script takes ``--profile``."""
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("COURSE_REHEARSAL", "1")  # the GPU profile's code path on this CPU
    monkeypatch.delenv("COURSE_MODEL_DIR", raising=False)
    before = earlier_run(tmp_path / "run")
    with pytest.raises(SystemExit, match=r"--profile colab-t4 loads Qwen/Qwen2.5-0.5B-Instruct from the Hugging Face "
                                         r"Hub, which this machine cannot reach .*no copy of it is cached here\. Train "
                                         r"the CPU lab instead: --profile cpu") as caught:  # fmt: skip
        script.main(["--profile", "colab-t4", "--output-dir", str(tmp_path / "run"), "--overwrite"])
    assert "COURSE_PROFILE" not in str(caught.value)
    assert snapshot(tmp_path / "run") == before


def test_an_unreadable_checkpoint_is_called_unreadable_not_damaged(tmp_path, monkeypatch):
    """As root every file reads: this user's refusal is played by ``os.access`` for checkpoint-3's files."""
    earlier_run(tmp_path / "run")
    unreadable = checkpoint(tmp_path / "run", 3)
    access = os.access
    monkeypatch.setattr(run_folder.os, "access", lambda path, mode: access(path, mode) and unreadable not in
                        Path(path).parents)  # fmt: skip
    problem = run_folder.checkpoint_problem(unreadable)
    assert problem == (f"trainer_state.json, adapter_model.safetensors cannot be read by this user (permission "
                       f"denied: chmod -R a+r {unreadable})")  # fmt: skip
    assert run_folder.checkpoint_problem(tmp_path / "run" / "checkpoint-2") is None


def notebook_cell(notebook: str, needle: str) -> str:
    """The source of the one code cell of ``solutions/<notebook>`` that holds ``needle``."""
    cells = json.loads((Path(__file__).parents[1] / "solutions" / notebook).read_text(encoding="utf-8"))["cells"]
    [source] = ["".join(c["source"]) for c in cells if c["cell_type"] == "code" and needle in "".join(c["source"])]
    return source


class LockProbingTrainer:
    """Stands in for the GRPOTrainer only to ask, mid-``train``, whether another process can take the run folder."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir, self.state, self.other_process_refused = run_dir, SimpleNamespace(global_step=0), None

    def add_callback(self, callback: object) -> None:
        pass

    def train(self, resume_from_checkpoint: str | None = None) -> SimpleNamespace:
        probe = "import sys; from pathlib import Path; from course_utils.training import run_folder as f\n"
        probe += "with f.locked(Path(sys.argv[1])):\n    pass"
        taken = subprocess.run([sys.executable, "-c", probe, str(self.run_dir)], capture_output=True, text=True)
        self.other_process_refused = taken.returncode != 0 and "is in use by another run" in taken.stderr
        return SimpleNamespace(metrics={"train_runtime": 0.0})


def test_notebook_04_holds_the_run_folder_while_its_trainer_trains(tmp_path):
    from course_utils.training import run_callbacks

    cpu_speed = SimpleNamespace(enabled=lambda _: contextlib.nullcontext())  # the plug-in is not what is asked here
    earlier_run(tmp_path / "run")
    trainer = LockProbingTrainer(tmp_path / "run")
    namespace = {"trainer": trainer, "run_dir": tmp_path / "run", "run_callbacks": run_callbacks,
                 "cpu_speed": cpu_speed, "run_folder": run_folder, "get_last_checkpoint": lambda _: None}  # fmt: skip
    exec(notebook_cell("04_train_grpo.ipynb", "trainer.train(resume_from_checkpoint"), namespace)
    assert trainer.other_process_refused is True
    with run_folder.locked(tmp_path / "run"):  # released when training ends
        pass
