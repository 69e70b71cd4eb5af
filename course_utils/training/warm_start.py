"""The warm start: a short supervised "cold start" with TRL's ``SFTTrainer`` before GRPO (as DeepSeek-R1 does).

A small model that never writes the XML format earns reward 0 on every completion: every group has the
same reward, every advantage is 0, and GRPO has nothing to learn from. A few SFT steps on short targets taken
from the end of the train split (``warm_start_dataset``, never a GRPO prompt) teach the format, and with
``equations_target`` reasoning the answer follows from: then the answers, right only sometimes, are what differs
inside a group. ``warm_start`` runs them and returns a plain model (the LoRA adapter merged back) for GRPO to start
its own adapter on.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

from datasets import Dataset
from transformers import AutoModelForCausalLM
from trl import SFTConfig, SFTTrainer

from course_utils.core.answer_format import format_answer
from course_utils.core.profiles import Profile, get_profile
from course_utils.core.speedups import NO_SPEEDUPS, SpeedUps
from course_utils.lesson.data import load_gsm8k
from course_utils.lesson.data_checks import calculator_notes
from course_utils.lesson.formatting import build_prompt, extract_hash_answer, extract_reasoning
from course_utils.lesson.models import saved_model_kind
from course_utils.training import run_folder
from course_utils.training.grpo_config import precision_flags
from course_utils.training.grpo_prompts import fit_to_data, warm_start_rows
from course_utils.training.lora_setup import make_lora_config
from course_utils.training.run_folder import WARM_START_DIRNAME
from course_utils.training.trained_model import WARM_START_MARKER, default_run_dir, warm_start_model_dir

WARM_START_MICRO_BATCH = 2  # warm-start sequences per forward pass (memory); the profile sets the effective batch


# --- The training examples -------------------------------------------------------------------------


def warm_start_target(solution: str, reasoning_lines: int = 1) -> str:
    """The assistant answer the warm start teaches: the first reference reasoning line(s) and the number, in XML.

    Short on purpose: the lesson is the *format* (and that it ends), not the arithmetic; a long target
    would teach the model to write past ``max_completion_length`` and get truncated.
    """
    if reasoning_lines < 0:
        raise ValueError(f"reasoning_lines must be >= 0, got {reasoning_lines}")
    lines = [re.sub(r"<<[^<>]*>>", "", line).strip() for line in extract_reasoning(solution).splitlines()]
    reasoning = "\n".join(line for line in lines if line)
    reasoning = "\n".join(reasoning.splitlines()[:reasoning_lines])
    return format_answer(reasoning, extract_hash_answer(solution))


def equations_target(solution: str) -> str:
    """The answer as the worked solution's calculator notes (``48/2=24``), one a line, then the number, in XML.

    Reasoning that holds the computation it answers with, in few tokens (``grpo_prompts.warm_start_rows`` keeps
    only the solutions whose notes are right and end on the answer).
    """
    equations = "\n".join(f"{expression}={value}" for expression, value in calculator_notes(solution))
    return format_answer(equations, extract_hash_answer(solution))


def warm_start_dataset(profile: Profile | str | None = None, folder: str | Path | None = None) -> Any:
    """Prompt/completion pairs for the warm start, taken from the *end* of the train split (no overlap with GRPO's)."""
    p = get_profile(profile)
    if p.warm_start_examples < 1:
        raise ValueError(f"Profile {p.name!r} has warm_start_examples={p.warm_start_examples}: no warm start to build.")
    raw = load_gsm8k("train", folder, verbose=False)
    p = fit_to_data(p, raw)
    if len(raw) < p.train_size + p.warm_start_examples:
        raise ValueError(
            f"GSM8K train has {len(raw)} rows, fewer than train_size + warm_start_examples = "
            f"{p.train_size + p.warm_start_examples}: lower one of them, or point GSM8K_DIR at the full data."
        )
    rows = raw.select(warm_start_rows(p, raw["answer"]))
    return Dataset.from_list(
        [
            {
                "prompt": build_prompt(row["question"]),
                "completion": [{"role": "assistant", "content": _target(p, row["answer"])}],
            }
            for row in rows
        ]
    )


def _target(p: Profile, solution: str) -> str:
    if p.warm_start_reasoning == "equations":
        return equations_target(solution)
    return warm_start_target(solution, p.warm_start_reasoning_lines)


# --- The SFT run -----------------------------------------------------------------------------------


def make_sft_config(
    profile: Profile | str | None = None, output_dir: str | Path | None = None, **overrides: Any
) -> Any:
    """The ``trl.SFTConfig`` of the warm start: a few steps at a high learning rate, nothing saved."""
    p = get_profile(profile)
    kwargs: dict[str, Any] = {
        "output_dir": str(output_dir or default_run_dir(p) / WARM_START_DIRNAME),
        "num_train_epochs": p.warm_start_epochs,
        # Same effective batch in micro-batches: SFT computes logits (49k vocab) for every token, and at batch
        # 8 they alone would outgrow the cpu profile's memory.
        "per_device_train_batch_size": min(p.warm_start_batch_size, WARM_START_MICRO_BATCH),
        "gradient_accumulation_steps": max(1, p.warm_start_batch_size // WARM_START_MICRO_BATCH),
        "learning_rate": p.warm_start_learning_rate,
        "lr_scheduler_type": "constant",
        "max_length": 512,
        "logging_steps": 1,
        "save_strategy": "no",
        "report_to": [],
        "activation_checkpointing": False,
        "dataloader_num_workers": 0,
        "seed": 42,
        **precision_flags(p),
    }
    kwargs.update(overrides)
    return SFTConfig(**kwargs)


def warm_start_lora_config(profile: Profile | str | None = None, model: Any = None) -> Any:
    """The warm start's ``LoraConfig``: GRPO's, but in every layer (``lora_top_layers`` ignored).

    Every layer, even where GRPO adapts only the top ones: a few SFT steps must move the format habit
    wherever it lives, and the adapter is merged away before GRPO starts its own.
    """
    return make_lora_config(get_profile(profile).override(lora_top_layers=None), model)


def finish_warm_start(trainer: Any, folder: str | Path | None = None, settings: dict[str, Any] | None = None) -> Any:
    """The primed plain model of a finished ``SFTTrainer`` run: LoRA merged back, marked, saved in ``folder``.

    Merged, so GRPO starts its own adapter on the primed weights; marked (``WARM_START_MARKER`` on its config,
    with the ``settings`` that made it), so ``save_final`` knows an adapter alone could not rebuild the model and
    a later run reuses it only under the same settings; saved, so notebook 05 can evaluate it and a resumed run
    continues on exactly the same base.
    """
    primed = trainer.model
    if hasattr(primed, "merge_and_unload"):
        primed = primed.merge_and_unload()
    losses = [round(h["loss"], 3) for h in trainer.state.log_history if "loss" in h]
    examples = len(trainer.train_dataset)
    seconds = round(trainer.state.log_history[-1].get("train_runtime", 0.0), 1) if trainer.state.log_history else 0.0
    steps = trainer.state.global_step
    info: dict[str, Any] = {"examples": examples, "steps": steps, "seconds": seconds}
    if settings is not None:
        info["settings"] = settings
    setattr(primed.config, WARM_START_MARKER, info)
    print(f"warm start: {examples} example{'s' * (examples != 1)}, {steps} step{'s' * (steps != 1)}, losses {losses}")
    if folder is not None:
        fix = ("Free space there (or point COURSE_OUTPUT_DIR at a disk with room), then run again: GRPO had not "
               "started, so no step is lost.")  # fmt: skip
        with run_folder.written_aside(Path(folder), "The warm start", fix) as partial:
            primed.save_pretrained(partial)
    return primed


# Profile fields that change what a warm start learns: a saved one is reused only when they all match
WARM_START_SETTING_FIELDS = (
    "model_source",
    "model_id",
    "warm_start_examples",
    "warm_start_learning_rate",
    "warm_start_epochs",
    "warm_start_batch_size",
    "warm_start_reasoning",
    "warm_start_reasoning_lines",
    "lora_r",
    "lora_alpha",
    "lora_target_modules",
)


def warm_start_settings(profile: Profile | str | None, dataset: Any) -> dict[str, Any]:
    """What makes a warm start: the profile's warm-start fields, its training dtype and a digest of its examples.

    The digest catches what the fields cannot: other data (the sample instead of GSM8K, another target length).
    Values are as JSON writes them (tuples as lists), so a saved copy compares equal.
    """
    p = get_profile(profile)
    rows = dataset.to_list() if hasattr(dataset, "to_list") else list(dataset)
    digest = hashlib.sha256(json.dumps(rows, sort_keys=True, ensure_ascii=False).encode()).hexdigest()[:16]
    fields = {name: getattr(p, name) for name in WARM_START_SETTING_FIELDS}
    made = {"training_dtype": p.training_dtype, "examples_sha256": digest, "assistant_only_loss": has_tool_turns(rows)}
    return json.loads(json.dumps({**fields, **made}))


def has_tool_turns(rows: Any) -> bool:
    """Whether an example's completion holds a ``tool`` turn: then the warm start learns the assistant's turns only.

    Why: SFT's completion mask covers the whole completion, so on a tool trace the model would also learn to write
    the calculator's answers itself; ``assistant_only_loss`` leaves them out, as GRPO's ``tool_mask`` does.
    """
    return any(isinstance(message, dict) and message.get("role") == "tool"
               for row in rows for message in (row.get("completion") or []))  # fmt: skip


def saved_warm_start_settings(folder: str | Path) -> dict[str, Any] | None:
    """The settings recorded with the warm start saved in ``folder`` (None when it has none or none recorded)."""
    path = Path(folder) / "config.json"
    try:
        info = json.loads(path.read_text(encoding="utf-8")).get(WARM_START_MARKER) or {}
    except (OSError, ValueError):
        return None
    return info.get("settings") if isinstance(info, dict) else None


def settings_changes(saved: dict[str, Any] | None, wanted: dict[str, Any]) -> list[str]:
    """``["warm_start_examples 1 -> 4", ...]``: how ``saved`` differs from ``wanted`` (all of it when unknown)."""
    if saved is None:
        return ["no settings recorded with it"]
    return [f"{key} {saved.get(key)!r} -> {value!r}" for key, value in wanted.items() if saved.get(key) != value]


def load_saved_warm_start(folder: str | Path, dtype: Any, required: bool = False) -> Any:
    """The warm-started model saved in ``folder`` (``finish_warm_start``), or None when there is none.

    ``required=True`` (a resume, which must continue on the same warm start): none is an error saying how to make
    it. A damaged one (weights cut short by a kill or a full disk) is always an error naming the folder.
    """
    folder = Path(folder)
    if saved_model_kind(folder) != "full-model":
        if required:
            raise FileNotFoundError(f"No saved warm start in {folder}: run the warm-start cells as for a fresh "
                                    "run (they save it there), then resume.")  # fmt: skip
        return None
    fix = "Delete that folder and run the warm start again; a resumed run then needs a fresh start (its adapter "
    fix += "was trained on the old warm start)."
    with run_folder.loading(folder, "The saved warm start", fix):
        return AutoModelForCausalLM.from_pretrained(folder, dtype=dtype)


def warm_start_trainer(model: Any, tokenizer: Any, profile: Profile, dataset: Any) -> Any:
    """The warm start's ``SFTTrainer``: LoRA in every layer, the loss on the assistant's turns of tool traces only."""
    rows = dataset.to_list() if hasattr(dataset, "to_list") else list(dataset)
    return SFTTrainer(
        model=model,
        args=make_sft_config(profile, assistant_only_loss=has_tool_turns(rows)),
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=warm_start_lora_config(profile, model),
    )


def warm_start(
    model: Any,
    tokenizer: Any,
    profile: Profile | str | None = None,
    dataset: Any = None,
    cache: bool | Path = False,
    speedups: SpeedUps = NO_SPEEDUPS,
) -> Any:
    """Prime the XML format with a short SFT run (TRL's ``SFTTrainer``); return the primed, plain model.

    The same steps notebook 04's learner writes out, in one call for scripts. ``cache``: True (the run
    folder's warm-start model) or a folder; a primed model already there is loaded instead of retrained when the
    settings that made it match this profile's and examples (``warm_start_settings``), and rebuilt otherwise.
    ``speedups``: the plug-in the SFT steps run with (``speedups=cpu_speed``: freed memory reused), default none.
    """
    p = get_profile(profile)
    if p.load_in_4bit:
        raise ValueError("A warm start cannot merge into a 4-bit model; use warm_start_examples=0 on 4-bit profiles.")
    folder = warm_start_model_dir(default_run_dir(p)) if cache is True else (Path(cache) if cache else None)
    dataset = dataset if dataset is not None else warm_start_dataset(p)
    settings = warm_start_settings(p, dataset)
    if folder is not None and saved_model_kind(folder) == "full-model":
        changes = settings_changes(saved_warm_start_settings(folder), settings)
        if not changes:
            print(f"reusing the warm start from {folder} (same settings)")
            return load_saved_warm_start(folder, model.dtype)
        print(f"the warm start in {folder} was made with other settings ({'; '.join(changes)}): rebuilding it")
    trainer = warm_start_trainer(model, tokenizer, p, dataset)
    with speedups.enabled(trainer, profile=p):
        trainer.train()
    return finish_warm_start(trainer, folder, settings)
