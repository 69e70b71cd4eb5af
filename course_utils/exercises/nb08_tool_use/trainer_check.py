"""08.4: the learner's ``GRPOTrainer(..., tools=[calculator])``, judged on what it holds; the reference is
``tool_lab.build_tool_trainer``'s call on the same pieces."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from trl import GRPOTrainer

from course_utils.core.profiles import Profile
from course_utils.exercises.nb04_train_grpo.grpo_trainer_check import (
    adapter_problems,
    dataset_problems,
    release_model,
    strip_adapters,
)
from course_utils.exercises.nb04_train_grpo.judging import TRL_TRAINER, judge, problems_of
from course_utils.exercises.verdicts import hand_back

TRAINER = "08.4 GRPOTrainer with tools"
TRAINER_HINT = ("notebook 04's call with two changes: reward_funcs=[*REWARD_FUNCS, tool_use_reward] and "
                "tools=[calculator], the calculator 08.2 handed back")


def tool_reward_problems(trainer: Any, config: Any, reward_funcs: Sequence[Any]) -> list[str]:
    """The course's five rewards and the tool-use reward 08.3 handed back, each with the config's weight."""
    names = [getattr(f, "__name__", type(f).__name__) for f in trainer.reward_funcs]
    expected = [getattr(f, "__name__", type(f).__name__) for f in reward_funcs]
    if names != expected:
        return [f"reward_funcs {names}: pass [*REWARD_FUNCS, tool_use_reward] {expected}, in the order of "
                "config.reward_weights"]  # fmt: skip
    given, wanted = [float(w) for w in trainer.reward_weights], [float(w) for w in config.reward_weights]
    if not all(math.isclose(g, w, abs_tol=1e-9) for g, w in zip(given, wanted, strict=True)):
        return [f"each reward's weight: yours {given}, the config's {wanted}"]
    return []


def tools_problems(trainer: Any, tools: Sequence[Callable[..., Any]]) -> list[str]:
    """The trainer calls exactly the calculator 08.2 handed back."""
    held = list(getattr(trainer, "tools", None) or [])
    if len(held) != len(tools) or any(h is not t for h, t in zip(held, tools, strict=False)):
        names = [getattr(t, "__name__", type(t).__name__) for t in held]
        return [f"tools: the trainer holds {names or 'no tool'}; pass tools=[calculator], the one 08.2 handed back"]
    return []


def tool_trainer_problems(trainer: Any, *, model: Any, tokenizer: Any, config: Any, lora: Any,
                          tools: Sequence[Callable[..., Any]], reward_funcs: Sequence[Any]) -> list[str]:
    """Everything the trainer holds that the course's tool run does not (callbacks are the learner's own)."""
    if not isinstance(trainer, GRPOTrainer):
        return [f"a {type(trainer).__name__}, not a GRPOTrainer; build one with GRPOTrainer(...)"]
    problems = [] if trainer.args is config else ["args: not the tool run's config above; pass args=config"]
    if trainer.processing_class is not tokenizer:
        problems.append("processing_class: not the tool tokenizer of section 3; pass processing_class=tokenizer")
    return [*problems, *tools_problems(trainer, tools), *tool_reward_problems(trainer, config, reward_funcs),
            *adapter_problems(trainer, model, lora), *dataset_problems(trainer.train_dataset)]


def check_08_trainer(trainer: Any, profile: Profile, *, model: Any, tokenizer: Any, config: Any, lora: Any,
                     train_dataset: Any, tools: Sequence[Callable[..., Any]], reward_funcs: Sequence[Any],
                     callbacks: Sequence[Any] = ()) -> Any:
    """08.4: the learner's ``GRPOTrainer(..., tools=[calculator])``; hands back it when it passed, else the course's.

    ``tools`` and ``reward_funcs`` are what 08.2 and 08.3 handed back (with the course's five rewards); the
    reference trainer (``tool_lab.build_tool_trainer``'s call) is built on the same pieces.
    """
    found = problems_of(lambda: tool_trainer_problems(trainer, model=model, tokenizer=tokenizer, config=config,
                                                      lora=lora, tools=tools, reward_funcs=reward_funcs))
    passed = judge(TRAINER, trainer, found, TRAINER_HINT, TRL_TRAINER)
    reference = None
    if not passed:
        release_model(trainer, model)
        strip_adapters(model)
        reference = GRPOTrainer(model=model, processing_class=tokenizer, reward_funcs=list(reward_funcs), args=config,
                                train_dataset=train_dataset, peft_config=lora, tools=list(tools),
                                callbacks=list(callbacks))  # fmt: skip
    return hand_back(TRAINER, passed, trainer, reference, "GRPOTrainer (tool_lab.build_tool_trainer's call)")
