"""GRPO by hand: group-relative advantages and the clipped per-token loss with its KL term.

GRPO (Group Relative Policy Optimization) samples a *group* of ``num_generations`` completions per
prompt, scores each, and uses "how much better than my siblings" as the advantage: no value network.
These functions compute, on small tensors, exactly what the installed TRL computes, so a learner can
check every number by hand; ``lesson.trl_grpo`` asks the installed TRL itself for the same numbers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

SCALES = ("group", "batch", "none")
LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo")
STD_EPS = 1e-4  # TRL adds this to the std before dividing, so an all-equal group gives 0, not NaN


def as_rewards(rewards: Sequence[float | None] | torch.Tensor) -> torch.Tensor:
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


def check_groups(rewards: torch.Tensor, num_generations: int) -> None:
    if not isinstance(num_generations, int) or num_generations < 1:
        raise ValueError(f"num_generations must be a positive int, got {num_generations!r}")
    if rewards.numel() % num_generations:
        raise ValueError(
            f"{rewards.numel()} rewards do not split into groups of num_generations={num_generations}; "
            "pass the rewards of whole groups, prompt by prompt (TRL orders them that way)"
        )


def normalize_scale(scale: str | bool) -> str:
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
    rewards = as_rewards(rewards)
    check_groups(rewards, num_generations)
    scale = normalize_scale(scale)
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
    rewards = as_rewards(rewards)
    check_groups(rewards, num_generations)
    _, std = _group_stats(rewards, num_generations, normalize_scale(scale))
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


__all__ = [
    "LOSS_TYPES",
    "SCALES",
    "PolicyLoss",
    "clipped_objective",
    "frac_reward_zero_std",
    "group_advantages",
    "grpo_policy_loss",
    "k3_kl",
    "nanstd",
]
