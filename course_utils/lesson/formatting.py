"""GSM8K rows as ``GRPOTrainer`` reads them: the gold answer parsed, the chat prompt built, no row lost silently.

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

import re
import warnings
from dataclasses import dataclass
from typing import Any

from datasets import Dataset

from course_utils.core.answer_format import SYSTEM_PROMPT

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


def swapped_roles_prompt(question: str, system_prompt: str = SYSTEM_PROMPT) -> list[dict[str, str]]:
    """``build_prompt`` with the roles in the WRONG order (user first), for the notebook's demonstration only."""
    return build_prompt(question, system_prompt)[::-1]


@dataclass(frozen=True)
class BadRow:
    """A row that cannot be parsed: where it is (``index`` counts from 0, as ``dataset[index]`` does) and why."""

    index: int
    reason: str
    excerpt: str

    def __str__(self) -> str:
        return self.described()

    def described(self, source: str = "") -> str:
        """The row as a person counts it (row 1 is the first), ``source`` after it (``data_source``), and why."""
        return f"row {self.index + 1} (index {self.index}){source}: {self.reason} ({self.excerpt!r})"


def data_source(dataset: Any) -> str:
    """`` of <file or source>`` when the rows say where they came from (``load_gsm8k`` notes it), else "".

    A bad row's number alone does not say which file to open.
    """
    source = getattr(getattr(dataset, "info", None), "description", None)
    return f" of {source}" if isinstance(source, str) and source.strip() else ""


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


def parse_row(index: int, row: Any, system_prompt: str) -> tuple[dict[str, Any] | None, BadRow | None]:
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
    return [bad for index, row in enumerate(dataset) if (bad := parse_row(index, row, SYSTEM_PROMPT)[1])]


def format_gsm8k(dataset: Any, *, lenient: bool = False, system_prompt: str = SYSTEM_PROMPT) -> Any:
    """Raw GSM8K rows -> a ``Dataset`` with ``prompt`` (chat messages), ``answer`` (gold), ``question``, ``reasoning``.

    ``dataset`` is a ``datasets.Dataset`` or a list of dicts with ``question`` and ``answer``. By
    default a bad row raises ``ValueError`` naming its index and an excerpt. ``lenient=True`` skips
    bad rows instead and warns with how many and which, so nothing disappears unnoticed.
    """
    parsed, bad = [], []
    source = data_source(dataset)
    for index, row in enumerate(dataset):
        good, problem = parse_row(index, row, system_prompt)
        if good is not None:
            parsed.append(good)
            continue
        if not lenient:
            raise GSM8KFormatError(f"Cannot format {problem.described(source)}. Fix the row, or pass lenient=True "
                                   "to skip bad rows.")  # fmt: skip
        bad.append(problem)
    if bad:
        listed = "; ".join(str(b) for b in bad[:10]) + (" ..." if len(bad) > 10 else "")
        warnings.warn(f"format_gsm8k skipped {len(bad)} of {len(bad) + len(parsed)} rows{source}: {listed}",
                      stacklevel=2)  # fmt: skip
    if not parsed:
        raise ValueError(f"No usable rows{source}: the dataset is empty or every row is malformed.")
    return Dataset.from_list(parsed)
