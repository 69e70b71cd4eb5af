"""Real GSM8K rows for the case banks: read alike from a Dataset or a list, the rows parsers get wrong included."""

from __future__ import annotations

import ast

import pytest
from datasets import Dataset

from course_utils.exercises import real_rows

ROWS = [
    {"question": "q0", "answer": "3 + 4 = 7\n#### 7"},
    {"question": "q1", "answer": "#### 12"},
    {"question": "q2", "answer": "#### 30"},
    {"question": "q3", "answer": "#### 1,000"},
    {"question": "q4", "answer": "#### -3"},
    {"question": "q5", "answer": "#### $4"},
    {"question": "q6", "answer": "#### 2.5"},
    {"question": "q7", "answer": "#### 8"},
]


@pytest.mark.parametrize("form", [list, Dataset.from_list], ids=["list", "Dataset"])
def test_a_column_and_rows_read_the_same_from_every_form(form):
    data = form(ROWS)
    assert real_rows.dataset_column(data, "question") == [row["question"] for row in ROWS]
    assert real_rows.dataset_rows(data, [3, 0]) == [ROWS[3], ROWS[0]]


def test_real_row_indices_take_the_first_rows_and_the_tricky_answers():
    chosen = real_rows.real_row_indices(ROWS, count=6)
    assert chosen == sorted(chosen) and len(chosen) <= 6
    assert {0, 1, 2} <= set(chosen), "the first count // 2 rows"
    assert {3, 4, 5} <= set(chosen), "a comma, a sign, a dollar: the answers one-line parsers get wrong"
    assert 7 not in chosen


def test_short_repr_keeps_the_end_of_a_long_text_on_one_line():
    assert real_rows.short_repr("a\nb") == "'a b'"
    cut = real_rows.short_repr("word " * 20 + "the end", width=20)
    assert cut.startswith("'...") and cut.endswith("the end'") and len(ast.literal_eval(cut)) == 20


def test_a_missing_column_is_a_key_error():
    with pytest.raises(KeyError):
        real_rows.dataset_rows([{"question": "q"}], [0])
