"""The learner's code as the notebooks hold it: the solution from ``solutions/``, the stub from ``notebooks/``.

Tests of a check run it on what a learner really starts with and on the course's own solution, not on a
copy written again in the test: ``exercise(nb, "advantages")`` executes the notebook's imports and the
cell holding the solution region that defines ``advantages``, and returns what that name is bound to.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import nbformat

REPO = Path(__file__).resolve().parents[1]
BEGIN = "### BEGIN SOLUTION"


def notebook_path(copy: str, stem_prefix: str) -> Path:
    """``("solutions", "01")`` -> ``solutions/01_grpo_concepts.ipynb``."""
    matches = sorted((REPO / copy).glob(f"{stem_prefix}_*.ipynb"))
    if len(matches) != 1:
        raise FileNotFoundError(f"expected one {copy}/{stem_prefix}_*.ipynb, found {[p.name for p in matches]}")
    return matches[0]


def code_cells(path: Path) -> list[str]:
    """The sources of the code cells, in order (the same indices in both copies)."""
    return [cell.source for cell in nbformat.read(path, as_version=4).cells if cell.cell_type == "code"]


def _binds(source: str, name: str) -> bool:
    """True when a top-level statement of ``source`` defines or assigns ``name``."""
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name == name:
            return True
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            return True
    return False


def exercise_cell_index(stem_prefix: str, name: str) -> int:
    """The index (among code cells) of the solution cell that defines ``name``."""
    sources = code_cells(notebook_path("solutions", stem_prefix))
    found = [i for i, source in enumerate(sources) if BEGIN in source and _binds(source, name)]
    if len(found) != 1:
        raise LookupError(f"{stem_prefix}: expected one solution cell defining {name!r}, found cells {found}")
    return found[0]


def _imports(sources: list[str]) -> str:
    """Every top-level import statement of the notebook (the Colab install cell left out)."""
    lines = []
    for source in sources:
        if source.lstrip().startswith("# Colab only"):
            continue
        for node in ast.parse(source).body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                lines.append(ast.unparse(node))
    return "\n".join(lines)


def exercise(stem_prefix: str, name: str, copy: str = "solutions", **given: Any) -> Any:
    """What ``name`` is bound to after the notebook's imports and its exercise cell run (``given`` defined first).

    ``copy="notebooks"`` gives the learner's stub; ``given`` supplies names the cell reads from earlier cells.
    """
    index = exercise_cell_index(stem_prefix, name)
    sources = code_cells(notebook_path(copy, stem_prefix))
    namespace: dict[str, Any] = {"__name__": f"notebook_{stem_prefix}", **given}
    exec(compile(_imports(sources), f"{copy}/{stem_prefix} imports", "exec"), namespace)
    namespace.update(given)
    exec(compile(sources[index], f"{copy}/{stem_prefix} code cell {index}", "exec"), namespace)
    return namespace[name]
