"""scripts/execute_copies.py: both copies executed side by side, each with its own output folder."""

from __future__ import annotations

import json

import nbformat
import pytest


@pytest.fixture
def execute_copies(load_script):
    return load_script("execute_copies")


def test_prepare_copies_both_folders_and_gives_each_an_empty_output_folder(execute_copies, tmp_path):
    target = tmp_path / "executed"
    (target / "stale").mkdir(parents=True)
    execute_copies.prepare(target)
    assert not (target / "stale").exists()
    for copy in ("solutions", "notebooks"):
        names = sorted(p.name for p in (target / copy).glob("*.ipynb"))
        assert names == sorted(p.name for p in (execute_copies.ROOT / copy).glob("*.ipynb"))
        assert list((target / f"outputs-{copy}").iterdir()) == []


def test_each_copy_runs_with_its_own_output_folder_and_keeps_its_outputs(execute_copies, tmp_path):
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell("import os\nprint(os.environ['COURSE_OUTPUT_DIR'])")]
    (tmp_path / "solutions").mkdir()
    nbformat.write(notebook, tmp_path / "solutions" / "00_demo.ipynb")
    (tmp_path / "outputs-solutions").mkdir()
    assert execute_copies.start("solutions", tmp_path, threads=1).wait() == 0
    executed = json.loads((tmp_path / "solutions" / "00_demo.ipynb").read_text())
    assert "".join(executed["cells"][0]["outputs"][0]["text"]).strip() == str(tmp_path / "outputs-solutions")
