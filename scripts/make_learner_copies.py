"""Make the learner copies: ``solutions/NN_*.ipynb`` -> ``notebooks/NN_*.ipynb`` (``make notebooks``).

The solutions are the source. Each piece a learner writes sits between ``### BEGIN SOLUTION`` and
``### END SOLUTION``; nbgrader's ``ClearSolutions`` preprocessor replaces every such region with the stub
below and leaves every other line as it is, so shown code, hints and checks are the same in both copies.

The stub is ``...`` rather than nbgrader's ``raise NotImplementedError()``: a region can hold a top-level
answer (``answer_1 = 0.5`` after ``answer_1 = None``), and a raise there would stop the notebook. The checks
read an untouched function body (``...``) or value (``None``) as "not answered yet".

``--check`` writes nothing and exits 1 when a learner copy is out of date (what the tests call too).
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

import nbformat
from nbgrader.preprocessors import ClearSolutions

ROOT = Path(__file__).resolve().parents[1]
SOURCE, TARGET = ROOT / "solutions", ROOT / "notebooks"
BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
STUB = "# YOUR CODE HERE\n..."


def solution_notebooks(folder: Path = SOURCE) -> list[Path]:
    """The source notebooks, in course order."""
    paths = sorted(folder.glob("[0-9][0-9]_*.ipynb"))
    if not paths:
        raise SystemExit(f"error: no NN_name.ipynb notebooks in {folder}")
    return paths


def _check_regions(path: Path, notebook: nbformat.NotebookNode) -> None:
    """Every BEGIN has its END in the same code cell, so nbgrader never swallows the rest of a cell."""
    for index, cell in enumerate(notebook.cells):
        begins, ends = cell.source.count(BEGIN), cell.source.count(END)
        if begins != ends:
            raise SystemExit(f"error: {path.name} cell {index}: {begins} '{BEGIN}' for {ends} '{END}'")
        if begins and cell.cell_type != "code":
            raise SystemExit(f"error: {path.name} cell {index}: a solution region in a {cell.cell_type} cell")


def learner_copy_text(path: Path) -> str:
    """The learner copy of one solution notebook, as the text ``notebooks/`` holds."""
    notebook = nbformat.read(path, as_version=4)
    _check_regions(path, notebook)
    learner = copy.deepcopy(notebook)
    clear = ClearSolutions(code_stub={"python": STUB}, enforce_metadata=False)
    learner, _ = clear.preprocess(learner, {})
    learner.metadata["course"] = {"learner_copy_of": f"solutions/{path.name}", "made_by": "make notebooks"}
    return nbformat.writes(learner) + "\n"


def out_of_date(source: Path = SOURCE, target: Path = TARGET) -> list[str]:
    """The learner copies that differ from what their solution gives, or are missing, or have no solution."""
    expected = {path.name: learner_copy_text(path) for path in solution_notebooks(source)}
    stale = [name for name, text in expected.items()
             if not (target / name).is_file() or (target / name).read_text(encoding="utf-8") != text]
    orphans = [p.name for p in sorted(target.glob("*.ipynb")) if p.name not in expected]
    return stale + [f"{name} (no solutions/{name})" for name in orphans]


def write_copies(source: Path = SOURCE, target: Path = TARGET, only: tuple[str, ...] = ()) -> list[Path]:
    """Write every learner copy (or those whose names start with one of ``only``); return the paths written."""
    target.mkdir(exist_ok=True)
    written = []
    for path in solution_notebooks(source):
        if only and not path.name.startswith(only):
            continue
        (target / path.name).write_text(learner_copy_text(path), encoding="utf-8")
        written.append(target / path.name)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 when a copy is out of date")
    parser.add_argument("only", nargs="*", help="notebook numbers to write (01 03 ...); all when none")
    args = parser.parse_args(argv)
    if args.check:
        stale = out_of_date()
        for name in stale:
            print(f"out of date: notebooks/{name}; run `make notebooks`")
        return 1 if stale else 0
    for path in write_copies(only=tuple(args.only)):
        print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
