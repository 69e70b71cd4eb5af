"""Monitoring: the rules on synthetic log histories, the live dashboard without a display, saved artifacts."""

from __future__ import annotations

from types import SimpleNamespace

import matplotlib
import pytest
import torch

from course_utils.exercises import nb04_train_grpo as nb04
from course_utils.lesson.grpo import frac_reward_zero_std
from course_utils.lesson.plotting import plot_training_dashboard
from course_utils.training.monitoring import Finding, describe_findings, flat_reward_cause, monitor, reward_fifths
from course_utils.training.run_callbacks import LiveDashboard
from course_utils.training.run_logs import compare_runs, load_log_history, save_run_artifacts, step_logs, training_logs

matplotlib.use("Agg")


# --- Dashboard and monitoring on synthetic histories -------------------------------------------------


def _history(n=10, **series):
    base = {
        "reward": [0.5 + 0.1 * i for i in range(n)],
        "reward_std": [0.8] * n,
        "completions/mean_length": [40.0] * n,
        "completions/clipped_ratio": [0.1] * n,
        "frac_reward_zero_std": [0.0] * n,
        "rewards/strict_format_reward_func/mean": [0.1] * n,
    }
    base.update(series)
    logs = [{key: values[i] for key, values in base.items()} | {"step": i + 1} for i in range(n)]
    return [*logs, {"train_runtime": 12.0, "step": n}]


def test_healthy_history_has_no_findings():
    assert monitor(_history()) == []
    assert "no rule fired" in describe_findings([])


@pytest.mark.parametrize(
    ("series", "rule"),
    [
        ({"reward_std": [0.05] * 10}, "reward_std_low"),
        ({"completions/mean_length": [40.0] * 6 + [90.0] * 4}, "length_jump"),
        ({"kl": [0.001 * 2**i for i in range(10)]}, "kl_rising"),
        ({"frac_reward_zero_std": [0.9] * 10}, "zero_std_high"),
        ({"completions/clipped_ratio": [0.6] * 10}, "clipped_high"),
    ],
)
def test_each_rule_fires(series, rule):
    findings = monitor(_history(**series))
    assert [f.code for f in findings] == [rule]
    assert isinstance(findings[0], Finding) and findings[0].fix
    assert rule in describe_findings(findings)


def test_reward_std_rule_speaks_of_the_batch_and_quotes_the_group_signal():
    """reward_std is the whole batch's std; the within-group signal is frac_reward_zero_std."""
    [finding] = monitor(_history(reward_std=[0.05] * 10, frac_reward_zero_std=[0.25] * 10))
    assert "in the batch" in finding.message and "a group" not in finding.message
    assert "frac_reward_zero_std is 25%" in finding.message
    no_group_metric = [
        {k: v for k, v in e.items() if k != "frac_reward_zero_std"} for e in _history(reward_std=[0.0] * 10)
    ]
    assert "not logged" in monitor(no_group_metric)[0].message


def test_high_batch_std_with_flat_groups_is_caught_by_the_group_rule():
    """Two prompts, each group all-equal: reward_std is large, yet no group carries a signal."""
    batch = [2.0] * 4 + [0.0] * 4
    history = _history(
        reward_std=[torch.tensor(batch).std().item()] * 10,
        frac_reward_zero_std=[frac_reward_zero_std(batch, num_generations=4)] * 10,
    )
    assert [f.code for f in monitor(history)] == ["zero_std_high"]


def test_flat_kl_does_not_fire():
    assert monitor(_history(kl=[0.01, 0.012, 0.011, 0.01, 0.012, 0.011, 0.01, 0.012, 0.011, 0.01])) == []


def test_monitor_rejects_bad_input():
    with pytest.raises(TypeError, match="log_history must be a list of dicts"):
        monitor("trainer_state.json")


def test_the_dashboard_leaves_no_figure_for_the_notebook_to_draw_again(capsys):
    """A figure left open in pyplot is drawn once more by the inline backend when the cell ends."""
    import matplotlib.pyplot as plt

    dashboard = LiveDashboard(show=True)
    before = set(plt.get_fignums())
    for step in (1, 2):
        dashboard.on_log(None, SimpleNamespace(global_step=step), None, logs={"reward": 0.5, "reward_std": 0.1})
    assert set(plt.get_fignums()) == before and dashboard.redraws == 2
    assert dashboard.figure.axes  # still whole, for save_run_artifacts


def test_dashboard_redraws_headless_and_saves(tmp_path):
    dashboard = LiveDashboard(show=False)
    state = type("State", (), {"global_step": 0})()
    for entry in training_logs(_history(4, kl=[0.0, 0.01, 0.02, 0.03])):
        state.global_step = entry["step"]
        dashboard.on_log(None, state, None, logs=entry)
    dashboard.on_log(None, state, None, logs={"train_runtime": 3.0})  # summary: no redraw
    assert dashboard.redraws == 4
    titles = [ax.get_title() for ax in dashboard.figure.axes]
    assert any(t.startswith("kl") for t in titles) and any("frac_reward_zero_std" in t for t in titles)
    paths = save_run_artifacts(_history(6), tmp_path)
    assert paths["png"].stat().st_size > 10_000
    back = load_log_history(paths["csv"])
    assert [e["reward"] for e in training_logs(back)] == pytest.approx([0.5 + 0.1 * i for i in range(6)])


def test_the_dashboards_reward_std_panel_says_it_is_the_whole_batch():
    """TRL's reward_std is the std over every completion of a step; the within-group signal is frac_reward_zero_std."""
    dashboard = LiveDashboard(show=False)
    state = type("State", (), {"global_step": 1})()
    dashboard.on_log(None, state, None, logs=training_logs(_history(1))[0])
    titles = [ax.get_title() for ax in dashboard.figure.axes]
    assert titles[1] == "reward_std (whole batch)"
    assert not any("within group" in title for title in titles)


def test_empty_dashboard_draws():
    assert len(plot_training_dashboard([]).axes) == 6


def test_the_dashboard_draws_the_tool_columns_only_for_a_run_with_tools():
    tool_steps = [{**entry, "tools/call_frequency": 0.25 * i, "tools/failure_frequency": 0.5}
                  for i, entry in enumerate(training_logs(_history(3)))]  # fmt: skip
    figure = plot_training_dashboard(tool_steps)
    panels = {ax.get_title(): ax for ax in figure.axes}
    lines = panels["tool calls per completion, failed share"].get_lines()
    assert [line.get_label() for line in lines] == ["call_frequency", "failure_frequency"]
    assert list(lines[0].get_ydata()) == [0.0, 0.25, 0.5]
    plain = {ax.get_title() for ax in plot_training_dashboard(training_logs(_history(3))).axes}
    assert "tool calls per completion, failed share" not in plain


def test_reward_fifths():
    first, last = reward_fifths(_history(10))
    assert first == pytest.approx(0.55) and last == pytest.approx(1.35)
    assert reward_fifths(_history(3)) == (pytest.approx(0.5), pytest.approx(0.7))  # one step a fifth, at least
    with pytest.raises(ValueError, match="No training step logged 'reward'"):
        reward_fifths([{"train_runtime": 1.0}])


def test_exercise_checks_for_notebook_04(capsys):
    history = _history(8, **{"completions/clipped_ratio": [0.8] * 8})
    assert nb04.check_04_prompts_per_step(16) and not nb04.check_04_prompts_per_step(128)
    assert nb04.check_04_group_size_field(" num_generations ") and not nb04.check_04_group_size_field("beta")
    assert nb04.check_04_monitoring_rule("clipped_high", history)
    assert not nb04.check_04_monitoring_rule("kl_rising", history)
    assert not nb04.check_04_monitoring_rule("clipped_high", "not a history")
    assert not nb04.check_04_prompts_per_step(None)
    assert "not answered yet" in capsys.readouterr().out


def _saved_run(folder, rewards):
    history = [{"step": i + 1, "reward": r, "reward_std": 0.5} for i, r in enumerate(rewards)]
    save_run_artifacts([*history, {"train_runtime": 1.0}], folder)
    return folder


def test_compare_runs_lays_one_metric_of_each_run_side_by_side(tmp_path):
    first = _saved_run(tmp_path / "lr-1e-4", [0.1, 0.4, 0.9])
    second = _saved_run(tmp_path / "lr-2e-4", [0.2, 0.8])
    frame = compare_runs([first, second])
    assert list(frame.columns) == ["lr-1e-4", "lr-2e-4"] and list(frame.index) == [1, 2, 3]
    assert frame.loc[3, "lr-1e-4"] == 0.9 and frame["lr-2e-4"].isna().sum() == 1
    same_name = _saved_run(tmp_path / "other" / "lr-1e-4", [0.0])
    assert set(compare_runs([first, same_name]).columns) == {str(first), str(same_name)}


def test_compare_runs_names_what_is_missing(tmp_path):
    run = _saved_run(tmp_path / "run", [0.1])
    with pytest.raises(ValueError, match=r"logged no 'kl'.*reward_std"):
        compare_runs([run], "kl")
    with pytest.raises(FileNotFoundError, match=r"No log_history\.csv in .*empty"):
        compare_runs([tmp_path / "empty"])
    with pytest.raises(ValueError, match="at least one run folder"):
        compare_runs([])


@pytest.mark.parametrize(
    ("series", "cause"),
    [
        ({}, "ok"),
        ({"completions/clipped_ratio": [1.0] * 10, "frac_reward_zero_std": [1.0] * 10}, "truncated"),
        ({"frac_reward_zero_std": [0.9] * 10}, "no_signal"),
        ({"completions/clipped_ratio": [1.0] * 5 + [0.0] * 5}, "ok"),  # only the last five steps count
    ],
)
def test_flat_reward_cause(series, cause):
    assert flat_reward_cause(_history(**series)) == cause


def test_flat_reward_cause_names_bad_input():
    with pytest.raises(TypeError, match="log_history must be a list"):
        flat_reward_cause("log_history.csv")


@pytest.mark.parametrize("task_step", [-0.02, 0.0, 0.05])  # the task falls, stays, or rises less than the bonus
def test_reward_without_task_fires_when_a_bonus_outgrows_the_task(task_step):
    n = 9
    hacked = _history(
        n,
        **{
            "rewards/novelty_reward_func/mean": [0.3 + 0.06 * i for i in range(n)],
            "rewards/strict_format_reward_func/mean": [0.3 + task_step * i for i in range(n)],
        },
    )
    [finding] = monitor(hacked)
    assert finding.code == "reward_without_task" and "novelty_reward_func" in finding.message
    assert "log_completions" in finding.fix


def test_reward_without_task_stays_silent_when_the_task_rises_or_the_run_is_short():
    n = 9
    learning = _history(
        n,
        **{
            "rewards/novelty_reward_func/mean": [0.3 + 0.06 * i for i in range(n)],
            "rewards/strict_format_reward_func/mean": [0.1 + 0.08 * i for i in range(n)],
        },
    )
    assert monitor(learning) == []  # the task rose more than the bonus
    short = _history(4, **{"rewards/novelty_reward_func/mean": [0.1, 0.5, 0.9, 1.0]})
    assert monitor(short) == []


def test_step_logs_keep_the_steps_that_reuse_a_batch():
    history = [
        {"step": 1, "loss": 0.0, "reward": 0.5, "clip_ratio/high_mean": 0.0},
        {"step": 2, "loss": 0.01, "clip_ratio/high_mean": 0.25},  # num_iterations=2: the batch used again
        {"step": 2, "train_runtime": 3.0, "train_loss": 0.005},
    ]
    assert [e["step"] for e in step_logs(history)] == [1, 2]
    assert [e["step"] for e in training_logs(history)] == [1]
    with pytest.raises(TypeError, match="log_history must be a list"):
        step_logs("log_history.csv")
