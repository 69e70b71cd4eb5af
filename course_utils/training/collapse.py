"""Collapse, defined once: a run whose completions stopped reasoning, however high its reward.

A GRPO run on a small model can climb its reward by saturating the format rewards while correctness stays flat:
the completions shrink to ``<reasoning>1</reasoning><answer>1</answer>``. The reward curve then looks like
convergence. ``collapse_report`` reads the completions of the last fifth of the steps instead, and calls the
run collapsed when any of these holds there:

- one answer is more than ``MAX_TOP_ANSWER_SHARE`` of the completions (the problems differ, so their answers do;
  a completion without an answer gives none);
- the median reasoning is under ``MIN_REASONING_TOKENS`` tokens;
- fewer than ``MIN_COMPUTATION_SHARE`` of the reasonings hold a computation (two numbers joined by an operator).
"""

from __future__ import annotations

import re
import statistics
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from course_utils.core.answer_format import ANSWER_OPEN, REASONING_CLOSE, REASONING_OPEN, extract_xml_answer

MAX_TOP_ANSWER_SHARE = 0.30
MIN_REASONING_TOKENS = 10
MIN_COMPUTATION_SHARE = 0.5
MIN_PROMPTS = 3  # fewer distinct problems in the window cannot tell one answer for all from one problem's answer

# Two numbers joined by an arithmetic operator or an equals sign: "48/2", "3 x 4", "12 = 12"
_COMPUTATION = re.compile(r"\d[\d,.]*\s*[-+*/×x÷=]\s*\$?\d")


def reasoning_text(completion: str) -> str:
    """What a completion reasons before its answer: inside ``<reasoning>``, else everything before ``<answer>``."""
    start = completion.find(REASONING_OPEN)
    body = completion[start + len(REASONING_OPEN) :] if start != -1 else completion
    for end_tag in (REASONING_CLOSE, ANSWER_OPEN):
        end = body.find(end_tag)
        if end != -1:
            body = body[:end]
    return body.strip()


def holds_computation(reasoning: str) -> bool:
    """True when the reasoning joins two numbers with an operator: arithmetic written out, not a bare number."""
    return _COMPUTATION.search(reasoning) is not None


@dataclass(frozen=True)
class CollapseReport:
    """The collapse measures of one window of completions, and the verdict with its reasons."""

    completions: int
    prompts: int
    median_completion_tokens: float
    median_reasoning_tokens: float
    top_answer: str
    top_answer_share: float
    computation_share: float
    reasons: list[str] = field(default_factory=list)

    @property
    def collapsed(self) -> bool:
        return bool(self.reasons)

    def summary(self, window: str = "last fifth") -> str:
        """One line: the verdict, then the measures it rests on (``window``: which completions they are)."""
        verdict = "collapsed: " + "; ".join(self.reasons) if self.collapsed else "not collapsed"
        return (
            f"{verdict} ({window}: {self.completions} completions of {self.prompts} problems, median "
            f"{self.median_completion_tokens:.0f} tokens, reasoning {self.median_reasoning_tokens:.0f}; most common "
            f"answer {self.top_answer!r} in {self.top_answer_share:.0%}; reasoning with a computation "
            f"{self.computation_share:.0%})"
        )


def _reasons(top_share: float, reasoning_tokens: float, computation_share: float, prompts: int) -> list[str]:
    reasons = []
    if prompts >= MIN_PROMPTS and top_share > MAX_TOP_ANSWER_SHARE:
        reasons.append(f"one answer in {top_share:.0%} of the completions (over {MAX_TOP_ANSWER_SHARE:.0%})")
    if reasoning_tokens < MIN_REASONING_TOKENS:
        reasons.append(f"median reasoning {reasoning_tokens:.0f} tokens (under {MIN_REASONING_TOKENS})")
    if computation_share < MIN_COMPUTATION_SHARE:
        reasons.append(f"{computation_share:.0%} of the reasonings hold a computation (under "
                       f"{MIN_COMPUTATION_SHARE:.0%})")  # fmt: skip
    return reasons


def collapse_report(
    completions: Sequence[str], prompts: Sequence[str], count_tokens: Callable[[str], int]
) -> CollapseReport:
    """The collapse measures of ``completions`` (one window, usually the last fifth of the steps) and the verdict.

    ``prompts`` pairs each completion with its problem (to count the problems); ``count_tokens`` is the model's
    tokenizer's count (``lambda t: len(tokenizer(t).input_ids)``).
    """
    if not completions:
        raise ValueError("collapse_report needs at least one completion: log them with log_completions=True")
    if len(prompts) != len(completions):
        raise ValueError(f"got {len(completions)} completions but {len(prompts)} prompts; they must pair up")
    texts = [c if isinstance(c, str) else "" for c in completions]
    reasonings = [reasoning_text(t) for t in texts]
    answers = Counter(answer for t in texts if (answer := extract_xml_answer(t)))  # no answer is not one answer
    top_answer, top_count = answers.most_common(1)[0] if answers else ("(none)", 0)
    top_share = top_count / len(texts)
    reasoning_tokens = statistics.median(count_tokens(r) if r else 0 for r in reasonings)
    computation_share = sum(map(holds_computation, reasonings)) / len(texts)
    n_prompts = len(set(prompts))
    return CollapseReport(
        completions=len(texts),
        prompts=n_prompts,
        median_completion_tokens=statistics.median(count_tokens(t) for t in texts),
        median_reasoning_tokens=reasoning_tokens,
        top_answer=top_answer,
        top_answer_share=top_share,
        computation_share=computation_share,
        reasons=_reasons(top_share, reasoning_tokens, computation_share, n_prompts),
    )


def last_fifth(steps: Sequence[int]) -> list[bool]:
    """For each row's step, whether it lies in the last fifth of the steps logged (at least one step)."""
    ordered = sorted(set(steps))
    if not ordered:
        return []
    keep = set(ordered[-max(1, len(ordered) // 5) :])
    return [s in keep for s in steps]


def first_fifth(steps: Sequence[int]) -> list[bool]:
    """For each row's step, whether it lies in the first fifth of the steps logged (at least one step)."""
    ordered = sorted(set(steps))
    if not ordered:
        return []
    keep = set(ordered[: max(1, len(ordered) // 5)])
    return [s in keep for s in steps]
