"""benchmarks/bench_tools.py's lines: the tool lab's time and tool metrics from its log, each model's held-out line."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from course_utils.core.profiles import get_profile


@pytest.fixture(scope="module")
def bench(load_benchmark):
    return load_benchmark("bench_tools")


def test_the_lab_lines_read_the_last_logged_tool_metrics(bench):
    log = [{"step": 1, "tools/call_frequency": 0.5, "tools/failure_frequency": 0.25},
           {"step": 2, "tools/call_frequency": 0.375, "tools/failure_frequency": 0.0},
           {"train_runtime": 9.0}]  # fmt: skip
    result = SimpleNamespace(log_history=log, warm_start_seconds=120.0)
    values = dict(line.split(": ", 1) for line in bench.lab_lines(result, 10.5, get_profile("cpu")))
    assert values["tools_call_frequency_last"] == "0.375" and values["tools_failure_frequency_last"] == "0.000"
    assert values["tools_call_frequency_per_step"] == "0.50 0.38" and values["tools_warm_start_minutes"] == "2.0"
    assert values["tools_lab_minutes"] == "10.5" and "16 GRPO steps" in values["tools_lab_profile"]


def test_a_lab_that_logged_no_tool_metrics_is_an_error(bench):
    with pytest.raises(RuntimeError, match="no tools/call_frequency"):
        bench.lab_lines(SimpleNamespace(log_history=[{"loss": 1.0}], warm_start_seconds=0.0), 1.0, get_profile("ci"))


def test_model_lines_give_accuracy_interval_and_calls(bench):
    result = {"accuracy": 0.05, "accuracy_ci": (0.02, 0.09), "calls_per_problem": 1.25, "failure_frequency": 0.1,
              "format_score": 0.9, "mean_completion_tokens": 80.0}  # fmt: skip
    values = dict(line.split(": ", 1) for line in bench.model_lines("with_tool", result, 90.0))
    assert values["tools_heldout_accuracy_with_tool"] == "0.050"
    assert values["tools_heldout_accuracy_with_tool_ci"] == "0.020-0.090"
    assert (
        values["tools_heldout_calls_per_problem_with_tool"] == "1.250"
        and values["tools_heldout_minutes_with_tool"] == "1.5"
    )


def test_sampled_lines_give_each_pass_at_k_with_its_interval(bench):
    result = {"ks": [1, 4], "pass@1": 0.05, "pass@1_ci": (0.02, 0.08), "pass@4": 0.15, "pass@4_ci": (0.1, 0.2)}
    values = dict(line.split(": ", 1) for line in bench.sampled_lines("with_tool", result))
    assert values == {
        "tools_sampled_pass@1_with_tool": "0.050",
        "tools_sampled_pass@1_with_tool_ci": "0.020-0.080",
        "tools_sampled_pass@4_with_tool": "0.150",
        "tools_sampled_pass@4_with_tool_ci": "0.100-0.200",
    }


def _records(pass1: list[float]) -> dict:
    return {"records": [{"gold": str(i), "pass@1": value} for i, value in enumerate(pass1)]}


def test_difference_lines_pair_each_problem_second_minus_first(bench):
    sampled = {"notebook04": _records([0, 0, 0.5, 0]), "with_tool": _records([1, 0.5, 0.5, 0]),
               "tool_unavailable": _records([0, 0, 0, 0])}  # fmt: skip
    values = dict(line.split(": ", 1) for line in bench.difference_lines(sampled))
    assert values["tools_sampled_pass@1_difference_with_tool_minus_notebook04"] == "+0.375"
    assert values["tools_sampled_pass@1_difference_with_tool_minus_tool_unavailable"] == "+0.500"
    assert values["tools_sampled_pass@1_difference_tool_unavailable_minus_notebook04"] == "-0.125"
    low, high = values["tools_sampled_pass@1_difference_with_tool_minus_notebook04_ci"].split(" to ")
    assert float(low) <= 0.375 <= float(high)


def test_difference_lines_refuse_results_on_different_problems(bench):
    sampled = {"notebook04": _records([0, 1]), "with_tool": _records([1, 0, 1]), "tool_unavailable": _records([0, 0])}
    with pytest.raises(ValueError, match="not on the same problems"):
        bench.difference_lines(sampled)
