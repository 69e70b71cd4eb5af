"""Notebook 02 (GSM8K data): the gold-answer parser, the prompt builder, the map function, lengths."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from course_utils.exercises.comparison import (
    Case,
    check_against_reference,
    close_to,
    dataset_rows,
    is_unanswered,
    real_row_indices,
    report,
    same_values,
    short_repr,
)
from course_utils.lesson.data_checks import pitfall_outcomes
from course_utils.lesson.formatting import (
    build_prompt,
    extract_hash_answer,
    extract_reasoning,
    format_gsm8k,
    format_row,
)


def check_02_gold_answer(answer: Any) -> bool:
    """What gold answer does ``extract_hash_answer`` give for ``"... Total: $1,250.\\n#### $1,250 "``?"""
    expected = extract_hash_answer("She earned 5*250 = $<<5*250=1250>>1,250.\n#### $1,250 ")
    correct = isinstance(answer, str) and answer == expected
    return report(
        "02.1 gold answer",
        correct,
        "a string, with the thousands separator, the $ and the surrounding spaces removed",
        answer,
    )


def check_02_rows_lost(answer: Any, dataset: Any) -> bool:
    """How many rows of ``dataset`` does the ``int_cast`` pitfall lose (``apply_pitfall`` returns None)?"""
    expected = len(pitfall_outcomes("int_cast", list(dataset["answer"]))["lost"])
    return report(
        "02.2 rows lost by int()",
        close_to(answer, expected),
        "count the answers int() cannot read: thousands separators, decimals, '$' (pitfall_report has it)",
        answer,
    )


def check_02_completion_length(answer: Any, stats: Any) -> bool:
    """A ``max_completion_length`` that fits at least 90% of reference solutions with their XML wrapper.

    Too short truncates (no ``<answer>``, zero reward); more than twice what is needed wastes compute.
    """
    needed = [length + stats.xml_overhead for length in stats.reasoning_lengths]
    try:
        fits = sum(length <= int(answer) for length in needed) / len(needed)
        correct = fits >= 0.9 and int(answer) <= 2 * max(needed)
    except (TypeError, ValueError):
        correct = False
    return report(
        "02.3 completion length",
        correct,
        "take the 90th percentile of stats.reasoning_lengths and add stats.xml_overhead",
        answer,
    )


ANSWER_EDGE_CASES = (
    ("thousands separator", "2 * 540 = 1080\n#### 1,080"),
    ("dollar sign and spaces", "She saved $1,200.\n#### $1,200 "),
    ("negative answer", "3 - 8 = -5\n#### -5"),
    ("decimal answer", "5 / 2 = 2.5\n#### 2.5"),
    ("answer on the next line", "####\n72\n"),
    ("no '####' marker", "The answer is 7"),
    ("two '####' markers", "#### 3\n#### 4"),
    ("nothing after '####'", "6 * 7 = 42\n#### "),
    ("a word, not a number", "#### seven"),
    ("not a string", None),
)
QUESTION_EDGE_CASES = (
    ("spaces and a newline around the question", ("  What is 6 * 7?\n",)),
    ("another system prompt", ("What is 6 * 7?", "Answer with one number.")),
    ("empty question", ("",)),
    ("only spaces", ("   ",)),
    ("not a string", (None,)),
)
ROW_EDGE_CASES = (
    ("dollar answer, padded question", {"question": "  How much?  ", "answer": "5 * 240 = 1200\n#### $1,200"}),
    ("no '####' in the answer", {"question": "How many?", "answer": "The answer is 7"}),
    ("no question", {"question": "", "answer": "#### 7"}),
)



def answer_cases(dataset: Any) -> list[Case]:
    """Real GSM8K answers from ``dataset`` plus the edge cases a parser must get right or refuse."""
    indices = real_row_indices(dataset)
    real = [
        Case(f"row {i} ({short_repr(row['answer'])})", (row["answer"],))
        for i, row in zip(indices, dataset_rows(dataset, indices), strict=True)
    ]
    return real + [Case(label, (text,)) for label, text in ANSWER_EDGE_CASES]


def check_02_extract_hash_answer(learner: Any, dataset: Any) -> bool:
    """The learner's ``extract_hash_answer`` against ``course_utils.lesson.formatting.extract_hash_answer``."""
    hint = (
        "exactly one '####' (else ValueError), drop ',' and '$', strip, refuse what is not a number "
        "(ValueError) and a non-string (TypeError)"
    )
    return check_against_reference(
        "02 extract_hash_answer", learner, extract_hash_answer, answer_cases(dataset), hint=hint
    )


def question_cases(dataset: Any) -> list[Case]:
    """Real GSM8K questions plus edge cases (padding, another system prompt, empty or missing question)."""
    indices = real_row_indices(dataset, count=8)
    real = [
        Case(f"row {i} ({short_repr(row['question'])})", (row["question"],))
        for i, row in zip(indices, dataset_rows(dataset, indices), strict=True)
    ]
    return real + [Case(label, args) for label, args in QUESTION_EDGE_CASES]


def check_02_build_prompt(learner: Any, dataset: Any) -> bool:
    """The learner's ``build_prompt(question, system_prompt)`` against ``lesson.formatting.build_prompt``."""
    hint = (
        "[{'role': 'system', 'content': system_prompt}, {'role': 'user', 'content': question.strip()}]; "
        "ValueError for an empty or non-string question"
    )
    return check_against_reference("02 build_prompt", learner, build_prompt, question_cases(dataset), hint=hint)


def _grpo_columns(row: dict[str, Any]) -> dict[str, Any]:
    """What ``GRPOTrainer`` reads from a formatted row: the reference for the learner's map function."""
    formatted = format_row(row)
    return {"prompt": formatted["prompt"], "answer": formatted["answer"]}


def _same_grpo_columns(expected: dict[str, Any], got: Any) -> bool:
    return isinstance(got, Mapping) and same_values(expected, {key: got.get(key) for key in expected})


def row_cases(dataset: Any) -> list[Case]:
    """Real raw rows plus rows a map function must transform right or refuse."""
    indices = real_row_indices(dataset, count=12)
    real = [Case(f"row {i}", (row,)) for i, row in zip(indices, dataset_rows(dataset, indices), strict=True)]
    return real + [Case(label, (row,)) for label, row in ROW_EDGE_CASES]


def _first_differing_row(mapped: Any, expected: Any) -> str | None:
    if len(mapped) != len(expected):
        return f"it has {len(mapped)} rows, the raw data {len(expected)}: map must keep every row"
    missing = {"prompt", "answer"} - set(getattr(mapped, "column_names", []))
    if missing:
        return f"its columns lack {sorted(missing)}; it has {getattr(mapped, 'column_names', None)}"
    for column in ("prompt", "answer"):
        for index, (got, want) in enumerate(zip(mapped[column], expected[column], strict=True)):
            if not same_values(want, got):
                ours, yours = short_repr(want, 60), short_repr(got, 60)
                return f"row {index}, column {column!r}: the reference has {ours}, yours {yours}"
    return None


def check_02_mapping(learner: Any, mapped: Any, dataset: Any) -> bool:
    """The learner's row function (for ``Dataset.map``) and the dataset it made, against ``format_gsm8k``."""
    hint = "return {'prompt': build_prompt(row['question']), 'answer': extract_hash_answer(row['answer'])}"
    if not check_against_reference(
        "02 map function", learner, _grpo_columns, row_cases(dataset), hint=hint, same=_same_grpo_columns
    ):
        return False
    if is_unanswered(mapped):
        return report("02 mapped dataset", False, "pass the dataset that dataset.map(your_function) returned", mapped)
    problem = _first_differing_row(mapped, format_gsm8k(dataset))
    if problem:
        print(f"❌ 02 mapped dataset: {problem}.")
        return False
    print(f"✅ 02 mapped dataset: all {len(mapped)} rows have the reference's prompt and answer.")
    return True


def split_solution_reference(text: str) -> tuple[str, str]:
    """Exercise 02.4's reference: the worked reasoning and the gold answer of one GSM8K solution."""
    return extract_reasoning(text), extract_hash_answer(text)


def check_02_split_solution(learner: Any, dataset: Any) -> bool:
    """Exercise: ``split_solution(text) -> (reasoning, answer)``, checked like ``extract_hash_answer``."""
    hint = "reasoning: the text before '####', stripped; answer: your extract_hash_answer (errors included)"
    return check_against_reference(
        "02.4 split_solution", learner, split_solution_reference, answer_cases(dataset), hint=hint
    )
