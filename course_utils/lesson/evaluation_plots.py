"""The figures of models measured and runs diagnosed: held-out rates before and after GRPO, each stage's rates,
speed and length, training against validation, memory by part (notebooks 05 and 06).

Like ``lesson.plotting``: each function takes plain data, draws on a new matplotlib figure and returns it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

# --- 05 evaluation -----------------------------------------------------------------------------------


def plot_before_after_rates(table: Any, metrics: tuple[str, ...] | None = None, title: str = "") -> Figure:
    """Grouped bars of the rates before and after training, with 95% Wilson error bars (notebook 05).

    ``table`` is ``evaluation.tables.compare_results(before, after, labels)``: its first two columns are the
    two models, and ``<label>_ci_low`` / ``<label>_ci_high`` the interval bounds. Overlapping bars with long error
    bars are the picture of "we cannot tell yet": evaluate on more problems. By default every row with an
    interval (the rates) is drawn, under a title naming the two models. Two models only: with a warm start,
    ``plot_stage_rates`` shows each stage, so the warm start's gain is not read as GRPO's.
    """

    labels = list(table.columns[:2])
    metrics = tuple(metrics or table.index[table[f"{labels[0]}_ci_low"].notna()])
    positions = np.arange(len(metrics))
    width = 0.38
    fig, ax = plt.subplots(figsize=(9, 3.8))
    for offset, label, color in zip((-width / 2, width / 2), labels, ("#9aa5b1", "#2e8b57"), strict=True):
        values = table.loc[list(metrics), label].to_numpy(dtype=float)
        low = table.loc[list(metrics), f"{label}_ci_low"].to_numpy(dtype=float)
        high = table.loc[list(metrics), f"{label}_ci_high"].to_numpy(dtype=float)
        errors = np.vstack([np.clip(values - low, 0, None), np.clip(high - values, 0, None)])
        ax.bar(positions + offset, values, width, yerr=errors, capsize=4, color=color, label=label)
    ax.set_xticks(positions, [m.replace("_", " ") for m in metrics], rotation=15, ha="right")
    ax.set(ylim=(0, 1.05), ylabel="rate (95% Wilson CI)", title=title or f"{labels[0]} and {labels[1]}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


STAGE_RATES = ("accuracy", "lenient_accuracy", "exact_match_accuracy", "format_score", "soft_format_score",
               "truncation_rate")  # fmt: skip
STAGE_COLORS = ("#9aa5b1", "#5b8fc7", "#2e8b57", "#c7783b", "#8e6bbf")


def plot_stage_rates(
    results: Mapping[str, Mapping[str, Any]], metrics: tuple[str, ...] = STAGE_RATES, title: str = ""
) -> Figure:
    """Grouped bars of the rates of every stage (base, warm start, after GRPO), with 95% Wilson error bars.

    ``results`` maps each stage's name to its ``evaluate_model`` result (``<metric>`` and ``<metric>_ci``), in
    training order, all on the same problems. One bar per stage and rate: what each stage added shows as the step
    from its left neighbour, so the warm start's share is not credited to GRPO (notebook 05). The default title
    names the stages drawn.
    """
    names = list(results)
    if not names:
        raise ValueError("results is empty: pass at least one evaluated model")
    metrics = tuple(m for m in metrics if all(m in result for result in results.values()))
    positions = np.arange(len(metrics))
    width = 0.8 / len(names)
    fig, ax = plt.subplots(figsize=(9.5, 3.8))
    for index, name in enumerate(names):
        result = results[name]
        values = np.array([float(result[m]) for m in metrics])
        bounds = np.array([result.get(f"{m}_ci", (math.nan, math.nan)) for m in metrics], dtype=float).reshape(-1, 2)
        errors = np.vstack([np.clip(values - bounds[:, 0], 0, None), np.clip(bounds[:, 1] - values, 0, None)])
        offset = (index - (len(names) - 1) / 2) * width
        color = STAGE_COLORS[index % len(STAGE_COLORS)]
        ax.bar(positions + offset, values, width, yerr=np.nan_to_num(errors), capsize=3, color=color, label=name)
    ax.set_xticks(positions, [m.replace("_", " ") for m in metrics], rotation=15, ha="right")
    ax.set(ylim=(0, 1.05), ylabel="rate (95% Wilson CI)", title=title or " → ".join(names))
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_speed_and_length(table: Any, title: str = "") -> Figure:
    """Speed and length before and after training, side by side: decoding speed, seconds per problem, answer length.

    ``table`` is ``compare_results(...)``. Decoding tokens/s leaves out reading the prompt (prefill), so it says
    whether the model got slower per token written; seconds per problem says what a learner waits, and tokens per
    completion says why the two can move apart: a model that learned to answer shorter takes fewer seconds per
    problem at the same decoding speed.
    """
    labels = list(table.columns[:2])
    panels = (("decode_tokens_per_second", "decoding tokens / s"), ("seconds_per_problem", "seconds / problem"),
              ("mean_completion_tokens", "tokens per completion"))  # fmt: skip
    fig, axes = plt.subplots(1, 3, figsize=(11, 3.2))
    for ax, (metric, name) in zip(axes, panels, strict=True):
        values = [float(table.loc[metric, label]) for label in labels]
        bars = ax.bar(labels, values, color=("#9aa5b1", "#2e8b57"))
        ax.bar_label(bars, fmt="%.1f", fontsize=8)
        ax.set(title=name)
    fig.suptitle(title or "Speed and length: measured, not quoted")
    fig.tight_layout()
    return fig


# --- 06 troubleshooting ------------------------------------------------------------------------------


def plot_train_vs_validation(train: list[dict], validation: list[dict], title: str = "") -> Figure:
    """Training reward (left axis) against validation accuracy (right axis): the picture of overfitting.

    ``train`` holds ``{"step", "reward"}`` rows, ``validation`` ``{"step", "accuracy"}`` rows. Two axes because
    the two numbers have different scales; what matters is that one keeps rising while the other stays flat.
    """
    fig, ax = plt.subplots(figsize=(7, 3.2))
    ax.plot([r["step"] for r in train], [r["reward"] for r in train], color="#2e8b57", label="training reward")
    ax.set(xlabel="step", ylabel="training reward")
    other = ax.twinx()
    other.plot([r["step"] for r in validation], [r["accuracy"] for r in validation], "o--", color="#c0392b",
               label="validation accuracy")  # fmt: skip
    other.set(ylabel="validation accuracy", ylim=(0, 1))
    fig.legend(loc="upper left", bbox_to_anchor=(0.1, 0.9), fontsize=8)
    ax.set_title(title or "Overfitting: training reward rises, validation accuracy stalls")
    fig.tight_layout()
    return fig


def plot_memory_breakdown(table: Any, available_gb: float | None = None, title: str = "") -> Figure:
    """Stacked bars of the memory estimate's parts, one bar per row of ``memory.what_if_table``.

    The larger of the training phase (activations plus the output head's log-softmax workspace) and the
    KV cache is drawn (they are not needed at the same time), the packed weights a CPU LoRA run keeps where
    there are any, and a
    dashed line marks the memory the GPU offers, so each fix shows which part it shrinks.
    """

    parts = ["weights_gb", "reference_model_gb", "gradients_gb", "optimizer_gb", "overhead_gb"]
    if "kept_packs_gb" in table and (table["kept_packs_gb"] > 0).any():  # a CPU LoRA run's packed weights
        parts.insert(-1, "kept_packs_gb")
    labels = [str(i) for i in table.index]
    fig, ax = plt.subplots(figsize=(8, 3.6))
    bottom = np.zeros(len(table))
    for part in parts:
        values = table[part].to_numpy(dtype=float)
        ax.bar(labels, values, bottom=bottom, label=part.removesuffix("_gb").replace("_", " "))
        bottom += values
    training = table["activations_gb"].to_numpy(dtype=float)
    if "logprob_gb" in table:
        training = training + table["logprob_gb"].to_numpy(dtype=float)
    peak = np.maximum(training, table["kv_cache_gb"].to_numpy(dtype=float))
    ax.bar(labels, peak, bottom=bottom, label="activations + log-softmax (or KV cache)", hatch="//", alpha=0.7)
    if available_gb is not None:
        ax.axhline(available_gb, color="black", linestyle="--", label=f"available {available_gb:g} GB")
    ax.set(ylabel="GB", title=title or "Estimated peak memory by part")
    ax.tick_params(axis="x", labelrotation=20)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    return fig
