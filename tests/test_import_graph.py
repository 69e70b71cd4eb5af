"""The package's import graph, read from the source with ``ast`` (imports inside functions count too).

course_utils is layered one way (profiles/paths, hardware, data and models, rewards, training, lab,
monitoring, evaluation; plotting a leaf): a cycle would make the order modules load in decide whether
an import works, and a leaf that imported training would pull the trainer into every plot.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from conftest import REPO_ROOT

PACKAGE = REPO_ROOT / "course_utils"


def module_name(path: Path) -> str:
    """``.../data.py`` -> ``course_utils.lesson.data``."""
    parts = path.relative_to(REPO_ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, known: set[str]) -> set[str]:
    """Every course_utils module ``path`` imports, anywhere in the file (``from course_utils import data`` included)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return {name for name in found if name in known}


def import_graph() -> dict[str, set[str]]:
    """Module -> the course_utils modules it imports (a package's own ``__init__`` left out of its submodules)."""
    paths = sorted(PACKAGE.rglob("*.py"))
    known = {module_name(path) for path in paths}
    graph = {}
    for path in paths:
        name = module_name(path)
        graph[name] = {m for m in imported_modules(path, known) if m != name and not name.startswith(m + ".")}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a list of modules (first == last), or None."""
    state: dict[str, str] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for nxt in graph.get(todo.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def test_the_graph_is_read_from_every_module() -> None:
    graph = import_graph()
    expected = {"course_utils.training.run", "course_utils.evaluation.heldout", "course_utils.lesson.plotting"}
    assert expected <= set(graph)
    assert "course_utils.lesson.models" in graph["course_utils.training.run"]  # a top-level import is seen
    assert "course_utils.core.profiles" in graph["course_utils.lesson.data"]


def test_function_level_imports_are_seen(tmp_path) -> None:
    source = tmp_path / "mod.py"
    source.write_text("def f():\n    from course_utils.training.run import train\n    import course_utils.lesson.data\n")  # noqa: E501
    known = {"course_utils.training.run", "course_utils.lesson.data"}
    assert imported_modules(source, known) == known


def test_find_cycle_finds_one_and_only_one_that_exists() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_no_import_cycle_in_course_utils() -> None:
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


@pytest.mark.parametrize("forbidden", ["course_utils.training.run", "course_utils.evaluation.heldout"])
def test_plotting_is_a_leaf(forbidden) -> None:
    assert forbidden not in reachable(import_graph(), "course_utils.lesson.plotting")


def test_course_utils_imports_sit_at_the_top_of_each_file() -> None:
    """A function-level import hides a dependency from the reader of the file's first lines."""
    inside = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        top = {id(node) for node in tree.body}
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            if id(node) not in top and any(n.startswith("course_utils") for n in names):
                inside.append(f"{path.relative_to(REPO_ROOT)}:{node.lineno}")
    assert not inside, f"course_utils imported inside a function or block: {inside}"
