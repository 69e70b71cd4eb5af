"""`make course`: every notebook executed headless, in order, into build/ with its outputs and a timing."""

from __future__ import annotations

import json

import nbformat

from course_utils import runner


def test_course_notebooks_are_found_in_order_in_both_copies():
    names = [path.name for path in runner.course_notebooks()]
    assert names == sorted(names) and names[0] == "00_setup.ipynb"
    assert runner.course_notebooks()[0].parent.name == "solutions"
    learners = runner.course_notebooks(runner.repo_root() / "notebooks")
    assert [path.name for path in learners] == names


def test_an_unknown_copy_is_refused(tmp_path):
    import pytest

    with pytest.raises(ValueError, match="copy must be one of"):
        runner.run_course(tmp_path, copy="answers")


def _write_notebook(path, source):
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell(source)]
    nbformat.write(notebook, path)


def test_execute_notebook_writes_outputs_and_times_it(tmp_path):
    source = tmp_path / "01_demo.ipynb"
    _write_notebook(source, "print(6 * 7)")
    seconds = runner.execute_notebook(source, tmp_path / "build")
    executed = json.loads((tmp_path / "build" / "01_demo.ipynb").read_text())
    assert seconds > 0
    assert "42" in "".join(executed["cells"][0]["outputs"][0]["text"])


def test_a_failing_notebook_stops_the_run_with_a_message(tmp_path, monkeypatch, capsys):
    _write_notebook(tmp_path / "00_broken.ipynb", "raise RuntimeError('boom')")
    monkeypatch.setattr(runner, "course_notebooks", lambda folder=None: [tmp_path / "00_broken.ipynb"])
    assert runner.main(["--output", str(tmp_path / "build")]) == 1
    assert "boom" in capsys.readouterr().err
