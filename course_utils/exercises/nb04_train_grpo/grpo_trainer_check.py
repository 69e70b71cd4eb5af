"""04.4: the learner's ``GRPOTrainer(...)`` call: the course's five rewards with their weights, the checked config,
the tokenizer, the (warm-started) model with the checked LoRA, and training prompts none of which notebook 05
evaluates on. When it fails, the LoRA layers its call left in the model are taken out before the course's
trainer is built on the same pieces.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from typing import Any

import torch
from peft.tuners.tuners_utils import BaseTunerLayer
from trl import GRPOTrainer

from course_utils.core.profiles import Profile
from course_utils.exercises.nb04_train_grpo.judging import TRL_TRAINER, judge, kind_problem, problems_of
from course_utils.exercises.verdicts import close_to, hand_back
from course_utils.lesson.data import load_gsm8k
from course_utils.lesson.rewards import REWARD_FUNCS
from course_utils.training.grpo_prompts import training_dataset


def reward_problems(trainer: Any, config: Any) -> list[str]:
    """The five rewards of notebook 03, each with the weight the checked config gives it."""
    names = [getattr(f, "__name__", type(f).__name__) for f in trainer.reward_funcs]
    expected = [f.__name__ for f in REWARD_FUNCS]
    if sorted(names) != sorted(expected):
        return [f"reward_funcs {names}: the five of notebook 03 are REWARD_FUNCS {expected}"]
    weights = [float(w) for w in config.reward_weights] if config.reward_weights is not None else [1.0] * len(names)
    wanted = [weights[expected.index(name)] for name in names]
    given = [float(w) for w in trainer.reward_weights]
    if not all(close_to(g, w) for g, w in zip(given, wanted, strict=True)):
        return [f"each reward's weight: yours {dict(zip(names, given, strict=True))}, the config's "
                f"{dict(zip(expected, weights, strict=True))} (reward_weights follow REWARD_FUNCS' order)"]
    return []


def training_questions(dataset: Any) -> list[str]:
    """The problem text of every training row: its ``question``, else the last user message of its ``prompt``."""
    if "question" in dataset.column_names:
        return list(dataset["question"])
    return [next((m["content"] for m in reversed(p) if m.get("role") == "user"), "") for p in dataset["prompt"]]


def dataset_problems(dataset: Any) -> list[str]:
    """``prompt`` and ``answer`` columns, and no problem of the GSM8K test split (notebook 05 evaluates on it)."""
    columns = set(getattr(dataset, "column_names", None) or [])
    if not {"prompt", "answer"} <= columns:
        return [f"train_dataset has columns {sorted(columns)}; GRPO generates from 'prompt' and the rewards read "
                "'answer'"]
    held_out = set(load_gsm8k("test", verbose=False)["question"])
    seen = sum(question in held_out for question in training_questions(dataset))
    if seen:
        return [f"train_dataset: {seen} of its {len(dataset)} problems are in GSM8K's test split, the held-out "
                "problems notebook 05 evaluates on; train on the train split"]
    return []


def _rows(dataset: Any) -> Counter[str]:
    """Each row's prompt and gold answer as one string, counted: the problems a dataset trains on, in any order."""
    return Counter(json.dumps([row.get("prompt"), row.get("answer")], sort_keys=True, default=str)
                   for row in dataset.to_list())


def same_problems_problems(dataset: Any, expected: Any) -> list[str]:
    """The notebook's training prompts, every one, unchanged (the order is TRL's to shuffle)."""
    if expected is None or not hasattr(dataset, "to_list"):
        return []
    yours, wanted = _rows(dataset), _rows(expected)
    if yours == wanted:
        return []
    missing, added = sum((wanted - yours).values()), sum((yours - wanted).values())
    return [f"train_dataset: {len(dataset)} rows, of which {added} are not the notebook's, and {missing} of its "
            f"{len(expected)} training problems are missing: the run the profile measured trains on train_dataset "
            "as the cell above built it; pass train_dataset=train_dataset"]


def _lora_values(config: Any) -> tuple[Any, ...]:
    targets = config.target_modules
    layers = config.layers_to_transform
    return (config.r, config.lora_alpha, set(targets) if not isinstance(targets, str) else targets,
            list(layers) if isinstance(layers, (list, tuple)) else layers)


def adapter_problems(trainer: Any, model: Any, lora: Any) -> list[str]:
    """The trainer trains ``model`` (the warm-started one), with the checked LoRA or none."""
    trained = trainer.model.get_base_model() if hasattr(trainer.model, "get_base_model") else trainer.model
    if trained is not model:
        return ["model: not the model loaded (and warm-started) above; pass model=model"]
    adapters = getattr(trainer.model, "peft_config", {})
    if lora is None:
        return ["peft_config: this profile trains every weight; pass peft_config=None"] if adapters else []
    if "default" not in adapters or _lora_values(adapters["default"]) != _lora_values(lora):
        return ["peft_config: the model carries no LoRA adapter as `lora` configures it; pass peft_config=lora"]
    return []


def trainer_problems(trainer: Any, model: Any, tokenizer: Any, config: Any, lora: Any,
                     train_dataset: Any = None) -> list[str]:
    """Everything a ``GRPOTrainer`` is given that the course's run is not (callbacks are the learner's own)."""
    kind = kind_problem(trainer, GRPOTrainer, "GRPOTrainer")
    if kind:
        return kind
    problems = [] if trainer.args is config else ["args: not the GRPOConfig checked above; pass args=config"]
    if trainer.processing_class is not tokenizer:
        problems.append("processing_class: not the tokenizer loaded with the model; pass processing_class=tokenizer")
    return [*problems, *reward_problems(trainer, config), *adapter_problems(trainer, model, lora),
            *(dataset_problems(trainer.train_dataset) or same_problems_problems(trainer.train_dataset, train_dataset))]


def release_model(trainer: Any, model: Any) -> None:
    """Take a failed trainer's LoRA layers out of ``model`` (peft adds them in place): the reference adds its own."""
    wrapped = getattr(trainer, "model", None)
    if hasattr(wrapped, "unload") and hasattr(wrapped, "get_base_model") and wrapped.get_base_model() is model:
        wrapped.unload()


def strip_adapters(model: Any) -> None:
    """Take out the LoRA layers a failed ``GRPOTrainer(...)`` call left in ``model`` (peft adds them in place).

    Without this the reference trainer would add a second adapter next to the leftover one.
    """
    if not isinstance(model, torch.nn.Module):
        return
    for name, module in list(model.named_modules()):
        if isinstance(module, BaseTunerLayer):
            parent_name, _, child = name.rpartition(".")
            parent = model.get_submodule(parent_name) if parent_name else model
            setattr(parent, child, module.get_base_layer())
    if "peft_config" in vars(model):
        del model.peft_config


def reference_trainer(model: Any, tokenizer: Any, config: Any, lora: Any, train_dataset: Any,
                      callbacks: Sequence[Any] = ()) -> Any:
    """The ``GRPOTrainer`` the course builds (``training.build_trainer``'s call) from the checked pieces."""
    return GRPOTrainer(model=model, processing_class=tokenizer, reward_funcs=list(REWARD_FUNCS), args=config,
                       train_dataset=train_dataset, peft_config=lora, callbacks=list(callbacks))


TRAINER_HINT = ("every argument is a name defined above: the model, the tokenizer, REWARD_FUNCS, the checked config, "
                "the training prompts, the checked LoRA and the dashboard")


def check_grpo_trainer(trainer: Any, profile: Profile, *, model: Any, tokenizer: Any, config: Any, lora: Any,
                       train_dataset: Any = None, callbacks: Sequence[Any] = ()) -> Any:
    """04.4: the learner's ``GRPOTrainer``; hands back it when it passed, else the course's trainer on the same pieces.

    ``config`` and ``lora`` are what 04.1 and 04.2 handed back; ``train_dataset`` and ``callbacks`` are the
    notebook's, for the reference trainer.
    """
    exercise = "04.4 GRPOTrainer"
    problems = problems_of(trainer_problems, trainer, model, tokenizer, config, lora, train_dataset)
    passed = judge(exercise, trainer, problems, TRAINER_HINT, TRL_TRAINER)
    reference = None
    if not passed:
        release_model(trainer, model)
        strip_adapters(model)
        data = train_dataset if train_dataset is not None else training_dataset(profile, tokenizer=tokenizer)
        reference = reference_trainer(model, tokenizer, config, lora, data, callbacks)
    return hand_back(exercise, passed, trainer, reference, "GRPOTrainer (training.build_trainer's call)")
