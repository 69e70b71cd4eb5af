"""A function's outcomes on a list of inputs computed in a child process that is stopped when one input runs
too long, then replayed: how 08.2 runs a learner's calculator on ``9**9**9`` without hanging the notebook."""

from __future__ import annotations

import builtins
import functools
import multiprocessing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

SECONDS_PER_CASE = 3.0  # the reference answers each case in well under a millisecond


@dataclass(frozen=True)
class Outcome:
    """What one call did in the child process: a value, or the built-in kind and message of what it raised."""

    value: Any = None
    error_kind: str = ""
    message: str = ""


def _builtin_kind(exc: BaseException) -> str:
    return next(cls.__name__ for cls in type(exc).__mro__ if cls.__module__ == "builtins")


def _run_cases(function: Callable[..., Any], inputs: list[tuple[Any, ...]], connection: Any) -> None:
    """In the child process: each input's outcome sent back as soon as it is known."""
    for key, args in enumerate(inputs):
        try:
            outcome = Outcome(value=function(*args))
        except BaseException as exc:  # every outcome is sent back and compared, none is raised here
            outcome = Outcome(error_kind=_builtin_kind(exc), message=" ".join(str(exc).split())[:200])
        try:
            connection.send((key, outcome))
        except Exception:  # a value that cannot be sent back is described instead
            connection.send((key, Outcome(value=f"<unsendable {type(outcome.value).__name__}>")))
    connection.close()


def isolated_outcomes(function: Callable[..., Any], inputs: list[tuple[Any, ...]],
                      seconds: float = SECONDS_PER_CASE) -> list[Outcome]:
    """Each input's outcome, computed in a forked child process that is stopped when one input takes ``seconds``.

    Why: a calculator built on ``eval`` or an unbounded ``**`` computes ``9**9**9`` for minutes in one C call that
    no signal interrupts; a child process can be stopped. The input that ran out of time reads as a
    ``TimeoutError``, and the remaining inputs run in a new child.
    """
    context = multiprocessing.get_context("fork")
    outcomes: list[Outcome] = []
    while len(outcomes) < len(inputs):
        remaining = inputs[len(outcomes) :]
        receiver, sender = context.Pipe(duplex=False)
        child = context.Process(target=_run_cases, args=(function, remaining, sender), daemon=True)
        child.start()
        sender.close()
        while len(outcomes) < len(inputs):
            if not receiver.poll(seconds):
                outcomes.append(Outcome(error_kind="TimeoutError", message=f"did not finish within {seconds:g} s"))
                break
            try:
                outcomes.append(receiver.recv()[1])
            except EOFError:  # the child died (out of memory, say) on this input
                outcomes.append(Outcome(error_kind="MemoryError", message="the process running it died"))
                break
        child.kill()
        child.join()
        receiver.close()
    return outcomes


def replayed_error(outcome: Outcome) -> Exception:
    """The error a recorded outcome raised, as its built-in kind (``CalculatorError`` comes back a ``ValueError``)."""
    kind = getattr(builtins, outcome.error_kind, None)
    if isinstance(kind, type) and issubclass(kind, Exception):
        try:
            return kind(outcome.message)
        except TypeError:  # a kind with other arguments (UnicodeDecodeError): its name and message
            pass
    return RuntimeError(f"{outcome.error_kind}: {outcome.message}")


def replayed(learner: Callable[..., Any], outcomes: dict[tuple[Any, ...], Outcome]) -> Callable[..., Any]:
    """A function that gives back the recorded outcome of each input: what the comparison runs as the learner's."""

    @functools.wraps(learner)  # the learner's name and module: the comparison reports it as theirs
    def call(*args: Any) -> Any:
        outcome = outcomes[args]
        if outcome.error_kind:
            raise replayed_error(outcome)
        return outcome.value

    return call



def fork_available() -> bool:
    return "fork" in multiprocessing.get_all_start_methods()
