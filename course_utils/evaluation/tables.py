"""The tables that compare evaluated models on the same problems: before/after, fixed and broken, stages, McNemar.

Each takes the results ``heldout.evaluate_model`` (or ``metrics.score_completions``) returns, and checks that they
come from the very same problems, in the same order: otherwise a change means nothing.
"""

from __future__ import annotations

import itertools
import math
import textwrap
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from course_utils.evaluation.metrics import OTHER_METRICS, RATE_METRICS
from course_utils.evaluation.stats import mcnemar_exact


def _records_of(result_or_records: Mapping[str, Any] | Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    if isinstance(result_or_records, Mapping):
        if "records" not in result_or_records:
            raise ValueError("Expected an evaluation result (a dict with 'records') or a list of records")
        return list(result_or_records["records"])
    return list(result_or_records)


def records_dataframe(result_or_records: Mapping[str, Any] | Sequence[Mapping[str, Any]]) -> Any:
    """The per-problem records as a pandas ``DataFrame`` (one row per problem, in dataset order)."""
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
    _check_result(before, "before")
    _check_result(after, "after")
    _check_same_problems(before, after)
    first, second = labels
    rows = []
    for metric in (*RATE_METRICS, *OTHER_METRICS):
        old, new = before.get(metric, math.nan), after.get(metric, math.nan)
        row = {"metric": metric, first: old, second: new, "change": new - old}
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
    names = list(results)
    rows = []
    for first, second in itertools.pairwise(names):
        b, c = paired_counts(results[first], results[second], key)
        rows.append({"comparison": f"{first} -> {second}", "only first": b, "only second": c, "p": mcnemar_exact(b, c)})
    return pd.DataFrame(rows).set_index("comparison")


def side_by_side(left: str, right: str, labels: tuple[str, str] = ("base", "trained"), width: int = 56) -> str:
    """Two texts in two columns of ``width`` characters, for reading a case study's outputs line against line."""
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
