"""lesson.tool_use: the calculator tool on hostile input, GSM8K's notes as tool calls on every training row, and a
GRPOTrainer step with ``tools=[calculator]`` on the tiny Qwen2 (Qwen2.5's own template supports tools)."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer
from trl import GRPOConfig, GRPOTrainer

from course_utils.core.answer_format import extract_xml_answer
from course_utils.lesson.data import load_gsm8k
from course_utils.lesson.tiny_qwen import save_tiny_qwen
from course_utils.lesson.tool_use import (
    MAX_EXPRESSION_CHARS,
    TOOL_USE_REWARD,
    CalculatorError,
    calculator,
    note_result,
    tool_call_trace,
    tool_calls_used,
    tool_use_reward,
    trace_coverage,
)


@pytest.mark.parametrize(
    "expression, result",
    [("48/2", "24"), ("48 + 24", "72"), ("(3 + 4) * 2.5", "17.5"), ("0.1 + 0.2", "0.3"), ("7/3", "2.333333"),
     ("2**10", "1024"), ("-5 - 3", "-8"), ("2**-2", "0.25"), ("1e3/4", "250"), ("10/4*2", "5"), ("+7", "7")],
)  # fmt: skip
def test_the_calculator_computes_arithmetic_exactly(expression, result):
    assert calculator(expression) == result


@pytest.mark.parametrize(
    "hostile, message",
    [
        ('__import__("os").system("ls")', "not Call"),
        ("open('/etc/passwd').read()", "not Call"),
        ("x + 1", "not Name"),
        ("(1).__class__", "not Attribute"),
        ("[1, 2]", "not List"),
        ("'1' + '2'", "not Constant"),
        ("lambda: 1", "not Lambda"),
        ("1 if 2 else 3", "not IfExp"),
        ("3 % 2", "not BinOp"),
        ("7 // 2", "not BinOp"),
        ("1 < 2", "not Compare"),
        ("True + 1", "not Constant"),
        ("9**9**9", "too large"),
        ("10**20", "too large"),
        ("2**100000", "exponent too large"),
        ("2**0.5", "whole numbers"),
        ("0**-1", "division by zero"),
        ("1/0", "division by zero"),
        ("1/(2-2)", "division by zero"),
        ("1e308*10", "too large"),
        ("1,000 + 1", "thousands commas"),
        ("1 +", "not arithmetic"),
        ("", "not arithmetic"),
        ("9" * (MAX_EXPRESSION_CHARS + 1), "too long"),
        ("1" + "+1" * 200, "too long"),
    ],
)
def test_the_calculator_refuses_hostile_input_with_a_message_the_model_reads(hostile, message):
    with pytest.raises(CalculatorError, match=message):
        calculator(hostile)


@pytest.mark.parametrize("not_text", [None, 12, b"1+1", ["1+1"]])
def test_an_expression_that_is_not_text_is_refused(not_text):
    with pytest.raises(CalculatorError, match="must be text"):
        calculator(not_text)


def test_a_note_whose_result_differs_is_refused_by_name():
    assert note_result("48/2", "24") == "24" and note_result("1000*2", "2,000") == "2000"
    with pytest.raises(CalculatorError, match="the calculator gives 24, the note says 25"):
        note_result("48/2", "25")
    with pytest.raises(CalculatorError, match="not a number"):
        note_result("48/2", "24 clips")


def test_a_solution_becomes_calls_and_the_xml_answer():
    trace = tool_call_trace("Natalia sold 48/2 = <<48/2=24>>24 clips.\nIn all 48+24 = <<48+24=72>>72.\n#### 72", "72")
    roles = [m["role"] for m in trace.messages]
    assert roles == ["assistant", "tool", "assistant", "tool", "assistant"] and trace.calls == 2
    assert trace.messages[0]["content"] == "<reasoning>\nNatalia sold 48/2 = "
    assert trace.messages[0]["tool_calls"][0]["function"] == {"name": "calculator", "arguments": {"expression": "48/2"}}
    assert trace.messages[1] == {"role": "tool", "name": "calculator", "content": "24"}
    assert trace.messages[-1]["content"].endswith("72.\n</reasoning>\n<answer>\n72\n</answer>")
    assert extract_xml_answer(trace.messages[-1]["content"]) == "72" and trace.unparsed == []


def test_a_note_that_does_not_parse_stays_as_text_and_is_named():
    trace = tool_call_trace("Each costs $2 so 3*$2 = <<3*$2=6>>6 dollars.\n#### 6", "6")
    assert trace.calls == 0 and len(trace.messages) == 1
    assert trace.unparsed == ["<<3*$2=6>>: not arithmetic: '3*$2' (invalid syntax)"]
    assert "3*$2=6" in trace.messages[0]["content"] and "<<" not in trace.messages[0]["content"]


@pytest.mark.parametrize("bad", [(None, "6"), ("#### 6", 6)])
def test_a_trace_needs_text(bad):
    with pytest.raises(TypeError, match="must be text"):
        tool_call_trace(*bad)


def test_every_training_row_converts_and_the_notes_that_do_not_parse_are_few_and_named(gsm8k_env):
    rows = load_gsm8k("train", formatted=True, verbose=False)
    traces = [tool_call_trace(r["reasoning"], r["answer"]) for r in rows]
    calls = sum(t.calls for t in traces)
    unparsed = [note for t in traces for note in t.unparsed]
    assert calls > 10 * len(unparsed)  # the notes are arithmetic, nearly all reproduced by the calculator
    assert all(": " in note and note.startswith("<<") for note in unparsed)
    assert all(extract_xml_answer(t.messages[-1]["content"]) == r["answer"] for t, r in zip(traces, rows, strict=True))
    coverage = trace_coverage(rows)
    assert (coverage.rows, coverage.calls, len(coverage.unparsed)) == (len(rows), calls, len(unparsed))
    assert [note for _, note in coverage.unparsed] == unparsed
    assert all(note in traces[row].unparsed for row, note in coverage.unparsed)  # each named with its row
    assert f"{coverage.notes:,} notes, {calls:,} became calculator calls" in str(coverage)
    row, note = coverage.unparsed[0]
    assert f"  row {row + 1} (index {row}): {note}" in str(coverage).splitlines()  # counted as a person counts
    print(coverage)


def test_raw_rows_count_as_formatted_rows_do():
    raw = load_gsm8k("train", limit=20, verbose=False)
    formatted = load_gsm8k("train", formatted=True, limit=20, verbose=False)
    assert trace_coverage(raw).calls == trace_coverage(formatted).calls > 0
    assert trace_coverage([{"answer": "No notes here.\n#### 3"}]).parsed_share == 1.0


@pytest.mark.parametrize(
    "rows, error, message",
    [("a string", TypeError, "sequence of GSM8K rows"), ({"answer": "#### 1"}, TypeError, "sequence of GSM8K rows"),
     ([], ValueError, "empty"), ([["not", "a", "row"]], TypeError, "row 1 is a list"),
     ([{"question": "Q"}], ValueError, "row 1 has neither"), (7, TypeError, "sequence of GSM8K rows")],
)  # fmt: skip
def test_trace_coverage_refuses_what_is_not_gsm8k_rows(rows, error, message):
    with pytest.raises(error, match=message):
        trace_coverage(rows)


def _call(expression):
    return {"type": "function", "function": {"name": "calculator", "arguments": {"expression": expression}}}


def _completion(*turns):
    """Assistant and tool turns: a str is an assistant's text, ("call", expr, text) a call, ("tool", result)."""
    messages = []
    for turn in turns:
        if isinstance(turn, str):
            messages.append({"role": "assistant", "content": turn})
        elif turn[0] == "call":
            messages.append({"role": "assistant", "content": turn[2], "tool_calls": [_call(turn[1])]})
        else:
            messages.append({"role": "tool", "name": "calculator", "content": turn[1]})
    return messages


ANSWER_72 = "\n</reasoning>\n<answer>\n72\n</answer>"
USED = _completion(("call", "48+24", "<reasoning>\n48+24 = "), ("tool", "72"), "72 clips." + ANSWER_72)
IDLE = _completion(("call", "1+1", "<reasoning>\n"), ("tool", "2"), "48+24 is 72." + ANSWER_72)
REFUSED = _completion(("call", "x", "<reasoning>\n"), ("tool", "{'error': 'not Name'}"), "72." + ANSWER_72)
HALF_USED = _completion(("call", "48+24", "<reasoning>\n"), ("tool", "72"), ("call", "9*9", "72 and "),
                        ("tool", "81"), "so" + ANSWER_72)  # fmt: skip
WRONG = _completion(("call", "48+25", "<reasoning>\n48+25 = "), ("tool", "73"), "73." + ANSWER_72.replace("72", "73"))


@pytest.mark.parametrize(
    "completion, reward",
    [(USED, TOOL_USE_REWARD), (IDLE, 0.0), (REFUSED, 0.0), (HALF_USED, TOOL_USE_REWARD / 2), (WRONG, 0.0),
     (_completion("<reasoning>\n48+24 = 72" + ANSWER_72), 0.0), ("<reasoning>\n72" + ANSWER_72, 0.0)],
)  # fmt: skip
def test_the_tool_use_reward_pays_only_for_used_results_in_right_answers(completion, reward):
    assert tool_use_reward([completion], answer=["72"]) == [reward]


ANSWER_12 = "\n</reasoning>\n<answer>\n12\n</answer>"


def test_an_idle_call_whose_result_is_digits_inside_the_answer_earns_nothing():
    """calculator('1+1') -> '2', then a right answer 12: the 2 in 12 is a digit, not the result written as a number."""
    idle = _completion(("call", "1+1", "<reasoning>\n"), ("tool", "2"), "Ten and two make 12." + ANSWER_12)
    assert "2" in idle[-1]["content"] and tool_calls_used(idle) == (1, 0)
    assert tool_use_reward([idle], answer=["12"]) == [0.0]
    used = _completion(("call", "10+2", "<reasoning>\n10+2 = "), ("tool", "12"), "12." + ANSWER_12)
    assert tool_use_reward([used], answer=["12"]) == [TOOL_USE_REWARD]  # the same answer from the tool's result pays


@pytest.mark.parametrize(
    ("result", "later", "used"),
    [("24", "72-24=48", 1), ("-24", "72-24=48", 0), ("-8", "so it is -8", 1), ("2", "3-(1)-2 is 0", 1),
     ("12", "then 1,2 and 3", 0), ("1200", "1,200 in all", 1), ("2", "1,2345", 0), ("2.5", "2.5.", 1)],
)  # fmt: skip
def test_a_result_is_used_when_the_text_writes_that_number(result, later, used):
    """A minus right after a digit is a subtraction, and commas group thousands only: numbers as a reader reads them."""
    completion = _completion(("call", "x", "<reasoning>\n"), ("tool", result), later + ANSWER_72)
    assert tool_calls_used(completion) == (1, used)


def test_calling_for_nothing_never_beats_a_used_call():
    padded = [*USED[:-1], *_completion(("call", "2+2", "72 clips. "), ("tool", "4")), USED[-1]]
    assert tool_calls_used(padded) == (2, 1)
    assert tool_use_reward([padded], answer=["72"])[0] < tool_use_reward([USED], answer=["72"])[0]


@pytest.mark.parametrize(
    "completions, answer, error",
    [("text", ["72"], TypeError), ({"role": "assistant"}, ["72"], TypeError), (None, ["72"], TypeError),
     ([USED], None, ValueError), ([USED], "72", ValueError), ([USED, USED], ["72"], ValueError)],
)  # fmt: skip
def test_the_tool_use_reward_refuses_calls_that_do_not_pair_up(completions, answer, error):
    with pytest.raises(error):
        tool_use_reward(completions, answer=answer)


@pytest.fixture(scope="module")
def tiny_qwen(tmp_path_factory):
    return save_tiny_qwen(tmp_path_factory.mktemp("tiny") / "qwen")


def test_qwen25s_template_renders_the_calls_and_the_tools_answers(tiny_qwen):
    tokenizer = AutoTokenizer.from_pretrained(tiny_qwen)
    trace = tool_call_trace("Half of 48 is 48/2 = <<48/2=24>>24.\n#### 24", "24")
    text = tokenizer.apply_chat_template([{"role": "user", "content": "Q"}, *trace.messages], tools=[calculator],
                                         tokenize=False)  # fmt: skip
    assert '<tool_call>\n{"name": "calculator", "arguments": {"expression": "48/2"}}\n</tool_call>' in text
    assert "<|im_start|>user\n<tool_response>\n24\n</tool_response><|im_end|>" in text
    assert '"description": "Compute an arithmetic expression exactly' in text.split("\n</tools>")[0]  # its docstring


def test_grpo_trains_a_step_with_the_calculator_as_a_tool(tiny_qwen, tmp_path):
    from transformers import AutoModelForCausalLM

    from course_utils.lesson.rewards import REWARD_FUNCS

    rows = load_gsm8k("train", formatted=True, limit=2, verbose=False)
    config = GRPOConfig(
        output_dir=str(tmp_path), num_generations=2, per_device_train_batch_size=2, max_completion_length=16,
        max_steps=1, max_tool_calling_iterations=2, logging_steps=1, save_strategy="no", report_to=[], use_cpu=True,
        bf16=False, learning_rate=1e-4, seed=0, activation_checkpointing=False,
    )  # fmt: skip
    model = AutoModelForCausalLM.from_pretrained(tiny_qwen)
    tokenizer = AutoTokenizer.from_pretrained(tiny_qwen)
    trainer = GRPOTrainer(model=model, reward_funcs=list(REWARD_FUNCS), args=config, train_dataset=rows,
                          processing_class=tokenizer, tools=[calculator])  # fmt: skip
    trainer.train()
    logged = trainer.state.log_history[0]
    assert trainer.state.global_step == 1
    assert 0.0 <= logged["tools/call_frequency"] <= 1.0 and 0.0 <= logged["tools/failure_frequency"] <= 1.0


@pytest.mark.parametrize(
    ("expression", "result"),
    [("100000000000000.01-100000000000000", "0.01"), ("123456789012345.123456 - 123456789012345", "0.123456"),
     ("0.1+0.2", "0.3"), ("-1/3", "-0.333333"), ("1_000*2", "2000"), ("1e3/8", "125")],
)  # fmt: skip
def test_the_calculator_is_exact_on_long_decimals(expression, result):
    """Numbers are read from their text, not from the float Python parses them to (which rounds long decimals)."""
    assert calculator(expression) == result


@pytest.mark.parametrize("expression", ["0x10 + 1", "0b11", "0o7*2"])
def test_the_calculator_refuses_numbers_not_written_in_decimal(expression):
    """Python parses 0x10 as 16, but its text is no decimal: the model reads why, not Fraction's own error."""
    with pytest.raises(CalculatorError, match="write numbers in decimal digits"):
        calculator(expression)
