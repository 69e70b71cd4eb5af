"""08.5: which log column TRL writes for the share of tool calls that failed."""

from __future__ import annotations

from typing import Any

from course_utils.exercises.verdicts import report_name
from course_utils.lesson.tool_use import TOOL_LOG_COLUMNS


def check_08_failure_column(answer: Any) -> bool:
    """08.5: which log column TRL writes for the share of tool calls that failed."""
    hint = "TRL logs two tools/ columns: calls per completion, and the share of calls that raised"
    return report_name("08.5 failure column", answer, {TOOL_LOG_COLUMNS[1]}, hint)
