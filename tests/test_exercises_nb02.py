"""Notebook 02's checks, three ways each, on real GSM8K rows: the course's solution passes, the learner's stub
reads "not answered yet" (and the notebook continues with the package's function), and plausible wrong answers
fail with what differs named.

The solutions and stubs are the notebooks' own cells (``tests/notebook_code.exercise``); the wrong answers are
the shortcuts learners take: the one-liner split, keeping the comma, ``int()`` on decimals, swapped roles,
collapsing the question's inner text, forgetting the ``answer`` column.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pandas as pd
import pytest
from datasets import Dataset
from notebook_code import exercise

from course_utils.core.answer_format import SYSTEM_PROMPT, XML_TEMPLATE
from course_utils.exercises import nb02_gsm8k_data as nb02
from course_utils.exercises.verdicts import is_unanswered
from course_utils.lesson.data import SAMPLE_TEST_ROWS, sample_path
from course_utils.lesson.data_checks import pitfall_outcomes, pitfall_report
from course_utils.lesson.formatting import build_prompt, extract_hash_answer, extract_reasoning, format_row
from course_utils.lesson.token_lengths import TokenLengthStats, recommended_completion_length, token_length_stats

VERDICT = re.compile(r"^(✅|❌|⏳) (\d\d(?:\.\d+)?)\b", re.M)

# --- 02.1 extract_hash_answer ---------------------------------------------------------------------------------------


def after_marker(text):
    return text.split("####")[1]


def one_liner(text):
    return text.split("####")[1].strip()


def keeps_the_comma(text):
    if not isinstance(text, str):
        raise TypeError("not a string")
    if text.count("####") != 1:
        raise ValueError("one '####'")
    answer = after_marker(text).replace("$", "").strip()
    if not re.fullmatch(r"-?[\d,]+(\.\d+)?", answer):
        raise ValueError(answer)
    return answer


def int_cast(text):
    return str(int(after_marker(text).replace(",", "").replace("$", "").strip()))


def lenient(text):
    return extract_hash_answer(text) if "####" in str(text) else ""


def digits_only(text):
    return re.findall(r"\d+", after_marker(text).replace(",", ""))[-1]


def last_marker(text):
    if not isinstance(text, str):
        raise TypeError("not a string")
    return extract_hash_answer("#### " + text.rsplit("####", 1)[1])


def as_float(text):
    return str(float(extract_hash_answer(text)))


def keeps_the_dollar(text):
    return after_marker(text).replace(",", "").strip()


def _marked_once(text):
    if not isinstance(text, str):
        raise TypeError("not a string")
    if text.count("####") != 1:
        raise ValueError("one '####'")
    return after_marker(text).replace(",", "").replace("$", "").strip()


def searches_not_fullmatch(text):  # re.search: "12 apples" reads as 12, "1e3" as 1
    match = re.search(r"-?\d+(\.\d+)?", _marked_once(text))
    if not match:
        raise ValueError(text)
    return match.group()


def validates_with_float(text):  # float() accepts nan, inf, 1e3 and 1_000
    answer = _marked_once(text)
    float(answer)
    return answer


def match_not_fullmatch(text):  # re.match anchors the start only
    answer = _marked_once(text)
    if not re.match(r"-?\d+(\.\d+)?", answer):
        raise ValueError(answer)
    return answer


def first_word(text):  # the first word after the marker
    answer = _marked_once(text).split()
    if not answer or not re.fullmatch(r"-?\d+(\.\d+)?", answer[0]):
        raise ValueError(text)
    return answer[0]


def no_negatives(text):
    answer = _marked_once(text)
    if not re.fullmatch(r"\d+(\.\d+)?", answer):
        raise ValueError(answer)
    return answer


LOOSE_PARSERS = [searches_not_fullmatch, validates_with_float, match_not_fullmatch, first_word]
WRONG_PARSERS = [one_liner, keeps_the_comma, int_cast, lenient, digits_only, last_marker, as_float, keeps_the_dollar,
                 *LOOSE_PARSERS, no_negatives]


@pytest.mark.parametrize(
    ("parser", "case"),
    [
        (searches_not_fullmatch, "a number followed by words"),
        (searches_not_fullmatch, "an exponent"),
        (validates_with_float, "not a number (nan)"),
        (validates_with_float, "an exponent"),
        (validates_with_float, "an underscore between digits"),
        (match_not_fullmatch, "a number followed by words"),
        (first_word, "two numbers"),
        (no_negatives, "a negative decimal with a thousands separator"),
    ],
)
def test_02_1_a_loose_parser_is_shown_the_form_it_reads_wrongly(parser, case, gsm8k_train):
    differences = nb02.compare_with_reference(parser, extract_hash_answer, nb02.answer_cases(gsm8k_train))
    assert case in {difference.label for difference in differences}


def test_02_1_solution_passes_and_is_handed_back(gsm8k_train, capsys):
    solution = exercise("02", "extract_hash_answer")
    assert nb02.check_02_extract_hash_answer(solution, gsm8k_train) is solution
    out = capsys.readouterr().out
    assert "✅ 02.1 extract_hash_answer" in out and "continues with yours" in out


def test_02_1_stub_reads_not_answered_and_the_reference_takes_over(gsm8k_train, capsys):
    stub = exercise("02", "extract_hash_answer", copy="notebooks")
    assert nb02.check_02_extract_hash_answer(stub, gsm8k_train) is extract_hash_answer
    out = capsys.readouterr().out
    assert "⏳ 02.1 extract_hash_answer: not answered yet" in out
    assert "continues with the package's course_utils.lesson.formatting.extract_hash_answer" in out


@pytest.mark.parametrize("wrong", WRONG_PARSERS, ids=lambda f: f.__name__)
def test_02_1_wrong_parsers_fail(wrong, gsm8k_train, capsys):
    assert nb02.check_02_extract_hash_answer(wrong, gsm8k_train) is extract_hash_answer
    assert "❌ 02.1 extract_hash_answer: differs from the reference" in capsys.readouterr().out


def test_02_1_names_what_differs(gsm8k_train, capsys):
    nb02.check_02_extract_hash_answer(keeps_the_comma, gsm8k_train)
    assert "the reference returns '1080', yours returns '1,080'" in capsys.readouterr().out
    nb02.check_02_extract_hash_answer(int_cast, gsm8k_train)
    assert "decimal answer: the reference returns '2.5', yours raises ValueError" in capsys.readouterr().out


def test_02_1_a_right_parser_refusing_with_another_error_of_the_family_passes(gsm8k_train):
    def no_type_check(text):  # None.count raises AttributeError where the reference raises TypeError
        if text.count("####") != 1:
            raise ValueError("one '####'")
        return extract_hash_answer(text)

    assert nb02.check_02_extract_hash_answer(no_type_check, gsm8k_train) is no_type_check


def test_the_parser_demonstration_prints_no_verdict(gsm8k_train, capsys):
    assert nb02.show_parser_differences(one_liner, gsm8k_train) > 0
    out = capsys.readouterr().out
    assert "one_liner differs from the reference on" in out and not VERDICT.search(out)


def test_case_banks_hold_real_rows_and_edge_cases(gsm8k_train):
    cases = nb02.answer_cases(gsm8k_train)
    real = [c for c in cases if c.label.startswith("row ")]
    assert len(real) >= 20 and len(cases) == len(real) + len(nb02.ANSWER_EDGE_CASES)
    assert any("," in c.args[0].rsplit("####", 1)[-1] for c in real)  # rows one-liners get wrong are included
    assert len(nb02.row_cases(gsm8k_train)) == len(gsm8k_train) + len(nb02.ROW_EDGE_CASES)


# --- 02.2 build_prompt ----------------------------------------------------------------------------------------------


def swapped_roles(question, system_prompt=SYSTEM_PROMPT):
    return build_prompt(question, system_prompt)[::-1]


def unstripped(question, system_prompt=SYSTEM_PROMPT):
    if not isinstance(question, str) or not question.strip():
        raise ValueError("empty question")
    return [{"role": "system", "content": system_prompt}, {"role": "user", "content": question}]


def collapses_inner_text(question, system_prompt=SYSTEM_PROMPT):
    return build_prompt(" ".join(str(question).split()) or None, system_prompt)


def ignores_the_system_prompt(question, system_prompt=SYSTEM_PROMPT):
    return build_prompt(question)


def accepts_empty(question, system_prompt=SYSTEM_PROMPT):
    return [{"role": "system", "content": system_prompt}, {"role": "user", "content": str(question).strip()}]


def one_user_message(question, system_prompt=SYSTEM_PROMPT):
    return [{"role": "user", "content": f"{system_prompt}\n\n{build_prompt(question)[1]['content']}"}]


WRONG_PROMPTS = [
    swapped_roles,
    unstripped,
    collapses_inner_text,
    ignores_the_system_prompt,
    accepts_empty,
    one_user_message,
]


def test_02_2_solution_passes_and_is_handed_back(gsm8k_train, capsys):
    solution = exercise("02", "build_prompt")
    assert nb02.check_02_build_prompt(solution, gsm8k_train) is solution
    assert "✅ 02.2 build_prompt" in capsys.readouterr().out


def test_02_2_stub_reads_not_answered_and_the_reference_takes_over(gsm8k_train, capsys):
    stub = exercise("02", "build_prompt", copy="notebooks")
    assert nb02.check_02_build_prompt(stub, gsm8k_train) is build_prompt
    out = capsys.readouterr().out
    assert "⏳ 02.2 build_prompt: not answered yet" in out and "lesson.formatting.build_prompt" in out


@pytest.mark.parametrize("wrong", WRONG_PROMPTS, ids=lambda f: f.__name__)
def test_02_2_wrong_prompts_fail(wrong, gsm8k_train, capsys):
    assert nb02.check_02_build_prompt(wrong, gsm8k_train) is build_prompt
    assert "❌ 02.2 build_prompt: differs from the reference" in capsys.readouterr().out


def test_02_2_swapped_roles_are_named(gsm8k_train, capsys):
    nb02.check_02_build_prompt(swapped_roles, gsm8k_train)
    assert "at [0]['role']: the reference returns 'system', yours returns 'user'" in capsys.readouterr().out


def test_02_2_a_type_error_for_a_missing_question_passes(gsm8k_train):
    def strict(question, system_prompt=SYSTEM_PROMPT):
        if not isinstance(question, str):
            raise TypeError("question must be a string")
        return build_prompt(question, system_prompt)

    assert nb02.check_02_build_prompt(strict, gsm8k_train) is strict


# --- 02.3 to_grpo_row -----------------------------------------------------------------------------------------------


def forgets_answer(row):
    return {"prompt": build_prompt(row["question"])}


def keeps_the_raw_answer(row):
    return {"prompt": build_prompt(row["question"]), "answer": row["answer"]}


def swapped_roles_row(row):
    return {"prompt": swapped_roles(row["question"]), "answer": extract_hash_answer(row["answer"])}


def prompt_as_text(row):
    return {"prompt": row["question"].strip(), "answer": extract_hash_answer(row["answer"])}


def answer_as_number(row):
    return {"prompt": build_prompt(row["question"]), "answer": float(extract_hash_answer(row["answer"]))}


def one_liner_answer(row):
    return {"prompt": build_prompt(row["question"]), "answer": one_liner(row["answer"])}


WRONG_ROWS = [
    forgets_answer,
    keeps_the_raw_answer,
    swapped_roles_row,
    prompt_as_text,
    answer_as_number,
    one_liner_answer,
]


def test_02_3_solution_passes_and_is_handed_back(gsm8k_train, capsys):
    solution = exercise("02", "to_grpo_row", build_prompt=build_prompt, extract_hash_answer=extract_hash_answer)
    assert nb02.check_02_mapping(solution, gsm8k_train) is solution
    out = capsys.readouterr().out
    assert f"✅ 02.3 to_grpo_row: same result as the reference on all {len(gsm8k_train) + 3} cases" in out


def test_02_3_stub_reads_not_answered_and_the_reference_takes_over(gsm8k_train, capsys):
    stub = exercise("02", "to_grpo_row", copy="notebooks")
    assert nb02.check_02_mapping(stub, gsm8k_train) is format_row
    out = capsys.readouterr().out
    assert "⏳ 02.3 to_grpo_row: not answered yet" in out and "lesson.formatting.format_row" in out


@pytest.mark.parametrize("wrong", WRONG_ROWS, ids=lambda f: f.__name__)
def test_02_3_wrong_row_functions_fail(wrong, gsm8k_train, capsys):
    assert nb02.check_02_mapping(wrong, gsm8k_train) is format_row
    assert "❌ 02.3 to_grpo_row: differs from the reference" in capsys.readouterr().out


def test_02_3_a_forgotten_answer_is_named_and_extra_columns_pass(gsm8k_train, capsys):
    nb02.check_02_mapping(forgets_answer, gsm8k_train)
    named = "row 0, at ['answer']: the reference returns '72', yours returns <no 'answer' key>"
    assert named in capsys.readouterr().out

    def with_reasoning(row):
        return {**format_row(row), "source": "gsm8k"}  # every column format_row makes, and one more

    assert nb02.check_02_mapping(with_reasoning, gsm8k_train) is with_reasoning


def test_02_3_what_the_notebook_continues_with_maps_the_dataset(gsm8k_train):
    rows = gsm8k_train.select(range(8))
    mapped = rows.map(format_row)
    assert mapped["answer"][0] == "72" and mapped["prompt"][0][0]["role"] == "system"


# --- 02.4 to 02.6: values -------------------------------------------------------------------------------------------


@pytest.fixture()
def stats():
    """Reasoning lengths 1..100 and a 20-token wrapper: 110 tokens fit nine in ten solutions; 137 is a quarter more."""
    return TokenLengthStats(prompt_lengths=[50] * 100, reasoning_lengths=list(range(1, 101)), xml_overhead=20)


def solved_values(dataset, stats):
    pitfalls = pd.DataFrame(pitfall_report(dataset))
    return [exercise("02", f"answer_{i}", pitfalls=pitfalls, stats=stats) for i in (1, 2, 3)]


def test_02_4_to_02_6_solutions_pass(gsm8k_train, stats, capsys):
    answer_1, answer_2, answer_3 = solved_values(gsm8k_train, stats)
    assert nb02.check_02_gold_answer(answer_1)
    assert nb02.check_02_rows_lost(answer_2, gsm8k_train)
    assert nb02.check_02_completion_length(answer_3, stats)
    out = capsys.readouterr().out
    assert all(f"✅ 02.{n}" in out for n in (4, 5, 6))


def test_02_4_to_02_6_stubs_read_not_answered(gsm8k_train, stats, capsys):
    stubs = [exercise("02", f"answer_{i}", copy="notebooks") for i in (1, 2, 3)]
    assert stubs == [None, None, None]
    assert not nb02.check_02_gold_answer(None)
    assert not nb02.check_02_rows_lost(None, gsm8k_train)
    assert not nb02.check_02_completion_length(None, stats)
    out = capsys.readouterr().out
    assert all(f"⏳ 02.{n}" in out for n in (4, 5, 6))


@pytest.mark.parametrize("wrong", ["$1,250", "1,250", 1250, "1250 ", "1250.0"])
def test_02_4_wrong_gold_answers_fail(wrong, capsys):
    assert not nb02.check_02_gold_answer(wrong)
    assert "❌ 02.4" in capsys.readouterr().out


def test_02_5_wrong_counts_fail(gsm8k_train, capsys):
    lost = len(pitfall_outcomes("int_cast", list(gsm8k_train["answer"]))["lost"])
    wrong = [lost + 1, lost - 1, 0, len(gsm8k_train), "many"]  # off by one, none, every row, not a number
    for answer in wrong:
        assert not nb02.check_02_rows_lost(answer, gsm8k_train), answer
    assert capsys.readouterr().out.count("❌ 02.5") == len(wrong)


# no wrapper, the median, past a quarter more, twice, tiny, not a number
@pytest.mark.parametrize("wrong", [100, 70, 138, 220, 1, "many"])
def test_02_6_wrong_lengths_fail(wrong, stats, capsys):
    assert not nb02.check_02_completion_length(wrong, stats)
    assert "❌ 02.6" in capsys.readouterr().out


@pytest.mark.parametrize("wrong", ["128", 128.0, True, "110 tokens"])
def test_02_6_a_length_of_the_wrong_kind_fails_and_says_an_int_was_expected(wrong, stats, capsys):
    assert not nb02.check_02_completion_length(wrong, stats)
    assert "a whole number of tokens was expected (an int)" in capsys.readouterr().out


def test_02_5_a_count_as_a_string_fails(gsm8k_train, capsys):
    lost = len(pitfall_outcomes("int_cast", list(gsm8k_train["answer"]))["lost"])
    assert nb02.check_02_rows_lost(lost, gsm8k_train)
    assert not nb02.check_02_rows_lost(str(lost), gsm8k_train)
    assert "a number was expected" in capsys.readouterr().out


# --- 02.7 split_solution --------------------------------------------------------------------------------------------


def validates_first(text):  # the right answer: TypeError on None where splitting first gives AttributeError
    if not isinstance(text, str):
        raise TypeError("text must be a string")
    return text.split("####")[0].strip(), extract_hash_answer(text)


def splits_first(text):
    return text.split("####")[0].strip(), extract_hash_answer(text)


def split_one_liner(text):
    return tuple(text.split("####"))


def split_keeping_the_comma(text):
    return text.split("####")[0].strip(), keeps_the_comma(text)


def reasoning_unstripped(text):
    return text.split("####")[0], extract_hash_answer(text)


def split_swapped(text):
    return extract_hash_answer(text), text.split("####")[0].strip()


def split_int_answer(text):
    return text.split("####")[0].strip(), int_cast(text)


def split_without_validation(text):
    reasoning, _, answer = text.partition("####")
    return reasoning.strip(), answer.replace(",", "").replace("$", "").strip()


WRONG_SPLITS = [
    split_one_liner,
    split_keeping_the_comma,
    reasoning_unstripped,
    split_swapped,
    split_int_answer,
    split_without_validation,
]


def test_02_7_solution_passes_and_is_handed_back(gsm8k_train, capsys):
    solution = exercise("02", "split_solution", extract_hash_answer=extract_hash_answer)
    assert nb02.check_02_split_solution(solution, gsm8k_train) is solution
    assert "✅ 02.7 split_solution" in capsys.readouterr().out


def test_02_7_stub_reads_not_answered_and_the_reference_takes_over(gsm8k_train, capsys):
    stub = exercise("02", "split_solution", copy="notebooks")
    assert nb02.check_02_split_solution(stub, gsm8k_train) is nb02.split_solution_reference
    assert "⏳ 02.7 split_solution: not answered yet" in capsys.readouterr().out


@pytest.mark.parametrize("right", [validates_first, splits_first], ids=lambda f: f.__name__)
def test_02_7_refusing_none_with_type_or_attribute_error_passes(right, gsm8k_train, capsys):
    assert nb02.check_02_split_solution(right, gsm8k_train) is right
    assert "✅ 02.7" in capsys.readouterr().out


@pytest.mark.parametrize("wrong", WRONG_SPLITS, ids=lambda f: f.__name__)
def test_02_7_wrong_splits_fail(wrong, gsm8k_train, capsys):
    assert nb02.check_02_split_solution(wrong, gsm8k_train) is nb02.split_solution_reference
    assert "❌ 02.7 split_solution: differs from the reference" in capsys.readouterr().out


# --- the hints ------------------------------------------------------------------------------------------------------


def test_the_hints_point_the_way_without_the_code():
    hints = [nb02.EXTRACT_HINT, nb02.PROMPT_HINT, nb02.MAPPING_HINT, nb02.SPLIT_HINT]
    for code in ("'role': 'system'", "{'prompt'", ".split(", ".replace(", ".strip()", r"\d", "[1]", "fullmatch"):
        assert not any(code in hint for hint in hints), code


def test_an_untouched_stub_is_read_as_unanswered():
    for name in ("extract_hash_answer", "build_prompt", "to_grpo_row", "split_solution"):
        assert is_unanswered(exercise("02", name, copy="notebooks")), name


# the 90th percentile with the wrapper, as a numpy int, to a multiple of 16, to a power of two, a quarter more
@pytest.mark.parametrize("right", [110, np.int64(110), 112, 128, 137])
def test_02_6_lengths_that_fit_nine_in_ten_pass(right, stats, capsys):
    assert nb02.check_02_completion_length(right, stats), capsys.readouterr().out


@pytest.mark.parametrize(("needed", "longest"), [(107, 133), (110, 137), (129, 256), (228, 285), (256, 320)])
def test_02_6_the_longest_length_accepted_rounds_up_by_a_quarter_or_to_a_power_of_two(needed, longest):
    assert nb02.longest_accepted_length(needed) == longest


@pytest.fixture(scope="module")
def course_tokenizer():
    from course_utils.lesson.models import load_tokenizer

    return load_tokenizer("ci")


def _character_lengths(rows) -> dict[str, int]:
    """What a learner who measured characters, not tokens, answers: the 90th percentile, with the wrapper or not."""
    chars = [len(extract_reasoning(answer)) for answer in rows["answer"]]
    return {f"{method}{wrapper}": int(np.percentile(chars, 90, method=method)) + extra
            for method in ("linear", "higher") for wrapper, extra in (("", 0), (" + wrapper", len(XML_WRAPPER)))}


XML_WRAPPER = XML_TEMPLATE.format(reasoning="", answer="")


def _bundled_sample_train() -> Dataset:
    """The rows ``load_gsm8k("train")`` gives with no GSM8K folder and no Hub: what an offline learner measures."""
    rows = [json.loads(line) for line in sample_path().read_text().splitlines() if line.strip()]
    return Dataset.from_list([{"question": r["question"], "answer": r["answer"]} for r in rows[:-SAMPLE_TEST_ROWS]])


@pytest.mark.parametrize("rows", ["the bundled sample", "48 real rows", "500 real rows"])
def test_02_6_the_90th_percentile_of_characters_fails_on_real_solutions(rows, gsm8k_train, course_tokenizer,
                                                                        capsys):
    """About two characters a token: what a reference needs, counted in characters, is far more than a quarter over."""
    data = {"the bundled sample": _bundled_sample_train,
            "48 real rows": lambda: gsm8k_train.select(range(48)),
            "500 real rows": lambda: gsm8k_train.select(range(500))}[rows]()
    stats = token_length_stats(data, course_tokenizer)
    right = stats.percentile("reasoning", 90) + stats.xml_overhead
    assert nb02.check_02_completion_length(right, stats), capsys.readouterr().out
    assert nb02.check_02_completion_length(recommended_completion_length(stats), stats), capsys.readouterr().out
    for how, wrong in _character_lengths(data).items():
        assert not nb02.check_02_completion_length(wrong, stats), (how, wrong, right)
        assert "❌ 02.6" in capsys.readouterr().out


def fills_the_row_in_place(row):
    """A Dataset.map function may fill in the row it is given and return it: map hands each call a fresh row."""
    row["prompt"] = nb02.build_prompt(row["question"])
    row["answer"] = nb02.extract_hash_answer(row["answer"])
    return row


def test_02_3_a_map_function_that_fills_its_row_in_place_passes(gsm8k_train, capsys):
    rows = gsm8k_train.select(range(20))
    assert nb02.check_02_mapping(fills_the_row_in_place, rows) is fills_the_row_in_place, capsys.readouterr().out
