"""The verdicts every notebook's checks print, the comparison with the reference, and what a check hands back.

Each check prints a verdict with a hint and never raises, so a notebook with an unanswered exercise still
runs top to bottom (in CI too). An unanswered exercise is reported as such, not as wrong: a value left at
``None`` or ``...``, a function whose body is still the stub (``...``, ``pass``) or raises
``NotImplementedError``.

A check of a function or an object the notebook goes on using hands back what the notebook continues
with (``hand_back``): the learner's version when it passed, otherwise the package's reference, and it
says which. So ``advantages = check_01_advantages(advantages)`` keeps the rest of notebook 01 running
whatever the learner wrote.

``check_against_reference`` is the one place where a function the learner wrote in a notebook cell is
run next to the package's reference on a bank of ``Case``s (real GSM8K rows, edge cases, TRL's own
computation) and every difference is printed: the input, what the reference gives, what the learner's
version gives. The notebook modules (``nb01_grpo_concepts``...) build their case banks and call it.
"""

from __future__ import annotations

import math
import numbers
import sys
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch


def _stub() -> None:
    """A function whose body is only a docstring and ``...``: what the learner copies start with."""
    ...


def _pass_stub() -> None:
    pass


EMPTY_BODIES = {_stub.__code__.co_code, _pass_stub.__code__.co_code}


def has_empty_body(function: Any) -> bool:
    """True for a function whose body does nothing (``...``, ``pass``, only a docstring or comments)."""
    code = getattr(function, "__code__", None)
    if code is None or code.co_code not in EMPTY_BODIES:
        return False
    returned = [c for c in code.co_consts if c is not None and c != function.__doc__]
    return not returned  # `lambda text: 0` compiles to the same instructions, returning 0 rather than None


def is_unanswered(answer: Any) -> bool:
    """True for the placeholders the notebooks start with: ``None``, ``...``, or a function with an empty body."""
    return answer is None or answer is Ellipsis or has_empty_body(answer)


_SHOWN_ERRORS: set[int] = set()  # the errors already reported, so that one error is reported once


def library_error(places: Sequence[str]) -> str | None:
    """The error the last failed cell raised inside a library, when it came from one of ``places``; else None.

    ``places`` are parts of a library file's path (``"trl/trainer/grpo_config"``). A learner's
    ``GRPOConfig(...)`` that TRL refuses leaves the answer at None: the check then shows TRL's own message
    and where it came from, which is the learner's mistake, not an unanswered exercise. IPython keeps the
    last error of a cell in ``sys.last_value``; each error is reported once.
    """
    error = getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)
    if not isinstance(error, BaseException) or id(error) in _SHOWN_ERRORS:
        return None
    frames = [f for f in traceback.extract_tb(error.__traceback__) if any(p in f.filename.replace("\\", "/")
                                                                            for p in places)]
    if not frames:
        return None
    _SHOWN_ERRORS.add(id(error))
    where = frames[-1]
    library_path = where.filename.replace("\\", "/").rsplit("site-packages/", 1)[-1]
    message = " ".join(str(error).split())
    return f"{type(error).__name__}: {message[:300]} (raised in {library_path}, line {where.lineno})"


_FAILED_TRIES: dict[str, int] = {}  # failed tries per exercise in this kernel: the hint unfolds on the second
HINT_POINTER = "the collapsed hint under the exercise; a second failed try prints it here"


def hint_for(exercise: str, hint: str) -> str:
    """What a failed verdict says as its hint: a pointer the first time, the hint itself from the second try on.

    The first failure shows what differs, which is often enough; the hint stays folded until it is needed.
    """
    _FAILED_TRIES[exercise] = _FAILED_TRIES.get(exercise, 0) + 1
    return hint if _FAILED_TRIES[exercise] > 1 else HINT_POINTER


def report(exercise: str, correct: bool, hint: str, answer: Any = None) -> bool:
    """Print the verdict for one exercise and return it (an unanswered one gets no hint: it is in the notebook)."""
    if is_unanswered(answer):
        print(f"⏳ {exercise}: not answered yet. The hint is in the collapsed cell under the exercise.")
        return False
    print(f"✅ {exercise}: correct." if correct else f"❌ {exercise}: not yet. Hint: {hint_for(exercise, hint)}")
    return bool(correct)


def list_problems(exercise: str, heading: str, problems: Sequence[Any], hint: str, show: int | None = None) -> None:
    """Print a failed verdict: ``❌ exercise: heading:``, one problem a line (the first ``show``), then the hint."""
    print(f"❌ {exercise}: {heading}:")
    for problem in problems[:show]:
        print(f"   - {problem}")
    if show is not None and len(problems) > show:
        print(f"   ... and {len(problems) - show} more.")
    print(f"   Hint: {hint_for(exercise, hint)}")


def hand_back(exercise: str, passed: bool, yours: Any, reference: Any, reference_name: str) -> Any:
    """What the notebook continues with: ``yours`` when it passed, else ``reference``, saying which."""
    if passed:
        print(f"   {exercise}: the notebook continues with yours.")
        return yours
    print(f"   {exercise}: the notebook continues with the package's {reference_name}.")
    return reference


def number_problem(answer: Any) -> str | None:
    """Why ``answer`` is not a number the course can compute with (a string or a bool is not one), or None."""
    if isinstance(answer, bool) or not isinstance(answer, numbers.Real):
        return f"a number was expected (an int or a float, no quotes), got {type(answer).__name__} {answer!r:.40}"
    if not math.isfinite(answer):
        return f"a finite number was expected, got {answer}"
    return None


def close_to(answer: Any, expected: float, tolerance: float = 1e-6) -> bool:
    """True when ``answer`` is a number (not a string, not a bool) within ``tolerance`` of ``expected``."""
    return number_problem(answer) is None and abs(float(answer) - expected) <= tolerance


def report_number(exercise: str, answer: Any, expected: float, hint: str, tolerance: float = 1e-6) -> bool:
    """The verdict on a number answer: a value of another kind is named as such, before any comparison."""
    problem = None if is_unanswered(answer) else number_problem(answer)
    if problem:
        print(f"❌ {exercise}: {problem}.")
        return False
    return report(exercise, close_to(answer, expected, tolerance), hint, answer)


def report_name(exercise: str, answer: Any, names: set[str], hint: str) -> bool:
    """The verdict on a name answer (a field, a flag): a string that, without quotes or backticks, is in ``names``."""
    if not is_unanswered(answer) and not isinstance(answer, str):
        print(f"❌ {exercise}: a name was expected, as a string (\"...\"), got {type(answer).__name__} {answer!r:.40}.")
        return False
    text = answer.strip().strip("`'\"") if isinstance(answer, str) else ""
    return report(exercise, text in names, hint, answer)


# --- the learner's function against the reference ----------------------------------------------------


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
    if isinstance(expected, float) and not isinstance(got, bool) and isinstance(got, (int, float)):
        return math.isclose(got, expected, rel_tol=1e-4, abs_tol=tolerance)
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


def compare_with_reference(
    learner: Callable[..., Any],
    reference: Callable[..., Any],
    cases: Sequence[Case],
    same: Callable[[Any, Any], bool] = same_values,
    errors: str = "family",
    needs: Needs | None = None,
) -> list[Difference]:
    """Run both functions on every case; return the cases where they differ (in value, or in raising).

    Where the reference raises, the learner's version must raise too: refusing bad input is part of the
    behaviour being checked. ``errors="family"`` accepts any of ``BAD_INPUT_ERRORS`` for one of them;
    ``errors="kind"`` demands the same built-in kind (where the task names the error). ``needs`` says what
    the following cells need of a returned value (a tensor, a gradient), checked before the values are
    compared. A learner's ``NotImplementedError`` raises ``NotAnswered``.
    """
    if errors not in ("family", "kind"):
        raise ValueError(f"errors must be 'family' or 'kind', got {errors!r}")
    differences = []
    for case in cases:
        reference_args = case.args if case.reference_args is None else case.reference_args
        expected, got = _outcome(reference, reference_args), _outcome(learner, case.args)
        if problem := _needs_problem(needs, expected, got):
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
) -> bool:
    """Print whether the learner's function agrees with ``reference`` on ``cases``, listing what differs."""
    if not_a_function(exercise, learner, hint):
        return False
    try:
        differences = compare_with_reference(learner, reference, cases, same, errors, needs)
    except NotAnswered:
        report(exercise, False, hint, None)
        return False
    if not differences:
        print(f"✅ {exercise}: same result as the reference on all {len(cases)} cases.")
        return True
    heading = f"differs from the reference on {len(differences)} of {len(cases)} cases"
    list_problems(exercise, heading, differences, hint, show)
    return False


def shown(value: Any) -> str:
    """A value on one short line (sets sorted): what a verdict line prints."""
    if isinstance(value, (set, frozenset)):
        value = sorted(value)
    text = repr(value)
    return text if len(text) <= 70 else f"{text[:67]}..."


def field_differences(yours: Mapping[str, Any], reference: Mapping[str, Any]) -> list[str]:
    """One line per field whose value differs (a field missing on one side counts), in the reference's order."""
    lines = []
    for name in [*reference, *(k for k in yours if k not in reference)]:
        mine, theirs = yours.get(name, "(not set)"), reference.get(name, "(not set)")
        if mine != theirs:
            lines.append(f"{name}: yours {shown(mine)}, reference {shown(theirs)}")
    return lines



# --- real GSM8K rows for the case banks ----------------------------------------------------------


def dataset_column(dataset: Any, name: str) -> list[Any]:
    """One column of a ``Dataset``, a ``DatasetDict`` split or a list of dicts, as a list."""
    if isinstance(dataset, Sequence) and not isinstance(dataset, str):
        return [row[name] for row in dataset]
    return list(dataset[name])


def short_repr(text: Any, width: int = 32) -> str:
    """``text`` on one line, cut from the front to ``width`` characters: a case label that fits a verdict line."""
    flat = " ".join(str(text).split())
    return repr(flat if len(flat) <= width else f"...{flat[-width + 3 :]}")


def real_row_indices(dataset: Any, count: int = 24) -> list[int]:
    """The first rows, and the rows whose final answer has a comma, a sign, a ``$`` or a decimal point.

    Those are the rows one-line parsers get wrong, so they belong in every check on real data.
    """
    answers = dataset_column(dataset, "answer")
    tricky = [i for i, text in enumerate(answers) if any(c in text.rsplit("####", 1)[-1] for c in ",-$.")]
    first = list(range(min(count // 2, len(answers))))
    return sorted(set(first + tricky[: count - len(first)]))


def dataset_rows(dataset: Any, indices: Sequence[int]) -> list[dict[str, Any]]:
    """The rows at ``indices`` as ``{"question", "answer"}`` dicts, whatever form the dataset has."""
    questions, answers = dataset_column(dataset, "question"), dataset_column(dataset, "answer")
    return [{"question": questions[i], "answer": answers[i]} for i in indices]
