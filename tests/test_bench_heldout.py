"""benchmarks/bench_heldout.py's lines: each model's held-out figures, strict and lenient, with intervals."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def bench(load_benchmark):
    return load_benchmark("bench_heldout")


def greedy(accuracy: float, lenient: float) -> dict:
    return {"accuracy": accuracy, "accuracy_ci": (accuracy / 2, accuracy * 2), "lenient_accuracy": lenient,
            "format_score": 0.5, "mean_completion_tokens": 24.0}  # fmt: skip


def sampled(pass1: float, pass8: float, maj8: float) -> dict:
    figures = {"pass@1": pass1, "pass@8": pass8, "maj@8": maj8}
    return {**figures, **{f"{key}_ci": (value / 2, value * 2) for key, value in figures.items()}}


def test_stage_lines_give_greedy_strict_and_lenient_then_the_sampled_rates(bench):
    lines = bench.stage_lines("grpo", greedy(0.04, 0.06), sampled(0.027, 0.145, 0.03))
    values = dict(line.split(": ", 1) for line in lines)
    assert values["heldout_greedy_grpo"] == "0.040" and values["heldout_greedy_grpo_ci"] == "0.020-0.080"
    assert values["heldout_lenient_grpo"] == "0.060"
    assert values["heldout_pass1_grpo"] == "0.027" and values["heldout_pass8_grpo"] == "0.145"
    assert values["heldout_maj8_grpo_ci"] == "0.015-0.060"
    assert values["heldout_mean_tokens_grpo"] == "24.0"


def test_the_curve_samples_each_earlier_checkpoint_against_the_warm_start(bench, gsm8k_env) -> None:
    """A real 2-step ci run saved at every step: one curve line (step 1), its minutes from the clock, a difference
    whose interval holds it; the last step is left to the main lines."""
    from course_utils.core.profiles import get_profile
    from course_utils.evaluation.heldout import heldout_set
    from course_utils.training import lab

    profile = get_profile("ci").override(save_steps=1)
    clock = bench.SaveClock(bench.time.perf_counter())
    result = lab.run_training(profile, callbacks=[clock])
    assert sorted(clock.minutes) == [1, 2] and all(minutes >= 0 for minutes in clock.minutes.values())
    problems = heldout_set(2)
    warm_model, tokenizer = bench.load_warm_start_model(profile, result.run_dir)
    warm = bench.sample_stage(warm_model, tokenizer, problems, profile)
    lines = bench.curve_lines(profile, result.run_dir, problems, warm, clock.minutes, last_step=2)
    assert len(lines) == 1 and lines[0].startswith("heldout_curve_step_1: minutes ")
    difference = float(lines[0].split("difference ")[1].split(" ")[0])
    low, high = (float(x) for x in lines[0].split("(")[1].rstrip(")").split(" to "))
    assert low <= difference <= high and -1 <= difference <= 1
    assert bench.curve_lines(profile, result.run_dir, problems, warm, clock.minutes, last_step=1) == []


def test_the_curve_keeps_every_checkpoint_and_the_seed_reaches_the_config(bench):
    args = bench.argparse.Namespace(seed=None, curve=False)
    assert bench.config_overrides(args) == {}
    args.seed, args.curve = 1, True
    assert bench.config_overrides(args) == {"seed": 1, "save_total_limit": None}


def test_lab_problem_lines_sample_the_profiles_own_training_problems(bench, gsm8k_env) -> None:
    """One real model as both stages: as many problems as the profile trains on, equal rates, a difference of 0."""
    from course_utils.core.profiles import get_profile
    from course_utils.training.run import load_model_for_training

    profile = get_profile("ci").override(train_size=3)
    model, tokenizer = load_model_for_training(profile)
    lines = bench.lab_problem_lines(profile, {"warm_start": model, "grpo": model}, tokenizer)
    values = dict(line.split(": ", 1) for line in lines)
    assert list(values) == ["lab_problems", "lab_problems_pass1_warm_start", "lab_problems_pass1_grpo",
                            "lab_problems_pass1_difference", "lab_problems_pass1_difference_ci"]  # fmt: skip
    assert values["lab_problems"] == "3"
    assert values["lab_problems_pass1_warm_start"] == values["lab_problems_pass1_grpo"]
    assert 0 <= float(values["lab_problems_pass1_grpo"]) <= 1
    assert values["lab_problems_pass1_difference"] == "+0.0000"
    assert values["lab_problems_pass1_difference_ci"] == "+0.0000 to +0.0000"


def records(*pass1: float) -> dict:
    return {"records": [{"gold": str(index), "pass@1": value} for index, value in enumerate(pass1)]}


def test_difference_lines_give_grpo_minus_the_warm_start_paired_by_problem(bench) -> None:
    lines = bench.difference_lines("heldout_pass1", records(0.0, 0.25, 0.5), records(0.25, 0.25, 1.0))
    values = dict(line.split(": ", 1) for line in lines)
    assert list(values) == ["heldout_pass1_difference", "heldout_pass1_difference_ci"]
    assert values["heldout_pass1_difference"] == "+0.2500"
    low, high = (float(side) for side in values["heldout_pass1_difference_ci"].split(" to "))
    assert 0 <= low <= 0.25 <= high <= 0.5


def test_difference_lines_refuse_results_on_other_problems(bench) -> None:
    with pytest.raises(ValueError, match="not on the same problems"):
        bench.difference_lines("heldout_pass1", records(0.0, 0.5), records(0.5))
