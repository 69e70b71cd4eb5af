"""Train GRPO from a course profile outside the notebook: one GPU, several GPUs, or several CPU processes.

Notebook 04's steps (course_utils.training.run), from the same profile, with overrides on the command line::

    python scripts/train_grpo.py --profile gpu --set max_steps=200 --set learning_rate=3e-5
    accelerate launch --config_file configs/accelerate/ddp.yaml --num_processes 4 scripts/train_grpo.py --profile gpu
    accelerate launch --cpu --num_processes 2 scripts/train_grpo.py --profile ci        # CPUs (gloo)

``--set FIELD=VALUE`` changes a profile field (``course_utils.core.profiles.Profile``); ``--config FIELD=VALUE`` a
``GRPOConfig`` field the profile does not have. ``--vllm-server URL`` generates on a separate ``trl vllm-serve``.
Under several processes, only the main one clears the run folder and saves the model.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
from pathlib import Path
from typing import Any

from accelerate import PartialState
from transformers.trainer_utils import get_last_checkpoint

from course_utils.core.profiles import Profile, get_profile, profile_names
from course_utils.training.monitoring import save_run_artifacts
from course_utils.training.run import (
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
    parser.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in the run folder")
    parser.add_argument("--vllm-server", metavar="URL", help="generate on a `trl vllm-serve` server at URL")
    return parser


def main(argv: list[str] | None = None) -> Path:
    args = build_parser().parse_args(argv)
    profile = profile_from_args(args.profile, parse_assignments(args.set, "--set"))
    overrides = config_overrides(args)
    state = PartialState()  # the process group accelerate launch / torchrun set up (one process otherwise)
    run_dir = args.output_dir or default_run_dir(profile)
    if state.is_main_process and not args.resume:
        clear_run_dir(run_dir)
    state.wait_for_everyone()

    model, tokenizer = load_model_for_training(profile)
    if profile.warm_start_examples:
        # One process caches the primed model for --resume; several would write the same files at once
        cache = warm_start_model_dir(run_dir) if state.num_processes == 1 else False
        model = warm_start(model, tokenizer, profile, cache=cache)
    config = make_grpo_config(profile, run_dir, **overrides)
    trainer = build_trainer(model, tokenizer, profile, config=config)
    # transformers' own resume: the newest checkpoint-N of the run folder (None: none there, start at step 0)
    trainer.train(resume_from_checkpoint=get_last_checkpoint(str(run_dir)) if args.resume else None)

    final_dir = run_dir / "final"
    if state.is_main_process:
        save_run_artifacts(trainer.state.log_history, run_dir)
        save_final(trainer, tokenizer, final_dir)
        print(f"trained {trainer.state.global_step} steps on {state.num_processes} process(es); model in {final_dir}")
    state.wait_for_everyone()
    return final_dir


if __name__ == "__main__":
    main()
