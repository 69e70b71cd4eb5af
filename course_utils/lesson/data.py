"""GSM8K read from wherever it is: a folder, the Hugging Face Hub, or the bundled sample; and split, saved, reloaded.

``load_gsm8k`` tries the sources in order and says which one it used; a source that was asked for and is
unusable (a missing file, a line that is not JSON, a file that is not UTF-8) is an error naming the file and
line, never a quiet switch to another source. ``train_val_split`` / ``save_splits`` / ``load_splits`` give
every later notebook the same seeded validation split, and ``measure_dataset_vs_dicts`` measures what a
``datasets.Dataset`` costs next to plain dicts. Parsing rows into prompts is ``formatting``'s job.
"""

from __future__ import annotations

import json
import math
import os
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from datasets import Dataset, DatasetDict, load_dataset, load_from_disk

from course_utils.core.hardware import hub_reachable

# Also read from here (by rewards.hacking and tests): the data module and the rewards share one format.
from course_utils.core.paths import data_dir, output_dir
from course_utils.lesson.formatting import extract_hash_answer, format_gsm8k

HUB_DATASET = ("openai/gsm8k", "main")

# The bundled sample: 64 problems written for the course (not copied from GSM8K) in the exact GSM8K
# format. Its last SAMPLE_TEST_ROWS rows are its "test" split, the first 48 its "train" split. Unlike
# real GSM8K (whose final answers never carry "$" and are all integers), a few sample answers are
# written "#### $1,200"-style and some are decimals or negative: the sample exercises every
# normalisation `extract_hash_answer` does, so the notebook and the tests see each case.
SAMPLE_FILENAME = "gsm8k_sample.jsonl"
SAMPLE_TEST_ROWS = 16
GSM8K_DIR_ENV_VAR = "GSM8K_DIR"
SPLITS = ("train", "test")


@dataclass(frozen=True)
class LoadedFrom:
    """Where ``load_gsm8k`` found its rows, for the learner to read."""

    kind: str  # "folder", "hub" or "sample"
    location: str

    def __str__(self) -> str:
        return f"{self.kind}: {self.location}"


REQUIRED_KEYS = ("question", "answer")


def _decode_problem(path: Path, exc: UnicodeDecodeError) -> str:
    """Why a data file is not UTF-8, and the fix (a byte-order mark gives its encoding away)."""
    head = path.read_bytes()[:4]
    if head[:2] in (b"\xff\xfe", b"\xfe\xff"):
        found = "it is UTF-16 (it starts with a UTF-16 byte-order mark)"
    else:
        found = f"byte {exc.start} of a line is {exc.object[exc.start : exc.start + 1]!r}"
    return f"{path} is not UTF-8 text: {found}. Re-save it as UTF-8 JSON Lines (one JSON object a line)."


def _read_jsonl(path: Path, required: Sequence[str] = ()) -> list[dict[str, Any]]:
    """The JSON objects of a JSON Lines file; a bad line (not JSON, not an object, a ``required`` key missing)
    is an error naming the file and line."""
    rows = []
    try:
        with path.open(encoding="utf-8-sig") as handle:
            for line_number, line in enumerate(handle, start=1):
                if line.strip():
                    rows.append(_parse_line(path, line_number, line, required))
    except UnicodeDecodeError as exc:
        raise ValueError(_decode_problem(path, exc)) from exc
    return rows


def _parse_line(path: Path, line_number: int, line: str, required: Sequence[str]) -> dict[str, Any]:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}:{line_number} is not valid JSON ({exc.msg}); fix or remove that line") from exc
    if not isinstance(row, dict):
        raise ValueError(f"{path}:{line_number} is a JSON {type(row).__name__}, not an object with {list(required)}")
    missing = [key for key in required if key not in row]
    if missing:
        raise ValueError(
            f"{path}:{line_number} has keys {sorted(row)}, not {list(required)} (missing {missing}). GSM8K rows "
            "need 'question' (the problem) and 'answer' (the worked solution ending '#### number'): rename the keys."
        )
    not_text = {key: type(row[key]).__name__ for key in required if not isinstance(row[key], str)}
    if not_text:
        raise ValueError(
            f"{path}:{line_number} has {', '.join(f'{key!r} as a {kind}' for key, kind in not_text.items())}: GSM8K's "
            "'question' and 'answer' are text, the answer a worked solution ending '#### number'. Quote the values."
        )
    return row


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")


def _from_folder(folder: Path, split: str, setting: str = "the folder argument") -> list[dict[str, Any]]:
    """The rows of ``<folder>/<split>.jsonl``; ``setting`` names what pointed there, for the error's fix."""
    path = folder / f"{split}.jsonl"
    if not path.is_file():
        present = sorted(p.name for p in folder.glob("*.jsonl")) if folder.is_dir() else "the folder does not exist"
        raise FileNotFoundError(
            f"No {path.name} in {folder} (from {setting}; found: {present}). Point {setting} at a folder holding "
            f"OpenAI's train.jsonl and test.jsonl, or leave {GSM8K_DIR_ENV_VAR} unset to use the Hub or the sample."
        )
    return _read_jsonl(path, REQUIRED_KEYS)


def _from_hub(split: str) -> list[dict[str, Any]] | None:
    if not hub_reachable():
        return None
    try:
        return load_dataset(*HUB_DATASET, split=split).to_list()
    except Exception as exc:  # any Hub failure means: use the next source, and say why
        warnings.warn(f"Loading {HUB_DATASET[0]} from the Hub failed ({exc}); using the next source.", stacklevel=3)
        return None


def sample_path() -> Path:
    """The bundled sample: problems we wrote ourselves, in the exact GSM8K format."""
    return data_dir() / SAMPLE_FILENAME


def _from_sample(split: str) -> list[dict[str, Any]]:
    path = sample_path()
    if not path.is_file():
        raise FileNotFoundError(f"The bundled sample {path} is missing: restore it with `git checkout -- data/`.")
    rows = _read_jsonl(path, REQUIRED_KEYS)
    return rows[:-SAMPLE_TEST_ROWS] if split == "train" else rows[-SAMPLE_TEST_ROWS:]


def _resolve_rows(split: str, folder: str | Path | None) -> tuple[list[dict[str, Any]], LoadedFrom]:
    """The rows of the first source asked for; a folder that was asked for (argument or ``GSM8K_DIR``) and is
    unusable is an error, never a quiet switch to another source. The sample, used only when nothing was asked
    for and the Hub is unreachable, says so."""
    env_folder = os.environ.get(GSM8K_DIR_ENV_VAR)
    if folder is not None or env_folder:
        setting = "the folder argument" if folder is not None else GSM8K_DIR_ENV_VAR
        chosen = Path(folder if folder is not None else env_folder)
        return _from_folder(chosen, split, setting), LoadedFrom("folder", str(chosen / f"{split}.jsonl"))
    hub_rows = _from_hub(split)
    if hub_rows is not None:
        return hub_rows, LoadedFrom("hub", f"{HUB_DATASET[0]} ({HUB_DATASET[1]}), split {split}")
    warnings.warn(
        f"GSM8K {split}: no {GSM8K_DIR_ENV_VAR} set and the Hub is unreachable, so the bundled {SAMPLE_FILENAME} "
        f"is used (a few dozen problems). Set {GSM8K_DIR_ENV_VAR} to a folder with OpenAI's files for the real data.",
        stacklevel=3,
    )
    return _from_sample(split), LoadedFrom("sample", f"{sample_path()} ({split} part; the Hub was unreachable)")


def load_gsm8k(
    split: str = "train",
    folder: str | Path | None = None,
    *,
    formatted: bool = False,
    limit: int | None = None,
    verbose: bool = True,
) -> Any:
    """GSM8K rows as a ``datasets.Dataset``, from the first source that has them.

    Sources, in order: ``folder`` (or the ``GSM8K_DIR`` environment variable) holding OpenAI's
    ``train.jsonl`` / ``test.jsonl``; the Hub dataset ``openai/gsm8k`` (``main``); the bundled sample
    ``data/gsm8k_sample.jsonl``. Raw rows have ``question`` and ``answer`` (the full solution);
    ``formatted=True`` returns ``format_gsm8k`` of them. ``limit`` keeps the first rows. The source used
    is printed (``verbose``) and stored in ``dataset.info.description``.
    """
    _check_split(split)
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be a positive number of rows or None, got {limit}")
    rows, source = _resolve_rows(split, folder)
    rows = rows[:limit] if limit is not None else rows
    dataset = Dataset.from_list([{"question": row["question"], "answer": row["answer"]} for row in rows])
    if verbose:
        print(f"GSM8K {split}: {len(dataset):,} rows from {source}")
    dataset.info.description = f"GSM8K {split} from {source}"  # before formatting: a bad row's error names the file
    dataset = format_gsm8k(dataset) if formatted else dataset
    dataset.info.description = f"GSM8K {split} from {source}"
    return dataset


def from_bundled_sample(dataset: Any) -> bool:
    """Whether ``load_gsm8k`` found these rows in the bundled sample (a few dozen problems), not real GSM8K."""
    return f" from {LoadedFrom('sample', '')}" in (getattr(dataset.info, "description", "") or "")


def train_val_split(dataset: Any, val_fraction: float = 0.2, seed: int = 42) -> Any:
    """A seeded ``DatasetDict`` with ``train`` and ``validation`` (8:2 by default).

    The same seed gives the same split on every machine, so results can be compared between learners.
    """
    if not 0 < val_fraction < 1:
        raise ValueError(f"val_fraction must be strictly between 0 and 1, got {val_fraction}")
    if len(dataset) < 2:
        raise ValueError(f"Need at least 2 rows to split, got {len(dataset)}")
    n_val = round(len(dataset) * val_fraction)
    if n_val == 0 or n_val == len(dataset):
        raise ValueError(
            f"val_fraction={val_fraction} of {len(dataset)} rows leaves an empty split; "
            "use more rows or another fraction"
        )
    split = dataset.train_test_split(test_size=n_val, seed=seed, shuffle=True)
    return DatasetDict({"train": split["train"], "validation": split["test"]})


def save_splits(splits: Any, name: str = "gsm8k_train_val") -> Path:
    """Save a ``DatasetDict`` (Arrow files) under the git-ignored ``output_dir()/datasets/<name>``; return the folder.

    Saved Arrow files are memory-mapped when reloaded: later notebooks get the exact same split back
    in a fraction of a second, without re-parsing or re-shuffling.
    """
    if not name or Path(name).name != name:
        raise ValueError(f"name must be a plain folder name (no '/' or '..'), got {name!r}")
    folder = output_dir() / "datasets" / name
    splits.save_to_disk(str(folder))
    return folder


def load_splits(name_or_path: str | Path = "gsm8k_train_val") -> Any:
    """Reload what ``save_splits`` wrote: a folder name under ``output_dir()/datasets`` or a path."""
    folder = Path(name_or_path)
    if not folder.is_absolute() and len(folder.parts) == 1:
        folder = output_dir() / "datasets" / folder
    if not folder.is_dir():
        raise FileNotFoundError(f"No saved dataset at {folder}: run save_splits(train_val_split(...)) first.")
    return load_from_disk(str(folder))


def _best_time(function: Callable[[], Any], repeats: int) -> float:
    best = math.inf
    for _ in range(repeats):
        started = time.perf_counter()
        function()
        best = min(best, time.perf_counter() - started)
    return best


def measure_dataset_vs_dicts(dataset: Any, repeats: int = 3) -> list[dict[str, Any]]:
    """Seconds (best of ``repeats``) for the same jobs on a ``Dataset`` and on a list of dicts.

    Jobs: iterate every row, read one column (``list(ds["answer"])`` and the batch read ``ds[:]["answer"]``),
    parse every gold answer (``map`` vs a list comprehension).
    The point of ``Dataset`` is not raw Python speed (it pays for Arrow conversion per row) but
    memory-mapped storage, caching and being what TRL's trainers expect; this measures the price.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    rows = dataset.to_list()
    jobs = {
        "iterate rows": (lambda: [row["answer"] for row in dataset], lambda: [row["answer"] for row in rows]),
        "read one column": (lambda: list(dataset["answer"]), lambda: [row["answer"] for row in rows]),
        "read one column, sliced": (lambda: dataset[:]["answer"], lambda: [row["answer"] for row in rows]),
        "parse gold answers": (
            lambda: dataset.map(lambda row: {"gold": extract_hash_answer(row["answer"])}, load_from_cache_file=False),
            lambda: [{**row, "gold": extract_hash_answer(row["answer"])} for row in rows],
        ),
    }
    results = []
    for job, (with_dataset, with_dicts) in jobs.items():
        dataset_s, dicts_s = _best_time(with_dataset, repeats), _best_time(with_dicts, repeats)
        results.append(
            {"job": job, "rows": len(rows), "Dataset_s": dataset_s, "dicts_s": dicts_s, "ratio": dataset_s / dicts_s}
        )
    return results
