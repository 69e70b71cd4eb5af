"""Notebook 04's checks: batch arithmetic, the group size field, the monitoring rule, the generation batch."""

from __future__ import annotations

from course_utils.exercises import nb04_train_grpo as nb04

MONITORING_HISTORY = [
    {"step": s, "reward": 0.4, "reward_std": 0.5, "completions/mean_length": 64.0,
     "completions/clipped_ratio": 0.8, "frac_reward_zero_std": 0.1}
    for s in range(1, 9)
]  # fmt: skip


def test_value_checks_of_04_accept_the_right_answers_only():
    assert nb04.check_04_prompts_per_step(16) and not nb04.check_04_prompts_per_step(128)
    assert nb04.check_04_group_size_field("num_generations")
    assert not nb04.check_04_group_size_field("beta") and not nb04.check_04_group_size_field("G")
    assert nb04.check_04_monitoring_rule("clipped_high", MONITORING_HISTORY)
    assert not nb04.check_04_monitoring_rule("kl_rising", MONITORING_HISTORY)


def test_the_kl_field_is_no_longer_an_answer_of_04():
    """06.2's answer is beta; no two exercises of the course share an answer."""
    assert not hasattr(nb04, "check_04_kl_field")
    assert not nb04.check_04_group_size_field("beta")


def learner_generation_batch(batch, accumulation, num_generations):
    if num_generations < 2 or batch < 1 or accumulation < 1:
        raise ValueError("sizes")
    completions = batch * accumulation
    if completions % num_generations:
        raise ValueError(f"{completions} completions are not whole groups of {num_generations}")
    return completions


def test_check_04_generation_batch(capsys):
    assert nb04.check_04_generation_batch(learner_generation_batch)
    assert not nb04.check_04_generation_batch(lambda b, a, g: b * a)  # never refuses
    assert "6 x 1, groups of 4: not whole groups: the reference raises" in capsys.readouterr().out
    assert not nb04.check_04_generation_batch(lambda b, a, g: b * a // g)  # prompts, not completions

    def refuses_with_assert(b, a, g):
        assert (b * a) % g == 0 and g > 1 and b > 0 and a > 0
        return b * a

    assert not nb04.check_04_generation_batch(refuses_with_assert)  # AssertionError is not a ValueError
    assert not nb04.check_04_generation_batch("b * a")
