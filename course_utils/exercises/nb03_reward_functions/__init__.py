"""Notebook 03 (reward functions): the five corrected rewards and the learner's own, called as TRL calls them.

The exercises, in the notebook's order: 03.1 ``correctness_reward_func``, 03.2 ``int_reward_func``,
03.3 ``strict_format_reward_func``, 03.4 ``soft_format_reward_func``, 03.5 ``xmlcount_reward_func`` (each run
next to ``course_utils.lesson.rewards``' corrected version on real GSM8K solutions, the sample bank and edge
cases), then at the end 03.6 and 03.7 (values) and 03.8, a reward of the learner's own, judged on TRL's
contract alone. The reward checks hand back what the notebook continues with: the learner's function when
it passed, else the package's.

The notebook imports its checks from here. Modules: ``trl_calls`` (a reward called as ``GRPOTrainer`` calls it),
``case_banks`` (the cases 03.1-03.5 run on), ``corrected_rewards`` (03.1-03.5), ``value_questions`` (03.6, 03.7),
``own_reward`` (03.8).
"""

from course_utils.exercises.nb03_reward_functions.corrected_rewards import (
    check_03_correctness,
    check_03_int,
    check_03_soft_format,
    check_03_strict_format,
    check_03_xmlcount,
)
from course_utils.exercises.nb03_reward_functions.own_reward import check_03_own_reward
from course_utils.exercises.nb03_reward_functions.value_questions import check_03_classic_comma, check_03_dotall_flag

__all__ = [
    "check_03_classic_comma",
    "check_03_correctness",
    "check_03_dotall_flag",
    "check_03_int",
    "check_03_own_reward",
    "check_03_soft_format",
    "check_03_strict_format",
    "check_03_xmlcount",
]
