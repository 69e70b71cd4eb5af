"""Notebook 04's end exercises (04.5-04.8): the values, ``generation_batch``; and the names its text asks to run.

Each runs the course's own solution (``solutions/``) and the learner's stub (``notebooks/``) through
``tests.notebook_code``, and a bank of wrong answers a learner really writes. The configs and the trainer
(04.1-04.4) are in ``test_exercises_nb04_constructs.py``.
"""

from __future__ import annotations

import ast
import re

import nbformat
import numpy as np
import pytest
from notebook_code import _imports, code_cells, exercise, notebook_path

from course_utils.exercises import nb04_train_grpo as nb04
from course_utils.training import grpo_config, monitoring

MONITORING_HISTORY = [
    {"step": s, "reward": 0.4, "reward_std": 0.5, "completions/mean_length": 64.0,
     "completions/clipped_ratio": 0.8, "frac_reward_zero_std": 0.1}
    for s in range(1, 9)
]  # fmt: skip


# --- 04.5-04.7: the values ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "check"),
    [
        ("answer_1", nb04.check_04_prompts_per_step),
        ("answer_2", nb04.check_04_group_size_field),
        ("answer_3", lambda answer: nb04.check_04_monitoring_rule(answer, MONITORING_HISTORY)),
    ],
)
def test_the_solution_values_pass_and_the_stubs_read_not_answered(name, check, capsys):
    assert check(exercise("04", name)) is True
    assert capsys.readouterr().out.startswith("✅ 04.")
    stub = exercise("04", name, copy="notebooks")
    assert stub is None and check(stub) is False
    assert capsys.readouterr().out.startswith("⏳ 04.")


def test_the_notebooks_history_is_the_one_the_test_reads():
    source = code_cells(notebook_path("solutions", "04"))
    cell = next(s for s in source if s.lstrip().startswith("from course_utils.exercises.nb04_train_grpo import"))
    namespace: dict = {}
    exec(cell, namespace)
    assert namespace["exercise_history"] == MONITORING_HISTORY


@pytest.mark.parametrize("wrong", [128, 8, 1, 16.5, "16 prompts", None, "16", True])
def test_04_5_wrong_prompt_counts_fail(wrong, capsys):
    """128 completions, 8 per group, one prompt; a number in a sentence is not a number."""
    assert nb04.check_04_prompts_per_step(wrong) is False
    assert capsys.readouterr().out.startswith("⏳ 04.5" if wrong is None else "❌ 04.5")


@pytest.mark.parametrize("wrong", ["G", "beta", "per_device_train_batch_size", "generation_batch_size", 8])
def test_04_6_wrong_field_names_fail(wrong, capsys):
    assert nb04.check_04_group_size_field(wrong) is False
    assert "❌ 04.6 group size field" in capsys.readouterr().out


@pytest.mark.parametrize("right", ["num_generations", " `num_generations` ", "'num_generations'"])
def test_04_6_the_name_passes_with_quotes_or_spaces(right):
    assert nb04.check_04_group_size_field(right)


@pytest.mark.parametrize("wrong", ["kl_rising", "reward_std_low", "zero_std_high", "clipped ratio", "CLIPPED_HIGH"])
def test_04_7_rules_that_do_not_fire_fail(wrong, capsys):
    assert nb04.check_04_monitoring_rule(wrong, MONITORING_HISTORY) is False
    assert "❌ 04.7 monitoring rule" in capsys.readouterr().out


@pytest.mark.parametrize("wrong", [8, ["clipped_high"], monitoring.Finding])
def test_04_6_and_04_7_a_name_must_be_a_string(wrong, capsys):
    assert nb04.check_04_group_size_field(wrong) is False
    assert nb04.check_04_monitoring_rule(wrong, MONITORING_HISTORY) is False
    assert capsys.readouterr().out.count("a name was expected, as a string") == 2


def test_04_7_an_unreadable_history_is_said_and_never_raised(capsys):
    assert nb04.check_04_monitoring_rule("clipped_high", "trainer_state.json") is False
    assert "could not read the log history" in capsys.readouterr().out


# --- 04.8: generation_batch ---------------------------------------------------------------------------------


def test_04_8_the_solution_passes_and_is_handed_back(capsys):
    solution = exercise("04", "generation_batch")
    assert nb04.check_04_generation_batch(solution) is solution
    out = capsys.readouterr().out
    assert "✅ 04.8 generation batch: same result as the reference on all 14 cases." in out
    assert "04.8 generation batch: the notebook continues with yours." in out


def test_04_8_the_stub_reads_not_answered_and_the_package_is_handed_back(capsys):
    stub = exercise("04", "generation_batch", copy="notebooks")
    assert nb04.check_04_generation_batch(stub) is grpo_config.check_generation_batch
    out = capsys.readouterr().out
    assert out.startswith("⏳ 04.8 generation batch: not answered yet.")
    assert "continues with the package's training.check_generation_batch." in out


def test_04_8_the_packages_own_function_is_not_an_answer(capsys):
    """``generation_batch = grpo_config.check_generation_batch`` passed before; it is the reference, not an answer."""
    assert nb04.check_04_generation_batch(grpo_config.check_generation_batch) is grpo_config.check_generation_batch
    out = capsys.readouterr().out
    assert out.startswith("❌ 04.8 generation batch: that is the package's own course_utils.training.grpo_config.")
    assert "continues with the package's" in out


def never_refuses(batch, accumulation, num_generations):
    return batch * accumulation


def prompts_not_completions(batch, accumulation, num_generations):
    if num_generations < 2 or batch < 1 or accumulation < 1 or (batch * accumulation) % num_generations:
        raise ValueError("sizes")
    return batch * accumulation // num_generations


def refuses_with_assert(batch, accumulation, num_generations):
    assert (batch * accumulation) % num_generations == 0 and num_generations > 1 and batch > 0 and accumulation > 0
    return batch * accumulation


def allows_a_group_of_one(batch, accumulation, num_generations):
    if num_generations < 1 or batch < 1 or accumulation < 1 or (batch * accumulation) % num_generations:
        raise ValueError("sizes")
    return batch * accumulation


def checks_the_batch_alone(batch, accumulation, num_generations):
    """Whole groups in each pass instead of in the whole round: refuses 4 passes of 2 in groups of 8."""
    if num_generations < 2 or batch < 1 or accumulation < 1 or batch % num_generations:
        raise ValueError("sizes")
    return batch * accumulation


@pytest.mark.parametrize(
    ("wrong", "case"),
    [
        (never_refuses, "6 x 1, groups of 4: not whole groups: the reference raises"),
        (prompts_not_completions, "the golden config: 8 x 16, groups of 8: the reference returns 128, yours returns"),
        (refuses_with_assert, "raises AssertionError"),
        (allows_a_group_of_one, "a group of one compares nothing: the reference raises"),
        (checks_the_batch_alone, "4 x 2, groups of 8: the reference returns 8, yours raises"),
        (lambda b, a, g: b * a, "batch 0"),
    ],
)
def test_04_8_wrong_functions_fail_naming_the_case(wrong, case, capsys):
    assert nb04.check_04_generation_batch(wrong) is grpo_config.check_generation_batch
    out = capsys.readouterr().out
    assert out.startswith("❌ 04.8 generation batch: differs from the reference") and case in out


def test_04_8_a_value_is_not_a_function(capsys):
    assert nb04.check_04_generation_batch(16) is grpo_config.check_generation_batch
    assert "is not a function" in capsys.readouterr().out


def test_04_8_any_value_error_kind_passes():
    """The task names ValueError; the package's GenerationBatchError is one, so a plain ValueError is right."""

    def plain(batch, accumulation, num_generations):
        if min(batch, accumulation) < 1 or num_generations < 2 or (batch * accumulation) % num_generations:
            raise ValueError("no")
        return batch * accumulation

    assert nb04.check_04_generation_batch(plain) is plain


# --- The notebook's text ------------------------------------------------------------------------------------


def test_the_resume_instruction_uses_only_names_the_notebook_defines():
    """Section 10 tells the learner to run a line: every name in it exists by then (no NameError)."""
    notebook = nbformat.read(notebook_path("solutions", "04"), as_version=4)
    text = next(c.source for c in notebook.cells if c.cell_type == "markdown" and "**Resuming.**" in c.source)
    [line] = [s for s in re.findall(r"`([^`]+)`", text) if "load_saved_warm_start(" in s]
    sources = [c.source for c in notebook.cells if c.cell_type == "code"]
    namespace: dict = {}
    exec(_imports(sources), namespace)
    first = next(s for s in sources if "profile = get_profile()" in s)
    bound = {t.id for node in ast.parse(first).body if isinstance(node, ast.Assign) for t in node.targets}
    assigned = {t.id for n in ast.walk(ast.parse(line)) if isinstance(n, ast.Assign) for t in n.targets}
    used = {n.id for n in ast.walk(ast.parse(line)) if isinstance(n, ast.Name)} - assigned
    assert used - {"model"} <= set(namespace) | bound, used - set(namespace) - bound
    assert callable(namespace["load_saved_warm_start"]) and callable(namespace["trained_model"].warm_start_model_dir)
    assert "run_dir" in bound


def test_the_trl_statements_match_the_installed_trl():
    """Truncated completions leave the loss, not the group statistics; with LoRA the reference is the adapter off."""
    notebook = nbformat.read(notebook_path("solutions", "04"), as_version=4)
    text = "\n".join(c.source for c in notebook.cells if c.cell_type == "markdown")
    assert "instead of\n  counting as wrong answers" not in text and "completion_mask" in text
    assert "still\n  enters their group's mean and std" in text
    loop = next(c.source for c in notebook.cells if "## The whole GRPO loop" in c.source)
    assert "a frozen copy, only when beta > 0" not in loop and "adapters\n            switched off" in loop


def refuses_pairs(batch, accumulation, num_generations):
    """A group of 2 compares two completions: the ci profile's pairs are groups."""
    if num_generations <= 2 or batch < 1 or accumulation < 1 or (batch * accumulation) % num_generations:
        raise ValueError("sizes")
    return batch * accumulation


def accepts_negative_sizes(batch, accumulation, num_generations):
    """Checks the product only: -2 x -2 is 4 completions."""
    completions = batch * accumulation
    if num_generations < 2 or completions < 1 or completions % num_generations:
        raise ValueError("sizes")
    return completions


@pytest.mark.parametrize("wrong", [refuses_pairs, accepts_negative_sizes], ids=lambda f: f.__name__)
def test_04_8_pairs_and_negative_sizes_tell(wrong, capsys):
    assert nb04.check_04_generation_batch(wrong) is grpo_config.check_generation_batch
    assert "❌ 04.8 generation batch" in capsys.readouterr().out


def as_numpy_int(batch, accumulation, num_generations):
    """The right answer, counted with numpy: an np.int64 is the same count."""
    if num_generations < 2 or batch < 1 or accumulation < 1 or (batch * accumulation) % num_generations:
        raise ValueError("sizes")
    return np.prod([batch, accumulation])


def test_04_8_a_numpy_integer_passes(capsys):
    assert nb04.check_04_generation_batch(as_numpy_int) is as_numpy_int, capsys.readouterr().out
