"""The private part of transformers' ``Trainer`` the course uses, in one place, behind a version gate.

A run stopped or failed mid-way keeps a checkpoint of its last finished step, the one ``--resume`` continues from
(model, optimizer, scheduler, RNG, state). transformers writes it only from its training loop, through
``Trainer._save_checkpoint``; :func:`save_checkpoint` calls that one method (and :func:`load_checkpoint` its reader,
``Trainer._load_from_checkpoint``, to rebuild a torn final model), so a release that renames or reshapes
it reads as :class:`TransformersChanged`, "this course was tested with transformers 5.24; transformers a.b changed
<name>", never as an error of the learner's run.
"""

from __future__ import annotations

import inspect
from importlib.metadata import version
from typing import Any

TESTED_TRANSFORMERS = "5.24"  # the minor version constraints.txt pins and the tests ran on


class TransformersChanged(RuntimeError):
    """A private transformers name the course uses is gone or takes other arguments: the course's to fix."""


def changed(name: str, detail: str) -> TransformersChanged:
    """The error a rename shows: which name, what changed, and that the learner's run is not the cause."""
    return TransformersChanged(
        f"This course was tested with transformers {TESTED_TRANSFORMERS}; transformers {version('transformers')} "
        f"changed Trainer.{name} ({detail}). This is not a mistake in your run: install the tested versions (pip "
        "install -c constraints.txt, in the course folder) or report it to the course."
    )


def save_checkpoint(trainer: Any) -> None:
    """The trainer's own checkpoint of its current step, as its loop writes one at ``save_steps``
    (``Trainer._save_checkpoint``): ``checkpoint-<step>`` in the output folder, which a resume reads."""
    method = getattr(trainer, "_save_checkpoint", None)
    if not callable(method):
        raise changed("_save_checkpoint", "it is gone")
    try:
        inspect.signature(method).bind(trainer.model, trial=None)
    except TypeError as error:
        raise changed("_save_checkpoint", f"its parameters: {error}") from None
    method(trainer.model, trial=None)


def load_checkpoint(trainer: Any, checkpoint: Any) -> None:
    """The model weights of ``checkpoint`` loaded into the trainer's model, as a resume loads them
    (``Trainer._load_from_checkpoint``): a finished run's final model is rebuilt from its last checkpoint."""
    method = getattr(trainer, "_load_from_checkpoint", None)
    if not callable(method):
        raise changed("_load_from_checkpoint", "it is gone")
    try:
        inspect.signature(method).bind(str(checkpoint))
    except TypeError as error:
        raise changed("_load_from_checkpoint", f"its parameters: {error}") from None
    method(str(checkpoint))
