"""Notebook 08's checks, each tested three ways: the course's solution passes and is handed back, the learner's
stub reads "not answered yet" and the package's version is handed back, and plausible wrong answers fail, each
naming what differs.

The solutions and stubs are the notebook's own cells (``notebook_code.exercise``); the wrong answers are written
here as a learner writes them (``eval``, floats, a note trusted without recomputing it, a reward per call...).
"""

from __future__ import annotations

import ast
import operator
import os
import re
import sys
import time
from fractions import Fraction

import pytest
from notebook_code import exercise
from trl import GRPOTrainer

from course_utils.core.answer_format import extract_xml_answer
from course_utils.core.profiles import get_profile
from course_utils.exercises import nb08_tool_use as nb08
from course_utils.exercises.nb08_tool_use import calculator_check, isolated_calls, tool_reward_check, trace_check
from course_utils.lesson.data_checks import calculator_notes
from course_utils.lesson.models import build_tiny_random_model, load_tokenizer
from course_utils.lesson.rewards import REWARD_FUNCS, answers_match, completion_text
from course_utils.lesson.tool_use import (
    MAX_EXPRESSION_CHARS,
    TOOL_NAME,
    ToolTrace,
    calculator,
    format_result,
    tool_call_trace,
    tool_use_reward,
)
from course_utils.training import grpo_prompts, lora_setup, run_callbacks
from course_utils.training.tool_lab import make_tool_grpo_config, tool_tokenizer


def verdict(capsys) -> str:
    return capsys.readouterr().out


# --- 08.1 the converter ------------------------------------------------------------------------------------


def test_08_1_the_solution_passes_and_is_handed_back(gsm8k_train, capsys):
    solution = exercise("08", "tool_call_trace")
    assert nb08.check_08_trace(solution, gsm8k_train) is solution
    out = verdict(capsys)
    assert "✅ 08.1 tool_call_trace: same result as the reference" in out and "continues with yours" in out


def test_08_1_the_stub_reads_not_answered_and_the_package_converter_is_handed_back(gsm8k_train, capsys):
    stub = exercise("08", "tool_call_trace", copy="notebooks")
    assert nb08.check_08_trace(stub, gsm8k_train) is tool_call_trace
    out = verdict(capsys)
    assert "⏳ 08.1 tool_call_trace: not answered yet." in out
    assert "continues with the package's tool_use.tool_call_trace." in out
    assert nb08.check_08_trace(None, gsm8k_train) is tool_call_trace


def test_08_1_the_cases_hold_the_rows_whose_notes_the_calculator_refuses(gsm8k_train):
    refused = trace_check.refused_note_rows(gsm8k_train)
    unparsed = [i for i in refused if tool_call_trace(gsm8k_train[i]["answer"], "0").unparsed]
    assert unparsed == [394, 4169], "the two floor divisions of the training split"
    labels = [case.label for case in trace_check.trace_cases(gsm8k_train)]
    assert all(any(label.startswith(f"train row {row} (") for label in labels) for row in unparsed), labels


def _trusting(solution, answer):  # uses the note's stated result as the tool's answer, never recomputed
    trace = tool_call_trace(solution, answer)
    stated = iter(s for _, s in calculator_notes(solution.split("####", 1)[0]))
    for message in trace.messages:
        if message["role"] == "tool":
            message["content"] = next(stated)
    return trace


def _without_reasoning_tag(solution, answer):  # forgets to open the reasoning
    trace = tool_call_trace(solution, answer)
    trace.messages[0]["content"] = trace.messages[0]["content"].removeprefix("<reasoning>\n")
    return trace


def _dropping_refused_notes(solution, answer):  # a refused note vanishes instead of staying as text
    trace = tool_call_trace(solution, answer)
    for message in trace.messages:
        for expression, stated in calculator_notes(solution):
            if message["role"] == "assistant" and f"{expression}={stated}" in message["content"]:
                message["content"] = message["content"].replace(f"{expression}={stated}", "")
    return trace


def _every_occurrence(solution, answer):  # splits the text at every occurrence of a note, not the first
    if not isinstance(solution, str) or not isinstance(answer, str):
        raise TypeError("text please")
    trace, text, rest = ToolTrace(), "<reasoning>\n", solution.split("####", 1)[0].strip()
    for expression, stated in dict.fromkeys(calculator_notes(rest)):
        parts = rest.split(f"<<{expression}={stated}>>")
        rest = parts[-1]
        trace.messages += [
            {"role": "assistant", "content": text + "".join(parts[:-1]), "tool_calls": [
                {"type": "function", "function": {"name": TOOL_NAME, "arguments": {"expression": expression}}}]},
            {"role": "tool", "name": TOOL_NAME, "content": calculator(expression)},
        ]
        trace.calls += 1
        text = ""
    closing = f"\n</reasoning>\n<answer>\n{answer}\n</answer>"
    trace.messages.append({"role": "assistant", "content": text + rest + closing})
    return trace


def _keeping_the_final_line(solution, answer):  # reads the whole solution, "#### 72" included
    return tool_call_trace(solution.replace("####", "Answer:"), answer) if isinstance(solution, str) else (
        tool_call_trace(solution, answer))  # fmt: skip


def _messages_only(solution, answer):  # returns the messages, not a ToolTrace
    return tool_call_trace(solution, answer).messages


def _no_type_check(solution, answer):  # an answer given as a number slips into the text
    return tool_call_trace(solution, str(answer))


@pytest.mark.parametrize(
    ("wrong", "named"),
    [
        (_trusting, "a result with a thousands comma"),
        (_without_reasoning_tag, "no note at all"),
        (_dropping_refused_notes, "a floor division the calculator refuses"),
        (_every_occurrence, "the same note twice"),
        (_keeping_the_final_line, "no note at all"),
        (_messages_only, "return a ToolTrace"),
        (_no_type_check, "an answer that is not text"),
    ],
)
def test_08_1_wrong_converters_fail_naming_the_case(wrong, named, gsm8k_train, capsys):
    assert nb08.check_08_trace(wrong, gsm8k_train) is tool_call_trace
    out = verdict(capsys)
    assert "❌ 08.1 tool_call_trace: differs from the reference" in out and named in out, out


def test_08_1_the_reason_for_a_refused_note_is_the_learner_s_own_words():
    trace = tool_call_trace("<<560//10=56>>56 boxes.\n#### 56", "56")
    reworded = ToolTrace(trace.messages, trace.calls, ["<<560//10=56>>: no floor division here"])
    assert trace_check.trace_view(reworded) == trace_check.trace_view(trace)
    assert trace_check.trace_view([1, 2]) == [1, 2]  # not a trace: left as it is, for the check to name


# --- 08.2 the calculator -----------------------------------------------------------------------------------


def test_08_2_the_solution_passes_and_is_handed_back(capsys):
    solution = exercise("08", "calculator")
    assert nb08.check_08_calculator(solution) is solution
    out = verdict(capsys)
    assert "✅ 08.2 calculator: same result as the reference on all" in out and "continues with yours" in out


def test_08_2_the_stub_reads_not_answered_and_the_package_calculator_is_handed_back(capsys):
    stub = exercise("08", "calculator", copy="notebooks")
    assert nb08.check_08_calculator(stub) is calculator
    out = verdict(capsys)
    assert "⏳ 08.2 calculator: not answered yet." in out and "the package's tool_use.calculator." in out
    assert nb08.check_08_calculator(calculator) is calculator
    assert "that is the package's own" in verdict(capsys)


def eval_calculator(expression: str) -> str:
    """Compute an arithmetic expression.

    Args:
        expression: The arithmetic to compute.
    """
    return format_result(Fraction(eval(expression)))  # the classic: runs whatever the model writes


def _walk(node, allowed, limits=True):
    operators = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
                 ast.Pow: operator.pow, ast.Mod: operator.mod, ast.FloorDiv: operator.floordiv}  # fmt: skip
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float):  # a bool is an int here
        return Fraction(str(node.value)) if limits else Fraction(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_walk(node.operand, allowed, limits)
    if isinstance(node, ast.BinOp) and type(node.op) in allowed:
        left, right = _walk(node.left, allowed, limits), _walk(node.right, allowed, limits)
        if isinstance(node.op, ast.Pow) and limits and abs(right) > 64:
            raise ValueError("exponent too large")
        if limits and isinstance(node.op, ast.Div) and right == 0:
            raise ValueError("division by zero")
        value = operators[type(node.op)](left, int(right) if isinstance(node.op, ast.Pow) else right)
        if limits and abs(value) > 10**15:
            raise ValueError("too large")
        return value
    raise ValueError(f"not allowed: {type(node).__name__}")


ARITHMETIC = {ast.Add, ast.Sub, ast.Mult, ast.Div, ast.Pow}


def unbounded_calculator(expression: str) -> str:
    """Compute an arithmetic expression.

    Args:
        expression: The arithmetic to compute.
    """
    return format_result(_walk(ast.parse(expression.strip(), mode="eval").body, ARITHMETIC, limits=False))


def modulo_calculator(expression: str) -> str:
    """Compute an arithmetic expression.

    Args:
        expression: The arithmetic to compute.
    """
    return format_result(_walk(ast.parse(expression.strip(), mode="eval").body, ARITHMETIC | {ast.Mod, ast.FloorDiv}))


def float_calculator(expression: str) -> str:
    """Compute an arithmetic expression.

    Args:
        expression: The arithmetic to compute.
    """
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ValueError("too long")
    return str(float(_walk(ast.parse(expression.strip(), mode="eval").body, ARITHMETIC)))  # "24.0", not "24"


def number_calculator(expression: str) -> float:
    """Compute an arithmetic expression.

    Args:
        expression: The arithmetic to compute.
    """
    return float(calculator(expression))  # the model reads text: TRL puts the return value in the tool turn


def undocumented_calculator(expression):
    return calculator(expression)


@pytest.mark.parametrize(
    ("wrong", "named"),
    [
        (eval_calculator, "__import__"),
        (unbounded_calculator, "did not finish within"),
        (modulo_calculator, "modulo"),
        ("no length limit", "over-long input of additions"),
        ("no exponent limit", "did not finish within"),
        (float_calculator, "yours returns '24.0'"),
        (number_calculator, "return the result as text"),
        (undocumented_calculator, "TRL cannot describe it to the model"),
    ],
)
def test_08_2_wrong_calculators_fail_naming_the_case(wrong, named, capsys):
    if wrong == "no length limit":  # the solution, with a limit that never applies
        wrong = exercise("08", "calculator", MAX_EXPRESSION_CHARS=10**6)
    elif wrong == "no exponent limit":
        wrong = exercise("08", "calculator", MAX_EXPONENT=10**12)
    assert nb08.check_08_calculator(wrong) is calculator
    out = verdict(capsys)
    assert "❌ 08.2 calculator" in out and named in out, out


def _slow(expression):
    if expression == "slow":
        time.sleep(30)
    if expression == "die":
        os._exit(1)
    if expression == "stub":
        raise NotImplementedError
    return expression.upper()


def test_08_2_a_runaway_input_is_stopped_and_the_rest_still_run():
    started = time.perf_counter()
    outcomes = isolated_calls.isolated_outcomes(_slow, [("a",), ("slow",), ("b",), ("die",), ("c",)], seconds=1.0)
    assert time.perf_counter() - started < 10
    assert [o.value for o in outcomes] == ["A", None, "B", None, "C"]
    assert outcomes[1].error_kind == "TimeoutError" and "within 1 s" in outcomes[1].message
    assert outcomes[3].error_kind == "MemoryError" and "died" in outcomes[3].message


def test_08_2_a_recorded_error_comes_back_as_its_built_in_kind():
    replay = isolated_calls.replayed(_slow, {("x",): isolated_calls.Outcome(error_kind="ValueError", message="no"),
                                   ("y",): isolated_calls.Outcome(error_kind="SystemExit", message="bye"),
                                   ("z",): isolated_calls.Outcome(error_kind="NotImplementedError")})  # fmt: skip
    with pytest.raises(ValueError, match="no"):
        replay("x")
    with pytest.raises(RuntimeError, match="SystemExit: bye"):  # never a SystemExit out of a check
        replay("y")
    with pytest.raises(NotImplementedError):  # a stub that raises reads "not answered yet"
        replay("z")


def test_08_2_without_fork_the_cases_that_may_hang_are_left_out_and_said(monkeypatch, capsys):
    monkeypatch.setattr(calculator_check, "fork_available", lambda: False)
    solution = exercise("08", "calculator")
    assert nb08.check_08_calculator(solution) is solution
    out = verdict(capsys)
    kept = len(calculator_check.CALCULATOR_CASES) - len(calculator_check.MAY_HANG)
    assert "no child process here" in out and f"all {kept} cases" in out


@pytest.mark.parametrize(
    ("got", "same"),
    [("24", True), ("24.0", False), ("2.333333", True), ("2.3333333333", True), ("2.33", False), (24, False),
     ("x", False)],
)  # fmt: skip
def test_08_2_results_compare_as_numbers_written_as_the_model_reads_them(got, same):
    expected = "24" if got in ("24", "24.0", 24, "x") else "2.333333"
    assert calculator_check.same_result(expected, got) is same


# --- 08.3 the tool-use reward ---------------------------------------------------------------------------------


def test_08_3_the_solution_and_the_package_s_reward_pass(gsm8k_train, capsys):
    solution = exercise("08", "tool_use_reward")
    assert nb08.check_08_tool_reward(solution, gsm8k_train) is solution
    assert "✅ 08.3 tool-use reward: pays for used calls on a right answer and for nothing else" in verdict(capsys)
    assert tool_reward_check.rule_problems(tool_use_reward, gsm8k_train) == []
    assert tool_reward_check.contract_problem(tool_use_reward) is None


def test_08_3_the_stub_reads_not_answered_and_the_package_reward_is_handed_back(gsm8k_train, capsys):
    stub = exercise("08", "tool_use_reward", copy="notebooks")
    assert nb08.check_08_tool_reward(stub, gsm8k_train) is tool_use_reward
    out = verdict(capsys)
    assert "⏳ 08.3 tool-use reward: not answered yet." in out and "tool_use.tool_use_reward" in out


def _right(completion, gold):
    return answers_match(extract_xml_answer(completion_text(completion)), gold)


def _calls(completion):
    if not isinstance(completion, list):
        return 0
    return sum(len(m.get("tool_calls") or []) for m in completion if isinstance(m, dict))


def per_call(completions, answer, **kwargs):  # every call pays: ten calls pay ten times
    return [0.5 * _calls(c) if _right(c, g) else 0.0 for c, g in zip(completions, answer, strict=True)]


def any_call(completions, answer, **kwargs):  # a call pays, right answer or not
    return [0.5 if _calls(c) else 0.0 for c in completions]


def called_and_right(completions, answer, **kwargs):  # right and called: idle calls pay too
    return [0.5 if _calls(c) and _right(c, g) else 0.0 for c, g in zip(completions, answer, strict=True)]


def _results(completion):
    return [m.get("content") for m in completion if isinstance(m, dict) and m.get("role") == "tool"] if isinstance(
        completion, list) else []  # fmt: skip


def errors_count_as_used(completions, answer, **kwargs):  # a refused call's message counts as a result
    return [0.5 if _results(c) and _right(c, g) and str(_results(c)[-1]) else 0.0
            for c, g in zip(completions, answer, strict=True)]  # fmt: skip


def per_used_call(completions, answer, **kwargs):  # each used result pays: repeating a call pays more
    rewards = []
    for completion, gold in zip(completions, answer, strict=True):
        messages = [m for m in completion if isinstance(m, dict)] if isinstance(completion, list) else []
        text = completion_text([m for m in messages if m.get("role") == "assistant"])
        used = sum(isinstance(r, str) and r in text for r in _results(completion))
        rewards.append(0.5 * used if _right(completion, gold) else 0.0)
    return rewards


def substring_used(completions, answer, **kwargs):  # "used" as a substring: a result 2 is "in" an answer 12
    rewards = []
    for completion, gold in zip(completions, answer, strict=True):
        messages = [m for m in completion if isinstance(m, dict)] if isinstance(completion, list) else []
        calls = sum(len(m.get("tool_calls") or []) for m in messages if m.get("role") == "assistant")
        used = 0
        for position, message in enumerate(messages):
            result = message.get("content") if message.get("role") == "tool" else None
            later = completion_text([m for m in messages[position + 1 :] if m.get("role") == "assistant"])
            used += isinstance(result, str) and bool(result.strip()) and result.strip() in later
        rewards.append(0.5 * min(used, calls) / calls if _right(completion, gold) and calls else 0.0)
    return rewards


def reads_first_message(completions, answer, **kwargs):  # notebook 03's classic reading: breaks on junk
    return [0.5 if "tool_calls" in completion[0] else 0.0 for completion in completions]


def never_pays(completions, answer, **kwargs):  # safe, and teaches nothing
    return [0.0 for _ in completions]


def one_number(completions, answer, **kwargs):  # a single float for the whole batch
    return 0.5


@pytest.mark.parametrize(
    ("wrong", "named"),
    [
        (per_call, "an idle call added earns nothing"),
        (any_call, "calls do not pay when the answer is wrong"),
        (called_and_right, "a call whose result is never used earns nothing"),
        (errors_count_as_used, "a refused call earns nothing"),
        (per_used_call, "repeating a call earns nothing more"),
        (substring_used, "a result counts as used only written as a whole number, not as digits inside another"),
        (reads_first_message, "junk completions"),
        (never_pays, "pays for using the tool at all"),
        (one_number, "returns 0.5, a float: a list with one float each"),
    ],
)
def test_08_3_wrong_rewards_fail_naming_the_rule(wrong, named, gsm8k_train, capsys):
    assert nb08.check_08_tool_reward(wrong, gsm8k_train) is tool_use_reward
    out = verdict(capsys)
    assert "❌ 08.3 tool-use reward: not yet" in out and named in out, out


def test_08_3_the_scenarios_are_what_their_names_say(gsm8k_train):
    index, solution, gold = tool_reward_check.tool_rows(gsm8k_train)[0]
    assert index == 0
    scenarios = tool_reward_check.tool_scenarios(solution, gold)
    assert [_calls(c) for c in scenarios.values()] == [2, 0, 1, 1, 3, 11, 2, 0, 1, 1]  # row 0 has two notes
    right = [_right(c, gold) for c in scenarios.values()]
    assert right == [True] * 6 + [False] * 2 + [True, True]
    inside = scenarios[tool_reward_check.DIGITS_INSIDE][1]["content"]
    assert inside in gold and inside != gold and not re.search(rf"(?<![\d.,]){inside}(?![\d.,])", completion_text(
        scenarios[tool_reward_check.DIGITS_INSIDE][2:]))  # fmt: skip
    late = scenarios[tool_reward_check.LATE_CALL]
    assert late[2]["content"] in late[0]["content"] and late[2]["content"] not in late[3]["content"]
    assert tool_reward_check.IDLE_RESULT not in completion_text(scenarios["an idle call, right answer"][2:])


# --- 08.4 GRPOTrainer with the calculator -----------------------------------------------------------------


@pytest.fixture
def pieces(gsm8k_env):
    """What the notebook has when it reaches 08.4, at toy size: the ci tool run on the tiny model."""
    profile = get_profile("ci").override(lora_top_layers=None, max_prompt_tokens=None, train_size=4)
    model = build_tiny_random_model()
    model.save_pretrained(gsm8k_env / "tiny")
    model.config._name_or_path = str(gsm8k_env / "tiny")
    return {
        "profile": profile, "model": model, "tokenizer": tool_tokenizer(load_tokenizer("ci"), profile),
        "config": make_tool_grpo_config(profile, gsm8k_env / "tools", max_steps=1),
        "lora": lora_setup.make_lora_config(profile, model), "train_dataset": grpo_prompts.training_dataset(profile),
        "dashboard": run_callbacks.LiveDashboard(show=False), "calculator": calculator,
        "tool_use_reward": tool_use_reward,
    }  # fmt: skip


def _trainer(p, **changes):
    kwargs = {"model": p["model"], "processing_class": p["tokenizer"],
              "reward_funcs": [*REWARD_FUNCS, p["tool_use_reward"]], "args": p["config"],
              "train_dataset": p["train_dataset"], "peft_config": p["lora"], "tools": [p["calculator"]],
              "callbacks": [p["dashboard"]], **changes}  # fmt: skip
    return GRPOTrainer(**kwargs)


def _check(p, trainer):
    return nb08.check_08_trainer(trainer, p["profile"], model=p["model"], tokenizer=p["tokenizer"],
                                 config=p["config"], lora=p["lora"], train_dataset=p["train_dataset"],
                                 tools=[p["calculator"]], reward_funcs=[*REWARD_FUNCS, p["tool_use_reward"]],
                                 callbacks=[p["dashboard"]])  # fmt: skip


def test_08_4_the_solution_passes_and_is_handed_back(pieces, capsys):
    names = {k: pieces[k] for k in ("model", "tokenizer", "config", "train_dataset", "lora", "dashboard",
                                    "calculator", "tool_use_reward")}  # fmt: skip
    trainer = exercise("08", "trainer", **names)
    assert isinstance(trainer, GRPOTrainer) and _check(pieces, trainer) is trainer
    out = verdict(capsys)
    assert out.startswith("✅ 08.4 GRPOTrainer with tools: correct.") and "continues with yours" in out


def test_08_4_the_stub_reads_not_answered_and_the_course_trainer_is_handed_back(pieces, capsys):
    stub = exercise("08", "trainer", copy="notebooks")
    handed = _check(pieces, stub)
    out = verdict(capsys)
    assert stub is None and out.startswith("⏳ 08.4 GRPOTrainer with tools: not answered yet.")
    assert isinstance(handed, GRPOTrainer) and list(handed.tools) == [calculator]
    assert handed.model.get_base_model() is pieces["model"]


def _own_calculator(expression: str) -> str:
    """Compute an arithmetic expression.

    Args:
        expression: The arithmetic to compute.
    """
    return calculator(expression)


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"tools": None}, "tools: the trainer holds no tool"),
        ({"tools": [_own_calculator]}, "pass tools=[calculator], the one 08.2 handed back"),
        ({"reward_funcs": [*REWARD_FUNCS[:4], tool_use_reward, REWARD_FUNCS[4]]}, "pass [*REWARD_FUNCS, tool_use_re"),
        ({"reward_funcs": [tool_use_reward, *REWARD_FUNCS]}, "in the order of config.reward_weights"),
        ({"args": "other config"}, "args: not the tool run's config"),
        ({"peft_config": None}, "peft_config: the model carries no LoRA adapter"),
    ],
)
def test_08_4_wrong_calls_fail_naming_the_problem(pieces, changes, named, capsys, gsm8k_env):
    stand_ins = {"other config": make_tool_grpo_config(pieces["profile"], gsm8k_env / "other", max_steps=1)}
    trainer = _trainer(pieces, **{k: stand_ins.get(v, v) if isinstance(v, str) else v for k, v in changes.items()})
    handed = _check(pieces, trainer)
    out = verdict(capsys)
    assert handed is not trainer and out.startswith("❌ 08.4 GRPOTrainer with tools: not yet") and named in out, out
    assert list(handed.tools) == [calculator] and handed.model.get_base_model() is pieces["model"]


def _raised(build, monkeypatch):
    """Run a learner's cell that raises, leaving the error where IPython leaves it (``sys.last_value``)."""
    try:
        build()
    except Exception as error:  # the learner's cell failed; the answer stays None
        monkeypatch.setattr(sys, "last_value", error, raising=False)
        monkeypatch.setattr(sys, "last_exc", error, raising=False)
        return error
    raise AssertionError("the call was expected to raise")


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"processing_class": "SmolLM2's own tokenizer"}, "does not support tool calling"),  # no tool turns
        ({"reward_funcs": list(REWARD_FUNCS)}, "reward"),  # five rewards for six weights
    ],
)
def test_08_4_a_call_trl_refuses_shows_trl_s_message(pieces, changes, named, capsys, monkeypatch):
    stand_ins = {"SmolLM2's own tokenizer": load_tokenizer("ci")}
    _raised(lambda: _trainer(pieces, **{k: stand_ins.get(v, v) if isinstance(v, str) else v
                                        for k, v in changes.items()}), monkeypatch)  # fmt: skip
    handed = _check(pieces, None)
    out = verdict(capsys)
    assert out.startswith("❌ 08.4 GRPOTrainer with tools: your call raised an error in the library"), out
    assert "(raised in trl/" in out and named in out and "not answered yet" not in out
    assert isinstance(handed, GRPOTrainer) and list(handed.model.peft_config) == ["default"]


# --- 08.5 ---------------------------------------------------------------------------------------------------


def test_08_5_the_failure_column(capsys):
    assert nb08.check_08_failure_column(exercise("08", "answer_1"))
    assert not nb08.check_08_failure_column(exercise("08", "answer_1", copy="notebooks"))
    for wrong in ["tools/call_frequency", "failure_frequency", 0.0]:
        assert not nb08.check_08_failure_column(wrong)
    assert nb08.check_08_failure_column("`tools/failure_frequency`")


# --- Round two: limits on every intermediate result, any error a refusal, numpy rewards, late calls -----------

_OPERATIONS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
               ast.Pow: operator.pow}


def _exact(node, check_each, source=None):
    """Arithmetic on Fractions; ``check_each``: the magnitude limit on every intermediate result, not the last.

    A number is read from its text in ``source``; without it, from the float Python parsed (``str(node.value)``).
    """
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        value = Fraction(str(node.value) if source is None else ast.get_source_segment(source, node))  # 1e999 too
        if check_each and abs(value) > 10**15:
            raise ValueError("too large")
        return value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _exact(node.operand, check_each, source)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATIONS:
        left, right = _exact(node.left, check_each, source), _exact(node.right, check_each, source)
        if isinstance(node.op, ast.Pow) and (right.denominator != 1 or abs(right) > 64):
            raise ValueError("exponent")
        value = _OPERATIONS[type(node.op)](left, right)  # 1/0 raises ZeroDivisionError
        if check_each and abs(value) > 10**15:
            raise ValueError("too large")
        return value
    raise ValueError(f"not allowed: {type(node).__name__}")


def limit_on_the_result_only(expression: str) -> str:
    """Compute an arithmetic expression.

    Args:
        expression: The arithmetic to compute.
    """
    if not isinstance(expression, str) or len(expression) > MAX_EXPRESSION_CHARS:
        raise ValueError("not an expression")
    try:
        value = _exact(ast.parse(expression.strip(), mode="eval").body, check_each=False, source=expression.strip())
    except SyntaxError as error:
        raise ValueError("not arithmetic") from error
    if abs(value) > 10**15:
        raise ValueError("too large")
    return format_result(value)


def _limited(expression, numbers_from_the_text=True):
    """A right calculator that leaves 1/0 to Python's ZeroDivisionError; or, without ``numbers_from_the_text``,
    one that reads each number from the float Python parsed (``Fraction(str(node.value))``)."""
    if not isinstance(expression, str) or len(expression) > MAX_EXPRESSION_CHARS:
        raise ValueError("not an expression")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as error:
        raise ValueError("not arithmetic") from error
    if isinstance(tree.body, ast.Tuple):
        raise ValueError("no thousands commas")
    source = expression.strip() if numbers_from_the_text else None
    return format_result(_exact(tree.body, check_each=True, source=source))


def zero_division_left_to_python(expression: str) -> str:
    """Compute an arithmetic expression.

    Args:
        expression: The arithmetic to compute.
    """
    return _limited(expression)


def numbers_read_from_floats(expression: str) -> str:
    """Compute an arithmetic expression.

    Args:
        expression: The arithmetic to compute.
    """
    return _limited(expression, numbers_from_the_text=False)


def test_08_2_a_limit_checked_on_the_last_result_only_fails(capsys):
    """``((((9**64)**64)**64)**64)**64``: each exponent is allowed, the intermediates are not."""
    assert nb08.check_08_calculator(limit_on_the_result_only) is calculator
    out = verdict(capsys)
    assert "❌ 08.2" in out and "an intermediate result too large" in out, out


def test_08_2_division_by_zero_left_to_zerodivisionerror_passes(capsys):
    """TRL catches any error a tool raises and hands its message to the model: any error is a refusal."""
    assert nb08.check_08_calculator(zero_division_left_to_python) is zero_division_left_to_python, verdict(capsys)


def test_08_2_numbers_read_from_the_float_python_parsed_fail(capsys):
    """``Fraction(str(100000000000000.01))`` is ``...0.02``: the calculator answers 0.02 where the digits say 0.01."""
    assert calculator("100000000000000.01 - 100000000000000") == "0.01"
    assert numbers_read_from_floats("100000000000000.01 - 100000000000000") == "0.02"
    assert nb08.check_08_calculator(numbers_read_from_floats) is calculator
    out = verdict(capsys)
    assert "❌ 08.2" in out and "a long decimal, which a float rounds" in out and "'0.02'" in out, out


def used_anywhere(completions, answer, **kwargs):
    """Pays when a tool result appears in any assistant turn, before the call too."""
    rewards = []
    for completion, gold in zip(completions, answer, strict=True):
        messages = [m for m in completion if isinstance(m, dict)] if isinstance(completion, list) else []
        said = " ".join(str(m.get("content") or "") for m in messages if m.get("role") == "assistant")
        results = [str(m.get("content")).strip() for m in messages if m.get("role") == "tool"]
        right = answers_match(extract_xml_answer(completion_text(completion)), gold)
        used = [r for r in results if r and not r.startswith("{") and r in said.replace(",", "")]
        rewards.append(0.5 * len(used) / len(results) if right and results else 0.0)
    return rewards


def test_08_3_a_result_counted_as_used_before_its_call_fails(gsm8k_train, capsys):
    assert nb08.check_08_tool_reward(used_anywhere, gsm8k_train) is tool_use_reward
    out = verdict(capsys)
    assert "an assistant turn after the call writes it" in out, out


def test_08_3_a_numpy_array_of_rewards_passes(gsm8k_train, capsys):
    """TRL takes a 1-D array as it takes a list (check 03.8 too)."""
    import numpy as np

    def as_array(completions, answer, **kwargs):
        return np.array(tool_use_reward(completions, answer=answer, **kwargs))

    assert nb08.check_08_tool_reward(as_array, gsm8k_train) is not tool_use_reward, verdict(capsys)
    assert "✅ 08.3 tool-use reward" in verdict(capsys)


def drops_tool_turns_in_place(completions, answer, **kwargs):
    """The course's reward, after deleting the tool turns from TRL's completions in place."""
    for completion in completions:
        if isinstance(completion, list):
            completion[:] = [m for m in completion if not (isinstance(m, dict) and m.get("role") == "tool")]
    return tool_use_reward(completions, answer=answer, **kwargs)


def test_08_3_a_reward_that_changes_trl_s_completions_in_place_fails(gsm8k_train, capsys):
    """TRL hands the same completions to every reward: one that edits them changes what the others score."""
    assert nb08.check_08_tool_reward(drops_tool_turns_in_place, gsm8k_train) is tool_use_reward
    out = verdict(capsys)
    assert "❌ 08.3" in out and "changes its input in place, at ['completions']" in out, out
