"""08.2: the learner's ``calculator(expression)`` next to ``lesson.tool_use.calculator`` on arithmetic and a bank of
hostile inputs, each run in a child process (``isolated_calls``)."""

from __future__ import annotations

from collections.abc import Callable
from fractions import Fraction
from typing import Any

from transformers.utils import get_json_schema

from course_utils.exercises.comparison import Case, check_against_reference, not_a_function
from course_utils.exercises.nb08_tool_use.isolated_calls import fork_available, isolated_outcomes, replayed
from course_utils.exercises.verdicts import hand_back, list_problems
from course_utils.lesson.tool_use import (
    MAX_EXPONENT,
    MAX_EXPRESSION_CHARS,
    calculator,
)

CALCULATOR = "08.2 calculator"

CALCULATOR_HINT = (
    "parse with ast.parse(expression, mode='eval') after checking the type and the length; walk the tree: a "
    "Constant that is an int or a float (not a bool), UnaryOp with USub/UAdd, BinOp with Add/Sub/Mult/Div/Pow; "
    "anything else raises CalculatorError; compute with Fraction, each number read from the text you parsed "
    "(ast.get_source_segment: the float has rounded a long decimal), check every value against MAX_MAGNITUDE and a "
    "power's size before computing it"
)



CALCULATOR_CASES: tuple[tuple[str, Any], ...] = (
    ("a GSM8K note", "48/2"),
    ("a sum with spaces", "48 + 24"),
    ("parentheses and a decimal", "(3 + 4) * 2.5"),
    ("exact decimals", "0.1 + 0.2"),
    ("a repeating decimal", "10/3"),
    ("a power", "2**10"),
    ("a negative power", "2**-2"),
    ("a negative result", "5 - 8"),
    ("a unary minus twice", "--3"),
    ("unary signs stacked", "+-+3"),
    ("a number in scientific notation", "1e3/4"),
    ("an expression with spaces around", "  6 * 7  "),
    ("a name", "x + 1"),
    ("a call to a builtin", "abs(-3)"),
    ("__import__", "__import__('os').getpid()"),
    ("opening a file", "open('/etc/passwd').read()"),
    ("attribute access", "(1).__class__"),
    ("a dunder chain", "().__class__.__bases__[0].__subclasses__()"),
    ("a lambda", "(lambda: 1)()"),
    ("a list comprehension", "[x for x in range(3)]"),
    ("a string", "'1' + '2'"),
    ("a string repeated", "'a' * 3"),
    ("True as a number", "True + 1"),
    ("a complex number", "1j * 2"),
    ("a comparison", "1 < 2"),
    ("a conditional expression", "1 if 2 else 3"),
    ("modulo", "7 % 3"),
    ("floor division", "7 // 2"),
    ("bitwise not", "~5"),
    ("logical not", "not 1"),
    ("a thousands comma", "1,000 + 1"),
    ("a huge power tower", "9**9**9"),
    ("powers of powers, each exponent allowed", "((((9**64)**64)**64)**64)**64"),
    ("an intermediate result too large", "10**15 * 10**15 / 10**15"),
    ("a power of ten too large", "10**100"),
    ("an exponent beyond the limit", f"0.5**{MAX_EXPONENT + 1}"),
    ("a power too large", "2**200"),
    ("a fractional exponent", "4**0.5"),
    ("an infinite number", "1e999"),
    ("a number too large", "1e308 * 10"),
    ("division by zero", "1/0"),
    ("division by a zero sum", "1/(2-2)"),
    ("zero to a negative power", "0**-1"),
    ("unfinished arithmetic", "1 +"),
    ("empty input", ""),
    ("over-long input of additions", "1" + "+1" * MAX_EXPRESSION_CHARS),
    ("over-long nesting", "(" * (MAX_EXPRESSION_CHARS + 10) + "1" + ")" * (MAX_EXPRESSION_CHARS + 10)),
    ("a number, not text", 12),
    ("None, not text", None),
    # a float keeps about 16 digits: Fraction(str(100000000000000.01)) is ...0.02, the digits written say ...0.01
    ("a long decimal, which a float rounds", "100000000000000.01 - 100000000000000"),
)

def same_result(expected: Any, got: Any) -> bool:
    """The same number as text: within 1e-6, and a whole result written without decimals ("24", not "24.0")."""
    if not isinstance(got, str):
        return False
    try:
        value = Fraction(got.strip())
    except (ValueError, ZeroDivisionError):
        return False
    if "." not in expected and got.strip() != expected:
        return False
    return abs(float(value) - float(Fraction(expected))) <= 1e-6 * max(1.0, abs(float(Fraction(expected))))


def calculator_needs(expected: Any, got: Any) -> str | None:
    """The model reads the tool's answer as text: TRL puts the return value in the tool message."""
    return None if isinstance(got, str) else f"returns a {type(got).__name__}: return the result as text (a str)"


def schema_problem(learner: Callable[..., Any]) -> str | None:
    """TRL describes a tool to the model from its signature and docstring (``get_json_schema``): it must read."""
    try:
        schema = get_json_schema(learner)
    except Exception as exc:  # transformers' own message says what the docstring or the hints lack
        return f"TRL cannot describe it to the model: {type(exc).__name__}: {exc}"
    parameters = schema.get("function", {}).get("parameters", {}).get("properties", {})
    if list(parameters) != ["expression"] or parameters["expression"].get("type") != "string":
        return f"its parameters read as {parameters}: the model calls calculator(expression: str)"
    return None



# Cases whose naive evaluation can run for minutes: left out where no child process can be forked (Windows)
MAY_HANG = {"a huge power tower", "a power of ten too large", "over-long input of additions",
            "powers of powers, each exponent allowed"}


def calculator_outcomes(learner: Callable[..., Any], cases: list[Case]) -> Callable[..., Any]:
    """The learner's calculator as the comparison calls it: outcomes computed safely beforehand, then replayed."""
    inputs = [case.args for case in cases]
    return replayed(learner, dict(zip(inputs, isolated_outcomes(learner, inputs), strict=True)))


def check_08_calculator(learner: Any) -> Any:
    """08.2: the learner's ``calculator(expression)``; hands back theirs or ``tool_use.calculator``.

    It must give the reference's numbers on arithmetic and refuse, by raising an error, everything the reference
    refuses; the model reads that error as the tool's answer. Any error is a refusal (TRL catches every one and
    hands its message to the model); running out of time or memory is not.
    """
    if not_a_function(CALCULATOR, learner, CALCULATOR_HINT):
        return hand_back(CALCULATOR, False, learner, calculator, "tool_use.calculator")
    if problem := schema_problem(learner):
        list_problems(CALCULATOR, "not yet", [problem], CALCULATOR_HINT)
        return hand_back(CALCULATOR, False, learner, calculator, "tool_use.calculator")
    cases = [Case(label, (expression,)) for label, expression in CALCULATOR_CASES]
    if not fork_available():
        print(f"   {CALCULATOR}: no child process here to stop a runaway case in; left out: {sorted(MAY_HANG)}")
        cases = [case for case in cases if case.label not in MAY_HANG]
        run = learner
    else:
        try:
            run = calculator_outcomes(learner, cases)
        except Exception as exc:  # the child process could not be started: said, and the check runs in-process
            print(f"   {CALCULATOR}: could not start a child process ({exc}); the cases that may hang are left out")
            cases = [case for case in cases if case.label not in MAY_HANG]
            run = learner
    passed = check_against_reference(CALCULATOR, run, calculator, cases, hint=CALCULATOR_HINT, same=same_result,
                                     needs=calculator_needs, errors="any")
    return hand_back(CALCULATOR, passed, learner, calculator, "tool_use.calculator")
