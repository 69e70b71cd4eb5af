"""Rewards that invite hacking, and their fix: the bonuses notebook 07 trains with until the policy games them.

Two bonuses of the kind tutorials suggest, each paid for any completion, right or wrong:

- the source article's "creativity bonus": novelty, measured as difference from the other completions of the
  batch (``novelty_scores``). The cheapest way to be different is word salad, not a new method.
- a "thoroughness bonus" for detailed reasoning: ``LENGTH_BONUS_PER_WORD`` for every word
  (``length_bonus_reward_func``). The cheapest way to be thorough is to keep writing: past the completion limit
  the answer is cut off and the task rewards are lost, and the bonus still pays.

The fix is the same for both (``paid_novelty_reward_func``, ``paid_length_bonus_reward_func``): pay the bonus
only to correct answers and cap it, so no amount of it outweighs being right.
"""

from __future__ import annotations

from typing import Any

from course_utils.core.answer_format import extract_xml_answer
from course_utils.lesson.rewards.corrected import answers_match, completion_texts

HACK_WEIGHT = 4.0  # the bonus as large as the five rewards' maximum (4.0): "creativity matters as much as the task"
NOVELTY_CAP = 0.25  # the fixed bonus: at most an eighth of the correctness reward
LENGTH_BONUS_PER_WORD = 0.1  # 20 more words earn as much as a correct answer (2.0)
LENGTH_BONUS_CAP = 0.25  # the fixed bonus: at most an eighth of the correctness reward


def _words(text: str) -> set[str]:
    return set(text.lower().split())


def novelty_scores(texts: list[str]) -> list[float]:
    """1 - mean Jaccard word overlap with every other text of the batch (0.0 when it is alone).

    Group-relative on purpose (that is how a "novel solution" can be measured at all): the same text
    earns more when its neighbours agree with each other.
    """
    words = [_words(text) for text in texts]
    scores = []
    for i, own in enumerate(words):
        overlaps = [
            len(own & other) / len(own | other) if own | other else 1.0 for j, other in enumerate(words) if j != i
        ]
        scores.append(1.0 - sum(overlaps) / len(overlaps) if overlaps else 0.0)
    return scores


def novelty_reward_func(prompts: Any = None, completions: Any = None, **kwargs: Any) -> list[float]:
    """The creativity bonus as usually written: novelty for every completion, right or wrong."""
    return novelty_scores(completion_texts(completions))


def _one_gold_per_completion(name: str, texts: list[str], answer: Any) -> None:
    if answer is None or isinstance(answer, str) or len(answer) != len(texts):
        raise ValueError(
            f"{name} needs one gold answer per completion ({len(texts)}); "
            "GRPOTrainer passes the dataset's `answer` column"
        )


def paid_novelty_reward_func(
    prompts: Any = None, completions: Any = None, answer: Any = None, **kwargs: Any
) -> list[float]:
    """The fixed bonus: ``NOVELTY_CAP`` x novelty, paid only when the ``<answer>`` is correct.

    Gated, because a bonus that wrong answers can earn is a bonus for being wrong in new ways; capped, because
    an uncapped bonus can outgrow the task it decorates.
    """
    texts = completion_texts(completions)
    _one_gold_per_completion("paid_novelty_reward_func", texts, answer)
    novelty = novelty_scores(texts)
    return [
        NOVELTY_CAP * score if answers_match(extract_xml_answer(text), gold) else 0.0
        for text, gold, score in zip(texts, answer, novelty, strict=True)
    ]


def length_bonus_reward_func(prompts: Any = None, completions: Any = None, **kwargs: Any) -> list[float]:
    """The thoroughness bonus as usually written: ``LENGTH_BONUS_PER_WORD`` per word, right or wrong, uncapped."""
    return [LENGTH_BONUS_PER_WORD * len(text.split()) for text in completion_texts(completions)]


def paid_length_bonus_reward_func(
    prompts: Any = None, completions: Any = None, answer: Any = None, **kwargs: Any
) -> list[float]:
    """The fixed thoroughness bonus: per word, capped at ``LENGTH_BONUS_CAP``, paid only when the answer is correct.

    Gated, because a wrong answer cut off at the limit must not earn more than a right one; capped, because an
    uncapped length bonus rewards padding once the answer is right.
    """
    texts = completion_texts(completions)
    _one_gold_per_completion("paid_length_bonus_reward_func", texts, answer)
    return [
        min(LENGTH_BONUS_PER_WORD * len(text.split()), LENGTH_BONUS_CAP)
        if answers_match(extract_xml_answer(text), gold)
        else 0.0
        for text, gold in zip(texts, answer, strict=True)
    ]


__all__ = [
    "HACK_WEIGHT",
    "LENGTH_BONUS_CAP",
    "LENGTH_BONUS_PER_WORD",
    "NOVELTY_CAP",
    "length_bonus_reward_func",
    "novelty_reward_func",
    "novelty_scores",
    "paid_length_bonus_reward_func",
    "paid_novelty_reward_func",
]
