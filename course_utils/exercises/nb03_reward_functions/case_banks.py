"""The cases the five corrected rewards (03.1-03.5) are run on, next to the package's: edge cases, the sample
bank, real GSM8K solutions written the ways a model writes them, batches of several, and gold answers that do
not pair up with the completions.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from course_utils.core.answer_format import format_answer
from course_utils.exercises.comparison import Case
from course_utils.exercises.nb03_reward_functions.trl_calls import (
    conversation,
    trl_reward_kwargs,
)
from course_utils.exercises.real_rows import dataset_rows, real_row_indices
from course_utils.lesson.formatting import extract_hash_answer, extract_reasoning
from course_utils.lesson.widgets import SAMPLE_BANK

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
    ("two final newlines", format_answer("40 * 25 = 1000", "1000") + "\n\n", "1000"),
    ("a final space", format_answer("40 * 25 = 1000", "1000") + " ", "1000"),
    ("closing answer tag twice at the end", format_answer("40 * 25 = 1000", "1000") + "\n</answer>", "1000"),
    ("closing reasoning tag twice", format_answer("40 * 25\n</reasoning>\n= 1000", "1000"), "1000"),
    ("a sentence before <reasoning>", "Sure! " + format_answer("40 * 25 = 1000", "1000"), "1000"),
    ("a line before <reasoning>", "Let me think.\n" + format_answer("40 * 25 = 1000", "1000"), "1000"),
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
    *[(label, conversation(text), gold) for label, text, gold in EDGE_TEXTS],
    ("plain text, not a conversation", format_answer("40 * 25 = 1000", "1000"), "1000"),
    ("no completion at all (None)", None, "1000"),
)


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
        cases.append(_reward_case(label, conversation(sample.completion), sample.answer))
    indices = real_row_indices(dataset, count=8)
    for index, row in zip(indices, dataset_rows(dataset, indices), strict=True):
        gold, reasoning = extract_hash_answer(row["answer"]), extract_reasoning(row["answer"])
        for label, text in _variants(reasoning, gold):
            cases.append(_reward_case(f"row {index}, {label} (gold {gold!r})", conversation(text), gold, reasoning))
    return cases


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
        kwargs = trl_reward_kwargs([conversation(t) for t in texts], [gold] * len(texts), [reasoning] * len(texts))
        cases.append(Case(f"row {index}: a group of {len(texts)} completions of unequal lengths", (kwargs,)))
    return cases


def mismatch_cases(dataset: Any) -> list[Case]:
    """Gold answers that do not pair up with the completions: an error, never a reward silently dropped."""
    rows = dataset_rows(dataset, real_row_indices(dataset, count=3)[:3])
    golds = [extract_hash_answer(row["answer"]) for row in rows]
    completions = [conversation(format_answer(extract_reasoning(r["answer"]), g)) for r, g in zip(rows, golds,
                                                                                               strict=True)]
    return [
        Case("3 completions, 2 gold answers", (trl_reward_kwargs(completions, golds[:2], [""] * 3),)),
        Case("2 completions, 3 gold answers", (trl_reward_kwargs(completions[:2], golds, [""] * 2),)),
    ]
