"""evaluation.tool_eval: calls run as TRL runs them, the loop's budget and rounds, greedy and sampled scoring with a
tool, the comparison table, and bad input to every helper.

The loop is tested on a scripted model (``CallingModel``): it writes a call, then the answer it read back, as a
tool-trained model does, so every branch runs; TRL's parser and Qwen2.5's template run for real. The real tiny Qwen2
runs the greedy and sampled paths end to end.
"""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from course_utils.core.profiles import get_profile
from course_utils.evaluation import tool_eval
from course_utils.evaluation.tool_eval import (
    ARMS,
    DIFFERENCES,
    MISSING,
    call_tool,
    describe_differences,
    evaluate_sampled_with_tool,
    evaluate_with_tool,
    measured_tool_table,
    tool_generate,
    tool_suffix_ids,
    tool_table,
)
from course_utils.lesson.formatting import build_prompt
from course_utils.lesson.tiny_qwen import save_tiny_qwen
from course_utils.lesson.tool_use import CalculatorError, calculator
from course_utils.training.tool_lab import tool_tokenizer

REFUSAL = "the calculator is switched off"


def refusing_calculator(expression: str) -> str:
    """Compute an arithmetic expression.

    Args:
        expression: The arithmetic to compute.
    """
    raise CalculatorError(REFUSAL)


CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "48/2"}}\n</tool_call><|im_end|>'
ANSWER = "<reasoning>\nHalf is {result}.\n</reasoning>\n<answer>\n24\n</answer><|im_end|>"


@pytest.fixture(scope="module")
def tiny_qwen(tmp_path_factory):
    return save_tiny_qwen(tmp_path_factory.mktemp("tiny") / "qwen")


@pytest.fixture(scope="module")
def tokenizer(tiny_qwen):
    return tool_tokenizer(
        AutoTokenizer.from_pretrained(tiny_qwen), get_profile("ci").override(tool_chat_template="own")
    )


class CallingModel(torch.nn.Module):
    """Writes a call until it has read ``calls`` tool answers, then the answer, quoting the last tool answer."""

    def __init__(self, tokenizer, calls: int = 1):
        super().__init__()
        self.tokenizer, self.calls = tokenizer, calls

    def generate(self, input_ids, attention_mask, max_new_tokens, **kwargs):
        replies = []
        for row, mask in zip(input_ids, attention_mask, strict=True):
            text = self.tokenizer.decode(row[mask.bool()])
            answers = text.split("<tool_response>\n")[1:]
            reply = CALL if len(answers) < self.calls else ANSWER.format(result=answers[-1].split("\n")[0])
            replies.append(self.tokenizer(reply, add_special_tokens=False)["input_ids"][:max_new_tokens])
        width = max(len(r) for r in replies)
        pad = self.tokenizer.pad_token_id
        new = torch.tensor([r + [pad] * (width - len(r)) for r in replies])
        return torch.cat([input_ids, new], dim=1)


def _rows(n=2):
    return [
        {"prompt": build_prompt(f"What is half of 48? ({i})"), "answer": "24", "question": f"q{i}"} for i in range(n)
    ]


def test_a_call_runs_as_trl_runs_it():
    call = {"type": "function", "function": {"name": "calculator", "arguments": {"expression": "48/2"}}}
    assert call_tool(calculator, call) == ("24", False)
    assert call_tool(refusing_calculator, call) == (str({"error": REFUSAL}), True)
    other = {"type": "function", "function": {"name": "search", "arguments": {}}}
    assert call_tool(calculator, other) == (str({"error": "Tool search not found."}), True)
    wrong_arguments = {"type": "function", "function": {"name": "calculator", "arguments": {"x": "1"}}}
    assert call_tool(calculator, wrong_arguments)[1] is True
    assert call_tool(calculator, {"type": "retrieval"})[1] is True


def test_the_tool_turns_follow_the_templates_own_rendering(tokenizer):
    suffix = tool_suffix_ids(tokenizer, [{"role": "tool", "name": "calculator", "content": "24"}])
    assert tokenizer.decode(suffix) == "\n<|im_start|>user\n<tool_response>\n24\n</tool_response><|im_end|>\n" \
                                       "<|im_start|>assistant\n"  # fmt: skip


def test_a_call_is_answered_and_the_model_goes_on_from_the_answer(tokenizer):
    [rollout] = tool_generate(CallingModel(tokenizer), tokenizer, [build_prompt("Half of 48?")], max_new_tokens=128)
    assert [m["role"] for m in rollout.messages] == ["assistant", "tool", "assistant"]
    assert rollout.messages[0]["tool_calls"][0]["function"]["arguments"] == {"expression": "48/2"}
    assert rollout.messages[1]["content"] == "24" and "Half is 24." in rollout.text
    assert (rollout.calls, rollout.failures, rollout.truncated) == (1, 0, False) and 0 < rollout.tokens <= 128


def test_a_refused_call_answers_with_the_error(tokenizer):
    [rollout] = tool_generate(CallingModel(tokenizer), tokenizer, [build_prompt("Half of 48?")],
                              refusing_calculator, max_new_tokens=128)  # fmt: skip
    assert REFUSAL in rollout.messages[1]["content"] and (rollout.calls, rollout.failures) == (1, 1)


def test_rounds_of_calls_stop_at_max_calls_and_the_budget_holds(tokenizer):
    always = CallingModel(tokenizer, calls=99)
    [rollout] = tool_generate(always, tokenizer, [build_prompt("Q")], max_new_tokens=400, max_calls=2)
    assert rollout.calls == 2 and rollout.messages[-1].get("tool_calls")  # the third call is left unanswered
    [short] = tool_generate(always, tokenizer, [build_prompt("Q")], max_new_tokens=40, max_calls=5)
    assert short.truncated and short.tokens <= 40


def test_greedy_evaluation_with_a_tool_counts_calls_and_failures(tokenizer):
    with_tool = evaluate_with_tool(CallingModel(tokenizer), tokenizer, _rows(3), batch_size=2, max_new_tokens=128)
    without = evaluate_with_tool(CallingModel(tokenizer), tokenizer, _rows(3), refusing_calculator, batch_size=2,
                                 max_new_tokens=128)  # fmt: skip
    assert (
        with_tool["accuracy"] == 1.0 and with_tool["calls_per_problem"] == 1.0 and with_tool["failure_frequency"] == 0
    )
    assert without["failure_frequency"] == 1.0 and without["tool"] == "refusing_calculator"
    assert [r["calls"] for r in with_tool["records"]] == [1, 1, 1]
    models, pairs = tool_table({"with": with_tool, "without": without})
    assert list(models.index) == ["with", "without"] and pairs.loc["with minus without", "McNemar p"] == 1.0
    assert models.loc["with", "truncated"] == 0.0 and "format" in models.columns


class RecordingModel(CallingModel):
    """``CallingModel`` that keeps the text of every row it was asked to continue."""

    def __init__(self, tokenizer, calls: int = 1):
        super().__init__(tokenizer, calls)
        self.seen = []

    def generate(self, input_ids, attention_mask, max_new_tokens, **kwargs):
        self.seen += [self.tokenizer.decode(row[mask.bool()]) for row, mask in zip(input_ids, attention_mask,
                                                                                    strict=True)]  # fmt: skip
        return super().generate(input_ids, attention_mask, max_new_tokens, **kwargs)


def test_no_tool_offered_means_no_schema_and_a_call_left_unanswered(tokenizer):
    """As GRPOTrainer without tools=: the prompt names no tool, and a call the model writes anyway ends it."""
    model = RecordingModel(tokenizer)
    [rollout] = tool_generate(model, tokenizer, [build_prompt("Half of 48?")], None, max_new_tokens=128)
    assert len(model.seen) == 1 and "<tools>" not in model.seen[0] and "calculator" not in model.seen[0]
    assert rollout.calls == 0 and rollout.ends_in_call and not rollout.truncated
    result = evaluate_with_tool(CallingModel(tokenizer), tokenizer, _rows(2), None, max_new_tokens=128)
    assert result["tool"] == "none" and result["ending_in_call_share"] == 1.0 and result["accuracy"] == 0.0
    offered = RecordingModel(tokenizer)
    tool_generate(offered, tokenizer, [build_prompt("Half of 48?")], max_new_tokens=128)
    assert "<tools>" in offered.seen[0] and "calculator" in offered.seen[0]


def test_the_three_arms_get_their_labels_and_paired_differences(tokenizer):
    answered = evaluate_with_tool(CallingModel(tokenizer), tokenizer, _rows(3), max_new_tokens=128)
    unanswered = evaluate_with_tool(CallingModel(tokenizer), tokenizer, _rows(3), None, max_new_tokens=128)
    greedy = {"with_tool": answered, "same_recipe_no_tool": unanswered, "tool_model_no_tool": unanswered}
    models, differences = tool_table(greedy)
    assert list(models.index) == list(ARMS.values())
    assert models.loc[ARMS["same_recipe_no_tool"], "ending in a call"] == 1.0
    first, second = DIFFERENCES[0]
    row = differences.loc[f"{ARMS[first]} minus {ARMS[second]}"]
    assert row["greedy difference"] == 1.0 and row["only first"] == 3 and row["only second"] == 0
    assert len(differences) == len(DIFFERENCES)
    with pytest.raises(ValueError, match="names a model greedy lacks"):
        tool_table(greedy, differences=[("with_tool", "notebook04")])


def test_the_measured_table_reads_the_bench_lines_and_names_the_missing(monkeypatch):
    written = {"tools_heldout_accuracy_with_tool": "0.120", "tools_pass1_with_tool_minus_same_recipe_no_tool": "+0.010",
               "tools_pass1_with_tool_minus_same_recipe_no_tool_ci": "-0.005 to +0.025"}  # fmt: skip
    monkeypatch.setattr(
        tool_eval, "bench_figures", lambda names, results: {n: written[n] for n in names if n in written}
    )
    models, differences, missing = measured_tool_table()
    assert models.loc[ARMS["with_tool"], "greedy"] == "0.120"
    assert models.loc[ARMS["same_recipe_no_tool"], "greedy"] == MISSING
    label = f"{ARMS['with_tool']} minus {ARMS['same_recipe_no_tool']}"
    assert differences.loc[label, "pass@1 95% CI"] == "-0.005 to +0.025"
    assert "tools_heldout_accuracy_same_recipe_no_tool" in missing and not set(written) & set(missing)


def test_the_real_tiny_qwen_runs_greedy_and_sampled(tiny_qwen, tokenizer):
    model = AutoModelForCausalLM.from_pretrained(tiny_qwen)
    greedy = evaluate_with_tool(model, tokenizer, _rows(2), max_new_tokens=8)
    torch.manual_seed(0)
    sampled = evaluate_sampled_with_tool(model, tokenizer, _rows(2), samples=2, ks=(1, 2), max_new_tokens=8)
    assert greedy["n"] == 2 and all(r["tokens"] <= 8 for r in greedy["records"])
    assert len(sampled["records"]) == 2 and 0.0 <= sampled["pass@1"] <= sampled["pass@2"] <= 1.0
    assert 0.0 <= sampled["format_score"] <= 1.0 and 0.0 <= sampled["truncation_rate"] <= 1.0
    models, _ = tool_table({"tiny": greedy}, {"tiny": sampled})
    assert {"pass@1", "pass@2", "pass@2 95% CI", "greedy 95% CI", "sampled truncated"} <= set(models.columns)


@pytest.mark.parametrize(
    "kwargs, error, message",
    [({"max_new_tokens": 0}, ValueError, "max_new_tokens"), ({"max_calls": 0}, ValueError, "max_calls"),
     ({"tool": "calculator"}, TypeError, "must be a function"), ({"tool": lambda a, b: a}, TypeError, "one argument")],
)  # fmt: skip
def test_tool_generation_refuses_bad_settings(tokenizer, kwargs, error, message):
    with pytest.raises(error, match=message):
        tool_generate(CallingModel(tokenizer), tokenizer, [build_prompt("Q")], **kwargs)


def test_a_tokenizer_without_a_tool_parser_is_refused(tiny_qwen):
    plain = AutoTokenizer.from_pretrained(tiny_qwen)
    with pytest.raises(ValueError, match="no parser for tool calls"):
        tool_generate(CallingModel(plain), plain, [build_prompt("Q")])


@pytest.mark.parametrize(
    "kwargs, message",
    [({"samples": 0}, "samples"), ({"ks": (3,)}, "ks must be"), ({"ks": ()}, "ks must be"),
     ({"prompts_per_batch": 0}, "prompts_per_batch")],
)  # fmt: skip
def test_sampled_evaluation_refuses_bad_settings(tokenizer, kwargs, message):
    with pytest.raises(ValueError, match=message):
        evaluate_sampled_with_tool(CallingModel(tokenizer), tokenizer, _rows(1), **({"samples": 2} | kwargs))


def test_evaluation_refuses_rows_without_prompts_and_tables_of_other_problems(tokenizer):
    with pytest.raises(ValueError, match="no chat 'prompt'"):
        evaluate_with_tool(CallingModel(tokenizer), tokenizer, [{"prompt": "text", "answer": "1"}])
    with pytest.raises(ValueError, match="batch_size"):
        evaluate_with_tool(CallingModel(tokenizer), tokenizer, _rows(1), batch_size=0)
    one = evaluate_with_tool(CallingModel(tokenizer), tokenizer, _rows(1), max_new_tokens=128)
    two = evaluate_with_tool(CallingModel(tokenizer), tokenizer, _rows(2), max_new_tokens=128)
    with pytest.raises(ValueError, match="same set"):
        tool_table({"one": one, "two": two})
    with pytest.raises(ValueError, match="at least one"):
        tool_table({})


def test_the_differences_are_described_by_where_their_interval_lies():
    import pandas as pd

    columns = {
        "greedy difference": ["+0.050", -0.04, MISSING],
        "greedy 95% CI": ["+0.010 to +0.090", (-0.07, -0.01), MISSING],
        "pass@1 difference": [0.01, float("nan"), "+0.000"],
        "pass@1 95% CI": ["-0.005 to +0.025", None, "-0.010 to +0.010"],
    }
    frame = pd.DataFrame(columns, index=["a minus b", "a minus c", "c minus b"])
    said = describe_differences(frame)
    assert said[0] == "a minus b, greedy accuracy: +0.050 (paired 95% interval +0.010 to +0.090); the interval lies " \
                      "above 0: higher on these problems."  # fmt: skip
    assert "spans 0" in said[1] and "lies below 0" in said[2] and said[3] == "a minus c, sampled pass@1: not measured."
    assert said[4] == "c minus b, greedy accuracy: not measured." and "spans 0" in said[5]
    with pytest.raises(ValueError, match="interval must be"):
        describe_differences(pd.DataFrame({"greedy difference": [0.1], "greedy 95% CI": ["0.1-0.2"]}, index=["x"]))
