"""03.8: a reward of the learner's own, judged on TRL's contract alone, then run in the installed TRL's own reward
code; hands back theirs, or the course's example when it breaks the contract.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from typing import Any

import numpy as np

from course_utils.core.answer_format import format_answer
from course_utils.core.trl_internals import TRLChanged
from course_utils.exercises.comparison import call_on_copy, not_a_function
from course_utils.exercises.nb03_reward_functions.trl_calls import (
    awaited,
    conversation,
    synchronous,
    trl_reward_kwargs,
)
from course_utils.exercises.real_rows import dataset_rows, real_row_indices, short_repr
from course_utils.exercises.verdicts import hand_back, list_problems, report
from course_utils.lesson import rewards
from course_utils.lesson.formatting import build_prompt, extract_hash_answer, extract_reasoning
from course_utils.lesson.trl_grpo import trl_reward_values
from course_utils.lesson.widgets import SAMPLE_BANK

OWN_REWARD = "03.8 your own reward"
OWN_REWARD_HINT = (
    "take completions and **kwargs, read the texts with completion_texts, and build one number per completion "
    "in a list; junk completions read as empty text, so score that instead of failing"
)


def repetition_penalty_reference(completions: Any, **kwargs: Any) -> list[float]:
    """03.8's example: minus the share of a completion's non-blank lines that repeat an earlier line."""
    scores = []
    for text in rewards.completion_texts(completions):
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        scores.append(-(len(lines) - len(set(lines))) / len(lines) if lines else 0.0)
    return scores


def _looping(reasoning: str, times: int) -> str:
    """A completion that gets stuck: its first reasoning line again and again, then cut off."""
    first = reasoning.splitlines()[0]
    return "<reasoning>\n" + "\n".join([first] * times)


# What a reward meets beyond model text: nothing, an empty message, a number, 80 kB of tags, a message without content
JUNK = (None, "", conversation(None), 42, "<answer>" * 10_000, [{"role": "assistant"}], ["not a message"],
        " \n\n \n", "Let me see.\n" * 20)


def contract_batches(dataset: Any) -> dict[str, list[Any]]:
    """Batches a reward meets in training, by name: the sample bank, real solutions and loops, one alone, junk."""
    indices = real_row_indices(dataset, count=6)[:6]
    real = []
    for row in dataset_rows(dataset, indices):
        gold, reasoning = extract_hash_answer(row["answer"]), extract_reasoning(row["answer"])
        real += [format_answer(reasoning, gold), _looping(reasoning, 3), _looping(reasoning, 12)]
    samples = [sample.completion for sample in SAMPLE_BANK]
    return {
        "the sample bank": [conversation(text) for text in samples],
        "real solutions and loops": [conversation(text) for text in real],
        "plain-text completions": samples,
        "a batch of one": [conversation(samples[0])],
        "junk completions": list(JUNK),
    }


def _value_problem(value: Any) -> str | None:
    """Why one reward is not what TRL can use (None is: it means "does not apply"), or None when it is."""
    if value is None:
        return None
    if isinstance(value, str) or not isinstance(value, numbers.Real):
        return f"{short_repr(value)} is a {type(value).__name__}, not a float"
    if math.isnan(value):
        return (f"{value}: TRL reads a NaN as None (its sums skip it), so it hides a failed computation as 'does not "
                "apply'; return None on purpose where the reward does not apply, a number everywhere else")
    if math.isinf(value):
        return (f"{value}: TRL adds it into the completion's total, so its group's mean is infinite: with "
                "scale_rewards='group' every advantage of the group becomes NaN and then 0 (the group teaches "
                "nothing), with scale_rewards='none' the group's other completions get advantages of about "
                f"{'-' if value > 0 else ''}3.4e38 (the largest float, one step wrecks the model); the logged reward "
                f"reads {value}; keep every reward finite (cap it, for example max(-10.0, min(value, 10.0)))")
    return None


def _batch_problem(name: str, completions: list[Any], learner: Callable[..., Any]) -> tuple[str | None, list[Any]]:
    """Call the learner as TRL does on one batch: ``(what is wrong or None, the rewards)``."""
    kwargs = trl_reward_kwargs(completions, ["1000"] * len(completions), [""] * len(completions))
    try:
        values, where = call_on_copy(lambda **given: awaited(learner(**given)), kwargs)
    except NotImplementedError:
        raise  # a stub: "not answered yet", not a wrong answer
    except Exception as error:  # the learner's bug is a verdict, never a crash
        return f"{name}: raises {type(error).__name__}: {' '.join(str(error).split())[:80]}", []
    if where:
        return (f"{name}: changes its input in place, at {where}: TRL hands the same completions "
                "to every reward and to its logs, so the rewards after yours (and yours, in order) score other "
                "completions; build new lists instead"), []
    if not (isinstance(values, (list, tuple)) or (isinstance(values, np.ndarray) and values.ndim == 1)):
        kind = "a single number" if isinstance(values, numbers.Number) else f"a {type(values).__name__}"
        return f"{name}: returns {kind}, not a list with one reward per completion", []
    if len(values) != len(completions):
        return f"{name}: {len(values)} reward(s) for {len(completions)} completion(s)", []
    bad = next((f"reward {i}: {why}" for i, v in enumerate(values) if (why := _value_problem(v))), None)
    return (f"{name}: {bad}" if bad else None), values


def _shown_values(values: set[float]) -> str:
    return ", ".join(f"{v:g}" for v in sorted(values)) or "None for all"


def contract_problems(learner: Callable[..., Any], dataset: Any) -> list[str]:
    """What in the learner's reward breaks TRL's contract or teaches nothing, in words; empty when nothing does."""
    problems, seen = [], set()
    for name, completions in contract_batches(dataset).items():
        problem, values = _batch_problem(name, completions, learner)
        if problem:
            problems.append(problem)
        elif name != "junk completions":
            seen |= {float(v) for v in values if v is not None}
    if not problems and len(seen) < 2:
        problems.append(
            f"it gives every completion the same reward ({_shown_values(seen)}): in every group the advantages "
            "are then 0, and the reward teaches nothing"
        )
    return problems


def _through_trl(learner: Callable[..., Any], dataset: Any) -> str | None:
    """Run the learner's reward inside the installed TRL's ``GRPOTrainer._calculate_rewards``; a problem, or None."""
    rows = dataset_rows(dataset, real_row_indices(dataset, count=4)[:4])
    reasonings = [extract_reasoning(row["answer"]) for row in rows]
    golds = [extract_hash_answer(row["answer"]) for row in rows]
    completions = [conversation(_looping(r, 1 + i)) for i, r in enumerate(reasonings)]
    prompts = [build_prompt(row["question"]) for row in rows]
    try:
        trl_reward_values(synchronous(learner), prompts, completions, answer=golds, reasoning=reasonings)
    except TRLChanged:  # the installed TRL moved a name the course reads: the course's problem, said as such
        raise
    except Exception as error:  # TRL's own error (a wrong length, say) or the learner's, reported as it reads
        return f"GRPOTrainer could not use it: {type(error).__name__}: {' '.join(str(error).split())[:120]}"
    return None


def check_03_own_reward(learner: Any, dataset: Any) -> Any:
    """03.8: a reward of the learner's own, judged on TRL's contract; hands back theirs or the course's example.

    Called with every keyword TRL passes, on the sample bank, real solutions, plain text, a batch of one and
    junk, it must return a list with one number (or None) per completion, never raise, and tell the sample
    completions apart; then the installed TRL's ``GRPOTrainer`` runs it in its own reward code.
    """
    reference, name = repetition_penalty_reference, "repetition_penalty_reference (the course's example)"
    if not_a_function(OWN_REWARD, learner, OWN_REWARD_HINT):
        return hand_back(OWN_REWARD, False, learner, reference, name)
    try:
        problems = contract_problems(learner, dataset) or [p for p in [_through_trl(learner, dataset)] if p]
    except NotImplementedError:
        report(OWN_REWARD, False, OWN_REWARD_HINT, None)
        return hand_back(OWN_REWARD, False, learner, reference, name)
    except TRLChanged as changed:  # the course cannot call rewards as this TRL does: its fault, not the learner's
        print(f"⚠️ {OWN_REWARD}: unchecked, the course could not call your reward as the installed TRL does "
              f"({changed}). That is the course's to fix, not your code.")  # fmt: skip
        return hand_back(OWN_REWARD, True, synchronous(learner), reference, name)
    if problems:
        list_problems(OWN_REWARD, "not yet", problems[:4], OWN_REWARD_HINT)
    else:
        batches = len(contract_batches(dataset))
        print(
            f"✅ {OWN_REWARD}: one number per completion on all {batches} batches (junk included), different "
            "rewards for different completions, and GRPOTrainer's own reward code ran it."
        )
    return hand_back(OWN_REWARD, not problems, synchronous(learner), reference, name)
