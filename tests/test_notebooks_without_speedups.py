"""The CPU plug-in is optional: with ``COURSE_CPU_SPEEDUPS=0`` every notebook runs under ``ci`` and nothing is patched.

Each notebook runs in a fresh kernel with one cell added at its end, which fails the notebook when the plug-in
installed any part at any time (``cpu_speed.ever_installed``) or when anything it could replace is not the
original: ``torch.multinomial``, TRL's log-prob functions, transformers' attention registry. Minutes in all, so
``make test-slow``; ``make test`` runs the same notebooks with the plug-in on.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from course_utils import cpu_speed

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((REPO / "notebooks").glob("[0-9][0-9]_*.ipynb"))

NOTHING_PATCHED = """
import torch
import trl.trainer.utils as trl_utils
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from course_utils import cpu_speed

assert cpu_speed.ever_installed() == (), f"patched with COURSE_CPU_SPEEDUPS=0: {cpu_speed.ever_installed()}"
assert torch.multinomial is torch._C._VariableFunctions.multinomial, torch.multinomial
for name in ("_use_triton", "_ChunkedLogProbFunction"):
    assert getattr(trl_utils, name).__module__.startswith("trl."), (name, getattr(trl_utils, name))
course_keys = [key for key in [*ALL_ATTENTION_FUNCTIONS, *ALL_MASK_ATTENTION_FUNCTIONS] if "course" in key]
assert not course_keys, course_keys
print("nothing patched")
"""


def executed_with_the_check(path: Path) -> nbformat.NotebookNode:
    """Execute ``path`` in a fresh kernel (which inherits this process's environment) with the check cell appended."""
    notebook = nbformat.read(path, as_version=4)
    notebook.cells.append(nbformat.v4.new_code_cell(NOTHING_PATCHED))
    NotebookClient(notebook, timeout=900, resources={"metadata": {"path": str(path.parent)}}).execute()
    return notebook


@pytest.mark.long
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[path.stem for path in NOTEBOOKS])
def test_a_notebook_runs_with_the_plug_in_switched_off_and_nothing_patched(path, tmp_path, monkeypatch):
    for name, value in {"COURSE_CPU_SPEEDUPS": "0", "COURSE_PROFILE": "ci", "HF_HUB_OFFLINE": "1"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("COURSE_OUTPUT_DIR", str(tmp_path))
    executed = executed_with_the_check(path)
    last_output = "".join(output.get("text", "") for output in executed.cells[-1].outputs)
    assert "nothing patched" in last_output


def test_the_check_cell_passes_on_originals_and_fails_once_a_part_was_installed():
    """The appended cell is not a formality: it passes in a clean process state and raises after an install."""
    before = set(cpu_speed._EVER)
    cpu_speed._EVER.clear()
    try:
        exec(NOTHING_PATCHED, {})
        cpu_speed._EVER.add("group_generation")
        with pytest.raises(AssertionError, match="patched with COURSE_CPU_SPEEDUPS=0"):
            exec(NOTHING_PATCHED, {})
    finally:
        cpu_speed._EVER.clear()
        cpu_speed._EVER.update(before)
