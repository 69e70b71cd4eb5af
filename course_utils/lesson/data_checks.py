"""Checks on GSM8K's gold answers: every calculator note recomputed, and the rows careless parsers lose or misread.

``check_calculator_notes`` verifies the bundled sample (whose problems we wrote by hand), so that a typo in our
own data cannot teach a wrong answer. ``PITFALL_PARSERS`` keeps deliberately wrong one-line parsers from
tutorials, and ``pitfall_report`` counts, on real rows, what each of them loses or gets wrong next to
``formatting.extract_hash_answer``.
"""

from __future__ import annotations

import ast
import math
import operator
import re
from collections.abc import Callable, Sequence
from typing import Any

from course_utils.lesson.formatting import extract_hash_answer, normalize_number

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


def solution_steps(reasoning: str) -> int:
    """The number of steps of a worked GSM8K solution: its non-empty lines before ``####``.

    GSM8K's annotators wrote one calculation per line, so the line count is a handle on a problem's
    difficulty: a small model that solves two-step problems sometimes rarely solves six-step ones.
    """
    if not isinstance(reasoning, str):
        raise TypeError(f"reasoning must be the worked solution as text, got {type(reasoning).__name__}")
    return sum(1 for line in reasoning.split("####", 1)[0].splitlines() if line.strip())


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
