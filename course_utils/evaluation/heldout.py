"""Evaluation: did GRPO change the model, and at what cost? Numbers a learner can trust.

Three ideas shape this module:

* **One scorer.** ``score_completions`` turns completion texts into every metric. ``evaluate_model`` (batched
  generation) and ``evaluate_one_at_a_time`` (the popular tutorial's loop) both call it, and so do the tests with
  hand-written completions, so a metric cannot mean one thing in the notebook and another in the tests.
* **The same definitions as training.** Answers are checked with ``course_utils.lesson.rewards.answers_match``
  (math-verify with a numeric fallback) and formats with the strict and soft format *reward functions*: the
  evaluation measures exactly what GRPO was rewarded for. Exact string match is reported next to it, to show how
  much the checker matters.
* **Error bars.** With 8 or 50 problems, "accuracy 25%" means little without its 95% Wilson interval.

Generation is greedy (reproducible), through the chat template, batched with left padding, and sorted by prompt
length so that each batch pads as little as possible (the original order is restored afterwards).
"""

from __future__ import annotations

import itertools
import math
import re
import time
from collections.abc import Mapping, Sequence
from numbers import Integral, Real
from pathlib import Path
from statistics import NormalDist
from typing import Any

from course_utils import cpu_speed
from course_utils.core.profiles import get_profile
from course_utils.lesson.data import load_gsm8k, load_splits, prompt_token_lengths, train_val_split
from course_utils.lesson.models import (
    Generation,
    greedy_generate,
    load_model_and_tokenizer,
    load_tokenizer,
    profile_dtype,
    saved_model_kind,
)
from course_utils.lesson.rewards import (
    answers_match,
    completion_text,
    extract_xml_answer,
    soft_format_reward_func,
    strict_format_reward_func,
)
from course_utils.training.run import load_trained_model, warm_start_model_dir
from course_utils.training.warm_start import load_saved_warm_start

# The rates that get a confidence interval, in the order tables show them.
RATE_METRICS = (
    "accuracy",
    "lenient_accuracy",
    "exact_match_accuracy",
    "format_score",
    "soft_format_score",
    "truncation_rate",
)
# The non-rate metrics ``compare_results`` also lists.
OTHER_METRICS = ("mean_completion_tokens", "tokens_per_second", "problems_per_second")
_RECORD_KEY = {  # which per-problem flag each rate counts
    "accuracy": "correct",
    "lenient_accuracy": "lenient_correct",
    "exact_match_accuracy": "exact_match",
    "format_score": "formatted",
    "soft_format_score": "soft_formatted",
    "truncation_rate": "truncated",
}


# --- Confidence intervals --------------------------------------------------------------------------


def wilson_interval(successes: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """The Wilson score interval for a rate of ``successes`` out of ``n``, as ``(low, high)``.

    Why Wilson and not the textbook ``p ± z·sqrt(p(1-p)/n)``: on small evaluation sets and rates near 0 or 1
    (format compliance before and after GRPO is exactly that), the textbook interval collapses to zero width at
    0/n and n/n and can leave [0, 1]; Wilson's stays inside [0, 1] and keeps a sensible width.

    ``n == 0`` returns ``(0.0, 1.0)``: with no observations every rate is plausible, and the widest possible
    interval says so instead of raising or inventing a number.
    """
    for name, value in (("successes", successes), ("n", n)):
        if isinstance(value, bool) or not isinstance(value, Integral):
            raise TypeError(f"{name} must be a whole number (int), got {type(value).__name__} {value!r}")
    if n < 0:
        raise ValueError(f"n must be >= 0 (the number of trials), got {n}")
    if not 0 <= successes <= n:
        raise ValueError(f"successes must be between 0 and n={n}, got {successes}")
    if isinstance(confidence, bool) or not isinstance(confidence, Real) or not 0 < confidence < 1:
        raise ValueError(f"confidence must be a number strictly between 0 and 1 (e.g. 0.95), got {confidence!r}")
    if n == 0:
        return (0.0, 1.0)
    z = NormalDist().inv_cdf(1 - (1 - confidence) / 2)
    p = successes / n
    denominator = 1 + z * z / n
    center = (p + z * z / (2 * n)) / denominator
    half_width = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denominator
    # At 0/n and n/n the bound is exactly 0 or 1 in exact arithmetic; floating point leaves ~1e-17 otherwise.
    low = 0.0 if successes == 0 else max(0.0, center - half_width)
    high = 1.0 if successes == n else min(1.0, center + half_width)
    return (low, high)


# --- Scoring ---------------------------------------------------------------------------------------


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
    ``problems_per_second``, ``elapsed_seconds``, ``confidence`` and ``records`` (one dict per problem: index,
    question, gold, completion, extracted, correct, lenient_correct, exact_match, formatted, soft_formatted,
    truncated, tokens).
    """
    if isinstance(completions, str) or isinstance(golds, str):
        raise TypeError("completions and golds must be lists (one entry per problem), not a single string")
    n = len(completions)
    if len(golds) != n:
        raise ValueError(f"{n} completions but {len(golds)} gold answers; pass exactly one gold answer per completion")
    for name, values in (("questions", questions), ("truncated", truncated), ("completion_tokens", completion_tokens)):
        _check_parallel(name, values, n)
    if elapsed_seconds is not None and not (isinstance(elapsed_seconds, Real) and elapsed_seconds > 0):
        raise ValueError(f"elapsed_seconds must be a positive number of seconds or None, got {elapsed_seconds!r}")
    texts = [_completion_text(c, i) for i, c in enumerate(completions)]
    gold_texts = [str(g).strip() for g in golds]
    strict, soft = _format_flags(texts, gold_texts) if n else ([], [])
    tokens = list(completion_tokens) if completion_tokens is not None else _count_tokens(texts, tokenizer)
    bad_tokens = [t for t in tokens if t is not None and (isinstance(t, bool) or not isinstance(t, Integral) or t < 0)]
    if bad_tokens:
        raise ValueError(f"completion_tokens must be whole numbers >= 0, got {bad_tokens[:3]}")
    records = []
    for i, text in enumerate(texts):
        extracted = extract_xml_answer(text)
        records.append(
            {
                "index": i,
                "question": questions[i] if questions is not None else "",
                "gold": gold_texts[i],
                "completion": text,
                "extracted": extracted,
                "correct": bool(extracted) and bool(answers_match(extracted, gold_texts[i])),
                "lenient_correct": _last_number_matches(text, gold_texts[i]),
                "exact_match": extracted == gold_texts[i],
                "formatted": strict[i],
                "soft_formatted": soft[i],
                "truncated": bool(truncated[i]) if truncated is not None else False,
                "tokens": tokens[i],
            }
        )
    return _summarize(records, elapsed_seconds, confidence)


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
    result["records"] = records
    return result


# --- Generation ------------------------------------------------------------------------------------


def _rows(dataset: Any) -> list[dict[str, Any]]:
    """The evaluation rows as dicts, checked: each needs a chat ``prompt`` and a gold ``answer``."""
    rows = [dict(row) for row in dataset]
    if not rows:
        raise ValueError("The evaluation dataset is empty: pass at least one problem")
    for i, row in enumerate(rows):
        prompt, answer = row.get("prompt"), row.get("answer")
        if not isinstance(prompt, list) or not prompt or not all(isinstance(m, Mapping) for m in prompt):
            raise ValueError(
                f"row {i} has no chat 'prompt' (a list of messages); use load_gsm8k(..., formatted=True) or "
                "format_gsm8k(dataset) to build one"
            )
        if answer is None or not str(answer).strip():
            raise ValueError(f"row {i} has no gold 'answer'; every evaluated problem needs one")
    return rows


def _question(row: Mapping[str, Any]) -> str:
    if isinstance(row.get("question"), str):
        return row["question"]
    users = [m.get("content", "") for m in row["prompt"] if m.get("role") == "user"]
    return users[-1] if users else ""


def _check_generation_args(batch_size: int, max_new_tokens: int) -> None:
    for name, value in (("batch_size", batch_size), ("max_new_tokens", max_new_tokens)):
        if isinstance(value, bool) or not isinstance(value, Integral) or value < 1:
            raise ValueError(f"{name} must be a positive whole number, got {value!r}")


def _progress_bar(total: int, enabled: bool, description: str) -> Any:
    from tqdm.auto import tqdm

    return tqdm(total=total, disable=not enabled, desc=description, unit="problem")


def evaluate_model(
    model: Any,
    tokenizer: Any,
    dataset: Any,
    *,
    batch_size: int = 16,
    max_new_tokens: int = 256,
    progress: bool = True,
    sort_by_length: bool = True,
    confidence: float = 0.95,
    description: str = "evaluating",
) -> dict[str, Any]:
    """Greedy, batched evaluation of ``model`` on ``dataset`` (rows with a chat ``prompt`` and a gold ``answer``).

    Prompts go through ``tokenizer.apply_chat_template(..., add_generation_prompt=True)``, are sorted by length
    (``sort_by_length``) so each batch pads little, left-padded (generation appends on the right), and generated
    under ``torch.inference_mode`` (on a CPU profile through ``cpu_speed.for_generation``: the same tokens,
    faster); the order of ``records`` is the dataset's. A generation that reaches
    ``max_new_tokens`` without an end-of-sequence token counts as truncated. Returns ``score_completions``'s dict,
    timed over the whole loop (tokenizing, generating, decoding), plus ``batch_size`` and ``max_new_tokens``.
    """
    _check_generation_args(batch_size, max_new_tokens)
    rows = _rows(dataset)
    started = time.perf_counter()
    prompts = [row["prompt"] for row in rows]
    lengths = prompt_token_lengths(tokenizer, prompts) if sort_by_length else [0] * len(rows)
    order = sorted(range(len(rows)), key=lambda i: -lengths[i])  # stable: unsorted when every length is 0
    generations: list[Generation | None] = [None] * len(rows)
    with _progress_bar(len(rows), progress, description) as bar, cpu_speed.for_generation(model):
        for start in range(0, len(order), batch_size):
            batch = order[start : start + batch_size]
            outputs = greedy_generate(model, tokenizer, [prompts[i] for i in batch], max_new_tokens)
            for i, generation in zip(batch, outputs, strict=True):
                generations[i] = generation
            bar.update(len(batch))
    elapsed = time.perf_counter() - started
    return _score_generations(rows, generations, elapsed, confidence) | {
        "batch_size": batch_size,
        "max_new_tokens": max_new_tokens,
    }


def _score_generations(
    rows: list[Any], generations: Sequence[Generation | None], elapsed: float, confidence: float
) -> dict[str, Any]:
    """Score generated texts against their rows' gold answers: the one place both generation loops end."""
    done = [g for g in generations if g is not None]
    return score_completions(
        [g.text for g in done],
        [str(row["answer"]) for row in rows],
        questions=[_question(row) for row in rows],
        truncated=[g.truncated for g in done],
        completion_tokens=[g.tokens for g in done],
        elapsed_seconds=elapsed,
        confidence=confidence,
    )


def evaluate_one_at_a_time(
    model: Any,
    tokenizer: Any,
    dataset: Any,
    *,
    max_new_tokens: int = 256,
    progress: bool = True,
    confidence: float = 0.95,
) -> dict[str, Any]:
    """The popular tutorial's loop, one problem per ``generate`` call: kept only as the speed baseline.

    It renders the chat template to text, tokenizes that one prompt, generates greedily, decodes, and moves on,
    so the hardware works on a single sequence at a time. Scored by the same ``score_completions``, so its
    metrics are comparable with ``evaluate_model``'s; only the speed should differ.
    """
    from tqdm.auto import tqdm

    _check_generation_args(1, max_new_tokens)
    rows = _rows(dataset)
    started = time.perf_counter()
    with cpu_speed.for_generation(model):  # as evaluate_model generates: only the batching differs
        generations = [
            greedy_generate(model, tokenizer, [row["prompt"]], max_new_tokens)[0]
            for row in tqdm(rows, disable=not progress, desc="one at a time", unit="problem")
        ]
    elapsed = time.perf_counter() - started
    return _score_generations(rows, generations, elapsed, confidence) | {
        "batch_size": 1,
        "max_new_tokens": max_new_tokens,
    }


# --- Tables ----------------------------------------------------------------------------------------


def _records_of(result_or_records: Mapping[str, Any] | Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    if isinstance(result_or_records, Mapping):
        if "records" not in result_or_records:
            raise ValueError("Expected an evaluation result (a dict with 'records') or a list of records")
        return list(result_or_records["records"])
    return list(result_or_records)


def records_dataframe(result_or_records: Mapping[str, Any] | Sequence[Mapping[str, Any]]) -> Any:
    """The per-problem records as a pandas ``DataFrame`` (one row per problem, in dataset order)."""
    import pandas as pd

    return pd.DataFrame(_records_of(result_or_records)).set_index("index")


def _check_result(result: Mapping[str, Any], name: str) -> None:
    missing = [key for key in ("n", "records", *RATE_METRICS) if key not in result]
    if missing:
        raise ValueError(f"{name} is not an evaluation result (missing {missing}); pass what evaluate_model returns")


def _check_same_problems(before: Mapping[str, Any], after: Mapping[str, Any]) -> None:
    """Before/after comparisons only mean something on the very same problems, in the same order."""
    if before["n"] != after["n"]:
        raise ValueError(f"before has {before['n']} problems and after {after['n']}: evaluate both on the same set")
    for b, a in zip(before["records"], after["records"], strict=True):
        if (b["question"], b["gold"]) != (a["question"], a["gold"]):
            raise ValueError(
                f"Problem {b['index']} differs between before and after ({b['question'][:40]!r} vs "
                f"{a['question'][:40]!r}): evaluate both models on the same dataset, in the same order"
            )


def compare_results(
    before: Mapping[str, Any], after: Mapping[str, Any], labels: tuple[str, str] = ("before", "after")
) -> Any:
    """A before/after table: one row per metric; the two values, the change, and the Wilson CIs of the rates.

    Both results must come from the same problems (checked), otherwise the change means nothing. Non-rate metrics
    (tokens, speed) have NaN in the CI columns.
    """
    import pandas as pd

    _check_result(before, "before")
    _check_result(after, "after")
    _check_same_problems(before, after)
    first, second = labels
    rows = []
    for metric in (*RATE_METRICS, *OTHER_METRICS):
        row = {"metric": metric, first: before[metric], second: after[metric], "change": after[metric] - before[metric]}
        for label, result in ((first, before), (second, after)):
            low, high = result.get(f"{metric}_ci", (math.nan, math.nan))
            row[f"{label}_ci_low"], row[f"{label}_ci_high"] = low, high
        rows.append(row)
    return pd.DataFrame(rows).set_index("metric")


def fixed_and_broken(before: Mapping[str, Any], after: Mapping[str, Any], *, include_unchanged: bool = False) -> Any:
    """Per problem, what training changed: ``fixed`` (wrong before, right after) and ``broken`` (the reverse).

    An accuracy that rises by 2 points can hide 10 fixed and 8 broken problems; this table shows both.
    ``include_unchanged`` also lists the problems that stayed right or stayed wrong.
    """
    import pandas as pd

    _check_result(before, "before")
    _check_result(after, "after")
    _check_same_problems(before, after)
    rows = []
    for b, a in zip(before["records"], after["records"], strict=True):
        change = {(False, True): "fixed", (True, False): "broken"}.get((b["correct"], a["correct"]))
        change = change or ("stayed right" if a["correct"] else "stayed wrong")
        if include_unchanged or change in ("fixed", "broken"):
            rows.append(
                {
                    "index": b["index"],
                    "change": change,
                    "question": b["question"],
                    "gold": b["gold"],
                    "before_answer": b["extracted"],
                    "after_answer": a["extracted"],
                    "before_formatted": b["formatted"],
                    "after_formatted": a["formatted"],
                }
            )
    columns = ["index", "change", "question", "gold", "before_answer", "after_answer", "before_formatted",
               "after_formatted"]  # fmt: skip
    return pd.DataFrame(rows, columns=columns).set_index("index")


def change_counts(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, int]:
    """How many problems were fixed, broken, stayed right and stayed wrong (they add up to ``n``)."""
    table = fixed_and_broken(before, after, include_unchanged=True)
    counts = table["change"].value_counts()
    return {key: int(counts.get(key, 0)) for key in ("fixed", "broken", "stayed right", "stayed wrong")}


def summary_line(result: Mapping[str, Any], name: str = "model") -> str:
    """One readable line: accuracy with its interval, formats, truncation, length and speed."""
    low, high = result["accuracy_ci"]
    return (
        f"{name}: accuracy {result['accuracy']:.0%} (95% CI {low:.0%}-{high:.0%}, n={result['n']}), "
        f"exact match {result['exact_match_accuracy']:.0%}, strict format {result['format_score']:.0%}, "
        f"soft format {result['soft_format_score']:.0%}, truncated {result['truncation_rate']:.0%}, "
        f"{result['mean_completion_tokens']:.1f} tokens/completion, {result['tokens_per_second']:.1f} tokens/s"
    )


def side_by_side(left: str, right: str, labels: tuple[str, str] = ("base", "trained"), width: int = 56) -> str:
    """Two texts in two columns of ``width`` characters, for reading a case study's outputs line against line."""
    import textwrap

    if width < 10:
        raise ValueError(f"width must be at least 10 characters per column, got {width}")

    def wrap(text: str) -> list[str]:
        return [part for line in text.splitlines() or [""] for part in textwrap.wrap(line, width) or [""]]

    left_lines, right_lines = wrap(left), wrap(right)
    height = max(len(left_lines), len(right_lines))
    left_lines += [""] * (height - len(left_lines))
    right_lines += [""] * (height - len(right_lines))
    rows = [f"{labels[0]:<{width}} | {labels[1]}", f"{'-' * width}-+-{'-' * width}"]
    rows += [f"{a:<{width}} | {b}" for a, b in zip(left_lines, right_lines, strict=True)]
    return "\n".join(rows)


# --- The trained model -----------------------------------------------------------------------------

def load_for_evaluation(profile: Any = None, folder: str | Path | None = None) -> tuple[Any, Any]:
    """The trained model and tokenizer (``training.load_trained_model``), with a LoRA adapter merged in.

    Merging (``merge_and_unload``) makes generation run at the base model's speed, so the speed comparison
    measures what GRPO changed (longer answers, say), not the overhead of unmerged LoRA layers.
    """
    model, tokenizer = load_trained_model(profile, folder)
    if hasattr(model, "merge_and_unload"):
        model = model.merge_and_unload()
    return model.eval(), tokenizer


# --- Paired comparison: the exact McNemar test ------------------------------------------------------


def _check_count(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise TypeError(
            f"{name} must be a whole number of problems (int), got {type(value).__name__} {value!r}; "
            "count the problems only one of the two models solved"
        )
    if value < 0:
        raise ValueError(f"{name} must be >= 0 (a count of problems), got {value}")
    return int(value)


def mcnemar_exact(only_first_right: int, only_second_right: int) -> float:
    """Two-sided exact McNemar p-value for two models scored on the same problems.

    Only the problems where the models disagree carry information: ``only_first_right`` (first solved, second
    did not) and ``only_second_right``. Under "the models are equally good", each disagreement goes either way
    with probability 1/2, so the p-value is the two-sided exact binomial test of ``min(b, c)`` in ``b + c``
    trials at p = 1/2. No disagreement (0, 0) gives 1.0: nothing suggests a difference.
    """
    b = _check_count("only_first_right", only_first_right)
    c = _check_count("only_second_right", only_second_right)
    n, k = b + c, min(b, c)
    if n == 0 or b == c:
        return 1.0
    # P(X <= k) for X ~ Binomial(n, 1/2), summed in log space so that thousands of disagreements do not overflow
    logs = [math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) - n * math.log(2) for i in range(k + 1)]
    top = max(logs)
    tail = math.exp(top) * sum(math.exp(x - top) for x in logs)
    return min(1.0, 2 * tail)


def paired_counts(first: Mapping[str, Any], second: Mapping[str, Any], key: str = "correct") -> tuple[int, int]:
    """``(only_first_right, only_second_right)`` for two results on the same problems, by record flag ``key``."""
    _check_same_problems(first, second)
    pairs = list(zip(first["records"], second["records"], strict=True))
    return sum(a[key] and not b[key] for a, b in pairs), sum(b[key] and not a[key] for a, b in pairs)


def stage_table(results: Mapping[str, Mapping[str, Any]]) -> Any:
    """One row per model: strict and lenient accuracy, strict format rate, each with its Wilson interval.

    Strict accuracy needs the answer inside the tags; lenient takes the last number in the text. A format gain
    raises the first and not the second.
    """
    import pandas as pd

    rows = {}
    for name, result in results.items():
        row: dict[str, Any] = {"n": result["n"]}
        for metric in ("accuracy", "lenient_accuracy", "format_score"):
            low, high = result[f"{metric}_ci"]
            row[metric] = result[metric]
            row[f"{metric} 95% CI"] = f"{low:.2f}-{high:.2f}"
        rows[name] = row
    return pd.DataFrame(rows).T


def mcnemar_table(results: Mapping[str, Mapping[str, Any]], key: str = "correct") -> Any:
    """Each consecutive pair of models (base -> warm start -> GRPO): who alone solved what, and McNemar's p."""
    import pandas as pd

    names = list(results)
    rows = []
    for first, second in itertools.pairwise(names):
        b, c = paired_counts(results[first], results[second], key)
        rows.append({"comparison": f"{first} -> {second}", "only first": b, "only second": c, "p": mcnemar_exact(b, c)})
    return pd.DataFrame(rows).set_index("comparison")


# --- Held-out problems: the test split and notebook 02's validation split -------------------------


def test_problems(profile: Any = None) -> Any:
    """The profile's ``eval_size`` first GSM8K test problems, formatted (never used for training or choices)."""
    return load_gsm8k("test", formatted=True, limit=get_profile(profile).eval_size)


def validation_problems(profile: Any = None, exclude: Any = None, size: int | None = None) -> Any:
    """Notebook 02's validation split (saved, else rebuilt with the same seed), minus questions in ``exclude``.

    The split holds out a fifth of the *train* split; ``exclude`` (a dataset with ``question``, or questions)
    removes any problem the run trained on, so the curve measures unseen problems. ``size`` defaults to the
    profile's ``eval_size``.
    """
    p = get_profile(profile)
    try:
        validation = load_splits()["validation"]
    except FileNotFoundError:
        validation = train_val_split(load_gsm8k("train", formatted=True, verbose=False), 0.2, 42)["validation"]
    if exclude is not None:
        seen = set(exclude["question"] if hasattr(exclude, "column_names") else exclude)
        validation = validation.filter(lambda row: row["question"] not in seen)
    size = p.eval_size if size is None else size
    return validation.select(range(min(size, len(validation))))


def checkpoint_steps(run_dir: str | Path) -> list[tuple[int, Path]]:
    """``(step, folder)`` of every ``checkpoint-N`` in ``run_dir``, by step."""
    found = []
    for folder in Path(run_dir).glob("checkpoint-*"):
        suffix = folder.name.split("-", 1)[1]
        if suffix.isdigit() and folder.is_dir():
            found.append((int(suffix), folder))
    return sorted(found)


def checkpoint_curve(
    profile: Any,
    run_dir: str | Path,
    problems: Any,
    *,
    base: Any = None,
    batch_size: int = 16,
    max_new_tokens: int | None = None,
) -> list[dict[str, Any]]:
    """Accuracy and format rate of the starting model (step 0) and of every checkpoint of ``run_dir`` on ``problems``.

    Each checkpoint holds the LoRA adapter at that step; it is loaded onto ``base`` (the model GRPO started from:
    the warm-start cache of the run folder when there is one, else the profile's model) and merged. A falling
    validation curve under a rising training reward is overfitting.
    """
    from peft import PeftModel

    p = get_profile(profile)
    max_new_tokens = max_new_tokens or p.eval_max_new_tokens
    base_dir = Path(base) if base is not None else warm_start_model_dir(run_dir)
    base_model, tokenizer = _starting_model(p, base_dir)
    settings = {"batch_size": batch_size, "max_new_tokens": max_new_tokens, "progress": False}
    curve = [_curve_point(0, evaluate_model(base_model, tokenizer, problems, **settings))]
    adapters = [(step, path) for step, path in checkpoint_steps(run_dir) if saved_model_kind(path) == "lora-adapter"]
    for index, (step, folder) in enumerate(adapters):
        if index:  # the previous adapter was merged into these weights: start again from the saved ones
            base_model, _ = _starting_model(p, base_dir)
        model = PeftModel.from_pretrained(base_model, folder).merge_and_unload()
        curve.append(_curve_point(step, evaluate_model(model, tokenizer, problems, **settings)))
    return curve


def _starting_model(profile: Any, base_dir: Path) -> tuple[Any, Any]:
    """The model GRPO started from (the saved warm start in ``base_dir``, else the profile's) and the tokenizer."""
    return _saved_warm_start(profile, base_dir) or load_model_and_tokenizer(profile)


def _saved_warm_start(profile: Any, folder: Path) -> tuple[Any, Any] | None:
    """The warm-started model saved in ``folder``, in the profile's dtype, and the profile's tokenizer; or None."""
    model = load_saved_warm_start(folder, profile_dtype(profile))
    return None if model is None else (model.eval(), load_tokenizer(profile))


def _curve_point(step: int, result: Mapping[str, Any]) -> dict[str, Any]:
    point: dict[str, Any] = {"step": step, "n": result["n"]}
    for metric in ("accuracy", "lenient_accuracy", "format_score"):
        point[metric] = result[metric]
        point[f"{metric}_ci"] = list(result[f"{metric}_ci"])
    return point


# --- The three stages: base, warm start, GRPO ----------------------------------------------------------

CURVE_FILENAME = "validation_curve.json"


def load_warm_start_model(profile: Any, run_dir: str | Path) -> tuple[Any, Any] | None:
    """The warm-started model of a run and the profile's tokenizer (left padding), or None without a warm start.

    Evaluated on its own, it tells what the supervised warm start did before GRPO changed anything, so the
    GRPO model is compared with the model GRPO started from, not with the raw base model.
    """
    return _saved_warm_start(profile, warm_start_model_dir(run_dir))


def save_curve(curve: Sequence[Mapping[str, Any]], run_dir: str | Path) -> Path:
    """Write a ``checkpoint_curve`` next to the run's log history, for notebook 06's overfitting plot."""
    import json

    path = Path(run_dir) / CURVE_FILENAME
    path.write_text(json.dumps(list(curve), indent=1))
    return path


def load_curve(run_dir: str | Path) -> list[dict[str, Any]] | None:
    """The curve ``save_curve`` wrote for ``run_dir``, or None when notebook 05 has not evaluated the run.

    A file that is there but damaged (cut short, edited) is an error naming it, not a curve of whatever parsed.
    """
    import json

    path = Path(run_dir) / CURVE_FILENAME
    if not path.is_file():
        return None
    try:
        curve = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path} is damaged ({exc}); delete it and run notebook 05's checkpoint cell again.") from exc
    if not isinstance(curve, list) or not all(isinstance(point, dict) and "step" in point for point in curve):
        raise ValueError(f"{path} is not a validation curve (a list of points with a 'step'); delete it and rerun.")
    return curve
