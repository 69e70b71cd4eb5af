"""Train GRPO from a course profile outside the notebook: one GPU, several GPUs, or several CPU processes.

Notebook 04's steps (course_utils.training), from the same profile, with overrides on the command line::

    python scripts/train_grpo.py --profile gpu --set max_steps=200 --set learning_rate=3e-5
    accelerate launch --config_file configs/accelerate/ddp.yaml --num_processes 4 scripts/train_grpo.py --profile gpu
    accelerate launch --cpu --num_processes 2 scripts/train_grpo.py --profile ci        # CPUs (gloo)

``--set FIELD=VALUE`` changes a profile field (``course_utils.core.profiles.Profile``); ``--config FIELD=VALUE`` a
``GRPOConfig`` field the profile does not have. ``--vllm-server URL`` generates on a separate ``trl vllm-serve``.
Under several processes, only the main one clears the run folder and saves the model.

Nothing is lost by accident: the whole configuration (values, data, switches, the packages a flag needs, the GPU a
GPU profile needs, the model: ``COURSE_MODEL_DIR``'s folder or the Hub's copy) is checked before the run folder is
touched; a folder holding an earlier run is continued with ``--resume`` or cleared with ``--overwrite``, never
silently, and ``--overwrite`` clears only a folder the course made, only of the files it writes
(``training.run_folder``). ``--resume`` continues from the newest complete checkpoint, naming any torn one it skips;
it refuses other settings (the profile's, ``--config``'s, the data's fingerprints, ``max_steps`` but to train a
finished run further), naming both values and the choices; a finished run whose final model is missing, torn or
older than its last checkpoint gets it rebuilt. A Ctrl-C or SIGTERM ends the run after the step in progress, with a
checkpoint of it (a second one stops at once); an interrupted or failed run never shortens its log history and says
how to continue. One run at a time per folder.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import dataclasses
import importlib.util
import sys
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from accelerate import PartialState
from trl import GRPOConfig

from course_utils import cpu_speed
from course_utils.core import transformers_internals
from course_utils.core.hardware import hub_reachable
from course_utils.core.profiles import Profile, get_profile, profile_names
from course_utils.core.rehearsal import REHEARSAL_ENV_VAR
from course_utils.lesson.data import GSM8K_DIR_ENV_VAR, load_gsm8k
from course_utils.lesson.local_model import MODEL_DIR_ENV_VAR, local_model_dir
from course_utils.lesson.offline_model import ModelUnavailableError
from course_utils.training import run_folder
from course_utils.training.grpo_config import check_training_ranges, make_grpo_config, vllm_available
from course_utils.training.run import build_trainer, load_model_for_training
from course_utils.training.run_callbacks import StopOnInterrupt
from course_utils.training.run_folder import FINAL_DIRNAME
from course_utils.training.run_logs import save_run_artifacts
from course_utils.training.trained_model import (
    default_run_dir,
    final_problem,
    rebuild_final,
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
    config_fields = [key for key in changes if key not in fields and key in GRPOConfig.__dataclass_fields__]
    if config_fields:
        raise SystemExit(f"error: --set: {config_fields} are GRPOConfig fields, not profile fields: give them with "
                         f"--config (--config {config_fields[0]}=...).")  # fmt: skip
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
    parser.add_argument("--output-dir", help="the run folder (default outputs/grpo-<profile>)")
    start = parser.add_mutually_exclusive_group()
    start.add_argument("--resume", action="store_true", help="continue from the newest complete checkpoint")
    start.add_argument("--overwrite", action="store_true", help="clear an earlier run of the course first")
    parser.add_argument("--vllm-server", metavar="URL", help="generate on a `trl vllm-serve` server at URL")
    return parser


def build_config(profile: Profile, run_dir: Path, overrides: dict[str, Any]) -> Any:
    """The run's ``GRPOConfig``, checked (field names, generation batch, TRL's own checks) as a clear exit."""
    try:
        config = make_grpo_config(profile, run_dir, **overrides)
        check_training_ranges(config)
        return config
    except (ValueError, TypeError) as exc:
        raise SystemExit(f"error: --config / --set: {exc}") from None


def check_switches_and_packages(profile: Profile, config: Any) -> None:
    """The environment switch and the packages the flags need, read now: later they would fail mid-run."""
    try:
        cpu_speed.switched_on(profile)
    except ValueError as exc:
        raise SystemExit(f"error: {exc}") from None
    if config.use_vllm and not vllm_available():
        raise SystemExit('error: --vllm-server / use_vllm needs vLLM, which is not installed: pip install ".[vllm]" '
                         "(GPU machines only), or leave the flag out to generate with transformers.")  # fmt: skip
    for target in config.report_to or []:
        if importlib.util.find_spec(target) is None:
            raise SystemExit(f"error: report_to={target!r} needs the {target!r} package, which is not installed: "
                             f"pip install {target}, or --config report_to=none.")  # fmt: skip


def check_device(profile: Profile) -> None:
    """A GPU profile on a machine without CUDA, named now with the script's choices: transformers would only say that
    fp16 needs CUDA, or fail at the first tensor sent to the GPU."""
    if profile.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"error: --profile {profile.name} trains on an NVIDIA GPU (device='cuda'), and this machine "
                         "has none (torch.cuda.is_available() is False). Train the CPU lab here: --profile cpu; or "
                         f"rehearse the GPU profile's code path on this CPU: {REHEARSAL_ENV_VAR}=1 (make rehearse)."
                         )  # fmt: skip


def check_model_folder(profile: Profile) -> None:
    """The model the run loads, checked before the run folder is touched: ``COURSE_MODEL_DIR``'s folder whole
    (tokenizer, shapes, size: a bad copy must not train on a 3-token tokenizer), else, with no Hub to reach, a Hub
    profile's model in the Hub's cache, the way forward said as the script takes it (``--profile cpu``)."""
    try:
        folder = local_model_dir(profile)
    except ValueError as exc:
        raise SystemExit(f"error: {exc}") from None
    if folder is None and profile.model_source == "hub" and not hub_reachable() and not hub_cached(profile.model_id):
        raise SystemExit(
            f"error: --profile {profile.name} loads {profile.model_id} from the Hugging Face Hub, which this machine "
            "cannot reach (offline, or HF_HUB_OFFLINE=1), and no copy of it is cached here. Train the CPU lab instead: "
            f"--profile cpu (its model comes with the course); or point {MODEL_DIR_ENV_VAR} at a copy of the model's "
            "folder; or go online."
        )


def hub_cached(model_id: str) -> bool:
    """Whether the Hub's cache on this machine holds ``model_id`` (its ``config.json``), downloaded before."""
    from huggingface_hub import try_to_load_from_cache

    return isinstance(try_to_load_from_cache(model_id, "config.json"), str)


def run_dir_from_args(args: argparse.Namespace, profile: Profile) -> Path:
    """The run folder, ``--output-dir`` or the profile's; an empty ``--output-dir`` (an unset variable) is refused."""
    if args.output_dir is None:
        return default_run_dir(profile)
    if not args.output_dir.strip():
        raise SystemExit('error: --output-dir is empty (an unset variable, as in --output-dir "$RUN_DIR"?): '
                         "give the run's own folder, e.g. --output-dir outputs/my-run.")  # fmt: skip
    return Path(args.output_dir)


def check_run_dir(run_dir: Path, args: argparse.Namespace) -> None:
    """Refuse, before any work, a folder that cannot hold a run, or an earlier run neither continued nor cleared."""
    try:
        run_folder.check_can_hold_a_run(run_dir)
        if args.overwrite:
            run_folder.check_clearable(run_dir)
    except (run_folder.RunFolderError, OSError) as exc:
        raise SystemExit(f"error: {exc}") from None
    found = run_folder.earlier_entries(run_dir)
    if found and not (args.resume or args.overwrite):
        raise SystemExit(
            f"error: {run_dir} holds an earlier run ({', '.join(found)}). Pass --resume to continue it, "
            "--overwrite to delete it and start again, or --output-dir for a new folder."
        )


def checkpoint_to_resume(run_dir: Path, resume: bool) -> Path | None:
    """The complete checkpoint ``--resume`` continues from (said aloud, torn ones named), or None for step 0.

    A ``--resume`` that finds no complete checkpoint over an earlier run's results is refused: starting at step 0
    would replace them.
    """
    if not resume:
        return None
    checkpoint, skipped = run_folder.newest_complete_checkpoint(run_dir)
    for note in skipped:
        print(f"--resume: skipping {run_dir / note} (torn: not resumable)")
    if checkpoint is not None:
        print(f"--resume: continuing from {checkpoint} (step {run_folder.checkpoint_step(checkpoint)})")
        note = run_folder.missing_optimizer_note(checkpoint)
        if note:
            print(f"--resume: {note}")
        return checkpoint
    found = run_folder.earlier_entries(run_dir)
    if found:
        raise SystemExit(
            f"error: --resume: no complete checkpoint-N in {run_dir} to continue from (it holds {', '.join(found)}). "
            "Pass --overwrite to delete that run and start again at step 0, or --output-dir for a new folder."
        )
    print(f"--resume: no checkpoint in {run_dir}; starting at step 0")
    return None


def check_resume_settings(run_dir: Path, profile: Profile, config: Any = None, checkpoint: Path | None = None) -> None:
    """Refuse a resume under settings the run was not trained with (model, LoRA shape, batch, lengths, max_steps,
    GRPOConfig fields, the data's fingerprints), naming both values and the choices; a finished run may train further.
    """
    try:
        step = run_folder.checkpoint_step(checkpoint) if checkpoint is not None else None
        conflicts, notes = run_folder.resume_conflicts(run_dir, run_folder.run_settings(profile, config), step)
        recorded = run_folder.recorded_settings(run_dir) is not None
    except (run_folder.RunFolderError, OSError) as exc:
        raise SystemExit(f"error: {exc}") from None
    if not recorded:
        print(f"--resume: {run_dir} recorded no settings (a notebook's run, or an older one): the model, LoRA shape, "
              "batch, lengths, max_steps and data are not checked against the checkpoint's.")  # fmt: skip
    if conflicts:
        raise SystemExit(
            f"error: --resume: {run_dir} was trained with other settings ({'; '.join(conflicts)}). Resume with the "
            "run's settings (put each back as said), pass --overwrite to start again with these, or give a new "
            "--output-dir."
        )
    for note in notes:
        print(f"--resume: {note}")


def finished_step(checkpoint: Path | None, config: Any) -> int | None:
    """The checkpoint's step when it already reached ``max_steps`` (the run is finished), else None."""
    if checkpoint is None:
        return None
    step = run_folder.checkpoint_step(checkpoint)
    return step if 0 < config.max_steps <= step else None


def check_no_held_out_problem() -> None:
    """Refuse training data that holds test problems: notebook 05's held-out figures would measure memory.

    The whole train split is compared (GRPO's prompts and the warm start's both come from it), as notebook 04's
    check does for its training rows.
    """
    train = load_gsm8k("train", verbose=False)
    held_out = set(load_gsm8k("test", verbose=False)["question"])
    seen = sum(question in held_out for question in train["question"])
    if seen:
        raise ValueError(
            f"{seen} of the {len(train)} train problems are also in the test split, the held-out problems notebook 05 "
            f"evaluates on (is train.jsonl a copy of test.jsonl?). Point {GSM8K_DIR_ENV_VAR} at OpenAI's GSM8K files."
        )


@contextlib.contextmanager
def inputs_explained() -> Iterator[None]:
    """A bad input (data, model cache, weights) or a full disk exits with its message, no traceback.

    These errors already name the file, field or setting and the fix (``run_folder.written_aside`` for a save).
    """
    try:
        yield
    except (ValueError, OSError, ModelUnavailableError) as exc:
        raise SystemExit(f"error: {exc}") from None


def keep_what_was_done(trainer: Any, run_dir: Path, is_main: bool, resumed_from: Path | None = None) -> None:
    """After a stop or a failure mid-run: a checkpoint of the last finished step, and the log history so far.

    The checkpoint is the trainer's own (``transformers_internals.save_checkpoint``: model, optimizer, scheduler, RNG,
    state), so ``--resume`` continues from it; a step already checkpointed is not saved again. A resume that failed
    before its first new step keeps the folder as it was. The log never replaces a longer one (``save_run_artifacts``).
    One process only: saving under several would wait on processes that may have stopped.
    """
    step = trainer.state.global_step
    if step <= (run_folder.checkpoint_step(resumed_from) if resumed_from else 0):
        print(f"no new step finished: {run_dir} is as it was")
        return
    saving = ""
    if is_main and not (run_dir / f"checkpoint-{step}").is_dir():
        try:
            transformers_internals.save_checkpoint(trainer)
        except Exception as exc:  # a full disk (OSError, SafetensorError) or what stopped the run stops this too
            saving = f", its checkpoint could not be saved ({type(exc).__name__}: {exc})"
    if is_main:
        save_run_artifacts(trainer.state.log_history, run_dir)
    last, _ = run_folder.newest_complete_checkpoint(run_dir)
    where = f"checkpoint {last}" if last else f"no complete checkpoint (step {step} finished{saving})"
    print(f"stopped at step {step} of {trainer.state.max_steps}: {where}; log history in {run_dir / 'log_history.csv'}")
    print(way_forward(run_dir))


def way_forward(run_dir: Path) -> str:
    """What continues a stopped run: ``--resume`` from a complete checkpoint, else a fresh start (costing the log)."""
    if run_folder.newest_complete_checkpoint(run_dir)[0] is not None:
        return "continue with the same command and --resume"
    return (f"no complete checkpoint to resume from: start again with the same command and --overwrite (it deletes "
            f"this run's files; copy {run_dir / 'log_history.csv'} first to keep its log)")  # fmt: skip


def explain_failure(exc: BaseException, step: int, resumed_from: Path | None, run_dir: Path) -> None:
    """Name a failure's cause and a way forward that works (a failed resume does not lead back into itself)."""
    cause = f"{type(exc).__name__}: {exc}"
    if resumed_from is not None and step <= run_folder.checkpoint_step(resumed_from):
        print(f"the resume from {resumed_from} failed before any new step ({cause}). If that checkpoint cannot be "
              "loaded, move it out of the run folder and --resume from the one before, or pass --overwrite to start "
              "again.")  # fmt: skip
    else:
        print(f"the run failed at step {step} ({cause}): fix the cause; then {way_forward(run_dir)}")


def main(argv: list[str] | None = None) -> Path:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    profile = profile_from_args(args.profile, parse_assignments(args.set, "--set"))
    overrides = config_overrides(args)
    state = PartialState()  # the process group accelerate launch / torchrun set up (one process otherwise)
    run_dir = run_dir_from_args(args, profile)
    # Everything is checked before the run folder is touched: a typo must not cost the earlier run
    check_device(profile)
    config = build_config(profile, run_dir, overrides)
    check_switches_and_packages(profile, config)
    check_model_folder(profile)
    with contextlib.ExitStack() as held:
        if state.is_main_process:  # one run per folder: the main process holds its lock for the whole run
            with inputs_explained():  # a folder in use is named before any advice on its earlier run
                held.enter_context(run_folder.locked(run_dir))
        check_run_dir(run_dir, args)
        return train_in(run_dir, args, profile, config, state, run_folder.command_args(argv))


def train_in(
    run_dir: Path, args: argparse.Namespace, profile: Profile, config: Any, state: Any, command: list[str]
) -> Path:
    """The run itself, in a folder checked and locked: resume or clear, train, keep what was done, save.

    ``command``: this run's arguments, recorded in the folder's marker with its settings, so a later message can
    give the exact command that continues the run or rebuilds its final model.
    """
    checkpoint = checkpoint_to_resume(run_dir, args.resume)
    if checkpoint is not None:
        check_resume_settings(run_dir, profile, config, checkpoint)
    final_dir = run_dir / FINAL_DIRNAME
    done = finished_step(checkpoint, config)
    torn_final = final_problem(final_dir, done) if done is not None else None
    if done is not None and torn_final is None:
        print(f"--resume: the run is finished (step {done} of max_steps={config.max_steps}); {final_dir} is kept. "
              "To train further, raise max_steps: --set max_steps=N --resume.")  # fmt: skip
        return final_dir
    if torn_final is not None:
        print(f"--resume: the run is finished (step {done}), but {final_dir} {torn_final}: rebuilding it from "
              f"{checkpoint}")  # fmt: skip
    interrupt = StopOnInterrupt() if state.num_processes == 1 else None
    with inputs_explained():
        check_no_held_out_problem()
        if state.is_main_process and not args.overwrite:
            run_folder.claim(run_dir, run_folder.run_settings(profile, config), command)
        model, tokenizer = load_model_for_training(profile)
        if profile.warm_start_examples:
            # One process caches the primed model for --resume; several would write the same files at once
            cache = warm_start_model_dir(run_dir) if state.num_processes == 1 else False
            model = warm_start(model, tokenizer, profile, cache=cache, speedups=cpu_speed)  # CPU: faster, same steps
        trainer = build_trainer(model, tokenizer, profile, config=config, callbacks=[interrupt] if interrupt else [])
    if state.is_main_process and args.overwrite:
        earlier = run_folder.earlier_entries(run_dir)
        if earlier:
            print(f"--overwrite: deleting the earlier run in {run_dir} ({', '.join(earlier)})")
        run_folder.clear(run_dir)
        run_folder.claim(run_dir, run_folder.run_settings(profile, config), command)
    state.wait_for_everyone()
    if torn_final is not None:
        if state.is_main_process:
            with inputs_explained():
                rebuild_final(trainer, tokenizer, checkpoint, final_dir)
            print(f"rebuilt {final_dir} from {checkpoint.name}")
        state.wait_for_everyone()
        return final_dir
    try:
        with interrupt or contextlib.nullcontext(), cpu_speed.enabled(trainer, profile=profile):
            trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint else None)
    except BaseException as exc:
        keep_what_was_done(trainer, run_dir, state.is_main_process, checkpoint)
        if isinstance(exc, KeyboardInterrupt):
            raise SystemExit(130) from None
        traceback.print_exc()
        explain_failure(exc, trainer.state.global_step, checkpoint, run_dir)
        raise SystemExit(1) from None
    if interrupt is not None and interrupt.requested:
        keep_what_was_done(trainer, run_dir, state.is_main_process, checkpoint)
        raise SystemExit(143 if interrupt.signal_name == "SIGTERM" else 130)

    if state.is_main_process:
        save_run_artifacts(trainer.state.log_history, run_dir)
        with inputs_explained():  # a full disk: named, with the resume that rebuilds the final model
            save_final(trainer, tokenizer, final_dir)
        print(f"trained {trainer.state.global_step} steps on {state.num_processes} process(es); model in {final_dir}")
    state.wait_for_everyone()
    return final_dir


if __name__ == "__main__":
    main()
