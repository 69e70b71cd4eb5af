"""The reward lab: five weight sliders, presets and a lenient/strict toggle over a bank of sample completions.

The logic is the plain function ``reward_lab`` (weights in, table / totals / advantages / verdict out),
tested without a browser. ``RewardLab`` wraps it in ipywidgets: every slider move calls it again and
redraws. The weights it shows are the ones to give ``GRPOConfig(reward_weights=...)``
(``RewardLab.grpo_config_kwargs()``): multipliers of each reward function's own size, so "initial" is all 1.0
and the points each reward can give are shown next to them. ``RewardLab.save()`` writes them to the file
notebook 04 trains with (``course_utils.lesson.rewards.save_weights``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import ipywidgets as widgets
import pandas as pd

from course_utils.lesson.grpo import frac_reward_zero_std, group_advantages, normalize_scale
from course_utils.lesson.plotting import figure_png, plot_group_advantages, plot_reward_totals
from course_utils.lesson.rewards import (
    DEFAULT_WEIGHTS,
    REWARD_NAMES,
    TOTAL_COLUMN,
    grpo_reward_weights,
    max_total_reward,
    resolve_weights,
    reward_points,
    reward_table,
    save_weights,
)
from course_utils.lesson.rewards.shaping import STAGES
from course_utils.lesson.rewards.weights import Weights

CALIBRATION_LOW = 0.3
CALIBRATION_HIGH = 0.7
SLIDER_MAX = 5.0
SLIDER_STEP = 0.025

QUESTION = "A school orders 40 boxes of pencils with 25 pencils in each box. How many pencils does it get?"
GOLD = "1000"
# What a collapsed run writes for every problem: perfect tags around a guess, no computation
BARE_GUESS = "<reasoning>\n1\n</reasoning>\n<answer>\n1\n</answer>\n"
RIGHT_ANSWER = "<reasoning>\n40 * 25 = 1000\n</reasoning>\n<answer>\n1000\n</answer>\n"
GUESS_SHARE_HIGH = 0.5  # a guess earning half of a right answer's total pays a run to stop solving


@dataclass(frozen=True)
class Sample:
    """One completion of the bank, with a label saying what it illustrates."""

    label: str
    completion: str
    answer: str = GOLD


# One group: ten completions of the same question, as GRPO would sample them.
SAMPLE_BANK: tuple[Sample, ...] = (
    Sample("perfect", RIGHT_ANSWER),
    Sample(
        "multi-line, no final \\n",
        "<reasoning>\nEach box holds 25 pencils.\n40 boxes * 25 = 1000.\n</reasoning>\n<answer>\n1000\n</answer>",
    ),
    Sample("answer 1,000", "<reasoning>\n40 * 25 = 1000\n</reasoning>\n<answer>\n1,000\n</answer>\n"),
    Sample("answer 1000.00", "<reasoning>\n40 * 25 = 1000\n</reasoning>\n<answer>\n1000.00\n</answer>\n"),
    Sample("wrong answer", "<reasoning>\n40 * 25 = 900\n</reasoning>\n<answer>\n900\n</answer>\n"),
    Sample("tags on one line", "<reasoning>40 * 25 = 1000</reasoning> <answer>1000</answer>"),
    Sample("no tags", "40 boxes of 25 pencils make 40 * 25 = 1000 pencils. The answer is 1000."),
    Sample(
        "chatter after answer",
        "<reasoning>\n40 * 25 = 1000\n</reasoning>\n<answer>\n1000\n</answer>\nI hope this helps! Ask me more.",
    ),
    Sample("cut off (length limit)", "<reasoning>\nFirst, 40 boxes. Each box has 25 pencils, so we multiply 40 by"),
    Sample("wrong, rambling", "Let me think. 40 + 25 = 65. So maybe 65 pencils? Or 40 - 25 = 15. I am not sure."),
)


@dataclass(frozen=True)
class LabResult:
    """Everything the lab displays for one setting of the weights."""

    weights: tuple[float, ...]
    stage: str
    table: pd.DataFrame  # label, one column per reward, total, advantage
    max_total: float
    mean_total: float
    ratio: float  # mean_total / max_total
    calibrated: bool
    verdict: str
    frac_reward_zero_std: float
    guess_total: float  # what BARE_GUESS earns under these weights
    right_total: float  # what RIGHT_ANSWER earns
    scale: str = "group"  # the scale_rewards the advantages were computed with

    @property
    def totals(self) -> list[float]:
        return self.table[TOTAL_COLUMN].tolist()

    @property
    def advantages(self) -> list[float]:
        return self.table["advantage"].tolist()


def calibration_verdict(
    mean_total: float, max_total: float, low: float = CALIBRATION_LOW, high: float = CALIBRATION_HIGH
) -> tuple[bool, str]:
    """Is the average completion earning between ``low`` and ``high`` of the best possible total?

    Too low: most completions score ~0, groups are often all-equal, advantages vanish. Too high: the
    reward is already saturated, nothing left to improve. In between, groups disagree: signal.
    """
    if max_total <= 0:
        return False, "❌ the maximum total is 0: every weight is 0 (or negative), so nothing can be learned"
    ratio = mean_total / max_total
    if ratio < low:
        return False, f"⚠️ too hard: mean is {ratio:.0%} of the max (< {low:.0%}); add partial credit or go lenient"
    if ratio > high:
        return False, f"⚠️ too easy: mean is {ratio:.0%} of the max (> {high:.0%}); the reward is nearly saturated"
    return True, f"✅ calibrated: mean is {ratio:.0%} of the max (within {low:.0%}-{high:.0%})"


def guess_verdict(guess_total: float, right_total: float) -> str:
    """What a bare guess in perfect tags earns against a right, reasoned answer, and what that does to a run.

    Every wrong answer of a group earns the guess's total too, so when it is a large share of the right answer's, a
    run climbs faster by writing tags around a number than by solving (notebook 04's collapse).
    """
    if right_total <= 0:
        return "❌ a right answer earns nothing under these weights"
    share = guess_total / right_total
    line = (f"a bare guess in perfect tags (<code>&lt;answer&gt;1&lt;/answer&gt;</code>, wrong) earns "
            f"{guess_total:.2f}, {share:.0%} of a right answer's {right_total:.2f}")  # fmt: skip
    if share >= GUESS_SHARE_HIGH:
        return f"⚠️ {line}: a run can climb by guessing in tags (a collapse); raise correctness, lower the format"
    return f"✅ {line}: solving pays more than the tags"


def reward_lab(
    weights: Weights = "initial", stage: str = "strict", bank: Sequence[Sample] = SAMPLE_BANK, scale: str = "group"
) -> LabResult:
    """Score the bank with the given weights and stage; the whole bank is treated as one GRPO group.

    ``scale`` is ``GRPOConfig.scale_rewards``: give the run's own, so the advantages drawn are the ones it trains on.
    """
    if stage not in STAGES:
        raise ValueError(f"stage must be one of {STAGES}, got {stage!r}")
    bank = list(bank)
    if not bank:
        raise ValueError("the sample bank is empty: pass at least one Sample")
    values = resolve_weights(weights)
    table = reward_table([s.completion for s in bank], [s.answer for s in bank], values, stage=stage)
    table.insert(0, "label", [s.label for s in bank])
    table = table.drop(columns="completion")
    scale = normalize_scale(scale)
    table["advantage"] = group_advantages(table[TOTAL_COLUMN].tolist(), len(bank), scale).tolist()
    best = max_total_reward(values)
    mean = float(table[TOTAL_COLUMN].mean())
    calibrated, verdict = calibration_verdict(mean, best)
    zero_std = frac_reward_zero_std(table[TOTAL_COLUMN].tolist(), len(bank), scale)
    ratio = mean / best if best > 0 else float("nan")
    guess, right = reward_table([BARE_GUESS, RIGHT_ANSWER], GOLD, values, stage=stage)[TOTAL_COLUMN].tolist()
    return LabResult(values, stage, table, best, mean, ratio, calibrated, verdict, zero_std, guess, right, scale)


def _short_name(reward_name: str) -> str:
    """``correctness_reward_func`` -> ``correctness``: what a slider and the points line call a reward."""
    return reward_name.removesuffix("_reward_func")


def weight_sliders(weights: Sequence[float]) -> dict[str, widgets.FloatSlider]:
    """One slider per reward (in ``REWARD_NAMES`` order), starting at ``weights``."""
    return {
        name: widgets.FloatSlider(value=w, min=0.0, max=SLIDER_MAX, step=SLIDER_STEP, description=_short_name(name),
                                  style={"description_width": "initial"})  # the whole name: "strict_format"
        for name, w in zip(REWARD_NAMES, weights, strict=True)
    }


class LabView:
    """The lab's outputs, redrawn from one ``LabResult``: the verdict, the config line, the table and two plots.

    HTML and Image widgets, not an Output widget: rich display() calls captured by an Output widget
    stall headless runs (nbclient waits out its whole cell timeout on each one).
    """

    def __init__(self) -> None:
        self.verdict = widgets.HTML()
        self.config_line = widgets.HTML()
        self.table = widgets.HTML()
        # each plot half the output's width: side by side at their natural size they overflow a notebook's column
        self.totals_plot = widgets.Image(format="png", layout=widgets.Layout(width="50%", height="auto"))
        self.advantages_plot = widgets.Image(format="png", layout=widgets.Layout(width="50%", height="auto"))

    def show(self, result: LabResult) -> None:
        """Redraw every output from ``result``."""
        self.verdict.value = (f"<b>{result.verdict}</b> — frac_reward_zero_std = {result.frac_reward_zero_std}<br>"
                              f"{guess_verdict(result.guess_total, result.right_total)}")  # fmt: skip
        points = ", ".join(f"{_short_name(n)} {p:g}" for n, p in reward_points(result.weights).items())
        self.config_line.value = (
            f"<code>GRPOConfig(reward_weights={list(result.weights)}, scale_rewards={result.scale!r})</code><br>"
            f"points at best: {points}; best total {result.max_total:g}"
        )
        self.table.value = result.table.round(3).to_html(index=False, border=0)
        self.totals_plot.value = figure_png(plot_reward_totals(result.totals, result.max_total))
        self.advantages_plot.value = figure_png(
            plot_group_advantages(result.table["label"].tolist(), result.totals, result.advantages, scale=result.scale)
        )

    def rows(self) -> list[widgets.Widget]:
        """The outputs top to bottom, the two plots side by side."""
        return [self.verdict, self.config_line, self.table, widgets.HBox([self.totals_plot, self.advantages_plot])]


class RewardLab:
    """The ipywidgets UI around ``reward_lab``: sliders, preset dropdown, lenient/strict toggle, and a ``LabView``.

    ``lab.result`` always holds the latest ``LabResult``, so tests drive the sliders
    (``lab.sliders[name].value = 3.0``) and read the recomputed numbers without a browser.
    """

    def __init__(
        self, bank: Sequence[Sample] = SAMPLE_BANK, preset: str = "initial", stage: str = "strict", scale: str = "group"
    ) -> None:
        self.bank = list(bank)
        self.scale = normalize_scale(scale)
        self._updating = False
        self.sliders = weight_sliders(resolve_weights(preset))
        self.preset = widgets.Dropdown(options=[*DEFAULT_WEIGHTS, "custom"], value=preset, description="preset")
        self.stage = widgets.ToggleButtons(options=list(STAGES), value=stage, description="format")
        self.view = LabView()
        for slider in self.sliders.values():
            slider.observe(self._on_slider, names="value")
        self.preset.observe(self._on_preset, names="value")
        self.stage.observe(lambda _change: self.refresh(), names="value")
        self.result = self.refresh()

    @property
    def weights(self) -> tuple[float, ...]:
        """The weights on the sliders, in ``REWARD_NAMES`` order."""
        return tuple(self.sliders[name].value for name in REWARD_NAMES)

    @contextmanager
    def _quietly(self) -> Iterator[None]:
        """Move widgets without their observers recomputing (one recomputation after, not one per widget)."""
        self._updating = True
        try:
            yield
        finally:
            self._updating = False

    def set_weights(self, weights: Weights) -> LabResult:
        """Move every slider at once (one recomputation, not five); the preset dropdown follows."""
        with self._quietly():
            for name, w in zip(REWARD_NAMES, resolve_weights(weights), strict=True):
                self.sliders[name].value = w
        self._sync_preset()
        return self.refresh()

    def _sync_preset(self) -> None:
        """Show the preset whose weights the sliders hold, or "custom"."""
        matching = [name for name, w in DEFAULT_WEIGHTS.items() if tuple(w) == self.weights]
        with self._quietly():
            self.preset.value = matching[0] if matching else "custom"

    def grpo_config_kwargs(self) -> dict[str, Any]:
        """``GRPOConfig(**lab.grpo_config_kwargs(), ...)`` trains with exactly the weights and the advantages shown."""
        return {"reward_weights": grpo_reward_weights(self.weights), "scale_rewards": self.scale}

    def save(self, path: Any = None) -> Any:
        """Save the slider weights where notebook 04 reads them (``outputs/reward_weights.json``); return the file."""
        return save_weights(self.weights, path)

    def _on_slider(self, _change: Any) -> None:
        if not self._updating:
            self._sync_preset()
            self.refresh()

    def _on_preset(self, change: Any) -> None:
        if not self._updating and change["new"] in DEFAULT_WEIGHTS:
            self.set_weights(change["new"])

    def refresh(self) -> LabResult:
        """Recompute from the current widget values and redraw."""
        self.result = reward_lab(self.weights, self.stage.value, self.bank, self.scale)
        self.view.show(self.result)
        return self.result

    @property
    def widget(self) -> widgets.VBox:
        """The assembled UI, for ``display(lab.widget)``: the controls, then the outputs."""
        controls = widgets.VBox([self.preset, self.stage, *self.sliders.values()])
        return widgets.VBox([controls, *self.view.rows()])


__all__ = [
    "BARE_GUESS",
    "CALIBRATION_HIGH",
    "CALIBRATION_LOW",
    "GOLD",
    "QUESTION",
    "SAMPLE_BANK",
    "LabResult",
    "LabView",
    "RewardLab",
    "Sample",
    "calibration_verdict",
    "guess_verdict",
    "reward_lab",
    "weight_sliders",
]
