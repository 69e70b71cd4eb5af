"""Tests for course_utils.lesson.grpo, against the installed TRL's own code.

``trl_grpo.trl_trainer`` builds a real ``GRPOTrainer`` on a tiny random Qwen2 model; the tests let it compute
advantages (``_generate_and_score_completions`` with rewards we choose) and the loss (``_compute_loss`` on
batches we choose), and compare with the by-hand functions. A change in the installed TRL shows up here.
"""

from __future__ import annotations

import math

import pytest
import torch

from course_utils.lesson.grpo import (
    clipped_objective,
    frac_reward_zero_std,
    group_advantages,
    grpo_policy_loss,
    k3_kl,
    nanstd,
)
from course_utils.lesson.trl_grpo import (
    FixedRewards,
    trl_frac_reward_zero_std,
    trl_group_advantages,
    trl_loss_case,
    trl_policy_loss,
    trl_reward_values,
    trl_trainer,
)

trl_utils = pytest.importorskip("trl.trainer.utils")

REWARD_BATCHES = [
    [2.0, 0.0, 0.5, 0.5, 1.0, 1.0, 1.0, 1.0],  # second group all equal
    [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0],
    [4.8125, 0.8125, 4.5, 0.0, 3.1, 2.2, 0.125, 0.5],
]


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
@pytest.mark.parametrize("rewards", REWARD_BATCHES)
@pytest.mark.parametrize("num_generations", [2, 4, 8])
def test_advantages_match_trl(rewards, scale, num_generations):
    expected = trl_group_advantages(rewards, num_generations, scale)
    torch.testing.assert_close(group_advantages(rewards, num_generations, scale), expected)
    expected_zero = trl_frac_reward_zero_std(rewards, num_generations, scale)
    assert frac_reward_zero_std(rewards, num_generations, scale) == pytest.approx(expected_zero)


def test_trl_reference_sees_the_rewards_we_chose():
    # a wrong formula must fail against it: the population std gives other advantages than TRL's sample std
    rewards = [2.5, 0.5, 0.0, 2.5]
    trl = trl_group_advantages(rewards, 4)
    grouped = torch.tensor(rewards)
    population = (grouped - grouped.mean()) / (grouped.std(unbiased=False) + 1e-4)
    assert not torch.allclose(trl, population, atol=1e-3)
    assert trl_frac_reward_zero_std([1.0] * 4 + rewards, 4) == 0.5


def test_fixed_rewards_refuse_a_wrong_count():
    rewards = FixedRewards()
    rewards.values = [1.0, 2.0]
    assert rewards(completions=["a", "b"]) == [1.0, 2.0]
    with pytest.raises(ValueError, match="2 fixed rewards for 3 completions"):
        rewards(completions=["a", "b", "c"])


def test_trl_reference_bad_input():
    with pytest.raises(ValueError, match="groups of num_generations=4"):
        trl_group_advantages([1.0, 0.0, 0.0], 4)
    with pytest.raises(ValueError, match="fill groups of num_generations=4"):
        trl_loss_case(trl_trainer(4), lengths=(3, 2))


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


def random_inputs(seed=0, batch=4, tokens=6):
    g = torch.Generator().manual_seed(seed)
    logps = -torch.rand(batch, tokens, generator=g) * 3
    old = logps + torch.randn(batch, tokens, generator=g) * 0.3
    adv = torch.randn(batch, generator=g)
    mask = torch.ones(batch, tokens)
    mask[0, 4:] = 0
    return logps, old, adv, mask


LOSS_SETTINGS = [(loss_type, beta, True) for loss_type in ("grpo", "bnpo", "dr_grpo", "dapo") for beta in (0.0, 0.04)]


@pytest.mark.parametrize(("loss_type", "beta", "bias_correction"), [*LOSS_SETTINGS, ("dapo", 0.04, False)])
def test_loss_matches_trl(loss_type, beta, bias_correction):
    trainer = trl_trainer(
        4,
        loss_type=loss_type,
        beta=beta,
        epsilon_high=0.28,
        use_bias_correction_kl=bias_correction,
        max_completion_length=8,
    )
    case = trl_loss_case(trainer, lengths=(6, 3, 5, 2), seed=1, drift=0.3)
    ours = grpo_policy_loss(
        case.per_token_logps,
        case.old_per_token_logps,
        case.advantages,
        case.completion_mask,
        ref_per_token_logps=case.ref_per_token_logps,
        beta=beta,
        epsilon=0.2,
        epsilon_high=0.28,
        loss_type=loss_type,
        max_completion_length=8,
        use_bias_correction_kl=bias_correction,
    )
    torch.testing.assert_close(ours.loss, trl_policy_loss(trainer, case))
    assert 0.0 < ours.clip_fraction < 1.0  # the batch exercises clipping
    metrics = trainer._metrics["train"]
    assert metrics["clip_ratio/region_mean"][-1] == pytest.approx(ours.clip_fraction, abs=1e-6)
    if beta:
        kl_mean = ((ours.per_token_kl * case.completion_mask).sum() / case.completion_mask.sum()).item()
        assert metrics["kl"][-1] == pytest.approx(kl_mean, rel=1e-5)


def test_first_step_loss_is_zero_only_with_equal_lengths():
    trainer = trl_trainer(4)
    ragged = trl_loss_case(trainer, lengths=(6, 3, 5, 2), seed=0, drift=0.0)
    equal = trl_loss_case(trainer, lengths=(4, 4, 4, 4), seed=0, drift=0.0)
    assert abs(trl_policy_loss(trainer, equal).item()) < 1e-6
    assert abs(trl_policy_loss(trainer, ragged).item()) > 1e-3


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
    logps, old, adv, mask = random_inputs()
    with pytest.raises(ValueError, match="ref_per_token_logps"):
        grpo_policy_loss(logps, old, adv, mask, beta=0.1)
    with pytest.raises(ValueError, match="loss_type"):
        grpo_policy_loss(logps, old, adv, mask, loss_type="ppo")
    with pytest.raises(ValueError, match="completion_mask"):
        grpo_policy_loss(logps, old, adv, mask[:, :3])
    with pytest.raises(ValueError, match="max_completion_length"):
        grpo_policy_loss(logps, old, adv, mask, loss_type="dr_grpo")


# --- a reward function, called by TRL's own reward code ------------------------------------------------


def test_trl_reward_values_runs_trls_call_with_every_keyword():
    seen = {}

    def reward(prompts, completions, completion_ids, answer, trainer_state, **kwargs):
        seen.update(kwargs, answer=answer, ids=completion_ids, state=trainer_state)
        return [1.0, None]

    values = trl_reward_values(reward, ["p1", "p2"], ["a b", "c"], answer=["1", "2"], reasoning=["r1", "r2"])
    assert values[0] == 1.0 and math.isnan(values[1])  # TRL turns None into NaN
    assert seen["answer"] == ["1", "2"] and seen["reasoning"] == ["r1", "r2"] and "log_metric" in seen
    assert all(isinstance(ids, list) and ids for ids in seen["ids"]) and seen["state"] is not None


def test_trl_reward_values_reports_trls_errors():
    with pytest.raises(ValueError, match="returned 1 rewards, but 2 were expected"):
        trl_reward_values(lambda completions, **kw: [0.0], ["p", "q"], ["a", "b"])
    with pytest.raises(TypeError, match="unexpected keyword argument"):
        trl_reward_values(lambda completions: [0.0, 0.0], ["p", "q"], ["a", "b"])
    with pytest.raises(ValueError, match="one entry per completion"):
        trl_reward_values(lambda completions, **kw: [0.0], ["p"], ["a"], answer=["1", "2"])
