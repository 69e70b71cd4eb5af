"""The article's two weight tables compared by training: the `cpu` lab run with "initial" and with "tuned".

Every run has the same warm start, data, steps and evaluation problems; only the reward weights and the
seed change. Two seeds per preset measure the run-to-run spread, the yardstick for the preset difference.
Prints ``name: value`` lines and writes everything (log histories, evaluations) to
``outputs/bench/reward_presets.json``, which notebooks 05 and 06 read (run:
``.venv/bin/python benchmarks/bench_reward_presets.py``; ``BENCH_SEEDS=42`` for one seed per preset).

- ``<preset>_seed<s>_test_accuracy`` (strict: the answer in the tags) / ``..._test_lenient_accuracy`` (the last
  number) / ``..._test_format_score`` (strict format): the
  trained model on the profile's ``eval_size`` GSM8K test problems (greedy, ``eval_max_new_tokens``);
- ``<preset>_seed<s>_reward_last_fifth``: mean total training reward over the last fifth of the steps,
  as a share of the preset's ``max_total_reward``;
- ``reward_curves_png``: each reward's curve, one line per run (``outputs/bench/reward_presets.png``);
- ``<preset>_..._spread``: max - min over the seeds; ``tuned_minus_initial_...``: difference of the seed means;
- the first run (initial, first seed) trains in the profile's own run folder with every checkpoint kept, so
  notebook 05 can evaluate it (three models, and the checkpoints on validation problems) without retraining.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from course_utils import cpu_speed
from course_utils.core.hardware import machine_summary
from course_utils.core.paths import output_dir
from course_utils.core.profiles import get_profile
from course_utils.evaluation import heldout as evaluation
from course_utils.lesson.rewards import REWARD_NAMES, grpo_reward_weights, max_total_reward
from course_utils.training import grpo_config, run_folder, trained_model
from course_utils.training import run as training
from course_utils.training.memory_measurement import peak_rss_gb
from course_utils.training.warm_start import warm_start

PRESETS = ("initial", "tuned")
METRICS = ("accuracy", "lenient_accuracy", "format_score")  # strict accuracy, last-number accuracy, strict format


def cpu_kind() -> str:
    """The machine's CPU and precision path (every figure names the machine it came from)."""
    summary = machine_summary()
    return f"{summary['machine_cpu']} ({summary['cpu_capability']}, {summary['cpu_precision_path']} path)"


def scores(result: dict[str, Any]) -> dict[str, float]:
    """The three rates the course compares, from an ``evaluate_model`` result."""
    return {metric: result[metric] for metric in METRICS}


def one_run(profile: Any, preset: str, seed: int, run_dir: Path, test: Any, keep_checkpoints: bool) -> dict[str, Any]:
    """Warm start (cached), GRPO with the preset's weights and seed, then the held-out evaluation."""
    model, tokenizer = training.load_model_for_training(profile)
    model = warm_start(model, tokenizer, profile, cache=True, speedups=cpu_speed)  # the lab's plug-in, as it trains
    training.clear_run_dir(run_dir)
    config = grpo_config.make_grpo_config(
        profile,
        run_dir,
        seed=seed,
        reward_weights=grpo_reward_weights(preset),
        save_total_limit=None if keep_checkpoints else 1,
    )
    trainer = training.build_trainer(model, tokenizer, profile, config=config)
    started = time.perf_counter()
    with cpu_speed.enabled(trainer, profile=profile):
        trainer.train()
    seconds = time.perf_counter() - started
    history = [dict(h) for h in trainer.state.log_history]
    trained_model.save_final(trainer, tokenizer)
    trained, eval_tokenizer = trained_model.load_trained_model(profile, run_dir / run_folder.FINAL_DIRNAME)
    result = evaluation.evaluate_model(
        trained,
        eval_tokenizer,
        test,
        batch_size=profile.eval_batch_size,
        max_new_tokens=profile.eval_max_new_tokens,
        progress=False,
        speedups=cpu_speed,  # the same greedy tokens, generated faster on a CPU
    )
    run = {
        "preset": preset,
        "seed": seed,
        "weights": grpo_reward_weights(preset),
        "max_total_reward": max_total_reward(preset),
        "train_seconds": seconds,
        "log_history": history,
        "test": scores(result),
        "test_counts": {m: result[f"{m}_count"] for m in METRICS},
    }
    return run


def reward_last_fifth(run: dict[str, Any]) -> float:
    """Mean total reward over the last fifth of the logged steps, as a share of the preset's maximum."""
    rewards = [h["reward"] for h in run["log_history"] if "reward" in h]
    tail = rewards[-max(len(rewards) // 5, 1) :]
    return statistics.fmean(tail) / run["max_total_reward"]


def plot_reward_curves(report: dict[str, Any], path: Path) -> Path:
    """One panel per reward (its unweighted mean per step, as TRL logs it), one line per run; saved as PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = report["reward_names"]
    fig, axes = plt.subplots(1, len(names) + 1, figsize=(4 * (len(names) + 1), 3.2), sharex=True)
    for run in report["runs"]:
        label = f"{run['preset']} seed {run['seed']}"
        style = "-" if run["preset"] == "initial" else "--"
        logs = [h for h in run["log_history"] if "reward" in h]
        steps = [h["step"] for h in logs]
        for ax, name in zip(axes, names, strict=False):
            ax.plot(steps, [h.get(f"rewards/{name}/mean") for h in logs], style, label=label)
            ax.set_title(name.removesuffix("_reward_func"), fontsize=9)
        axes[-1].plot(steps, [h["reward"] / run["max_total_reward"] for h in logs], style, label=label)
    axes[-1].set_title("weighted total / its maximum", fontsize=9)
    axes[-1].legend(fontsize=7)
    for ax in axes:
        ax.set_xlabel("step")
    fig.suptitle(f"profile {report['profile']}, {report['cpu']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def main() -> None:
    profile = get_profile(os.environ.get("COURSE_PROFILE", "cpu"))
    seeds = [int(s) for s in os.environ.get("BENCH_SEEDS", "42,43").split(",")]
    out_path = output_dir() / "bench" / "reward_presets.json"
    out_path.parent.mkdir(parents=True, exist_ok=True)
    test = evaluation.test_problems(profile)
    started = time.perf_counter()
    runs: list[dict[str, Any]] = []
    for seed in seeds:  # both presets per seed first, so a stopped benchmark still compares them
        for preset in PRESETS:
            first = not runs
            run_dir = trained_model.default_run_dir(profile) if first else out_path.parent / f"{preset}-seed{seed}"
            with contextlib.redirect_stdout(sys.stderr):  # the trainers' per-step log lines are not results
                runs.append(one_run(profile, preset, seed, run_dir, test, keep_checkpoints=first))
            report = {"profile": profile.name, "cpu": cpu_kind(), "reward_names": REWARD_NAMES, "runs": runs}
            out_path.write_text(json.dumps(report, indent=1, default=str))
    print(f"reward_curves_png: {plot_reward_curves(report, out_path.with_suffix('.png'))}")
    print(f"cpu_kind: {cpu_kind()}")
    print(f"profile: {profile.name}")
    print(f"machine_load_average: {os.getloadavg()[0]:.2f}")
    for run in runs:
        tag = f"{run['preset']}_seed{run['seed']}"
        for metric, value in run["test"].items():
            print(f"{tag}_test_{metric}: {value:.3f}")
        print(f"{tag}_reward_last_fifth: {reward_last_fifth(run):.3f}")
        print(f"{tag}_train_minutes: {run['train_seconds'] / 60:.1f}")
    for metric in METRICS:
        means = {}
        for preset in PRESETS:
            values = [r["test"][metric] for r in runs if r["preset"] == preset]
            means[preset] = statistics.fmean(values)
            print(f"{preset}_{metric}_mean: {means[preset]:.3f}")
            print(f"{preset}_{metric}_spread: {max(values) - min(values):.3f}")
        print(f"tuned_minus_initial_{metric}: {means['tuned'] - means['initial']:.3f}")
    print(f"bench_minutes: {(time.perf_counter() - started) / 60:.1f}")
    print(f"peak_rss_gb: {peak_rss_gb():.2f}")
    print(f"results_file: {out_path}")


if __name__ == "__main__":
    main()
