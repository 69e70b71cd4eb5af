"""Notebook 02's checks: parsing, prompts, the dataset mapping, on real GSM8K rows."""

from __future__ import annotations

import re

from course_utils.core.answer_format import SYSTEM_PROMPT
from course_utils.exercises import nb02_gsm8k_data as nb02

# --- 02: the learner's parser, prompt and mapping against course_utils.lesson.formatting ---------------------------


def learner_extract(text):
    if not isinstance(text, str):
        raise TypeError("text must be a string")
    if text.count("####") != 1:
        raise ValueError("expected exactly one '####'")
    answer = text.split("####")[1].replace(",", "").replace("$", "").strip()
    if not re.fullmatch(r"-?\d+(\.\d+)?", answer):
        raise ValueError(f"{answer!r} is not a number")
    return answer


def learner_prompt(question, system_prompt=SYSTEM_PROMPT):
    if not isinstance(question, str) or not question.strip():
        raise ValueError("question must be a non-empty string")
    return [{"role": "system", "content": system_prompt}, {"role": "user", "content": question.strip()}]


def learner_row(row):
    return {"prompt": learner_prompt(row["question"]), "answer": learner_extract(row["answer"])}




def test_case_banks_hold_real_rows_and_edge_cases(gsm8k_train):
    cases = nb02.answer_cases(gsm8k_train)
    real = [c for c in cases if c.label.startswith("row ")]
    assert len(real) >= 20 and len(cases) == len(real) + len(nb02.ANSWER_EDGE_CASES)
    assert any("," in c.args[0].rsplit("####", 1)[-1] for c in real)  # rows one-liners get wrong are included


def test_check_02_extract_hash_answer(gsm8k_train, capsys):
    assert nb02.check_02_extract_hash_answer(learner_extract, gsm8k_train)
    assert not nb02.check_02_extract_hash_answer(lambda text: text.split("####")[1].strip(), gsm8k_train)
    assert "the reference returns '1080', yours returns '1,080'" in capsys.readouterr().out
    lenient = lambda text: learner_extract(text) if "####" in str(text) else ""  # noqa: E731
    assert not nb02.check_02_extract_hash_answer(lenient, gsm8k_train)


def test_check_02_build_prompt(gsm8k_train):
    assert nb02.check_02_build_prompt(learner_prompt, gsm8k_train)
    assert not nb02.check_02_build_prompt(lambda q, s=SYSTEM_PROMPT: learner_prompt(q, s)[::-1], gsm8k_train)
    unstripped = lambda q, s=SYSTEM_PROMPT: [{"role": "system", "content": s}, {"role": "user", "content": q}]  # noqa: E731
    assert not nb02.check_02_build_prompt(unstripped, gsm8k_train)


def test_check_02_mapping(gsm8k_train):
    mapped = gsm8k_train.map(learner_row)
    assert nb02.check_02_mapping(learner_row, mapped, gsm8k_train)
    assert not nb02.check_02_mapping(learner_row, mapped.select(range(10)), gsm8k_train)
    assert not nb02.check_02_mapping(learner_row, None, gsm8k_train)
    no_prompt = lambda row: {"answer": learner_extract(row["answer"])}  # noqa: E731
    assert not nb02.check_02_mapping(no_prompt, mapped, gsm8k_train)


def test_check_02_split_solution(gsm8k_train):
    def split_solution(text):
        return text.split("####")[0].strip(), learner_extract(text)

    assert nb02.check_02_split_solution(split_solution, gsm8k_train)
    assert not nb02.check_02_split_solution(lambda text: tuple(text.split("####")), gsm8k_train)
