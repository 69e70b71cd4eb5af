"""Real GSM8K rows for the case banks: the first rows, and the ones one-line parsers get wrong.

A check runs the learner's function on real data as well as on edge cases; these read the rows from a
``Dataset``, a ``DatasetDict`` split or a list of dicts alike.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def dataset_column(dataset: Any, name: str) -> list[Any]:
    """One column of a ``Dataset``, a ``DatasetDict`` split or a list of dicts, as a list."""
    if isinstance(dataset, Sequence) and not isinstance(dataset, str):
        return [row[name] for row in dataset]
    return list(dataset[name])


def short_repr(text: Any, width: int = 32) -> str:
    """``text`` on one line, cut from the front to ``width`` characters: a case label that fits a verdict line."""
    flat = " ".join(str(text).split())
    return repr(flat if len(flat) <= width else f"...{flat[-width + 3 :]}")


def real_row_indices(dataset: Any, count: int = 24) -> list[int]:
    """The first rows, and the rows whose final answer has a comma, a sign, a ``$`` or a decimal point.

    Those are the rows one-line parsers get wrong, so they belong in every check on real data.
    """
    answers = dataset_column(dataset, "answer")
    tricky = [i for i, text in enumerate(answers) if any(c in text.rsplit("####", 1)[-1] for c in ",-$.")]
    first = list(range(min(count // 2, len(answers))))
    return sorted(set(first + tricky[: count - len(first)]))


def dataset_rows(dataset: Any, indices: Sequence[int]) -> list[dict[str, Any]]:
    """The rows at ``indices`` as ``{"question", "answer"}`` dicts, whatever form the dataset has."""
    questions, answers = dataset_column(dataset, "question"), dataset_column(dataset, "answer")
    return [{"question": questions[i], "answer": answers[i]} for i in indices]
