"""A reward that invites hacking, and its fix: the "creativity bonus" of notebook 03, trained in notebook 07.

The source article suggests a bonus for "novel" solutions. Measured from the text, novelty is difference from
the other completions of the batch (``novelty_scores``), and the cheapest way to be different is word salad, not
a new method. ``novelty_reward_func`` pays that for any completion; given ``HACK_WEIGHT`` (the bonus worth as much
as the whole task reward) a policy earns more by writing salad than by solving the problem.
``paid_novelty_reward_func`` is the fix: the bonus goes only to correct answers and is capped at
``NOVELTY_CAP``, so no amount of novelty outweighs being right.
"""

from __future__ import annotations

from typing import Any

from course_utils.data import extract_xml_answer
from course_utils.rewards.corrected import answers_match, completion_texts

HACK_WEIGHT = 4.0  # the bonus as large as the five rewards' maximum (4.0): "creativity matters as much as the task"
NOVELTY_CAP = 0.25  # the fixed bonus: at most an eighth of the correctness reward


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


def paid_novelty_reward_func(
    prompts: Any = None, completions: Any = None, answer: Any = None, **kwargs: Any
) -> list[float]:
    """The fixed bonus: ``NOVELTY_CAP`` x novelty, paid only when the ``<answer>`` is correct.

    Gated, because a bonus that wrong answers can earn is a bonus for being wrong in new ways; capped, because
    an uncapped bonus can outgrow the task it decorates.
    """
    texts = completion_texts(completions)
    if answer is None or isinstance(answer, str) or len(answer) != len(texts):
        raise ValueError(
            f"paid_novelty_reward_func needs one gold answer per completion ({len(texts)}); "
            "GRPOTrainer passes the dataset's `answer` column"
        )
    novelty = novelty_scores(texts)
    return [
        NOVELTY_CAP * score if answers_match(extract_xml_answer(text), gold) else 0.0
        for text, gold, score in zip(texts, answer, novelty, strict=True)
    ]


__all__ = [
    "HACK_WEIGHT",
    "NOVELTY_CAP",
    "novelty_reward_func",
    "novelty_scores",
    "paid_novelty_reward_func",
]
