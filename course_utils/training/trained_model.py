"""Where a run and its result live, and the result saved and loaded again (the folder notebook 05 loads).

``default_run_dir`` / ``final_model_dir`` / ``warm_start_model_dir`` name the folders; ``save_final`` writes the
trained model or LoRA adapter aside and renames it into place; ``load_trained_model`` reads it back for evaluation.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer

from course_utils.core import transformers_internals
from course_utils.core.paths import output_dir
from course_utils.core.profiles import Profile, get_profile
from course_utils.lesson.models import load_model_and_tokenizer, saved_model_kind
from course_utils.training import run_folder
from course_utils.training.run_folder import FINAL_DIRNAME, RUN_INFO_FILENAME, WARM_START_DIRNAME, final_problem

WARM_START_MARKER = "course_warm_start"  # set on model.config, so a merged or saved model says it was primed


def default_run_dir(profile: Profile | str | None = None) -> Path:
    """Where a profile's run writes checkpoints, logs and figures: ``outputs/grpo-<profile>``."""
    return output_dir() / f"grpo-{get_profile(profile).name}"


def final_model_dir(profile: Profile | str | None = None) -> Path:
    """Where the trained model (or LoRA adapter) is saved; notebook 05 loads it from here."""
    return default_run_dir(profile) / FINAL_DIRNAME


def warm_start_model_dir(run_dir: str | Path) -> Path:
    """Where a run keeps the warm-started model its GRPO began from (notebook 05 evaluates it; a resume reloads it)."""
    return Path(run_dir) / WARM_START_DIRNAME / "model"


def find_trained_model(profile: Profile | str | None = None, path: str | Path | None = None) -> Path | None:
    """The folder of the profile's trained model or LoRA adapter (or ``path``), or None when it holds none."""
    folder = Path(path) if path is not None else final_model_dir(profile)
    return folder if saved_model_kind(folder) is not None else None


def save_final(trainer: Any, tokenizer: Any, folder: str | Path | None = None, merge: bool | None = None) -> Path:
    """Save the trained model where notebook 05 finds it (``final_model_dir``); return the folder.

    A LoRA run saves only its adapter (megabytes), unless the base model was warm-started: then
    the adapter alone would not reproduce the model (its base exists nowhere else), so it is merged
    and the full model is saved. ``merge`` forces one or the other.
    """
    folder = Path(folder) if folder is not None else Path(trainer.args.output_dir) / FINAL_DIRNAME
    model = trainer.model
    is_peft = hasattr(model, "peft_config")
    if merge is None:
        merge = is_peft and getattr(model.config, WARM_START_MARKER, None) is not None
    if is_peft and merge:
        model = model.merge_and_unload()
    info = {
        "kind": "lora-adapter" if is_peft and not merge else "full-model",
        "global_step": trainer.state.global_step,
        "warm_start": getattr(model.config, WARM_START_MARKER, None),
    }
    fix = ("Free space there (or point COURSE_OUTPUT_DIR at a disk with room), then run the same command with "
           "--resume: a finished run's final model is rebuilt from its last complete checkpoint.")  # fmt: skip
    with run_folder.written_aside(folder, "The final model", fix) as partial:  # never a half-saved model
        model.save_pretrained(partial)
        tokenizer.save_pretrained(partial)
        (partial / RUN_INFO_FILENAME).write_text(json.dumps(info, indent=2))
    return folder


def rebuild_final(trainer: Any, tokenizer: Any, checkpoint: Path, folder: Path) -> Path:
    """The final model of a finished run saved again from its last complete ``checkpoint`` (its weights loaded)."""
    transformers_internals.load_checkpoint(trainer, checkpoint)
    trainer.state.global_step = run_folder.checkpoint_step(checkpoint)
    return save_final(trainer, tokenizer, folder)


def rebuild_note(folder: Path, profile: Profile | str | None = None) -> str:
    """How to rebuild a torn final model: the script's ``--resume`` of the finished run does it, from its newest
    complete checkpoint (the run's own command, ``run_folder.resume_command``); without one, train again."""
    checkpoint, _ = run_folder.newest_complete_checkpoint(folder.parent)
    if checkpoint is None:
        return (f"No complete checkpoint in {folder.parent} to rebuild it from: train it again (notebook 04 with "
                f"COURSE_PROFILE={get_profile(profile).name}).")  # fmt: skip
    return f"Rebuild it from {checkpoint.name}: {run_folder.resume_command(folder.parent, profile)}"


def missing_final_note(folder: Path, profile: Profile) -> str:
    """Why there is no trained model in ``folder`` and what to do: a torn save is named with its rebuild."""
    if not any(folder.with_name(name).exists() for name in (f"{folder.name}.partial", f"{folder.name}.old")):
        notebook = f"Run notebooks/04_train_grpo.ipynb with COURSE_PROFILE={profile.name} first."
        return f"No trained model in {folder}. {notebook}"
    return f"The trained model in {folder} {final_problem(folder)}. {rebuild_note(folder, profile)}"


def older_final_note(folder: Path, profile: Profile | str | None = None) -> str | None:
    """What to know when the run in ``folder``'s parent has a newer complete checkpoint than its final model: the
    final is an earlier step's (a save cut short, or a run stopped before its end), and how to get the newer one."""
    checkpoint, _ = run_folder.newest_complete_checkpoint(folder.parent)
    problem = final_problem(folder, run_folder.checkpoint_step(checkpoint)) if checkpoint else None
    if checkpoint is None or problem is None:
        return None
    return (f"Note: {folder} {problem}; {checkpoint.name} is newer. To save the run's final model (training on to "
            f"its max_steps if it had not finished): {run_folder.resume_command(folder.parent, profile)}")  # fmt: skip


def load_trained_model(profile: Profile | str | None = None, folder: str | Path | None = None) -> tuple[Any, Any]:
    """The model trained in notebook 04 and its tokenizer (left padding), from ``final_model_dir(profile)``.

    A LoRA adapter is loaded on top of the profile's base model; a full model is loaded directly.
    """
    p = get_profile(profile)
    folder = Path(folder) if folder is not None else final_model_dir(p)
    kind = saved_model_kind(folder)
    if kind is None:
        raise FileNotFoundError(missing_final_note(folder, p))
    fix = f"Train it again (notebook 04 with COURSE_PROFILE={p.name}), or resume its run from a complete checkpoint."
    if run_folder.newest_complete_checkpoint(folder.parent)[0] is not None:  # a run's final model: rebuilt from it
        fix = rebuild_note(folder, p)
    base = load_model_and_tokenizer(p)[0] if kind == "lora-adapter" else None
    with run_folder.loading(folder, "The trained model", fix):
        if base is not None:
            model = PeftModel.from_pretrained(base, folder)
        else:
            model = AutoModelForCausalLM.from_pretrained(folder, dtype=getattr(torch, p.dtype))
        tokenizer = AutoTokenizer.from_pretrained(folder)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return model.eval(), tokenizer
