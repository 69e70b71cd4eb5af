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
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from course_utils.core.answer_format import format_answer
from course_utils.lesson.data_checks import calculator_notes

TOOL_NAME = "calculator"
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
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as exc:
        raise CalculatorError(f"not arithmetic: {expression!r} ({exc.msg})") from None
    return format_result(_value(tree.body))


def format_result(value: Fraction) -> str:
    """A whole number without decimals ("24"), else at most ``RESULT_DECIMALS`` decimals without trailing zeros."""
    if value.denominator == 1:
        return str(value.numerator)
    text = f"{float(value):.{RESULT_DECIMALS}f}".rstrip("0").rstrip(".")
    return "0" if text == "-0" else text


def _checked(value: Fraction) -> Fraction:
    if abs(value) > MAX_MAGNITUDE:
        raise CalculatorError(f"result too large (more than {MAX_MAGNITUDE:.0e})")
    return value


def _value(node: ast.AST) -> Fraction:
    """The exact value of one node of the parsed expression, or ``CalculatorError`` naming what is not allowed."""
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        if isinstance(node.value, float) and not math.isfinite(node.value):
            raise CalculatorError("numbers must be finite")
        return _checked(Fraction(str(node.value)))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_value(node.operand))
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
        return _power(_value(node.left), _value(node.right))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _value(node.left), _value(node.right)
        if isinstance(node.op, ast.Div) and right == 0:
            raise CalculatorError("division by zero")
        return _checked(_BINARY[type(node.op)](left, right))
    if isinstance(node, ast.Tuple):
        raise CalculatorError("write numbers without thousands commas: 1000, not 1,000")
    raise CalculatorError(f"only numbers, + - * / ** and parentheses are allowed, not {type(node).__name__}")


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
