"""The answer format has one home: the prompt asks for it, the warm start writes it, the rewards accept it."""

from __future__ import annotations

import pytest

from course_utils.core import answer_format as fmt
from course_utils.lesson import rewards
from course_utils.training.warm_start import warm_start_target


def test_system_prompt_shows_the_template_with_placeholders():
    layout = "<reasoning>\n...\n</reasoning>\n<answer>\n...\n</answer>"
    assert f"Respond in the following format:\n{layout}" == fmt.SYSTEM_PROMPT


def test_a_formatted_answer_is_the_strict_format_and_reads_back():
    text = fmt.format_answer("6 * 7 = 42\nso 42", "42")
    assert [text.count(tag) for tag in fmt.TAGS] == [1, 1, 1, 1]
    assert rewards.is_strict_format(text) and fmt.extract_xml_answer(text) == "42"
    assert rewards.xmlcount_score(text) == 0.5


def test_warm_start_targets_use_the_template():
    assert warm_start_target("6 * 7 = <<6*7=42>>42\n#### 42") == fmt.format_answer("6 * 7 = 42", "42")


@pytest.mark.parametrize(
    ("text", "expected"),
    [("<answer> 7 </answer>", "7"), ("<answer>1</answer><answer>2</answer>", "2"), ("<answer>7", ""), (None, "")],
)
def test_extract_xml_answer_reads_the_last_complete_block(text, expected):
    assert fmt.extract_xml_answer(text) == expected
