"""Which problems a GRPO run trains on: the ones the warm start solves *sometimes*, chosen from its own samples.

GRPO learns only from groups whose rewards differ. For the correctness reward that is a problem the model gets
right in some of a group's samples but not all: a group of 8 that is all wrong (or all right) has zero advantages,
so it teaches nothing about solving. ``scripts/choose_problems.py --screen`` draws a group per training problem from
the warm start, as training draws one, and writes the problems solved sometimes to a list in ``data/problem_lists/``,
with how it was made. A profile's ``problem_list`` names that list; ``training_dataset`` trains on it.

A list names problems by a key of their question text (``question_key``), not by row number, so it survives
another copy or order of the GSM8K files and refuses data it was not made from.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from course_utils.core.paths import data_dir

LIST_FOLDER = "problem_lists"
LIST_KEYS = ("made_by", "screened", "samples_per_problem", "problems")


def problem_list_path(name: str) -> Path:
    """``data/problem_lists/<name>.json``: where the list a profile names lives."""
    if not isinstance(name, str) or not name or "/" in name or name.endswith(".json"):
        raise ValueError(f"a problem list is named by its file stem in data/{LIST_FOLDER}/ (e.g. 'cpu'), got {name!r}")
    return data_dir() / LIST_FOLDER / f"{name}.json"


def question_key(question: str) -> str:
    """A short, stable key of a question's text (whitespace-insensitive): how a list names its problems."""
    if not isinstance(question, str) or not question.strip():
        raise ValueError(f"question must be a non-empty string, got {question!r}")
    return hashlib.sha256(" ".join(question.split()).encode()).hexdigest()[:16]


def load_problem_list(name: str) -> dict[str, Any]:
    """The list ``name``, checked: how it was made, and its problems (each a ``key`` and ``correct_samples``)."""
    path = problem_list_path(name)
    if not path.exists():
        known = sorted(p.stem for p in path.parent.glob("*.json"))
        raise FileNotFoundError(f"no problem list {name!r} at {path}; known lists: {known or 'none'}. "
                                "scripts/choose_problems.py --screen writes one.")  # fmt: skip
    listing = json.loads(path.read_text())
    missing = [key for key in LIST_KEYS if key not in listing]
    if missing or not listing["problems"]:
        raise ValueError(f"{path} is not a problem list: it lacks {missing or ['problems']}; write it again with "
                         "scripts/choose_problems.py --screen")  # fmt: skip
    return listing


def sometimes_solved(records: Sequence[Mapping[str, Any]]) -> list[int]:
    """Indices of the problems whose samples are right sometimes, not always and not never."""
    return [i for i, r in enumerate(records) if 0 < r["correct_samples"] < r["samples"]]


def problem_list(
    questions: Sequence[str], records: Sequence[Mapping[str, Any]], made_by: str, **facts: Any
) -> dict[str, Any]:
    """The list to write: the problems solved sometimes among ``questions`` (screened in that order), and how."""
    if len(questions) != len(records):
        raise ValueError(f"{len(questions)} questions but {len(records)} scored problems: they must pair one to one")
    chosen = sometimes_solved(records)
    samples = records[0]["samples"] if records else 0
    return {
        "made_by": made_by,
        "screened": len(records),
        "samples_per_problem": samples,
        **facts,
        "problems": [_listed(questions[i], records[i]) for i in chosen],
    }


def rescreened_list(
    earlier: Mapping[str, Any], questions: Sequence[str], records: Sequence[Mapping[str, Any]], made_by: str,
    **facts: Any,
) -> dict[str, Any]:
    """A list sampled again (``questions`` in ``earlier``'s order), each problem's right samples counted over both
    screens: those solved sometimes, most often solved first, so a profile's first ``train_size`` are the problems
    whose groups most often hold a right answer."""
    if [question_key(q) for q in questions] != [p["key"] for p in earlier["problems"]]:
        raise ValueError("the questions sampled again are not the earlier list's problems in its order: build them "
                         "with the profile whose problem_list this is")  # fmt: skip
    before = earlier["samples_per_problem"]
    pairs = zip(records, earlier["problems"], strict=True)
    both = [{**record, "correct_samples": record["correct_samples"] + problem["correct_samples"],
             "samples": record["samples"] + before} for record, problem in pairs]  # fmt: skip
    listing = problem_list(questions, both, made_by, **facts)
    listing["problems"].sort(key=lambda problem: -problem["correct_samples"])
    first = {key: earlier[key] for key in ("made_by", "screened", "samples_per_problem")}
    return listing | {"screened": earlier["screened"], "first_screen": first, "order": "most often solved first"}


def _listed(question: str, record: Mapping[str, Any]) -> dict[str, Any]:
    """One problem of a list: its key, how often the warm start was right, and the question's start to read."""
    return {"key": question_key(question), "correct_samples": record["correct_samples"],
            "question_start": " ".join(question.split())[:60]}  # fmt: skip


def listed_rows(questions: Sequence[str], listing: Mapping[str, Any]) -> list[int]:
    """Row indices of ``questions`` that the list names, in the list's order; an error when some are missing."""
    where = {}
    for index, question in enumerate(questions):
        where.setdefault(question_key(question), index)
    keys = [problem["key"] for problem in listing["problems"]]
    absent = [key for key in keys if key not in where]
    if absent:
        raise ValueError(
            f"{len(absent)} of the list's {len(keys)} problems are not in this data (first: "
            f"{next(p['question_start'] for p in listing['problems'] if p['key'] == absent[0])!r}). The list was made "
            "from OpenAI's GSM8K train.jsonl: set GSM8K_DIR to its folder, or set the profile's problem_list to None."
        )
    return [where[key] for key in keys]
