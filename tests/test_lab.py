"""The whole-run helpers: the ci-sized stand-in profile, and finding notebook 04's result before training anything."""

from __future__ import annotations

import pytest

from course_utils.core.profiles import get_profile
from course_utils.training import lab
from course_utils.training.grpo_config import GenerationBatchError
from course_utils.training.lab import SHORT_RUN_FIELDS, short_run_profile, trained_model_or_short_run
from course_utils.training.trained_model import default_run_dir
from course_utils.training.trained_model import final_model_dir as trained_model_dir


def test_short_run_profile_uses_ci_sizes_under_its_own_name() -> None:
    short = short_run_profile("cpu")
    assert short.name == "cpu-short" and short.model_id == get_profile("cpu").model_id
    for field in SHORT_RUN_FIELDS:
        assert getattr(short, field) == getattr(get_profile("ci"), field), field
    assert short_run_profile(short) is short
    assert trained_model_dir(short) != trained_model_dir("cpu")


@pytest.fixture
def outputs(tmp_path, monkeypatch):
    monkeypatch.setenv("COURSE_OUTPUT_DIR", str(tmp_path))
    return tmp_path


def test_notebook_04s_result_is_used_first(outputs, capsys) -> None:
    folder = trained_model_dir("cpu")
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    assert trained_model_or_short_run("cpu") == (folder, False)
    assert "Trained model found" in capsys.readouterr().out


def test_a_short_run_on_disk_is_reused_without_training(outputs, capsys) -> None:
    folder = trained_model_dir(short_run_profile("cpu"))
    folder.mkdir(parents=True)
    (folder / "adapter_config.json").write_text("{}")
    assert trained_model_or_short_run("cpu") == (folder, True)
    said = capsys.readouterr().out
    assert "Run notebooks/04_train_grpo.ipynb with COURSE_PROFILE=cpu first" in said
    assert "Fallback: the stand-in short run already on disk" in said


def test_a_bad_setting_leaves_the_previous_run_on_disk(outputs, monkeypatch) -> None:
    """``run_training`` builds the config, the model and the trainer before it clears the run folder."""
    profile = get_profile("ci").override(warm_start_examples=0)
    earlier = default_run_dir(profile) / "checkpoint-2"
    earlier.mkdir(parents=True)
    loaded = []
    monkeypatch.setattr(lab, "load_model_for_training", lambda p: loaded.append(p) or (object(), object()))
    with pytest.raises(GenerationBatchError):  # the config: 3 completions make no whole group of 2
        lab.run_training(profile.override(per_device_train_batch_size=3))
    assert not loaded, "a bad config stops the run before the model is loaded"

    def refuse(*args, **kwargs):
        raise ValueError("the trainer refuses this model")

    monkeypatch.setattr(lab, "build_trainer", refuse)
    with pytest.raises(ValueError, match="refuses"):
        lab.run_training(profile)
    assert loaded and earlier.is_dir(), "the previous run's checkpoint is still there"


def test_config_overrides_reach_the_grpo_config_and_a_wrong_name_stops_before_loading(outputs, monkeypatch) -> None:
    """``run_training(profile, seed=1)``: the same warm start, another GRPO run (bench-heldout's HELDOUT_SEED)."""
    profile = get_profile("ci").override(warm_start_examples=0)
    loaded, configs = [], []
    monkeypatch.setattr(lab, "load_model_for_training", lambda p: loaded.append(p) or (object(), object()))
    with pytest.raises(ValueError, match=r"GRPOConfig has no field\(s\) \['sede'\]"):
        lab.run_training(profile, sede=1)
    assert not loaded, "a misspelt field stops the run before the model is loaded"

    def capture(model, tokenizer, p, config, callbacks):
        configs.append(config)
        raise RuntimeError("captured")

    monkeypatch.setattr(lab, "build_trainer", capture)
    with pytest.raises(RuntimeError, match="captured"):
        lab.run_training(profile, seed=7)
    assert configs[0].seed == 7 and configs[0].num_generations == profile.num_generations


def test_a_torn_final_model_is_named_with_its_rebuild_not_run_notebook_04(outputs, capsys) -> None:
    import torch
    from safetensors.torch import save_file

    final = trained_model_dir("cpu")
    partial = final.with_name("final.partial")  # a kill or a full disk while notebook 04 saved final/
    partial.mkdir(parents=True)
    (partial / "adapter_config.json").write_text("{}")
    checkpoint = final.with_name("checkpoint-40")  # the finished run's last checkpoint, the one a rebuild loads
    checkpoint.mkdir()
    save_file({"w": torch.zeros(2)}, str(checkpoint / "adapter_model.safetensors"))
    (checkpoint / "trainer_state.json").write_text('{"global_step": 40, "log_history": []}')
    short = trained_model_dir(short_run_profile("cpu"))
    short.mkdir(parents=True)
    (short / "adapter_config.json").write_text("{}")
    trained_model_or_short_run("cpu")
    said = capsys.readouterr().out
    assert "final is missing or incomplete (only final.partial on disk" in said
    assert "Rebuild it from checkpoint-40: " in said and "train_grpo.py --profile cpu --output-dir" in said
    assert "--resume" in said
