"""The course's own standards, checked on every run: clean notebooks of one shape, agreeing set-up files."""

from __future__ import annotations

import importlib
import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from types import ModuleType

import pytest
import yaml

from course_utils.core.profiles import PROFILES

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((REPO / "solutions").glob("*.ipynb"))  # the source; notebooks/ is made from it
EXPECTED_NOTEBOOKS = [
    "00_setup",
    "01_grpo_concepts",
    "02_gsm8k_data",
    "03_reward_functions",
    "04_train_grpo",
    "05_evaluate",
    "06_troubleshooting",
    "07_grpo_variants",
    "08_tool_use",
    "99_appendix_cpu_speed",
]


def exercise_module(number: str) -> ModuleType:
    """The exercises module of notebook ``number`` ("02" -> ``course_utils.exercises.nb02_gsm8k_data``)."""
    folder = REPO / "course_utils" / "exercises"
    (path,) = [p for p in folder.glob(f"nb{number}_*") if p.suffix == ".py" or (p / "__init__.py").is_file()]
    return importlib.import_module(f"course_utils.exercises.{path.stem}")


def load(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def code_cells(notebook: dict) -> list[str]:
    return ["".join(c["source"]) for c in notebook["cells"] if c["cell_type"] == "code"]


def markdown(notebook: dict) -> list[str]:
    return ["".join(c["source"]) for c in notebook["cells"] if c["cell_type"] == "markdown"]


def test_notebooks_are_named_nn_snake_case():
    assert NOTEBOOKS, "no notebooks found"
    for path in NOTEBOOKS:
        assert re.fullmatch(r"\d\d_[a-z0-9]+(_[a-z0-9]+)*\.ipynb", path.name), path.name


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_committed_without_outputs_or_widget_state(path):
    notebook = load(path)
    assert "widgets" not in notebook.get("metadata", {}), "strip the widget state from the metadata"
    for cell in notebook["cells"]:
        if cell["cell_type"] == "code":
            assert not cell.get("outputs") and cell.get("execution_count") is None, f"outputs in {path.name}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_cell_has_its_own_id(path):
    """nbformat 4.5 requires cell ids (a missing one is repaired with a warning today, an error in future)."""
    ids = [cell.get("id") for cell in load(path)["cells"]]
    missing = [index for index, cell_id in enumerate(ids) if not cell_id]
    assert not missing, f"cells {missing} of {path.name} have no id: run nbformat's normalize() on the notebook"
    assert len(set(ids)) == len(ids), f"{path.name} repeats a cell id"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_starts_with_goals_and_run_time_then_the_colab_cell(path):
    notebook = load(path)
    first = notebook["cells"][0]
    assert first["cell_type"] == "markdown"
    text = "".join(first["source"]).lower()
    assert "goal" in text and "run time" in text
    colab = code_cells(notebook)[0]
    assert colab == code_cells(load(REPO / "solutions" / "00_setup.ipynb"))[0], "the Colab cell differs from 00's"
    assert 'if "google.colab" in sys.modules' in colab and "scripts/colab_install.py" in colab


# A run time stated in text: "~30 s", "< 2 min", "1–2 min", "15-20 minutes", "under a minute", "an hour".
RUN_TIME_FIGURE = re.compile(
    r"\d+(?:[.,]\d+)?\s*(?:[-–]\s*\d+(?:[.,]\d+)?\s*)?(?:min(?:ute)?s?|s|sec(?:ond)?s?|h|hours?)\b"
    r"|\ban? (?:minute|hour)\b",
    re.IGNORECASE,
)


def run_time_figures(text: str) -> list[str]:
    return [match.group(0) for match in RUN_TIME_FIGURE.finditer(text)]


def test_run_time_figures_are_found_and_other_numbers_are_not():
    stated = "| `ci` | ~30 s | ~0.5 min | < 2 min | 1–2 min | ~15-20 min (estimate) | 3 minutes | 2 h | under a minute"
    assert run_time_figures(stated) == [
        "30 s", "0.5 min", "2 min", "1–2 min", "15-20 min", "3 minutes", "2 h", "a minute"
    ]  # fmt: skip
    other = "`cpu` 50, 8 problems, 2 seeds x 10 steps, 30–70% of the maximum, 1 step, `cpu_lab_minutes`, 135M"
    assert run_time_figures(other) == []


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_reads_its_run_time_from_the_readme_instead_of_restating_it(path):
    """The README's notebook table is the one home of run times; the notebook prints its own row of it."""
    notebook = load(path)
    first = "".join(notebook["cells"][0]["source"])
    assert not run_time_figures(first), f"{path.name} restates run times {run_time_figures(first)}: cite the README"
    assert "README's notebook table" in " ".join(first.split())
    printed = f'print(describe_run_time("{path.stem}", '
    assert any(printed in code for code in code_cells(notebook)[1:3]), f"{path.name} does not print {printed}...)"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_ends_with_a_recap_and_checked_exercises(path):
    notebook = load(path)
    text = "\n".join(markdown(notebook)).lower()
    assert "recap" in text and "exercise" in text
    called = set(re.findall(r"\b(check_(\d\d)_\w+)\(", "\n".join(code_cells(notebook))))
    assert called, f"{path.name} calls no exercise check"
    missing = {name for name, number in called if not hasattr(exercise_module(number), name)}
    assert not missing, f"{path.name} calls checks its notebook's exercises module lacks: {missing}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_has_no_path_hacks_or_star_imports(path):
    source = "\n".join(code_cells(load(path)))
    assert "sys.path" not in source
    assert not re.search(r"^\s*from\s+\S+\s+import\s+\*", source, re.MULTILINE)


def test_every_course_notebook_exists():
    assert [p.stem for p in NOTEBOOKS] == EXPECTED_NOTEBOOKS


def test_package_has_no_path_hacks_or_star_imports():
    for path in (REPO / "course_utils").rglob("*.py"):
        source = path.read_text(encoding="utf-8")
        assert "sys.path" not in source, path
        assert not re.search(r"^\s*from\s+\S+\s+import\s+\*", source, re.MULTILINE), path


def test_every_package_module_has_a_test_file():
    untested = []
    for path in (REPO / "course_utils").glob("*.py"):
        if path.stem != "__init__" and not (REPO / "tests" / f"test_{path.stem}.py").is_file():
            untested.append(path.stem)
    assert not untested, f"modules without tests/test_<module>.py: {untested}"


def _requirement_names(requirements: list[str]) -> set[str]:
    return {re.split(r"[<>=!;\s\[]", r, maxsplit=1)[0].lower() for r in requirements}


def test_environment_yml_installs_what_pyproject_declares():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    declared = project["dependencies"] + project["optional-dependencies"]["dev"]
    env = yaml.safe_load((REPO / "environment.yml").read_text())
    pip_lines = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    pip_section = [r for r in pip_lines if r != "-c constraints.txt"]  # the pins: tests/test_pins.py
    conda_python = next(d for d in env["dependencies"] if isinstance(d, str) and d.startswith("python"))
    assert "-e ." in pip_section, "environment.yml must install the course package itself"
    assert sorted(r for r in pip_section if r != "-e .") == sorted(declared), "same specs, same versions"
    assert _requirement_names([r for r in pip_section if r != "-e ."]) == _requirement_names(declared)
    assert conda_python.split("=")[1] >= project["requires-python"].lstrip(">=")


def test_readme_quick_start_has_exactly_two_commands():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    quick_start = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    commands = re.findall(
        r"^\s*(make \w+)\s*$", "\n".join(re.findall(r"```(?:bash|sh)?\n(.*?)```", quick_start, re.S)), re.M
    )
    assert commands == ["make lab", "make test"]


def test_readme_maps_every_notebook_with_a_colab_badge():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    for path in NOTEBOOKS:
        assert f"notebooks/{path.name}" in readme
        assert re.search(rf"colab\.research\.google\.com/github/\S+/notebooks/{re.escape(path.name)}", readme), (
            path.name
        )


def test_ci_runs_the_readme_test_command():
    assert "make test" in (REPO / ".ci" / "run").read_text()
    assert re.search(r"^test:", (REPO / "Makefile").read_text(), re.M)


def test_gitignore_covers_venv_caches_and_outputs():
    ignored = (REPO / ".gitignore").read_text().split()
    for entry in [".venv/", "__pycache__/", "build/", "outputs/", ".ipynb_checkpoints/"]:
        assert entry in ignored


def test_ruff_is_clean_on_package_tests_and_notebooks():
    result = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "course_utils", "tests", "benchmarks", "solutions", "scripts"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout[-3000:]


# Notebooks whose lesson code the learner writes in cells, with the functions each must define and check.
LESSON_CODE = {
    "01_grpo_concepts": {"advantages": "check_01_advantages", "policy_loss": "check_01_policy_loss"},
    "02_gsm8k_data": {
        "extract_hash_answer": "check_02_extract_hash_answer",
        "build_prompt": "check_02_build_prompt",
        "to_grpo_row": "check_02_mapping",
    },
    "03_reward_functions": {
        "correctness_reward_func": "check_03_correctness",
        "int_reward_func": "check_03_int",
        "strict_format_reward_func": "check_03_strict_format",
        "soft_format_reward_func": "check_03_soft_format",
        "xmlcount_reward_func": "check_03_xmlcount",
    },
    "04_train_grpo": {"generation_batch": "check_04_generation_batch"},
    "05_evaluate": {"evaluate_loop": "check_evaluation_loop", "last_number": "check_05_last_number"},
    "08_tool_use": {
        "tool_call_trace": "check_08_trace",
        "calculator": "check_08_calculator",
        "tool_use_reward": "check_08_tool_reward",
    },
}


@pytest.mark.parametrize("name", sorted(LESSON_CODE))
def test_lesson_code_is_written_in_cells_and_checked(name):
    notebook = load(REPO / "solutions" / f"{name}.ipynb")
    source = "\n".join(code_cells(notebook))
    for function, check in LESSON_CODE[name].items():
        assert re.search(rf"^def {function}\(", source, re.M), f"{name} does not define {function}"
        assert re.search(rf"\b{check}\({function}\b", source), f"{name} does not run {check} on {function}"
    assert "getsource" not in source, f"{name} prints source instead of teaching it"
    long_cells = [len(text.split()) for text in markdown(notebook) if len(text.split()) > 250]
    assert not long_cells, f"{name} has markdown cells of {long_cells} words (at most 250)"


# The library calls notebook 04's and 05's learner writes out in cells, each followed by its check
LESSON_CALLS = {
    "04_train_grpo": {
        "SFTConfig(": "lesson_checks.check_sft_config(sft_config",
        "SFTTrainer(": "sft_trainer.train()",
        "GRPOConfig(": "lesson_checks.check_grpo_config(config",
        "LoraConfig(": "lesson_checks.check_lora_config(lora",
        "GRPOTrainer(": "lesson_checks.check_grpo_trainer(trainer",
        "trainer.train(resume_from_checkpoint=": "get_last_checkpoint(",
    },
    "05_evaluate": {".generate(": 'padding_side="left"', "apply_chat_template(": "extract_xml_answer(completion)"},
    "08_tool_use": {"GRPOTrainer(": "check_08_trainer(trainer", "tools=[calculator]": "trainer.train("},
}


@pytest.mark.parametrize("name", sorted(LESSON_CALLS))
def test_library_calls_are_written_in_cells_and_checked(name):
    source = "\n".join(code_cells(load(REPO / "solutions" / f"{name}.ipynb")))
    for call, companion in LESSON_CALLS[name].items():
        assert call in source and companion in source, f"{name}: {call!r} with {companion!r} is not in a code cell"
    assert "training.train(" not in source and "getsource" not in source


@pytest.mark.parametrize("name", ["04_train_grpo", "05_evaluate", "99_appendix_cpu_speed"])
def test_engineering_detail_stays_out_of_the_lesson_text(name):
    """Markdown cells stay short and speak of memory reuse, not of the C library's internals."""
    texts = markdown(load(REPO / "solutions" / f"{name}.ipynb"))
    assert all(len(text.split()) <= 250 for text in texts), [len(t.split()) for t in texts if len(t.split()) > 250]
    for word in ("malloc", "page fault"):
        assert not any(word in text.lower() for text in texts), f"{name} mentions {word!r}"


def readme_profile_rows() -> dict[str, list[str]]:
    """The README's hardware-profile table: the cells of each profile's row, by profile name."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    table = readme.split("## Hardware profiles", 1)[1].split("\n## ", 1)[0]
    rows = [line.strip("|").split("|") for line in table.splitlines() if re.match(r"^\| `[\w-]+` \|", line)]
    return {cells[0].strip().strip("`"): [cell.strip() for cell in cells] for cells in rows}


def test_readme_profile_table_states_each_profiles_group_batch_and_completion_length():
    rows = readme_profile_rows()
    assert sorted(rows) == sorted(PROFILES), "one row per profile"
    for name, cells in rows.items():
        profile = PROFILES[name]
        group_by_prompts = cells[5].split(" (")[0]  # a note in brackets may follow
        assert group_by_prompts == f"{profile.num_generations} × {profile.prompts_per_step}", f"{name}: group × prompts"
        tokens = int(re.match(r"\d+", cells[6]).group())
        assert tokens == profile.max_completion_length, f"{name}: the README says {tokens} completion tokens"


def test_notebook_05_states_each_profiles_number_of_evaluation_problems():
    """Its goals cell says how many problems each profile evaluates: the numbers profiles.py sets (eval_size)."""
    first = " ".join("".join(load(REPO / "solutions" / "05_evaluate.ipynb")["cells"][0]["source"]).split())
    stated = dict(re.findall(r"`([\w-]+)` (?:evaluates )?(\d+)\b", first))
    assert sorted(stated) == sorted(PROFILES), f"notebook 05 states the problems of {sorted(stated)}"
    for name, count in stated.items():
        assert int(count) == PROFILES[name].eval_size, f"notebook 05 says `{name}` evaluates {count} problems"
