"""course_utils.core.trl_internals: TRL's private methods the lesson asks, in one module, behind a version gate.

Checked against the installed TRL: every name is there and the tested minor version is installed; a rename or a
changed signature reads as the course's problem ("this course was tested with TRL 1.16; TRL a.b changed ..."),
never the learner's; the reward keyword arguments are TRL's own; and no module outside this gate and ``cpu_speed``
reaches for a private name of TRL, transformers or PEFT (read from the source with ``ast``).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from conftest import REPO_ROOT
from trl import GRPOTrainer

from course_utils.core import transformers_internals, trl_internals
from course_utils.core.trl_internals import TRLChanged
from course_utils.lesson.trl_grpo import trl_reward_extras, trl_reward_values, trl_trainer

PACKAGE = REPO_ROOT / "course_utils"
GATED = {PACKAGE / "core" / "trl_internals.py", PACKAGE / "core" / "transformers_internals.py"}
LIBRARIES = ("trl", "transformers", "peft")


def test_the_installed_trl_is_the_tested_one_and_has_every_name():
    assert trl_internals.tested_minor(), f"TRL {trl_internals.installed_trl()} is not {trl_internals.TESTED_TRL}"
    assert trl_internals.missing() == []


def test_a_missing_method_is_named_as_a_trl_change():
    class RenamedInANewTRL(GRPOTrainer):
        _compute_loss = None

    assert trl_internals.missing(RenamedInANewTRL) == ["_compute_loss"]


class OlderTrainer:
    """A trainer whose private methods were renamed or reshaped, as a TRL release may do."""

    model = None

    def _compute_loss(self, model, inputs, extra_argument):  # a parameter added
        raise AssertionError("never called: the arguments do not fit")


@pytest.mark.parametrize(
    ("call", "name"),
    [
        (lambda t: trl_internals.compute_loss(t, {}), "_compute_loss"),
        (lambda t: trl_internals.generate_and_score(t, []), "_generate_and_score_completions"),
        (lambda t: trl_internals.logged_metrics(t), "_metrics"),
        (lambda t: trl_internals.calculate_rewards(t, [], [], [], []), "_calculate_rewards"),
    ],
)
def test_a_rename_reads_as_the_courses_problem_not_the_learners(call, name):
    with pytest.raises(TRLChanged) as error:
        call(OlderTrainer())
    message = str(error.value)
    assert message.startswith(f"This course was tested with TRL {trl_internals.TESTED_TRL}; TRL ")
    assert f"changed GRPOTrainer.{name}" in message and "not a mistake in your code" in message


def test_an_error_inside_trls_method_goes_through_unchanged():
    """TRL's own checks (a wrong number of rewards) are TRL's words, not a rename."""
    with pytest.raises(ValueError, match="returned 1 rewards"):
        trl_reward_values(lambda completions, **_: [1.0], ["a", "b"], ["x", "y"])


def test_the_reward_keywords_are_read_from_trls_reward_code():
    extras = trl_reward_extras()
    assert {"trainer_state", "log_extra", "log_metric"} <= set(extras)
    assert not set(extras) & set(trl_internals.CALL_ARGUMENTS)
    assert extras["trainer_state"].max_steps == 10 and callable(extras["log_metric"])
    trainer = trl_trainer(4)
    seen = trl_internals.recorded_reward_call(trainer)
    assert set(seen) == {*trl_internals.CALL_ARGUMENTS, *extras}  # every keyword TRL passed, and only those

    def strict_reward(prompts, completions, completion_ids, trainer_state, log_extra, log_metric):
        return [1.0] * len(completions)

    expected = [name for name in seen if name not in trl_internals.CALL_ARGUMENTS]
    assert strict_reward(prompts=["p"], completions=["c"], completion_ids=[[1]], **extras) == [1.0], expected


# --- No private name of TRL, transformers or PEFT outside the gate ------------------------------------------------


def names_defined_in(paths: list[Path]) -> set[str]:
    """Every name the package defines itself (functions, classes, variables, attributes, arguments, imports)."""
    defined = set()
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                defined.add(node.name)
            elif isinstance(node, (ast.Name, ast.Attribute)) and isinstance(node.ctx, ast.Store):
                defined.add(node.id if isinstance(node, ast.Name) else node.attr)
            elif isinstance(node, ast.arg):
                defined.add(node.arg)
            elif isinstance(node, ast.alias):
                defined.add(node.asname or node.name.rsplit(".", 1)[-1])
    return defined


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def foreign_private_names(path: Path, ours: set[str]) -> list[str]:
    """``file:line name`` for each private attribute ``path`` reads that the package does not define (so a
    library's), by attribute, ``getattr``/``hasattr``/``setattr`` string, or ``from trl... import _name``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        names = []
        if isinstance(node, ast.Attribute) and _private(node.attr):
            names = [node.attr]
        elif isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("getattr", "hasattr", "setattr"):
            names = [a.value for a in node.args[1:2] if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in LIBRARIES:
            names = [alias.name for alias in node.names]
        found += [f"{path}:{node.lineno} {name}" for name in names
                  if _private(name) and name not in ours]  # fmt: skip
    return found


def test_the_scan_reads_attributes_strings_and_imports(tmp_path):
    source = tmp_path / "sample.py"
    source.write_text(
        "from trl.trainer.utils import _use_triton\n"
        "def f(trainer, _ours):\n    x = trainer._compute_loss\n    y = _ours._also_ours\n"
        "    return getattr(trainer, '_metrics')\n"
        "def g(obj):\n    obj._also_ours = 1\n"
    )
    found = [line.split()[-1] for line in foreign_private_names(source, {"_also_ours", "_ours"})]
    assert sorted(found) == ["_compute_loss", "_metrics", "_use_triton"]


def test_no_private_name_of_trl_transformers_or_peft_outside_the_gate():
    paths = sorted(PACKAGE.rglob("*.py")) + sorted((PACKAGE.parent / "scripts").glob("*.py"))
    outside = [p for p in paths if p not in GATED and "cpu_speed" not in p.parts]
    ours = names_defined_in(outside)  # not the plug-in's: it assigns TRL's private names when it patches them
    found = [line for path in outside for line in foreign_private_names(path, ours)]
    assert not found, "private library names outside core/trl_internals.py (call them through it):\n" + "\n".join(
        found
    )


# --- transformers' Trainer: the checkpoint of a stopped run -------------------------------------------------------


def test_save_checkpoint_writes_what_a_resume_reads(tmp_path):
    from datasets import Dataset
    from transformers import Trainer, TrainingArguments

    from course_utils.lesson.models import build_tiny_random_model

    rows = Dataset.from_list([{"input_ids": [1, 2, 3, 4], "labels": [1, 2, 3, 4]}] * 2)
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=1, save_strategy="no", report_to=[], use_cpu=True,
                             per_device_train_batch_size=2)  # fmt: skip
    trainer = Trainer(model=build_tiny_random_model(hidden_size=16), args=args, train_dataset=rows)
    trainer.train()
    transformers_internals.save_checkpoint(trainer)
    saved = {path.name for path in (tmp_path / "checkpoint-1").iterdir()}
    assert {"trainer_state.json", "optimizer.pt", "scheduler.pt"} <= saved, saved


def test_a_renamed_checkpoint_method_reads_as_the_courses_problem():
    class Renamed:
        model = None

    with pytest.raises(transformers_internals.TransformersChanged, match=r"tested with transformers 5\.24"):
        transformers_internals.save_checkpoint(Renamed())
