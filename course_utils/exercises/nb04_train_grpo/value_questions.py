"""04.5-04.7, the values asked at the end of notebook 04: prompts per optimizer step, the group size's field,
and the monitoring rule a log history fires.
"""

from __future__ import annotations

from typing import Any

from course_utils.exercises.verdicts import report_name, report_number
from course_utils.training.monitoring import monitor


def check_04_prompts_per_step(answer: Any) -> bool:
    """Golden config: batch 8, accumulation 16, num_generations 8: how many distinct prompts per optimizer step?"""
    hint = "completions per step = batch x accumulation; each prompt fills one group of num_generations"
    return report_number("04.5 prompts per step", answer, 8 * 16 / 8, hint)


def check_04_group_size_field(answer: Any) -> bool:
    """Which ``GRPOConfig`` field is the group size (completions sampled per prompt)?"""
    hint = "the field that says how many completions are generated for each prompt; TRL's default is 8"
    return report_name("04.6 group size field", answer, {"num_generations"}, hint)


def check_04_monitoring_rule(answer: Any, log_history: Any) -> bool:
    """Which monitoring rule fires on ``log_history``? (a rule name such as ``"clipped_high"``)."""
    try:
        fired = {finding.code for finding in monitor(log_history)}
    except (TypeError, ValueError) as exc:
        print(f"⚠️ 04.7: could not read the log history ({exc}); pass the one the notebook built.")
        return False
    hint = "run monitor(log_history) and read the rule names, or section 9's table"
    return report_name("04.7 monitoring rule", answer, fired, hint)
