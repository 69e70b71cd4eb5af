"""A reward called as ``GRPOTrainer`` calls it: keyword arguments only, the extra ones read from the installed TRL.

A completion comes as TRL passes it for a conversational dataset (one assistant message), and an ``async def``
reward is awaited as TRL awaits it. Every check of notebook 03 calls the learner's reward through these.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import inspect
from collections.abc import Callable, Sequence
from typing import Any

from course_utils.lesson import rewards
from course_utils.lesson.formatting import build_prompt
from course_utils.lesson.trl_grpo import trl_reward_extras


def conversation(text: Any) -> list[dict[str, Any]]:
    """A completion as TRL passes it for a conversational dataset: one assistant message."""
    return [{"role": "assistant", "content": text}]


@functools.cache
def _trl_extras() -> dict[str, Any]:
    """The installed TRL's extra reward keywords (``lesson.trl_grpo.trl_reward_extras``), read once per process."""
    return trl_reward_extras()


def trl_reward_kwargs(completions: Sequence[Any], answers: Sequence[str], reasoning: Sequence[str]) -> dict[str, Any]:
    """The keyword arguments ``GRPOTrainer._calculate_rewards`` gives a reward function for a batch (TRL 1.16).

    ``environments`` is left out: TRL passes it only to trainers built with an ``environment_factory``.
    """
    texts = [rewards.completion_text(c) for c in completions]
    return {
        "prompts": [build_prompt("A GSM8K question?") for _ in completions],
        "completions": list(completions),
        "completion_ids": [list(text.encode()) for text in texts],  # stand-ins for token ids
        "answer": list(answers),
        "reasoning": list(reasoning),
        **_trl_extras(),
    }


def awaited(value: Any) -> Any:
    """The value of an awaitable, run as TRL 1.16 runs an ``async def`` reward: on an event loop of its own thread.

    A thread of its own, because a notebook's kernel already runs an event loop in this one.
    """
    if not inspect.isawaitable(value):
        return value

    async def wait() -> Any:
        return await value

    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, wait()).result()


def synchronous(learner: Callable[..., Any]) -> Callable[..., Any]:
    """The learner's reward as a plain function: an ``async def`` one awaited each call (the rest unchanged).

    What the notebook continues with: its later cells call the reward directly, where TRL would await it.
    """
    if not inspect.iscoroutinefunction(learner):
        return learner

    def call(*args: Any, **kwargs: Any) -> Any:
        return awaited(learner(*args, **kwargs))

    call.__name__ = call.__qualname__ = getattr(learner, "__name__", "own_reward_func")
    call.__doc__ = learner.__doc__
    return call


def called_like_trl(function: Callable[..., Any]) -> Callable[[dict[str, Any]], Any]:
    """``function(**kwargs)``: how ``GRPOTrainer`` calls a reward (keywords only, extra columns included).

    ``functools.wraps`` keeps the learner's name and module on the wrapper, so the comparison reports the
    learner's function as theirs.
    """

    @functools.wraps(function)
    def call(kwargs: dict[str, Any]) -> Any:
        return awaited(function(**kwargs))  # an async def reward is awaited, as TRL awaits it

    return call
