"""03.6 and 03.7, the values asked at the end of notebook 03: what the classic reward gives ``1,000``, and the
flag that lets ``.`` match a newline.
"""

from __future__ import annotations

import re
from typing import Any

from course_utils.exercises.verdicts import report, report_name, report_number
from course_utils.lesson.rewards import classic

CLASSIC_COMMA = "03.6 classic correctness on 1,000"
DOTALL_FLAG = "03.7 regex flag"


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
