"""The lesson's figures and the training runs', one function per figure (notebooks 01 to 04, 07's variant runs);
the figures of models measured and runs diagnosed (05, 06) are ``lesson.evaluation_plots``'.

Each function takes plain data (lists, dicts, pandas objects, log histories), draws on a new
matplotlib figure and returns it, so notebooks show it and tests can check it without a display
(matplotlib picks its non-GUI backend by itself when there is none).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from io import BytesIO
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

from course_utils.lesson.tool_use import TOOL_LOG_COLUMNS

__all__ = ["Figure", "plt"]


def plot_token_lengths(
    prompt_lengths: list[int],
    reasoning_lengths: list[int],
    percentiles: tuple[float, ...] = (50, 90, 99),
    completion_length: int | None = None,
    overhead: int = 0,
) -> Figure:
    """Histograms of prompt and reference-reasoning token lengths, with percentile lines (notebook 02).

    ``completion_length`` draws the chosen ``max_completion_length`` on the reasoning panel: every
    reference solution to its right would be cut off, and a cut-off completion earns no reward;
    ``overhead`` (the XML wrapper's tokens) is added to each reasoning length when counting the cut.
    """

    fig, axes = plt.subplots(1, 2, figsize=(11, 3.6))
    panels = (("Prompt (chat template applied)", prompt_lengths), ("Reference reasoning", reasoning_lengths))
    for ax, (title, lengths) in zip(axes, panels, strict=True):
        ax.hist(lengths, bins=min(40, max(5, len(lengths) // 4)), color="#7aa6c2", edgecolor="white")
        for q, style in zip(percentiles, ("--", "-", ":", "-."), strict=False):
            value = float(np.percentile(lengths, q, method="higher"))
            ax.axvline(value, color="#333333", linestyle=style, label=f"p{q:g} = {value:.0f}")
        ax.set(title=f"{title}, {len(lengths):,} rows", xlabel="tokens", ylabel="rows")
    if completion_length is not None:
        clipped = sum(length + overhead > completion_length for length in reasoning_lengths) / len(reasoning_lengths)
        axes[1].axvline(
            completion_length, color="#c0392b", label=f"completion limit {completion_length} ({clipped:.0%} cut)"
        )
    for ax in axes:
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


# --- 01 GRPO concepts and 03 reward lab --------------------------------------------------------------


ADVANTAGE_TITLES = {
    "group": "advantage (reward - group mean) / group std",
    "batch": "advantage (reward - group mean) / batch std",
    "none": "advantage: reward - group mean (not scaled)",
}


def plot_group_advantages(
    labels: list[str], rewards: list[float], advantages: list[float], title: str = "", scale: str = "group"
) -> Figure:
    """Rewards and group-relative advantages of one group side by side (notebooks 01 and 03).

    Bars above zero are reinforced, below zero discouraged; an all-equal group shows no bars at all. ``scale`` is
    the ``scale_rewards`` the advantages were computed with: the axis title says it.
    """
    if scale not in ADVANTAGE_TITLES:
        raise ValueError(f"scale {scale!r}: one of {list(ADVANTAGE_TITLES)} (GRPOConfig's scale_rewards)")
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.4), sharey=False)
    positions = list(range(len(labels)))
    axes[0].bar(positions, rewards, color="#7aa6c2")
    axes[0].set(title="reward", xticks=positions)
    colors = ["#2e8b57" if a > 0 else "#c0392b" for a in advantages]
    axes[1].bar(positions, advantages, color=colors)
    axes[1].axhline(0, color="#333333", linewidth=0.8)
    axes[1].set(title=ADVANTAGE_TITLES[scale], xticks=positions)
    for ax in axes:
        ax.set_xticklabels(labels, rotation=30, ha="right", fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def plot_clipped_objective(ratios: list[float], objectives: dict[str, list[float]], epsilon: float = 0.2) -> Figure:
    """The clipped surrogate ``min(r A, clip(r) A)`` against the ratio r, one curve per advantage (notebook 01).

    The flat parts are where clipping switches the gradient off: the policy may not move further
    than ``1 ± epsilon`` from the one that generated the completions in one update.
    """
    fig, ax = plt.subplots(figsize=(6.5, 3.6))
    for label, values in objectives.items():
        ax.plot(ratios, values, label=label)
    for edge in (1 - epsilon, 1 + epsilon):
        ax.axvline(edge, color="#999999", linestyle=":")
    ax.axvline(1.0, color="#333333", linewidth=0.8)
    ax.set(xlabel="ratio π_θ / π_old", ylabel="objective (the loss is its negative)", title="Clipped objective")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_k3_kl(log_ratios: list[float], k3: list[float], exact: list[float] | None = None) -> Figure:
    """The k3 KL estimate ``exp(r) - r - 1`` against ``r = log π_ref - log π_θ`` (notebook 01)."""
    fig, ax = plt.subplots(figsize=(6.5, 3.4))
    ax.plot(log_ratios, k3, label="k3 = exp(r) - r - 1")
    if exact is not None:
        ax.plot(log_ratios, exact, linestyle="--", label="r² / 2 (small-r approximation)")
    ax.set(xlabel="r = log π_ref - log π_θ (per token)", ylabel="per-token KL estimate", title="KL penalty per token")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_reward_totals(totals: list[float], max_total: float, low: float = 0.3, high: float = 0.7) -> Figure:
    """Histogram of weighted total rewards with the calibration band [low, high] x max (notebook 03)."""
    fig, ax = plt.subplots(figsize=(6.5, 3.2))
    ax.hist(totals, bins=max(5, min(20, len(totals))), range=(min(0.0, min(totals)), max_total), color="#7aa6c2")
    ax.axvspan(low * max_total, high * max_total, color="#2e8b57", alpha=0.12, label=f"{low:.0%}-{high:.0%} of max")
    mean = sum(totals) / len(totals)
    ax.axvline(mean, color="#c0392b", label=f"mean {mean:.2f} / max {max_total:.2f}")
    ax.set(xlabel="weighted total reward", ylabel="completions", title="Total reward over the sample bank")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def figure_png(fig: Figure, dpi: int = 90) -> bytes:
    """The figure as PNG bytes, then closed: what an ``ipywidgets.Image`` shows (the reward lab).

    Widgets that hold images and HTML, rather than an ``Output`` widget that replays rich display
    messages, render the same in JupyterLab, Colab and headless runs (nbclient / nbmake).
    """

    buffer = BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi)
    plt.close(fig)
    return buffer.getvalue()


# --- Training dashboard (notebook 04) ---------------------------------------------------------------

_DASHBOARD_PANELS: tuple[tuple[str, str], ...] = (
    ("reward", "total reward (mean ± std)"),
    ("reward_std", "reward_std (whole batch)"),  # TRL: the std of every reward of the step, not per group
    ("rewards", "each reward's mean"),
    ("completions/mean_length", "completion length (tokens)"),
    ("completions/clipped_ratio", "clipped ratio (truncated)"),
    ("frac_reward_zero_std", "frac_reward_zero_std"),
    ("kl", "kl (beta > 0)"),
    ("tools", "tool calls per completion, failed share"),
)


def plot_training_dashboard(logs: list[dict], title: str = "GRPO training") -> Figure:
    """The training curves of a GRPO run, one panel per metric the monitoring rules read.

    ``logs`` are the training entries of ``trainer.state.log_history`` (dicts with ``reward``); an
    empty list gives empty panels, so the dashboard can be drawn before the first step. The ``kl``
    panel appears only when the logs have a ``kl`` (TRL logs it only when ``beta > 0``), the ``tools`` panel
    only when they have TRL's ``tools/`` columns (a trainer with ``tools=``).
    """
    present = {"kl": any(entry.get("kl") is not None for entry in logs),
               "tools": any(entry.get(TOOL_LOG_COLUMNS[0]) is not None for entry in logs)}  # fmt: skip
    panels = [panel for panel in _DASHBOARD_PANELS if present.get(panel[0], True)]
    columns = max(3, -(-len(panels) // 2))
    fig, axes = plt.subplots(2, columns, figsize=(3.8 * columns + 0.6, 6), squeeze=False)
    steps = [entry.get("step", i + 1) for i, entry in enumerate(logs)]

    def series(key: str) -> tuple[list, list]:
        pairs = [(s, e[key]) for s, e in zip(steps, logs, strict=True) if e.get(key) is not None]
        return [p[0] for p in pairs], [p[1] for p in pairs]

    for ax, (key, label) in zip(axes.flat, panels, strict=False):
        ax.set_title(label, fontsize=10)
        ax.set_xlabel("step")
        if key == "rewards":
            names = sorted({k for e in logs for k in e if k.startswith("rewards/") and k.endswith("/mean")})
            for name in names:
                xs, ys = series(name)
                ax.plot(xs, ys, marker=".", label=name.split("/")[1].replace("_reward_func", ""))
            if names:
                ax.legend(fontsize=7)
            continue
        if key == "tools":
            for column in TOOL_LOG_COLUMNS:
                xs, ys = series(column)
                ax.plot(xs, ys, marker=".", label=column.split("/")[1])
            ax.legend(fontsize=7)
            continue
        xs, ys = series(key)
        ax.plot(xs, ys, marker=".")
        if key == "reward":
            _, stds = series("reward_std")
            if len(stds) == len(ys) and ys:
                ax.fill_between(
                    xs,
                    [y - s for y, s in zip(ys, stds, strict=True)],
                    [y + s for y, s in zip(ys, stds, strict=True)],
                    alpha=0.2,
                )
        if key == "reward_std":
            ax.axhline(0.1, color="red", linestyle=":", linewidth=1)
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def plot_reward_curve(xs: list[float], ys: list[float], xlabel: str, title: str, marker: float | None = None) -> Figure:
    """A reward as a function of one quantity (e.g. the Gaussian length reward against length; notebook 03)."""
    fig, ax = plt.subplots(figsize=(6.5, 3.2))
    ax.plot(xs, ys)
    if marker is not None:
        ax.axvline(marker, color="#999999", linestyle=":", label=f"target {marker:g}")
        ax.legend(fontsize=8)
    ax.set(xlabel=xlabel, ylabel="reward", title=title)
    fig.tight_layout()
    return fig


# --- 04 and 05: the share of right completions per step --------------------------------------------------


def plot_correct_share_curves(curves: Mapping[str, list[float]], window: int = 10, title: str = "") -> Figure:
    """Each run's share of right completions per step, as a trailing mean over ``window`` steps.

    One step of the CPU labs is one group of 8, so a single step reads 0, 1/8 or 2/8: the mean over several steps
    is what can rise. Runs of different lengths share the step axis, so a longer lab shows where a shorter one stops.
    """
    if not curves or not all(len(shares) for shares in curves.values()):
        raise ValueError(f"each curve needs at least one step's share, got {({k: len(v) for k, v in curves.items()})}")
    if not isinstance(window, int) or window < 1:
        raise ValueError(f"window must be a whole number of steps >= 1, got {window!r}")
    fig, ax = plt.subplots(figsize=(8, 3.2))
    for label, shares in curves.items():
        values = np.asarray(shares, dtype=float)
        sums = np.cumsum(np.insert(values, 0, 0.0))
        starts = np.maximum(np.arange(1, len(values) + 1) - window, 0)
        means = (sums[1:] - sums[starts]) / (np.arange(1, len(values) + 1) - starts)
        ax.plot(np.arange(1, len(values) + 1), means, label=f"{label} ({len(values)} steps)")
    ax.set(xlabel="step", ylabel=f"right answers (mean of {window} steps)", ylim=(0, None))
    ax.legend(fontsize=8)
    ax.set_title(title or "Does the share of right answers rise during training?")
    fig.tight_layout()
    return fig


# --- 07 variants ------------------------------------------------------------------------------------

VARIANT_PANELS = (
    ("reward", "reward (mean total)"),
    ("completions/mean_length", "completion length (tokens)"),
    ("completions/clipped_ratio", "truncated completions"),
    ("clip_ratio/low_mean", "clip ratio, low side"),
    ("clip_ratio/high_mean", "clip ratio, high side"),
    ("entropy", "entropy (nats per token)"),
)


def _logged(value: Any) -> bool:
    """A value a step really logged: not missing, not the NaN a table gives a step that did not log it."""
    return value is not None and not (isinstance(value, float) and math.isnan(value))


def plot_variant_curves(curves: dict[str, list[dict]], title: str = "GRPO variants") -> Figure:
    """One panel per logged metric, one line per variant (notebook 07).

    ``curves`` maps a variant's name to its log entries (dicts with ``step`` and TRL's metric keys, e.g. the
    seeds' mean per step). A metric a variant did not log (clip ratios of an on-policy run are all 0) is a flat
    or missing line, never an error.
    """
    fig, axes = plt.subplots(2, 3, figsize=(13, 6.5))
    for ax, (key, label) in zip(axes.flat, VARIANT_PANELS, strict=True):
        for name, logs in curves.items():
            pairs = [(e.get("step", i + 1), e[key]) for i, e in enumerate(logs) if _logged(e.get(key))]
            if pairs:
                ax.plot([p[0] for p in pairs], [p[1] for p in pairs], marker=".", label=name)
        ax.set_title(label, fontsize=10)
        ax.set_xlabel("step")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 5), fontsize=8)
    fig.suptitle(title)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    return fig


def plot_variant_table(summary: Any, metric: str, baseline: str | None = None, title: str = "") -> Figure:
    """A metric's mean per variant as bars, with the seeds' spread (max - min) as error bars (notebook 07).

    ``summary`` is a DataFrame indexed by variant with ``<metric>`` and ``<metric>_spread`` columns
    (``variant_tables.seed_summary``). The baseline's bar is darker, so a gap inside the whiskers reads as noise.
    """
    if metric not in summary.columns or f"{metric}_spread" not in summary.columns:
        raise ValueError(f"summary needs columns {metric!r} and {metric + '_spread'!r}; got {list(summary.columns)}")
    names = [str(n) for n in summary.index]
    fig, ax = plt.subplots(figsize=(max(6.0, 0.8 * len(names)), 3.4))
    colors = ["#2c5d7c" if name == baseline else "#7aa6c2" for name in names]
    ax.bar(names, summary[metric], yerr=summary[f"{metric}_spread"] / 2, color=colors, capsize=4)
    ax.set(ylabel=metric, title=title or f"{metric}: mean over seeds, whiskers = seed spread")
    ax.tick_params(axis="x", rotation=30)
    fig.tight_layout()
    return fig
