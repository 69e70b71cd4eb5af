"""Notebook 01 (GRPO concepts): advantages and the clipped loss, checked against the installed TRL."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from course_utils.exercises.comparison import Case, check_against_reference, close_to, not_a_function, report
from course_utils.lesson.grpo import (
    frac_reward_zero_std,
    group_advantages,
    trl_group_advantages,
    trl_loss_case,
    trl_policy_loss,
    trl_trainer,
)


def check_01_first_advantage(answer: Any) -> bool:
    """Advantage of the first completion in the group with rewards [1, 0, 0, 0] (scale="group")."""
    expected = group_advantages([1.0, 0.0, 0.0, 0.0], num_generations=4)[0].item()
    return report(
        "01.1 first advantage",
        close_to(answer, expected, tolerance=0.01),
        "(reward - group mean) / (sample std + 1e-4); the sample std of [1, 0, 0, 0] is 0.5",
        answer,
    )


def check_01_zero_std_fraction(answer: Any) -> bool:
    """frac_reward_zero_std for two groups of 4: rewards [2, 2, 2, 2] and [0, 2, 0, 0]."""
    expected = frac_reward_zero_std([2.0] * 4 + [0.0, 2.0, 0.0, 0.0], num_generations=4)
    return report(
        "01.2 frac_reward_zero_std",
        close_to(answer, expected),
        "the share of completions whose group has all-equal rewards",
        answer,
    )


ADVANTAGE_CASES = (
    ("one group: two right, one wrong, one rambling", [2.5, 0.5, 0.0, 2.5], 4),
    ("two groups, the second all equal", [2.0, 0.0, 0.5, 0.5, 1.0, 1.0, 1.0, 1.0], 4),
    ("every reward 0", [0.0, 0.0, 0.0, 0.0], 4),
    ("a nearly solved group (tiny std)", [2.5, 2.5, 2.5, 2.4], 4),
    ("three pairs (num_generations=2)", [1.0, 0.0, 3.0, 3.0, 0.2, 0.1], 2),
    ("one group of 8, negative rewards too", [-1.0, 0.5, 2.0, 0.0, -0.5, 1.5, 0.0, 4.0], 8),
)
# lengths of the completions, seed, how far the policy moved since generation (0: the first step), label
LOSS_SETTINGS = (
    ((6, 3, 5, 2), 0, 0.0, "first step after generation (ratio 1), ragged lengths"),
    ((6, 3, 5, 2), 1, 0.3, "the policy moved, ragged lengths"),
    ((4, 4, 4, 4), 2, 0.3, "the policy moved, equal lengths"),
    ((8, 1, 2, 7, 3, 3, 5, 6), 3, 0.6, "two groups, the policy moved far: much clipping"),
)


def advantage_cases() -> list[Case]:
    """Batches of rewards (whole groups, prompt by prompt) with their ``num_generations``."""
    return [Case(f"{label}, rewards {rewards}", (rewards, n)) for label, rewards, n in ADVANTAGE_CASES]


def check_01_advantages(learner: Any) -> bool:
    """The learner's ``advantages(rewards, num_generations)`` against the advantages the installed TRL computes."""
    hint = "per group: (reward - group mean) / (group.std() + 1e-4); torch's std is the sample std, as TRL's"
    return check_against_reference("01 group advantages", learner, trl_group_advantages, advantage_cases(), hint=hint)


def loss_cases(loss_type: str = "dapo") -> tuple[Callable[..., Any], list[Case]]:
    """TRL's loss (a real ``GRPOTrainer``, ``epsilon=0.2``, ``beta=0``) and batches to run it on.

    Each case gives the learner ``(per_token_logps, old_per_token_logps, advantages, completion_mask)``
    and gives TRL the same batch as token ids, from which its model computes the same log-probs.
    """
    trainer = trl_trainer(4, loss_type=loss_type, max_completion_length=8)
    cases = []
    for lengths, seed, drift, label in LOSS_SETTINGS:
        batch = trl_loss_case(trainer, lengths, seed=seed, drift=drift, label=label)
        args = (batch.per_token_logps, batch.old_per_token_logps, batch.advantages, batch.completion_mask)
        cases.append(Case(label, args, reference_args=(batch,)))
    return functools.partial(trl_policy_loss, trainer), cases


def check_01_policy_loss(learner: Any) -> bool:
    """The learner's clipped loss (TRL's default ``loss_type="dapo"``) against ``GRPOTrainer._compute_loss``."""
    hint = "-min(ratio * A, clamp(ratio, 0.8, 1.2) * A) per token, summed over real tokens (mask), / mask.sum()"
    if not_a_function("01 clipped loss", learner, hint):
        return False
    reference, cases = loss_cases("dapo")
    return check_against_reference("01 clipped loss", learner, reference, cases, hint=hint)


def check_01_sequence_mean_loss(learner: Any) -> bool:
    """Exercise: the loss with ``loss_type="grpo"`` (mean per completion, then over completions) against TRL's."""
    hint = "same per-token loss; (per_token * mask).sum(dim=1) / mask.sum(dim=1), then .mean() over completions"
    if not_a_function("01.3 per-completion mean loss", learner, hint):
        return False
    reference, cases = loss_cases("grpo")
    return check_against_reference("01.3 per-completion mean loss", learner, reference, cases, hint=hint)
