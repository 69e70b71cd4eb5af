"""``notebooks/`` is made from ``solutions/`` by nbgrader's ClearSolutions (``make notebooks``), and kept so."""

from __future__ import annotations

import ast
import importlib.util
import re
import shutil
import sys
from pathlib import Path

import nbformat
import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "make_learner_copies.py"
_spec = importlib.util.spec_from_file_location("make_learner_copies", SCRIPT)
copies = sys.modules.setdefault(_spec.name, importlib.util.module_from_spec(_spec))
_spec.loader.exec_module(copies)
SOLUTIONS = copies.solution_notebooks()
REGION = re.compile(r"^[ \t]*### BEGIN SOLUTION\n(.*?)^[ \t]*### END SOLUTION[ \t]*$", re.M | re.S)


def cells(path):
    return nbformat.read(path, as_version=4).cells


def test_the_learner_copies_are_up_to_date():
    stale = copies.out_of_date()
    assert not stale, f"run `make notebooks`: out of date {stale}"


def test_every_lesson_notebook_has_solution_regions_and_its_copy_none():
    for path in SOLUTIONS:
        solution_text = "".join(cell.source for cell in cells(path))
        learner_text = "".join(cell.source for cell in cells(copies.TARGET / path.name))
        if not path.name.startswith("00_"):
            assert copies.BEGIN in solution_text, f"{path.name}: no solution region"
        assert copies.BEGIN not in learner_text and copies.END not in learner_text, path.name


def _solution_lines(source: str) -> set[str]:
    """The code lines inside the solution regions of one cell (blank lines and comments left out)."""
    lines = set()
    for region in REGION.findall(source):
        lines |= {line.strip() for line in region.splitlines() if line.strip() and not line.strip().startswith("#")}
    return lines


def test_no_solution_line_is_left_in_a_learner_cell():
    leaks = []
    for path in SOLUTIONS:
        for index, (solution, learner) in enumerate(zip(cells(path), cells(copies.TARGET / path.name), strict=True)):
            learner_lines = {line.strip() for line in learner.source.splitlines()}
            left = {line for line in _solution_lines(solution.source) if line in learner_lines and len(line) > 12}
            leaks += [f"{path.name} cell {index}: {line}" for line in sorted(left)]
    assert not leaks, leaks


def test_the_copies_differ_only_inside_the_regions():
    for path in SOLUTIONS:
        solution, learner = cells(path), cells(copies.TARGET / path.name)
        assert len(solution) == len(learner), path.name
        for index, (mine, theirs) in enumerate(zip(solution, learner, strict=True)):
            stubbed = REGION.sub(lambda m: "", mine.source)
            expected = REGION.sub(lambda m: "", theirs.source) if copies.BEGIN in theirs.source else None
            if copies.BEGIN not in mine.source:
                assert mine.source == theirs.source, f"{path.name} cell {index} differs outside any region"
            else:
                assert expected is None and "# YOUR CODE HERE" in theirs.source, f"{path.name} cell {index}"
                assert len(stubbed) > 0


@pytest.fixture()
def course_copy(tmp_path):
    source, target = tmp_path / "solutions", tmp_path / "notebooks"
    shutil.copytree(copies.SOURCE, source)
    target.mkdir()
    copies.write_copies(source, target)
    return source, target


def test_an_edited_solution_makes_its_copy_out_of_date(course_copy):
    source, target = course_copy
    assert copies.out_of_date(source, target) == []
    path = sorted(source.glob("01_*.ipynb"))[0]
    notebook = nbformat.read(path, as_version=4)
    notebook.cells[0].source += "\nOne more sentence."
    nbformat.write(notebook, path)
    assert copies.out_of_date(source, target) == [path.name]


def test_a_copy_edited_by_hand_missing_or_without_a_solution_is_out_of_date(course_copy):
    source, target = course_copy
    first, second = sorted(target.glob("*.ipynb"))[:2]
    first.write_text(first.read_text().replace("GRPO", "GRP0"))
    second.unlink()
    shutil.copy(target / "03_reward_functions.ipynb", target / "42_extra.ipynb")
    orphan = "42_extra.ipynb (no solutions/42_extra.ipynb)"
    assert copies.out_of_date(source, target) == [first.name, second.name, orphan]


def test_an_unclosed_region_is_refused_with_the_cell_named(course_copy, tmp_path):
    source, _ = course_copy
    path = sorted(source.glob("01_*.ipynb"))[0]
    notebook = nbformat.read(path, as_version=4)
    code = next(i for i, cell in enumerate(notebook.cells) if copies.BEGIN in cell.source)
    notebook.cells[code].source = notebook.cells[code].source.replace(copies.END, "")
    nbformat.write(notebook, path)
    with pytest.raises(SystemExit, match=rf"cell {code}: 1 '### BEGIN SOLUTION' for 0"):
        copies.learner_copy_text(path)


def test_make_notebooks_and_the_readme_name_both_copies():
    makefile = (copies.ROOT / "Makefile").read_text()
    assert "scripts/make_learner_copies.py" in makefile and "--notebook-dir=notebooks" in makefile
    readme = (copies.ROOT / "README.md").read_text()
    assert "solutions/" in readme and "make notebooks" in readme


def _bound_in_regions(source: str) -> set[str]:
    """The names the solution regions of a cell define or assign at top level (``def f``, ``x = ...``)."""
    names = set()
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    return names


def _exercise_problems(path: Path) -> list[str]:
    """Each exercise cell needs a collapsed hint near it and, after it, a check called on what it defines."""
    notebook_cells = cells(path)
    problems = []
    for index, cell in enumerate(notebook_cells):
        if cell.cell_type != "code" or copies.BEGIN not in cell.source:
            continue
        nearby = notebook_cells[max(index - 2, 0) : index + 4]
        if not any(c.cell_type == "markdown" and "<details>" in c.source for c in nearby):
            problems.append(f"{path.name} cell {index}: no collapsed hint (<details>) beside the exercise")
        names = _bound_in_regions(cell.source)
        later = "\n".join(c.source for c in notebook_cells[index : index + 4] if c.cell_type == "code")
        if not any(re.search(rf"check_\w+\(\s*{re.escape(name)}\b", later) for name in names):
            problems.append(f"{path.name} cell {index}: no check_...({sorted(names)}) right after the exercise")
    return problems


@pytest.mark.parametrize("path", SOLUTIONS, ids=lambda p: p.name)
def test_every_exercise_has_a_hint_and_a_check_right_after(path):
    assert _exercise_problems(path) == []


def test_an_exercise_without_its_check_or_hint_is_named(tmp_path):
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [
        nbformat.v4.new_code_cell("def f(x):\n    ### BEGIN SOLUTION\n    return x\n    ### END SOLUTION"),
        nbformat.v4.new_code_cell("print(f(2))"),
    ]
    path = tmp_path / "01_demo.ipynb"
    nbformat.write(notebook, path)
    problems = _exercise_problems(path)
    assert any("no collapsed hint" in p for p in problems) and any("no check_" in p for p in problems)
