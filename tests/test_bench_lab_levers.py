"""benchmarks/bench_lab_levers.py: every lever makes a config TRL accepts, and a run's lines read its log."""

from __future__ import annotations

import pytest

from course_utils.core.profiles import get_profile
from course_utils.training.grpo_config import make_grpo_config


@pytest.fixture(scope="module")
def bench(load_benchmark):
    return load_benchmark("bench_lab_levers")


def test_every_lever_builds_a_grpo_config_that_differs_from_the_lab_only_where_it_says(bench, tmp_path):
    lab = make_grpo_config("cpu", output_dir=tmp_path)
    fields = ("max_completion_length", "num_generations", "steps_per_generation",
              "use_transformers_continuous_batching")  # fmt: skip
    for name, (changes, overrides) in bench.LEVERS.items():
        config = make_grpo_config(get_profile("cpu").override(**changes), output_dir=tmp_path, **overrides)
        assert config.per_device_train_batch_size == lab.per_device_train_batch_size, name  # 8 completions a step
        differing = {field for field in fields if getattr(config, field) != getattr(lab, field)}
        assert differing == (set(changes) | set(overrides)) - {"warm_start_examples"}, name
    assert make_grpo_config("cpu", output_dir=tmp_path, steps_per_generation=4).generation_batch_size == 32


def log(step: int, length: float, correct: float, std: float) -> dict:
    return {"step": step, "loss": 0.1, "completions/mean_length": length, "reward": 1.0, "reward_std": 0.5,
            "rewards/correctness_reward_func/mean": correct, "rewards/correctness_reward_func/std": std}  # fmt: skip


def test_lever_lines_give_times_lengths_and_the_correct_share_by_fifths(bench):
    history = [log(step, 50 - step, 0.25 * (step > 5), 0.5 * (step % 2)) for step in range(1, 11)]
    lines = dict(line.split(": ", 1) for line in bench.lever_lines("cap_64", 30.0, 90.0, history))
    assert lines["lever_cap_64_minutes"] == "2.0" and lines["lever_cap_64_warm_start_seconds"] == "30"
    assert lines["lever_cap_64_step_seconds"] == "9.00"
    assert lines["lever_cap_64_mean_length_first_fifth"] == "48.5"  # steps 1-2: 49 and 48
    assert lines["lever_cap_64_mean_length_last_fifth"] == "40.5"
    assert lines["lever_cap_64_correct_first_fifth"] == "0.000" and lines["lever_cap_64_correct_last_fifth"] == "0.125"
    assert lines["lever_cap_64_varied_steps"] == "0.500"


def test_fifths_of_nothing_is_an_error(bench):
    with pytest.raises(ValueError, match="no values"):
        bench.fifths([])
    assert bench.fifths([1.0, 2.0, 3.0]) == (1.0, 3.0)


def test_step_seconds_count_every_optimizer_step_not_only_the_generation_rounds(bench):
    """With steps_per_generation=4, TRL logs a reward on one step in four; the other steps log a loss only."""
    from course_utils.training import run_logs

    history = []
    for step in range(1, 9):
        history.append(log(step, 30.0, 0.25, 0.5) if step % 4 == 1 else {"step": step, "loss": 0.1})
    logs = run_logs.training_logs(history)
    lines = dict(line.split(": ", 1) for line in bench.lever_lines("generation_batch_32", 0.0, 16.0, history))
    assert len(logs) == 2 and lines["lever_generation_batch_32_step_seconds"] == "2.00"
