"""Notebook 07 (GRPO variants): one variant written as ``GRPOConfig`` fields, and the noise rule.

The exercises, in the notebook's order: 07.1 DAPO's clip-higher as ``GRPOConfig`` fields (judged on the real
config it makes, next to the ``two_iterations`` run it is compared with; hands back the learner's fields or
``variants.VARIANTS["clip_higher"]``), 07.2 GDPO's ``normalize_then_sum`` advantages (against
``multi_reward.gdpo_advantages``, which follows TRL; hands back the learner's function or it), then at the end
07.3 and 07.4 (values) and 07.5 ``non_overlapping``.
"""

from __future__ import annotations

import numbers
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from course_utils.core.profiles import Profile
from course_utils.evaluation.variant_tables import real_difference
from course_utils.evaluation.variants import variant_fields
from course_utils.exercises.comparison import Case, check_against_reference
from course_utils.exercises.verdicts import hand_back, list_problems, report, report_name, shown
from course_utils.lesson.multi_reward import gdpo_advantages
from course_utils.lesson.rewards import DEFAULT_WEIGHTS, REWARD_FUNCS
from course_utils.training.grpo_config import make_grpo_config

CLIP_HIGHER = "07.1 clip-higher as GRPOConfig fields"
GDPO = "07.2 GDPO's normalise-then-sum"
OFF_POLICY_FIELD = "07.3 the off-policy switch"
CONSTANT_NORMALISER = "07.4 the length-unbiased constant"
NON_OVERLAPPING = "07.5 non-overlapping or noise"

# The run clip-higher is compared with: the same off-policy updates, the symmetric clip.
COMPARED_WITH = "two_iterations"
# Fields that change what is logged or saved, never what is trained: any value passes.
LOGGING_PREFIXES = ("log", "report_to", "run_name", "output_dir", "save_", "num_completions_to_print", "push_to_hub")
LOGGING_PREFIXES += ("hub_", "disable_tqdm")
# The largest upper bound that is still a clip: the ratio may grow to 1 + epsilon_high.
MAX_EPSILON_HIGH = 1.0

GDPO_HINT = (
    "per group and per reward: subtract the group's mean and divide by its standard deviation (n - 1, as TRL's "
    "nanstd) plus 1e-4; then the weighted sum per completion; then the same normalisation over the whole batch"
)
CLIP_HIGHER_HINT = (
    "clip-higher loosens only the upper end of the ratio's clip range (TRL has a field for that end alone); "
    "everything else stays as in the two_iterations run, which is off-policy: on-policy nothing is ever clipped"
)
# Either field makes a generation batch serve several optimizer updates, so the ratio moves away from 1:
# num_iterations (μ) reuses each batch, steps_per_generation spreads one batch over several steps.
OFF_POLICY_FIELDS = {"num_iterations", "steps_per_generation"}
OFF_POLICY_HINT = "on-policy every ratio is 1; the field that reuses each generation batch for several updates (μ)"
CONSTANT_HINT = "the variant named after the paper that diagnosed GRPO's length bias (read TRL's loss_type help)"
NON_OVERLAPPING_HINT = (
    "every seed of one variant beats every seed of the other (strictly: a tie overlaps), in either direction; "
    "fewer than 2 seeds on a side says nothing; return a bool, True or False"
)


# Completions as the course's five rewards see them: right and formatted, formatted and wrong, right in prose,
# no format at all. Their reward rows are the real cases of 07.2.
HONEST = "<reasoning>\n40 * 25 = 1000\n</reasoning>\n<answer>\n1000\n</answer>"
WRONG = "<reasoning>\n40 + 25 = 65\n</reasoning>\n<answer>\n65\n</answer>"
PROSE = "40 times 25 is 1000, so the answer is 1000."
RAMBLING = "<reasoning>\n" + "Let us think about this carefully. " * 8


def _trains_the_same(field: str) -> bool:
    return field.startswith(LOGGING_PREFIXES)


def _field_reason(field: str, yours: Any, theirs: Any) -> str:
    """Why a field that differs from the two_iterations run makes the comparison about something else."""
    if field == "num_iterations":
        why = (
            "on-policy (1) the ratio is 1 and nothing is ever clipped"
            if yours == 1
            else f"{COMPARED_WITH} reuses each batch {theirs} times; the comparison must differ in the clip only"
        )
    elif field == "epsilon":
        why = "that moves the lower end too; clip-higher raises the upper end only"
    else:
        why = f"it changes training beyond the clip, so the comparison with {COMPARED_WITH} would not isolate it"
    return f"{field}: yours {shown(yours)}, {COMPARED_WITH} {shown(theirs)}: {why}"


def _clip_problems(config: Any) -> list[str]:
    """What keeps the config's clip range from being clip-higher, in words."""
    epsilon, high = config.epsilon, config.epsilon_high
    if high is None:
        return [f"epsilon_high is not set, so the upper end is epsilon ({epsilon}): the clip is symmetric"]
    if isinstance(high, bool) or not isinstance(high, numbers.Real):
        return [f"epsilon_high is {shown(high)}, not a number"]
    if high <= epsilon:
        return [f"epsilon_high {high} is not above epsilon {epsilon}: the upper end is no looser than the lower"]
    if high > MAX_EPSILON_HIGH:
        return [f"epsilon_high {high}: a ratio may grow {1 + high:g} times before clipping, which is no clip at all"]
    return []


def clip_higher_problems(fields: Any, profile: Profile | str | None = None) -> list[str]:
    """What keeps ``fields`` from being DAPO's clip-higher next to ``two_iterations``; empty when nothing does.

    Judged on the real ``GRPOConfig`` (``make_grpo_config``): the fields exist, the upper clip is looser
    than the lower, and every other field that changes training is as in the ``two_iterations`` run.
    """
    if not isinstance(fields, Mapping):
        return [f"expected a dict of GRPOConfig fields, got {type(fields).__name__} {shown(fields)}"]
    folder = Path(tempfile.gettempdir()) / "07-clip-higher-check"
    try:
        config = make_grpo_config(profile, folder, **dict(fields))
        baseline = make_grpo_config(profile, folder, **variant_fields(COMPARED_WITH))
    except Exception as error:  # an unknown field or a value GRPOConfig refuses: the learner's mistake, in words
        return [f"GRPOConfig refuses it: {type(error).__name__}: {' '.join(str(error).split())[:160]}"]
    yours, theirs = config.to_dict(), baseline.to_dict()
    differing = [f for f in theirs if f != "epsilon_high" and not _trains_the_same(f) and yours[f] != theirs[f]]
    return _clip_problems(config) + [_field_reason(f, yours[f], theirs[f]) for f in differing]


def check_07_clip_higher(fields: Any, profile: Profile | str | None = None) -> Any:
    """07.1: the learner's clip-higher fields, on the real ``GRPOConfig``; hands back theirs or the package's."""
    reference, name = variant_fields("clip_higher"), "variants.VARIANTS['clip_higher']"
    if fields is None or fields is Ellipsis:
        report(CLIP_HIGHER, False, CLIP_HIGHER_HINT, None)
        return hand_back(CLIP_HIGHER, False, fields, reference, name)
    try:
        problems = clip_higher_problems(fields, profile)
    except Exception as error:  # a value no comparison can read: a verdict, never a crash
        problems = [f"could not be read: {type(error).__name__}: {' '.join(str(error).split())[:120]}"]
    if problems:
        list_problems(CLIP_HIGHER, "not yet", problems[:4], CLIP_HIGHER_HINT)
    else:
        print(f"✅ {CLIP_HIGHER}: a looser upper clip, off-policy, and otherwise the {COMPARED_WITH} run.")
    return hand_back(CLIP_HIGHER, not problems, fields, reference, name)


def check_07_off_policy_field(answer: Any) -> bool:
    """07.3: which ``GRPOConfig`` field, set to 2, makes GSPO's sequence ratio (and clip-higher) change anything?"""
    return report_name(OFF_POLICY_FIELD, answer, OFF_POLICY_FIELDS, OFF_POLICY_HINT)


def check_07_constant_normaliser(answer: Any) -> bool:
    """07.4: which ``loss_type`` divides the summed token losses by a constant (``max_completion_length``)?"""
    return report_name(CONSTANT_NORMALISER, answer, {"dr_grpo"}, CONSTANT_HINT)


def difference_cases() -> list[Case]:
    """Per-seed values of two variants: clear gaps both ways, overlaps, ties, single seeds, three seeds."""
    pairs = [
        ([0.9, 1.0], [0.4, 0.5]),
        ([0.4, 0.5], [0.9, 1.0]),
        ([0.4, 0.9], [0.5, 0.6]),
        ([0.5, 0.6], [0.6, 0.7]),
        ([0.6, 0.7], [0.5, 0.6]),
        ([0.5, 0.5], [0.5, 0.5]),
        ([1.0], [0.0]),
        ([1.0, 1.1], [0.0]),
        ([0.1, 0.2, 0.3], [0.31, 0.5, 0.4]),
        ([0.1, 0.2, 0.35], [0.31, 0.5, 0.4]),
        ([0.02, 0.0], [0.04, 0.06]),
        ([0.0, 1.0], [1.01, 1.02]),
    ]
    return [Case(f"{a} vs {b}", (a, b)) for a, b in pairs]


def same_verdict(expected: bool, got: Any) -> bool:
    """A verdict is a bool (numpy's too): ``1`` for True is a number, not an answer to "is it non-overlapping?"."""
    return isinstance(got, (bool, np.bool_)) and bool(got) == expected


def check_07_non_overlapping(learner: Any) -> bool:
    """07.5: the learner's ``non_overlapping(first, second)`` against the course's noise rule."""
    return check_against_reference(
        NON_OVERLAPPING, learner, real_difference, difference_cases(), hint=NON_OVERLAPPING_HINT, same=same_verdict
    )


# --- 07.2: GDPO's advantages ----------------------------------------------------------------------------


def course_reward_rows(completions: list[str], gold: str) -> np.ndarray:
    """The course's five rewards of each completion: one row a completion, one column a reward function."""
    golds = [gold] * len(completions)
    return np.array([func(prompts=None, completions=completions, answer=golds) for func in REWARD_FUNCS]).T


def gdpo_cases() -> list[Case]:
    """Rewards on different scales, a reward constant in its group, two groups, pairs, zero and tuned weights."""
    equal, tuned = list(DEFAULT_WEIGHTS["initial"]), list(DEFAULT_WEIGHTS["tuned"])
    group = course_reward_rows([HONEST, HONEST, WRONG, PROSE], "1000")
    two_groups = np.vstack([group, course_reward_rows([WRONG, RAMBLING, HONEST, WRONG], "1000")])
    same_group = np.vstack([group, course_reward_rows([HONEST] * 4, "1000")])
    scales = [[2.0, 0.1], [0.0, 0.5], [2.0, 0.3], [0.0, 0.2]]
    return [
        Case("the course's rewards, one group of 4, equal weights", (group, equal, 4)),
        Case("the same group, the tuned weights", (group, tuned, 4)),
        Case("two groups of 4, equal weights", (two_groups, equal, 4)),
        Case("a group whose completions all earn the same (each reward constant)", (same_group, tuned, 4)),
        Case("two rewards, scales 2.0 and 0.5, as lists", (scales, [1.0, 1.0], 4)),
        Case("the same, the second reward weighted 0", (scales, [1.0, 0.0], 4)),
        Case("pairs, as notebook 04's ci run groups them", (two_groups, tuned, 2)),
    ]


def same_advantages(expected: Any, got: Any) -> bool:
    """One finite advantage per completion, as the reference's within 1e-5 (a list of numbers counts)."""
    try:
        values = np.asarray(got, dtype=float)
    except (TypeError, ValueError):
        return False
    if values.shape != np.shape(expected) or not np.isfinite(values).all():
        return False
    return bool(np.allclose(values, expected, rtol=1e-4, atol=1e-5))


def check_07_gdpo(learner: Any) -> Any:
    """07.2: the learner's ``normalize_then_sum(rewards, weights, group_size)`` against ``gdpo_advantages``.

    Hands back the learner's function when it agrees on every case, else ``gdpo_advantages``, so the next cells,
    which set it beside the advantages TRL logged, run either way.
    """
    passed = check_against_reference(GDPO, learner, gdpo_advantages, gdpo_cases(), hint=GDPO_HINT, same=same_advantages)
    return hand_back(GDPO, passed, learner, gdpo_advantages, "multi_reward.gdpo_advantages")
