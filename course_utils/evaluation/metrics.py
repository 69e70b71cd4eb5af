"""Every evaluation metric from completion texts and gold answers: one scorer, no model involved.

Two ideas shape this module:

* **One scorer.** ``score_completions`` turns completion texts into every metric. ``heldout.evaluate_model``
  (batched generation) and ``heldout.evaluate_one_at_a_time`` (the popular tutorial's loop) both call it, and so do
  the tests with hand-written completions, so a metric cannot mean one thing in the notebook and another in the tests.
* **The same definitions as training.** Answers are checked with ``course_utils.lesson.rewards.answers_match``
  (math-verify with a numeric fallback) and formats with the strict and soft format *reward functions*: the
  evaluation measures exactly what GRPO was rewarded for. Exact string match is reported next to it, to show how
  much the checker matters.

Every rate comes with its Wilson interval (``stats.wilson_interval``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from numbers import Integral, Real
from typing import Any

from course_utils.evaluation.stats import wilson_interval
from course_utils.lesson.rewards import (
    answers_match,
    completion_text,
    extract_xml_answer,
    soft_format_reward_func,
    strict_format_reward_func,
)

# The rates that get a confidence interval, in the order tables show them.
RATE_METRICS = (
    "accuracy",
    "lenient_accuracy",
    "exact_match_accuracy",
    "format_score",
    "soft_format_score",
    "truncation_rate",
)
# The non-rate metrics ``tables.compare_results`` also lists (NaN where a result lacks one). Speed is seconds per
# problem and decoding tokens per second: tokens per second over the whole call counts the prompt's reading as
# writing, so a model that learned to answer shorter looks slower per token.
OTHER_METRICS = ("mean_completion_tokens", "seconds_per_problem", "decode_tokens_per_second", "tokens_per_second",
                 "problems_per_second")  # fmt: skip
_RECORD_KEY = {  # which per-problem flag each rate counts
    "accuracy": "correct",
    "lenient_accuracy": "lenient_correct",
    "exact_match_accuracy": "exact_match",
    "format_score": "formatted",
    "soft_format_score": "soft_formatted",
    "truncation_rate": "truncated",
}


def _completion_text(completion: Any, index: int) -> str:
    """A completion as text, read like the rewards read it: a string, or TRL's ``[{"role": ..., "content": ...}]``."""
    is_chat = isinstance(completion, list) and bool(completion) and all(isinstance(m, Mapping) for m in completion)
    if isinstance(completion, str) or is_chat:
        return completion_text(completion)
    raise TypeError(
        f"completion {index} must be a string or a list of chat messages, "
        f"got {type(completion).__name__}: {str(completion)[:60]!r}"
    )


def _check_parallel(name: str, values: Sequence[Any] | None, n: int) -> None:
    if values is not None and len(values) != n:
        raise ValueError(f"{name} has {len(values)} entries but there are {n} completions; pass one per completion")


def _format_flags(texts: list[str], golds: list[str]) -> tuple[list[bool], list[bool]]:
    """Strict and soft format flags from the reward functions themselves (a positive reward = formatted)."""
    prompts = [[{"role": "user", "content": ""}] for _ in texts]
    completions = [[{"role": "assistant", "content": text}] for text in texts]
    strict = strict_format_reward_func(prompts=prompts, completions=completions, answer=golds)
    soft = soft_format_reward_func(prompts=prompts, completions=completions, answer=golds)
    return [float(r) > 0 for r in strict], [float(r) > 0 for r in soft]


def _count_tokens(texts: list[str], tokenizer: Any) -> list[int | None]:
    if tokenizer is None:
        return [None] * len(texts)
    return [len(tokenizer(text, add_special_tokens=False)["input_ids"]) for text in texts]


_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+")


def last_number(text: str) -> str:
    """The last number written anywhere in ``text`` (commas dropped), or ``""``: the lenient reading of an answer.

    Why a lenient reading: strict accuracy needs the answer inside ``<answer>`` tags, so a model that learns the
    tags gains strict accuracy without solving one more problem. The last number ignores the format, so strict and
    lenient side by side separate a format gain from a maths gain.
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a string, got {type(text).__name__}")
    found = _NUMBER.findall(text)
    return found[-1].replace(",", "").rstrip(".") if found else ""


def _last_number_matches(text: str, gold: str) -> bool:
    number = last_number(text)
    return bool(number) and bool(answers_match(number, gold))


def _rate(records: list[dict[str, Any]], key: str) -> tuple[int, float]:
    successes = sum(bool(r[key]) for r in records)
    return successes, (successes / len(records) if records else math.nan)


def score_completions(
    completions: Sequence[Any],
    golds: Sequence[str],
    *,
    questions: Sequence[str] | None = None,
    truncated: Sequence[bool] | None = None,
    completion_tokens: Sequence[int] | None = None,
    tokenizer: Any = None,
    elapsed_seconds: float | None = None,
    confidence: float = 0.95,
) -> dict[str, Any]:
    """Every evaluation metric from completion texts and gold answers: a pure function, no model involved.

    ``truncated`` says which generations hit ``max_new_tokens`` without an end-of-sequence token; only the
    generator knows, so hand-written texts default to "none truncated". ``completion_tokens`` are the generated
    token counts (EOS not counted); when absent they are counted with ``tokenizer``, and without either the token
    metrics are NaN. ``elapsed_seconds`` (the generation time) gives ``tokens_per_second`` and
    ``problems_per_second`` (NaN without it).

    Returns a dict with ``n``, the rates in ``RATE_METRICS`` with ``<rate>_ci`` (Wilson, ``confidence``) and
    ``<rate>_count``, ``mean_completion_tokens``, ``total_completion_tokens``, ``tokens_per_second``,
    ``problems_per_second``, ``seconds_per_problem``, ``elapsed_seconds``, ``confidence`` and ``records`` (one
    dict per problem: index, question, gold, completion, extracted, correct, lenient_correct, exact_match,
    formatted, soft_formatted, truncated, tokens).
    """
    _check_scoring_inputs(completions, golds, questions, truncated, completion_tokens, elapsed_seconds)
    texts = [_completion_text(c, i) for i, c in enumerate(completions)]
    gold_texts = [str(g).strip() for g in golds]
    strict, soft = _format_flags(texts, gold_texts) if texts else ([], [])
    tokens = list(completion_tokens) if completion_tokens is not None else _count_tokens(texts, tokenizer)
    bad_tokens = [t for t in tokens if t is not None and (isinstance(t, bool) or not isinstance(t, Integral) or t < 0)]
    if bad_tokens:
        raise ValueError(f"completion_tokens must be whole numbers >= 0, got {bad_tokens[:3]}")
    records = [
        _record(
            i,
            text,
            gold_texts[i],
            question=questions[i] if questions is not None else "",
            formatted=strict[i],
            soft_formatted=soft[i],
            truncated=bool(truncated[i]) if truncated is not None else False,
            tokens=tokens[i],
        )
        for i, text in enumerate(texts)
    ]
    return _summarize(records, elapsed_seconds, confidence)


def _check_scoring_inputs(
    completions: Sequence[Any],
    golds: Sequence[str],
    questions: Sequence[str] | None,
    truncated: Sequence[bool] | None,
    completion_tokens: Sequence[int] | None,
    elapsed_seconds: float | None,
) -> None:
    """One gold answer (and, when given, one question, flag and token count) per completion; a positive time."""
    if isinstance(completions, str) or isinstance(golds, str):
        raise TypeError("completions and golds must be lists (one entry per problem), not a single string")
    n = len(completions)
    if len(golds) != n:
        raise ValueError(f"{n} completions but {len(golds)} gold answers; pass exactly one gold answer per completion")
    for name, values in (("questions", questions), ("truncated", truncated), ("completion_tokens", completion_tokens)):
        _check_parallel(name, values, n)
    if elapsed_seconds is not None and not (isinstance(elapsed_seconds, Real) and elapsed_seconds > 0):
        raise ValueError(f"elapsed_seconds must be a positive number of seconds or None, got {elapsed_seconds!r}")


def _record(
    index: int,
    text: str,
    gold: str,
    *,
    question: str,
    formatted: bool,
    soft_formatted: bool,
    truncated: bool,
    tokens: int | None,
) -> dict[str, Any]:
    """One problem's record: the extracted answer, whether it is right (strictly, leniently, exactly), and the
    flags the caller measured on the whole batch."""
    extracted = extract_xml_answer(text)
    return {
        "index": index,
        "question": question,
        "gold": gold,
        "completion": text,
        "extracted": extracted,
        "correct": bool(extracted) and bool(answers_match(extracted, gold)),
        "lenient_correct": _last_number_matches(text, gold),
        "exact_match": extracted == gold,
        "formatted": formatted,
        "soft_formatted": soft_formatted,
        "truncated": truncated,
        "tokens": tokens,
    }


def _summarize(records: list[dict[str, Any]], elapsed_seconds: float | None, confidence: float) -> dict[str, Any]:
    n = len(records)
    result: dict[str, Any] = {"n": n, "confidence": confidence}
    for metric, key in _RECORD_KEY.items():
        successes, rate = _rate(records, key)
        result[metric] = rate
        result[f"{metric}_count"] = successes
        result[f"{metric}_ci"] = wilson_interval(successes, n, confidence)
    known = [r["tokens"] for r in records if r["tokens"] is not None]
    total = sum(known) if known and len(known) == n else None
    result["total_completion_tokens"] = total
    result["mean_completion_tokens"] = total / n if total is not None and n else math.nan
    result["elapsed_seconds"] = elapsed_seconds if elapsed_seconds is not None else math.nan
    timed = elapsed_seconds is not None
    result["tokens_per_second"] = total / elapsed_seconds if timed and total is not None else math.nan
    result["problems_per_second"] = n / elapsed_seconds if timed else math.nan
    result["seconds_per_problem"] = elapsed_seconds / n if timed and n else math.nan
    result["records"] = records
    return result


def summary_line(result: Mapping[str, Any], name: str = "model") -> str:
    """One readable line: accuracy with its interval, formats, truncation, length and speed."""
    low, high = result["accuracy_ci"]
    return (
        f"{name}: accuracy {result['accuracy']:.0%} (95% CI {low:.0%}-{high:.0%}, n={result['n']}), "
        f"exact match {result['exact_match_accuracy']:.0%}, strict format {result['format_score']:.0%}, "
        f"soft format {result['soft_format_score']:.0%}, truncated {result['truncation_rate']:.0%}, "
        f"{result['mean_completion_tokens']:.1f} tokens/completion, {result['tokens_per_second']:.1f} tokens/s"
    )
