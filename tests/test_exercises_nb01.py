"""Notebook 01's checks, three ways each: the course's solution passes, the learner's stub reads "not answered
yet" (and the notebook continues with the package's function), and plausible wrong answers fail.

The solutions and stubs are the notebooks' own cells (``tests/notebook_code.exercise``); the wrong answers are
the mistakes a learner makes with the formulas: population std, a forgotten mask, the wrong reduction.
"""

from __future__ import annotations

import pytest
import torch
from notebook_code import exercise

from course_utils.exercises import nb01_grpo_concepts as nb01
from course_utils.lesson.grpo import group_advantages


@pytest.fixture(scope="module")
def trl_once():
    """TRL's reference values computed once per case for the banks of wrong answers (a second each otherwise).

    The check itself runs unchanged: only the installed TRL's numbers are kept between calls. The solution and
    stub tests run without it, against TRL itself.
    """
    patch = pytest.MonkeyPatch()
    advantages, losses = {}, {}
    trl_advantages, loss_cases = nb01.trl_group_advantages, nb01.loss_cases

    def kept_advantages(rewards, num_generations, scale="group"):
        key = (tuple(rewards), num_generations, scale)
        if key not in advantages:
            advantages[key] = trl_advantages(rewards, num_generations, scale)
        return advantages[key].clone()

    def kept_loss_cases(loss_type="dapo"):
        if loss_type not in losses:
            reference, cases = loss_cases(loss_type)
            values = {case.label: reference(*case.reference_args) for case in cases}
            losses[loss_type] = (lambda batch: values[batch.label].clone(), cases)
        return losses[loss_type]

    patch.setattr(nb01, "trl_group_advantages", kept_advantages)
    patch.setattr(nb01, "loss_cases", kept_loss_cases)
    yield
    patch.undo()

# --- 01.1 advantages ----------------------------------------------------------------------------------------------


def _grouped(rewards, n):
    return torch.as_tensor(rewards, dtype=torch.float32).view(-1, n)


def population_std(rewards, n):
    g = _grouped(rewards, n)
    return ((g - g.mean(1, keepdim=True)) / (g.std(1, keepdim=True, unbiased=False) + 1e-4)).flatten()


def no_epsilon(rewards, n):
    g = _grouped(rewards, n)
    return ((g - g.mean(1, keepdim=True)) / g.std(1, keepdim=True)).flatten()


def no_division(rewards, n):
    g = _grouped(rewards, n)
    return (g - g.mean(1, keepdim=True)).flatten()


def batch_mean(rewards, n):
    r = torch.as_tensor(rewards, dtype=torch.float32)
    g = r.view(-1, n)
    return ((g - r.mean()) / (g.std(1, keepdim=True) + 1e-4)).flatten()


def batch_std(rewards, n):
    r = torch.as_tensor(rewards, dtype=torch.float32)
    g = r.view(-1, n)
    return ((g - g.mean(1, keepdim=True)) / (r.std() + 1e-4)).flatten()


def not_flattened(rewards, n):
    g = _grouped(rewards, n)
    return (g - g.mean(1, keepdim=True)) / (g.std(1, keepdim=True) + 1e-4)


def groups_as_columns(rewards, n):
    g = torch.as_tensor(rewards, dtype=torch.float32).view(n, -1)
    return ((g - g.mean(0, keepdim=True)) / (g.std(0, keepdim=True) + 1e-4)).flatten()


WRONG_ADVANTAGES = [population_std, no_epsilon, no_division, batch_mean, batch_std, not_flattened, groups_as_columns]


def test_01_1_solution_passes_and_is_handed_back(capsys):
    advantages = exercise("01", "advantages")
    assert nb01.check_01_advantages(advantages) is advantages
    out = capsys.readouterr().out
    assert "✅ 01.1 group advantages" in out and "continues with yours" in out


def test_01_1_stub_reads_not_answered_and_the_package_takes_over(capsys):
    stub = exercise("01", "advantages", copy="notebooks")
    assert nb01.check_01_advantages(stub) is group_advantages
    out = capsys.readouterr().out
    assert "⏳ 01.1 group advantages: not answered yet" in out
    assert "continues with the package's course_utils.lesson.grpo.group_advantages" in out


@pytest.mark.parametrize("wrong", WRONG_ADVANTAGES, ids=lambda f: f.__name__)
def test_01_1_wrong_advantages_fail(wrong, capsys, trl_once):
    assert nb01.check_01_advantages(wrong) is group_advantages
    assert "❌ 01.1 group advantages: differs from the reference" in capsys.readouterr().out


def as_list(rewards, n):  # right values, but cell 7 calls .round on them
    return group_advantages(rewards, n).flatten().tolist()


def as_numpy(rewards, n):
    return group_advantages(rewards, n).numpy()


def as_integers(rewards, n):
    return group_advantages(rewards, n).round().long()


def one_row_per_group(rewards, n):
    return group_advantages(rewards, n).view(-1, n)


WRONG_KINDS = [as_list, as_numpy, as_integers, one_row_per_group]


@pytest.mark.parametrize("wrong", WRONG_KINDS, ids=lambda f: f.__name__)
def test_01_1_right_numbers_of_the_wrong_kind_fail_and_say_what_the_next_cells_need(wrong, capsys, trl_once):
    assert nb01.check_01_advantages(wrong) is group_advantages
    out = capsys.readouterr().out
    assert "❌ 01.1 group advantages" in out and "the reference returns a float32 tensor of shape" in out


def test_01_1_a_list_is_named_as_a_list(capsys, trl_once):
    nb01.check_01_advantages(as_list)
    assert "yours returns a list of 4: the next cells call tensor methods" in capsys.readouterr().out


def test_01_1_the_package_s_own_function_is_not_an_answer(capsys):
    assert nb01.check_01_advantages(group_advantages) is group_advantages
    assert "that is the package's own" in capsys.readouterr().out


# --- 01.2 and 01.5: the losses --------------------------------------------------------------------------------------


def per_token(logps, old, adv, mask, epsilon=0.2):
    ratio = torch.exp(logps - old)
    a = adv.unsqueeze(1)
    return -torch.min(ratio * a, torch.clamp(ratio, 1 - epsilon, 1 + epsilon) * a) * mask


def token_mean(logps, old, adv, mask, epsilon=0.2):  # "dapo"
    return per_token(logps, old, adv, mask, epsilon).sum() / mask.sum()


def sequence_mean(logps, old, adv, mask, epsilon=0.2):  # "grpo"
    return (per_token(logps, old, adv, mask, epsilon).sum(dim=1) / mask.sum(dim=1)).mean()


def no_mask(logps, old, adv, mask, epsilon=0.2):
    return per_token(logps, old, adv, torch.ones_like(mask), epsilon).mean()


def masked_sum(logps, old, adv, mask, epsilon=0.2):
    return per_token(logps, old, adv, mask, epsilon).sum()


def mean_over_padding_too(logps, old, adv, mask, epsilon=0.2):
    return per_token(logps, old, adv, mask, epsilon).mean()


def no_clipping(logps, old, adv, mask, epsilon=0.2):
    return (-torch.exp(logps - old) * adv.unsqueeze(1) * mask).sum() / mask.sum()


def max_not_min(logps, old, adv, mask, epsilon=0.2):
    ratio, a = torch.exp(logps - old), adv.unsqueeze(1)
    return (-torch.max(ratio * a, torch.clamp(ratio, 1 - epsilon, 1 + epsilon) * a) * mask).sum() / mask.sum()


def no_minus_sign(logps, old, adv, mask, epsilon=0.2):
    return -token_mean(logps, old, adv, mask, epsilon)


def constant_normalizer(logps, old, adv, mask, epsilon=0.2):  # "dr_grpo" with max_completion_length=8
    return per_token(logps, old, adv, mask, epsilon).sum() / (mask.size(0) * 8)


def unreduced(logps, old, adv, mask, epsilon=0.2):
    return per_token(logps, old, adv, mask, epsilon)


def sequence_mean_without_mask_count(logps, old, adv, mask, epsilon=0.2):
    return per_token(logps, old, adv, mask, epsilon).mean(dim=1).mean()


def sequence_sum_then_mean(logps, old, adv, mask, epsilon=0.2):
    return per_token(logps, old, adv, mask, epsilon).sum(dim=1).mean()


def as_item(logps, old, adv, mask, epsilon=0.2):  # right number, but loss.backward() fails on a float
    return token_mean(logps, old, adv, mask, epsilon).item()


def detached(logps, old, adv, mask, epsilon=0.2):
    return token_mean(logps, old, adv, mask, epsilon).detach()


def rebuilt(logps, old, adv, mask, epsilon=0.2):
    return torch.tensor(token_mean(logps, old, adv, mask, epsilon).item(), requires_grad=True)


def as_float(logps, old, adv, mask, epsilon=0.2):
    return float(token_mean(logps, old, adv, mask, epsilon).detach())


def sequence_mean_item(logps, old, adv, mask, epsilon=0.2):
    return sequence_mean(logps, old, adv, mask, epsilon).item()


WRONG_DAPO = [
    as_item,
    detached,
    rebuilt,
    as_float,
    sequence_mean,  # per-completion mean where the default "dapo" is asked
    no_mask,
    masked_sum,
    mean_over_padding_too,
    no_clipping,
    max_not_min,
    no_minus_sign,
    constant_normalizer,
    unreduced,
]
WRONG_GRPO = [
    sequence_mean_item,
    token_mean,  # one token mean for the batch where the per-completion mean is asked
    no_mask,
    sequence_mean_without_mask_count,
    sequence_sum_then_mean,
    constant_normalizer,
    max_not_min,
]


def test_01_2_solution_passes_and_is_handed_back(capsys):
    policy_loss = exercise("01", "policy_loss")
    assert nb01.check_01_policy_loss(policy_loss) is policy_loss
    out = capsys.readouterr().out
    assert "✅ 01.2 clipped loss (dapo)" in out and "continues with yours" in out


def test_01_2_stub_reads_not_answered_and_the_package_takes_over(capsys):
    stub = exercise("01", "policy_loss", copy="notebooks")
    assert nb01.check_01_policy_loss(stub) is nb01.dapo_policy_loss
    out = capsys.readouterr().out
    assert "⏳ 01.2 clipped loss (dapo): not answered yet" in out and 'loss_type="dapo"' in out


@pytest.mark.parametrize("wrong", WRONG_DAPO, ids=lambda f: f.__name__)
def test_01_2_wrong_losses_fail(wrong, capsys, trl_once):
    assert nb01.check_01_policy_loss(wrong) is nb01.dapo_policy_loss
    assert "❌ 01.2 clipped loss (dapo)" in capsys.readouterr().out


@pytest.mark.parametrize("wrong", [as_item, detached, rebuilt, as_float], ids=lambda f: f.__name__)
def test_01_2_a_loss_without_the_gradient_fails_and_names_backward(wrong, capsys, trl_once):
    assert nb01.check_01_policy_loss(wrong) is nb01.dapo_policy_loss
    assert "loss.backward()" in capsys.readouterr().out


def rebuilt_inputs(logps, old, adv, mask, epsilon=0.2):
    """per_token_logps copied into a new leaf: the loss has a gradient function, the model gets no gradient."""
    return token_mean(torch.tensor(logps.tolist(), requires_grad=True), old, adv, mask, epsilon)


def same_value_no_gradient(logps, old, adv, mask, epsilon=0.2):
    """TRL's value, with a gradient of 0: the clipped term detached."""
    return token_mean(logps, old, adv, mask, epsilon).detach() + 0 * logps.sum()


@pytest.mark.parametrize(("wrong", "named"), [(rebuilt_inputs, "no gradient reaches the model"),
                                              (same_value_no_gradient, "another gradient than TRL's")])
def test_01_2_a_loss_whose_gradient_misses_the_model_fails(wrong, named, capsys, trl_once):
    """The check backpropagates into a real parameter: a grad_fn alone is not enough."""
    assert nb01.check_01_policy_loss(wrong) is nb01.dapo_policy_loss
    out = capsys.readouterr().out
    assert "❌ 01.2" in out and named in out, out


def test_01_2_a_right_loss_written_another_way_passes(trl_once):
    assert nb01.check_01_policy_loss(token_mean) is token_mean


def test_01_5_solution_passes_and_is_handed_back(capsys):
    sequence_mean_loss = exercise("01", "sequence_mean_loss")
    assert nb01.check_01_sequence_mean_loss(sequence_mean_loss) is sequence_mean_loss
    assert "✅ 01.5 per-completion mean loss (grpo)" in capsys.readouterr().out


def test_01_5_stub_reads_not_answered_and_the_package_takes_over(capsys):
    stub = exercise("01", "sequence_mean_loss", copy="notebooks")
    assert nb01.check_01_sequence_mean_loss(stub) is nb01.grpo_sequence_mean_loss
    out = capsys.readouterr().out
    assert "⏳ 01.5 per-completion mean loss (grpo): not answered yet" in out and 'loss_type="grpo"' in out


@pytest.mark.parametrize("wrong", WRONG_GRPO, ids=lambda f: f.__name__)
def test_01_5_wrong_losses_fail(wrong, capsys, trl_once):
    assert nb01.check_01_sequence_mean_loss(wrong) is nb01.grpo_sequence_mean_loss
    assert "❌ 01.5 per-completion mean loss (grpo)" in capsys.readouterr().out


def test_the_handed_back_losses_are_the_package_s_reductions():
    g = torch.Generator().manual_seed(0)
    logps, old = -torch.rand(4, 6, generator=g), -torch.rand(4, 6, generator=g)
    adv, mask = group_advantages([1.0, 0.0, 2.0, 0.5], 4), (torch.arange(6) < torch.tensor([[6], [3], [5], [2]]))
    mask = mask.float()
    assert torch.allclose(nb01.dapo_policy_loss(logps, old, adv, mask), token_mean(logps, old, adv, mask))
    assert torch.allclose(nb01.grpo_sequence_mean_loss(logps, old, adv, mask), sequence_mean(logps, old, adv, mask))


# --- 01.3 and 01.4: values ------------------------------------------------------------------------------------------


def test_01_3_and_01_4_solutions_pass(capsys):
    assert nb01.check_01_first_advantage(exercise("01", "answer_1"))
    assert nb01.check_01_zero_std_fraction(exercise("01", "answer_2"))
    out = capsys.readouterr().out
    assert "✅ 01.3 first advantage" in out and "✅ 01.4 frac_reward_zero_std" in out


def test_01_3_and_01_4_stubs_read_not_answered(capsys):
    assert exercise("01", "answer_1", copy="notebooks") is None
    assert not nb01.check_01_first_advantage(None) and not nb01.check_01_zero_std_fraction(None)
    out = capsys.readouterr().out
    assert "⏳ 01.3 first advantage: not answered yet" in out and "⏳ 01.4 frac_reward_zero_std" in out


@pytest.mark.parametrize("wrong", [1.73, 0.75, 1.0, -1.5, "1.5 or so"])  # population std, no division, ...
def test_01_3_wrong_values_fail(wrong, capsys):
    assert not nb01.check_01_first_advantage(wrong)
    assert "❌ 01.3" in capsys.readouterr().out


@pytest.mark.parametrize("wrong", ["1.5", "1.50", torch.tensor([1.5]), [1.5]])
def test_01_3_the_right_number_of_the_wrong_kind_fails_and_says_a_number_was_expected(wrong, capsys):
    assert not nb01.check_01_first_advantage(wrong)
    assert "❌ 01.3 first advantage: a number was expected" in capsys.readouterr().out


@pytest.mark.parametrize("wrong", [1, 0.25, 4, 0.0, "0.5", False, float("nan")])
def test_01_4_wrong_values_fail(wrong, capsys):  # groups not completions, one of four groups, a count, none, kinds
    assert not nb01.check_01_zero_std_fraction(wrong)
    assert "❌ 01.4" in capsys.readouterr().out


def test_01_4_a_bool_is_not_a_number(capsys):
    nb01.check_01_zero_std_fraction(False)
    assert "a number was expected (an int, a float or a 0-d tensor, no quotes), got bool False" in (
        capsys.readouterr().out)


@pytest.mark.parametrize("right", [torch.tensor(1.5), torch.tensor(1.4999, dtype=torch.float64)])
def test_01_3_the_0_d_tensor_advantages_returns_passes(right, capsys):
    """``advantages([1, 0, 0, 0], 4)[0]`` is a 0-d tensor: the number it holds is the answer."""
    assert nb01.check_01_first_advantage(right)
    assert "✅ 01.3" in capsys.readouterr().out


def test_the_hints_point_the_way_without_the_code():
    """No hint is a line of the solution (the issue's 01.3 hint was the formula itself)."""
    hints = [nb01.ADVANTAGES_HINT, nb01.POLICY_LOSS_HINT, nb01.SEQUENCE_MEAN_HINT]
    for code in ("(dim=1)", ".sum(", ".mean(", "unbiased", "torch.min(", "clamp(ratio", ".std("):
        assert not any(code in hint for hint in hints), code
