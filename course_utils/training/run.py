"""The ``GRPOTrainer`` run: the model in its training dtype, the trainer on the course's rewards, a fresh start.

The package's reference for what notebook 04's learner writes, used by scripts, benchmarks and the checks that
compare the notebook with it, from the modules that each hold one part of the run:

1. ``training.grpo_config``: ``make_grpo_config(profile)``, the real ``GRPOConfig`` fields from the hardware profile.
2. ``load_model_for_training`` here, LoRA from ``training.lora_setup`` (``make_lora_config``).
3. ``training.grpo_prompts``: ``training_dataset(profile)``, the GRPO prompts.
4. ``build_trainer(...)`` here: ``GRPOTrainer`` with the course's rewards and their weights.
5. ``training.trained_model``: ``save_final`` / ``load_trained_model``, the result in the folder notebook 05 loads.

The warm start before GRPO lives in ``course_utils.training.warm_start``; the dashboard in ``training.run_callbacks``,
the saved log history in ``training.run_logs``, the monitoring rules in ``training.monitoring``; ``training.lab`` chains
everything for scripts.
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import TrainerCallback
from trl import GRPOTrainer

from course_utils.core.hardware import cpu_precision
from course_utils.core.profiles import Profile, get_profile
from course_utils.lesson.models import load_model_and_tokenizer
from course_utils.lesson.rewards import REWARD_FUNCS
from course_utils.training import run_folder
from course_utils.training.grpo_config import make_grpo_config
from course_utils.training.grpo_prompts import training_dataset
from course_utils.training.lora_setup import make_lora_config


def load_model_for_training(profile: Profile | str | None = None) -> tuple[Any, Any]:
    """The profile's model and tokenizer, in the profile's training dtype (``Profile.training_dtype``).

    Why a training dtype: on a CPU with bfloat16 instructions, a bf16 copy of the weights generates faster
    than fp32 and halves memory; with LoRA the trained adapter weights stay in fp32, so the small updates
    are not lost to bf16 rounding. The evaluation keeps loading the profile's ``dtype``.
    """
    p = get_profile(profile)
    model, tokenizer = load_model_and_tokenizer(p)
    dtype = p.training_dtype
    if dtype != p.dtype:
        if not p.use_lora:
            raise ValueError(
                f"Profile {p.name!r}: train_dtype={dtype} without LoRA would train the {dtype} weights "
                "themselves and lose small updates to rounding; set use_lora=True or train_dtype=None."
            )
        model = model.to(getattr(torch, dtype))
    if p.device == "cpu" and p.train_dtype == "auto":
        print(f"CPU precision: {cpu_precision()}.")
    return model, tokenizer



# --- The trainer -----------------------------------------------------------------------------------


def build_trainer(
    model: Any,
    tokenizer: Any,
    profile: Profile | str | None = None,
    train_dataset: Any = None,
    config: Any = None,
    callbacks: Iterable[TrainerCallback] = (),
    reward_funcs: Sequence[Any] | None = None,
    tools: Iterable[Callable[..., Any]] = (),
) -> Any:
    """A ``GRPOTrainer`` on the course's five rewards (weights from the config), LoRA from the profile.

    ``tools`` are plain typed functions with docstrings the model may call while it generates (notebook 08);
    the tokenizer's chat template must then render tool calls (``tool_lab.tool_tokenizer``).

    The same call notebook 04's learner writes out: plain TRL. The CPU speed-ups are applied around
    ``trainer.train()`` (``with cpu_speed.enabled(trainer):``), not here.
    """
    p = get_profile(profile)
    config = config if config is not None else make_grpo_config(p)
    funcs = list(reward_funcs) if reward_funcs is not None else list(REWARD_FUNCS)
    if config.reward_weights is not None and len(config.reward_weights) != len(funcs):
        raise ValueError(
            f"{len(config.reward_weights)} reward_weights for {len(funcs)} reward functions: give one weight each."
        )
    if train_dataset is None:
        train_dataset = training_dataset(p, tokenizer=tokenizer)
    missing = {"prompt", "answer"} - set(train_dataset.column_names)
    if missing:
        raise ValueError(
            f"train_dataset lacks column(s) {sorted(missing)}: "
            "build it with training_dataset(profile, tokenizer=tokenizer)."
        )
    return GRPOTrainer(
        model=model,
        reward_funcs=[finite_rewards(func) for func in funcs],
        args=config,
        train_dataset=train_dataset,
        processing_class=tokenizer,
        peft_config=make_lora_config(p, model),
        callbacks=list(callbacks),
        tools=list(tools) or None,
    )


def finite_rewards(func: Any) -> Any:
    """``func`` refusing an infinite reward by name; a plain function only (a reward model or an async one as given).

    Why: TRL sums the rewards with ``nansum`` (None and NaN mean "does not apply" and are left out), but an ``inf``
    makes the group's mean and std infinite: its advantages become NaN or 0 and the group teaches nothing, silently.
    """
    if not inspect.isfunction(func) or inspect.iscoroutinefunction(func):
        return func

    @functools.wraps(func)
    def checked(*args: Any, **kwargs: Any) -> Any:
        rewards = func(*args, **kwargs)
        for index, value in enumerate(rewards):
            if isinstance(value, int | float) and math.isinf(value):
                raise ValueError(
                    f"reward function {func.__name__!r} returned {value} for completion {index + 1} of "
                    f"{len(rewards)}: a reward must be a finite number, or None where it does not apply (TRL then "
                    "leaves it out of the sum, as it does NaN). Fix the function, then rerun."
                )
        return rewards

    return checked


def clear_run_dir(run_dir: str | Path) -> Path:
    """Delete an earlier run (a fresh start) from a folder the course made; keep the warm start.

    Only the course's own entries go, and only from a folder it marked; anything else is refused by name
    (``run_folder.clear``): a run folder given by mistake (``.``, the outputs root, a project) is never emptied.
    """
    return run_folder.clear(run_dir)
