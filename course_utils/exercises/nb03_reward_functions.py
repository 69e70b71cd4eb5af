"""Notebook 03 (reward functions): the five corrected rewards and the learner's own, called as TRL calls them."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from decimal import Decimal
from typing import Any

from transformers import TrainerState

from course_utils.core.answer_format import format_answer
from course_utils.exercises.comparison import (
    Case,
    check_against_reference,
    close_to,
    dataset_rows,
    not_a_function,
    real_row_indices,
    report,
    same_values,
)
from course_utils.lesson import rewards
from course_utils.lesson.formatting import build_prompt, extract_hash_answer, extract_reasoning
from course_utils.lesson.grpo import trl_reward_values
from course_utils.lesson.rewards import classic
from course_utils.lesson.widgets import SAMPLE_BANK


def _conversation(text: Any) -> list[dict[str, Any]]:
    """A completion as TRL passes it for a conversational dataset: one assistant message."""
    return [{"role": "assistant", "content": text}]


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
    ("two answer blocks", "<answer>\n5\n</answer> wait, no:\n<answer>\n1000\n</answer>", "1000"),
    ("spaces before the tags", "  " + format_answer("40 * 25 = 1000", "1000"), "1000"),
    ("every tag twice", format_answer("a", "1") + "\n" + format_answer("b", "1000"), "1000"),
    ("empty reasoning", format_answer("", "1000"), "1000"),
    ("tags in the wrong order", "<answer>\n1000\n</answer>\n<reasoning>\n40 * 25\n</reasoning>", "1000"),
    ("closing tag twice inside", "<reasoning>a</reasoning> b </reasoning>\n<answer>1000</answer>", "1000"),
    ("a long line of tags", "<reasoning></reasoning><answer>" * 200, "1000"),
    ("empty completion", "", "1000"),
    ("a message whose content is None", None, "1000"),
)
REWARD_EDGE_CASES: tuple[tuple[str, Any, str], ...] = (
    *[(label, _conversation(text), gold) for label, text, gold in EDGE_TEXTS],
    ("plain text, not a conversation", format_answer("40 * 25 = 1000", "1000"), "1000"),
    ("no completion at all (None)", None, "1000"),
)


def trl_reward_kwargs(completions: Sequence[Any], answers: Sequence[str], reasoning: Sequence[str]) -> dict[str, Any]:
    """The keyword arguments ``GRPOTrainer`` gives a reward function for a batch (see ``_calculate_rewards``)."""
    texts = [rewards.completion_text(c) for c in completions]
    return {
        "prompts": [build_prompt("A GSM8K question?") for _ in completions],
        "completions": list(completions),
        "completion_ids": [list(text.encode()) for text in texts],  # stand-ins for token ids
        "answer": list(answers),
        "reasoning": list(reasoning),
        "trainer_state": TrainerState(global_step=1, max_steps=10),
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
    """Real GSM8K solutions written the ways a model writes them, the sample bank of notebook 03, and edge cases."""
    cases = []
    indices = real_row_indices(dataset, count=8)
    for index, row in zip(indices, dataset_rows(dataset, indices), strict=True):
        gold, reasoning = extract_hash_answer(row["answer"]), extract_reasoning(row["answer"])
        for label, text in _variants(reasoning, gold):
            cases.append(_reward_case(f"row {index}, {label} (gold {gold!r})", _conversation(text), gold, reasoning))
    for sample in SAMPLE_BANK:
        label = f"sample '{sample.label}' (gold {sample.answer!r})"
        cases.append(_reward_case(label, _conversation(sample.completion), sample.answer))
    for label, completion, gold in REWARD_EDGE_CASES:
        cases.append(_reward_case(f"{label} (gold {gold!r})", completion, gold))
    return cases


def _called_like_trl(function: Callable[..., Any]) -> Callable[[dict[str, Any]], Any]:
    """``function(**kwargs)``: how ``GRPOTrainer`` calls a reward (keywords only, extra columns included)."""
    return lambda kwargs: function(**kwargs)


def _check_reward(exercise: str, learner: Any, reference: Callable[..., Any], dataset: Any, hint: str) -> bool:
    if not_a_function(exercise, learner, hint):
        return False
    return check_against_reference(
        exercise, _called_like_trl(learner), _called_like_trl(reference), reward_cases(dataset), hint=hint
    )


def check_03_correctness(learner: Any, dataset: Any) -> bool:
    """The learner's corrected ``correctness_reward_func`` against ``lesson.rewards``' on real and edge cases."""
    hint = "for each text of completion_texts(completions): 2.0 if answers_match(extract_xml_answer(text), gold)"
    return _check_reward("03 correctness_reward_func", learner, rewards.correctness_reward_func, dataset, hint)


def check_03_int(learner: Any, dataset: Any) -> bool:
    """The learner's corrected ``int_reward_func``: 0.5 when the answer block parses to a whole number."""
    hint = "n = plain_number(extract_xml_answer(text)); 0.5 if n is not None and n == n.to_integral_value()"
    return _check_reward("03 int_reward_func", learner, rewards.int_reward_func, dataset, hint)


def check_03_strict_format(learner: Any, dataset: Any) -> bool:
    """The learner's corrected ``strict_format_reward_func``: the exact layout, multi-line reasoning allowed."""
    hint = (
        "drop one final newline; each tag exactly once; starts '<reasoning>\\n', ends '\\n</answer>'; "
        "'\\n</reasoning>\\n<answer>\\n' between a non-blank reasoning and a non-blank answer"
    )
    return _check_reward("03 strict_format_reward_func", learner, rewards.strict_format_reward_func, dataset, hint)


def check_03_soft_format(learner: Any, dataset: Any) -> bool:
    """The learner's corrected ``soft_format_reward_func``: a reasoning block, then an answer block, any spacing."""
    hint = (
        "strip the text; it starts with <reasoning>; after the first </reasoning> (and any spaces) comes "
        "<answer>, and a </answer> follows"
    )
    return _check_reward("03 soft_format_reward_func", learner, rewards.soft_format_reward_func, dataset, hint)


def check_03_xmlcount(learner: Any, dataset: Any) -> bool:
    """The learner's corrected ``xmlcount_reward_func``: 0.125 per tag alone on its line, minus trailing text."""
    hint = (
        "0.125 per tag that appears once, alone on its line, after the tag before it; then minus "
        "0.001 per non-space character after the last </answer>, at most 0.5"
    )
    return _check_reward("03 xmlcount_reward_func", learner, rewards.xmlcount_reward_func, dataset, hint)


def check_03_classic_comma(answer: Any) -> bool:
    """What does the classic correctness reward give '<answer>\\n1,000\\n</answer>' when the gold is '1000'?"""
    completion = [{"role": "assistant", "content": "<answer>\n1,000\n</answer>"}]
    expected = classic.correctness_reward_func(None, [completion], ["1000"])[0]
    return report(
        "03.1 classic correctness on 1,000",
        close_to(answer, expected),
        "the classic version compares strings with ==",
        answer,
    )


def check_03_dotall_flag(answer: Any) -> bool:
    """Which flag of Python's ``re`` module lets ``.`` match a newline?"""
    text = str(answer).strip().removeprefix("re.") if isinstance(answer, str) else ""
    hint = "look for the flag named after 'dot' in the re docs"
    return report("03.2 regex flag", text in {"DOTALL", "S"}, hint, answer)


def repetition_penalty_reference(completions: Any, **kwargs: Any) -> list[float]:
    """Exercise 03.3's reference: minus the share of a completion's non-blank lines that repeat an earlier line."""
    scores = []
    for text in rewards.completion_texts(completions):
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        scores.append(-(len(lines) - len(set(lines))) / len(lines) if lines else 0.0)
    return scores


def _looping(reasoning: str, times: int) -> str:
    """A completion that gets stuck: its first reasoning line again and again, then cut off."""
    first = reasoning.splitlines()[0]
    return "<reasoning>\n" + "\n".join([first] * times)


def own_reward_cases(dataset: Any) -> list[Case]:
    """Sample completions (the bank, real solutions, loops a small model falls into) and edge cases."""
    cases = [case for case in reward_cases(dataset) if not case.label.startswith("row ")]
    indices = real_row_indices(dataset, count=6)
    for index, row in zip(indices, dataset_rows(dataset, indices), strict=True):
        gold, reasoning = extract_hash_answer(row["answer"]), extract_reasoning(row["answer"])
        for label, text in (
            ("solution", format_answer(reasoning, gold)),
            ("first line 3 times", _looping(reasoning, 3)),
            ("first line 12 times", _looping(reasoning, 12)),
            ("solution written twice", format_answer(reasoning + "\n" + reasoning, gold)),
        ):
            cases.append(_reward_case(f"row {index}, {label}", _conversation(text), gold, reasoning))
    for label, text in (
        ("blank lines only", "\n \n\t\n"),
        ("same line, different indentation", "  x = 1\nx = 1  \n"),
        ("one line", "42"),
    ):
        cases.append(_reward_case(label, _conversation(text), "42"))
    return cases


def _through_trl(learner: Callable[..., Any], dataset: Any) -> str | None:
    """Run the learner's reward inside ``GRPOTrainer._calculate_rewards``; a problem in words, or None."""
    indices = real_row_indices(dataset, count=4)[:4]
    rows = dataset_rows(dataset, indices)
    reasonings = [extract_reasoning(row["answer"]) for row in rows]
    golds = [extract_hash_answer(row["answer"]) for row in rows]
    completions = [_conversation(_looping(r, 1 + i)) for i, r in enumerate(reasonings)]
    prompts = [build_prompt(row["question"]) for row in rows]
    try:
        got = trl_reward_values(learner, prompts, completions, answer=golds, reasoning=reasonings)
    except Exception as error:  # the learner's bug, reported as TRL reports it
        return f"GRPOTrainer could not use it: {type(error).__name__}: {error}"
    expected = repetition_penalty_reference(completions)
    if not same_values(expected, got):
        return f"inside GRPOTrainer it gave {got}, the reference {expected}"
    return None


def check_03_own_reward(learner: Any, dataset: Any) -> bool:
    """Exercise 03.3: a repetition penalty, on sample completions and then called by TRL's own reward code."""
    hint = (
        "def f(completions, **kwargs): for each text of completion_texts(completions), the non-blank lines "
        "stripped; return -(repeats / lines), 0.0 when there are no lines"
    )
    if not_a_function("03.3 your reward", learner, hint):
        return False
    reference, cases = _called_like_trl(repetition_penalty_reference), own_reward_cases(dataset)
    if not check_against_reference("03.3 your reward", _called_like_trl(learner), reference, cases, hint=hint):
        return False
    problem = _through_trl(learner, dataset)
    if problem:
        print(f"❌ 03.3 your reward through GRPOTrainer: {problem}. Hint: {hint}")
        return False
    print("✅ 03.3 your reward through GRPOTrainer: TRL called it and got the reference's rewards.")
    return True
