"""08.3: a tool-use reward of the learner's design, judged on what it must not pay for (calls whose results are
not used, calls when the answer is wrong, failed calls, repeated calls) and on paying for real use."""

from __future__ import annotations

import itertools
import math
import numbers
import re
from collections.abc import Callable
from typing import Any

import numpy as np

from course_utils.exercises.comparison import call_on_copy, mutation_message, not_a_function
from course_utils.exercises.nb03_reward_functions.trl_calls import awaited, synchronous, trl_reward_kwargs
from course_utils.exercises.real_rows import dataset_rows, real_row_indices, short_repr
from course_utils.exercises.verdicts import hand_back, list_problems, report
from course_utils.lesson.formatting import extract_hash_answer
from course_utils.lesson.tool_use import (
    TOOL_NAME,
    tool_call_trace,
    tool_use_reward,
)

TOOL_REWARD = "08.3 tool-use reward"

TOOL_REWARD_HINT = (
    "read the final answer from the last assistant message; pay nothing unless it matches the gold answer; then "
    "pay one fixed bonus when some tool result (a tool message's content that is a number, not an error's text) is "
    "written as a whole number (not as digits inside another: 2 is not in 12) in an assistant message after it"
)





IDLE_EXPRESSION, IDLE_RESULT = "123457*3", "370371"  # a result no GSM8K solution writes


def _call_turn(expression: str, content: str = "") -> dict[str, Any]:
    call = {"type": "function", "function": {"name": TOOL_NAME, "arguments": {"expression": expression}}}
    return {"role": "assistant", "content": content, "tool_calls": [call]}


def _tool_turn(content: Any) -> dict[str, Any]:
    return {"role": "tool", "name": TOOL_NAME, "content": content}


def _wrong(text: str, gold: str) -> str:
    """``text`` with its answer block stating another number than ``gold``."""
    return text.replace(f"<answer>\n{gold}\n</answer>", f"<answer>\n{gold}1\n</answer>")


LATE_CALL = "a call after the text that wrote its result, right answer"
DIGITS_INSIDE = "an idle call whose result is digits inside the answer, right answer"


def _digits_inside(text: str, gold: str) -> str | None:
    """A run of ``gold``'s digits that the text never writes as a number of its own (``2`` inside ``12``), or None."""
    written = set(re.findall(r"\d[\d,]*(?:\.\d+)?", text))
    written = {n.replace(",", "") for n in written}
    digits = gold.lstrip("-")
    runs = [digits[i:j] for i in range(len(digits)) for j in range(i + 1, len(digits) + 1)]
    for run in runs[:-1] if len(digits) > 1 else []:  # the whole answer aside
        if run.isdigit() and not run.startswith("0") and run not in written:
            return run
    return None


def tool_scenarios(solution: str, gold: str) -> dict[str, list[dict[str, Any]]]:
    """One real solution written the ways a tool-using model writes it, as TRL passes completions with ``tools=``.

    The calls of ``tool_call_trace`` (each result used by the text after it), the same text with no call, idle
    and refused calls before it, the answer made wrong, and the first call repeated ten times.
    """
    trace = tool_call_trace(solution, gold)
    text = "".join(str(message["content"]) for message in trace.messages)
    final = trace.messages[-1]
    idle = [_call_turn(IDLE_EXPRESSION), _tool_turn(IDLE_RESULT)]
    refusal = {"error": "only numbers, + - * / ** and parentheses are allowed"}
    refused = [_call_turn("48 // 2"), _tool_turn(str(refusal))]  # TRL writes the error's dict as text
    first_call = [{**trace.messages[0], "content": ""}, trace.messages[1]]
    scenarios = {
        "used calls, right answer": trace.messages,
        "no call, right answer": [{"role": "assistant", "content": text}],
        "an idle call, right answer": [*idle, {"role": "assistant", "content": text}],
        "a refused call, right answer": [*refused, {"role": "assistant", "content": text}],
        "used calls and an idle one, right answer": [*idle, *trace.messages],
        "the first call made 10 times, right answer": [*first_call * 9, *trace.messages],
        "used calls, wrong answer": [*trace.messages[:-1], {**final, "content": _wrong(final["content"], gold)}],
        "no call, wrong answer": [{"role": "assistant", "content": _wrong(text, gold)}],
    }
    if inside := _digits_inside(text, gold):  # its result is a run of the answer's digits, never a number written
        plain = scenarios["no call, right answer"]
        scenarios[DIGITS_INSIDE] = [_call_turn(f"{inside}+0"), _tool_turn(inside), *plain]
    if late := _late_call(trace.messages, gold):  # its result is in the text before it, never after
        answer_only = {"role": "assistant", "content": f"<answer>\n{gold}\n</answer>"}
        scenarios[LATE_CALL] = [{"role": "assistant", "content": text}, *late, answer_only]
    return scenarios


def _late_call(messages: list[dict[str, Any]], gold: str) -> list[dict[str, Any]]:
    """A call of the trace and its tool turn whose result the final answer does not write, even inside a number."""
    for call, result in itertools.pairwise(messages):
        if call.get("tool_calls") and result.get("role") == "tool" and str(result["content"]).strip() not in gold:
            return [{**call, "content": ""}, result]
    return []


# (scenario, the one it is compared with, what the reward must do): "<=" earns no more, ">" earns more
TOOL_RULES: tuple[tuple[str, str, str, str], ...] = (
    ("used calls, right answer", ">", "no call, right answer", "pays for using the tool at all"),
    ("an idle call, right answer", "<=", "no call, right answer", "a call whose result is never used earns nothing"),
    ("a refused call, right answer", "<=", "no call, right answer", "a refused call earns nothing"),
    ("used calls and an idle one, right answer", "<=", "used calls, right answer", "an idle call added earns nothing"),
    ("the first call made 10 times, right answer", "<=", "used calls, right answer",
     "repeating a call earns nothing more"),
    ("used calls, wrong answer", "<=", "no call, wrong answer", "calls do not pay when the answer is wrong"),
    (DIGITS_INSIDE, "<=", "no call, right answer",
     "a result counts as used only written as a whole number, not as digits inside another"),
    (LATE_CALL, "<=", "no call, right answer",
     "a result counts as used only when an assistant turn after the call writes it"),
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


class ChangedItsInput(Exception):
    """The learner's reward changed the completions or columns TRL gave it: the rewards after it score those."""


def _rewards(learner: Callable[..., Any], completions: list[Any], golds: list[str]) -> Any:
    """The learner's rewards for one batch, called as TRL calls a reward (keywords, every extra TRL passes).

    On its own copy of the batch: a reward that changes it in place raises ``ChangedItsInput``.
    """
    kwargs = trl_reward_kwargs(completions, golds, [""] * len(completions))
    values, where = call_on_copy(lambda **given: awaited(learner(**given)), kwargs)
    if where:
        raise ChangedItsInput(mutation_message(where))
    return values


def _batch_problem(values: Any, completions: int) -> str | None:
    """Why ``values`` is not one finite float per completion in a list (or a 1-D array, as TRL takes), or None."""
    if isinstance(values, np.ndarray) and values.ndim == 1:
        values = values.tolist()
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
    except (NotImplementedError, ChangedItsInput):
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
        reward = dict(zip(scenarios, map(float, list(values)), strict=True))
        for scenario, relation, other, rule in TOOL_RULES:
            if scenario not in reward:
                continue
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
    except ChangedItsInput as changed:
        problems = [str(changed)]
    except Exception as exc:  # the learner's reward failed on a real batch: a verdict, never a crash
        problems = [f"raises {type(exc).__name__} on real solutions with calls: {' '.join(str(exc).split())[:120]}"]
    if problems:
        list_problems(TOOL_REWARD, f"not yet, {len(problems)} rule(s) broken", problems, TOOL_REWARD_HINT, show=4)
    else:
        print(f"✅ {TOOL_REWARD}: pays for used calls on a right answer and for nothing else, on "
              f"{len(tool_rows(dataset))} real solutions, and gives one float per completion on junk.")  # fmt: skip
    return hand_back(TOOL_REWARD, not problems, synchronous(learner), reference, name)
