"""A calculator the model can call while it trains (``GRPOTrainer(tools=[calculator])``), and GSM8K's notes as calls.

GSM8K's reference solutions mark every calculation: ``Natalia sold 48/2 = <<48/2=24>>24 clips``. Each
``<<expression=result>>`` note is a calculator call the annotator made. ``tool_call_trace`` turns a solution into the
conversation a tool-using model would have: an assistant turn that stops where the note starts and calls
``calculator``, the tool's answer, and the assistant going on from there. A warm start on such traces teaches a small
model the call format before GRPO rewards using it.

``calculator`` evaluates arithmetic safely: an AST walk over numbers and ``+ - * / **`` with parentheses, exact
(fractions, so ``0.1 + 0.2`` is ``0.3``), never ``eval``. Anything else, exponents that would make huge numbers and
over-long input raise ``CalculatorError``; TRL returns its message to the model as the tool's answer and counts it
in ``tools/failure_frequency``.

``tool_use_reward`` pays for calls that help: only when the final answer is right, and only for the share of calls
whose result the completion goes on to use. ``trace_coverage`` says how many notes of a set of rows become calls.
"""

from __future__ import annotations

import ast
import math
import operator
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from fractions import Fraction
from typing import Any

from course_utils.core.answer_format import extract_xml_answer, format_answer
from course_utils.lesson.data_checks import calculator_notes
from course_utils.lesson.rewards import answers_match, completion_text

TOOL_NAME = "calculator"
# The columns TRL logs for a trainer with tools=: calls per completion, and the share of calls that raised
TOOL_LOG_COLUMNS = ("tools/call_frequency", "tools/failure_frequency")
MAX_EXPRESSION_CHARS = 120  # GSM8K's longest note is far shorter; a long input is a model babbling, not arithmetic
MAX_MAGNITUDE = 10**15  # no GSM8K quantity comes near; a bigger intermediate means a runaway expression
MAX_EXPONENT = 64
RESULT_DECIMALS = 6
_BINARY: dict[type, Callable[[Fraction, Fraction], Fraction]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
}
_UNARY: dict[type, Callable[[Fraction], Fraction]] = {ast.USub: operator.neg, ast.UAdd: operator.pos}


class CalculatorError(ValueError):
    """An expression the calculator refuses; the message is what the model reads back."""


def calculator(expression: str) -> str:
    """Compute an arithmetic expression exactly: numbers, + - * / ** and parentheses.

    Args:
        expression: The arithmetic to compute, for example "48/2" or "(3 + 4) * 2.5".

    Returns:
        The result as a number, for example "24" or "17.5".
    """
    if not isinstance(expression, str):
        raise CalculatorError(f"expression must be text such as '48/2', got {type(expression).__name__}")
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise CalculatorError(f"expression too long ({len(expression)} characters, at most {MAX_EXPRESSION_CHARS})")
    source = expression.strip()
    try:
        tree = ast.parse(source, mode="eval")
    except SyntaxError as exc:
        raise CalculatorError(f"not arithmetic: {expression!r} ({exc.msg})") from None
    return format_result(_value(tree.body, source))


def format_result(value: Fraction) -> str:
    """A whole number without decimals ("24"), else at most ``RESULT_DECIMALS`` decimals without trailing zeros."""
    if value.denominator == 1:
        return str(value.numerator)
    rounded = round(value, RESULT_DECIMALS)  # exact: a float would cut a long number's decimals
    whole, part = divmod(abs(rounded.numerator) * 10**RESULT_DECIMALS // rounded.denominator, 10**RESULT_DECIMALS)
    text = f"{'-' * (rounded < 0)}{whole}.{part:0{RESULT_DECIMALS}d}".rstrip("0").rstrip(".")
    return "0" if text == "-0" else text


def _checked(value: Fraction) -> Fraction:
    if abs(value) > MAX_MAGNITUDE:
        raise CalculatorError(f"result too large (more than {MAX_MAGNITUDE:.0e})")
    return value


def _value(node: ast.AST, source: str) -> Fraction:
    """The exact value of one node of the parsed ``source``, or ``CalculatorError`` naming what is not allowed.

    A number is read from its text in ``source`` (``Fraction("0.01")``), not from the float Python parsed it to,
    which has already rounded a long decimal (``100000000000000.01`` is ``...0.015625`` as a float).
    """
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        if isinstance(node.value, float) and not math.isfinite(node.value):
            raise CalculatorError("numbers must be finite")
        return _checked(_number(ast.get_source_segment(source, node) or str(node.value)))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_value(node.operand, source))
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
        return _power(_value(node.left, source), _value(node.right, source))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _value(node.left, source), _value(node.right, source)
        if isinstance(node.op, ast.Div) and right == 0:
            raise CalculatorError("division by zero")
        return _checked(_BINARY[type(node.op)](left, right))
    if isinstance(node, ast.Tuple):
        raise CalculatorError("write numbers without thousands commas: 1000, not 1,000")
    raise CalculatorError(f"only numbers, + - * / ** and parentheses are allowed, not {type(node).__name__}")


def _number(text: str) -> Fraction:
    """A number's exact value from its text; hex, octal and binary literals are refused: GSM8K writes decimals."""
    try:
        return Fraction(text.replace("_", ""))
    except ValueError:
        raise CalculatorError(f"write numbers in decimal digits, such as 16 or 2.5, not {text!r}") from None


def _power(base: Fraction, exponent: Fraction) -> Fraction:
    """``base ** exponent`` for a whole exponent whose result stays within ``MAX_MAGNITUDE``."""
    if exponent.denominator != 1:
        raise CalculatorError("exponents must be whole numbers")
    if abs(exponent) > MAX_EXPONENT:
        raise CalculatorError(f"exponent too large (at most {MAX_EXPONENT})")
    if base == 0 and exponent < 0:
        raise CalculatorError("division by zero")
    if abs(base) > 1 and abs(exponent) * math.log10(abs(base)) > math.log10(MAX_MAGNITUDE):
        raise CalculatorError(f"result too large (more than {MAX_MAGNITUDE:.0e})")
    return _checked(base ** int(exponent))


# --- GSM8K's notes as tool calls ---------------------------------------------------------------------


@dataclass
class ToolTrace:
    """A solution as a tool-using conversation: the messages, the calls made, and the notes left as text."""

    messages: list[dict[str, Any]] = field(default_factory=list)
    calls: int = 0
    unparsed: list[str] = field(default_factory=list)  # notes kept as plain text, each with why


def note_result(expression: str, stated: str) -> str:
    """The calculator's answer to a note's expression, checked against the note's stated result.

    Raises ``CalculatorError`` when the calculator refuses the expression or gives another value than the note
    states: such a note cannot become a call whose answer continues the annotator's text.
    """
    result = calculator(expression)
    try:
        matches = Fraction(result) == Fraction(stated.replace(",", "").strip())
    except (ValueError, ZeroDivisionError):
        raise CalculatorError(f"the note's result {stated!r} is not a number") from None
    if not matches:
        raise CalculatorError(f"the calculator gives {result}, the note says {stated}")
    return result


def _call(expression: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": TOOL_NAME, "arguments": {"expression": expression}}}


def tool_call_trace(solution: str, answer: str) -> ToolTrace:
    """The assistant and tool turns of a GSM8K ``solution`` (its text before ``####``), ending in the XML answer.

    The first assistant turn opens ``<reasoning>``; each note that the calculator reproduces ends an assistant
    turn with a call, followed by the tool's answer; the last turn closes the reasoning and gives ``answer``. A
    note that does not parse stays in the text as ``expression = result`` and is named in ``unparsed``.
    """
    if not isinstance(solution, str) or not isinstance(answer, str):
        raise TypeError("solution and answer must be text (a GSM8K solution before '####', and its final answer)")
    trace, text, rest = ToolTrace(), "<reasoning>\n", solution.split("####", 1)[0].strip()
    for expression, stated in calculator_notes(rest):
        note = f"<<{expression}={stated}>>"
        before, rest = rest.split(note, 1)
        try:
            result = note_result(expression, stated)
        except CalculatorError as exc:
            trace.unparsed.append(f"{note}: {exc}")
            text += f"{before}{expression}={stated}"
            continue
        trace.messages += [
            {"role": "assistant", "content": text + before, "tool_calls": [_call(expression)]},
            {"role": "tool", "name": TOOL_NAME, "content": result},
        ]
        trace.calls += 1
        text = ""
    reasoning_end = format_answer("", answer).split("</reasoning>", 1)[1]  # the layout after the reasoning
    trace.messages.append({"role": "assistant", "content": f"{text}{rest}\n</reasoning>{reasoning_end}"})
    return trace


# --- How many notes become calls -----------------------------------------------------------------------


@dataclass
class TraceCoverage:
    """What ``tool_call_trace`` made of a set of rows: the calls, and every note left as text with its row."""

    rows: int
    calls: int
    unparsed: list[tuple[int, str]]  # (row index, "<<note>>: why")

    @property
    def notes(self) -> int:
        """Every ``<<expression=result>>`` note read: the calls plus the notes left as text."""
        return self.calls + len(self.unparsed)

    @property
    def parsed_share(self) -> float:
        """The share of notes that became calls (1.0 for rows without notes)."""
        return self.calls / self.notes if self.notes else 1.0

    def __str__(self) -> str:
        lines = [f"{self.rows:,} rows: {self.notes:,} notes, {self.calls:,} became calculator calls "
                 f"({self.parsed_share:.2%}), {len(self.unparsed)} stayed as text"]  # fmt: skip
        lines += [f"  row {row + 1} (index {row}): {note}" for row, note in self.unparsed]
        return "\n".join(lines)


def _solution_and_answer(row: Any, index: int) -> tuple[str, str]:
    """A row's worked solution and final answer: formatted rows (``reasoning``, ``answer``) or raw GSM8K rows
    (``answer`` holding the solution, ``####`` and the number)."""
    if not isinstance(row, Mapping):
        raise TypeError(f"row {index + 1} is a {type(row).__name__}, not a GSM8K row (a mapping with 'answer')")
    reasoning, answer = row.get("reasoning"), row.get("answer")
    if isinstance(reasoning, str) and isinstance(answer, str):
        return reasoning, answer.strip()
    if isinstance(answer, str) and "####" in answer:
        solution, final = answer.split("####", 1)
        return solution, final.strip().replace(",", "")
    raise ValueError(
        f"row {index + 1} has neither 'reasoning' and 'answer' (load_gsm8k(..., formatted=True)) nor a raw 'answer' "
        "with '####' (load_gsm8k(...)): pass GSM8K rows"
    )


def trace_coverage(rows: Iterable[Any]) -> TraceCoverage:
    """Every row's solution turned into a tool trace: how many notes became calls, and which did not, and why."""
    if isinstance(rows, (str, bytes, Mapping)) or not isinstance(rows, Iterable):
        raise TypeError(f"rows must be a sequence of GSM8K rows (a dataset or a list), got {type(rows).__name__}")
    calls, unparsed, count = 0, [], 0
    for index, row in enumerate(rows):
        trace = tool_call_trace(*_solution_and_answer(row, index))
        calls, count = calls + trace.calls, count + 1
        unparsed += [(index, note) for note in trace.unparsed]
    if not count:
        raise ValueError("rows is empty: pass at least one GSM8K row")
    return TraceCoverage(count, calls, unparsed)


# --- A reward for using the tool -----------------------------------------------------------------------

TOOL_USE_REWARD = 0.5  # a quarter of the correctness reward: a bonus for a right answer, never a goal of its own
# A number as written: a minus right after a digit or ")" is a subtraction ("72-24" holds 24, not -24), and commas
# count only as thousands separators ("1,200" is 1200; "1,2" is 1 and 2)
_NUMBER = re.compile(r"(?<![\d)])-?(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?")


def _numbers(text: str) -> set[Decimal]:
    found = set()
    for match in _NUMBER.findall(text):
        try:
            found.add(Decimal(match.replace(",", "")))
        except InvalidOperation:
            continue
    return found


def _result_value(content: Any) -> Decimal | None:
    """A tool message's result as a number; None for an error (TRL's ``{'error': ...}``) or anything else."""
    try:
        return Decimal(str(content).strip())
    except InvalidOperation:
        return None


def tool_calls_used(completion: Any) -> tuple[int, int]:
    """(calls made, calls whose result the completion uses): a result is used when a later assistant turn writes
    it as a number. A refused call (an error message) is never used. A plain-text completion made no calls."""
    if not isinstance(completion, (list, tuple)):
        return 0, 0
    messages = [m for m in completion if isinstance(m, Mapping)]
    calls = sum(len(m.get("tool_calls") or []) for m in messages if m.get("role") == "assistant")
    used = 0
    for position, message in enumerate(messages):
        value = _result_value(message.get("content")) if message.get("role") == "tool" else None
        later = "".join(completion_text(m) for m in messages[position + 1 :] if m.get("role") == "assistant")
        used += value is not None and value in _numbers(later)
    return calls, min(used, calls)


def tool_use_reward(completions: Any, answer: Any = None, **kwargs: Any) -> list[float]:
    """``TOOL_USE_REWARD`` x the share of calls whose result is used, for a completion whose answer is right; else 0.

    Why this shape: calling the tool for nothing earns nothing. A wrong answer earns no bonus however many calls it
    made; a call whose result never reappears in the text (or that was refused) dilutes the share, so padding a
    right answer with idle calls lowers its reward; a right answer without calls earns the correctness reward only.
    TRL's signature: ``completions`` as TRL passes them with ``tools=`` (lists of messages), ``answer`` the dataset's
    gold answers, one per completion.
    """
    if completions is None or isinstance(completions, (str, bytes, Mapping)):
        raise TypeError(f"completions must be a list (one entry per completion), got {type(completions).__name__}")
    if answer is None or isinstance(answer, (str, bytes)) or len(answer) != len(completions):
        raise ValueError(
            "tool_use_reward needs one gold answer per completion: answer=[...] (TRL passes the 'answer' column)"
        )
    rewards = []
    for completion, gold in zip(completions, answer, strict=True):
        calls, used = tool_calls_used(completion)
        right = answers_match(extract_xml_answer(completion_text(completion)), gold)
        rewards.append(TOOL_USE_REWARD * used / calls if right and calls else 0.0)
    return rewards
