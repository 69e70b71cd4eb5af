"""The verdicts every notebook's checks print, and what a check hands back.

Each check prints a verdict with a hint and never raises, so a notebook with an unanswered exercise still
runs top to bottom (in CI too). An unanswered exercise is reported as such, not as wrong: a value left at
``None`` or ``...``, a function whose body is still the stub (``...``, ``pass``) or raises
``NotImplementedError``.

A check of a function or an object the notebook goes on using hands back what the notebook continues
with (``hand_back``): the learner's version when it passed, otherwise the package's reference, and it
says which. So ``advantages = check_01_advantages(advantages)`` keeps the rest of notebook 01 running
whatever the learner wrote.
"""

from __future__ import annotations

import math
import numbers
import sys
import traceback
from collections.abc import Mapping, Sequence
from typing import Any


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


def plain_number(answer: Any) -> Any:
    """A 0-d tensor or array (what ``advantages(...)[0]`` returns) as the number it holds; anything else as given."""
    if getattr(answer, "ndim", None) == 0 and callable(getattr(answer, "item", None)):
        try:
            return answer.item()
        except Exception:  # an object that only looks like a tensor is judged as it is
            return answer
    return answer


def number_problem(answer: Any) -> str | None:
    """Why ``answer`` is not a number the course can compute with (a string or a bool is not one), or None.

    A 0-d tensor is the number it holds (``plain_number``).
    """
    answer = plain_number(answer)
    if isinstance(answer, bool) or not isinstance(answer, numbers.Real):
        return (f"a number was expected (an int, a float or a 0-d tensor, no quotes), got {type(answer).__name__} "
                f"{answer!r:.40}")
    if not math.isfinite(answer):
        return f"a finite number was expected, got {answer}"
    return None


def close_to(answer: Any, expected: float, tolerance: float = 1e-6) -> bool:
    """True when ``answer`` is a number (not a string, not a bool) within ``tolerance`` of ``expected``."""
    return number_problem(answer) is None and abs(float(plain_number(answer)) - expected) <= tolerance


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
