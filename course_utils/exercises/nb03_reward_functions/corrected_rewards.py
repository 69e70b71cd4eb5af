"""03.1-03.5: the learner's corrected rewards run next to ``course_utils.lesson.rewards``' on every case bank.

Each check hands back what the notebook continues with: the learner's function when it passed, else the
package's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from course_utils.exercises.comparison import Case, check_against_reference, not_a_function
from course_utils.exercises.nb03_reward_functions.case_banks import batch_cases, mismatch_cases, reward_cases
from course_utils.exercises.nb03_reward_functions.trl_calls import (
    called_like_trl,
    synchronous,
)
from course_utils.exercises.verdicts import hand_back
from course_utils.lesson import rewards

CORRECTNESS = "03.1 correctness_reward_func"
INT = "03.2 int_reward_func"
STRICT_FORMAT = "03.3 strict_format_reward_func"
SOFT_FORMAT = "03.4 soft_format_reward_func"
XMLCOUNT = "03.5 xmlcount_reward_func"
# Hints point the way in words; the notebook shows the same ones, collapsed.
CORRECTNESS_HINT = (
    "read every completion's text with completion_texts, take its last answer block with extract_xml_answer, "
    "and let answers_match compare it with the gold answer at the same position (zip strictly)"
)
INT_HINT = (
    "plain_number reads the answer block as a Decimal, or None when it is not a number; a whole number is one "
    "that equals its integral value (Decimal has a method for that); None earns nothing"
)
STRICT_FORMAT_HINT = (
    "allow one final newline, demand each of the four tags exactly once, the right start and end, and one "
    "separator between the blocks (str.partition); reasoning and answer must not be blank"
)
SOFT_FORMAT_HINT = (
    "strip the text first; it starts with the reasoning tag; split what follows at the first closing reasoning "
    "tag (str.partition); the rest, stripped on the left, opens the answer block and closes it later"
)
XMLCOUNT_HINT = (
    "a tag counts when it appears once, alone on its line, and after the tag before it; the penalty counts only "
    "non-space characters after the last closing answer tag (str.rpartition), and stops at 0.5"
)


def rewards_needs(expected: list[float], got: Any) -> str | None:
    """What TRL and the next cells do with a reward's return: one float per completion, in a list."""
    if not isinstance(got, (list, tuple)):
        return f"returns a {type(got).__name__}: TRL needs a list with one reward per completion"
    if len(got) != len(expected):
        return f"returns {len(got)} reward(s) for {len(expected)} completion(s): one per completion"
    return None


def _check_reward(
    exercise: str, learner: Any, reference: Callable[..., Any], dataset: Any, hint: str, extra: Sequence[Case] = ()
) -> Any:
    """Run the learner's reward next to the reference on every case; hand back the one the notebook continues with."""
    cases = [*reward_cases(dataset), *batch_cases(dataset), *extra]
    passed = not not_a_function(exercise, learner, hint) and check_against_reference(
        exercise, called_like_trl(learner), called_like_trl(reference), cases, hint=hint, needs=rewards_needs
    )
    return hand_back(exercise, passed, synchronous(learner), reference, f"rewards.{reference.__name__}")


def check_03_correctness(learner: Any, dataset: Any) -> Any:
    """03.1: the learner's corrected ``correctness_reward_func``; hands back theirs or ``rewards``'."""
    extra = mismatch_cases(dataset)
    return _check_reward(CORRECTNESS, learner, rewards.correctness_reward_func, dataset, CORRECTNESS_HINT, extra)


def check_03_int(learner: Any, dataset: Any) -> Any:
    """03.2: the learner's corrected ``int_reward_func`` (0.5 for a whole number); hands back theirs or ``rewards``'."""
    return _check_reward(INT, learner, rewards.int_reward_func, dataset, INT_HINT)


def check_03_strict_format(learner: Any, dataset: Any) -> Any:
    """03.3: the learner's corrected ``strict_format_reward_func``; hands back theirs or ``rewards``'."""
    return _check_reward(STRICT_FORMAT, learner, rewards.strict_format_reward_func, dataset, STRICT_FORMAT_HINT)


def check_03_soft_format(learner: Any, dataset: Any) -> Any:
    """03.4: the learner's corrected ``soft_format_reward_func``; hands back theirs or ``rewards``'."""
    return _check_reward(SOFT_FORMAT, learner, rewards.soft_format_reward_func, dataset, SOFT_FORMAT_HINT)


def check_03_xmlcount(learner: Any, dataset: Any) -> Any:
    """03.5: the learner's corrected ``xmlcount_reward_func``; hands back theirs or ``rewards``'."""
    return _check_reward(XMLCOUNT, learner, rewards.xmlcount_reward_func, dataset, XMLCOUNT_HINT)
