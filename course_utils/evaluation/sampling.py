"""Sampled evaluation: pass@1, pass@k and maj@k, the measures of what a model solves sometimes and what it solves first.

Greedy accuracy says what the model answers on its single most likely path. GRPO learns from *samples*: a
group of completions per prompt, drawn as in training. So the same measures are taken here from samples drawn
the way ``GRPOTrainer`` draws them (``lesson.generation.sample_generate``: each prompt repeated ``samples`` times in
a row, TRL's default temperature and top-p, through the plug-in the caller hands over as training does):

- **pass@1**: the share of samples that are right, averaged over problems;
- **pass@k**: the chance that at least one of ``k`` samples is right (the unbiased estimator, ``stats.pass_at_k``);
- **maj@k**: whether the most frequent answer among the samples is right (majority vote, ``majority_answer``).

GRPO's own signal needs a problem the model solves *sometimes*: a group that is all right or all wrong has zero
advantages. pass@k high while pass@1 is low is exactly the room GRPO has to work in (Yue et al., 2025).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Mapping, Sequence
from numbers import Integral
from typing import Any

from course_utils.core.speedups import NO_SPEEDUPS, SpeedUps
from course_utils.evaluation.heldout import rows_to_evaluate
from course_utils.evaluation.stats import bootstrap_interval, pass_at_k
from course_utils.lesson.generation import sample_generate
from course_utils.lesson.rewards import answers_match, extract_xml_answer, plain_number


def answer_key(answer: str) -> str:
    """The form two answers share when they mean the same number (``"1,000"`` and ``"1000.00"``); else the text."""
    number = plain_number(answer)
    return str(number.normalize()) if number is not None else " ".join(answer.split())


def majority_answer(answers: Sequence[str]) -> str:
    """The most frequent non-empty answer (numbers compared by value), the first seen on a tie; ``""`` when none."""
    if isinstance(answers, str):
        raise TypeError("answers must be a list of extracted answers, not one string")
    keyed = [(answer_key(a), a) for a in answers if isinstance(a, str) and a.strip()]
    if not keyed:
        return ""
    counts = Counter(key for key, _ in keyed)
    best = max(counts.values())
    return next(answer for key, answer in keyed if counts[key] == best)


def _check_ks(ks: Sequence[int], samples: int) -> tuple[int, ...]:
    bad = [k for k in ks if isinstance(k, bool) or not isinstance(k, Integral) or not 1 <= k <= samples]
    if bad or not ks:
        raise ValueError(f"ks must be whole numbers between 1 and samples={samples}, got {list(ks)}")
    return tuple(sorted(set(int(k) for k in ks)))


def problem_record(completions: Sequence[str], gold: str, ks: Sequence[int]) -> dict[str, Any]:
    """One problem's samples scored: how many are right, pass@k for each k, and the majority vote."""
    extracted = [extract_xml_answer(text) for text in completions]
    correct = [bool(a) and bool(answers_match(a, gold)) for a in extracted]
    vote = majority_answer(extracted)
    n, c = len(completions), sum(correct)
    return {
        "gold": gold,
        "samples": n,
        "correct_samples": c,
        "extracted": extracted,
        "majority": vote,
        "majority_correct": bool(vote) and bool(answers_match(vote, gold)),
        **{f"pass@{k}": pass_at_k(n, c, k) for k in ks},
    }


def summarize_samples(
    records: Sequence[Mapping[str, Any]], ks: Sequence[int], confidence: float = 0.95
) -> dict[str, Any]:
    """pass@k for each k and maj@n over problems, each with a bootstrap interval over the problems."""
    result: dict[str, Any] = {"n": len(records), "confidence": confidence}
    samples = records[0]["samples"] if records else 0
    for name in [*(f"pass@{k}" for k in ks), "maj"]:
        values = [float(r["majority_correct"]) if name == "maj" else r[name] for r in records]
        key = f"maj@{samples}" if name == "maj" else name
        result[key] = sum(values) / len(values) if values else float("nan")
        result[f"{key}_ci"] = bootstrap_interval(values, confidence) if values else (0.0, 1.0)
    return result


def evaluate_sampled(
    model: Any,
    tokenizer: Any,
    dataset: Any,
    *,
    samples: int = 8,
    ks: Sequence[int] = (1, 8),
    prompts_per_batch: int = 4,
    max_new_tokens: int = 256,
    temperature: float = 1.0,
    seed: int = 0,
    speedups: SpeedUps = NO_SPEEDUPS,
) -> dict[str, Any]:
    """``samples`` completions per problem, drawn as training draws a group; pass@k for each of ``ks`` and maj@samples.

    Batches hold ``prompts_per_batch`` whole groups (``prompts_per_batch * samples`` rows). Each batch is seeded
    with ``seed`` plus its index, so a problem's samples do not depend on how many problems came before it in
    another run. Returns ``summarize_samples``'s dict plus ``records`` (one per problem), ``samples``, ``ks`` and
    ``elapsed_seconds``. ``speedups``: the plug-in to sample through (``speedups=cpu_speed``), default plain
    transformers.
    """
    rows = rows_to_evaluate(dataset)
    ks = _check_ks(ks, samples)
    if isinstance(prompts_per_batch, bool) or not isinstance(prompts_per_batch, Integral) or prompts_per_batch < 1:
        raise ValueError(f"prompts_per_batch must be a positive whole number, got {prompts_per_batch!r}")
    started, records = time.perf_counter(), []
    with speedups.for_generation(model):
        for index, start in enumerate(range(0, len(rows), prompts_per_batch)):
            batch = rows[start : start + prompts_per_batch]
            groups = sample_generate(model, tokenizer, [r["prompt"] for r in batch], samples, max_new_tokens,
                                     temperature=temperature, seed=seed + index)  # fmt: skip
            for row, group in zip(batch, groups, strict=True):
                records.append(problem_record([g.text for g in group], str(row["answer"]), ks))
    elapsed = time.perf_counter() - started
    return summarize_samples(records, ks) | {"records": records, "samples": samples, "ks": ks,
                                             "elapsed_seconds": elapsed}  # fmt: skip


def paired_difference(
    first: Mapping[str, Any], second: Mapping[str, Any], key: str = "pass@1", confidence: float = 0.95
) -> dict[str, Any]:
    """``second - first`` on the same problems for one per-problem measure, with a bootstrap interval.

    The interval resamples problems and keeps each problem's pair together, so what both models find easy
    or hard cancels out; a difference whose interval excludes 0 is the paired evidence notebook 05 asks for.
    """
    a, b = first["records"], second["records"]
    if len(a) != len(b) or any(x["gold"] != y["gold"] for x, y in zip(a, b, strict=False)):
        raise ValueError("the two results are not on the same problems in the same order; evaluate both on one set")
    if key not in a[0]:
        measures = sorted(k for k in a[0] if k.startswith("pass@"))
        raise ValueError(f"unknown measure {key!r}; the records hold {measures}")
    differences = [y[key] - x[key] for x, y in zip(a, b, strict=True)]
    return {"key": key, "difference": sum(differences) / len(differences),
            "ci": bootstrap_interval(differences, confidence), "n": len(differences)}  # fmt: skip
