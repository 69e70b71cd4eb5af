"""Notebook 08 (tool use): the checks of the converter, the calculator and the tool-use reward the learner writes.

The exercises, in the notebook's order: 08.1 ``tool_call_trace`` (a GSM8K solution's ``<<expression=result>>``
notes as calculator calls, run next to ``lesson.tool_use.tool_call_trace`` on real rows, the rows whose notes do
not parse, and edge cases), 08.2 ``calculator`` (next to ``lesson.tool_use.calculator`` on arithmetic and a bank
of hostile inputs, each run in a child process that is stopped after a few seconds, so that ``9**9**9`` computed
in full cannot hang the notebook), 08.3 a tool-use reward of the learner's design, judged on what it must not pay
for (calls whose results are not used, calls when the answer is wrong, failed calls, repeated calls) and on
paying for real use. Each check hands back what the notebook continues with: the learner's version when it
passed, else the package's.
"""

from __future__ import annotations

import builtins
import functools
import math
import multiprocessing
import numbers
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from transformers.utils import get_json_schema
from trl import GRPOTrainer

from course_utils.core.profiles import Profile
from course_utils.exercises.comparison import Case, check_against_reference, not_a_function
from course_utils.exercises.nb03_reward_functions.trl_calls import awaited, synchronous, trl_reward_kwargs
from course_utils.exercises.nb04_train_grpo.grpo_trainer_check import (
    adapter_problems,
    dataset_problems,
    release_model,
    strip_adapters,
)
from course_utils.exercises.nb04_train_grpo.judging import TRL_TRAINER, judge, problems_of
from course_utils.exercises.real_rows import dataset_rows, real_row_indices, short_repr
from course_utils.exercises.verdicts import hand_back, list_problems, report, report_name
from course_utils.lesson.data_checks import calculator_notes
from course_utils.lesson.formatting import extract_hash_answer
from course_utils.lesson.tool_use import (
    MAX_EXPONENT,
    MAX_EXPRESSION_CHARS,
    TOOL_NAME,
    calculator,
    tool_call_trace,
    tool_use_reward,
)

TRACE = "08.1 tool_call_trace"
CALCULATOR = "08.2 calculator"
TOOL_REWARD = "08.3 tool-use reward"

TRACE_HINT = (
    "walk calculator_notes(text) in order; split the text at each note (str.split(note, 1)); note_result gives "
    "the tool's answer or raises CalculatorError, and a refused note stays in the text as expression=result; the "
    "last assistant turn closes the reasoning and gives the answer"
)
CALCULATOR_HINT = (
    "parse with ast.parse(expression, mode='eval') after checking the type and the length; walk the tree: a "
    "Constant that is an int or a float (not a bool), UnaryOp with USub/UAdd, BinOp with Add/Sub/Mult/Div/Pow; "
    "anything else raises CalculatorError; compute with Fraction, check every value against MAX_MAGNITUDE and a "
    "power's size before computing it"
)
TOOL_REWARD_HINT = (
    "read the final answer from the last assistant message; pay nothing unless it matches the gold answer; then "
    "pay one fixed bonus when some tool result (a tool message's content that is text, not an error) appears in "
    "an assistant message after it"
)


# --- 08.1 GSM8K's notes as tool calls ----------------------------------------------------------------------


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


# --- 08.2 the calculator, on hostile input --------------------------------------------------------------------


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
)
SECONDS_PER_CASE = 3.0  # the reference answers each case in well under a millisecond


@dataclass(frozen=True)
class Outcome:
    """What one call did in the child process: a value, or the built-in kind and message of what it raised."""

    value: Any = None
    error_kind: str = ""
    message: str = ""


def _builtin_kind(exc: BaseException) -> str:
    return next(cls.__name__ for cls in type(exc).__mro__ if cls.__module__ == "builtins")


def _run_cases(function: Callable[..., Any], inputs: list[tuple[Any, ...]], connection: Any) -> None:
    """In the child process: each input's outcome sent back as soon as it is known."""
    for key, args in enumerate(inputs):
        try:
            outcome = Outcome(value=function(*args))
        except BaseException as exc:  # every outcome is sent back and compared, none is raised here
            outcome = Outcome(error_kind=_builtin_kind(exc), message=" ".join(str(exc).split())[:200])
        try:
            connection.send((key, outcome))
        except Exception:  # a value that cannot be sent back is described instead
            connection.send((key, Outcome(value=f"<unsendable {type(outcome.value).__name__}>")))
    connection.close()


def isolated_outcomes(function: Callable[..., Any], inputs: list[tuple[Any, ...]],
                      seconds: float = SECONDS_PER_CASE) -> list[Outcome]:
    """Each input's outcome, computed in a forked child process that is stopped when one input takes ``seconds``.

    Why: a calculator built on ``eval`` or an unbounded ``**`` computes ``9**9**9`` for minutes in one C call that
    no signal interrupts; a child process can be stopped. The input that ran out of time reads as a
    ``TimeoutError``, and the remaining inputs run in a new child.
    """
    context = multiprocessing.get_context("fork")
    outcomes: list[Outcome] = []
    while len(outcomes) < len(inputs):
        remaining = inputs[len(outcomes) :]
        receiver, sender = context.Pipe(duplex=False)
        child = context.Process(target=_run_cases, args=(function, remaining, sender), daemon=True)
        child.start()
        sender.close()
        while len(outcomes) < len(inputs):
            if not receiver.poll(seconds):
                outcomes.append(Outcome(error_kind="TimeoutError", message=f"did not finish within {seconds:g} s"))
                break
            try:
                outcomes.append(receiver.recv()[1])
            except EOFError:  # the child died (out of memory, say) on this input
                outcomes.append(Outcome(error_kind="MemoryError", message="the process running it died"))
                break
        child.kill()
        child.join()
        receiver.close()
    return outcomes


def replayed_error(outcome: Outcome) -> Exception:
    """The error a recorded outcome raised, as its built-in kind (``CalculatorError`` comes back a ``ValueError``)."""
    kind = getattr(builtins, outcome.error_kind, None)
    if isinstance(kind, type) and issubclass(kind, Exception):
        try:
            return kind(outcome.message)
        except TypeError:  # a kind with other arguments (UnicodeDecodeError): its name and message
            pass
    return RuntimeError(f"{outcome.error_kind}: {outcome.message}")


def replayed(learner: Callable[..., Any], outcomes: dict[tuple[Any, ...], Outcome]) -> Callable[..., Any]:
    """A function that gives back the recorded outcome of each input: what the comparison runs as the learner's."""

    @functools.wraps(learner)  # the learner's name and module: the comparison reports it as theirs
    def call(*args: Any) -> Any:
        outcome = outcomes[args]
        if outcome.error_kind:
            raise replayed_error(outcome)
        return outcome.value

    return call


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


def fork_available() -> bool:
    return "fork" in multiprocessing.get_all_start_methods()


# Cases whose naive evaluation can run for minutes: left out where no child process can be forked (Windows)
MAY_HANG = {"a huge power tower", "a power of ten too large", "over-long input of additions"}


def calculator_outcomes(learner: Callable[..., Any], cases: list[Case]) -> Callable[..., Any]:
    """The learner's calculator as the comparison calls it: outcomes computed safely beforehand, then replayed."""
    inputs = [case.args for case in cases]
    return replayed(learner, dict(zip(inputs, isolated_outcomes(learner, inputs), strict=True)))


def check_08_calculator(learner: Any) -> Any:
    """08.2: the learner's ``calculator(expression)``; hands back theirs or ``tool_use.calculator``.

    It must give the reference's numbers on arithmetic and refuse, by raising an error, everything the reference
    refuses; the model reads that error as the tool's answer.
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
                                     needs=calculator_needs)
    return hand_back(CALCULATOR, passed, learner, calculator, "tool_use.calculator")


# --- 08.3 a reward for using the tool that calling it for nothing cannot earn --------------------------------


IDLE_EXPRESSION, IDLE_RESULT = "123457*3", "370371"  # a result no GSM8K solution writes


def _call_turn(expression: str, content: str = "") -> dict[str, Any]:
    call = {"type": "function", "function": {"name": TOOL_NAME, "arguments": {"expression": expression}}}
    return {"role": "assistant", "content": content, "tool_calls": [call]}


def _tool_turn(content: Any) -> dict[str, Any]:
    return {"role": "tool", "name": TOOL_NAME, "content": content}


def _wrong(text: str, gold: str) -> str:
    """``text`` with its answer block stating another number than ``gold``."""
    return text.replace(f"<answer>\n{gold}\n</answer>", f"<answer>\n{gold}1\n</answer>")


def tool_scenarios(solution: str, gold: str) -> dict[str, list[dict[str, Any]]]:
    """One real solution written the ways a tool-using model writes it, as TRL passes completions with ``tools=``.

    The calls of ``tool_call_trace`` (each result used by the text after it), the same text with no call, idle
    and refused calls before it, the answer made wrong, and the first call repeated ten times.
    """
    trace = tool_call_trace(solution, gold)
    text = "".join(str(message["content"]) for message in trace.messages)
    final = trace.messages[-1]
    idle = [_call_turn(IDLE_EXPRESSION), _tool_turn(IDLE_RESULT)]
    refused = [_call_turn("48 // 2"), _tool_turn({"error": "only numbers, + - * / ** and parentheses are allowed"})]
    first_call = [{**trace.messages[0], "content": ""}, trace.messages[1]]
    return {
        "used calls, right answer": trace.messages,
        "no call, right answer": [{"role": "assistant", "content": text}],
        "an idle call, right answer": [*idle, {"role": "assistant", "content": text}],
        "a refused call, right answer": [*refused, {"role": "assistant", "content": text}],
        "used calls and an idle one, right answer": [*idle, *trace.messages],
        "the first call made 10 times, right answer": [*first_call * 9, *trace.messages],
        "used calls, wrong answer": [*trace.messages[:-1], {**final, "content": _wrong(final["content"], gold)}],
        "no call, wrong answer": [{"role": "assistant", "content": _wrong(text, gold)}],
    }


# (scenario, the one it is compared with, what the reward must do): "<=" earns no more, ">" earns more
TOOL_RULES: tuple[tuple[str, str, str, str], ...] = (
    ("used calls, right answer", ">", "no call, right answer", "pays for using the tool at all"),
    ("an idle call, right answer", "<=", "no call, right answer", "a call whose result is never used earns nothing"),
    ("a refused call, right answer", "<=", "no call, right answer", "a refused call earns nothing"),
    ("used calls and an idle one, right answer", "<=", "used calls, right answer", "an idle call added earns nothing"),
    ("the first call made 10 times, right answer", "<=", "used calls, right answer",
     "repeating a call earns nothing more"),
    ("used calls, wrong answer", "<=", "no call, wrong answer", "calls do not pay when the answer is wrong"),
)


def tool_rows(dataset: Any, count: int = 6) -> list[tuple[int, str, str]]:
    """``(index, solution, gold)`` of real rows whose notes become calls: the first and the tricky ones."""
    rows = []
    for index in real_row_indices(dataset, 24):
        solution = dataset_rows(dataset, [index])[0]["answer"]
        gold = extract_hash_answer(solution)
        if tool_call_trace(solution, gold).calls:
            rows.append((index, solution, gold))
    return rows[:count]


def _rewards(learner: Callable[..., Any], completions: list[Any], golds: list[str]) -> Any:
    """The learner's rewards for one batch, called as TRL calls a reward (keywords, every extra TRL passes)."""
    return awaited(learner(**trl_reward_kwargs(completions, golds, [""] * len(completions))))


def _batch_problem(values: Any, completions: int) -> str | None:
    """Why ``values`` is not one finite float per completion in a list, or None."""
    if not isinstance(values, (list, tuple)):
        return f"returns {' '.join(repr(values).split())[:40]}, a {type(values).__name__}: a list with one float each"
    if len(values) != completions or not all(_finite(v) for v in values):
        return f"returns {short_repr(values, 60)} for {completions} completions: one float each"
    return None


def _finite(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


JUNK_COMPLETIONS = (None, "", "plain text, no messages", [{"role": "assistant"}], [{"role": "tool", "content": None}],
                    [_call_turn("1+1")], ["not a message"])


def contract_problem(learner: Callable[..., Any]) -> str | None:
    """One float per completion, also for what a reward meets beyond model text (nothing, a bare call, junk)."""
    junk = list(JUNK_COMPLETIONS)
    try:
        values = _rewards(learner, junk, ["1"] * len(junk))
    except NotImplementedError:
        raise
    except Exception as exc:  # the learner's bug is a verdict, never a crash
        return f"junk completions (None, plain text, a message without content...): raises {type(exc).__name__}: {exc}"
    problem = _batch_problem(values, len(junk))
    return f"junk completions (None, plain text, a message without content...): {problem}" if problem else None


def rule_problems(learner: Callable[..., Any], dataset: Any) -> list[str]:
    """Every rule the learner's reward breaks on real rows, in words; empty when it keeps them all."""
    problems = []
    for index, solution, gold in tool_rows(dataset):
        scenarios = tool_scenarios(solution, gold)
        values = _rewards(learner, list(scenarios.values()), [gold] * len(scenarios))
        if problem := _batch_problem(values, len(scenarios)):
            return [f"row {index}: {problem}"]
        reward = dict(zip(scenarios, map(float, values), strict=True))
        for scenario, relation, other, rule in TOOL_RULES:
            kept = reward[scenario] > reward[other] if relation == ">" else reward[scenario] <= reward[other] + 1e-9
            if not kept:
                problems.append(f"row {index}: {rule}: '{scenario}' earns {reward[scenario]:g}, "
                                f"'{other}' {reward[other]:g}")  # fmt: skip
    return problems


def check_08_tool_reward(learner: Any, dataset: Any) -> Any:
    """08.3: a tool-use reward of the learner's design; hands back theirs or ``tool_use.tool_use_reward``.

    Judged on rules, not on values: called as TRL calls it on real solutions written with used, idle, refused,
    repeated calls and with wrong answers, it must pay for used calls on a right answer and for nothing else, and
    return one float per completion on junk too.
    """
    reference, name = tool_use_reward, "tool_use.tool_use_reward"
    if not_a_function(TOOL_REWARD, learner, TOOL_REWARD_HINT):
        return hand_back(TOOL_REWARD, False, learner, reference, name)
    try:
        problems = [p for p in [contract_problem(learner)] if p] or rule_problems(learner, dataset)
    except NotImplementedError:
        report(TOOL_REWARD, False, TOOL_REWARD_HINT, None)
        return hand_back(TOOL_REWARD, False, learner, reference, name)
    except Exception as exc:  # the learner's reward failed on a real batch: a verdict, never a crash
        problems = [f"raises {type(exc).__name__} on real solutions with calls: {' '.join(str(exc).split())[:120]}"]
    if problems:
        list_problems(TOOL_REWARD, f"not yet, {len(problems)} rule(s) broken", problems, TOOL_REWARD_HINT, show=4)
    else:
        print(f"✅ {TOOL_REWARD}: pays for used calls on a right answer and for nothing else, on "
              f"{len(tool_rows(dataset))} real solutions, and gives one float per completion on junk.")  # fmt: skip
    return hand_back(TOOL_REWARD, not problems, synchronous(learner), reference, name)


# --- 08.4 GRPOTrainer with the calculator ---------------------------------------------------------------------


TRAINER = "08.4 GRPOTrainer with tools"
TRAINER_HINT = ("notebook 04's call with two changes: reward_funcs=[*REWARD_FUNCS, tool_use_reward] and "
                "tools=[calculator], the calculator 08.2 handed back")


def tool_reward_problems(trainer: Any, config: Any, reward_funcs: Sequence[Any]) -> list[str]:
    """The course's five rewards and the tool-use reward 08.3 handed back, each with the config's weight."""
    names = [getattr(f, "__name__", type(f).__name__) for f in trainer.reward_funcs]
    expected = [getattr(f, "__name__", type(f).__name__) for f in reward_funcs]
    if names != expected:
        return [f"reward_funcs {names}: pass [*REWARD_FUNCS, tool_use_reward] {expected}, in the order of "
                "config.reward_weights"]  # fmt: skip
    given, wanted = [float(w) for w in trainer.reward_weights], [float(w) for w in config.reward_weights]
    if not all(math.isclose(g, w, abs_tol=1e-9) for g, w in zip(given, wanted, strict=True)):
        return [f"each reward's weight: yours {given}, the config's {wanted}"]
    return []


def tools_problems(trainer: Any, tools: Sequence[Callable[..., Any]]) -> list[str]:
    """The trainer calls exactly the calculator 08.2 handed back."""
    held = list(getattr(trainer, "tools", None) or [])
    if len(held) != len(tools) or any(h is not t for h, t in zip(held, tools, strict=False)):
        names = [getattr(t, "__name__", type(t).__name__) for t in held]
        return [f"tools: the trainer holds {names or 'no tool'}; pass tools=[calculator], the one 08.2 handed back"]
    return []


def tool_trainer_problems(trainer: Any, *, model: Any, tokenizer: Any, config: Any, lora: Any,
                          tools: Sequence[Callable[..., Any]], reward_funcs: Sequence[Any]) -> list[str]:
    """Everything the trainer holds that the course's tool run does not (callbacks are the learner's own)."""
    if not isinstance(trainer, GRPOTrainer):
        return [f"a {type(trainer).__name__}, not a GRPOTrainer; build one with GRPOTrainer(...)"]
    problems = [] if trainer.args is config else ["args: not the tool run's config above; pass args=config"]
    if trainer.processing_class is not tokenizer:
        problems.append("processing_class: not the tool tokenizer of section 3; pass processing_class=tokenizer")
    return [*problems, *tools_problems(trainer, tools), *tool_reward_problems(trainer, config, reward_funcs),
            *adapter_problems(trainer, model, lora), *dataset_problems(trainer.train_dataset)]


def check_08_trainer(trainer: Any, profile: Profile, *, model: Any, tokenizer: Any, config: Any, lora: Any,
                     train_dataset: Any, tools: Sequence[Callable[..., Any]], reward_funcs: Sequence[Any],
                     callbacks: Sequence[Any] = ()) -> Any:
    """08.4: the learner's ``GRPOTrainer(..., tools=[calculator])``; hands back it when it passed, else the course's.

    ``tools`` and ``reward_funcs`` are what 08.2 and 08.3 handed back (with the course's five rewards); the
    reference trainer (``tool_lab.build_tool_trainer``'s call) is built on the same pieces.
    """
    found = problems_of(lambda: tool_trainer_problems(trainer, model=model, tokenizer=tokenizer, config=config,
                                                      lora=lora, tools=tools, reward_funcs=reward_funcs))
    passed = judge(TRAINER, trainer, found, TRAINER_HINT, TRL_TRAINER)
    reference = None
    if not passed:
        release_model(trainer, model)
        strip_adapters(model)
        reference = GRPOTrainer(model=model, processing_class=tokenizer, reward_funcs=list(reward_funcs), args=config,
                                train_dataset=train_dataset, peft_config=lora, tools=list(tools),
                                callbacks=list(callbacks))  # fmt: skip
    return hand_back(TRAINER, passed, trainer, reference, "GRPOTrainer (tool_lab.build_tool_trainer's call)")


# --- the end of the notebook ----------------------------------------------------------------------------------


TOOL_LOG_COLUMNS = ("tools/call_frequency", "tools/failure_frequency")


def check_08_failure_column(answer: Any) -> bool:
    """08.5: which log column TRL writes for the share of tool calls that failed."""
    hint = "TRL logs two tools/ columns: calls per completion, and the share of calls that raised"
    return report_name("08.5 failure column", answer, {TOOL_LOG_COLUMNS[1]}, hint)
