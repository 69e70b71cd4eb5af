"""GSM8K, from raw rows to the chat prompts that ``GRPOTrainer`` consumes.

A GSM8K answer is worked reasoning with calculator notes, then the final number after ``####``::

    Natalia sold 48/2 = <<48/2=24>>24 clips in May.
    ...
    #### 72

``extract_hash_answer`` turns that into the gold answer (``"72"``), ``build_prompt`` makes the chat
messages (a ``system`` message with the XML format instruction, then the ``user`` question), and
``format_gsm8k`` does both for a whole dataset without losing a row silently: a row it cannot parse
is an error naming the row, or, in the explicit lenient mode, a reported skip.
"""

from __future__ import annotations

import json
import os
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from course_utils.paths import data_dir

SYSTEM_PROMPT = """Respond in the following format:
<reasoning>
...
</reasoning>
<answer>
...
</answer>"""

HUB_DATASET = ("openai/gsm8k", "main")
SAMPLE_FILENAME = "gsm8k_sample.jsonl"
SAMPLE_TEST_ROWS = 16  # the bundled sample's last rows are its held-out "test" split
GSM8K_DIR_ENV_VAR = "GSM8K_DIR"
SPLITS = ("train", "test")

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


class GSM8KFormatError(ValueError):
    """A GSM8K answer that does not follow the ``reasoning ... #### number`` format."""


def _excerpt(text: str, width: int = 60) -> str:
    flat = " ".join(str(text).split())
    return flat if len(flat) <= width else f"{flat[: width - 3]}..."


def normalize_number(text: str) -> str:
    """``" $1,000 "`` -> ``"1000"``: drop thousands separators, ``$`` and surrounding space.

    Only formatting is removed; the digits stay as written (``"18.00"`` stays ``"18.00"``; equality of
    values is the reward's job, not the parser's).
    """
    return text.replace(",", "").replace("$", "").strip()


def extract_hash_answer(text: str) -> str:
    """The normalised gold answer after ``####`` (``"... #### 1,000"`` -> ``"1000"``).

    Raises ``GSM8KFormatError`` (a ``ValueError``) when there is no ``####``, more than one, or the
    answer is empty or not a number, and ``TypeError`` for a non-string: a silently wrong gold answer
    would poison every reward computed against it.
    """
    if not isinstance(text, str):
        raise TypeError(f"A GSM8K answer must be a string, got {type(text).__name__}: {_excerpt(repr(text))}")
    count = text.count("####")
    if count != 1:
        problem = "no '####' marker" if count == 0 else f"{count} '####' markers (expected exactly one)"
        raise GSM8KFormatError(f"{problem} in answer {_excerpt(text)!r}")
    answer = normalize_number(text.split("####", 1)[1])
    if not answer:
        raise GSM8KFormatError(f"empty answer after '####' in {_excerpt(text)!r}")
    if not _NUMBER.fullmatch(answer):
        raise GSM8KFormatError(f"answer {answer!r} after '####' is not a number, in {_excerpt(text)!r}")
    return answer


def extract_reasoning(text: str) -> str:
    """The reference solution without its final ``#### answer`` line."""
    return text.split("####", 1)[0].strip()


def extract_xml_answer(text: str | None) -> str:
    """The content of the last complete ``<answer>...</answer>`` block, stripped; ``""`` when none.

    ``str.rfind`` instead of a regex: linear time on any input, so a 1 MB completion full of tags
    cannot stall a reward. A non-string (``None`` from a failed generation, say) holds no answer.
    """
    if not isinstance(text, str):
        return ""
    end = text.rfind("</answer>")
    if end == -1:
        return ""
    start = text.rfind("<answer>", 0, end)
    if start == -1:
        return ""
    return text[start + len("<answer>") : end].strip()


def build_prompt(question: str, system_prompt: str = SYSTEM_PROMPT) -> list[dict[str, str]]:
    """The chat messages for one problem: the format instruction as ``system``, then the question as ``user``.

    The order matters: chat templates treat the first ``system`` message as standing instructions;
    put the instruction in a second ``user`` turn and many models ignore it.
    """
    if not isinstance(question, str) or not question.strip():
        raise ValueError(f"question must be a non-empty string, got {_excerpt(repr(question))}")
    if not isinstance(system_prompt, str):
        raise TypeError(f"system_prompt must be a string, got {type(system_prompt).__name__}")
    return [
        {"role": "system", "content": system_prompt},
        {"role": "user", "content": question.strip()},
    ]


# --- Loading ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LoadedFrom:
    """Where ``load_gsm8k`` found its rows, for the learner to read."""

    kind: str  # "folder", "hub" or "sample"
    location: str

    def __str__(self) -> str:
        return f"{self.kind}: {self.location}"


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    rows = []
    with path.open(encoding="utf-8") as handle:
        for line_number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise ValueError(
                    f"{path}:{line_number} is not valid JSON ({exc.msg}); fix or remove that line"
                ) from exc
    return rows


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")


def _from_folder(folder: Path, split: str) -> list[dict[str, Any]]:
    path = folder / f"{split}.jsonl"
    if not path.is_file():
        present = sorted(p.name for p in folder.glob("*.jsonl")) if folder.is_dir() else "folder does not exist"
        raise FileNotFoundError(
            f"No {path.name} in {folder} (found: {present}). Point GSM8K_DIR (or the folder argument) at a folder "
            "holding OpenAI's train.jsonl and test.jsonl."
        )
    return _read_jsonl(path)


def _from_hub(split: str) -> list[dict[str, Any]] | None:
    from course_utils.profiles import hub_reachable

    if not hub_reachable():
        return None
    try:
        from datasets import load_dataset

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
    rows = _read_jsonl(path)
    return rows[:-SAMPLE_TEST_ROWS] if split == "train" else rows[-SAMPLE_TEST_ROWS:]


def _resolve_rows(split: str, folder: str | Path | None) -> tuple[list[dict[str, Any]], LoadedFrom]:
    if folder is not None:
        return _from_folder(Path(folder), split), LoadedFrom("folder", str(Path(folder) / f"{split}.jsonl"))
    env_folder = os.environ.get(GSM8K_DIR_ENV_VAR)
    if env_folder:
        try:
            return _from_folder(Path(env_folder), split), LoadedFrom("folder", str(Path(env_folder) / f"{split}.jsonl"))
        except FileNotFoundError as exc:
            warnings.warn(f"{GSM8K_DIR_ENV_VAR}={env_folder!r} is unusable ({exc}); trying the Hub.", stacklevel=3)
    hub_rows = _from_hub(split)
    if hub_rows is not None:
        return hub_rows, LoadedFrom("hub", f"{HUB_DATASET[0]} ({HUB_DATASET[1]}), split {split}")
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
    from datasets import Dataset

    _check_split(split)
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be a positive number of rows or None, got {limit}")
    rows, source = _resolve_rows(split, folder)
    rows = rows[:limit] if limit is not None else rows
    dataset = Dataset.from_list([{"question": row["question"], "answer": row["answer"]} for row in rows])
    dataset.info.description = f"GSM8K {split} from {source}"
    if verbose:
        print(f"GSM8K {split}: {len(dataset):,} rows from {source}")
    return format_gsm8k(dataset) if formatted else dataset


# --- Formatting ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BadRow:
    """A row that cannot be parsed: where it is and why."""

    index: int
    reason: str
    excerpt: str

    def __str__(self) -> str:
        return f"row {self.index}: {self.reason} ({self.excerpt!r})"


def _parse_row(row: dict[str, Any], system_prompt: str) -> dict[str, Any]:
    question, solution = row.get("question"), row.get("answer")
    if not isinstance(question, str) or not question.strip():
        raise GSM8KFormatError(f"missing or empty question: {_excerpt(repr(question))}")
    return {
        "prompt": build_prompt(question, system_prompt),
        "answer": extract_hash_answer(solution),
        "question": question.strip(),
        "reasoning": extract_reasoning(solution),
    }


def find_bad_rows(dataset: Any) -> list[BadRow]:
    """Every row ``format_gsm8k`` would refuse, with the reason: look before you skip."""
    bad = []
    for index, row in enumerate(dataset):
        try:
            _parse_row(row, SYSTEM_PROMPT)
        except (ValueError, TypeError) as exc:
            bad.append(BadRow(index, str(exc), _excerpt(repr(row.get("answer")), 40)))
    return bad


def format_gsm8k(dataset: Any, *, lenient: bool = False, system_prompt: str = SYSTEM_PROMPT) -> Any:
    """Raw GSM8K rows -> a ``Dataset`` with ``prompt`` (chat messages), ``answer`` (gold), ``question``, ``reasoning``.

    ``dataset`` is a ``datasets.Dataset`` or a list of dicts with ``question`` and ``answer``. By
    default a bad row raises ``ValueError`` naming its index and an excerpt. ``lenient=True`` skips
    bad rows instead and warns with how many and which, so nothing disappears unnoticed.
    """
    from datasets import Dataset

    parsed, bad = [], []
    for index, row in enumerate(dataset):
        if not isinstance(row, dict):
            problem = BadRow(index, f"row is a {type(row).__name__}, not a dict", _excerpt(repr(row), 40))
        else:
            try:
                parsed.append(_parse_row(row, system_prompt))
                continue
            except (ValueError, TypeError) as exc:
                problem = BadRow(index, str(exc), _excerpt(repr(row.get("answer")), 40))
        if not lenient:
            raise GSM8KFormatError(f"Cannot format {problem}. Fix the row, or pass lenient=True to skip bad rows.")
        bad.append(problem)
    if bad:
        listed = "; ".join(str(b) for b in bad[:10]) + (" ..." if len(bad) > 10 else "")
        warnings.warn(f"format_gsm8k skipped {len(bad)} of {len(bad) + len(parsed)} rows: {listed}", stacklevel=2)
    if not parsed:
        raise ValueError("No usable rows: the dataset is empty or every row is malformed.")
    return Dataset.from_list(parsed)


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
    from datasets import DatasetDict

    return DatasetDict({"train": split["train"], "validation": split["test"]})
