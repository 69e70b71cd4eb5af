"""Notebook 04 (training): the constructs the learner writes (``SFTConfig``, ``LoraConfig``, ``GRPOConfig``,
``GRPOTrainer``), the batch arithmetic of ``GRPOConfig`` and the monitoring rules."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from course_utils.core.profiles import Profile
from course_utils.exercises.comparison import Case, check_against_reference, close_to, field_differences, report, shown
from course_utils.lesson.rewards import REWARD_FUNCS
from course_utils.training.monitoring import monitor
from course_utils.training.run import check_generation_batch, make_grpo_config, make_lora_config
from course_utils.training.warm_start import make_sft_config


def check_04_prompts_per_step(answer: Any) -> bool:
    """Golden config: batch 8, accumulation 16, num_generations 8: how many distinct prompts per optimizer step?"""
    hint = "completions per step = batch x accumulation; each prompt fills one group of num_generations"
    return report("04.1 prompts per step", close_to(answer, 8 * 16 / 8), hint, answer)


def check_04_group_size_field(answer: Any) -> bool:
    """Which ``GRPOConfig`` field is the group size (completions sampled per prompt)?"""
    text = answer.strip().strip("`'\"") if isinstance(answer, str) else ""
    hint = "the field that says how many completions are generated for each prompt; TRL's default is 8"
    return report("04.2 group size field", text == "num_generations", hint, answer)


def generation_batch_cases() -> list[Case]:
    """Sizes that form whole groups, sizes that do not, and sizes that are no sizes at all."""
    return [
        Case("the golden config: 8 x 16, groups of 8", (8, 16, 8)),
        Case("4 x 2, groups of 8", (4, 2, 8)),
        Case("the cpu lab: one pass of 8, groups of 8", (8, 1, 8)),
        Case("12 x 1, groups of 3", (12, 1, 3)),
        Case("6 x 1, groups of 4: not whole groups", (6, 1, 4)),
        Case("3 x 3, groups of 2: not whole groups", (3, 3, 2)),
        Case("a group of one compares nothing", (8, 1, 1)),
        Case("batch 0", (0, 1, 2)),
        Case("accumulation 0", (4, 0, 2)),
    ]


def check_04_generation_batch(learner: Any) -> bool:
    """A function ``(batch, accumulation, num_generations) -> completions per round``; ValueError when unusable."""
    hint = ("return batch x accumulation; raise ValueError when that is not a multiple of num_generations, when "
            "num_generations < 2, or when a size is < 1")
    return check_against_reference(
        "04.4 generation batch", learner, check_generation_batch, generation_batch_cases(), hint=hint
    )


def check_04_monitoring_rule(answer: Any, log_history: Any) -> bool:
    """Which monitoring rule fires on ``log_history``? (a rule name such as ``"clipped_high"``)."""
    try:
        fired = {finding.code for finding in monitor(log_history)}
    except (TypeError, ValueError) as exc:
        print(f"⚠️ 04.3: could not read the log history ({exc}); pass the one the notebook built.")
        return False
    text = answer.strip() if isinstance(answer, str) else ""
    hint = "run monitor(log_history) and read the rule names, or look at the last columns of the frame"
    return report("04.3 monitoring rule", text in fired, hint, answer)


# --- the constructs written out in the lesson cells ----------------------------------------------------

# Fields compared between a learner's LoraConfig and the reference (the rest are peft's bookkeeping)
LORA_FIELDS = ("r", "lora_alpha", "lora_dropout", "target_modules", "layers_to_transform", "task_type")


class DiffersFromReference(ValueError):
    """The learner's construct differs from the package's reference for the same profile."""


def _verdict(what: str, differences: Sequence[str], fix: str) -> bool:
    """Print the verdict; raise with every difference listed when there is one."""
    if not differences:
        print(f"✅ {what}: the same as the package's reference, field by field.")
        return True
    listing = "\n".join(f"  - {line}" for line in differences)
    raise DiffersFromReference(f"{what} differs from the package's reference in {len(differences)} place(s):\n"
                               f"{listing}\n{fix}")


PROFILE_FIX = ("Read each value from the profile as the reference does; to try another value, change the profile "
               "(profile = profile.override(field=value)) and rerun from its cell.")


def _as_dict(config: Any, kind: str) -> dict[str, Any]:
    if not hasattr(config, "to_dict"):
        raise TypeError(f"expected a {kind}, got {type(config).__name__}; pass the object your cell built")
    return config.to_dict()


def check_sft_config(config: Any, profile: Profile) -> bool:
    """The learner's ``SFTConfig`` against ``warm_start.make_sft_config(profile)``, every field."""
    yours = _as_dict(config, "trl.SFTConfig")
    reference = make_sft_config(profile, yours["output_dir"]).to_dict()
    return _verdict("Your SFTConfig", field_differences(yours, reference), PROFILE_FIX)


def check_grpo_config(config: Any, profile: Profile, reward_weights: Any = None) -> bool:
    """The learner's ``GRPOConfig`` against ``training.make_grpo_config(profile)``, every field.

    ``reward_weights`` are the weights the learner's cell used (notebook 03's); the reference gets the same.
    """
    yours = _as_dict(config, "trl.GRPOConfig")
    reference = make_grpo_config(profile, yours["output_dir"], reward_weights=reward_weights)
    return _verdict("Your GRPOConfig", field_differences(yours, reference.to_dict()), PROFILE_FIX)


def _lora_fields(config: Any) -> dict[str, Any]:
    values = {name: getattr(config, name, "(not set)") for name in LORA_FIELDS}
    if isinstance(values["target_modules"], (list, tuple)):
        values["target_modules"] = set(values["target_modules"])
    if isinstance(values["layers_to_transform"], tuple):
        values["layers_to_transform"] = list(values["layers_to_transform"])
    values["task_type"] = str(getattr(values["task_type"], "value", values["task_type"]))
    return values


def check_lora_config(config: Any, profile: Profile, model: Any) -> bool:
    """The learner's ``LoraConfig`` against ``training.make_lora_config(profile, model)`` (None: no LoRA)."""
    reference = make_lora_config(profile, model)
    if reference is None or config is None:
        same = reference is None and config is None
        differences = [] if same else [f"LoRA: yours {shown(config)}, reference {shown(reference)}"]
        return _verdict("Your LoRA choice", differences, PROFILE_FIX)
    return _verdict("Your LoraConfig", field_differences(_lora_fields(config), _lora_fields(reference)), PROFILE_FIX)


def trainer_differences(trainer: Any, profile: Profile, config: Any, lora: Any, tokenizer: Any) -> list[str]:
    """What a ``GRPOTrainer`` was given that the course's run is not: rewards, args, data, LoRA.

    Callbacks are the learner's own (a plain ``GRPOTrainer`` passes): the CPU speed-ups are applied around
    ``trainer.train()`` (``cpu_speed.enabled``), not given to the trainer.
    """
    differences = []
    names = [getattr(f, "__name__", type(f).__name__) for f in getattr(trainer, "reward_funcs", [])]
    expected = [f.__name__ for f in REWARD_FUNCS]
    if names != expected:
        differences.append(f"reward_funcs: yours {names}, reference {expected} (lesson.rewards.REWARD_FUNCS)")
    if trainer.args is not config:
        differences.append("args: not the GRPOConfig checked above; pass args=config")
    if trainer.processing_class is not tokenizer:
        differences.append("processing_class: not the tokenizer loaded with the model; pass processing_class=tokenizer")
    columns = set(getattr(trainer.train_dataset, "column_names", []) or [])
    if not {"prompt", "answer"} <= columns:
        differences.append(f"train_dataset: columns {sorted(columns)}, needs 'prompt' and 'answer' "
                           "(training.training_dataset(profile, tokenizer=tokenizer))")
    adapters = getattr(trainer.model, "peft_config", {})
    if lora is not None:
        got = _lora_fields(adapters["default"]) if "default" in adapters else None
        if got is None or field_differences(got, _lora_fields(lora)):
            differences.append("peft_config: the model carries no LoRA adapter as configured; pass peft_config=lora")
    elif adapters:
        differences.append("peft_config: this profile fine-tunes every weight; pass peft_config=None")
    return differences


def check_grpo_trainer(trainer: Any, profile: Profile, config: Any, lora: Any, tokenizer: Any) -> bool:
    """The learner's ``GRPOTrainer`` against what ``training.build_trainer`` passes for the same profile."""
    fix = "Pass exactly what the reference passes; see training.build_trainer."
    return _verdict("Your GRPOTrainer", trainer_differences(trainer, profile, config, lora, tokenizer), fix)


