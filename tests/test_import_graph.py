"""The package's shape: its map, and its import graph read from the source with ``ast`` (function-level imports too).

course_utils is in groups that import one way (core <- lesson <- training <- evaluation <- exercises; the
cpu_speed plug-in on the side, reading only core and read by no module of ours): a cycle would make the order
modules load in decide whether an import works, and a lesson module that imported training would pull the trainer
into every plot. The package docstring is the map a reader starts from, so every module must be on it.
"""

from __future__ import annotations

import ast
import importlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import REPO_ROOT
from notebook_code import code_cells

PACKAGE = REPO_ROOT / "course_utils"


def module_name(path: Path) -> str:
    """``.../data.py`` -> ``course_utils.lesson.data``."""
    parts = path.relative_to(REPO_ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def absolute_imports(source: str, filename: str) -> Iterator[tuple[str, str | None]]:
    """(module, name) for each absolute import in ``source``, at any depth: ``import a.b`` gives ``("a.b", None)``,
    ``from a import b`` gives ``("a", "b")``."""
    for node in ast.walk(ast.parse(source, filename=filename)):
        if isinstance(node, ast.Import):
            yield from ((alias.name, None) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield from ((node.module, alias.name) for alias in node.names)


def imported_modules(path: Path, known: set[str]) -> set[str]:
    """Every course_utils module ``path`` imports, anywhere in the file (``from course_utils import data`` included)."""
    found = set()
    for module, name in absolute_imports(path.read_text(), str(path)):
        found.add(module)
        if name is not None:
            found.add(f"{module}.{name}")
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
    assert "course_utils.core.hardware" in graph["course_utils.lesson.data"]


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


# --- Groups: which group may import which -------------------------------------------------------------

# group -> the groups its modules may import (besides their own); "package" is course_utils/__init__.py
ALLOWED_IMPORTS: dict[str, set[str]] = {
    "package": set(),
    "core": set(),
    "lesson": {"core"},
    "training": {"core", "lesson"},
    "evaluation": {"core", "lesson", "training"},
    "exercises": {"core", "lesson", "training", "evaluation"},
    "cpu_speed": {"core"},
    "runner": {"core"},
}


def group_of(module: str) -> str:
    """``course_utils.lesson.rewards.classic`` -> ``lesson``; ``course_utils.runner`` -> ``runner``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "package"


def group_violations(graph: dict[str, set[str]]) -> list[str]:
    """Every import that crosses groups against ``ALLOWED_IMPORTS``, as ``importer -> imported``."""
    violations = []
    for module, imported in sorted(graph.items()):
        group = group_of(module)
        allowed = ALLOWED_IMPORTS[group] | {group}
        violations += [f"{module} -> {other}" for other in sorted(imported) if group_of(other) not in allowed]
    return violations


def test_every_group_has_a_rule():
    assert {group_of(module) for module in import_graph()} == set(ALLOWED_IMPORTS)


def test_group_violations_are_found():
    graph = {
        "course_utils.lesson.data": {"course_utils.core.paths", "course_utils.cpu_speed.packed_linear"},
        "course_utils.core.paths": {"course_utils.core.profiles"},
        "course_utils.runner": {"course_utils.training.run"},
    }
    assert group_violations(graph) == [
        "course_utils.lesson.data -> course_utils.cpu_speed.packed_linear",
        "course_utils.runner -> course_utils.training.run",
    ]


def importers_of(graph: dict[str, set[str]], group: str) -> list[str]:
    """Every module outside ``group`` that imports one of its modules, as ``importer -> imported``."""
    return [
        f"{module} -> {other}"
        for module, imported in sorted(graph.items())
        for other in sorted(imported)
        if group_of(other) == group and group_of(module) != group
    ]


def test_importers_of_finds_a_module_that_imports_the_plug_in():
    graph = {
        "course_utils.evaluation.heldout": {"course_utils.cpu_speed", "course_utils.core.speedups"},
        "course_utils.cpu_speed.logit_tiles": {"course_utils.cpu_speed.packed_linear"},
    }
    assert importers_of(graph, "cpu_speed") == ["course_utils.evaluation.heldout -> course_utils.cpu_speed"]


def test_no_module_outside_the_plug_in_imports_it():
    """The plug-in is a side branch: training and evaluation take it from their caller (``speedups=cpu_speed``),
    so every place that turns it on is a line in a notebook or a script, not a hidden call inside the package."""
    found = importers_of(import_graph(), "cpu_speed")
    assert not found, "modules importing the CPU plug-in (take it as a speedups argument instead):\n" + "\n".join(found)


def test_imports_follow_the_group_order():
    violations = group_violations(import_graph())
    assert not violations, "imports against the group order (see ALLOWED_IMPORTS):\n" + "\n".join(violations)


# --- The map: the package docstring names every module -------------------------------------------------


def package_modules() -> list[str]:
    """Every module of course_utils except the packages themselves: ``course_utils.lesson.rewards.classic``..."""
    return [module_name(p) for p in sorted(PACKAGE.rglob("*.py")) if p.stem != "__init__"]


def missing_from_map(docstring: str, modules: list[str]) -> list[str]:
    """The modules whose last name the docstring does not mention as ````name````."""
    return [module for module in modules if f"``{module.rsplit('.', 1)[-1]}``" not in docstring]


def test_missing_from_map_finds_an_unlisted_module():
    assert missing_from_map("``data`` and ``grpo``", ["a.data", "a.b.grpo", "a.plotting"]) == ["a.plotting"]


def test_the_package_docstring_lists_every_module_and_group():
    doc = importlib.import_module("course_utils").__doc__ or ""
    missing = missing_from_map(doc, package_modules())
    assert not missing, f"modules missing from course_utils/__init__.py's map: {missing}"
    groups = {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    assert all(f"``{group}``" in doc for group in groups), groups


@pytest.mark.parametrize("group", sorted(p.parent.name for p in PACKAGE.glob("*/__init__.py")))
def test_each_group_docstring_lists_its_modules(group):
    init = PACKAGE / group / "__init__.py"
    doc = ast.get_docstring(ast.parse(init.read_text())) or ""
    own = [module_name(p) for p in sorted(init.parent.glob("*.py")) if p.stem != "__init__"]
    own += [module_name(p.parent) for p in sorted(init.parent.glob("*/__init__.py"))]  # subpackages (rewards)
    assert not missing_from_map(doc, own), f"{init.relative_to(REPO_ROOT)} does not list {missing_from_map(doc, own)}"


def course_utils_names_imported(source: str, filename: str) -> set[tuple[str, str]]:
    """(module, name) for each ``from course_utils... import name`` in ``source``, at any depth."""
    return {(module, name) for module, name in absolute_imports(source, filename)
            if name is not None and module.startswith("course_utils")}  # fmt: skip


def unresolved(pairs: set[tuple[str, str]]) -> list[str]:
    """The pairs whose module does not import or has no such name (neither attribute nor submodule)."""
    missing = []
    for module_name_, name in sorted(pairs):
        module = importlib.import_module(module_name_)
        if hasattr(module, name):
            continue
        try:
            importlib.import_module(f"{module_name_}.{name}")
        except ModuleNotFoundError:
            missing.append(f"{module_name_}.{name}")
    return missing


def test_unresolved_names_a_name_that_moved_away() -> None:
    pairs = course_utils_names_imported("from course_utils.core.profiles import no_such_helper\n", "x.py")
    assert unresolved(pairs) == ["course_utils.core.profiles.no_such_helper"]


def test_scripts_benchmarks_and_notebooks_import_names_that_exist() -> None:
    """A module split must update every caller: scripts run only by hand (gpu_check) would fail only on a GPU."""
    pairs: set[tuple[str, str]] = set()
    for folder in ("scripts", "benchmarks"):
        for path in sorted((REPO_ROOT / folder).glob("*.py")):
            pairs |= course_utils_names_imported(path.read_text(), str(path))
    for path in sorted((REPO_ROOT / "solutions").glob("*.ipynb")):
        for source in code_cells(path):
            if "course_utils" in source:
                lines = [line for line in source.splitlines() if not line.lstrip().startswith(("%", "!"))]
                pairs |= course_utils_names_imported("\n".join(lines), str(path))
    assert len(pairs) > 20
    assert unresolved(pairs) == []
