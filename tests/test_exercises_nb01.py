"""Notebook 01's checks: advantages and the losses against the installed TRL, and the value questions."""

from __future__ import annotations

import torch

from course_utils.exercises import nb01_grpo_concepts as nb01


def test_value_checks_of_01_accept_the_right_answers():
    assert nb01.check_01_first_advantage(1.5) and not nb01.check_01_first_advantage(0.75)
    assert nb01.check_01_zero_std_fraction(0.5) and not nb01.check_01_zero_std_fraction(0.25)



# --- 01: the learner's advantages and losses against the installed TRL ----------------------------------


def learner_advantages(rewards, num_generations):
    grouped = torch.tensor(rewards).view(-1, num_generations)
    return ((grouped - grouped.mean(dim=1, keepdim=True)) / (grouped.std(dim=1, keepdim=True) + 1e-4)).flatten()


def population_std_advantages(rewards, num_generations):
    grouped = torch.tensor(rewards).view(-1, num_generations)
    std = grouped.std(dim=1, keepdim=True, unbiased=False)
    return ((grouped - grouped.mean(dim=1, keepdim=True)) / (std + 1e-4)).flatten()


def per_token_loss(logps, old_logps, advantages, mask, epsilon=0.2):
    ratio = torch.exp(logps - old_logps)
    a = advantages.unsqueeze(1)
    return -torch.min(ratio * a, torch.clamp(ratio, 1 - epsilon, 1 + epsilon) * a) * mask


def token_mean_loss(logps, old_logps, advantages, mask):
    return per_token_loss(logps, old_logps, advantages, mask).sum() / mask.sum()


def sequence_mean_loss(logps, old_logps, advantages, mask):
    return (per_token_loss(logps, old_logps, advantages, mask).sum(dim=1) / mask.sum(dim=1)).mean()


def test_check_01_advantages():
    assert nb01.check_01_advantages(learner_advantages)
    assert not nb01.check_01_advantages(population_std_advantages)
    assert not nb01.check_01_advantages(lambda rewards, n: torch.tensor(rewards))


def test_check_01_losses():
    assert nb01.check_01_policy_loss(token_mean_loss)
    assert not nb01.check_01_policy_loss(sequence_mean_loss)
    assert not nb01.check_01_policy_loss(lambda logps, old, adv, mask: (logps - old).mean())
    assert nb01.check_01_sequence_mean_loss(sequence_mean_loss)
    assert not nb01.check_01_sequence_mean_loss(token_mean_loss)
