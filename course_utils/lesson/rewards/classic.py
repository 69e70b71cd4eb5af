"""The five rewards as popularised (willccbb's GRPO GSM8K demo, copied into many tutorials): bugs included.

Kept verbatim, same regexes and same arithmetic, so notebook 03 can put them next to the corrected
versions (``course_utils.lesson.rewards``) on the same completions and show where they disagree. Do not
"fix" anything here; the bugs are the lesson:

- ``correctness``: exact string comparison, so ``"1,000"`` is wrong against gold ``"1000"``;
- ``int``: ``str.isdigit`` rejects ``"-3"`` and ``"1,000"`` but accepts ``"²"``;
- ``strict_format``: ``.`` without ``re.DOTALL`` never crosses a newline, so multi-line reasoning
  never matches, and ``\\n$`` demands a newline after ``</answer>`` that models rarely emit;
- ``soft_format``: same missing ``re.DOTALL``;
- ``xmlcount``: when the completion does not contain ``"\\n</answer>\\n"``, ``split(...)[-1]`` is the
  whole text, so the "trailing text" penalty charges every character of the completion; and with
  nothing after ``</answer>`` the ``- 1`` turns the penalty into a +0.001 bonus.

One deliberate difference from the originals: they print the first completion on every call (side
effect only) and index ``completion[0]["content"]``, so a plain-string completion raises. Here a
plain string is accepted as the text itself, for side-by-side tables; every returned value is the
original's. Bad content (``None``) still raises, as in the originals.
"""

from __future__ import annotations

import re
from typing import Any

STRICT_PATTERN = r"^<reasoning>\n.*?\n</reasoning>\n<answer>\n.*?\n</answer>\n$"
SOFT_PATTERN = r"<reasoning>.*?</reasoning>\s*<answer>.*?</answer>"


def _responses(completions: list[Any]) -> list[str]:
    """``completion[0]["content"]`` as in the originals (a plain string is taken as is)."""
    return [c if isinstance(c, str) else c[0]["content"] for c in completions]


def extract_xml_answer(text: str) -> str:
    """The original extractor: text after the *first*-split ``<answer>``'s last piece, up to ``</answer>``."""
    answer = text.split("<answer>")[-1]
    answer = answer.split("</answer>")[0]
    return answer.strip()


def correctness_reward_func(prompts: Any, completions: list[Any], answer: list[str], **kwargs: Any) -> list[float]:
    """2.0 if the extracted answer equals the gold answer as a string (``"1,000" != "1000"``)."""
    extracted = [extract_xml_answer(r) for r in _responses(completions)]
    return [2.0 if r == a else 0.0 for r, a in zip(extracted, answer)]  # noqa: B905  (original: no strict)


def int_reward_func(completions: list[Any], **kwargs: Any) -> list[float]:
    """0.5 if the extracted answer ``isdigit()`` (no minus sign, no comma, no decimal point)."""
    extracted = [extract_xml_answer(r) for r in _responses(completions)]
    return [0.5 if r.isdigit() else 0.0 for r in extracted]


def strict_format_reward_func(completions: list[Any], **kwargs: Any) -> list[float]:
    """0.5 if ``re.match(STRICT_PATTERN, text)`` (no ``re.DOTALL``: one-line reasoning only)."""
    matches = [re.match(STRICT_PATTERN, r) for r in _responses(completions)]
    return [0.5 if match else 0.0 for match in matches]


def soft_format_reward_func(completions: list[Any], **kwargs: Any) -> list[float]:
    """0.5 if ``re.match(SOFT_PATTERN, text)`` (no ``re.DOTALL`` either)."""
    matches = [re.match(SOFT_PATTERN, r) for r in _responses(completions)]
    return [0.5 if match else 0.0 for match in matches]


def count_xml(text: str) -> float:
    """The original tag counter with its trailing-text penalties (see the module docstring for the bugs)."""
    count = 0.0
    if text.count("<reasoning>\n") == 1:
        count += 0.125
    if text.count("\n</reasoning>\n") == 1:
        count += 0.125
    if text.count("\n<answer>\n") == 1:
        count += 0.125
        count -= len(text.split("\n</answer>\n")[-1]) * 0.001
    if text.count("\n</answer>") == 1:
        count += 0.125
        count -= (len(text.split("\n</answer>")[-1]) - 1) * 0.001
    return count


def xmlcount_reward_func(completions: list[Any], **kwargs: Any) -> list[float]:
    """``count_xml`` of each completion."""
    return [count_xml(c) for c in _responses(completions)]


REWARD_FUNCS = [
    correctness_reward_func,
    int_reward_func,
    strict_format_reward_func,
    soft_format_reward_func,
    xmlcount_reward_func,
]

__all__ = [
    "REWARD_FUNCS",
    "SOFT_PATTERN",
    "STRICT_PATTERN",
    "correctness_reward_func",
    "count_xml",
    "extract_xml_answer",
    "int_reward_func",
    "soft_format_reward_func",
    "strict_format_reward_func",
    "xmlcount_reward_func",
]
