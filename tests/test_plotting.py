"""Every figure function draws the data it is given and returns a Figure (no display needed).

Figures owned by one topic are also tested beside it (test_data, test_training, test_evaluation); this file
checks the rest, and that each figure really carries the numbers passed in.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from course_utils.lesson import evaluation_plots, plotting


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plotting.plt.close("all")


def test_group_advantages_draws_rewards_and_signed_advantages():
    fig = plotting.plot_group_advantages(["a", "b", "c"], [1.0, 0.0, 2.0], [0.0, -1.0, 1.0], title="one group")
    rewards_ax, advantages_ax = fig.axes
    assert [bar.get_height() for bar in rewards_ax.patches] == [1.0, 0.0, 2.0]
    assert [bar.get_height() for bar in advantages_ax.patches] == [0.0, -1.0, 1.0]
    assert fig._suptitle.get_text() == "one group"


def test_clipped_objective_has_one_curve_per_advantage_and_the_clip_edges():
    ratios = list(np.linspace(0.5, 1.5, 11))
    fig = plotting.plot_clipped_objective(ratios, {"A=+1": ratios, "A=-1": [-r for r in ratios]}, epsilon=0.2)
    ax = fig.axes[0]
    xs = sorted({line.get_xdata()[0] for line in ax.lines if len(line.get_xdata()) == 2})
    assert xs == pytest.approx([0.8, 1.0, 1.2])
    assert {t.get_text() for t in ax.get_legend().get_texts()} == {"A=+1", "A=-1"}


def test_k3_kl_draws_the_optional_exact_curve():
    assert len(plotting.plot_k3_kl([0.0, 0.5], [0.0, 0.15]).axes[0].lines) == 1
    assert len(plotting.plot_k3_kl([0.0, 0.5], [0.0, 0.15], exact=[0.0, 0.125]).axes[0].lines) == 2


def test_reward_totals_marks_the_mean():
    fig = plotting.plot_reward_totals([1.0, 2.0, 3.0], max_total=4.0)
    means = [line.get_xdata()[0] for line in fig.axes[0].lines]
    assert means == [2.0]


def test_reward_curve_with_and_without_target():
    fig = plotting.plot_reward_curve([0, 1, 2], [0.1, 1.0, 0.1], "length", "length reward", marker=1)
    assert list(fig.axes[0].lines[0].get_ydata()) == [0.1, 1.0, 0.1]
    assert fig.axes[0].get_legend() is not None
    assert plotting.plot_reward_curve([0, 1], [0, 1], "x", "t").axes[0].get_legend() is None


def test_train_vs_validation_uses_two_axes():
    fig = evaluation_plots.plot_train_vs_validation(
        [{"step": 1, "reward": 0.1}, {"step": 2, "reward": 0.5}], [{"step": 2, "accuracy": 0.2}]
    )
    assert len(fig.axes) == 2
    assert list(fig.axes[0].lines[0].get_ydata()) == [0.1, 0.5]
    assert list(fig.axes[1].lines[0].get_ydata()) == [0.2]


def test_memory_breakdown_stacks_parts_to_the_total():
    parts = {"weights_gb": [1.0], "reference_model_gb": [0.0], "gradients_gb": [0.5], "optimizer_gb": [1.0],
             "overhead_gb": [0.5], "activations_gb": [2.0], "kv_cache_gb": [1.0]}  # fmt: skip
    fig = evaluation_plots.plot_memory_breakdown(pd.DataFrame(parts, index=["full"]), available_gb=16)
    top = max(bar.get_y() + bar.get_height() for bar in fig.axes[0].patches)
    assert top == pytest.approx(5.0)  # 3.0 of states + the larger of activations (2.0) and KV cache (1.0)


def test_memory_breakdown_stacks_the_kept_packs_where_there_are_any():
    parts = {"weights_gb": [1.0, 1.0], "reference_model_gb": [0.0, 0.0], "gradients_gb": [0.5, 0.5],
             "optimizer_gb": [1.0, 1.0], "overhead_gb": [0.5, 0.5], "kept_packs_gb": [0.0, 0.75],
             "activations_gb": [2.0, 2.0], "kv_cache_gb": [1.0, 1.0]}  # fmt: skip
    fig = evaluation_plots.plot_memory_breakdown(pd.DataFrame(parts, index=["gpu", "cpu"]))
    tops = sorted(bar.get_y() + bar.get_height() for bar in fig.axes[0].patches)
    assert tops[-2:] == pytest.approx([5.0, 5.75]), "the cpu run's bar is taller by its packs"
    assert "kept packs" in [text.get_text() for text in fig.axes[0].get_legend().get_texts()]


def test_figures_render_headless():
    fig = plotting.plot_k3_kl([0.0, 1.0], [0.0, 0.7])
    fig.canvas.draw()
    pixels = np.asarray(fig.canvas.buffer_rgba())
    assert pixels.shape[:2] == (fig.canvas.get_width_height()[1], fig.canvas.get_width_height()[0])
    assert len(np.unique(pixels.reshape(-1, 4), axis=0)) > 2  # the curve and the axes were drawn, not a blank canvas


def test_variant_curves_draw_one_line_per_variant_and_skip_missing_metrics():
    curves = {
        "dapo": [{"step": 1, "reward": 0.5, "entropy": 0.9}, {"step": 2, "reward": 0.7, "entropy": 0.8}],
        "gspo": [{"step": 1, "reward": 0.4, "clip_ratio/high_mean": 0.1}],
    }
    fig = plotting.plot_variant_curves(curves)
    reward_ax, *_, entropy_ax = fig.axes
    assert len(reward_ax.lines) == 2 and len(entropy_ax.lines) == 1
    assert len(plotting.plot_variant_curves({}).axes[0].lines) == 0


def test_variant_curves_skip_the_steps_that_logged_no_value():
    """A reused batch's step (num_iterations=2) logs clip ratios but no reward: NaN in a table, not a point."""
    nan = float("nan")
    curves = {"gspo": [{"step": 1, "reward": 0.4, "clip_ratio/high_mean": 0.0},
                       {"step": 2, "reward": nan, "clip_ratio/high_mean": 0.5}]}  # fmt: skip
    fig = plotting.plot_variant_curves(curves)
    [reward_line] = fig.axes[0].lines
    assert list(reward_line.get_xdata()) == [1]


def test_variant_table_draws_bars_with_spread_and_names_missing_columns():
    summary = pd.DataFrame({"accuracy": [0.1, 0.2], "accuracy_spread": [0.02, 0.04]}, index=["dapo", "grpo"])
    fig = plotting.plot_variant_table(summary, "accuracy", baseline="dapo")
    assert len(fig.axes[0].patches) == 2
    with pytest.raises(ValueError, match="final_reward_spread"):
        plotting.plot_variant_table(summary, "final_reward")


def _stage(rate: float, n: int = 10) -> dict:
    """An evaluation result with every rate at ``rate`` and an interval of ±0.1 around it."""
    metrics = evaluation_plots.STAGE_RATES
    return {"n": n} | {m: rate for m in metrics} | {f"{m}_ci": (max(rate - 0.1, 0.0), rate + 0.1) for m in metrics}


def test_stage_rates_draw_one_bar_per_stage_and_rate_in_training_order():
    results = {"base": _stage(0.1), "warm start": _stage(0.4), "after GRPO": _stage(0.5)}
    fig = evaluation_plots.plot_stage_rates(results)
    ax = fig.axes[0]
    rates = len(evaluation_plots.STAGE_RATES)
    assert len(ax.patches) == 3 * rates
    heights = [bar.get_height() for bar in ax.patches]
    assert heights == pytest.approx([0.1] * rates + [0.4] * rates + [0.5] * rates)  # base, warm start, GRPO
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["base", "warm start", "after GRPO"]
    assert ax.get_title() == "base → warm start → after GRPO"  # the default title names every stage drawn
    assert "Before and after" not in ax.get_title()


def test_stage_rates_take_two_stages_a_title_and_skip_rates_a_result_lacks():
    base, grpo = _stage(0.2), _stage(0.3)
    del grpo["truncation_rate"]
    fig = evaluation_plots.plot_stage_rates({"base": base, "after GRPO": grpo}, title="base → after GRPO: 10 problems")
    ax = fig.axes[0]
    assert len(ax.patches) == 2 * (len(evaluation_plots.STAGE_RATES) - 1)
    assert ax.get_title() == "base → after GRPO: 10 problems"
    with pytest.raises(ValueError, match="at least one"):
        evaluation_plots.plot_stage_rates({})


def test_before_after_rates_are_titled_with_the_two_models_drawn():
    table = pd.DataFrame(
        {"base": [0.1], "trained": [0.5], "change": [0.4], "base_ci_low": [0.0], "base_ci_high": [0.3],
         "trained_ci_low": [0.3], "trained_ci_high": [0.7]},
        index=pd.Index(["accuracy"], name="metric"),
    )  # fmt: skip
    ax = evaluation_plots.plot_before_after_rates(table).axes[0]
    assert ax.get_title() == "base and trained" and len(ax.patches) == 2


def test_correct_share_curves_are_trailing_means_over_the_window():
    fig = plotting.plot_correct_share_curves({"short": [0.0, 0.25, 0.5], "long": [0.125] * 5}, window=2)
    short, long = fig.axes[0].lines
    assert np.allclose(short.get_ydata(), [0.0, 0.125, 0.375]) and list(short.get_xdata()) == [1, 2, 3]
    assert np.allclose(long.get_ydata(), [0.125] * 5)
    assert "short (3 steps)" in [text.get_text() for text in fig.axes[0].get_legend().get_texts()]


@pytest.mark.parametrize(("curves", "window", "message"), [
    ({}, 10, "at least one step"),
    ({"run": []}, 10, "at least one step"),
    ({"run": [0.1]}, 0, "window must be a whole number"),
    ({"run": [0.1]}, 2.5, "window must be a whole number"),
])  # fmt: skip
def test_correct_share_curves_refuse_empty_runs_and_bad_windows(curves, window, message):
    with pytest.raises(ValueError, match=message):
        plotting.plot_correct_share_curves(curves, window=window)
