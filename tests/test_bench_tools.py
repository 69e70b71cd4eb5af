"""benchmarks/bench_tools.py's lines: the tool lab's time and tool metrics from its log, the tool reward's mean and the
budget's cut over training, how the traces fit the budget, each arm's held-out lines and the paired differences."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from course_utils.core.profiles import get_profile
from course_utils.evaluation.metrics import score_completions
from course_utils.evaluation.tool_eval import ARM_LINES, ARMS, DIFFERENCE_LINES, DIFFERENCES


@pytest.fixture(scope="module")
def bench(load_benchmark):
    return load_benchmark("bench_tools")


def _values(lines: list[str]) -> dict[str, str]:
    return dict(line.split(": ", 1) for line in lines)


def test_the_lab_lines_read_the_tool_metrics_the_tool_reward_and_the_clipped_ratio(bench):
    log = [{"step": 1, "reward": 0.5, "tools/call_frequency": 0.5, "tools/failure_frequency": 0.25,
            "rewards/tool_use_reward/mean": 0.0, "completions/clipped_ratio": 0.25},
           {"step": 2, "reward": 0.7, "tools/call_frequency": 0.375, "tools/failure_frequency": 0.0,
            "rewards/tool_use_reward/mean": 0.125, "completions/clipped_ratio": 0.125},
           {"train_runtime": 9.0}]  # fmt: skip
    result = SimpleNamespace(log_history=log, warm_start_seconds=120.0)
    values = _values(bench.lab_lines(result, 10.5, get_profile("cpu")))
    assert values["tools_call_frequency_last"] == "0.375" and values["tools_failure_frequency_last"] == "0.000"
    assert values["tools_call_frequency_per_step"] == "0.50 0.38" and values["tools_warm_start_minutes"] == "2.0"
    assert values["tools_lab_minutes"] == "10.5" and "16 GRPO steps" in values["tools_lab_profile"]
    assert values["tools_tool_reward_mean_over_training"] == "0.0625"
    assert values["tools_tool_reward_steps_above_0"] == "1 of 2"
    assert values["tools_training_clipped_ratio_with_tool"] == "0.188 (mean of 2 steps)"


def test_a_lab_that_logged_no_tool_metrics_is_an_error(bench):
    with pytest.raises(RuntimeError, match="no tools/call_frequency"):
        bench.lab_lines(SimpleNamespace(log_history=[{"loss": 1.0}], warm_start_seconds=0.0), 1.0, get_profile("ci"))


def test_the_trace_lines_give_the_share_of_traces_over_the_budget(bench, monkeypatch):
    lengths = iter([50, 190, 210, 230])
    monkeypatch.setattr(bench, "trace_dataset", lambda profile, tokenizer: [{}, {}, {}, {}])
    monkeypatch.setattr(bench, "trace_completion_tokens", lambda tokenizer, row: next(lengths))
    values = _values(bench.trace_lines(get_profile("cpu").override(tool_max_completion_length=200), None))
    assert values["tools_traces_over_budget"] == "0.500 (2 of 4 traces longer than 200 tokens)"
    assert values["tools_trace_tokens"] == "50-230 (median 210)"


def _greedy(texts: list[str], golds: list[str], truncated: list[bool] | None = None) -> dict:
    result = score_completions(texts, golds, questions=[f"q{i}" for i in range(len(texts))], truncated=truncated)
    return result | {"calls_per_problem": 1.25, "failure_frequency": 0.1, "ending_in_call_share": 0.5}


def right(answer: str) -> str:
    return f"<reasoning>\nso\n</reasoning>\n<answer>\n{answer}\n</answer>"


def test_model_lines_give_accuracy_interval_format_truncation_and_calls(bench):
    result = _greedy([right("1"), right("9"), "cut sho"], ["1", "2", "3"], truncated=[False, False, True])
    values = _values(bench.model_lines("with_tool", result, 90.0))
    assert values[ARM_LINES["greedy"].format(arm="with_tool")] == "0.333"
    assert (
        values["tools_heldout_format_with_tool"] == "0.667" and values["tools_heldout_truncation_with_tool"] == "0.333"
    )
    assert (
        values["tools_heldout_calls_per_problem_with_tool"] == "1.250"
        and values["tools_heldout_minutes_with_tool"] == "1.5"
    )
    assert values["tools_heldout_ending_in_call_with_tool"] == "0.500"
    assert "-" in values["tools_heldout_accuracy_with_tool_ci"]


def test_sampled_lines_give_each_pass_at_k_with_its_interval_truncation_and_format(bench):
    result = {"ks": [1, 4], "pass@1": 0.05, "pass@1_ci": (0.02, 0.08), "pass@4": 0.15, "pass@4_ci": (0.1, 0.2),
              "truncation_rate": 0.125, "format_score": 0.75}  # fmt: skip
    assert _values(bench.sampled_lines("with_tool", result)) == {
        "tools_sampled_pass@1_with_tool": "0.050",
        "tools_sampled_pass@1_with_tool_ci": "0.020-0.080",
        "tools_sampled_pass@4_with_tool": "0.150",
        "tools_sampled_pass@4_with_tool_ci": "0.100-0.200",
        "tools_sampled_truncation_with_tool": "0.125",
        "tools_sampled_format_with_tool": "0.750",
    }


def _sampled(pass1: list[float]) -> dict:
    return {"records": [{"gold": str(i), "pass@1": value} for i, value in enumerate(pass1)]}


def test_difference_lines_pair_each_problem_first_minus_second(bench):
    golds = ["0", "1", "2", "3"]
    greedy = {"with_tool": _greedy([right("0"), right("1"), right("x"), right("x")], golds),
              "same_recipe_no_tool": _greedy([right("x"), right("x"), right("x"), right("3")], golds),
              "tool_model_no_tool": _greedy([right("x")] * 4, golds)}  # fmt: skip
    sampled = {"with_tool": _sampled([1, 0.5, 0.5, 0]), "same_recipe_no_tool": _sampled([0, 0, 0.5, 0]),
               "tool_model_no_tool": _sampled([0, 0, 0, 0])}  # fmt: skip
    values = _values(bench.difference_lines(greedy, sampled))
    assert values["tools_pass1_with_tool_minus_same_recipe_no_tool"] == "+0.375"
    assert values["tools_pass1_with_tool_minus_tool_model_no_tool"] == "+0.500"
    assert values["tools_pass1_tool_model_no_tool_minus_same_recipe_no_tool"] == "-0.125"
    assert values["tools_greedy_with_tool_minus_same_recipe_no_tool"] == "+0.250"
    assert values["tools_only_with_tool_right_vs_same_recipe_no_tool"] == "2"
    assert values["tools_only_same_recipe_no_tool_right_vs_with_tool"] == "1"
    low, high = values["tools_pass1_with_tool_minus_same_recipe_no_tool_ci"].split(" to ")
    assert float(low) <= 0.375 <= float(high)
    for first, second in DIFFERENCES:  # every line the notebook reads is written
        assert all(template.format(first=first, second=second) in values for template in DIFFERENCE_LINES.values())


def test_difference_lines_without_sampling_give_the_greedy_differences_only(bench):
    greedy = {arm: _greedy([right("1")], ["1"]) for arm in ARMS}
    values = _values(bench.difference_lines(greedy, {}))
    assert values["tools_greedy_with_tool_minus_same_recipe_no_tool"] == "+0.000"
    assert not any(name.startswith("tools_pass1_") for name in values)


def test_difference_lines_refuse_results_on_different_problems(bench):
    greedy = {arm: _greedy([right("1")], ["1"]) for arm in ARMS}
    sampled = {"with_tool": _sampled([0, 1]), "same_recipe_no_tool": _sampled([1, 0, 1]),
               "tool_model_no_tool": _sampled([0, 0])}  # fmt: skip
    with pytest.raises(ValueError, match="not on the same problems"):
        bench.difference_lines(greedy, sampled)
