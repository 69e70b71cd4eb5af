"""How every check of notebook 04 judges a construct: one verdict, every problem found, and a learner's call that
raised inside TRL or peft shown with the library's own message, not as unanswered. Checks never raise.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from course_utils.exercises.verdicts import is_unanswered, library_error, list_problems, report

# Where the library code a construct runs lives: an error raised there by the learner's call is the learner's mistake.
TRL_CONFIG = ("trl/trainer/grpo_config", "trl/trainer/sft_config", "transformers/training_args")
PEFT = ("peft/",)
TRL_TRAINER = ("trl/trainer/", "peft/", "transformers/trainer")


def judge(exercise: str, answer: Any, problems: Sequence[str], hint: str, raised_in: Sequence[str] = ()) -> bool:
    """Print the verdict on a construct: not answered, correct, or every problem found (one a line).

    An answer left at None because the learner's call raised inside the library (``raised_in``) is reported
    with the library's own message, not as unanswered.
    """
    if answer is None and (error := library_error(raised_in)):
        print(f"❌ {exercise}: your call raised an error in the library, so nothing was built:\n   {error}")
        return False
    if is_unanswered(answer) or not problems:
        return report(exercise, not problems, hint, answer)
    list_problems(exercise, f"not yet, {len(problems)} problem{'s' * (len(problems) > 1)}", problems, hint)
    return False


def problems_of(find: Callable[..., list[str]], *args: Any) -> list[str]:
    """``find(*args)``, with an error of the learner's object read as one more problem: a check never raises."""
    try:
        return find(*args)
    except Exception as exc:  # an object too odd to inspect is a verdict, not a crash of the notebook
        return [f"could not be checked ({type(exc).__name__}: {exc})"]


def kind_problem(answer: Any, kind: type, name: str) -> list[str]:
    """The problem of an answer that is not a ``kind`` at all (what to build instead); empty when it is one."""
    return [] if isinstance(answer, kind) else [f"a {type(answer).__name__}, not a {name}; build one with {name}(...)"]
