"""Tests for the reward lab: the plain function and the ipywidgets UI driven by setting slider values."""

from __future__ import annotations

import html

import pytest

from course_utils.lesson.rewards import DEFAULT_WEIGHTS, REWARD_NAMES, TOTAL_COLUMN, max_total_reward
from course_utils.lesson.widgets import (
    CALIBRATION_HIGH,
    CALIBRATION_LOW,
    SAMPLE_BANK,
    RewardLab,
    Sample,
    calibration_verdict,
    reward_lab,
)

ONE_LINE_LABEL = "tags on one line"


def weighted(result, row):
    return sum(w * result.table.at[row, n] for w, n in zip(result.weights, REWARD_NAMES, strict=True))


def test_reward_lab_table_totals_and_advantages():
    result = reward_lab("tuned", "strict")
    assert list(result.table.columns) == ["label", *REWARD_NAMES, TOTAL_COLUMN, "advantage"]
    assert len(result.table) == len(SAMPLE_BANK)
    for row in range(len(SAMPLE_BANK)):
        assert result.totals[row] == pytest.approx(weighted(result, row))
    assert result.max_total == pytest.approx(max_total_reward("tuned"))
    assert result.mean_total == pytest.approx(sum(result.totals) / len(result.totals))
    assert sum(result.advantages) == pytest.approx(0.0, abs=1e-4)  # one group: advantages centre on 0
    best = result.totals.index(max(result.totals))
    assert result.advantages[best] == max(result.advantages)


def test_stage_toggle_changes_the_strict_slot():
    row = [s.label for s in SAMPLE_BANK].index(ONE_LINE_LABEL)
    lenient, strict = reward_lab("initial", "lenient"), reward_lab("initial", "strict")
    assert lenient.table.at[row, "strict_format_reward_func"] > strict.table.at[row, "strict_format_reward_func"]
    assert lenient.mean_total > strict.mean_total


@pytest.mark.parametrize(
    ("fraction", "calibrated", "word"),
    [
        (CALIBRATION_LOW - 0.01, False, "too hard"),
        (0.5, True, "calibrated"),
        (CALIBRATION_HIGH + 0.01, False, "too easy"),
    ],
)
def test_calibration_verdict(fraction, calibrated, word):
    ok, text = calibration_verdict(fraction * 4.0, 4.0)
    assert ok is calibrated and word in text


def test_calibration_with_zero_weights_is_not_calibrated():
    result = reward_lab([0.0] * 5)
    assert not result.calibrated and "maximum total is 0" in result.verdict


def test_reward_lab_bad_input():
    with pytest.raises(ValueError, match="stage"):
        reward_lab("initial", "medium")
    with pytest.raises(ValueError, match="empty"):
        reward_lab("initial", "strict", bank=[])


def test_the_lab_computes_advantages_at_the_runs_scale():
    """Under scale_rewards='none' (the cpu lab) an advantage is the total minus the group's mean, unscaled."""
    grouped, unscaled = reward_lab("initial", "strict", scale="group"), reward_lab("initial", "strict", scale="none")
    mean = sum(unscaled.totals) / len(unscaled.totals)
    assert unscaled.advantages == pytest.approx([total - mean for total in unscaled.totals], abs=1e-5)
    assert grouped.advantages != pytest.approx(unscaled.advantages, abs=1e-3)
    assert unscaled.scale == "none" and grouped.scale == "group"
    lab = RewardLab(scale="none")
    assert lab.result.advantages == pytest.approx(unscaled.advantages)
    assert lab.grpo_config_kwargs()["scale_rewards"] == "none"
    assert "scale_rewards='none'" in lab.view.config_line.value


def test_an_unknown_scale_is_refused_by_the_lab_and_the_plot():
    from course_utils.lesson.plotting import plot_group_advantages

    with pytest.raises(ValueError, match="scale"):
        reward_lab("initial", "strict", scale="std")
    with pytest.raises(ValueError, match="scale"):
        RewardLab(scale="grouped")
    with pytest.raises(ValueError, match="scale_rewards"):
        plot_group_advantages(["a", "b"], [1.0, 0.0], [0.5, -0.5], scale="std")


def test_all_wrong_bank_teaches_nothing():
    bank = [Sample(f"no tags {i}", "I think it is 7.") for i in range(4)]
    result = reward_lab("initial", "strict", bank)
    assert result.frac_reward_zero_std == 1.0
    assert result.advantages == [0.0] * 4


def test_sliders_recompute_the_outputs():
    lab = RewardLab()
    assert lab.result.weights == DEFAULT_WEIGHTS["initial"]
    before = lab.result.mean_total
    lab.sliders["correctness_reward_func"].value = 4.0
    assert lab.result.weights[0] == 4.0
    assert lab.result.mean_total > before
    assert lab.preset.value == "custom"  # no preset has these weights any more
    assert lab.result.mean_total == pytest.approx(reward_lab(lab.weights, "strict").mean_total)


def test_preset_dropdown_moves_every_slider():
    lab = RewardLab()
    lab.preset.value = "tuned"
    assert lab.weights == DEFAULT_WEIGHTS["tuned"]
    assert lab.result.weights == DEFAULT_WEIGHTS["tuned"]
    lab.set_weights("initial")
    assert lab.preset.value == "initial"


def test_toggle_switches_stage():
    lab = RewardLab(stage="strict")
    strict_mean = lab.result.mean_total
    lab.stage.value = "lenient"
    assert lab.result.stage == "lenient" and lab.result.mean_total > strict_mean
    assert "GRPOConfig(reward_weights=" in lab.view.config_line.value
    assert "best total 4" in lab.view.config_line.value and "correctness 2" in lab.view.config_line.value


def test_lab_saves_the_slider_weights_for_training(tmp_path):
    from course_utils.lesson.rewards import load_weights

    lab = RewardLab(preset="initial")
    lab.sliders["correctness_reward_func"].value = 2.5
    path = lab.save(tmp_path / "w.json")
    assert load_weights(path) == [2.5, 1.0, 1.0, 1.0, 1.0] == list(lab.weights)
    assert lab.preset.value == "custom"
    assert "calibrated" in lab.view.verdict.value or "too" in lab.view.verdict.value


@pytest.mark.slow  # importing trl alone takes ~10 s on the shared CPU
def test_widget_assembles_and_exports_to_grpo_config(tmp_path):
    from trl import GRPOConfig

    lab = RewardLab(preset="tuned")
    box = lab.widget
    assert len(box.children) == 5
    config = GRPOConfig(
        output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none", **lab.grpo_config_kwargs()
    )
    assert list(config.reward_weights) == list(DEFAULT_WEIGHTS["tuned"])


def _widget_tree(widget):
    yield widget
    for child in getattr(widget, "children", ()):
        yield from _widget_tree(child)


def test_lab_draws_table_and_plots_into_plain_widgets():
    """The table is HTML and the plots PNG images, redrawn on every change."""
    lab = RewardLab()
    first_plot, first_table = bytes(lab.view.totals_plot.value), lab.view.table.value
    assert first_plot.startswith(b"\x89PNG") and bytes(lab.view.advantages_plot.value).startswith(b"\x89PNG")
    assert first_table.count("<tr") == len(SAMPLE_BANK) + 1  # header + one row per sample
    assert all(html.escape(sample.label) in first_table for sample in SAMPLE_BANK)
    lab.sliders["correctness_reward_func"].value = 0.0
    assert bytes(lab.view.totals_plot.value) != first_plot and lab.view.table.value != first_table


def test_lab_has_no_output_widget():
    """An ipywidgets.Output capturing rich display() stalls nbclient/nbmake for a whole cell timeout
    per call (notebook 03 once took 610 s in CI); the lab must not bring one back."""
    import ipywidgets as widgets

    assert not [w for w in _widget_tree(RewardLab().widget) if isinstance(w, widgets.Output)]


def test_the_lab_says_what_a_bare_guess_earns_against_a_right_answer() -> None:
    """Under the initial weights a wrong guess in perfect tags earns half a right answer: a collapse is paid for."""
    from course_utils.lesson.widgets import guess_verdict

    initial = reward_lab("initial")
    assert (initial.guess_total, initial.right_total) == (2.0, 4.0)
    assert guess_verdict(initial.guess_total, initial.right_total).startswith("⚠️")
    correct_first = reward_lab((1.0, 0.2, 0.2, 0.2, 0.2))
    assert correct_first.guess_total == pytest.approx(0.4)
    assert guess_verdict(correct_first.guess_total, correct_first.right_total).startswith("✅")
    assert guess_verdict(0.0, 0.0).startswith("❌")
