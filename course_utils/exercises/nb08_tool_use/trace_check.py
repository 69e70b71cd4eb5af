"""08.1: the learner's ``tool_call_trace`` (GSM8K's ``<<expression=result>>`` notes as calculator calls),
run next to ``lesson.tool_use.tool_call_trace`` on real rows, the rows whose notes do not parse, and edge cases."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Sequence
from typing import Any

from course_utils.exercises.comparison import Case, check_against_reference, not_a_function
from course_utils.exercises.real_rows import dataset_rows, real_row_indices
from course_utils.exercises.verdicts import hand_back
from course_utils.lesson.data_checks import calculator_notes
from course_utils.lesson.formatting import extract_hash_answer
from course_utils.lesson.tool_use import (
    tool_call_trace,
)

TRACE = "08.1 tool_call_trace"

TRACE_HINT = (
    "walk calculator_notes(text) in order; split the text at each note (str.split(note, 1)); note_result gives "
    "the tool's answer or raises CalculatorError, and a refused note stays in the text as expression=result; the "
    "last assistant turn closes the reasoning and gives the answer"
)



class TraceView(dict):
    """A ``ToolTrace`` as the check compares it: messages, calls, and the notes left as text (without the why)."""


def trace_view(trace: Any) -> Any:
    """What a ``ToolTrace`` is compared by; anything else unchanged, so the check can say what it is instead.

    The reason given for a note left as text is the learner's own wording; the note itself must be the same.
    """
    if not all(hasattr(trace, name) for name in ("messages", "calls", "unparsed")):
        return trace
    unparsed = [str(item).split(": ", 1)[0] for item in trace.unparsed]
    return TraceView(messages=trace.messages, calls=trace.calls, unparsed_notes=unparsed)


def _viewed(function: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(function)  # the learner's name and module: the comparison reports it as theirs
    def call(*args: Any) -> Any:
        return trace_view(function(*args))

    return call


def trace_needs(expected: Any, got: Any) -> str | None:
    """The next cells read ``trace.messages``, ``trace.calls`` and ``trace.unparsed``: a ``ToolTrace``."""
    if isinstance(got, TraceView):
        return None
    return f"returns a {type(got).__name__}: return a ToolTrace(messages=..., calls=..., unparsed=...)"


TRACE_EDGES: tuple[tuple[str, Any, Any], ...] = (
    ("no note at all", "She has 3 apples and eats none.\n#### 3", "3"),
    ("a note at the very start", "<<2*3=6>>6 cats sleep.\n#### 6", "6"),
    ("the same note twice", "First 2+2 = <<2+2=4>>4 pens, again 2+2 = <<2+2=4>>4 cups.\n#### 4", "4"),
    ("a note whose stated result is wrong", "Half of 48 is 48/2 = <<48/2=25>>25.\n#### 25", "25"),
    ("a floor division the calculator refuses", "He packs 560//10 = <<560//10=56>>56 boxes.\n#### 56", "56"),
    ("a result with a thousands comma", "He earns 1000*2 = <<1000*2=2,000>>2,000 dollars.\n#### 2000", "2000"),
    ("a stated result that is no number", "She sold 48/2 = <<48/2=half>>half of them.\n#### 24", "24"),
    ("a name inside the note", "Twice x is <<x*2=4>>4.\n#### 4", "4"),
    ("a refused note, then a good one", "<<7//2=3>>3 and 3+4 = <<3+4=7>>7 more.\n#### 7", "7"),
    ("text after the final answer", "2+3 = <<2+3=5>>5.\n#### 5\nThat is all.", "5"),
    ("an empty solution", "", "0"),
    ("a solution that is not text", None, "3"),
    ("an answer that is not text", "2+3 = <<2+3=5>>5.\n#### 5", 5),
)
_ODD_NOTE = re.compile(r"[^\d\s.+\-*/()]|//")


def refused_note_rows(dataset: Any) -> list[int]:
    """Rows with a note whose expression holds more than digits, spaces, ``+ - * / ( )`` or a ``//``: candidates."""
    answers = list(dataset["answer"]) if not isinstance(dataset, Sequence) else [r["answer"] for r in dataset]
    return [i for i, text in enumerate(answers) if any(_ODD_NOTE.search(e) for e, _ in calculator_notes(text))]


def trace_cases(dataset: Any, count: int = 24) -> list[Case]:
    """Edge cases first (their labels name the mistake), then real rows, those with refused notes among them."""
    cases = [Case(label, (solution, answer)) for label, solution, answer in TRACE_EDGES]
    indices = sorted(set(real_row_indices(dataset, count)) | set(refused_note_rows(dataset)[:6]))
    for index, row in zip(indices, dataset_rows(dataset, indices), strict=True):
        notes = len(calculator_notes(row["answer"]))
        cases.append(Case(f"train row {index} ({notes} notes)", (row["answer"], extract_hash_answer(row["answer"]))))
    return cases


def check_08_trace(learner: Any, dataset: Any) -> Any:
    """08.1: the learner's ``tool_call_trace(solution, answer)``; hands back theirs or ``tool_use.tool_call_trace``."""
    passed = not not_a_function(TRACE, learner, TRACE_HINT) and check_against_reference(
        TRACE, _viewed(learner), _viewed(tool_call_trace), trace_cases(dataset), hint=TRACE_HINT, needs=trace_needs
    )
    return hand_back(TRACE, passed, learner, tool_call_trace, "tool_use.tool_call_trace")
