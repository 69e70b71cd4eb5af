"""The whole-run helpers: the ci-sized stand-in profile, and finding notebook 04's result before training anything."""

from __future__ import annotations

import pytest

from course_utils.core.profiles import get_profile
from course_utils.training.lab import SHORT_RUN_FIELDS, short_run_profile, trained_model_or_short_run
from course_utils.training.run import final_model_dir as trained_model_dir


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
    assert "run notebook 04" in said and "short run already on disk" in said
