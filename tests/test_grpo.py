"""Tests for course_utils.grpo, pinned to the installed TRL.

Two kinds of pin:
- fast tests reproduce TRL's exact tensor formulas (copied from trl/trainer/grpo_trainer.py,
  ``_generate_and_score_completions`` and ``_compute_loss``) and use TRL's own ``nanstd``;
- a slow test builds a real ``GRPOTrainer`` on the offline model and calls its ``_compute_loss`` on
  inputs we choose, then compares loss and logged metrics with ``grpo_policy_loss``.
"""

from __future__ import annotations

import math

import pytest
import torch

from course_utils.grpo import (
    clipped_objective,
    frac_reward_zero_std,
    group_advantages,
    grpo_policy_loss,
    k3_kl,
    nanstd,
)

trl_utils = pytest.importorskip("trl.trainer.utils")


def trl_advantages(rewards: torch.Tensor, num_generations: int, scale_rewards: str):
    """TRL 1.16 ``_generate_and_score_completions``, ``sum_then_normalize`` branch, verbatim (one process)."""
    nanstd_ = trl_utils.nanstd
    mean_grouped_rewards = torch.nanmean(rewards.view(-1, num_generations), dim=1)
    mean_grouped_rewards = mean_grouped_rewards.repeat_interleave(num_generations, dim=0)
    if scale_rewards in ["group", "none"]:
        if num_generations > 1:
            std_rewards = nanstd_(rewards.view(-1, num_generations), dim=1)
            std_rewards = std_rewards.repeat_interleave(num_generations, dim=0)
        else:
            std_rewards = torch.zeros_like(rewards)
    else:
        std_rewards = nanstd_(rewards).expand_as(rewards) if rewards.numel() > 1 else torch.zeros_like(rewards)
    advantages = rewards - mean_grouped_rewards
    if scale_rewards != "none":
        advantages = advantages / (std_rewards + 1e-4)
    is_std_zero = torch.isclose(std_rewards, torch.zeros_like(std_rewards))
    return torch.nan_to_num(advantages, nan=0.0), is_std_zero.float().mean().item()


REWARD_BATCHES = [
    [2.0, 0.0, 0.5, 0.5, 1.0, 1.0, 1.0, 1.0],  # second group all equal
    [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0],
    [4.8125, 0.8125, 4.5, 0.0, 3.1, 2.2, 0.125, 0.5],
]


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
@pytest.mark.parametrize("rewards", REWARD_BATCHES)
@pytest.mark.parametrize("num_generations", [2, 4, 8])
def test_advantages_match_trl(rewards, scale, num_generations):
    tensor = torch.tensor(rewards)
    expected, expected_zero = trl_advantages(tensor, num_generations, scale)
    torch.testing.assert_close(group_advantages(rewards, num_generations, scale), expected)
    assert frac_reward_zero_std(rewards, num_generations, scale) == pytest.approx(expected_zero)


def test_advantages_by_hand():
    # Group [1, 0, 0, 0]: mean 1/4, sample std sqrt((9/16 + 3/16) / 3) = 1/2.
    adv = group_advantages([1.0, 0.0, 0.0, 0.0], num_generations=4)
    torch.testing.assert_close(adv, torch.tensor([0.75, -0.25, -0.25, -0.25]) / (0.5 + 1e-4))
    assert adv.sum().abs() < 1e-5  # advantages always sum to ~0 inside a group
    torch.testing.assert_close(
        group_advantages([1.0, 0.0, 0.0, 0.0], 4, scale="none"), torch.tensor([0.75, -0.25, -0.25, -0.25])
    )


def test_equal_rewards_teach_nothing():
    assert torch.equal(group_advantages([0.5] * 4, 4), torch.zeros(4))
    assert frac_reward_zero_std([0.5] * 4 + [0.0, 1.0, 0.0, 1.0], 4) == 0.5


def test_scale_accepts_the_booleans_grpo_config_accepts():
    rewards = [1.0, 0.0, 0.0, 0.0]
    torch.testing.assert_close(group_advantages(rewards, 4, True), group_advantages(rewards, 4, "group"))
    torch.testing.assert_close(group_advantages(rewards, 4, False), group_advantages(rewards, 4, "none"))


@pytest.mark.parametrize(
    ("args", "error"),
    [(([1.0, 2.0, 3.0], 2), "groups of num_generations=2"), (([1.0], 0), "positive int"), (([], 1), "non-empty")],
)
def test_advantages_bad_input(args, error):
    with pytest.raises(ValueError, match=error):
        group_advantages(*args)
    with pytest.raises(ValueError, match="scale"):
        group_advantages([1.0, 2.0], 2, scale="global")


def test_nanstd_matches_trl_and_torch():
    x = torch.tensor([[1.0, 2.0, float("nan"), 4.0], [3.0, 3.0, 3.0, 3.0]])
    torch.testing.assert_close(nanstd(x, dim=1), trl_utils.nanstd(x, dim=1))
    torch.testing.assert_close(nanstd(torch.tensor([1.0, 2.0, 4.0])), torch.tensor([1.0, 2.0, 4.0]).std())


# --- the loss ----------------------------------------------------------------------------------------------


def trl_loss(logps, old, ref, adv, mask, beta, eps_low, eps_high, loss_type, max_len, use_bias_correction_kl=True):
    """TRL 1.16 ``_compute_loss``, token-level IS, one process, no accumulation, verbatim tensor formulas."""
    advantages = adv.unsqueeze(1)
    coef_1 = torch.exp(logps - old)
    per_token_kl = None
    if beta != 0.0:
        per_token_kl = torch.exp(ref - logps) - (ref - logps) - 1
        if use_bias_correction_kl:
            per_token_kl = per_token_kl * coef_1
    coef_2 = torch.clamp(coef_1, 1 - eps_low, 1 + eps_high)
    per_token_loss = -torch.min(coef_1 * advantages, coef_2 * advantages)
    if beta != 0.0:
        per_token_loss = per_token_loss + beta * per_token_kl
    if loss_type == "grpo":
        return ((per_token_loss * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    if loss_type == "bnpo":
        return (per_token_loss * mask).sum() / mask.sum().clamp(min=1.0)
    if loss_type == "dr_grpo":
        return (per_token_loss * mask).sum() / (per_token_loss.size(0) * max_len)
    normalizer = mask.sum().clamp(min=1.0)  # dapo: num_items_in_batch over one process, one step
    return (per_token_loss * mask).sum() / normalizer


def random_inputs(seed=0, batch=4, tokens=6):
    g = torch.Generator().manual_seed(seed)
    logps = -torch.rand(batch, tokens, generator=g) * 3
    old = logps + torch.randn(batch, tokens, generator=g) * 0.3  # big enough that some tokens clip
    ref = logps + torch.randn(batch, tokens, generator=g) * 0.2
    adv = torch.randn(batch, generator=g)
    mask = torch.ones(batch, tokens)
    mask[0, 4:] = 0
    mask[2, 2:] = 0
    return logps, old, ref, adv, mask


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo"])
@pytest.mark.parametrize("beta", [0.0, 0.04])
@pytest.mark.parametrize("bias_correction", [True, False])
def test_loss_matches_trl_formula(loss_type, beta, bias_correction):
    logps, old, ref, adv, mask = random_inputs()
    ours = grpo_policy_loss(
        logps,
        old,
        adv,
        mask,
        ref_per_token_logps=ref,
        beta=beta,
        epsilon=0.2,
        epsilon_high=0.28,
        loss_type=loss_type,
        max_completion_length=6,
        use_bias_correction_kl=bias_correction,
    )
    expected = trl_loss(logps, old, ref, adv, mask, beta, 0.2, 0.28, loss_type, 6, bias_correction)
    torch.testing.assert_close(ours.loss, expected)
    assert 0.0 < ours.clip_fraction < 1.0  # the inputs exercise clipping


def test_logged_loss_starts_at_zero_but_the_gradient_does_not():
    # First step: old == current policy, so ratio == 1; equal lengths and group advantages summing to 0.
    logps = (-torch.rand(4, 5)).requires_grad_(True)
    adv = group_advantages([2.0, 0.0, 0.5, 0.0], num_generations=4)
    result = grpo_policy_loss(logps, logps.detach(), adv, torch.ones(4, 5))
    assert abs(result.loss.item()) < 1e-6
    result.loss.backward()
    assert logps.grad.abs().sum() > 0.1


def test_equal_rewards_give_zero_gradient():
    logps = (-torch.rand(4, 5)).requires_grad_(True)
    adv = group_advantages([1.0] * 4, num_generations=4)
    grpo_policy_loss(logps, logps.detach(), adv, torch.ones(4, 5)).loss.backward()
    assert torch.count_nonzero(logps.grad) == 0


def test_k3_is_a_nonnegative_kl_estimate():
    logps = torch.linspace(-3, 0, 7)
    assert torch.all(k3_kl(logps, logps) == 0)
    r = torch.linspace(-2, 2, 41)
    assert torch.all(k3_kl(torch.zeros_like(r), r) >= 0)
    small = torch.tensor([0.01])
    assert k3_kl(torch.zeros(1), small).item() == pytest.approx(0.01**2 / 2, rel=0.01)


def test_clipped_objective_is_flat_outside_the_trust_region():
    ratios = torch.tensor([0.5, 1.0, 1.5])
    assert clipped_objective(ratios, 1.0).tolist() == pytest.approx([0.5, 1.0, 1.2])
    assert clipped_objective(ratios, -1.0).tolist() == pytest.approx([-0.8, -1.0, -1.5])


def test_loss_bad_input():
    logps, old, _ref, adv, mask = random_inputs()
    with pytest.raises(ValueError, match="ref_per_token_logps"):
        grpo_policy_loss(logps, old, adv, mask, beta=0.1)
    with pytest.raises(ValueError, match="loss_type"):
        grpo_policy_loss(logps, old, adv, mask, loss_type="ppo")
    with pytest.raises(ValueError, match="completion_mask"):
        grpo_policy_loss(logps, old, adv, mask[:, :3])
    with pytest.raises(ValueError, match="max_completion_length"):
        grpo_policy_loss(logps, old, adv, mask, loss_type="dr_grpo")


@pytest.mark.slow
@pytest.mark.parametrize("loss_type", ["dapo", "grpo"])
def test_loss_matches_a_real_grpo_trainer(tmp_path, loss_type):
    """Calls TRL's own ``GRPOTrainer._compute_loss`` (offline SmolLM2, CPU) on chosen logps and advantages."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from course_utils.models import load_model_and_tokenizer
    from course_utils.rewards import correctness_reward_func

    model, tokenizer = load_model_and_tokenizer("ci")
    config = GRPOConfig(
        output_dir=str(tmp_path),
        use_cpu=True,
        bf16=False,
        report_to="none",
        beta=0.04,
        num_generations=2,
        per_device_train_batch_size=2,
        max_completion_length=8,
        epsilon=0.2,
        epsilon_high=0.28,
        loss_type=loss_type,
    )
    dataset = Dataset.from_list([{"prompt": "What is 1+1?", "answer": "2"}] * 2)
    trainer = GRPOTrainer(
        model=model,
        processing_class=tokenizer,
        reward_funcs=[correctness_reward_func],
        args=config,
        train_dataset=dataset,
    )
    g = torch.Generator().manual_seed(1)
    prompt_ids, completion_ids = (
        torch.randint(0, 1000, (2, 3), generator=g),
        torch.randint(0, 1000, (2, 4), generator=g),
    )
    prompt_mask, mask = torch.ones(2, 3, dtype=torch.long), torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])
    with torch.no_grad():
        logps, _, _ = trainer._get_per_token_logps_and_entropies(
            model, torch.cat([prompt_ids, completion_ids], 1), torch.cat([prompt_mask, mask], 1), 4
        )
    old = logps + torch.randn(2, 4, generator=g) * 0.3
    ref = logps + torch.randn(2, 4, generator=g) * 0.3
    advantages = group_advantages([2.0, 0.0], num_generations=2)
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
    model.train()
    trainer.current_gradient_accumulation_steps = 1  # set by Trainer's training loop; one micro-batch here
    trl_value = trainer._compute_loss(model, inputs)

    ours = grpo_policy_loss(
        logps,
        old,
        advantages,
        mask,
        ref_per_token_logps=ref,
        beta=0.04,
        epsilon=0.2,
        epsilon_high=0.28,
        loss_type=loss_type,
    )
    assert trl_value.item() == pytest.approx(ours.loss.item(), rel=1e-5, abs=1e-7)
    metrics = trainer._metrics["train"]
    kl_mean = ((ours.per_token_kl * mask).sum() / mask.sum()).item()
    assert metrics["kl"][-1] == pytest.approx(kl_mean, rel=1e-5)
    assert metrics["clip_ratio/region_mean"][-1] == pytest.approx(ours.clip_fraction, abs=1e-6)
    assert math.isfinite(trl_value.item())
