"""Paths come from the course's location, never from the current directory; each can be moved by a variable."""

from __future__ import annotations

from pathlib import Path

from course_utils import paths


def test_repo_root_holds_the_notebooks_whatever_the_working_directory(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    assert (paths.repo_root() / "notebooks" / "00_setup.ipynb").is_file()
    assert paths.data_dir() == paths.repo_root() / "data"


def test_output_and_cache_dirs_follow_their_variables(monkeypatch, tmp_path):
    monkeypatch.setenv("COURSE_OUTPUT_DIR", str(tmp_path / "out"))
    monkeypatch.setenv("COURSE_CACHE_DIR", str(tmp_path / "cache"))
    assert paths.output_dir() == tmp_path / "out" and (tmp_path / "out").is_dir()
    assert paths.cache_dir() == tmp_path / "cache" and (tmp_path / "cache").is_dir()


def test_default_output_dir_is_the_ignored_outputs_folder(monkeypatch):
    monkeypatch.delenv("COURSE_OUTPUT_DIR", raising=False)
    assert paths.output_dir() == paths.repo_root() / "outputs"
    assert "outputs/" in (paths.repo_root() / ".gitignore").read_text().split()


def test_default_cache_is_under_the_user_cache(monkeypatch, tmp_path):
    monkeypatch.delenv("COURSE_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert paths.cache_dir() == Path(tmp_path) / "grpo-course"
