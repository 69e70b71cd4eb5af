"""Notebook 02 (GSM8K data): the gold-answer parser, the prompt builder, the map function, lengths.

The exercises, in the notebook's order: 02.1 ``extract_hash_answer``, 02.2 ``build_prompt``, 02.3
``to_grpo_row`` (the function ``Dataset.map`` applies), then at the end 02.4 to 02.6 (values) and 02.7
``split_solution``. The function checks run the learner's function next to the course's reference on real
GSM8K rows and edge cases, and hand back what the notebook continues with: the learner's function when it
passed, else the package's.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from course_utils.exercises.comparison import Case, check_against_reference, compare_with_reference, not_a_function
from course_utils.exercises.real_rows import dataset_rows, real_row_indices, short_repr
from course_utils.exercises.verdicts import (
    hand_back,
    is_unanswered,
    number_problem,
    plain_number,
    report,
    report_number,
)
from course_utils.lesson.data_checks import pitfall_outcomes
from course_utils.lesson.formatting import (
    build_prompt,
    extract_hash_answer,
    extract_reasoning,
    format_row,
)

EXTRACT = "02.1 extract_hash_answer"
PROMPT = "02.2 build_prompt"
MAPPING = "02.3 to_grpo_row"
GOLD_ANSWER = "02.4 gold answer"
ROWS_LOST = "02.5 rows lost by int()"
COMPLETION_LENGTH = "02.6 completion length"
SPLIT = "02.7 split_solution"

# Hints point the way in words; the notebook shows the same ones, collapsed.
EXTRACT_HINT = (
    "read the differences above as a list of rules: which inputs are refused, and with which error, and what "
    "is removed from a number before it is returned; the whole text after the marker must be the number, "
    "not just begin with one, and Python's float() reads more than GSM8K writes"
)
PROMPT_HINT = (
    "a list of two messages, each a dict with a role and a content; the format instruction comes first; "
    "strip only the ends of the question, and refuse one that is not a string or is empty once stripped"
)
MAPPING_HINT = (
    "reuse the two functions above: one turns the row's question into the messages, the other its solution "
    "into the gold answer; return a dict with the two column names GRPOTrainer reads"
)
SPLIT_HINT = (
    "two parts of one text: everything before the marker, stripped, and what your extract_hash_answer "
    "returns for the whole text (let it refuse bad input first)"
)


def check_02_gold_answer(answer: Any) -> bool:
    """02.4: what gold answer does ``extract_hash_answer`` give for ``"... $1,250.\\n#### $1,250 "``?"""
    expected = extract_hash_answer("She earned 5*250 = $<<5*250=1250>>1,250.\n#### $1,250 ")
    correct = isinstance(answer, str) and answer == expected
    return report(
        GOLD_ANSWER,
        correct,
        "work it out from the rules of your parser: what does it remove after the marker, what does it keep, "
        "and what type does it return?",
        answer,
    )


def check_02_rows_lost(answer: Any, dataset: Any) -> bool:
    """02.5: how many rows of ``dataset`` does the ``int_cast`` pitfall lose (``apply_pitfall`` returns None)?"""
    expected = len(pitfall_outcomes("int_cast", list(dataset["answer"]))["lost"])
    return report_number(
        ROWS_LOST,
        answer,
        expected,
        "the pitfall table of section 2 (pitfalls, for the rows you loaded) says what each shortcut does: "
        "find the int() one and count the rows it makes disappear",
    )


def longest_accepted_length(needed: int) -> int:
    """The longest ``max_completion_length`` 02.6 accepts: room to round ``needed`` up, not to waste compute.

    A quarter above what nine in ten solutions need, or the power of two at or above it, whichever is more.
    Counted in characters (two or more a token in GSM8K's reasoning), the 90th percentile lands above both.
    """
    return max(needed * 5 // 4, 1 << (needed - 1).bit_length())


def check_02_completion_length(answer: Any, stats: Any) -> bool:
    """02.6: a ``max_completion_length`` that fits at least 90% of reference solutions with their XML wrapper.

    Too short truncates (no ``<answer>``, zero reward); more than ``longest_accepted_length`` lets a completion that
    never stops run on, at a cost in time, for tokens no reference solution needs.
    """
    answer = plain_number(answer)
    needed = sorted(length + stats.xml_overhead for length in stats.reasoning_lengths)
    if not is_unanswered(answer) and (isinstance(answer, float) or number_problem(answer)):
        print(f"❌ {COMPLETION_LENGTH}: a whole number of tokens was expected (an int), got "
              f"{type(answer).__name__} {answer!r:.40}.")
        return False
    nine_in_ten = needed[math.ceil(0.9 * len(needed)) - 1]
    correct = not is_unanswered(answer) and nine_in_ten <= answer <= longest_accepted_length(nine_in_ten)
    return report(
        COMPLETION_LENGTH,
        correct,
        "section 4 measured what a reference solution needs: its reasoning tokens (not characters: two or more "
        "make a token) plus the XML wrapper; cover nine in ten of them (a percentile of stats' reasoning lengths, plus "
        "the wrapper), and round up by at most a quarter, or to the power of two just above",
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
    ("a number followed by words", "3 * 4 = 12\n#### 12 apples"),
    ("words before the number", "#### about 12"),
    ("an exponent", "#### 1e3"),
    ("not a number (nan)", "#### nan"),
    ("infinity", "#### inf"),
    ("an underscore between digits", "#### 1_000"),
    ("a negative decimal with a thousands separator", "#### -1,234.5"),
    ("a decimal point and no decimals", "#### 12."),
    ("two numbers", "#### 12 15"),
    ("not a string", None),
)
QUESTION_EDGE_CASES = (
    ("spaces and a newline around the question", ("  What is 6 * 7?\n",)),
    ("a line break and two spaces inside the question", ("A farm has 3 cows  and 2 hens.\nHow many legs?",)),
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


def show_parser_differences(parser: Callable[[str], Any], dataset: Any, show: int = 4) -> int:
    """Print where ``parser`` differs from the reference parser on 02.1's cases; return how many differ.

    For the notebook's demonstrations of shown parsers (the one-liner): no verdict line, nothing is checked.
    """
    cases = answer_cases(dataset)
    differences = compare_with_reference(parser, extract_hash_answer, cases)
    name = getattr(parser, "__name__", "the parser")
    print(f"{name} differs from the reference on {len(differences)} of {len(cases)} cases:")
    for difference in differences[:show]:
        print(f"   - {difference.label}: the reference {difference.reference}, {name} {difference.yours}")
    if len(differences) > show:
        print(f"   ... and {len(differences) - show} more.")
    return len(differences)


def check_02_extract_hash_answer(learner: Any, dataset: Any) -> Any:
    """02.1: the learner's ``extract_hash_answer`` against ``course_utils.lesson.formatting.extract_hash_answer``.

    Returns what the notebook continues with: the learner's function, or the reference.
    """
    passed = check_against_reference(EXTRACT, learner, extract_hash_answer, answer_cases(dataset), hint=EXTRACT_HINT)
    reference_name = "course_utils.lesson.formatting.extract_hash_answer"
    return hand_back(EXTRACT, passed, learner, extract_hash_answer, reference_name)


def question_cases(dataset: Any) -> list[Case]:
    """Real GSM8K questions plus edge cases (padding, inner line breaks, another system prompt, none)."""
    indices = real_row_indices(dataset, count=8)
    real = [
        Case(f"row {i} ({short_repr(row['question'])})", (row["question"],))
        for i, row in zip(indices, dataset_rows(dataset, indices), strict=True)
    ]
    return real + [Case(label, args) for label, args in QUESTION_EDGE_CASES]


def check_02_build_prompt(learner: Any, dataset: Any) -> Any:
    """02.2: the learner's ``build_prompt(question, system_prompt)`` against ``lesson.formatting.build_prompt``.

    Returns what the notebook continues with: the learner's function, or the reference.
    """
    passed = check_against_reference(PROMPT, learner, build_prompt, question_cases(dataset), hint=PROMPT_HINT)
    return hand_back(PROMPT, passed, learner, build_prompt, "course_utils.lesson.formatting.build_prompt")


GRPO_COLUMNS = ("prompt", "answer")  # what GRPOTrainer reads from a row (the rewards get `answer`)


def _grpo_columns(row: dict[str, Any]) -> dict[str, Any]:
    """What ``GRPOTrainer`` reads from a formatted row: the reference for the learner's map function."""
    formatted = format_row(row)
    return {key: formatted[key] for key in GRPO_COLUMNS}


@dataclass(frozen=True)
class _Missing:
    """Stands for a column the learner's row lacks, so a difference reads ``yours returns <no 'answer' key>``."""

    key: str

    def __repr__(self) -> str:
        return f"<no {self.key!r} key>"


def _trainer_view(learner: Callable[[dict[str, Any]], Any]) -> Callable[[dict[str, Any]], Any]:
    """The learner's row function seen as the trainer sees its rows: only ``prompt`` and ``answer`` count.

    It keeps the learner's name and module (``functools.wraps``): it runs the learner's code, not the package's.
    """

    @functools.wraps(learner)
    def columns(row: dict[str, Any]) -> Any:
        got = learner(row)
        if not isinstance(got, Mapping):
            return got
        return {key: got[key] if key in got else _Missing(key) for key in GRPO_COLUMNS}

    return columns


def row_cases(dataset: Any) -> list[Case]:
    """Every raw row of ``dataset`` (what ``Dataset.map`` runs the function on), then rows it must refuse."""
    rows = dataset_rows(dataset, range(len(dataset)))
    return [Case(f"row {i}", (row,)) for i, row in enumerate(rows)] + [
        Case(label, (row,)) for label, row in ROW_EDGE_CASES
    ]


def check_02_mapping(learner: Any, dataset: Any) -> Any:
    """02.3: the learner's row function for ``Dataset.map`` against ``format_row``'s ``prompt`` and ``answer``.

    Run on every row of ``dataset`` and on broken rows; extra columns pass. Returns what the notebook continues
    with: the learner's function, or ``course_utils.lesson.formatting.format_row``.
    """
    passed = not not_a_function(MAPPING, learner, MAPPING_HINT) and check_against_reference(
        MAPPING, _trainer_view(learner), _grpo_columns, row_cases(dataset), hint=MAPPING_HINT, keeps_inputs=False
    )  # Dataset.map hands each call a fresh row: filling it in and returning it is how map functions are written
    return hand_back(MAPPING, passed, learner, format_row, "course_utils.lesson.formatting.format_row")


def split_solution_reference(text: str) -> tuple[str, str]:
    """02.7's answer: the worked reasoning and the gold answer of one GSM8K solution (bad input refused first)."""
    answer = extract_hash_answer(text)
    return extract_reasoning(text), answer


def check_02_split_solution(learner: Any, dataset: Any) -> Any:
    """02.7: ``split_solution(text) -> (reasoning, answer)``, on the cases of ``extract_hash_answer``.

    A refusal of bad input passes with any error of the ``ValueError``/``TypeError`` family (validating
    first gives ``TypeError`` for ``None``, splitting first ``AttributeError``). Returns the learner's
    function when it passed, else ``split_solution_reference``.
    """
    passed = check_against_reference(SPLIT, learner, split_solution_reference, answer_cases(dataset), hint=SPLIT_HINT)
    reference_name = "course_utils.exercises.nb02_gsm8k_data.split_solution_reference"
    return hand_back(SPLIT, passed, learner, split_solution_reference, reference_name)
