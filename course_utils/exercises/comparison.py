"""A function the learner wrote in a notebook cell, run next to the package's reference on a bank of cases.

``check_against_reference`` is the one place where a learner's function is run next to the package's reference
on a bank of ``Case``s (real GSM8K rows, edge cases, TRL's own computation) and every difference is printed:
the input, what the reference gives, what the learner's version gives. The notebook modules
(``nb01_grpo_concepts``...) build their case banks and call it; the verdict it prints is ``verdicts``'.
"""

from __future__ import annotations

import copy
import inspect
import math
import numbers
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from course_utils.exercises.verdicts import is_unanswered, list_problems, report


@dataclass(frozen=True)
class Case:
    """One input on which the learner's function must give what the reference gives."""

    label: str  # shown when the two differ: say what the case is about ("real row 12", "thousands separator")
    args: tuple[Any, ...]
    reference_args: tuple[Any, ...] | None = None  # the same problem in the form the reference takes, if different


@dataclass(frozen=True)
class Difference:
    """A case where the learner's function and the reference disagree, both outcomes in words."""

    label: str
    reference: str
    yours: str

    def __str__(self) -> str:
        return f"{self.label}: the reference {self.reference}, yours {self.yours}"


def same_values(expected: Any, got: Any, tolerance: float = 1e-5) -> bool:
    """Equal values; tensors and floats within ``tolerance`` (absolute, plus 1e-4 relative), containers item by item."""
    if isinstance(expected, torch.Tensor):  # a list or a float is not a tensor: the next cells call tensor methods
        if not isinstance(got, torch.Tensor) or got.shape != expected.shape or got.is_floating_point() != (
            expected.is_floating_point()
        ):
            return False
        return torch.allclose(got.detach().to(expected.dtype), expected, rtol=1e-4, atol=tolerance)
    if isinstance(expected, float) and not isinstance(got, bool) and isinstance(got, numbers.Real):
        return math.isclose(got, expected, rel_tol=1e-4, abs_tol=tolerance)
    if type(expected) is int and isinstance(got, numbers.Integral) and not isinstance(got, bool):
        return int(got) == expected  # numpy's int64 is the same count
    if isinstance(expected, Mapping):
        return (
            isinstance(got, Mapping)
            and set(got) == set(expected)
            and all(same_values(expected[key], got[key], tolerance) for key in expected)
        )
    if isinstance(expected, (list, tuple)):
        return (
            isinstance(got, (list, tuple))
            and len(got) == len(expected)
            and all(same_values(e, g, tolerance) for e, g in zip(expected, got, strict=True))
        )
    return type(got) is type(expected) and got == expected


class NotAnswered(Exception):
    """The learner's function raised ``NotImplementedError``: a stub, not a wrong answer."""


def _outcome(function: Callable[..., Any], args: tuple[Any, ...]) -> tuple[bool, Any]:
    """``(True, value)`` or ``(False, the exception)``: a raised error is an outcome to compare, not a crash."""
    try:
        return True, function(*args)
    except NotImplementedError as exc:
        raise NotAnswered(str(exc)) from exc
    except Exception as exc:  # any error of the learner's code is reported, never raised
        return False, exc


def _error_kind(exc: BaseException) -> type[BaseException]:
    """The built-in class an error belongs to (``GSM8KFormatError`` -> ``ValueError``): what a learner can match."""
    return next(cls for cls in type(exc).__mro__ if cls.__module__ == "builtins")


# Errors that all say "this input is not what I take": where the reference refuses an input with one of them,
# a learner's version that refuses it with another is right (validating first gives TypeError, not AttributeError).
BAD_INPUT_ERRORS = (ValueError, TypeError, AttributeError, KeyError, IndexError)


def _same_refusal(expected: BaseException, got: BaseException, errors: str) -> bool:
    if errors == "any":  # the caller catches every error (TRL's tool calls): a run out of time is no refusal
        return not isinstance(got, (TimeoutError, MemoryError))
    if errors == "family" and isinstance(expected, BAD_INPUT_ERRORS):
        return isinstance(got, BAD_INPUT_ERRORS)
    return isinstance(got, _error_kind(expected))


def _describe(ok: bool, value: Any, width: int = 90) -> str:
    text = f"returns {value!r}" if ok else f"raises {type(value).__name__}: {value}"
    text = " ".join(text.split())
    return text if len(text) <= width else f"{text[: width - 3]}..."


def _where_they_differ(expected: Any, got: Any, path: str = "") -> tuple[str, Any, Any]:
    """The first place inside two containers where the values differ: ``("['answer']", '1080', '1,080')``."""
    if isinstance(expected, Mapping) and isinstance(got, Mapping) and set(expected) == set(got):
        for key in expected:
            if not same_values(expected[key], got[key]):
                return _where_they_differ(expected[key], got[key], f"{path}[{key!r}]")
    if isinstance(expected, (list, tuple)) and isinstance(got, (list, tuple)) and len(expected) == len(got):
        for index, (e, g) in enumerate(zip(expected, got, strict=True)):
            if not same_values(e, g):
                return _where_they_differ(e, g, f"{path}[{index}]")
    if isinstance(expected, str) and isinstance(got, str):
        start = next(
            (i for i, (e, g) in enumerate(zip(expected, got, strict=False)) if e != g), min(map(len, (expected, got)))
        )
        if start > 24:  # show where the strings part, not their common beginning
            return f"{path}[{start - 12}:]", expected[start - 12 :], got[start - 12 :]
    return path, expected, got


def _difference(label: str, expected: tuple[bool, Any], got: tuple[bool, Any]) -> Difference:
    if expected[0] and got[0] and isinstance(expected[1], torch.Tensor) and kind_of(expected[1]) != kind_of(got[1]):
        return Difference(label, f"returns {kind_of(expected[1])}", f"returns {kind_of(got[1])}")
    if expected[0] and got[0]:
        path, expected_part, got_part = _where_they_differ(expected[1], got[1])
        if path:
            return Difference(f"{label}, at {path}", _describe(True, expected_part), _describe(True, got_part))
    return Difference(label, _describe(*expected), _describe(*got))


def kind_of(value: Any) -> str:
    """What a value is, in the words a verdict uses: ``a float32 tensor of shape (4,)``, ``a list``."""
    if isinstance(value, torch.Tensor):
        grad = ", carrying the gradient" if value.grad_fn is not None else ""
        return f"a {str(value.dtype).removeprefix('torch.')} tensor of shape {tuple(value.shape)}{grad}"
    if isinstance(value, (list, tuple)):
        return f"a {type(value).__name__} of {len(value)}"
    return f"a {type(value).__name__}"


# What the cells after an exercise need of the value the learner's function returns: given the reference's
# value and the learner's, the problem in words (what the next cells would do with it), or None.
Needs = Callable[[Any, Any], str | None]


def _needs_problem(needs: Needs | None, expected: tuple[bool, Any], got: tuple[bool, Any]) -> str | None:
    if needs is None or not (expected[0] and got[0]):
        return None
    try:
        return needs(expected[1], got[1])
    except Exception as exc:  # a value too odd to inspect is a difference, not a crash
        return f"returns {kind_of(got[1])} that cannot be inspected ({type(exc).__name__})"


def _agree(
    expected: tuple[bool, Any], got: tuple[bool, Any], same: Callable[[Any, Any], bool], errors: str = "family"
) -> bool:
    (expected_ok, expected_value), (got_ok, got_value) = expected, got
    if not expected_ok:  # the reference refuses this input: the learner's version must refuse it too
        return not got_ok and _same_refusal(expected_value, got_value, errors)
    if not got_ok:
        return False
    try:
        return bool(same(expected_value, got_value))
    except Exception:  # a value that cannot even be compared is a difference
        return False


def _shared_inputs(value: Any, depth: int = 0) -> list[Any]:
    """The inputs shared, not copied: datasets (``map`` returns a new one) and bound methods (TRL's ``log_extra``
    and ``log_metric`` belong to its trainer, and copying one copies the trainer and its model)."""
    if type(value).__module__.startswith("datasets.") or inspect.ismethod(value):
        return [value]
    if depth < 3 and isinstance(value, (list, tuple)):
        return [found for item in value for found in _shared_inputs(item, depth + 1)]
    if depth < 3 and isinstance(value, Mapping):
        return [found for item in value.values() for found in _shared_inputs(item, depth + 1)]
    return []


def own_copy(args: Any) -> Any:
    """A deep copy of a case's inputs: each function gets its own, so neither can change what the other reads."""
    memo = {id(shared): shared for shared in _shared_inputs(args)}
    try:
        return copy.deepcopy(args, memo)
    except Exception:  # an input that cannot be copied is shared, as the notebook shares it
        return args


def _same_content(before: Any, after: Any) -> bool:
    """``after`` holds what ``before`` held: tensors, arrays, containers and plain values; other objects pass."""
    if isinstance(before, torch.Tensor):
        return isinstance(after, torch.Tensor) and before.shape == after.shape and bool(
            torch.equal(before, after) or (before.is_floating_point() and after.dtype == before.dtype
                                         and torch.allclose(before, after, rtol=0, atol=0, equal_nan=True)))
    if isinstance(before, np.ndarray):
        return isinstance(after, np.ndarray) and before.shape == after.shape and np.array_equal(
            before, after, equal_nan=before.dtype.kind in "fc")
    if isinstance(before, Mapping):
        return isinstance(after, Mapping) and set(before) == set(after) and all(
            _same_content(before[key], after[key]) for key in before)
    if isinstance(before, (list, tuple)):
        return isinstance(after, (list, tuple)) and len(before) == len(after) and all(
            _same_content(b, a) for b, a in zip(before, after, strict=True))
    if isinstance(before, float) and isinstance(after, float) and math.isnan(before) and math.isnan(after):
        return True
    if isinstance(before, (str, bytes, numbers.Number, type(None))):
        return type(before) is type(after) and before == after
    return True


def changed_input(before: Any, after: Any, path: str = "") -> str | None:
    """Where ``after`` no longer holds what ``before`` held (``"[0]['completions']"``), or None when nothing changed."""
    if _same_content(before, after):
        return None
    if isinstance(before, Mapping) and isinstance(after, Mapping) and set(before) == set(after):
        return next(changed_input(before[k], after[k], f"{path}[{k!r}]") for k in before
                    if not _same_content(before[k], after[k]))
    if isinstance(before, (list, tuple)) and isinstance(after, (list, tuple)) and len(before) == len(after):
        return next(changed_input(b, a, f"{path}[{i}]") for i, (b, a) in enumerate(zip(before, after, strict=True))
                    if not _same_content(b, a))
    return path or "(the whole input)"


def mutation_message(where: str) -> str:
    """What an answer that changed its input in place is told: the caller goes on using that input."""
    return (f"changes its input in place, at {where}: the caller goes on using it (TRL hands the same objects to "
            "every reward and to its logs); build new values instead")


def mutation_difference(label: str, where: str) -> Difference:
    """The difference of an answer that changed what it was given: the caller goes on using its inputs."""
    return Difference(label, "leaves its inputs as they were", mutation_message(where))


def call_on_copy(function: Callable[..., Any], kwargs: Mapping[str, Any]) -> tuple[Any, str | None]:
    """``function(**kwargs)`` on its own deep copy of ``kwargs``: its value, and where it changed that copy, or None.

    For checks that call a learner's function themselves (a reward called as TRL calls it), not through
    ``compare_with_reference``; an error of the function propagates.
    """
    snapshot = dict(kwargs)
    given = own_copy(snapshot)
    value = function(**given)
    return value, changed_input(snapshot, given) if given is not snapshot else None


def compare_with_reference(
    learner: Callable[..., Any],
    reference: Callable[..., Any],
    cases: Sequence[Case],
    same: Callable[[Any, Any], bool] = same_values,
    errors: str = "family",
    needs: Needs | None = None,
    keeps_inputs: bool = True,
) -> list[Difference]:
    """Run both functions on every case, each on its own deep copy; return the cases where they differ.

    Where the reference raises, the learner's version must raise too: refusing bad input is part of the
    behaviour being checked. ``errors="family"`` accepts any of ``BAD_INPUT_ERRORS`` for one of them;
    ``errors="kind"`` demands the same built-in kind (where the task names the error); ``errors="any"`` accepts
    any error (where the caller catches every one). ``needs`` says what the following cells need of a returned
    value (a tensor, a gradient), checked before the values are compared. ``keeps_inputs``: an answer that changes
    its inputs in place differs (not for ``Dataset.map`` functions, which get a fresh row each call). A learner's
    ``NotImplementedError`` raises ``NotAnswered``.
    """
    if errors not in ("family", "kind", "any"):
        raise ValueError(f"errors must be 'family', 'kind' or 'any', got {errors!r}")
    differences = []
    for case in cases:
        reference_args = case.args if case.reference_args is None else case.reference_args
        expected = _outcome(reference, own_copy(reference_args))
        given = own_copy(case.args)
        got = _outcome(learner, given)
        where = changed_input(case.args, given) if keeps_inputs and given is not case.args else None
        if where:
            differences.append(mutation_difference(case.label, where))
        elif problem := _needs_problem(needs, expected, got):
            differences.append(Difference(case.label, f"returns {kind_of(expected[1])}", problem))
        elif not _agree(expected, got, same, errors):
            differences.append(_difference(case.label, expected, got))
    return differences


def package_origin(function: Any) -> str | None:
    """``module.name`` when ``function`` is the package's own (``course_utils...``), else None.

    A learner's function is defined in the notebook; one that comes from ``course_utils`` (``generation_batch =
    training.check_generation_batch``, or a ``functools.partial`` of it) is the reference, not an answer.
    """
    inner = getattr(function, "func", function)  # functools.partial
    module = getattr(inner, "__module__", None) or ""
    if module == "course_utils" or module.startswith("course_utils."):
        return f"{module}.{getattr(inner, '__qualname__', type(inner).__name__)}"
    return None


def not_a_function(exercise: str, learner: Any, hint: str) -> bool:
    """Report an unanswered exercise, an answer that is not a function, or the package's own function."""
    if is_unanswered(learner):
        report(exercise, False, hint, learner)
        return True
    if not callable(learner):
        print(f"❌ {exercise}: {type(learner).__name__} {learner!r:.40} is not a function; pass the function, no ().")
        return True
    if origin := package_origin(learner):
        print(f"❌ {exercise}: that is the package's own {origin}; write the function yourself.")
        return True
    return False


def check_against_reference(
    exercise: str,
    learner: Any,
    reference: Callable[..., Any],
    cases: Sequence[Case],
    *,
    hint: str,
    same: Callable[[Any, Any], bool] = same_values,
    errors: str = "family",
    needs: Needs | None = None,
    show: int = 4,
    keeps_inputs: bool = True,
) -> bool:
    """Print whether the learner's function agrees with ``reference`` on ``cases``, listing what differs."""
    if not_a_function(exercise, learner, hint):
        return False
    try:
        differences = compare_with_reference(learner, reference, cases, same, errors, needs, keeps_inputs)
    except NotAnswered:
        report(exercise, False, hint, None)
        return False
    if not differences:
        print(f"✅ {exercise}: same result as the reference on all {len(cases)} cases.")
        return True
    heading = f"differs from the reference on {len(differences)} of {len(cases)} cases"
    list_problems(exercise, heading, differences, hint, show)
    return False
