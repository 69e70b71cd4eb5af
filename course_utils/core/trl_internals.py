"""The private parts of TRL's ``GRPOTrainer`` the lesson asks, in one place, behind a version gate.

Notebooks 01 and 03 compare the learner's numbers with what the installed TRL computes, so they call a few methods
TRL does not promise to keep (``_generate_and_score_completions``, ``_compute_loss`` ...). Every such use goes
through this module (a test fails on one elsewhere, ``cpu_speed`` aside). When a TRL release renames or reshapes
one, the learner reads :class:`TRLChanged`, "this course was tested with TRL 1.16; TRL a.b changed <name>", never
an error that blames their code. The reward keyword arguments are read from TRL's own reward code
(:func:`reward_extras`), not copied.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from importlib.metadata import version
from typing import Any

from trl import GRPOTrainer

TESTED_TRL = "1.16"  # the minor version constraints.txt pins and the tests ran on
# GRPOTrainer's private names the lesson uses: methods, then attributes set in __init__
METHODS = (
    "_generate_and_score_completions",
    "_get_per_token_logps_and_entropies",
    "_compute_loss",
    "_calculate_rewards",
    "_log_completion_extra",
    "_log_metric",
)
ATTRIBUTES = ("_metrics",)
# The keywords TRL's reward code passes that are not dataset columns: TRL's own, read from a call (reward_extras)
CALL_ARGUMENTS = ("prompts", "completions", "completion_ids")


class TRLChanged(RuntimeError):
    """A private TRL name the course uses is gone or takes other arguments: the course's to fix, not the learner's."""


def installed_trl() -> str:
    return version("trl")


def tested_minor(installed: str | None = None) -> bool:
    """Whether ``installed`` (default: this environment's TRL) is the minor version the course was tested with."""
    return ".".join((installed or installed_trl()).split(".")[:2]) == TESTED_TRL


def changed(name: str, detail: str) -> TRLChanged:
    """The error a rename shows: which name, what changed, and that the learner's code is not the cause."""
    return TRLChanged(
        f"This course was tested with TRL {TESTED_TRL}; TRL {installed_trl()} changed GRPOTrainer.{name} ({detail}). "
        "This is not a mistake in your code: install the tested versions (pip install -c constraints.txt, in the "
        "course folder) or report it to the course."
    )


def missing(trainer_class: type = GRPOTrainer) -> list[str]:
    """The private methods the lesson uses that the installed ``GRPOTrainer`` lacks (empty when all are there)."""
    return [name for name in METHODS if not callable(getattr(trainer_class, name, None))]


def _call(trainer: Any, name: str, *args: Any, **kwargs: Any) -> Any:
    """``trainer.<name>(*args, **kwargs)``, a missing method or changed parameters raised as :class:`TRLChanged`.

    What the method itself raises (TRL's own checks, a reward function's error) goes through unchanged."""
    method = getattr(trainer, name, None)
    if not callable(method):
        raise changed(name, "it is gone")
    try:
        inspect.signature(method).bind(*args, **kwargs)
    except TypeError as error:
        raise changed(name, f"its parameters: {error}") from None
    return method(*args, **kwargs)


def generate_and_score(trainer: Any, inputs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """TRL's generation, rewards and advantages for ``inputs`` (``_generate_and_score_completions``)."""
    return _call(trainer, "_generate_and_score_completions", list(inputs))


def logged_metrics(trainer: Any, mode: str = "train") -> dict[str, list[float]]:
    """The metrics TRL has logged so far in ``mode`` (``_metrics``), each a list of values."""
    metrics = getattr(trainer, "_metrics", None)
    if not isinstance(metrics, dict) or mode not in metrics:
        raise changed("_metrics", f"no {mode!r} metrics dict on the trainer")
    return metrics[mode]


def per_token_logps(trainer: Any, input_ids: Any, attention_mask: Any, logits_to_keep: int) -> Any:
    """The completion tokens' log-probabilities under the trainer's model (``_get_per_token_logps_and_entropies``)."""
    output = _call(trainer, "_get_per_token_logps_and_entropies", trainer.model, input_ids, attention_mask,
                   logits_to_keep)  # fmt: skip
    if not isinstance(output, tuple) or not output:
        raise changed("_get_per_token_logps_and_entropies", f"it returns {type(output).__name__}, not a tuple")
    return output[0]


def compute_loss(trainer: Any, inputs: dict[str, Any]) -> Any:
    """TRL's GRPO loss of one micro-batch (``_compute_loss``)."""
    return _call(trainer, "_compute_loss", trainer.model, inputs)


def calculate_rewards(
    trainer: Any, inputs: list[dict[str, Any]], prompts: list[Any], completions: list[Any], completion_ids: list[Any]
) -> Any:
    """The rewards TRL's reward code gets from the trainer's reward functions (``_calculate_rewards``)."""
    return _call(trainer, "_calculate_rewards", inputs, prompts, completions, completion_ids)


class _Recorder:
    """A reward function that keeps the keyword arguments TRL called it with."""

    __name__ = "recorder"

    def __init__(self) -> None:
        self.seen: dict[str, Any] = {}

    def __call__(self, **kwargs: Any) -> list[float]:
        self.seen = kwargs
        return [0.0] * len(kwargs["completions"])


def recorded_reward_call(trainer: Any) -> dict[str, Any]:
    """The keyword arguments TRL's reward code passes a reward function, from one call on ``trainer`` (a prompt
    with no dataset columns, mid-run: step 1 of 10)."""
    recorder = _Recorder()
    own = trainer.reward_funcs, trainer.reward_func_names
    trainer.reward_funcs, trainer.reward_func_names = [recorder], ["recorder"]
    trainer.state.global_step, trainer.state.max_steps = 1, 10
    try:
        calculate_rewards(trainer, [{"prompt": "1 + 1 ="}], ["1 + 1 ="], [" 2"], [[17]])
    finally:
        trainer.reward_funcs, trainer.reward_func_names = own
    return recorder.seen


def reward_extras(trainer: Any) -> dict[str, Any]:
    """What TRL passes a reward function besides ``prompts``, ``completions``, ``completion_ids`` and the dataset's
    columns (TRL 1.16: ``trainer_state``, ``log_extra``, ``log_metric``), read from its reward code on ``trainer``.
    A reward called with these is called as ``GRPOTrainer`` calls it."""
    return {name: value for name, value in recorded_reward_call(trainer).items() if name not in CALL_ARGUMENTS}
