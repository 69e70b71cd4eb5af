"""Notebook 03 -> notebook 04: the weights set on the slider lab are the weights GRPOConfig trains with.

The cells are the notebooks' own (found by what they contain), run in two separate kernels as a learner runs
two notebooks: notebook 03 imports, builds the lab, a learner moves two sliders, the save cell writes the
file; then notebook 04's set-up cell and its config cell (the complete notebook's ``GRPOConfig(...)``) run,
and the test reads the config's ``reward_weights``.
"""

from __future__ import annotations

import json

import nbformat
import pytest
from conftest import REPO_ROOT
from nbclient import NotebookClient

NOTEBOOKS = REPO_ROOT / "solutions"  # the complete notebooks: notebook 04's config cell holds a GRPOConfig
MOVED = {"correctness_reward_func": 2.5, "xmlcount_reward_func": 0.0}


def _cell(path: str, needle: str) -> str:
    """The source of the one code cell of ``path`` that contains ``needle``."""
    notebook = nbformat.read(NOTEBOOKS / path, as_version=4)
    found = [c.source for c in notebook.cells if c.cell_type == "code" and needle in c.source]
    assert len(found) == 1, f"{path}: expected one code cell containing {needle!r}, found {len(found)}"
    return found[0]


def _run(sources: list[str]) -> str:
    """Execute the cells in a fresh kernel (cwd: solutions/); return the last cell's printed text."""
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in sources])
    NotebookClient(
        notebook, timeout=240, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOKS)}}
    ).execute()
    return "".join(o.get("text", "") for o in notebook.cells[-1].outputs if o.get("output_type") == "stream")


def _notebook_04_weights() -> list[float]:
    setup_cell = _cell("04_train_grpo.ipynb", "reward_weights = load_weights()")  # imports, profile, weights
    config_cell = _cell("04_train_grpo.ipynb", "config = GRPOConfig(")  # the learner's GRPOConfig(...)
    printed = _run([setup_cell, config_cell, "import json\nprint(json.dumps(list(config.reward_weights)))"])
    return json.loads(printed.strip().splitlines()[-1])


@pytest.mark.slow  # two kernels, each importing trl
@pytest.mark.long  # over 20 s; notebooks 02-05 run the same path in make test
def test_slider_weights_reach_notebook_04_config(tmp_path, monkeypatch):
    monkeypatch.setenv("COURSE_OUTPUT_DIR", str(tmp_path))
    monkeypatch.setenv("COURSE_PROFILE", "ci")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert _notebook_04_weights() == [1.0] * 5  # notebook 03 never ran: the "initial" preset
    moves = "\n".join(f"lab.sliders[{name!r}].value = {value}" for name, value in MOVED.items())
    _run(
        [
            _cell("03_reward_functions.ipynb", "from course_utils.lesson.widgets import"),
            _cell("03_reward_functions.ipynb", 'lab = RewardLab(preset="initial"'),
            moves,
            _cell("03_reward_functions.ipynb", "lab.save()"),
        ]
    )
    assert (tmp_path / "reward_weights.json").is_file()
    assert _notebook_04_weights() == [2.5, 1.0, 1.0, 1.0, 0.0]
