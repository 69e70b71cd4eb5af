"""The five GSM8K rewards, corrected, under TRL's reward signature.

Every function here takes ``(prompts, completions, answer, **kwargs)`` and returns one float per
completion, as ``GRPOTrainer`` expects. A completion is either plain text or a conversation
(``[{"role": "assistant", "content": "..."}]``); both are read by ``completion_text``.

Why "corrected": the popular versions (kept verbatim in ``course_utils.lesson.rewards.classic``) compare
answers as exact strings (``"1,000" != "1000"``), match multi-line reasoning without ``re.DOTALL``
(so it never matches), demand a trailing newline models rarely emit, and charge the whole completion
length as a "trailing text" penalty when that newline is missing. The versions here:

- never raise on what a model can produce (``None``, non-strings, 1 MB of tags): a crashing reward
  kills a training run hours in, a zero reward just teaches;
- use string scans (``find``/``count``), not backtracking regexes, so the cost stays linear in the
  completion length;
- check answers with Hugging Face ``math-verify`` behind a cheap exact numeric comparison.
"""

from __future__ import annotations

import re
import signal
import threading
from collections.abc import Callable, Mapping
from decimal import Decimal, InvalidOperation
from functools import lru_cache
from typing import Any

from course_utils.core.answer_format import (
    ANSWER_CLOSE,
    ANSWER_OPEN,
    REASONING_CLOSE,
    REASONING_OPEN,
    TAGS,
    extract_xml_answer,
)

RewardFunc = Callable[..., list[float]]

# Reward values (the classic magnitudes, kept so numbers in the course match the popular notebook).
CORRECT_REWARD = 2.0
INT_REWARD = 0.5
STRICT_FORMAT_REWARD = 0.5
SOFT_FORMAT_REWARD = 0.5
TAG_REWARD = 0.125
TRAILING_CHAR_PENALTY = 0.001
MAX_TRAILING_PENALTY = 0.5  # a floor: 500 junk characters already say "stop talking"; more adds nothing

# Math-verify is only asked about short answers: GSM8K answers are numbers, and sympy on a long
# string (or on ``9^9^9^9``) can take seconds.
_MATH_VERIFY_MAX_CHARS = 200
_MATH_VERIFY_TIMEOUT_S = 1  # math-verify's signal.alarm takes whole seconds
_EXPLOSIVE = ("^", "**", "!")  # power towers and factorials make sympy hang; never a GSM8K answer

# A plain number, optionally with ``$``, thousands separators and a trailing unit word:
# "$1,000", "18.00", "-3", "72 dollars". The pattern has no nested quantifiers: linear time.
_PLAIN_NUMBER = re.compile(
    r"\s*\$?\s*(?P<num>[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|[-+]?\.\d+)\s*%?\s*(?:[A-Za-z]{1,20}\s*)?\.?\s*"
)


# --- Reading completions ------------------------------------------------------------------------------


def _content_text(content: Any) -> str:
    """A message's content as text: a string, or the text parts of a multimodal list; else ``""``."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [p.get("text") for p in content if isinstance(p, Mapping)]
        return "".join(p for p in parts if isinstance(p, str))
    return ""


def completion_text(completion: Any) -> str:
    """The text of one completion, conversational or plain; ``""`` for anything else.

    TRL passes a plain string for standard datasets and a list of messages for conversational ones
    (usually a single assistant message). ``None``, numbers or malformed messages hold no text: they
    score like an empty completion instead of crashing the trainer.
    """
    if isinstance(completion, str):
        return completion
    if isinstance(completion, Mapping):
        return _content_text(completion.get("content"))
    if isinstance(completion, (list, tuple)):
        return "".join(_content_text(m.get("content")) for m in completion if isinstance(m, Mapping))
    return ""


def completion_texts(completions: Any) -> list[str]:
    if completions is None or isinstance(completions, (str, bytes, Mapping)):
        raise TypeError(
            f"completions must be a list (one entry per completion), got {type(completions).__name__}; "
            "wrap a single completion in a list: [completion]"
        )
    return [completion_text(c) for c in completions]


def _answers(answer: Any, n: int, func: str) -> list[Any]:
    """The gold answers, one per completion; a clear error for anything else (a call bug, not model output)."""
    if answer is None:
        raise ValueError(
            f"{func} needs the gold answers: pass answer=[...] (TRL does this from the dataset's 'answer' column)"
        )
    if isinstance(answer, (str, bytes, Mapping)) or not hasattr(answer, "__len__"):
        raise TypeError(
            f"{func}: answer must be a list with one gold answer per completion, got {type(answer).__name__}; "
            "for a single prompt's group use [gold] * len(completions)"
        )
    if len(answer) != n:
        raise ValueError(f"{func}: got {n} completions but {len(answer)} answers; they must pair up one to one")
    return list(answer)


# --- Answer equivalence -------------------------------------------------------------------------------


def plain_number(text: str) -> Decimal | None:
    """``"$1,000"`` -> ``Decimal(1000)``, ``"72 dollars"`` -> ``Decimal(72)``; ``None`` when not a plain number.

    Thousands separators, a ``$``, a ``%`` and one trailing unit word are allowed; ``"1e3"``, ``"²"`` or
    ``"ten"`` are not numbers here. Linear time: the pattern has no nested quantifiers.
    """
    if len(text) > 64:
        return None
    match = _PLAIN_NUMBER.fullmatch(text)
    if match is None:
        return None
    try:
        return Decimal(match.group("num").replace(",", ""))
    except InvalidOperation:
        return None


def _math_verify_timeout() -> int | None:
    """math-verify's timeout is ``signal.alarm``: it raises ValueError outside the main thread, and its
    ``alarm(0)`` on exit would cancel an alarm someone else set (a test timeout, say). In both cases run
    without it; the inputs are already bounded (short, no power towers), so sympy cannot hang on them.
    """
    if threading.current_thread() is not threading.main_thread():
        return None
    if hasattr(signal, "getitimer") and signal.getitimer(signal.ITIMER_REAL)[0] > 0:
        return None
    return _MATH_VERIFY_TIMEOUT_S


@lru_cache(maxsize=8192)
def _math_verify_match(predicted: str, gold: str) -> bool:
    """Math-verify's verdict, cached: groups repeat the same answers, and parsing costs ~1 ms."""
    from math_verify import parse, verify  # here: math-verify takes seconds to import, and only this match uses it
    from math_verify.errors import TimeoutException

    timeout = _math_verify_timeout()
    try:
        gold_parsed = parse(gold, parsing_timeout=timeout)
        pred_parsed = parse(predicted, parsing_timeout=timeout)
        if not gold_parsed or not pred_parsed:
            return False
        return bool(verify(gold_parsed, pred_parsed, timeout_seconds=timeout))
    except (Exception, TimeoutException):  # a verifier failure means "not shown equal", never a crash
        return False


def answers_match(predicted: Any, gold: Any) -> bool:
    """True when ``predicted`` states the same answer as ``gold`` (``"1,000"`` = ``"1000"``, ``"18.00"`` = ``"18"``).

    Cheap path first: when both sides are plain numbers the exact decimal comparison is the right
    verdict, so math-verify (sympy, ~1 ms per parse) is only asked about the rest (``\\frac{144}{2}``,
    ``\\boxed{72}``). Never raises: anything unreadable is simply not a match.
    """
    if predicted is None or gold is None:
        return False
    predicted, gold = str(predicted).strip(), str(gold).strip()
    if not predicted or not gold:
        return False
    if predicted == gold:
        return True
    pred_num, gold_num = plain_number(predicted), plain_number(gold)
    if pred_num is not None and gold_num is not None:
        return pred_num == gold_num
    for side in (predicted, gold):
        if len(side) > _MATH_VERIFY_MAX_CHARS or any(op in side for op in _EXPLOSIVE):
            return False
    return _math_verify_match(predicted, gold)


def _is_integer_answer(text: str) -> bool:
    number = plain_number(text)
    return number is not None and number.is_finite() and number == number.to_integral_value()


# --- Format checks (string scans, linear time) ---------------------------------------------------------


def is_strict_format(text: str) -> bool:
    """Exactly ``<reasoning>\\n...\\n</reasoning>\\n<answer>\\n...\\n</answer>`` (one final newline allowed).

    Each tag once, reasoning and answer not blank, reasoning over any number of lines.
    """
    body = text.removesuffix("\n")
    if any(body.count(tag) != 1 for tag in TAGS):
        return False
    if not (body.startswith(REASONING_OPEN + "\n") and body.endswith("\n" + ANSWER_CLOSE)):
        return False
    inner = body[len(REASONING_OPEN) + 1 : -len(ANSWER_CLOSE) - 1]
    reasoning, separator, answer = inner.partition(f"\n{REASONING_CLOSE}\n{ANSWER_OPEN}\n")
    return bool(separator) and bool(reasoning.strip()) and bool(answer.strip())


def is_soft_format(text: str) -> bool:
    """``<reasoning>...</reasoning>`` then ``<answer>...</answer>``, any whitespace, multi-line allowed."""
    body = text.strip()
    if not body.startswith(REASONING_OPEN):
        return False
    _, closed, rest = body[len(REASONING_OPEN) :].partition(REASONING_CLOSE)
    rest = rest.lstrip()
    return bool(closed) and rest.startswith(ANSWER_OPEN) and ANSWER_CLOSE in rest[len(ANSWER_OPEN) :]


def tag_alone_on_its_line(text: str, tag: str) -> int:
    """Position of ``tag`` when it appears exactly once and alone on its line; ``-1`` otherwise."""
    pos = text.find(tag)
    end = pos + len(tag)
    alone = text.count(tag) == 1 and (pos == 0 or text[pos - 1] == "\n") and (end == len(text) or text[end] == "\n")
    return pos if alone else -1


def xmlcount_score(text: str) -> float:
    """0.125 per tag found once, alone on its line, in order; -0.001 per non-space character after ``</answer>``."""
    score, previous = 0.0, -1
    for tag in TAGS:
        pos = tag_alone_on_its_line(text, tag)
        if pos > previous:  # found, and after the tag before it
            score += TAG_REWARD
            previous = pos
    _, closed, trailing = text.rpartition(ANSWER_CLOSE)
    if closed:
        score -= min(TRAILING_CHAR_PENALTY * len("".join(trailing.split())), MAX_TRAILING_PENALTY)
    return score


# --- The five rewards (TRL signature) ------------------------------------------------------------------


def correctness_reward_func(
    prompts: Any = None, completions: Any = None, answer: Any = None, **kwargs: Any
) -> list[float]:
    """2.0 when the ``<answer>`` block states the gold answer (math-verify equivalence), else 0.0."""
    texts = completion_texts(completions)
    golds = _answers(answer, len(texts), "correctness_reward_func")
    return [
        CORRECT_REWARD if answers_match(extract_xml_answer(t), g) else 0.0 for t, g in zip(texts, golds, strict=True)
    ]


def int_reward_func(prompts: Any = None, completions: Any = None, answer: Any = None, **kwargs: Any) -> list[float]:
    """0.5 when the ``<answer>`` block is a whole number (``-3``, ``1,000``, ``18.00``), else 0.0."""
    return [INT_REWARD if _is_integer_answer(extract_xml_answer(t)) else 0.0 for t in completion_texts(completions)]


def strict_format_reward_func(
    prompts: Any = None, completions: Any = None, answer: Any = None, **kwargs: Any
) -> list[float]:
    """0.5 for exactly the system prompt's layout, tags on their own lines, multi-line reasoning allowed."""
    return [STRICT_FORMAT_REWARD if is_strict_format(t) else 0.0 for t in completion_texts(completions)]


def soft_format_reward_func(
    prompts: Any = None, completions: Any = None, answer: Any = None, **kwargs: Any
) -> list[float]:
    """0.5 for a reasoning block followed by an answer block, whatever the whitespace."""
    return [SOFT_FORMAT_REWARD if is_soft_format(t) else 0.0 for t in completion_texts(completions)]


def xmlcount_reward_func(
    prompts: Any = None, completions: Any = None, answer: Any = None, **kwargs: Any
) -> list[float]:
    """Partial credit per well-placed tag (up to 0.5), so a model learns the format one tag at a time."""
    return [xmlcount_score(t) for t in completion_texts(completions)]


REWARD_FUNCS: list[RewardFunc] = [
    correctness_reward_func,
    int_reward_func,
    strict_format_reward_func,
    soft_format_reward_func,
    xmlcount_reward_func,
]
REWARD_NAMES: tuple[str, ...] = tuple(f.__name__ for f in REWARD_FUNCS)

# Best (and worst) value each corrected reward can return, in REWARD_FUNCS order.
REWARD_MAX: tuple[float, ...] = (CORRECT_REWARD, INT_REWARD, STRICT_FORMAT_REWARD, SOFT_FORMAT_REWARD, 4 * TAG_REWARD)
REWARD_MIN: tuple[float, ...] = (0.0, 0.0, 0.0, 0.0, -MAX_TRAILING_PENALTY)
