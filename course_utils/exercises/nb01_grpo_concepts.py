"""Notebook 01 (GRPO concepts): advantages and the clipped loss, checked against the installed TRL.

The exercises, in the notebook's order: 01.1 ``advantages``, 01.2 ``policy_loss`` (TRL's default
``loss_type="dapo"``), then at the end 01.3 and 01.4 (values) and 01.5 ``sequence_mean_loss``
(``loss_type="grpo"``). The function checks compare with what a real ``GRPOTrainer`` computes and hand
back what the notebook continues with: the learner's function when it passed, else the package's.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from course_utils.exercises.comparison import Case, check_against_reference, kind_of, not_a_function
from course_utils.exercises.verdicts import hand_back, report_number
from course_utils.lesson.grpo import frac_reward_zero_std, group_advantages, grpo_policy_loss
from course_utils.lesson.trl_grpo import trl_group_advantages, trl_loss_case, trl_policy_loss, trl_trainer

ADVANTAGES = "01.1 group advantages"
POLICY_LOSS = "01.2 clipped loss (dapo)"
FIRST_ADVANTAGE = "01.3 first advantage"
ZERO_STD_FRACTION = "01.4 frac_reward_zero_std"
SEQUENCE_MEAN_LOSS = "01.5 per-completion mean loss (grpo)"

# Hints point the way in words; the notebook shows the same ones, collapsed.
ADVANTAGES_HINT = (
    "each group needs its own mean and its own spread, so arrange the rewards so that torch can reduce one group "
    "at a time; mind which std TRL uses (section 1) and where the small constant goes; hand back one flat float "
    "tensor in the rewards' order"
)
POLICY_LOSS_HINT = (
    "build the docstring's formula one piece at a time and compare each with section 4; a completion's "
    "advantage applies to each of its tokens (mind the shapes); padding counts nowhere, neither in the sum nor "
    "in what you divide by; keep the result a tensor, training calls .backward() on it"
)
FIRST_ADVANTAGE_HINT = "section 1's formula, by hand or with the function you wrote: mind which std TRL uses"
ZERO_STD_HINT = "frac_reward_zero_std counts how much of the batch sits in a group whose rewards are all equal"
SEQUENCE_MEAN_HINT = (
    "the same per-token loss as your policy_loss; section 8 says in which order loss_type='grpo' averages, "
    "and each completion counts only its own real tokens"
)


def check_01_first_advantage(answer: Any) -> bool:
    """Advantage of the first completion in the group with rewards [1, 0, 0, 0] (scale="group")."""
    expected = group_advantages([1.0, 0.0, 0.0, 0.0], num_generations=4)[0].item()
    return report_number(FIRST_ADVANTAGE, answer, expected, FIRST_ADVANTAGE_HINT, tolerance=0.01)


def check_01_zero_std_fraction(answer: Any) -> bool:
    """frac_reward_zero_std for two groups of 4: rewards [2, 2, 2, 2] and [0, 2, 0, 0]."""
    expected = frac_reward_zero_std([2.0] * 4 + [0.0, 2.0, 0.0, 0.0], num_generations=4)
    return report_number(ZERO_STD_FRACTION, answer, expected, ZERO_STD_HINT)


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


def advantages_needs(expected: torch.Tensor, got: Any) -> str | None:
    """What the cells after 01.1 need: a flat float tensor (they call ``.round``, ``.view`` and index it)."""
    if not isinstance(got, torch.Tensor):
        return (f"returns {kind_of(got)}: the next cells call tensor methods on the advantages (.round, .view); "
                "return a torch tensor")
    if not got.is_floating_point():
        return f"returns {kind_of(got)}: advantages are fractions, so a float tensor"
    if got.shape != expected.shape:
        return f"returns {kind_of(got)}: one advantage per reward, flat, shape {tuple(expected.shape)}"
    return None


def loss_needs(expected: torch.Tensor, got: Any) -> str | None:
    """What training does with a loss: ``loss.backward()``, so one number in a tensor that carries the gradient."""
    if not isinstance(got, torch.Tensor):
        return (f"returns {kind_of(got)}: training calls loss.backward(), which needs a torch tensor that carries "
                "the gradient (no .item(), no float())")
    if got.numel() != 1:
        return f"returns {kind_of(got)}: the loss of a batch is one number (a tensor of shape ())"
    if got.grad_fn is None:
        return (f"returns {kind_of(got)} without the gradient of per_token_logps: loss.backward() would raise "
                "(nothing may be detached or rebuilt with torch.tensor)")
    return None


class GradientNotReached(Exception):
    """The learner's loss does not carry the gradient TRL's does back to the model's log-probabilities."""


def gradient_problem(loss: torch.Tensor, weights: torch.Tensor, wanted: torch.Tensor) -> str | None:
    """Why ``loss.backward()`` would not train the model as TRL's loss does, or None."""
    (grad,) = torch.autograd.grad(loss, weights, allow_unused=True)
    if grad is None:
        return "no gradient reaches the model: built from a copy (torch.tensor, .detach, .item)"
    if not torch.allclose(grad, wanted, rtol=1e-3, atol=1e-6):
        return "the model gets another gradient than TRL's: a part is detached"
    return None


def with_gradient(learner: Callable[..., Any], loss_type: str) -> Callable[..., Any]:
    """The learner's loss called as training calls it, then backpropagated into a real parameter.

    ``per_token_logps`` comes from a parameter (as it comes from the model's weights); the loss must carry the
    gradient TRL's loss carries back to it, else the wrapper raises ``GradientNotReached``, which the comparison
    reports. ``functools.wraps`` keeps the learner's name and module: the comparison reports it as theirs.
    """
    reference = _reduced_as(loss_type)

    @functools.wraps(learner)
    def call(per_token_logps: torch.Tensor, *rest: Any) -> Any:
        weights = torch.nn.Parameter(per_token_logps.detach().clone())
        loss = learner(weights * 1.0, *rest)
        if not (isinstance(loss, torch.Tensor) and loss.grad_fn is not None and loss.numel() == 1):
            return loss  # loss_needs says what training needs
        (wanted,) = torch.autograd.grad(reference(weights * 1.0, *rest), weights)
        if problem := gradient_problem(loss.sum(), weights, wanted):
            raise GradientNotReached(problem)
        return loss

    return call


def advantage_cases() -> list[Case]:
    """Batches of rewards (whole groups, prompt by prompt) with their ``num_generations``."""
    return [Case(f"{label}, rewards {rewards}", (rewards, n)) for label, rewards, n in ADVANTAGE_CASES]


def check_01_advantages(learner: Any) -> Any:
    """01.1: the learner's ``advantages(rewards, num_generations)`` against the advantages TRL computes.

    Returns what the notebook continues with: the learner's function, or ``lesson.grpo.group_advantages``.
    """
    passed = check_against_reference(
        ADVANTAGES, learner, trl_group_advantages, advantage_cases(), hint=ADVANTAGES_HINT, needs=advantages_needs
    )
    return hand_back(ADVANTAGES, passed, learner, group_advantages, "course_utils.lesson.grpo.group_advantages")


def _reduced_as(loss_type: str) -> Callable[..., torch.Tensor]:
    """``grpo_policy_loss`` reduced as ``loss_type``, with the learner's signature: the answer handed back."""

    def loss(
        per_token_logps: torch.Tensor,
        old_per_token_logps: torch.Tensor,
        advantages: torch.Tensor,
        completion_mask: torch.Tensor,
        epsilon: float = 0.2,
    ) -> torch.Tensor:
        parts = grpo_policy_loss(
            per_token_logps, old_per_token_logps, advantages, completion_mask, epsilon=epsilon, loss_type=loss_type
        )
        return parts.loss

    loss.__name__ = loss.__qualname__ = f"{loss_type}_policy_loss"
    return loss


dapo_policy_loss = _reduced_as("dapo")  # 01.2's answer: TRL's default reduction
grpo_sequence_mean_loss = _reduced_as("grpo")  # 01.5's answer: per completion first, then over completions


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


def _check_loss(exercise: str, learner: Any, loss_type: str, hint: str) -> bool:
    """The learner's loss against ``GRPOTrainer._compute_loss`` with ``loss_type`` (TRL built only when needed)."""
    if not_a_function(exercise, learner, hint):
        return False
    reference, cases = loss_cases(loss_type)
    return check_against_reference(exercise, with_gradient(learner, loss_type), reference, cases, hint=hint,
                                  needs=loss_needs)


def check_01_policy_loss(learner: Any) -> Any:
    """01.2: the learner's clipped loss (TRL's default ``loss_type="dapo"``) against ``GRPOTrainer._compute_loss``.

    Returns what the notebook continues with: the learner's function, or ``dapo_policy_loss``.
    """
    passed = _check_loss(POLICY_LOSS, learner, "dapo", POLICY_LOSS_HINT)
    reference_name = 'grpo_policy_loss(..., loss_type="dapo").loss (course_utils.lesson.grpo)'
    return hand_back(POLICY_LOSS, passed, learner, dapo_policy_loss, reference_name)


def check_01_sequence_mean_loss(learner: Any) -> Any:
    """01.5: the loss with ``loss_type="grpo"`` (mean per completion, then over completions) against TRL's.

    Returns the learner's function when it passed, else ``grpo_sequence_mean_loss``.
    """
    passed = _check_loss(SEQUENCE_MEAN_LOSS, learner, "grpo", SEQUENCE_MEAN_HINT)
    reference_name = 'grpo_policy_loss(..., loss_type="grpo").loss (course_utils.lesson.grpo)'
    return hand_back(SEQUENCE_MEAN_LOSS, passed, learner, grpo_sequence_mean_loss, reference_name)
