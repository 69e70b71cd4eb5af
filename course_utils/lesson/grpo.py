"""GRPO by hand: group-relative advantages and the clipped per-token loss with its KL term.

GRPO (Group Relative Policy Optimization) samples a *group* of ``num_generations`` completions per
prompt, scores each, and uses "how much better than my siblings" as the advantage: no value network.
These functions compute, on small tensors, exactly what the installed TRL computes, so a learner can
check every number by hand. The second half of the module asks the installed TRL itself: a real
``GRPOTrainer`` on a tiny random Qwen2 model (``models.build_tiny_random_model``) runs its own code on
inputs we choose, so notebook 01 and ``tests/test_grpo.py`` compare against TRL, not a copy of it:

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
import math
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
from course_utils.lesson.models import build_tiny_random_model
from course_utils.lesson.offline_model import materialize_offline_model

SCALES = ("group", "batch", "none")
LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo")
STD_EPS = 1e-4  # TRL adds this to the std before dividing, so an all-equal group gives 0, not NaN


def _as_rewards(rewards: Sequence[float | None] | torch.Tensor) -> torch.Tensor:
    """The rewards as a float tensor; a None (a reward that cannot score a completion) is NaN, as TRL reads it:
    left out of its group's mean and std, and given advantage 0."""
    if not isinstance(rewards, torch.Tensor):
        rewards = [math.nan if reward is None else reward for reward in rewards]
    tensor = torch.as_tensor(rewards, dtype=torch.float32)
    if tensor.dim() != 1 or tensor.numel() == 0:
        raise ValueError(
            f"rewards must be a non-empty flat list (one reward per completion), got shape {tuple(tensor.shape)}"
        )
    return tensor


def _check_groups(rewards: torch.Tensor, num_generations: int) -> None:
    if not isinstance(num_generations, int) or num_generations < 1:
        raise ValueError(f"num_generations must be a positive int, got {num_generations!r}")
    if rewards.numel() % num_generations:
        raise ValueError(
            f"{rewards.numel()} rewards do not split into groups of num_generations={num_generations}; "
            "pass the rewards of whole groups, prompt by prompt (TRL orders them that way)"
        )


def _normalize_scale(scale: str | bool) -> str:
    # GRPOConfig maps True -> "group" and False -> "none" (grpo_config.py, __post_init__).
    scale = {True: "group", False: "none"}.get(scale, scale)  # type: ignore[arg-type]
    if scale not in SCALES:
        raise ValueError(f"scale must be one of {SCALES} (or True/False), got {scale!r}")
    return scale


def nanstd(tensor: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sample standard deviation (Bessel-corrected, like ``torch.std``) ignoring NaNs, as ``trl.trainer.utils.nanstd``.

    Bessel's correction matters for small groups: with 4 completions the std is ``sqrt(4/3)`` times the
    population std, which changes every advantage.
    """
    mean = torch.nanmean(tensor, dim=dim, keepdim=True)
    variance = torch.nanmean((tensor - mean) ** 2, dim=dim, keepdim=True)
    count = torch.sum(~torch.isnan(tensor), dim=dim, keepdim=True)
    correction = torch.where(count > 1, count / (count - 1), torch.full_like(variance, float("nan")))
    std = torch.sqrt(variance * correction)
    return std.squeeze(dim) if dim is not None else std.reshape(())


def _group_stats(rewards: torch.Tensor, num_generations: int, scale: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-completion group mean and the std used for scaling/logging, both repeated to the rewards' length."""
    grouped = rewards.view(-1, num_generations)
    mean = torch.nanmean(grouped, dim=1).repeat_interleave(num_generations)
    if scale in ("group", "none"):
        std = (
            nanstd(grouped, dim=1).repeat_interleave(num_generations)
            if num_generations > 1
            else torch.zeros_like(rewards)
        )
    else:  # "batch": one std over every completion in the batch
        std = nanstd(rewards).expand_as(rewards) if rewards.numel() > 1 else torch.zeros_like(rewards)
    return mean, std


def group_advantages(
    rewards: Sequence[float] | torch.Tensor, num_generations: int, scale: str | bool = "group"
) -> torch.Tensor:
    """Advantage of each completion: its reward minus its group's mean, divided by a std (per ``scale``).

    ``rewards`` lists whole groups one after another (``num_generations`` completions of prompt 1,
    then of prompt 2, ...). ``scale="group"`` divides by each group's std (GRPO's original recipe),
    ``"batch"`` by the std of the whole batch, ``"none"`` not at all (Dr. GRPO's argument: dividing by a
    small std over-weights nearly-solved prompts). A group whose rewards are all equal gets advantage 0
    for every completion: nothing to prefer, nothing learned. Mirrors TRL's ``_generate_and_score_completions``.
    """
    rewards = _as_rewards(rewards)
    _check_groups(rewards, num_generations)
    scale = _normalize_scale(scale)
    mean, std = _group_stats(rewards, num_generations, scale)
    advantages = rewards - mean
    if scale != "none":
        advantages = advantages / (std + STD_EPS)
    return torch.nan_to_num(advantages, nan=0.0)


def frac_reward_zero_std(
    rewards: Sequence[float] | torch.Tensor, num_generations: int, scale: str | bool = "group"
) -> float:
    """Share of completions whose group (or batch, for ``scale="batch"``) has zero reward std: TRL's metric.

    Every completion in such a group has advantage 0, so it contributes no gradient: a value near 1
    means the reward cannot tell the completions apart (all wrong, or all right) and training stalls.
    """
    rewards = _as_rewards(rewards)
    _check_groups(rewards, num_generations)
    _, std = _group_stats(rewards, num_generations, _normalize_scale(scale))
    return torch.isclose(std, torch.zeros_like(std)).float().mean().item()


def k3_kl(per_token_logps: torch.Tensor, ref_per_token_logps: torch.Tensor) -> torch.Tensor:
    """Per-token KL estimate ``exp(r) - r - 1`` with ``r = ref_logp - logp`` (Schulman's k3 estimator).

    Always >= 0, exactly 0 where the policy equals the reference, and unbiased for KL(policy || ref)
    on tokens sampled from the policy. TRL: ``_compute_loss``, ``per_token_kl``.
    """
    diff = ref_per_token_logps - per_token_logps
    return torch.exp(diff) - diff - 1


@dataclass(frozen=True)
class PolicyLoss:
    """The loss and the tensors behind it, for plots and for checking by hand."""

    loss: torch.Tensor  # scalar
    per_token_loss: torch.Tensor  # (B, T), KL included when beta > 0
    ratio: torch.Tensor  # (B, T) pi_theta / pi_old per token (TRL's coef_1)
    clipped_ratio: torch.Tensor  # (B, T) ratio clamped to [1 - eps_low, 1 + eps_high] (coef_2)
    per_token_kl: torch.Tensor | None  # (B, T) k3 estimate, None when beta == 0
    clip_fraction: float  # share of (masked) tokens where clipping switched the gradient off


def _aggregate(
    per_token_loss: torch.Tensor,
    mask: torch.Tensor,
    loss_type: str,
    max_completion_length: int | None,
    num_items_in_batch: float | None,
) -> torch.Tensor:
    """TRL's per-loss-type reduction (one process, no gradient accumulation)."""
    if loss_type == "grpo":  # mean per sequence, then over sequences: long answers weigh less per token
        return ((per_token_loss * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    if loss_type == "bnpo":  # mean over the tokens of this batch
        return (per_token_loss * mask).sum() / mask.sum().clamp(min=1.0)
    if loss_type == "dr_grpo":  # constant normalizer: no length bias
        if max_completion_length is None:
            raise ValueError("loss_type='dr_grpo' divides by max_completion_length: pass it")
        return (per_token_loss * mask).sum() / (per_token_loss.size(0) * max_completion_length)
    # "dapo": mean over every token of the whole generation batch (num_items_in_batch)
    normalizer = torch.as_tensor(mask.sum() if num_items_in_batch is None else num_items_in_batch, dtype=torch.float32)
    return (per_token_loss * mask).sum() / normalizer.clamp(min=1.0)


def grpo_policy_loss(
    per_token_logps: torch.Tensor,
    old_per_token_logps: torch.Tensor,
    advantages: torch.Tensor,
    completion_mask: torch.Tensor,
    *,
    ref_per_token_logps: torch.Tensor | None = None,
    beta: float = 0.0,
    epsilon: float = 0.2,
    epsilon_high: float | None = None,
    loss_type: str = "dapo",
    max_completion_length: int | None = None,
    num_items_in_batch: float | None = None,
    use_bias_correction_kl: bool = True,
) -> PolicyLoss:
    """The clipped surrogate loss per token, plus ``beta`` x KL, reduced as TRL's ``_compute_loss`` does.

    Per token: ``-min(ratio * A, clip(ratio, 1 - eps, 1 + eps_high) * A) + beta * KL``. When the policy
    has not moved yet (``ratio == 1``, TRL's default single iteration per batch) the first term is
    ``-A``, and advantages average to 0 inside each group, so the logged loss starts near 0 even though
    its gradient is not 0: the loss value is not a progress measure in GRPO.

    ``use_bias_correction_kl`` (GRPOConfig default ``True``) multiplies the KL by the ratio, as TRL does,
    so the KL gradient is the unbiased reverse-KL gradient; the logged ``kl`` includes that factor.
    """
    if loss_type not in LOSS_TYPES:
        raise ValueError(f"loss_type must be one of {LOSS_TYPES}, got {loss_type!r}")
    if beta != 0.0 and ref_per_token_logps is None:
        raise ValueError("beta > 0 needs ref_per_token_logps (the reference model's log-probs) for the KL term")
    shape = per_token_logps.shape
    for name, tensor in (("old_per_token_logps", old_per_token_logps), ("completion_mask", completion_mask)):
        if tensor.shape != shape:
            raise ValueError(f"{name} has shape {tuple(tensor.shape)}, expected {tuple(shape)} like per_token_logps")
    eps_high = epsilon if epsilon_high is None else epsilon_high
    adv = advantages.unsqueeze(1) if advantages.dim() == 1 else advantages
    mask = completion_mask.to(per_token_logps.dtype)

    ratio = torch.exp(per_token_logps - old_per_token_logps)
    clipped = torch.clamp(ratio, 1 - epsilon, 1 + eps_high)
    per_token_loss = -torch.min(ratio * adv, clipped * adv)
    kl = None
    if beta != 0.0:
        kl = k3_kl(per_token_logps, ref_per_token_logps)
        if use_bias_correction_kl:
            kl = kl * ratio
        per_token_loss = per_token_loss + beta * kl
    loss = _aggregate(per_token_loss, mask, loss_type, max_completion_length, num_items_in_batch)
    clipped_mask = ((ratio < 1 - epsilon) & (adv < 0)) | ((ratio > 1 + eps_high) & (adv > 0))
    clip_fraction = ((clipped_mask.float() * mask).sum() / mask.sum().clamp(min=1.0)).item()
    return PolicyLoss(loss, per_token_loss, ratio, clipped, kl, clip_fraction)


def clipped_objective(ratio: torch.Tensor, advantage: float, epsilon: float = 0.2) -> torch.Tensor:
    """``min(ratio * A, clip(ratio) * A)`` for a range of ratios: the curve that shows where clipping bites."""
    return torch.min(ratio * advantage, torch.clamp(ratio, 1 - epsilon, 1 + epsilon) * advantage)


# --- the same numbers from the installed TRL ------------------------------------------------------------


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

    _check_groups(torch.zeros(num_generations), num_generations)
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
            scale_rewards=_normalize_scale(scale_rewards),
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
    values = _as_rewards(rewards)
    _check_groups(values, num_generations)
    trainer = trl_trainer(num_generations, _normalize_scale(scale))
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
    "LOSS_TYPES",
    "SCALES",
    "FixedRewards",
    "LossCase",
    "PolicyLoss",
    "clipped_objective",
    "frac_reward_zero_std",
    "group_advantages",
    "grpo_policy_loss",
    "k3_kl",
    "nanstd",
    "trl_frac_reward_zero_std",
    "trl_group_advantages",
    "trl_loss_case",
    "trl_policy_loss",
    "trl_reward_extras",
    "trl_reward_values",
    "trl_trainer",
]
