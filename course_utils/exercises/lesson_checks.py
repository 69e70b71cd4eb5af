"""The checks after each construct a learner writes in a lesson cell: compared with the package's reference.

Notebook 04's learner writes ``SFTConfig(...)``, ``LoraConfig(...)``, ``GRPOConfig(...)`` and
``GRPOTrainer(...)`` out field by field; notebook 05's learner writes the evaluation loop. Right after,
one of these functions compares the learner's object with what the package builds from the same profile
(``warm_start.make_sft_config``, ``training.make_lora_config``, ``training.make_grpo_config``,
``evaluation.evaluate_model``) and says plainly what differs.

A difference raises ``DiffersFromReference``: the rest of the notebook (and notebook 05 after it) assumes
the course's run, and CI executing the notebooks keeps lesson and package in sync this way. To try
another value, change the profile (``profile = profile.override(learning_rate=1e-4)``): the reference
follows it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from course_utils.core.profiles import Profile
from course_utils.evaluation.heldout import evaluate_model
from course_utils.lesson.rewards import REWARD_FUNCS
from course_utils.training.run import make_grpo_config, make_lora_config
from course_utils.training.warm_start import make_sft_config

# Fields compared between a learner's LoraConfig and the reference (the rest are peft's bookkeeping)
LORA_FIELDS = ("r", "lora_alpha", "lora_dropout", "target_modules", "layers_to_transform", "task_type")


class DiffersFromReference(ValueError):
    """The learner's construct differs from the package's reference for the same profile."""


def _shown(value: Any) -> str:
    if isinstance(value, (set, frozenset)):
        value = sorted(value)
    text = repr(value)
    return text if len(text) <= 70 else f"{text[:67]}..."


def field_differences(yours: Mapping[str, Any], reference: Mapping[str, Any]) -> list[str]:
    """One line per field whose value differs (a field missing on one side counts), in the reference's order."""
    lines = []
    for name in [*reference, *(k for k in yours if k not in reference)]:
        mine, theirs = yours.get(name, "(not set)"), reference.get(name, "(not set)")
        if mine != theirs:
            lines.append(f"{name}: yours {_shown(mine)}, reference {_shown(theirs)}")
    return lines


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
        differences = [] if same else [f"LoRA: yours {_shown(config)}, reference {_shown(reference)}"]
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


# --- notebook 05: the evaluation loop ------------------------------------------------------------------

RECORD_FIELDS = ("completion", "extracted", "correct")


def check_evaluation_loop(
    learner: Callable[..., Sequence[Mapping[str, Any]]],
    model: Any,
    tokenizer: Any,
    problems: Any,
    *,
    batch_size: int,
    max_new_tokens: int,
) -> bool:
    """Run the learner's loop and ``evaluation.evaluate_model`` on the same problems; compare per problem.

    The reference runs in the dataset's order with the same batches (``sort_by_length=False``), so the
    same greedy generation gives the same text; each record's ``completion``, ``extracted`` and ``correct``
    must match.
    """
    yours = list(learner(model, tokenizer, problems, batch_size, max_new_tokens))
    settings = {"batch_size": batch_size, "max_new_tokens": max_new_tokens, "progress": False}
    reference = evaluate_model(model, tokenizer, problems, sort_by_length=False, **settings)["records"]
    differences = []
    if len(yours) != len(reference):
        differences.append(f"records: yours {len(yours)}, reference {len(reference)} (one per problem)")
    for index, (mine, theirs) in enumerate(zip(yours, reference, strict=False)):
        if not isinstance(mine, Mapping):
            differences.append(f"problem {index}: yours is a {type(mine).__name__}, not a dict of {RECORD_FIELDS}")
            continue
        got = {name: mine.get(name, "(not set)") for name in RECORD_FIELDS}
        wanted = {name: theirs[name] for name in RECORD_FIELDS}
        differences += [f"problem {index}, {line}" for line in field_differences(got, wanted)]
    fix = ("Each record is {'completion': text, 'extracted': extract_xml_answer(text), 'correct': "
           "answers_match(...)}; generate greedily, left-padded, with skip_special_tokens when decoding.")
    return _verdict(f"Your evaluation loop ({len(reference)} problems)", differences, fix)
