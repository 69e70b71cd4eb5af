"""Notebook 03 (reward functions): the five corrected rewards and the learner's own, called as TRL calls them.

The exercises, in the notebook's order: 03.1 ``correctness_reward_func``, 03.2 ``int_reward_func``,
03.3 ``strict_format_reward_func``, 03.4 ``soft_format_reward_func``, 03.5 ``xmlcount_reward_func`` (each run
next to ``course_utils.lesson.rewards``' corrected version on real GSM8K solutions, the sample bank and edge
cases), then at the end 03.6 and 03.7 (values) and 03.8, a reward of the learner's own, judged on TRL's
contract alone. The reward checks hand back what the notebook continues with: the learner's function when
it passed, else the package's.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import inspect
import math
import numbers
import re
from collections.abc import Callable, Sequence
from decimal import Decimal
from typing import Any

import numpy as np

from course_utils.core.answer_format import format_answer
from course_utils.core.trl_internals import TRLChanged
from course_utils.exercises.comparison import (
    Case,
    check_against_reference,
    dataset_rows,
    hand_back,
    list_problems,
    not_a_function,
    real_row_indices,
    report,
    report_name,
    report_number,
    short_repr,
)
from course_utils.lesson import rewards
from course_utils.lesson.formatting import build_prompt, extract_hash_answer, extract_reasoning
from course_utils.lesson.grpo import trl_reward_extras, trl_reward_values
from course_utils.lesson.rewards import classic
from course_utils.lesson.widgets import SAMPLE_BANK

CORRECTNESS = "03.1 correctness_reward_func"
INT = "03.2 int_reward_func"
STRICT_FORMAT = "03.3 strict_format_reward_func"
SOFT_FORMAT = "03.4 soft_format_reward_func"
XMLCOUNT = "03.5 xmlcount_reward_func"
CLASSIC_COMMA = "03.6 classic correctness on 1,000"
DOTALL_FLAG = "03.7 regex flag"
OWN_REWARD = "03.8 your own reward"

# Hints point the way in words; the notebook shows the same ones, collapsed.
CORRECTNESS_HINT = (
    "read every completion's text with completion_texts, take its last answer block with extract_xml_answer, "
    "and let answers_match compare it with the gold answer at the same position (zip strictly)"
)
INT_HINT = (
    "plain_number reads the answer block as a Decimal, or None when it is not a number; a whole number is one "
    "that equals its integral value (Decimal has a method for that); None earns nothing"
)
STRICT_FORMAT_HINT = (
    "allow one final newline, demand each of the four tags exactly once, the right start and end, and one "
    "separator between the blocks (str.partition); reasoning and answer must not be blank"
)
SOFT_FORMAT_HINT = (
    "strip the text first; it starts with the reasoning tag; split what follows at the first closing reasoning "
    "tag (str.partition); the rest, stripped on the left, opens the answer block and closes it later"
)
XMLCOUNT_HINT = (
    "a tag counts when it appears once, alone on its line, and after the tag before it; the penalty counts only "
    "non-space characters after the last closing answer tag (str.rpartition), and stops at 0.5"
)
OWN_REWARD_HINT = (
    "take completions and **kwargs, read the texts with completion_texts, and build one number per completion "
    "in a list; junk completions read as empty text, so score that instead of failing"
)


def _conversation(text: Any) -> list[dict[str, Any]]:
    """A completion as TRL passes it for a conversational dataset: one assistant message."""
    return [{"role": "assistant", "content": text}]


ASIDE = "Let me check that again. " * 9  # over 200 characters: too long to be one answer
# (label, completion text, gold answer): the cases the classic rewards get wrong, and what a model can emit
EDGE_TEXTS: tuple[tuple[str, str | None, str], ...] = (
    ("negative answer", format_answer("5 - 8 = -3", "-3"), "-3"),
    ("answer 18.00 for gold 18", format_answer("2 * 9 = 18", "18.00"), "18"),
    ("decimal answer 2.5", format_answer("5 / 2 = 2.5", "2.5"), "2.5"),
    ("superscript two", format_answer("x squared", "²"), "2"),
    ("answer in words", format_answer("two fives", "ten"), "10"),
    ("answer as a fraction", format_answer("2000 / 2", "\\frac{2000}{2}"), "1000"),
    ("answer $1,000", format_answer("40 * 25 = 1000", "$1,000"), "1000"),
    ("answer with a unit", format_answer("40 * 25 = 1000", "1000 pencils"), "1000"),
    ("answer 1e3 (an exponent)", format_answer("40 * 25 = 1000", "1e3"), "1000"),
    ("answer 1_000 (an underscore)", format_answer("40 * 25 = 1000", "1_000"), "1000"),
    ("answer nan", format_answer("0 / 0", "nan"), "1000"),
    ("negative decimal with a separator", format_answer("-1234.5", "-1,234.5"), "-1234.5"),
    ("two answer blocks", "<answer>\n5\n</answer> wait, no:\n<answer>\n1000\n</answer>", "1000"),
    ("corrected after a long aside", f"<answer>\n5\n</answer>\n{ASIDE}\n<answer>\n1000\n</answer>", "1000"),
    ("spaces before the tags", "  " + format_answer("40 * 25 = 1000", "1000"), "1000"),
    ("every tag twice", format_answer("a", "1") + "\n" + format_answer("b", "1000"), "1000"),
    ("empty reasoning", format_answer("", "1000"), "1000"),
    ("tags in the wrong order", "<answer>\n1000\n</answer>\n<reasoning>\n40 * 25\n</reasoning>", "1000"),
    ("closing tag twice inside", "<reasoning>a</reasoning> b </reasoning>\n<answer>1000</answer>", "1000"),
    ("a long line of tags", "<reasoning></reasoning><answer>" * 200, "1000"),
    ("600 characters after </answer>", format_answer("40 * 25 = 1000", "1000") + "\n" + "x" * 600, "1000"),
    ("empty completion", "", "1000"),
    ("a message whose content is None", None, "1000"),
)
EDGE_CASES: tuple[tuple[str, Any, str], ...] = (
    *[(label, _conversation(text), gold) for label, text, gold in EDGE_TEXTS],
    ("plain text, not a conversation", format_answer("40 * 25 = 1000", "1000"), "1000"),
    ("no completion at all (None)", None, "1000"),
)


@functools.cache
def _trl_extras() -> dict[str, Any]:
    """The installed TRL's extra reward keywords (``lesson.grpo.trl_reward_extras``), read once per process."""
    return trl_reward_extras()


def trl_reward_kwargs(completions: Sequence[Any], answers: Sequence[str], reasoning: Sequence[str]) -> dict[str, Any]:
    """The keyword arguments ``GRPOTrainer._calculate_rewards`` gives a reward function for a batch (TRL 1.16).

    ``environments`` is left out: TRL passes it only to trainers built with an ``environment_factory``.
    """
    texts = [rewards.completion_text(c) for c in completions]
    return {
        "prompts": [build_prompt("A GSM8K question?") for _ in completions],
        "completions": list(completions),
        "completion_ids": [list(text.encode()) for text in texts],  # stand-ins for token ids
        "answer": list(answers),
        "reasoning": list(reasoning),
        **_trl_extras(),
    }


def _reward_case(label: str, completion: Any, gold: str, reasoning: str = "") -> Case:
    """One completion as a batch of one, called as TRL calls a reward: keyword arguments only."""
    return Case(label, (trl_reward_kwargs([completion], [gold], [reasoning]),))


def _variants(reasoning: str, gold: str) -> list[tuple[str, str]]:
    """The ways a model writes one real solution: exact, with or without the final newline, chatty, cut off..."""
    exact = format_answer(reasoning, gold)
    number = Decimal(gold)
    restyled = f"{number:,}" if number == number.to_integral_value() and abs(number) >= 1000 else f"${gold}"
    return [
        ("exact layout", exact),
        ("final newline", exact + "\n"),
        (f"answer written {restyled!r}", format_answer(reasoning, restyled)),
        ("wrong answer", format_answer(reasoning, str(number + 1))),
        ("tags on one line", f"<reasoning>{' '.join(reasoning.split())}</reasoning> <answer>{gold}</answer>"),
        ("text after </answer>", exact + "\nI hope this helps!"),
        ("cut off", exact[: len(exact) * 3 // 5]),
    ]


def reward_cases(dataset: Any) -> list[Case]:
    """Edge cases, the sample bank of notebook 03, and real GSM8K solutions written the ways a model writes them.

    In that order, so the first differences a verdict shows name the mistake ("two answer blocks"), and the
    real rows then show it on GSM8K itself.
    """
    cases = [_reward_case(f"{label} (gold {gold!r})", completion, gold) for label, completion, gold in EDGE_CASES]
    for sample in SAMPLE_BANK:
        label = f"sample '{sample.label}' (gold {sample.answer!r})"
        cases.append(_reward_case(label, _conversation(sample.completion), sample.answer))
    indices = real_row_indices(dataset, count=8)
    for index, row in zip(indices, dataset_rows(dataset, indices), strict=True):
        gold, reasoning = extract_hash_answer(row["answer"]), extract_reasoning(row["answer"])
        for label, text in _variants(reasoning, gold):
            cases.append(_reward_case(f"row {index}, {label} (gold {gold!r})", _conversation(text), gold, reasoning))
    return cases


def awaited(value: Any) -> Any:
    """The value of an awaitable, run as TRL 1.16 runs an ``async def`` reward: on an event loop of its own thread.

    A thread of its own, because a notebook's kernel already runs an event loop in this one.
    """
    if not inspect.isawaitable(value):
        return value

    async def wait() -> Any:
        return await value

    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, wait()).result()


def synchronous(learner: Callable[..., Any]) -> Callable[..., Any]:
    """The learner's reward as a plain function: an ``async def`` one awaited each call (the rest unchanged).

    What the notebook continues with: its later cells call the reward directly, where TRL would await it.
    """
    if not inspect.iscoroutinefunction(learner):
        return learner

    def call(*args: Any, **kwargs: Any) -> Any:
        return awaited(learner(*args, **kwargs))

    call.__name__ = call.__qualname__ = getattr(learner, "__name__", "own_reward_func")
    call.__doc__ = learner.__doc__
    return call


def batch_cases(dataset: Any, size: int = 5) -> list[Case]:
    """Batches of several completions of unequal lengths, as TRL passes a generation batch.

    The edge cases in batches of ``size``, and each real row's variants (exact, chatty, cut off...) as one
    group: a reward that scores only the first completion, or stops early, differs here.
    """
    singles = [(label, completion, gold) for label, completion, gold in EDGE_CASES if completion is not None]
    cases = []
    for start in range(0, len(singles), size):
        chunk = singles[start : start + size]
        _, completions, golds = zip(*chunk, strict=True)
        label = f"a batch of {len(chunk)}: {', '.join(label for label, _, _ in chunk)}"
        cases.append(Case(label, (trl_reward_kwargs(completions, golds, [""] * len(chunk)),)))
    indices = real_row_indices(dataset, count=4)
    for index, row in zip(indices, dataset_rows(dataset, indices), strict=True):
        gold, reasoning = extract_hash_answer(row["answer"]), extract_reasoning(row["answer"])
        texts = [text for _, text in _variants(reasoning, gold)]
        kwargs = trl_reward_kwargs([_conversation(t) for t in texts], [gold] * len(texts), [reasoning] * len(texts))
        cases.append(Case(f"row {index}: a group of {len(texts)} completions of unequal lengths", (kwargs,)))
    return cases


def mismatch_cases(dataset: Any) -> list[Case]:
    """Gold answers that do not pair up with the completions: an error, never a reward silently dropped."""
    rows = dataset_rows(dataset, real_row_indices(dataset, count=3)[:3])
    golds = [extract_hash_answer(row["answer"]) for row in rows]
    completions = [_conversation(format_answer(extract_reasoning(r["answer"]), g)) for r, g in zip(rows, golds,
                                                                                               strict=True)]
    return [
        Case("3 completions, 2 gold answers", (trl_reward_kwargs(completions, golds[:2], [""] * 3),)),
        Case("2 completions, 3 gold answers", (trl_reward_kwargs(completions[:2], golds, [""] * 2),)),
    ]


def _called_like_trl(function: Callable[..., Any]) -> Callable[[dict[str, Any]], Any]:
    """``function(**kwargs)``: how ``GRPOTrainer`` calls a reward (keywords only, extra columns included).

    ``functools.wraps`` keeps the learner's name and module on the wrapper, so the comparison reports the
    learner's function as theirs.
    """

    @functools.wraps(function)
    def call(kwargs: dict[str, Any]) -> Any:
        return awaited(function(**kwargs))  # an async def reward is awaited, as TRL awaits it

    return call


def rewards_needs(expected: list[float], got: Any) -> str | None:
    """What TRL and the next cells do with a reward's return: one float per completion, in a list."""
    if not isinstance(got, (list, tuple)):
        return f"returns a {type(got).__name__}: TRL needs a list with one reward per completion"
    if len(got) != len(expected):
        return f"returns {len(got)} reward(s) for {len(expected)} completion(s): one per completion"
    return None


def _check_reward(
    exercise: str, learner: Any, reference: Callable[..., Any], dataset: Any, hint: str, extra: Sequence[Case] = ()
) -> Any:
    """Run the learner's reward next to the reference on every case; hand back the one the notebook continues with."""
    cases = [*reward_cases(dataset), *batch_cases(dataset), *extra]
    passed = not not_a_function(exercise, learner, hint) and check_against_reference(
        exercise, _called_like_trl(learner), _called_like_trl(reference), cases, hint=hint, needs=rewards_needs
    )
    return hand_back(exercise, passed, synchronous(learner), reference, f"rewards.{reference.__name__}")


def check_03_correctness(learner: Any, dataset: Any) -> Any:
    """03.1: the learner's corrected ``correctness_reward_func``; hands back theirs or ``rewards``'."""
    extra = mismatch_cases(dataset)
    return _check_reward(CORRECTNESS, learner, rewards.correctness_reward_func, dataset, CORRECTNESS_HINT, extra)


def check_03_int(learner: Any, dataset: Any) -> Any:
    """03.2: the learner's corrected ``int_reward_func`` (0.5 for a whole number); hands back theirs or ``rewards``'."""
    return _check_reward(INT, learner, rewards.int_reward_func, dataset, INT_HINT)


def check_03_strict_format(learner: Any, dataset: Any) -> Any:
    """03.3: the learner's corrected ``strict_format_reward_func``; hands back theirs or ``rewards``'."""
    return _check_reward(STRICT_FORMAT, learner, rewards.strict_format_reward_func, dataset, STRICT_FORMAT_HINT)


def check_03_soft_format(learner: Any, dataset: Any) -> Any:
    """03.4: the learner's corrected ``soft_format_reward_func``; hands back theirs or ``rewards``'."""
    return _check_reward(SOFT_FORMAT, learner, rewards.soft_format_reward_func, dataset, SOFT_FORMAT_HINT)


def check_03_xmlcount(learner: Any, dataset: Any) -> Any:
    """03.5: the learner's corrected ``xmlcount_reward_func``; hands back theirs or ``rewards``'."""
    return _check_reward(XMLCOUNT, learner, rewards.xmlcount_reward_func, dataset, XMLCOUNT_HINT)


# --- the end of the notebook: two values and a reward of the learner's own ----------------------------------


def check_03_classic_comma(answer: Any) -> bool:
    """03.6: what does the classic correctness reward give '<answer>\\n1,000\\n</answer>' when the gold is '1000'?"""
    completion = [{"role": "assistant", "content": "<answer>\n1,000\n</answer>"}]
    expected = classic.correctness_reward_func(None, [completion], ["1000"])[0]
    hint = "the classic version compares the two strings with ==; is '1,000' the same string as '1000'?"
    return report_number(CLASSIC_COMMA, answer, expected, hint)


def check_03_dotall_flag(answer: Any) -> bool:
    """03.7: which flag of Python's ``re`` module lets ``.`` match a newline? (a name, or the flag itself)"""
    hint = "look for the flag named after the dot in the re module's docs"
    if isinstance(answer, re.RegexFlag):
        return report(DOTALL_FLAG, answer == re.DOTALL, hint, answer)
    name = answer.strip().strip("`'\"").removeprefix("re.") if isinstance(answer, str) else answer
    return report_name(DOTALL_FLAG, name, {"DOTALL", "S"}, hint)


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
JUNK = (None, "", _conversation(None), 42, "<answer>" * 10_000, [{"role": "assistant"}], ["not a message"])


def contract_batches(dataset: Any) -> dict[str, list[Any]]:
    """Batches a reward meets in training, by name: the sample bank, real solutions and loops, one alone, junk."""
    indices = real_row_indices(dataset, count=6)[:6]
    real = []
    for row in dataset_rows(dataset, indices):
        gold, reasoning = extract_hash_answer(row["answer"]), extract_reasoning(row["answer"])
        real += [format_answer(reasoning, gold), _looping(reasoning, 3), _looping(reasoning, 12)]
    samples = [sample.completion for sample in SAMPLE_BANK]
    return {
        "the sample bank": [_conversation(text) for text in samples],
        "real solutions and loops": [_conversation(text) for text in real],
        "plain-text completions": samples,
        "a batch of one": [_conversation(samples[0])],
        "junk completions": list(JUNK),
    }


def _value_problem(value: Any) -> str | None:
    """Why one reward is not what TRL can use (None is: it means "does not apply"), or None when it is."""
    if value is None:
        return None
    if isinstance(value, str) or not isinstance(value, numbers.Real):
        return f"{short_repr(value)} is a {type(value).__name__}, not a float"
    if not math.isfinite(value):
        return f"{value} is not a finite number (return None where the reward does not apply)"
    return None


def _batch_problem(name: str, completions: list[Any], learner: Callable[..., Any]) -> tuple[str | None, list[Any]]:
    """Call the learner as TRL does on one batch: ``(what is wrong or None, the rewards)``."""
    kwargs = trl_reward_kwargs(completions, ["1000"] * len(completions), [""] * len(completions))
    try:
        values = awaited(learner(**kwargs))
    except NotImplementedError:
        raise  # a stub: "not answered yet", not a wrong answer
    except Exception as error:  # the learner's bug is a verdict, never a crash
        return f"{name}: raises {type(error).__name__}: {' '.join(str(error).split())[:80]}", []
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
    completions = [_conversation(_looping(r, 1 + i)) for i, r in enumerate(reasonings)]
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
