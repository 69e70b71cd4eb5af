"""Train GRPO from a course profile outside the notebook: one GPU, several GPUs, or several CPU processes.

Notebook 04's steps (course_utils.training.run), from the same profile, with overrides on the command line::

    python scripts/train_grpo.py --profile gpu --set max_steps=200 --set learning_rate=3e-5
    accelerate launch --config_file configs/accelerate/ddp.yaml --num_processes 4 scripts/train_grpo.py --profile gpu
    accelerate launch --cpu --num_processes 2 scripts/train_grpo.py --profile ci        # CPUs (gloo)

``--set FIELD=VALUE`` changes a profile field (``course_utils.core.profiles.Profile``); ``--config FIELD=VALUE`` a
``GRPOConfig`` field the profile does not have. ``--vllm-server URL`` generates on a separate ``trl vllm-serve``.
Under several processes, only the main one clears the run folder and saves the model.

Nothing is lost by accident: the whole configuration is built and checked before the run folder is touched; a
folder holding an earlier run is continued with ``--resume`` or deleted with ``--overwrite``, never silently.
A Ctrl-C ends the run after the step in progress, with a checkpoint of it (a second one stops at once); an
interrupted or failed run keeps its log history and says how to continue it.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from accelerate import PartialState
from transformers.trainer_utils import get_last_checkpoint

from course_utils import cpu_speed
from course_utils.core.profiles import Profile, get_profile, profile_names
from course_utils.lesson.models import ModelUnavailableError
from course_utils.training.monitoring import StopOnInterrupt, save_run_artifacts
from course_utils.training.run import (
    WARM_START_DIRNAME,
    build_trainer,
    clear_run_dir,
    default_run_dir,
    load_model_for_training,
    make_grpo_config,
    save_final,
    warm_start_model_dir,
)
from course_utils.training.warm_start import warm_start


def parse_value(text: str) -> Any:
    """A Python literal when the text is one (``3``, ``2e-4``, ``True``, ``None``, ``(1.0, 0.5)``), else the string."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def parse_assignments(items: list[str], option: str) -> dict[str, Any]:
    """``["a=1", "b=x"]`` as ``{"a": 1, "b": "x"}``; a clear error for an item without ``=``."""
    values = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise SystemExit(f"error: {option} takes FIELD=VALUE, got {item!r} (example: {option} max_steps=50)")
        values[name.strip()] = parse_value(value.strip())
    return values


def profile_from_args(name: str, changes: dict[str, Any]) -> Profile:
    """The named profile with ``changes`` applied; tuples stay tuples (``lora_target_modules``, weights)."""
    profile = get_profile(name)
    fields = {f.name: f for f in dataclasses.fields(Profile)}
    for key, value in changes.items():
        if isinstance(value, list) and key in fields:
            changes[key] = tuple(value)
    try:
        return profile.override(**changes)
    except ValueError as exc:
        raise SystemExit(f"error: --set: {exc}") from None


def config_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """GRPOConfig fields from ``--config`` and ``--vllm-server``."""
    overrides = parse_assignments(args.config, "--config")
    if args.vllm_server:
        overrides.update(use_vllm=True, vllm_mode="server", vllm_server_base_url=args.vllm_server)
    return overrides


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", required=True, choices=profile_names(), help="the hardware profile")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="change a profile field")
    parser.add_argument("--config", action="append", default=[], metavar="FIELD=VALUE", help="a GRPOConfig field")
    parser.add_argument("--output-dir", type=Path, help="the run folder (default outputs/grpo-<profile>)")
    start = parser.add_mutually_exclusive_group()
    start.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in the run folder")
    start.add_argument("--overwrite", action="store_true", help="delete an earlier run in the run folder first")
    parser.add_argument("--vllm-server", metavar="URL", help="generate on a `trl vllm-serve` server at URL")
    return parser


def build_config(profile: Profile, run_dir: Path, overrides: dict[str, Any]) -> Any:
    """The run's ``GRPOConfig``, checked (field names, generation batch, TRL's own checks) as a clear exit."""
    try:
        return make_grpo_config(profile, run_dir, **overrides)
    except (ValueError, TypeError) as exc:
        raise SystemExit(f"error: --config / --set: {exc}") from None


def earlier_run(run_dir: Path) -> list[str]:
    """What an earlier run left in ``run_dir`` (checkpoints, ``final``, logs), the reusable warm start aside."""
    if not run_dir.is_dir():
        return []
    return sorted(child.name for child in run_dir.iterdir() if child.name != WARM_START_DIRNAME)


def checkpoint_to_resume(run_dir: Path, resume: bool) -> str | None:
    """The checkpoint ``--resume`` continues from (said aloud), or None for a fresh start at step 0.

    A ``--resume`` that finds no checkpoint over an earlier run's results is refused: starting at step 0 would
    replace them.
    """
    found = earlier_run(run_dir)
    checkpoint = get_last_checkpoint(str(run_dir)) if found else None
    if resume and checkpoint:
        step = trainer_state_step(Path(checkpoint))
        print(f"--resume: continuing from {checkpoint} (step {step})")
        return checkpoint
    if found and resume:
        raise SystemExit(
            f"error: --resume: no checkpoint-N in {run_dir} to continue from (it holds {', '.join(found)}). "
            "Pass --overwrite to delete that run and start again at step 0."
        )
    if resume:
        print(f"--resume: no checkpoint in {run_dir}; starting at step 0")
    return None


def trainer_state_step(checkpoint: Path) -> int | str:
    """The step a checkpoint saved (its ``trainer_state.json``), or its folder suffix when that cannot be read."""
    try:
        return json.loads((checkpoint / "trainer_state.json").read_text())["global_step"]
    except (OSError, ValueError, KeyError):
        return checkpoint.name.rsplit("-", 1)[-1]


def check_run_dir(run_dir: Path, args: argparse.Namespace) -> None:
    """Refuse, before any work, to start over a folder holding an earlier run unless ``--overwrite`` says so."""
    found = earlier_run(run_dir)
    if found and not (args.resume or args.overwrite):
        raise SystemExit(
            f"error: {run_dir} holds an earlier run ({', '.join(found)}). Pass --resume to continue it, "
            "--overwrite to delete it and start again, or --output-dir for a new folder."
        )


@contextlib.contextmanager
def inputs_explained() -> Iterator[None]:
    """While the run is set up: a bad input (data, model cache, weights) exits with its message, no traceback.

    These errors already name the file, field or setting and the fix; the run folder is untouched at this point.
    """
    try:
        yield
    except (ValueError, OSError, ModelUnavailableError) as exc:
        raise SystemExit(f"error: {exc}") from None


def keep_what_was_done(trainer: Any, run_dir: Path, is_main: bool) -> None:
    """After a stop or a failure mid-run: a checkpoint of the last finished step, and the log history so far.

    The checkpoint is the trainer's own (``_save_checkpoint``: model, optimizer, scheduler, RNG, state), so
    ``--resume`` continues from it; a step already checkpointed is not saved again. One process only: saving
    under several would wait on processes that may have stopped.
    """
    step = trainer.state.global_step
    if is_main and step > 0 and not (run_dir / f"checkpoint-{step}").is_dir():
        trainer._save_checkpoint(trainer.model, trial=None)
    if is_main:
        save_run_artifacts(trainer.state.log_history, run_dir)
    last = get_last_checkpoint(str(run_dir)) if run_dir.is_dir() else None
    where = f"checkpoint {last}" if last else "no checkpoint (no step had finished)"
    print(f"stopped at step {step} of {trainer.state.max_steps}: {where}; log history in {run_dir / 'log_history.csv'}")
    if last:
        print("continue with the same command and --resume")


def main(argv: list[str] | None = None) -> Path:
    args = build_parser().parse_args(argv)
    profile = profile_from_args(args.profile, parse_assignments(args.set, "--set"))
    overrides = config_overrides(args)
    state = PartialState()  # the process group accelerate launch / torchrun set up (one process otherwise)
    run_dir = args.output_dir or default_run_dir(profile)
    # Everything is checked before the run folder is touched: a typo must not cost the earlier run
    config = build_config(profile, run_dir, overrides)
    check_run_dir(run_dir, args)
    checkpoint = checkpoint_to_resume(run_dir, args.resume)

    interrupt = StopOnInterrupt() if state.num_processes == 1 else None
    with inputs_explained():
        model, tokenizer = load_model_for_training(profile)
        if profile.warm_start_examples:
            # One process caches the primed model for --resume; several would write the same files at once
            cache = warm_start_model_dir(run_dir) if state.num_processes == 1 else False
            model = warm_start(model, tokenizer, profile, cache=cache)
        trainer = build_trainer(model, tokenizer, profile, config=config, callbacks=[interrupt] if interrupt else [])
    if state.is_main_process and args.overwrite and earlier_run(run_dir):
        print(f"--overwrite: deleting the earlier run in {run_dir} ({', '.join(earlier_run(run_dir))})")
        clear_run_dir(run_dir)
    state.wait_for_everyone()
    try:
        with interrupt or contextlib.nullcontext(), cpu_speed.enabled(trainer, profile=profile):
            trainer.train(resume_from_checkpoint=checkpoint)
    except BaseException:
        keep_what_was_done(trainer, run_dir, state.is_main_process)
        raise
    if interrupt is not None and interrupt.requested:
        keep_what_was_done(trainer, run_dir, state.is_main_process)
        raise SystemExit(130)

    final_dir = run_dir / "final"
    if state.is_main_process:
        save_run_artifacts(trainer.state.log_history, run_dir)
        save_final(trainer, tokenizer, final_dir)
        print(f"trained {trainer.state.global_step} steps on {state.num_processes} process(es); model in {final_dir}")
    state.wait_for_everyone()
    return final_dir


if __name__ == "__main__":
    main()
