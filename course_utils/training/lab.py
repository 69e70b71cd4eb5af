"""The whole lab in one call, for scripts, benchmarks and notebooks that need a trained model.

``run_training`` chains what notebook 04 does one cell at a time: load, warm start, GRPO, save.
``trained_model_or_short_run`` gives notebooks 05 and 06 notebook 04's result, or a ci-sized stand-in run
when notebook 04 has not run (CI runs each notebook on its own). ``tiny_grpo_run`` is notebook 06's one-step run
that reproduces a failure.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from course_utils.core.paths import output_dir
from course_utils.core.profiles import Profile, get_profile
from course_utils.core.speedups import NO_SPEEDUPS, SpeedUps
from course_utils.training import run_folder
from course_utils.training.grpo_config import make_grpo_config
from course_utils.training.run import build_trainer, clear_run_dir, load_model_for_training
from course_utils.training.run_logs import save_run_artifacts
from course_utils.training.trained_model import (
    default_run_dir,
    final_model_dir,
    find_trained_model,
    missing_final_note,
    older_final_note,
    save_final,
)
from course_utils.training.warm_start import warm_start


@dataclass
class RunResult:
    """What ``run_training`` did: the trainer (with its log history), where it saved, and how long each part took."""

    trainer: Any
    tokenizer: Any
    run_dir: Path
    final_dir: Path
    warm_start_seconds: float
    train_seconds: float


def run_training(
    profile: Profile | str | None = None,
    callbacks: Iterable[TrainerCallback] = (),
    before_train: Any = None,
    speedups: SpeedUps = NO_SPEEDUPS,
    **config_overrides: Any,
) -> RunResult:
    """The whole of notebook 04 in one call (fresh run): load, warm start, train, save artifacts and model.

    For scripts and the benchmark; the notebook runs the same steps one cell at a time. ``before_train``
    is called with the trainer just before training (to instrument it, say); ``config_overrides`` replace
    ``GRPOConfig`` fields (``seed=1``: the same warm start, another GRPO run). The config, the model and the
    trainer are all built (and so checked) before the previous run's outputs are deleted: a bad setting stops
    the run with the previous one still on disk. The config comes first, so it fails before the warm start.
    ``speedups``: the plug-in the warm start and GRPO train with (``speedups=cpu_speed``), default plain TRL.
    """
    p = get_profile(profile)
    config = make_grpo_config(p, **config_overrides)
    # One run in the folder from before the warm start (its save replaces the earlier one) to the saved model
    with run_folder.locked(default_run_dir(p)):
        started = time.perf_counter()
        model, tokenizer = load_model_for_training(p)
        if p.warm_start_examples:
            model = warm_start(model, tokenizer, p, cache=True, speedups=speedups)  # kept: notebook 05 evaluates it
        warm_seconds = time.perf_counter() - started
        trainer = build_trainer(model, tokenizer, p, config=config, callbacks=callbacks)
        run_dir = clear_run_dir(default_run_dir(p))
        if config.log_completions:  # TRL made this folder when the trainer was built; the clearing removed it
            (Path(config.output_dir) / "completions").mkdir(parents=True, exist_ok=True)
        if before_train is not None:
            before_train(trainer)
        started = time.perf_counter()
        with speedups.enabled(trainer, profile=p):
            trainer.train()
        train_seconds = time.perf_counter() - started
        save_run_artifacts(trainer.state.log_history, run_dir)
        final_dir = save_final(trainer, tokenizer)
    return RunResult(trainer, tokenizer, run_dir, final_dir, warm_seconds, train_seconds)


# The training sizes of a "short run": the ci profile's, so the notebook runs standalone in about a minute.
SHORT_RUN_FIELDS = (
    "num_generations",
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "max_completion_length",
    "max_steps",
    "save_steps",
    "logging_steps",
    "train_size",
    "warm_start_examples",
)


def short_run_profile(profile: Any = None) -> Any:
    """``profile`` with the ci profile's training sizes, renamed ``<name>-short`` so it never overwrites a real run."""
    p, ci = get_profile(profile), get_profile("ci")
    if p.name.endswith("-short"):
        return p
    return p.override(name=f"{p.name}-short", **{field: getattr(ci, field) for field in SHORT_RUN_FIELDS})


def train_short_run(profile: Any = None, speedups: SpeedUps = NO_SPEEDUPS) -> Path:
    """Train a ci-sized GRPO run of ``profile``'s model (warm start, a few steps) and save it; return the folder.

    The same whole run as notebook 04 (``run_training``, with ``speedups``), only with the ci profile's sizes.
    """
    return run_training(short_run_profile(profile), speedups=speedups).final_dir


STAND_IN_NOTE = "stand-in short run"


def trained_label(label: str, is_short_run: bool) -> str:
    """``label`` for a table, a figure or a result, marked ``(stand-in short run)`` when the model is the stand-in.

    Why: notebook 05 without notebook 04's model evaluates a ci-sized run that barely trained; every table and
    figure it feeds must say so, not only the cell that trained it.
    """
    return f"{label} ({STAND_IN_NOTE})" if is_short_run else label


def trained_model_or_short_run(profile: Any = None, speedups: SpeedUps = NO_SPEEDUPS) -> tuple[Path, bool]:
    """The trained model's folder for ``profile``, and whether it is a stand-in short run.

    Looks for notebook 04's result first; without one it says so and uses (or trains, once) a ci-sized short run,
    so this notebook also runs on its own. A short run barely trains: its numbers show the method, not the effect.
    ``speedups``: the plug-in a short run trains with, default plain TRL.
    """
    folder = find_trained_model(profile)
    if folder is not None:
        print(f"Trained model found: {folder}")
        note = older_final_note(folder, profile)  # a later save cut short leaves an earlier step's model there
        if note:
            print(note)
        return folder, False
    short = short_run_profile(profile)
    print(f"{missing_final_note(final_model_dir(profile), get_profile(profile))} (To evaluate your own run.)")
    folder = find_trained_model(short)
    if folder is not None:
        print(f"Fallback: the {STAND_IN_NOTE} already on disk, {folder}; it only demonstrates the method.")
        return folder, True
    print(f"Fallback: training a {STAND_IN_NOTE} ({short.max_steps} GRPO steps); it only demonstrates the method.")
    return train_short_run(short, speedups), True


def tiny_grpo_run(
    profile: Any,
    reward_funcs: list[Any],
    train_dataset: Any,
    name: str,
    *,
    max_steps: int = 1,
    max_completion_length: int = 12,
    **overrides: Any,
) -> tuple[Any, list[dict[str, Any]]]:
    """A real, deliberately tiny GRPOTrainer run (fresh model, a few steps, few tokens): (config, log history).

    The troubleshooting notebook reproduces each failure with one of these instead of describing it:
    same trainer, same metrics as a real run, seconds instead of hours. ``overrides`` go to ``GRPOConfig``.
    """
    model, tokenizer = load_model_for_training(profile)
    config = make_grpo_config(
        profile,
        output_dir() / f"06-{name}",
        max_steps=max_steps,
        max_completion_length=max_completion_length,
        reward_weights=None,
        save_strategy="no",
        logging_steps=1,
        **overrides,
    )
    trainer = build_trainer(model, tokenizer, profile, train_dataset, config, reward_funcs=list(reward_funcs))
    trainer.train()
    return config, trainer.state.log_history
