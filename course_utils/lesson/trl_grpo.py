"""The same numbers as ``lesson.grpo``, from the installed TRL: a real ``GRPOTrainer`` on a tiny random Qwen2 model
(``models.build_tiny_random_model``) runs its own code on inputs we choose, so notebook 01 and ``tests/test_grpo.py``
compare against TRL, not a copy of it:

- advantages and ``frac_reward_zero_std``: ``GRPOTrainer._generate_and_score_completions`` with a
  reward function that hands back the rewards we chose (``trl_group_advantages``);
- the loss: ``GRPOTrainer._compute_loss`` (token-level importance sampling, loss types ``grpo``,
  ``bnpo``, ``dr_grpo`` and the default ``dapo``), one process, no gradient accumulation
  (``trl_loss_case`` and ``trl_policy_loss``).

Those methods are TRL's private ones: they are called through ``core.trl_internals``, whose version gate turns a
TRL rename into "this course was tested with TRL 1.16; TRL a.b changed <name>", not an error in the learner's code.
"""

from __future__ import annotations

import contextlib
import functools
import tempfile
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from datasets import Dataset
from transformers import AutoTokenizer
from transformers.utils import logging as hf_logging
from trl import GRPOConfig, GRPOTrainer

from course_utils.core import trl_internals
from course_utils.lesson.grpo import as_rewards, check_groups, group_advantages, normalize_scale
from course_utils.lesson.models import build_tiny_random_model
from course_utils.lesson.offline_model import materialize_offline_model


class FixedRewards:
    """A reward function that returns rewards we chose, in order: TRL computes everything after the rewards."""

    __name__ = "fixed_rewards"  # TRL names the reward's metrics after it

    def __init__(self) -> None:
        self.values: list[float] = []

    def __call__(self, completions: list[Any], **kwargs: Any) -> list[float]:
        if len(self.values) != len(completions):
            raise ValueError(f"{len(self.values)} fixed rewards for {len(completions)} completions")
        return list(self.values)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """No loading bars, no deprecation notices from the libraries: they are not what a learner checks here."""

    bars_shown = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            yield
    finally:
        if bars_shown:
            hf_logging.enable_progress_bar()


@functools.lru_cache(maxsize=1)
def _scratch() -> tempfile.TemporaryDirectory:
    """One temporary folder per session for the tiny model and the trainers' output; removed at exit."""
    return tempfile.TemporaryDirectory(prefix="trl-reference-")


@functools.lru_cache(maxsize=1)
def _tiny_model_folder() -> str:
    """The tiny random model saved once per session: TRL loads its reference model (``beta > 0``) from a path."""

    folder = f"{_scratch().name}/tiny-qwen2"
    build_tiny_random_model().save_pretrained(folder)
    AutoTokenizer.from_pretrained(materialize_offline_model()).save_pretrained(folder)
    return folder


def trl_trainer(*settings: Any, **named_settings: Any) -> Any:
    """A real ``GRPOTrainer`` on a tiny random Qwen2 model (CPU, about a second), reused per setting
    (the settings of :func:`_kept_trl_trainer`: ``num_generations``, ``scale_rewards``, ``loss_type``, ``beta``, ...).

    Its only reward is a ``FixedRewards``: set ``trainer.reward_funcs[0].values`` to make TRL score
    completions with rewards of your choice (one token each by default: only the rewards matter).
    A kept trainer is built again when accelerate's process-wide state it runs on was reset since (every new
    ``TrainingArguments`` resets it when it sets up its device).
    """
    trainer = _kept_trl_trainer(*settings, **named_settings)
    if not _accelerate_state_holds(trainer):
        _kept_trl_trainer.cache_clear()
        trainer = _kept_trl_trainer(*settings, **named_settings)
    return trainer


def _accelerate_state_holds(trainer: Any) -> bool:
    try:
        trainer.accelerator.device  # noqa: B018  (raises once accelerate's shared state was reset)
    except AttributeError:
        return False
    return True


@functools.lru_cache(maxsize=32)
def _kept_trl_trainer(
    num_generations: int = 4,
    scale_rewards: str = "group",
    loss_type: str = "dapo",
    beta: float = 0.0,
    epsilon: float = 0.2,
    epsilon_high: float | None = None,
    use_bias_correction_kl: bool = True,
    max_completion_length: int = 1,
) -> Any:
    """:func:`trl_trainer`'s trainer, built once per setting. The tokenizer is the offline SmolLM2 one (no
    download); the model is saved to a temporary folder once, because TRL loads the reference model from a path."""

    check_groups(torch.zeros(num_generations), num_generations)
    with _quiet():
        config = GRPOConfig(
            output_dir=f"{_scratch().name}/run",
            use_cpu=True,
            bf16=False,
            report_to="none",
            save_strategy="no",
            num_generations=num_generations,
            per_device_train_batch_size=num_generations,
            max_completion_length=max_completion_length,
            scale_rewards=normalize_scale(scale_rewards),
            loss_type=loss_type,
            beta=beta,
            epsilon=epsilon,
            epsilon_high=epsilon_high,
            use_bias_correction_kl=use_bias_correction_kl,
        )
        prompts = Dataset.from_list([{"prompt": "1 + 1 ="}] * num_generations)
        trainer = GRPOTrainer(
            model=_tiny_model_folder(), reward_funcs=[FixedRewards()], args=config, train_dataset=prompts
        )
    trainer.current_gradient_accumulation_steps = 1  # the training loop sets it; here one micro-batch per step
    return trainer


def _trl_scored(rewards: Sequence[float] | torch.Tensor, num_generations: int, scale: str | bool) -> tuple[Any, Any]:
    """Let TRL generate one completion per reward, score them with ``rewards`` and compute its advantages."""
    values = as_rewards(rewards)
    check_groups(values, num_generations)
    trainer = trl_trainer(num_generations, normalize_scale(scale))
    trainer.reward_funcs[0].values = values.tolist()
    trainer.model.train()
    inputs = [{"prompt": f"prompt {i // num_generations}:"} for i in range(values.numel())]
    with _quiet():
        output = trl_internals.generate_and_score(trainer, inputs)
    return output, trl_internals.logged_metrics(trainer)


def trl_group_advantages(
    rewards: Sequence[float] | torch.Tensor, num_generations: int, scale: str | bool = "group"
) -> torch.Tensor:
    """The advantages the installed TRL computes for ``rewards`` (whole groups, prompt by prompt)."""
    output, _ = _trl_scored(rewards, num_generations, scale)
    return output["advantages"]


def trl_frac_reward_zero_std(
    rewards: Sequence[float] | torch.Tensor, num_generations: int, scale: str | bool = "group"
) -> float:
    """The ``frac_reward_zero_std`` the installed TRL logs for ``rewards``."""
    _, metrics = _trl_scored(rewards, num_generations, scale)
    return metrics["frac_reward_zero_std"][-1]


@dataclass(frozen=True)
class LossCase:
    """One batch for the loss: TRL's ``inputs`` dict and the same numbers as plain tensors for our formulas."""

    label: str
    inputs: dict[str, torch.Tensor]  # what GRPOTrainer._compute_loss reads
    per_token_logps: torch.Tensor  # (B, T) log-probs of the completion tokens under the current model
    old_per_token_logps: torch.Tensor
    ref_per_token_logps: torch.Tensor
    advantages: torch.Tensor  # (B,)
    completion_mask: torch.Tensor  # (B, T) 1 for real tokens, 0 for padding


def trl_loss_case(
    trainer: Any,
    lengths: Sequence[int] = (6, 3, 5, 2),
    seed: int = 0,
    drift: float = 0.3,
    label: str | None = None,
) -> LossCase:
    """A batch of random completions of the given ``lengths``, with log-probs from the trainer's own model.

    ``drift`` moves the old (and reference) log-probs away from the current ones, so the ratio is not 1
    and clipping happens; ``drift=0`` is the first step after generation. Advantages come from random
    rewards in groups of ``trainer.num_generations``.
    """
    batch, width = len(lengths), max(lengths)
    if batch % trainer.num_generations:
        raise ValueError(f"{batch} completions do not fill groups of num_generations={trainer.num_generations}")
    g = torch.Generator().manual_seed(seed)
    prompt_ids = torch.randint(0, 1000, (batch, 3), generator=g)
    completion_ids = torch.randint(0, 1000, (batch, width), generator=g)
    prompt_mask = torch.ones(batch, 3, dtype=torch.long)
    mask = (torch.arange(width) < torch.tensor(lengths).unsqueeze(1)).long()
    with torch.no_grad():
        logps = trl_internals.per_token_logps(
            trainer, torch.cat([prompt_ids, completion_ids], 1), torch.cat([prompt_mask, mask], 1), width
        )
    old = logps + drift * torch.randn(batch, width, generator=g)
    ref = logps + drift * torch.randn(batch, width, generator=g)
    advantages = group_advantages(torch.rand(batch, generator=g).round(decimals=1), trainer.num_generations)
    inputs = {
        "prompt_ids": prompt_ids,
        "prompt_mask": prompt_mask,
        "completion_ids": completion_ids,
        "completion_mask": mask,
        "advantages": advantages,
        "old_per_token_logps": old,
        "ref_per_token_logps": ref,
        "num_items_in_batch": mask.sum(),
    }
    name = label or f"lengths {list(lengths)}, drift {drift}, seed {seed}"
    return LossCase(name, inputs, logps, old, ref, advantages, mask.float())


def trl_policy_loss(trainer: Any, case: LossCase) -> torch.Tensor:
    """The loss the installed TRL computes for ``case`` (``GRPOTrainer._compute_loss``, one micro-batch)."""
    trainer.model.train()
    with torch.no_grad(), _quiet():
        return trl_internals.compute_loss(trainer, case.inputs)


def _message_text(completion: Any) -> str:
    """A completion's text for tokenizing its ids: a string, or the contents of TRL's list of messages."""
    if isinstance(completion, str):
        return completion
    return "".join(str(m.get("content") or "") for m in completion if isinstance(m, dict))


def trl_reward_values(
    reward_func: Callable[..., Any], prompts: Sequence[Any], completions: Sequence[Any], **columns: Sequence[Any]
) -> list[float]:
    """The rewards the installed TRL gets from ``reward_func``: ``GRPOTrainer._calculate_rewards`` calls it.

    TRL passes ``prompts``, ``completions``, ``completion_ids``, every dataset column (``columns``, one value
    per completion), ``trainer_state``, ``log_extra`` and ``log_metric``; a ``None`` reward becomes NaN, and a
    wrong number of rewards is TRL's own ``ValueError``. Whatever the function raises, TRL raises too.
    """
    if len(prompts) != len(completions) or any(len(v) != len(completions) for v in columns.values()):
        raise ValueError("prompts and every column need one entry per completion")
    trainer = trl_trainer(4)
    tokenizer = trainer.processing_class
    completion_ids = [tokenizer(_message_text(c), add_special_tokens=False)["input_ids"] for c in completions]
    inputs = [{"prompt": p, **{k: v[i] for k, v in columns.items()}} for i, p in enumerate(prompts)]
    own = trainer.reward_funcs, trainer.reward_func_names
    trainer.reward_funcs = [reward_func]
    trainer.reward_func_names = [getattr(reward_func, "__name__", "reward_func")]
    try:
        with _quiet():
            rewards = trl_internals.calculate_rewards(trainer, inputs, list(prompts), list(completions), completion_ids)
    finally:
        trainer.reward_funcs, trainer.reward_func_names = own
    return rewards[:, 0].tolist()


@functools.cache
def trl_reward_extras() -> dict[str, Any]:
    """The keyword arguments the installed TRL passes a reward besides prompts, completions, their ids and the
    dataset's columns (``trainer_state``, ``log_extra``, ``log_metric`` in TRL 1.16), read once from TRL's own
    reward code: a check that calls a reward with them calls it as ``GRPOTrainer`` does."""
    return trl_internals.reward_extras(trl_trainer(4))


__all__ = [
    "FixedRewards",
    "LossCase",
    "trl_frac_reward_zero_std",
    "trl_group_advantages",
    "trl_loss_case",
    "trl_policy_loss",
    "trl_reward_extras",
    "trl_reward_values",
    "trl_trainer",
]
