"""The bonuses of notebook 07: exploitable as usually written, and fixed by gating and capping them."""

from __future__ import annotations

import pytest

from course_utils.evaluation.reward_hack import hack_rewards
from course_utils.lesson.rewards import CORRECT_REWARD, REWARD_FUNCS
from course_utils.lesson.rewards.hacking import (
    HACK_WEIGHT,
    LENGTH_BONUS_CAP,
    LENGTH_BONUS_PER_WORD,
    NOVELTY_CAP,
    length_bonus_reward_func,
    novelty_reward_func,
    novelty_scores,
    paid_length_bonus_reward_func,
    paid_novelty_reward_func,
)

HONEST = "<reasoning>\n40 * 25 = 1000\n</reasoning>\n<answer>\n1000\n</answer>"
GAMING = "<reasoning>\nzebra quantum violet harbor nebula saffron gondola\n</reasoning>\n<answer>\n7\n</answer>"
# A group as GRPO sees it once the policy agrees on the right answer: three honest, correct completions, one salad
GROUP = [HONEST, HONEST, HONEST, GAMING]
GOLDS = ["1000"] * len(GROUP)
# What the thoroughness bonus pays for: reasoning that goes on until the completion limit cuts it, no answer
RAMBLING = "<reasoning>\n" + "Let us think about this very carefully, one small step at a time. " * 6
LENGTH_GROUP = [HONEST, HONEST, HONEST, RAMBLING]


def totals(fixed: bool, group: list[str] = LENGTH_GROUP) -> list[float]:
    funcs, weights = hack_rewards(fixed)
    columns = [func(prompts=None, completions=group, answer=GOLDS) for func in funcs]
    return [sum(w * column[i] for w, column in zip(weights, columns, strict=True)) for i in range(len(group))]


def test_the_hack_reward_pays_the_gaming_completion_more_than_the_honest_correct_one():
    hacked = totals(fixed=False)
    assert hacked[3] > hacked[0], hacked
    correct = REWARD_FUNCS[0](prompts=None, completions=LENGTH_GROUP, answer=GOLDS)
    assert correct[0] == CORRECT_REWARD and correct[3] == 0.0  # the gaming one has no answer, and still wins


def test_the_fixed_reward_pays_the_honest_correct_completion_more():
    fixed = totals(fixed=True)
    assert fixed[0] > fixed[3], fixed
    assert fixed[0] - fixed[3] >= CORRECT_REWARD  # the bonus can never outweigh being right


def test_novelty_is_difference_from_the_batch():
    scores = novelty_scores(GROUP)
    assert scores[0] == scores[1] == scores[2] < scores[3] <= 1.0
    assert novelty_scores(["alone"]) == [0.0]
    assert novelty_scores(["", ""]) == [0.0, 0.0]  # two empty texts are the same text
    assert novelty_reward_func(None, [[{"role": "assistant", "content": t}] for t in GROUP]) == scores


def test_paid_novelty_is_gated_on_correctness_and_capped():
    paid = paid_novelty_reward_func(None, GROUP, GOLDS)
    assert paid[3] == 0.0 and 0.0 < paid[0] <= NOVELTY_CAP
    assert all(value <= NOVELTY_CAP for value in paid_novelty_reward_func(None, ["a", "b c d", "e"], ["1", "2", "3"]))
    assert HACK_WEIGHT > NOVELTY_CAP


@pytest.mark.parametrize("answer", [None, "1000", ["1000"]])
def test_paid_novelty_needs_one_gold_answer_per_completion(answer):
    with pytest.raises(ValueError, match="one gold answer per completion"):
        paid_novelty_reward_func(None, GROUP, answer)


def test_the_novelty_bonus_at_its_weight_pays_salad_more_than_the_honest_correct_answer():
    bonus = [HACK_WEIGHT * value for value in novelty_reward_func(None, GROUP)]
    columns = [f(prompts=None, completions=GROUP, answer=GOLDS) for f in REWARD_FUNCS]
    task = [sum(column) for column in zip(*columns, strict=True)]
    assert task[3] + bonus[3] > task[0] + bonus[0]
    paid = paid_novelty_reward_func(None, GROUP, GOLDS)
    assert task[0] + paid[0] > task[3] + paid[3]


def test_the_length_bonus_pays_per_word_and_its_fix_is_gated_and_capped():
    assert length_bonus_reward_func(None, ["one two three", ""]) == [3 * LENGTH_BONUS_PER_WORD, 0.0]
    paid = paid_length_bonus_reward_func(None, LENGTH_GROUP, GOLDS)
    assert paid[3] == 0.0 and paid[0] == min(len(HONEST.split()) * LENGTH_BONUS_PER_WORD, LENGTH_BONUS_CAP)
    long_and_right = HONEST.replace("40 * 25", "40 * 25, " + "and so on " * 40)
    assert paid_length_bonus_reward_func(None, [long_and_right], ["1000"]) == [LENGTH_BONUS_CAP]
    with pytest.raises(ValueError, match="one gold answer per completion"):
        paid_length_bonus_reward_func(None, LENGTH_GROUP, "1000")


def test_hack_rewards_give_one_weight_per_function():
    for fixed in (False, True):
        funcs, weights = hack_rewards(fixed)
        assert len(funcs) == len(weights) == len(REWARD_FUNCS) + 1
    assert hack_rewards(False)[0][-1] is length_bonus_reward_func
    assert hack_rewards(True)[0][-1] is paid_length_bonus_reward_func
