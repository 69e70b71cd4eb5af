"""The verdicts printed by both copies of the course, executed by nbmake under ``ci`` (``make test``).

``make test`` copies ``solutions/`` and ``notebooks/`` into ``build/executed/``, executes both with
``pytest --nbmake --overwrite`` (``scripts/execute_copies.py``) and then runs this file with
``COURSE_EXECUTED_NOTEBOOKS`` set to that folder.
Every check prints one verdict line that starts with its icon and the exercise's number (``✅ 01.3 ...``):
in the solutions every one passes, in the learner copies every one reads "not answered yet", and both
copies print the same checks.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from pathlib import Path

import nbformat
import pytest

pytestmark = pytest.mark.executed
VERDICT = re.compile(r"^(✅|❌|⏳) (\d\d(?:\.\d+)?)\b", re.M)
FOLDER = os.environ.get("COURSE_EXECUTED_NOTEBOOKS", "")


def printed_text(path: Path) -> str:
    """Everything the executed notebook printed (streams and text results), cell after cell."""
    parts = []
    for cell in nbformat.read(path, as_version=4).cells:
        for output in cell.get("outputs", []):
            if output.get("output_type") == "stream":
                parts.append(output.get("text", ""))
            elif "data" in output:
                parts.append(output["data"].get("text/plain", ""))
    return "\n".join(parts)


def verdicts(path: Path) -> list[tuple[str, str]]:
    """``(icon, exercise)`` for every verdict line the notebook printed."""
    return [(match[1], match[2]) for match in VERDICT.finditer(printed_text(path))]


def executed(copy: str) -> list[Path]:
    if not FOLDER:
        pytest.skip("COURSE_EXECUTED_NOTEBOOKS is not set: `make test` sets it after executing both copies")
    paths = sorted((Path(FOLDER) / copy).glob("[0-9][0-9]_*.ipynb"))
    assert paths, f"no executed notebooks in {Path(FOLDER) / copy}"
    return paths


def verdicts_other_than(copy: str, icon: str) -> dict[str, list[str]]:
    """Per executed notebook of ``copy``, the verdicts whose icon is not ``icon``."""
    found = {}
    for path in executed(copy):
        bad = [f"{mark} {exercise}" for mark, exercise in verdicts(path) if mark != icon]
        if bad:
            found[path.name] = bad
    return found


def test_every_check_in_the_solutions_passes():
    failed = verdicts_other_than("solutions", "✅")
    assert not failed, f"checks that did not pass in solutions/: {failed}"


def test_every_check_in_the_learner_copies_reads_not_answered_yet():
    answered = verdicts_other_than("notebooks", "⏳")
    assert not answered, f"checks in notebooks/ that did not read 'not answered yet': {answered}"


def test_both_copies_print_the_same_checks():
    solutions = {p.name: Counter(e for _, e in verdicts(p)) for p in executed("solutions")}
    learners = {p.name: Counter(e for _, e in verdicts(p)) for p in executed("notebooks")}
    assert solutions == learners
    assert sum(map(len, solutions.values())) >= 20, f"too few checks found: {solutions}"
