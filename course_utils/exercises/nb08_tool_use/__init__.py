"""Notebook 08 (tool use): the checks of the converter, the calculator, the tool-use reward and the trainer.

The exercises, in the notebook's order: 08.1 ``tool_call_trace`` (a GSM8K solution's ``<<expression=result>>``
notes as calculator calls, run next to ``lesson.tool_use.tool_call_trace`` on real rows, the rows whose notes do
not parse, and edge cases), 08.2 ``calculator`` (next to ``lesson.tool_use.calculator`` on arithmetic and a bank
of hostile inputs, each run in a child process that is stopped after a few seconds, so that ``9**9**9`` computed
in full cannot hang the notebook), 08.3 a tool-use reward of the learner's design, judged on what it must not pay
for (calls whose results are not used, calls when the answer is wrong, failed calls, repeated calls) and on
paying for real use, 08.4 ``GRPOTrainer(..., tools=[calculator])``, 08.5 the log column of failed calls. Each
check hands back what the notebook continues with: the learner's version when it passed, else the package's.

The notebook imports its checks from here. Modules: ``trace_check`` (08.1), ``isolated_calls`` (a function run
on inputs in a child process that is stopped when one runs too long, then replayed), ``calculator_check``
(08.2), ``tool_reward_check`` (08.3), ``trainer_check`` (08.4), ``value_questions`` (08.5).
"""

from course_utils.exercises.nb08_tool_use.calculator_check import check_08_calculator
from course_utils.exercises.nb08_tool_use.tool_reward_check import check_08_tool_reward
from course_utils.exercises.nb08_tool_use.trace_check import check_08_trace
from course_utils.exercises.nb08_tool_use.trainer_check import check_08_trainer
from course_utils.exercises.nb08_tool_use.value_questions import check_08_failure_column

__all__ = [
    "check_08_calculator",
    "check_08_failure_column",
    "check_08_tool_reward",
    "check_08_trace",
    "check_08_trainer",
]
