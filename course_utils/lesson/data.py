"""GSM8K, from raw rows to the chat prompts that ``GRPOTrainer`` consumes.

A GSM8K answer is worked reasoning with calculator notes, then the final number after ``####``::

    Natalia sold 48/2 = <<48/2=24>>24 clips in May.
    ...
    #### 72

``extract_hash_answer`` turns that into the gold answer (``"72"``), ``build_prompt`` makes the chat
messages (a ``system`` message with the XML format instruction, then the ``user`` question), and
``format_gsm8k`` does both for a whole dataset without losing a row silently: a row it cannot parse
is an error naming the row, or, in the explicit lenient mode, a reported skip.

Also here, for notebook 02 and the pre-flight check: ``check_calculator_notes`` (verifies the bundled
sample), ``PITFALL_PARSERS`` / ``pitfall_report`` (deliberately wrong parsers and the rows they lose),
``render_prompt`` / ``continuation_probability`` (what the model sees; ``models.greedy_generate`` shows what it does),
``prompt_token_lengths`` / ``rows_with_short_prompts`` (the prompt cap of the ``cpu`` lab),
``token_length_stats`` / ``reference_length_percentile`` / ``recommended_completion_length``,
``save_splits`` / ``load_splits`` and ``measure_dataset_vs_dicts``.
"""

from __future__ import annotations

import ast
import json
import math
import operator
import os
import re
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from course_utils.core.answer_format import SYSTEM_PROMPT, XML_TEMPLATE
from course_utils.core.answer_format import extract_xml_answer as extract_xml_answer  # read back by notebook 02
from course_utils.core.paths import data_dir, output_dir
from course_utils.core.profiles import hub_reachable

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


def format_row(row: dict[str, Any], system_prompt: str = SYSTEM_PROMPT) -> dict[str, Any]:
    """One raw GSM8K row as ``GRPOTrainer`` reads it: ``prompt``, gold ``answer``, ``question``, ``reasoning``.

    The function a ``Dataset.map`` applies; ``format_gsm8k`` runs it on every row and names the rows it refuses.
    """
    question, solution = row.get("question"), row.get("answer")
    if not isinstance(question, str) or not question.strip():
        raise GSM8KFormatError(f"missing or empty question: {_excerpt(repr(question))}")
    return {
        "prompt": build_prompt(question, system_prompt),
        "answer": extract_hash_answer(solution),
        "question": question.strip(),
        "reasoning": extract_reasoning(solution),
    }


def _row_problem(index: int, row: Any, system_prompt: str) -> tuple[dict[str, Any] | None, BadRow | None]:
    """Parse one row: ``(parsed, None)`` when it is usable, ``(None, BadRow)`` saying why when not."""
    if not isinstance(row, dict):
        return None, BadRow(index, f"row is a {type(row).__name__}, not a dict", _shown(row))
    try:
        return format_row(row, system_prompt), None
    except (ValueError, TypeError) as exc:
        return None, BadRow(index, str(exc), _shown(row.get("answer")))


def _shown(value: Any) -> str:
    """A short excerpt of a bad value: strings as they are, anything else as its repr."""
    return _excerpt(value if isinstance(value, str) else repr(value), 40)


def find_bad_rows(dataset: Any) -> list[BadRow]:
    """Every row ``format_gsm8k`` would refuse, with the reason: look before you skip."""
    return [bad for index, row in enumerate(dataset) if (bad := _row_problem(index, row, SYSTEM_PROMPT)[1])]


def format_gsm8k(dataset: Any, *, lenient: bool = False, system_prompt: str = SYSTEM_PROMPT) -> Any:
    """Raw GSM8K rows -> a ``Dataset`` with ``prompt`` (chat messages), ``answer`` (gold), ``question``, ``reasoning``.

    ``dataset`` is a ``datasets.Dataset`` or a list of dicts with ``question`` and ``answer``. By
    default a bad row raises ``ValueError`` naming its index and an excerpt. ``lenient=True`` skips
    bad rows instead and warns with how many and which, so nothing disappears unnoticed.
    """
    from datasets import Dataset

    parsed, bad = [], []
    for index, row in enumerate(dataset):
        good, problem = _row_problem(index, row, system_prompt)
        if good is not None:
            parsed.append(good)
            continue
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
    from datasets import load_from_disk

    folder = Path(name_or_path)
    if not folder.is_absolute() and len(folder.parts) == 1:
        folder = output_dir() / "datasets" / folder
    if not folder.is_dir():
        raise FileNotFoundError(f"No saved dataset at {folder}: run save_splits(train_val_split(...)) first.")
    return load_from_disk(str(folder))


# --- Calculator notes ------------------------------------------------------------------------------

_NOTE = re.compile(r"<<([^<>=]*)=([^<>]*)>>")
_OPERATORS: dict[type, Callable[..., float]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}


def calculator_notes(solution: str) -> list[tuple[str, str]]:
    """The ``<<expression=result>>`` notes of a GSM8K solution, in order: ``[("48/2", "24"), ...]``."""
    return _NOTE.findall(solution)


def evaluate_arithmetic(expression: str) -> float:
    """Evaluate ``+ - * /`` arithmetic with parentheses, safely (an AST walk, never ``eval``).

    Raises ``ValueError`` for anything else (names, calls, ``**``, ``%``): a calculator note that is
    not plain arithmetic cannot be checked, and saying so beats guessing.
    """

    def walk(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float) and not isinstance(node.value, bool):
            return float(node.value)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            return _OPERATORS[type(node.op)](walk(node.left), walk(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPERATORS:
            return _OPERATORS[type(node.op)](walk(node.operand))
        raise ValueError(f"not plain arithmetic: {ast.dump(node)[:60]}")

    try:
        tree = ast.parse(expression.replace(",", "").strip(), mode="eval")
        return walk(tree.body)
    except (SyntaxError, ZeroDivisionError) as exc:
        raise ValueError(f"cannot evaluate {expression!r}: {exc}") from exc


def check_calculator_notes(solution: str, rel_tol: float = 1e-6) -> list[str]:
    """Problems with a solution's calculator notes; ``[]`` when every note is right.

    Each note ``<<expr=value>>`` must evaluate to its value, and the final ``#### answer`` must equal
    the last note's value. We run this on the bundled sample (whose problems we wrote by hand) so
    that a typo in our own data cannot teach a wrong answer.
    """
    problems = []
    notes = calculator_notes(solution)
    for expression, value in notes:
        try:
            computed = evaluate_arithmetic(expression)
            stated = float(normalize_number(value))
        except ValueError as exc:
            problems.append(f"<<{expression}={value}>>: {exc}")
            continue
        if not math.isclose(computed, stated, rel_tol=rel_tol, abs_tol=1e-9):
            problems.append(f"<<{expression}={value}>>: the expression gives {computed:g}")
    if not notes:
        problems.append("no calculator notes")
    else:
        final, last_value = extract_hash_answer(solution), normalize_number(notes[-1][1])
        if not math.isclose(float(final), float(last_value), rel_tol=rel_tol, abs_tol=1e-9):
            problems.append(f"final answer {final} differs from the last note's value {last_value}")
    return problems


# --- Pitfalls: DELIBERATELY WRONG parsers, kept for the notebook to measure --------------------------


def _pitfall_regex_digits(text: str) -> str | None:
    match = re.search(r"#### (\d+)", text)  # no sign, no comma, no decimal point, no "$"
    return match.group(1) if match else None


def _pitfall_isdigit_filter(text: str) -> str | None:
    answer = text.split("####")[-1].strip()
    return answer if answer.isdigit() else None  # the `ds.filter(lambda r: ... .isdigit())` pattern


def _pitfall_int_cast(text: str) -> str | None:
    return str(int(text.split("####")[-1]))  # int(" 1,000") raises: the row is skipped by try/except


def _pitfall_keep_commas(text: str) -> str | None:
    return text.split("####")[-1].strip()  # "1,000" and "$5" stay as written


def _pitfall_keep_dollar(text: str) -> str | None:
    return text.split("####")[-1].strip().replace(",", "")  # "$1200" never equals "1200"


def _pitfall_no_strip(text: str) -> str | None:
    return text.split("####")[-1].replace(",", "").replace("$", "")  # " 72" != "72"


PITFALL_PARSERS: dict[str, tuple[Callable[[str], str | None], str]] = {
    "regex_digits": (_pitfall_regex_digits, r're.search(r"#### (\d+)", text): no sign, comma, decimal point or $'),
    "isdigit_filter": (_pitfall_isdigit_filter, "keep rows whose answer .isdigit(): drops -5, 1,000, 2.5, $5"),
    "int_cast": (_pitfall_int_cast, 'int(text.split("####")[-1]) inside try/except: fails on 1,000 / 2.5 / $5'),
    "keep_commas": (_pitfall_keep_commas, "split and strip only: 1,000 and $5 stay as written"),
    "keep_dollar": (_pitfall_keep_dollar, "commas removed, $ kept: $1200 never equals 1200"),
    "no_strip": (_pitfall_no_strip, "commas and $ removed, no strip(): ' 72' never equals '72'"),
}
"""Deliberately WRONG gold-answer parsers, each a classic mistake: never use them outside the lesson.

Each maps a raw GSM8K answer to a string, or ``None`` when the row is LOST (no match, or an exception
swallowed by the usual ``try/except: continue``). ``pitfall_report`` counts the damage on real rows.
"""


def apply_pitfall(name: str, text: str) -> str | None:
    """Run one pitfall parser the way careless code does: an exception means the row is silently lost."""
    if name not in PITFALL_PARSERS:
        raise KeyError(f"Unknown pitfall {name!r}; choose one of {sorted(PITFALL_PARSERS)}")
    try:
        return PITFALL_PARSERS[name][0](text)
    except (ValueError, IndexError, AttributeError):
        return None


def pitfall_outcomes(name: str, answers: Sequence[str]) -> dict[str, list[int]]:
    """Row indices the pitfall ``lost`` (no answer at all) and got ``wrong`` (differs from ``extract_hash_answer``)."""
    lost, wrong = [], []
    for index, text in enumerate(answers):
        got = apply_pitfall(name, text)
        if got is None:
            lost.append(index)
        elif got != extract_hash_answer(text):
            wrong.append(index)
    return {"lost": lost, "wrong": wrong}


def pitfall_report(dataset: Any) -> list[dict[str, Any]]:
    """For every pitfall parser: rows lost, rows wrong, rows right, and one damaged example.

    ``dataset`` holds raw rows (an ``answer`` column with the full solution). One row per pitfall,
    ready for ``pandas.DataFrame``.
    """
    answers = list(dataset["answer"]) if hasattr(dataset, "column_names") else [row["answer"] for row in dataset]
    report = []
    for name, (_, description) in PITFALL_PARSERS.items():
        outcome = pitfall_outcomes(name, answers)
        damaged = outcome["lost"] + outcome["wrong"]
        example = answers[min(damaged)].split("####")[-1] if damaged else ""
        report.append(
            {
                "pitfall": name,
                "rows": len(answers),
                "lost": len(outcome["lost"]),
                "wrong": len(outcome["wrong"]),
                "right": len(answers) - len(damaged),
                "example": f"#### {example.strip()}" if damaged else "",
                "what": description,
            }
        )
    return report


# --- Chat prompts through the model's template --------------------------------------------------------


def swapped_roles_prompt(question: str, system_prompt: str = SYSTEM_PROMPT) -> list[dict[str, str]]:
    """``build_prompt`` with the roles in the WRONG order (user first), for the notebook's demonstration only."""
    return build_prompt(question, system_prompt)[::-1]


def render_prompt(tokenizer: Any, messages: list[dict[str, str]]) -> str:
    """The exact text the model sees: the chat template applied, with the assistant turn opened."""
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def count_tokens(tokenizer: Any, texts: Sequence[str]) -> list[int]:
    """Token counts of already-rendered texts (no special tokens added: the template wrote them)."""
    if not texts:
        return []
    encoded = tokenizer(list(texts), add_special_tokens=False, return_attention_mask=False)  # ids only: 1/3 faster
    return [len(ids) for ids in encoded["input_ids"]]


def prompt_token_lengths(tokenizer: Any, prompts: Sequence[list[dict[str, str]]]) -> list[int]:
    """Token count of each chat prompt as the model receives it: template applied, assistant turn opened."""
    if not prompts:
        return []
    rendered = tokenizer.apply_chat_template(list(prompts), tokenize=False, add_generation_prompt=True)
    return count_tokens(tokenizer, rendered)


def rows_with_short_prompts(lengths: Sequence[int], max_tokens: int, limit: int | None = None) -> list[int]:
    """Indices, in order, of the rows whose prompt has at most ``max_tokens`` tokens (the first ``limit`` of them).

    A filter, never a truncation: a GSM8K question cut short loses the numbers it needs, and its gold
    answer no longer follows from what the model reads.
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be a positive number of tokens, got {max_tokens}")
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be a positive number of rows or None, got {limit}")
    kept = [index for index, length in enumerate(lengths) if length <= max_tokens]
    return kept[:limit] if limit is not None else kept


def continuation_probability(model: Any, tokenizer: Any, messages: list[dict[str, str]], continuation: str) -> float:
    """Probability that the model's reply to ``messages`` starts with ``continuation`` (one forward pass).

    Cheaper and more telling than sampling: it shows how strongly a prompt steers the model towards,
    say, ``"<reasoning>"`` as its first words, before any training.
    """
    import torch

    if not continuation:
        raise ValueError("continuation must be a non-empty string")
    prompt_ids = tokenizer(render_prompt(tokenizer, messages), add_special_tokens=False)["input_ids"]
    continuation_ids = tokenizer(continuation, add_special_tokens=False)["input_ids"]
    ids = torch.tensor([prompt_ids + continuation_ids], device=model.device)
    with torch.inference_mode():
        log_probs = torch.log_softmax(model(ids).logits[0, :-1].float(), dim=-1)
    targets = ids[0, len(prompt_ids) :]
    picked = log_probs[len(prompt_ids) - 1 :].gather(1, targets.unsqueeze(1))
    return float(picked.sum().exp())


# --- Token lengths ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class TokenLengthStats:
    """Token lengths per row: the rendered prompt, the reference reasoning, and the XML wrapper around it."""

    prompt_lengths: list[int] = field(repr=False)
    reasoning_lengths: list[int] = field(repr=False)
    xml_overhead: int

    def percentile(self, which: str, q: float) -> int:
        """The ``q``-th percentile of ``"prompt"`` or ``"reasoning"`` lengths: at least ``q`` % of rows fit in it.

        ``method="higher"`` (an observed length, never an interpolated one below it) keeps that promise
        on small datasets too: with linear interpolation, the 90th percentile of the 48-row sample fits
        fewer than 90 % of its rows.
        """
        import numpy as np

        values = {"prompt": self.prompt_lengths, "reasoning": self.reasoning_lengths}.get(which)
        if values is None:
            raise ValueError(f"which must be 'prompt' or 'reasoning', got {which!r}")
        if not 0 <= q <= 100:
            raise ValueError(f"q must be a percentile between 0 and 100, got {q}")
        return int(np.percentile(values, q, method="higher"))

    def fraction_truncated(self, completion_length: int) -> float:
        """Share of reference solutions (reasoning plus XML wrapper) longer than ``completion_length`` tokens."""
        needed = [length + self.xml_overhead for length in self.reasoning_lengths]
        return sum(length > completion_length for length in needed) / len(needed)

    def summary(self, qs: Sequence[float] = (50, 90, 95, 99, 100)) -> dict[str, dict[str, int]]:
        """``{"prompt": {"p50": ..., ...}, "reasoning": {...}}``, ready for ``pandas.DataFrame``."""
        return {which: {f"p{q:g}": self.percentile(which, q) for q in qs} for which in ("prompt", "reasoning")}


def _texts_for_lengths(dataset: Any) -> tuple[list[list[dict[str, str]]], list[str], list[str]]:
    """Prompts, reference reasonings and gold answers from raw or formatted rows."""
    rows = dataset.to_list() if hasattr(dataset, "to_list") else list(dataset)
    if not rows:
        raise ValueError("Cannot measure token lengths of an empty dataset.")
    first = rows[0] if isinstance(rows[0], dict) else {}
    if "prompt" in first and "reasoning" in first:
        return [r["prompt"] for r in rows], [r["reasoning"] for r in rows], [r["answer"] for r in rows]
    if "prompt" in first:
        raise ValueError(
            f"Token lengths need raw GSM8K rows (question, answer) or format_gsm8k output (prompt, reasoning); "
            f"got columns {sorted(first)}. A trainer dataset without 'reasoning' has no reference solutions."
        )
    parsed = []
    for index, row in enumerate(rows):
        good, problem = _row_problem(index, row, SYSTEM_PROMPT)
        if problem is not None:
            raise GSM8KFormatError(f"Cannot measure {problem}. Fix the row or drop it with format_gsm8k(lenient=True).")
        parsed.append(good)
    return [r["prompt"] for r in parsed], [r["reasoning"] for r in parsed], [r["answer"] for r in parsed]


def token_length_stats(dataset: Any, tokenizer: Any) -> TokenLengthStats:
    """Token lengths of every prompt (through the chat template) and every reference reasoning.

    ``dataset`` holds raw GSM8K rows or ``format_gsm8k`` output. The XML overhead is the wrapper
    ``<reasoning>...</reasoning><answer>...</answer>`` around the longest gold answer, plus the end
    token: what a completion needs on top of its reasoning to earn the format rewards.
    """
    prompts, reasonings, answers = _texts_for_lengths(dataset)
    prompt_lengths = prompt_token_lengths(tokenizer, prompts)
    reasoning_lengths = count_tokens(tokenizer, reasonings)
    longest_answer = max(answers, key=len)
    overhead = count_tokens(tokenizer, [XML_TEMPLATE.format(reasoning="", answer=longest_answer)])[0] + 1
    return TokenLengthStats(prompt_lengths, reasoning_lengths, overhead)


def reference_length_percentile(dataset: Any, tokenizer: Any, q: float = 90) -> int:
    """The ``q``-th percentile of the reference reasoning lengths in tokens.

    A ``max_completion_length`` below the 90th percentile truncates the model before it can finish
    more than one solution in ten the way the reference does, and a truncated completion has no
    ``<answer>``: zero reward. Preflight checks compare the setting against this number. Raw GSM8K rows
    work too (the reasoning is the part before ``####``).
    """
    return token_length_stats(dataset, tokenizer).percentile("reasoning", q)


def recommended_completion_length(stats: TokenLengthStats, q: float = 90, multiple: int = 16) -> int:
    """``max_completion_length`` that fits the ``q``-th percentile reference reasoning plus the XML wrapper.

    Rounded up to a ``multiple`` of tokens. Reference solutions are terse (and their ``<<...>>`` notes
    are not what a model writes), so treat this as a floor: a model's reasoning is usually longer.
    """
    if multiple < 1:
        raise ValueError(f"multiple must be a positive number of tokens, got {multiple}")
    needed = stats.percentile("reasoning", q) + stats.xml_overhead
    return math.ceil(needed / multiple) * multiple


# --- Measured, not asserted: Dataset vs plain dicts ---------------------------------------------------


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
