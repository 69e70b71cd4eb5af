"""The checking functions for every notebook's exercises, and the check of a learner's function.

Each check prints a verdict with a hint and returns ``True`` or ``False``; it never raises, so a
notebook with an unanswered exercise still runs top to bottom (in CI too). An unanswered exercise
(``None`` or ``...``) is reported as such, not as wrong.

``check_against_reference`` is the one place where a function the learner wrote in a notebook cell is
run next to the package's reference on a bank of ``Case``s (real GSM8K rows, edge cases, TRL's own
computation) and every difference is printed: the input, what the reference gives, what the learner's
version gives. The notebooks' ``check_NN_...`` functions build their case banks and call it.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import torch
from transformers import TrainerState

from course_utils.core.answer_format import format_answer
from course_utils.core.hardware import native_bf16
from course_utils.core.profiles import get_profile
from course_utils.evaluation.heldout import last_number, wilson_interval
from course_utils.evaluation.variants import real_difference
from course_utils.lesson import rewards
from course_utils.lesson.data import (
    build_prompt,
    extract_hash_answer,
    extract_reasoning,
    format_gsm8k,
    format_row,
    pitfall_outcomes,
)
from course_utils.lesson.grpo import (
    frac_reward_zero_std,
    group_advantages,
    trl_group_advantages,
    trl_loss_case,
    trl_policy_loss,
    trl_reward_values,
    trl_trainer,
)
from course_utils.lesson.rewards import answers_match, classic
from course_utils.lesson.widgets import SAMPLE_BANK
from course_utils.training.memory import OOM_BASE, OOM_FIXES, what_if_table
from course_utils.training.monitoring import THRESHOLDS, WINDOW, flat_reward_cause, monitor
from course_utils.training.preflight import check
from course_utils.training.run import check_generation_batch


def is_unanswered(answer: Any) -> bool:
    """True for the placeholders the notebooks start with (``None`` or ``...``)."""
    return answer is None or answer is Ellipsis


def report(exercise: str, correct: bool, hint: str, answer: Any = None) -> bool:
    """Print the verdict for one exercise and return it."""
    if is_unanswered(answer):
        print(f"⏳ {exercise}: not answered yet. Hint: {hint}")
        return False
    print(f"✅ {exercise}: correct." if correct else f"❌ {exercise}: not yet. Hint: {hint}")
    return bool(correct)


def close_to(answer: Any, expected: float, tolerance: float = 1e-6) -> bool:
    """True when ``answer`` is a number within ``tolerance`` of ``expected`` (False for anything else)."""
    try:
        return abs(float(answer) - expected) <= tolerance
    except (TypeError, ValueError):
        return False


# --- the learner's function against the reference ----------------------------------------------------


@dataclass(frozen=True)
class Case:
    """One input on which the learner's function must give what the reference gives."""

    label: str  # shown when the two differ: say what the case is about ("real row 12", "thousands separator")
    args: tuple[Any, ...]
    reference_args: tuple[Any, ...] | None = None  # the same problem in the form the reference takes, if different


@dataclass(frozen=True)
class Difference:
    """A case where the learner's function and the reference disagree, both outcomes in words."""

    label: str
    reference: str
    yours: str

    def __str__(self) -> str:
        return f"{self.label}: the reference {self.reference}, yours {self.yours}"


def same_values(expected: Any, got: Any, tolerance: float = 1e-5) -> bool:
    """Equal values; tensors and floats within ``tolerance`` (absolute, plus 1e-4 relative), containers item by item."""
    if isinstance(expected, torch.Tensor):
        try:
            got = torch.as_tensor(got, dtype=expected.dtype)
        except (TypeError, ValueError, RuntimeError):
            return False
        return got.shape == expected.shape and torch.allclose(got, expected, rtol=1e-4, atol=tolerance)
    if isinstance(expected, float) and not isinstance(got, bool) and isinstance(got, (int, float)):
        return math.isclose(got, expected, rel_tol=1e-4, abs_tol=tolerance)
    if isinstance(expected, Mapping):
        return (
            isinstance(got, Mapping)
            and set(got) == set(expected)
            and all(same_values(expected[key], got[key], tolerance) for key in expected)
        )
    if isinstance(expected, (list, tuple)):
        return (
            isinstance(got, (list, tuple))
            and len(got) == len(expected)
            and all(same_values(e, g, tolerance) for e, g in zip(expected, got, strict=True))
        )
    return type(got) is type(expected) and got == expected


def _outcome(function: Callable[..., Any], args: tuple[Any, ...]) -> tuple[bool, Any]:
    """``(True, value)`` or ``(False, the exception)``: a raised error is an outcome to compare, not a crash."""
    try:
        return True, function(*args)
    except Exception as exc:  # any error of the learner's code is reported, never raised
        return False, exc


def _error_kind(exc: BaseException) -> type[BaseException]:
    """The built-in class an error belongs to (``GSM8KFormatError`` -> ``ValueError``): what a learner can match."""
    return next(cls for cls in type(exc).__mro__ if cls.__module__ == "builtins")


def _describe(ok: bool, value: Any, width: int = 90) -> str:
    text = f"returns {value!r}" if ok else f"raises {type(value).__name__}: {value}"
    text = " ".join(text.split())
    return text if len(text) <= width else f"{text[: width - 3]}..."


def _where_they_differ(expected: Any, got: Any, path: str = "") -> tuple[str, Any, Any]:
    """The first place inside two containers where the values differ: ``("['answer']", '1080', '1,080')``."""
    if isinstance(expected, Mapping) and isinstance(got, Mapping) and set(expected) == set(got):
        for key in expected:
            if not same_values(expected[key], got[key]):
                return _where_they_differ(expected[key], got[key], f"{path}[{key!r}]")
    if isinstance(expected, (list, tuple)) and isinstance(got, (list, tuple)) and len(expected) == len(got):
        for index, (e, g) in enumerate(zip(expected, got, strict=True)):
            if not same_values(e, g):
                return _where_they_differ(e, g, f"{path}[{index}]")
    if isinstance(expected, str) and isinstance(got, str):
        start = next(
            (i for i, (e, g) in enumerate(zip(expected, got, strict=False)) if e != g), min(map(len, (expected, got)))
        )
        if start > 24:  # show where the strings part, not their common beginning
            return f"{path}[{start - 12}:]", expected[start - 12 :], got[start - 12 :]
    return path, expected, got


def _difference(label: str, expected: tuple[bool, Any], got: tuple[bool, Any]) -> Difference:
    if expected[0] and got[0]:
        path, expected_part, got_part = _where_they_differ(expected[1], got[1])
        if path:
            return Difference(f"{label}, at {path}", _describe(True, expected_part), _describe(True, got_part))
    return Difference(label, _describe(*expected), _describe(*got))


def _agree(expected: tuple[bool, Any], got: tuple[bool, Any], same: Callable[[Any, Any], bool]) -> bool:
    (expected_ok, expected_value), (got_ok, got_value) = expected, got
    if not expected_ok:  # the reference refuses this input: the learner's version must refuse it the same way
        return not got_ok and isinstance(got_value, _error_kind(expected_value))
    if not got_ok:
        return False
    try:
        return bool(same(expected_value, got_value))
    except Exception:  # a value that cannot even be compared is a difference
        return False


def compare_with_reference(
    learner: Callable[..., Any],
    reference: Callable[..., Any],
    cases: Sequence[Case],
    same: Callable[[Any, Any], bool] = same_values,
) -> list[Difference]:
    """Run both functions on every case; return the cases where they differ (in value, or in raising).

    Where the reference raises, the learner's version must raise an error of the same built-in kind
    (``ValueError``, ``TypeError``...): refusing bad input is part of the behaviour being checked.
    """
    differences = []
    for case in cases:
        reference_args = case.args if case.reference_args is None else case.reference_args
        expected, got = _outcome(reference, reference_args), _outcome(learner, case.args)
        if not _agree(expected, got, same):
            differences.append(_difference(case.label, expected, got))
    return differences


def not_a_function(exercise: str, learner: Any, hint: str) -> bool:
    """Report an unanswered exercise or an answer that is not a function; checked before building any cases."""
    if is_unanswered(learner):
        report(exercise, False, hint, learner)
        return True
    if not callable(learner):
        print(f"❌ {exercise}: {type(learner).__name__} {learner!r:.40} is not a function; pass the function, no ().")
        return True
    return False


def check_against_reference(
    exercise: str,
    learner: Any,
    reference: Callable[..., Any],
    cases: Sequence[Case],
    *,
    hint: str,
    same: Callable[[Any, Any], bool] = same_values,
    show: int = 4,
) -> bool:
    """Print whether the learner's function agrees with ``reference`` on ``cases``, listing what differs."""
    if not_a_function(exercise, learner, hint):
        return False
    differences = compare_with_reference(learner, reference, cases, same)
    if not differences:
        print(f"✅ {exercise}: same result as the reference on all {len(cases)} cases.")
        return True
    print(f"❌ {exercise}: differs from the reference on {len(differences)} of {len(cases)} cases:")
    for difference in differences[:show]:
        print(f"   - {difference}")
    if len(differences) > show:
        print(f"   ... and {len(differences) - show} more.")
    print(f"   Hint: {hint}")
    return False


# --- 00 set-up ---------------------------------------------------------------------------------------


def check_00_profile_variable(answer: Any) -> bool:
    """Which environment variable chooses the hardware profile?"""
    correct = isinstance(answer, str) and answer.strip() == "COURSE_PROFILE"
    return report("00.1 profile variable", correct, "look at course_utils.core.profiles.PROFILE_ENV_VAR", answer)


def check_00_completions_per_step(answer: Any) -> bool:
    """How many completions does one optimizer step of the ``colab-t4`` profile train on?"""
    expected = get_profile("colab-t4").effective_batch_size
    return report(
        "00.2 completions per step",
        close_to(answer, expected),
        "per-device batch x gradient accumulation steps (see profiles_table())",
        answer,
    )


# --- 01 GRPO concepts --------------------------------------------------------------------------------


def check_01_first_advantage(answer: Any) -> bool:
    """Advantage of the first completion in the group with rewards [1, 0, 0, 0] (scale="group")."""
    expected = group_advantages([1.0, 0.0, 0.0, 0.0], num_generations=4)[0].item()
    return report(
        "01.1 first advantage",
        close_to(answer, expected, tolerance=0.01),
        "(reward - group mean) / (sample std + 1e-4); the sample std of [1, 0, 0, 0] is 0.5",
        answer,
    )


def check_01_zero_std_fraction(answer: Any) -> bool:
    """frac_reward_zero_std for two groups of 4: rewards [2, 2, 2, 2] and [0, 2, 0, 0]."""
    expected = frac_reward_zero_std([2.0] * 4 + [0.0, 2.0, 0.0, 0.0], num_generations=4)
    return report(
        "01.2 frac_reward_zero_std",
        close_to(answer, expected),
        "the share of completions whose group has all-equal rewards",
        answer,
    )


ADVANTAGE_CASES = (
    ("one group: two right, one wrong, one rambling", [2.5, 0.5, 0.0, 2.5], 4),
    ("two groups, the second all equal", [2.0, 0.0, 0.5, 0.5, 1.0, 1.0, 1.0, 1.0], 4),
    ("every reward 0", [0.0, 0.0, 0.0, 0.0], 4),
    ("a nearly solved group (tiny std)", [2.5, 2.5, 2.5, 2.4], 4),
    ("three pairs (num_generations=2)", [1.0, 0.0, 3.0, 3.0, 0.2, 0.1], 2),
    ("one group of 8, negative rewards too", [-1.0, 0.5, 2.0, 0.0, -0.5, 1.5, 0.0, 4.0], 8),
)
# lengths of the completions, seed, how far the policy moved since generation (0: the first step), label
LOSS_SETTINGS = (
    ((6, 3, 5, 2), 0, 0.0, "first step after generation (ratio 1), ragged lengths"),
    ((6, 3, 5, 2), 1, 0.3, "the policy moved, ragged lengths"),
    ((4, 4, 4, 4), 2, 0.3, "the policy moved, equal lengths"),
    ((8, 1, 2, 7, 3, 3, 5, 6), 3, 0.6, "two groups, the policy moved far: much clipping"),
)


def advantage_cases() -> list[Case]:
    """Batches of rewards (whole groups, prompt by prompt) with their ``num_generations``."""
    return [Case(f"{label}, rewards {rewards}", (rewards, n)) for label, rewards, n in ADVANTAGE_CASES]


def check_01_advantages(learner: Any) -> bool:
    """The learner's ``advantages(rewards, num_generations)`` against the advantages the installed TRL computes."""
    hint = "per group: (reward - group mean) / (group.std() + 1e-4); torch's std is the sample std, as TRL's"
    return check_against_reference("01 group advantages", learner, trl_group_advantages, advantage_cases(), hint=hint)


def loss_cases(loss_type: str = "dapo") -> tuple[Callable[..., Any], list[Case]]:
    """TRL's loss (a real ``GRPOTrainer``, ``epsilon=0.2``, ``beta=0``) and batches to run it on.

    Each case gives the learner ``(per_token_logps, old_per_token_logps, advantages, completion_mask)``
    and gives TRL the same batch as token ids, from which its model computes the same log-probs.
    """
    trainer = trl_trainer(4, loss_type=loss_type, max_completion_length=8)
    cases = []
    for lengths, seed, drift, label in LOSS_SETTINGS:
        batch = trl_loss_case(trainer, lengths, seed=seed, drift=drift, label=label)
        args = (batch.per_token_logps, batch.old_per_token_logps, batch.advantages, batch.completion_mask)
        cases.append(Case(label, args, reference_args=(batch,)))
    return functools.partial(trl_policy_loss, trainer), cases


def check_01_policy_loss(learner: Any) -> bool:
    """The learner's clipped loss (TRL's default ``loss_type="dapo"``) against ``GRPOTrainer._compute_loss``."""
    hint = "-min(ratio * A, clamp(ratio, 0.8, 1.2) * A) per token, summed over real tokens (mask), / mask.sum()"
    if not_a_function("01 clipped loss", learner, hint):
        return False
    reference, cases = loss_cases("dapo")
    return check_against_reference("01 clipped loss", learner, reference, cases, hint=hint)


def check_01_sequence_mean_loss(learner: Any) -> bool:
    """Exercise: the loss with ``loss_type="grpo"`` (mean per completion, then over completions) against TRL's."""
    hint = "same per-token loss; (per_token * mask).sum(dim=1) / mask.sum(dim=1), then .mean() over completions"
    if not_a_function("01.3 per-completion mean loss", learner, hint):
        return False
    reference, cases = loss_cases("grpo")
    return check_against_reference("01.3 per-completion mean loss", learner, reference, cases, hint=hint)


# --- 02 GSM8K data -----------------------------------------------------------------------------------


def check_02_gold_answer(answer: Any) -> bool:
    """What gold answer does ``extract_hash_answer`` give for ``"... Total: $1,250.\\n#### $1,250 "``?"""
    expected = extract_hash_answer("She earned 5*250 = $<<5*250=1250>>1,250.\n#### $1,250 ")
    correct = isinstance(answer, str) and answer == expected
    return report(
        "02.1 gold answer",
        correct,
        "a string, with the thousands separator, the $ and the surrounding spaces removed",
        answer,
    )


def check_02_rows_lost(answer: Any, dataset: Any) -> bool:
    """How many rows of ``dataset`` does the ``int_cast`` pitfall lose (``apply_pitfall`` returns None)?"""
    expected = len(pitfall_outcomes("int_cast", list(dataset["answer"]))["lost"])
    return report(
        "02.2 rows lost by int()",
        close_to(answer, expected),
        "count the answers int() cannot read: thousands separators, decimals, '$' (pitfall_report has it)",
        answer,
    )


def check_02_completion_length(answer: Any, stats: Any) -> bool:
    """A ``max_completion_length`` that fits at least 90% of reference solutions with their XML wrapper.

    Too short truncates (no ``<answer>``, zero reward); more than twice what is needed wastes compute.
    """
    needed = [length + stats.xml_overhead for length in stats.reasoning_lengths]
    try:
        fits = sum(length <= int(answer) for length in needed) / len(needed)
        correct = fits >= 0.9 and int(answer) <= 2 * max(needed)
    except (TypeError, ValueError):
        correct = False
    return report(
        "02.3 completion length",
        correct,
        "take the 90th percentile of stats.reasoning_lengths and add stats.xml_overhead",
        answer,
    )


ANSWER_EDGE_CASES = (
    ("thousands separator", "2 * 540 = 1080\n#### 1,080"),
    ("dollar sign and spaces", "She saved $1,200.\n#### $1,200 "),
    ("negative answer", "3 - 8 = -5\n#### -5"),
    ("decimal answer", "5 / 2 = 2.5\n#### 2.5"),
    ("answer on the next line", "####\n72\n"),
    ("no '####' marker", "The answer is 7"),
    ("two '####' markers", "#### 3\n#### 4"),
    ("nothing after '####'", "6 * 7 = 42\n#### "),
    ("a word, not a number", "#### seven"),
    ("not a string", None),
)
QUESTION_EDGE_CASES = (
    ("spaces and a newline around the question", ("  What is 6 * 7?\n",)),
    ("another system prompt", ("What is 6 * 7?", "Answer with one number.")),
    ("empty question", ("",)),
    ("only spaces", ("   ",)),
    ("not a string", (None,)),
)
ROW_EDGE_CASES = (
    ("dollar answer, padded question", {"question": "  How much?  ", "answer": "5 * 240 = 1200\n#### $1,200"}),
    ("no '####' in the answer", {"question": "How many?", "answer": "The answer is 7"}),
    ("no question", {"question": "", "answer": "#### 7"}),
)


def _column(dataset: Any, name: str) -> list[Any]:
    """One column of a ``Dataset``, a ``DatasetDict`` split or a list of dicts, as a list."""
    if isinstance(dataset, Sequence) and not isinstance(dataset, str):
        return [row[name] for row in dataset]
    return list(dataset[name])


def _short(text: Any, width: int = 32) -> str:
    flat = " ".join(str(text).split())
    return repr(flat if len(flat) <= width else f"...{flat[-width + 3 :]}")


def real_row_indices(dataset: Any, count: int = 24) -> list[int]:
    """The first rows, and the rows whose final answer has a comma, a sign, a ``$`` or a decimal point.

    Those are the rows one-line parsers get wrong, so they belong in every check on real data.
    """
    answers = _column(dataset, "answer")
    tricky = [i for i, text in enumerate(answers) if any(c in text.rsplit("####", 1)[-1] for c in ",-$.")]
    first = list(range(min(count // 2, len(answers))))
    return sorted(set(first + tricky[: count - len(first)]))


def _rows(dataset: Any, indices: Sequence[int]) -> list[dict[str, Any]]:
    questions, answers = _column(dataset, "question"), _column(dataset, "answer")
    return [{"question": questions[i], "answer": answers[i]} for i in indices]


def answer_cases(dataset: Any) -> list[Case]:
    """Real GSM8K answers from ``dataset`` plus the edge cases a parser must get right or refuse."""
    indices = real_row_indices(dataset)
    real = [
        Case(f"row {i} ({_short(row['answer'])})", (row["answer"],))
        for i, row in zip(indices, _rows(dataset, indices), strict=True)
    ]
    return real + [Case(label, (text,)) for label, text in ANSWER_EDGE_CASES]


def check_02_extract_hash_answer(learner: Any, dataset: Any) -> bool:
    """The learner's ``extract_hash_answer`` against ``course_utils.lesson.data.extract_hash_answer``."""
    hint = (
        "exactly one '####' (else ValueError), drop ',' and '$', strip, refuse what is not a number "
        "(ValueError) and a non-string (TypeError)"
    )
    return check_against_reference(
        "02 extract_hash_answer", learner, extract_hash_answer, answer_cases(dataset), hint=hint
    )


def question_cases(dataset: Any) -> list[Case]:
    """Real GSM8K questions plus edge cases (padding, another system prompt, empty or missing question)."""
    indices = real_row_indices(dataset, count=8)
    real = [
        Case(f"row {i} ({_short(row['question'])})", (row["question"],))
        for i, row in zip(indices, _rows(dataset, indices), strict=True)
    ]
    return real + [Case(label, args) for label, args in QUESTION_EDGE_CASES]


def check_02_build_prompt(learner: Any, dataset: Any) -> bool:
    """The learner's ``build_prompt(question, system_prompt)`` against ``course_utils.lesson.data.build_prompt``."""
    hint = (
        "[{'role': 'system', 'content': system_prompt}, {'role': 'user', 'content': question.strip()}]; "
        "ValueError for an empty or non-string question"
    )
    return check_against_reference("02 build_prompt", learner, build_prompt, question_cases(dataset), hint=hint)


def _grpo_columns(row: dict[str, Any]) -> dict[str, Any]:
    """What ``GRPOTrainer`` reads from a formatted row: the reference for the learner's map function."""
    formatted = format_row(row)
    return {"prompt": formatted["prompt"], "answer": formatted["answer"]}


def _same_grpo_columns(expected: dict[str, Any], got: Any) -> bool:
    return isinstance(got, Mapping) and same_values(expected, {key: got.get(key) for key in expected})


def row_cases(dataset: Any) -> list[Case]:
    """Real raw rows plus rows a map function must transform right or refuse."""
    indices = real_row_indices(dataset, count=12)
    real = [Case(f"row {i}", (row,)) for i, row in zip(indices, _rows(dataset, indices), strict=True)]
    return real + [Case(label, (row,)) for label, row in ROW_EDGE_CASES]


def _first_differing_row(mapped: Any, expected: Any) -> str | None:
    if len(mapped) != len(expected):
        return f"it has {len(mapped)} rows, the raw data {len(expected)}: map must keep every row"
    missing = {"prompt", "answer"} - set(getattr(mapped, "column_names", []))
    if missing:
        return f"its columns lack {sorted(missing)}; it has {getattr(mapped, 'column_names', None)}"
    for column in ("prompt", "answer"):
        for index, (got, want) in enumerate(zip(mapped[column], expected[column], strict=True)):
            if not same_values(want, got):
                return f"row {index}, column {column!r}: the reference has {_short(want, 60)}, yours {_short(got, 60)}"
    return None


def check_02_mapping(learner: Any, mapped: Any, dataset: Any) -> bool:
    """The learner's row function (for ``Dataset.map``) and the dataset it made, against ``format_gsm8k``."""
    hint = "return {'prompt': build_prompt(row['question']), 'answer': extract_hash_answer(row['answer'])}"
    if not check_against_reference(
        "02 map function", learner, _grpo_columns, row_cases(dataset), hint=hint, same=_same_grpo_columns
    ):
        return False
    if is_unanswered(mapped):
        return report("02 mapped dataset", False, "pass the dataset that dataset.map(your_function) returned", mapped)
    problem = _first_differing_row(mapped, format_gsm8k(dataset))
    if problem:
        print(f"❌ 02 mapped dataset: {problem}.")
        return False
    print(f"✅ 02 mapped dataset: all {len(mapped)} rows have the reference's prompt and answer.")
    return True


def split_solution_reference(text: str) -> tuple[str, str]:
    """Exercise 02.4's reference: the worked reasoning and the gold answer of one GSM8K solution."""
    return extract_reasoning(text), extract_hash_answer(text)


def check_02_split_solution(learner: Any, dataset: Any) -> bool:
    """Exercise: ``split_solution(text) -> (reasoning, answer)``, checked like ``extract_hash_answer``."""
    hint = "reasoning: the text before '####', stripped; answer: your extract_hash_answer (errors included)"
    return check_against_reference(
        "02.4 split_solution", learner, split_solution_reference, answer_cases(dataset), hint=hint
    )


# --- 03 reward functions -----------------------------------------------------------------------------

def _conversation(text: Any) -> list[dict[str, Any]]:
    """A completion as TRL passes it for a conversational dataset: one assistant message."""
    return [{"role": "assistant", "content": text}]


# (label, completion text, gold answer): the cases the classic rewards get wrong, and what a model can emit
EDGE_TEXTS: tuple[tuple[str, str | None, str], ...] = (
    ("negative answer", format_answer("5 - 8 = -3", "-3"), "-3"),
    ("answer 18.00 for gold 18", format_answer("2 * 9 = 18", "18.00"), "18"),
    ("decimal answer 2.5", format_answer("5 / 2 = 2.5", "2.5"), "2.5"),
    ("superscript two", format_answer("x squared", "²"), "2"),
    ("answer in words", format_answer("two fives", "ten"), "10"),
    ("answer as a fraction", format_answer("2000 / 2", "\\frac{2000}{2}"), "1000"),
    ("answer $1,000", format_answer("40 * 25 = 1000", "$1,000"), "1000"),
    ("answer with a unit", format_answer("40 * 25 = 1000", "1000 pencils"), "1000"),
    ("two answer blocks", "<answer>\n5\n</answer> wait, no:\n<answer>\n1000\n</answer>", "1000"),
    ("spaces before the tags", "  " + format_answer("40 * 25 = 1000", "1000"), "1000"),
    ("every tag twice", format_answer("a", "1") + "\n" + format_answer("b", "1000"), "1000"),
    ("empty reasoning", format_answer("", "1000"), "1000"),
    ("tags in the wrong order", "<answer>\n1000\n</answer>\n<reasoning>\n40 * 25\n</reasoning>", "1000"),
    ("closing tag twice inside", "<reasoning>a</reasoning> b </reasoning>\n<answer>1000</answer>", "1000"),
    ("a long line of tags", "<reasoning></reasoning><answer>" * 200, "1000"),
    ("empty completion", "", "1000"),
    ("a message whose content is None", None, "1000"),
)
REWARD_EDGE_CASES: tuple[tuple[str, Any, str], ...] = (
    *[(label, _conversation(text), gold) for label, text, gold in EDGE_TEXTS],
    ("plain text, not a conversation", format_answer("40 * 25 = 1000", "1000"), "1000"),
    ("no completion at all (None)", None, "1000"),
)


def trl_reward_kwargs(completions: Sequence[Any], answers: Sequence[str], reasoning: Sequence[str]) -> dict[str, Any]:
    """The keyword arguments ``GRPOTrainer`` gives a reward function for a batch (see ``_calculate_rewards``)."""
    texts = [rewards.completion_text(c) for c in completions]
    return {
        "prompts": [build_prompt("A GSM8K question?") for _ in completions],
        "completions": list(completions),
        "completion_ids": [list(text.encode()) for text in texts],  # stand-ins for token ids
        "answer": list(answers),
        "reasoning": list(reasoning),
        "trainer_state": TrainerState(global_step=1, max_steps=10),
    }


def _reward_case(label: str, completion: Any, gold: str, reasoning: str = "") -> Case:
    """One completion as a batch of one, called as TRL calls a reward: keyword arguments only."""
    return Case(label, (trl_reward_kwargs([completion], [gold], [reasoning]),))


def _variants(reasoning: str, gold: str) -> list[tuple[str, str]]:
    """The ways a model writes one real solution: exact, with or without the final newline, chatty, cut off..."""
    exact = format_answer(reasoning, gold)
    number = Decimal(gold)
    restyled = f"{number:,}" if number == number.to_integral_value() and abs(number) >= 1000 else f"${gold}"
    return [
        ("exact layout", exact),
        ("final newline", exact + "\n"),
        (f"answer written {restyled!r}", format_answer(reasoning, restyled)),
        ("wrong answer", format_answer(reasoning, str(number + 1))),
        ("tags on one line", f"<reasoning>{' '.join(reasoning.split())}</reasoning> <answer>{gold}</answer>"),
        ("text after </answer>", exact + "\nI hope this helps!"),
        ("cut off", exact[: len(exact) * 3 // 5]),
    ]


def reward_cases(dataset: Any) -> list[Case]:
    """Real GSM8K solutions written the ways a model writes them, the sample bank of notebook 03, and edge cases."""
    cases = []
    indices = real_row_indices(dataset, count=8)
    for index, row in zip(indices, _rows(dataset, indices), strict=True):
        gold, reasoning = extract_hash_answer(row["answer"]), extract_reasoning(row["answer"])
        for label, text in _variants(reasoning, gold):
            cases.append(_reward_case(f"row {index}, {label} (gold {gold!r})", _conversation(text), gold, reasoning))
    for sample in SAMPLE_BANK:
        label = f"sample '{sample.label}' (gold {sample.answer!r})"
        cases.append(_reward_case(label, _conversation(sample.completion), sample.answer))
    for label, completion, gold in REWARD_EDGE_CASES:
        cases.append(_reward_case(f"{label} (gold {gold!r})", completion, gold))
    return cases


def _called_like_trl(function: Callable[..., Any]) -> Callable[[dict[str, Any]], Any]:
    """``function(**kwargs)``: how ``GRPOTrainer`` calls a reward (keywords only, extra columns included)."""
    return lambda kwargs: function(**kwargs)


def _check_reward(exercise: str, learner: Any, reference: Callable[..., Any], dataset: Any, hint: str) -> bool:
    if not_a_function(exercise, learner, hint):
        return False
    return check_against_reference(
        exercise, _called_like_trl(learner), _called_like_trl(reference), reward_cases(dataset), hint=hint
    )


def check_03_correctness(learner: Any, dataset: Any) -> bool:
    """The learner's corrected ``correctness_reward_func`` against ``lesson.rewards``' on real and edge cases."""
    hint = "for each text of completion_texts(completions): 2.0 if answers_match(extract_xml_answer(text), gold)"
    return _check_reward("03 correctness_reward_func", learner, rewards.correctness_reward_func, dataset, hint)


def check_03_int(learner: Any, dataset: Any) -> bool:
    """The learner's corrected ``int_reward_func``: 0.5 when the answer block parses to a whole number."""
    hint = "n = plain_number(extract_xml_answer(text)); 0.5 if n is not None and n == n.to_integral_value()"
    return _check_reward("03 int_reward_func", learner, rewards.int_reward_func, dataset, hint)


def check_03_strict_format(learner: Any, dataset: Any) -> bool:
    """The learner's corrected ``strict_format_reward_func``: the exact layout, multi-line reasoning allowed."""
    hint = (
        "drop one final newline; each tag exactly once; starts '<reasoning>\\n', ends '\\n</answer>'; "
        "'\\n</reasoning>\\n<answer>\\n' between a non-blank reasoning and a non-blank answer"
    )
    return _check_reward("03 strict_format_reward_func", learner, rewards.strict_format_reward_func, dataset, hint)


def check_03_soft_format(learner: Any, dataset: Any) -> bool:
    """The learner's corrected ``soft_format_reward_func``: a reasoning block, then an answer block, any spacing."""
    hint = (
        "strip the text; it starts with <reasoning>; after the first </reasoning> (and any spaces) comes "
        "<answer>, and a </answer> follows"
    )
    return _check_reward("03 soft_format_reward_func", learner, rewards.soft_format_reward_func, dataset, hint)


def check_03_xmlcount(learner: Any, dataset: Any) -> bool:
    """The learner's corrected ``xmlcount_reward_func``: 0.125 per tag alone on its line, minus trailing text."""
    hint = (
        "0.125 per tag that appears once, alone on its line, after the tag before it; then minus "
        "0.001 per non-space character after the last </answer>, at most 0.5"
    )
    return _check_reward("03 xmlcount_reward_func", learner, rewards.xmlcount_reward_func, dataset, hint)


def check_03_classic_comma(answer: Any) -> bool:
    """What does the classic correctness reward give '<answer>\\n1,000\\n</answer>' when the gold is '1000'?"""
    completion = [{"role": "assistant", "content": "<answer>\n1,000\n</answer>"}]
    expected = classic.correctness_reward_func(None, [completion], ["1000"])[0]
    return report(
        "03.1 classic correctness on 1,000",
        close_to(answer, expected),
        "the classic version compares strings with ==",
        answer,
    )


def check_03_dotall_flag(answer: Any) -> bool:
    """Which flag of Python's ``re`` module lets ``.`` match a newline?"""
    text = str(answer).strip().removeprefix("re.") if isinstance(answer, str) else ""
    hint = "look for the flag named after 'dot' in the re docs"
    return report("03.2 regex flag", text in {"DOTALL", "S"}, hint, answer)


def repetition_penalty_reference(completions: Any, **kwargs: Any) -> list[float]:
    """Exercise 03.3's reference: minus the share of a completion's non-blank lines that repeat an earlier line."""
    scores = []
    for text in rewards.completion_texts(completions):
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        scores.append(-(len(lines) - len(set(lines))) / len(lines) if lines else 0.0)
    return scores


def _looping(reasoning: str, times: int) -> str:
    """A completion that gets stuck: its first reasoning line again and again, then cut off."""
    first = reasoning.splitlines()[0]
    return "<reasoning>\n" + "\n".join([first] * times)


def own_reward_cases(dataset: Any) -> list[Case]:
    """Sample completions (the bank, real solutions, loops a small model falls into) and edge cases."""
    cases = [case for case in reward_cases(dataset) if not case.label.startswith("row ")]
    indices = real_row_indices(dataset, count=6)
    for index, row in zip(indices, _rows(dataset, indices), strict=True):
        gold, reasoning = extract_hash_answer(row["answer"]), extract_reasoning(row["answer"])
        for label, text in (
            ("solution", format_answer(reasoning, gold)),
            ("first line 3 times", _looping(reasoning, 3)),
            ("first line 12 times", _looping(reasoning, 12)),
            ("solution written twice", format_answer(reasoning + "\n" + reasoning, gold)),
        ):
            cases.append(_reward_case(f"row {index}, {label}", _conversation(text), gold, reasoning))
    for label, text in (
        ("blank lines only", "\n \n\t\n"),
        ("same line, different indentation", "  x = 1\nx = 1  \n"),
        ("one line", "42"),
    ):
        cases.append(_reward_case(label, _conversation(text), "42"))
    return cases


def _through_trl(learner: Callable[..., Any], dataset: Any) -> str | None:
    """Run the learner's reward inside ``GRPOTrainer._calculate_rewards``; a problem in words, or None."""
    indices = real_row_indices(dataset, count=4)[:4]
    rows = _rows(dataset, indices)
    reasonings = [extract_reasoning(row["answer"]) for row in rows]
    golds = [extract_hash_answer(row["answer"]) for row in rows]
    completions = [_conversation(_looping(r, 1 + i)) for i, r in enumerate(reasonings)]
    prompts = [build_prompt(row["question"]) for row in rows]
    try:
        got = trl_reward_values(learner, prompts, completions, answer=golds, reasoning=reasonings)
    except Exception as error:  # the learner's bug, reported as TRL reports it
        return f"GRPOTrainer could not use it: {type(error).__name__}: {error}"
    expected = repetition_penalty_reference(completions)
    if not same_values(expected, got):
        return f"inside GRPOTrainer it gave {got}, the reference {expected}"
    return None


def check_03_own_reward(learner: Any, dataset: Any) -> bool:
    """Exercise 03.3: a repetition penalty, on sample completions and then called by TRL's own reward code."""
    hint = (
        "def f(completions, **kwargs): for each text of completion_texts(completions), the non-blank lines "
        "stripped; return -(repeats / lines), 0.0 when there are no lines"
    )
    if not_a_function("03.3 your reward", learner, hint):
        return False
    reference, cases = _called_like_trl(repetition_penalty_reference), own_reward_cases(dataset)
    if not check_against_reference("03.3 your reward", _called_like_trl(learner), reference, cases, hint=hint):
        return False
    problem = _through_trl(learner, dataset)
    if problem:
        print(f"❌ 03.3 your reward through GRPOTrainer: {problem}. Hint: {hint}")
        return False
    print("✅ 03.3 your reward through GRPOTrainer: TRL called it and got the reference's rewards.")
    return True


def check_04_prompts_per_step(answer: Any) -> bool:
    """Golden config: batch 8, accumulation 16, num_generations 8: how many distinct prompts per optimizer step?"""
    hint = "completions per step = batch x accumulation; each prompt fills one group of num_generations"
    return report("04.1 prompts per step", close_to(answer, 8 * 16 / 8), hint, answer)


def check_04_group_size_field(answer: Any) -> bool:
    """Which ``GRPOConfig`` field is the group size (completions sampled per prompt)?"""
    text = answer.strip().strip("`'\"") if isinstance(answer, str) else ""
    hint = "the field that says how many completions are generated for each prompt; TRL's default is 8"
    return report("04.2 group size field", text == "num_generations", hint, answer)


def generation_batch_cases() -> list[Case]:
    """Sizes that form whole groups, sizes that do not, and sizes that are no sizes at all."""
    return [
        Case("the golden config: 8 x 16, groups of 8", (8, 16, 8)),
        Case("4 x 2, groups of 8", (4, 2, 8)),
        Case("the cpu lab: one pass of 8, groups of 8", (8, 1, 8)),
        Case("12 x 1, groups of 3", (12, 1, 3)),
        Case("6 x 1, groups of 4: not whole groups", (6, 1, 4)),
        Case("3 x 3, groups of 2: not whole groups", (3, 3, 2)),
        Case("a group of one compares nothing", (8, 1, 1)),
        Case("batch 0", (0, 1, 2)),
        Case("accumulation 0", (4, 0, 2)),
    ]


def check_04_generation_batch(learner: Any) -> bool:
    """A function ``(batch, accumulation, num_generations) -> completions per round``; ValueError when unusable."""
    hint = ("return batch x accumulation; raise ValueError when that is not a multiple of num_generations, when "
            "num_generations < 2, or when a size is < 1")
    return check_against_reference(
        "04.4 generation batch", learner, check_generation_batch, generation_batch_cases(), hint=hint
    )


def check_04_monitoring_rule(answer: Any, log_history: Any) -> bool:
    """Which monitoring rule fires on ``log_history``? (a rule name such as ``"clipped_high"``)."""
    try:
        fired = {finding.code for finding in monitor(log_history)}
    except (TypeError, ValueError) as exc:
        print(f"⚠️ 04.3: could not read the log history ({exc}); pass the one the notebook built.")
        return False
    text = answer.strip() if isinstance(answer, str) else ""
    hint = "run monitor(log_history) and read the rule names, or look at the last columns of the frame"
    return report("04.3 monitoring rule", text in fired, hint, answer)


# --- 05 evaluation -----------------------------------------------------------------------------------

CHECKER_OPTIONS_05 = ("1000", "1,000", "$1000", "1000.0", "one thousand", "100")


def check_05_wilson_lower(answer: Any) -> bool:
    """A model solves 4 of 8 held-out problems: the lower end of the 95% Wilson interval, to 2 decimals."""
    expected = wilson_interval(4, 8)[0]
    hint = "call wilson_interval(successes, n) and read the first number; 50% on 8 problems is a wide range"
    return report("05.1 Wilson lower bound for 4/8", close_to(answer, expected, 0.006), hint, answer)


def _problems_for_half_width(target: float = 0.05, rate: float = 0.5) -> int:
    n = 2
    while True:
        low, high = wilson_interval(round(rate * n), n)
        if (high - low) / 2 <= target:
            return n
        n += 2


def check_05_problems_needed(answer: Any) -> bool:
    """About how many problems give a 95% interval of at most ±5 points around an accuracy of 50%?"""
    expected = _problems_for_half_width(0.05, 0.5)
    within = close_to(answer, expected, 0.1 * expected)
    hint = "try wilson_interval(n // 2, n) for growing n until (high - low) / 2 <= 0.05; any answer within 10% counts"
    return report("05.2 problems for ±5 points", within, hint, answer)


def last_number_cases() -> list[Case]:
    """Completions a lenient reader meets: tagged and untagged answers, separators, decimals, signs, no number."""
    texts = {
        "tagged answer": "<reasoning>\n9 + 9 = 18\n</reasoning>\n<answer>\n18\n</answer>",
        "plain sentence": "The answer is 72.",
        "thousands separator": "She earns 1,250 dollars.",
        "decimal": "Each costs 2.50, so 5.75 in all",
        "negative": "The temperature fell to -4 degrees",
        "several numbers, last wins": "3 boxes of 12 is 36 eggs, minus 6 is 30",
        "sentence-final full stop": "So the total is 42.",
        "no number at all": "I do not know.",
        "empty": "",
    }
    return [Case(label, (text,)) for label, text in texts.items()]


def check_05_last_number(learner: Any) -> bool:
    """A function ``text -> the last number in it`` (commas dropped, ``""`` when none): the lenient reading."""
    hint = "find every number with a regular expression, keep the last, drop its commas; '' when there is none"
    return check_against_reference("05.4 last number", learner, last_number, last_number_cases(), hint=hint)


def check_05_checker_matters(answer: Any) -> bool:
    """Which of ``CHECKER_OPTIONS_05`` does ``answers_match`` accept for the gold ``"1000"`` but exact match rejects?"""
    expected = {option for option in CHECKER_OPTIONS_05 if answers_match(option, "1000") and option != "1000"}
    given = {str(a).strip() for a in answer} if isinstance(answer, (list, tuple, set)) else None
    hint = "list the strings (e.g. ['1,000', ...]) that mean 1000 but are not written '1000'; try answers_match"
    return report("05.3 math-verify versus exact match", given == expected, hint, answer)


# --- 06 troubleshooting ------------------------------------------------------------------------------


def check_06_batch_size(answer: Any) -> bool:
    """Smallest ``per_device_train_batch_size`` that works with ``gradient_accumulation_steps=3`` and 6 generations."""
    def accepted(batch: int) -> bool:
        config = {"per_device_train_batch_size": batch, "gradient_accumulation_steps": 3, "num_generations": 6}
        return "batch-not-divisible" not in {f.code for f in check(config, hardware={"device": "cuda", "bf16": True})}

    expected = next(b for b in range(1, 100) if accepted(b))
    hint = "the generation batch is batch x accumulation steps; it must be a multiple of num_generations"
    return report("06.1 smallest batch", close_to(answer, expected), hint, answer)


def _log_history(steps: int = 10, **series: list[float]) -> list[dict[str, Any]]:
    """A ``trainer.state.log_history``: one entry per step with the given metrics, then the run's summary."""
    logs = [{"step": i + 1, "reward": 0.0} | {key: values[i] for key, values in series.items()} for i in range(steps)]
    return [*logs, {"step": steps, "train_runtime": 12.5, "train_loss": 0.0}]


# label, the metrics per step (10 steps unless the lists are shorter)
FLAT_REWARD_HISTORIES: tuple[tuple[str, dict[str, list[float]]], ...] = (
    ("healthy run", {"completions/clipped_ratio": [0.05] * 10, "frac_reward_zero_std": [0.1] * 10}),
    ("every completion cut off", {"completions/clipped_ratio": [1.0] * 10, "frac_reward_zero_std": [1.0] * 10}),
    ("equal groups, none cut off", {"completions/clipped_ratio": [0.0] * 10, "frac_reward_zero_std": [0.9] * 10}),
    (
        "cut off early, fine later",
        {"completions/clipped_ratio": [1.0] * 5 + [0.0] * 5, "frac_reward_zero_std": [0.2] * 10},
    ),
    ("signal lost late", {"completions/clipped_ratio": [0.0] * 10, "frac_reward_zero_std": [0.0] * 5 + [1.0] * 5}),
    ("clipped 35%, equal groups 45%", {"completions/clipped_ratio": [0.35] * 10, "frac_reward_zero_std": [0.45] * 10}),
    ("clipped 25%, equal groups 55%", {"completions/clipped_ratio": [0.25] * 10, "frac_reward_zero_std": [0.55] * 10}),
    ("clipped ratio never logged", {"frac_reward_zero_std": [0.8] * 10}),
    ("three steps only", {"completions/clipped_ratio": [0.0] * 3, "frac_reward_zero_std": [0.6] * 3}),
    ("only the reward logged", {}),
)


def flat_reward_cases(*real_histories: Any) -> list[Case]:
    """Log histories made for each diagnosis, then any real ones (the notebook's runs)."""
    cases = [
        Case(label, (_log_history(min((len(v) for v in series.values()), default=10), **series),))
        for label, series in FLAT_REWARD_HISTORIES
    ]
    cases.append(Case("empty log history", ([],)))
    return cases + [Case(f"real run {i + 1}", (list(history),)) for i, history in enumerate(real_histories)]


def check_06_flat_reward_cause(learner: Any, *real_histories: Any) -> bool:
    """Exercise 06.2: ``flat_reward_cause(log_history)`` against ``monitoring.flat_reward_cause``."""
    hint = (
        f"keep the entries with a 'reward', the last {WINDOW}; 'truncated' if the mean completions/clipped_ratio "
        f"> {THRESHOLDS['clipped_high']}, else 'no_signal' if the mean frac_reward_zero_std > "
        f"{THRESHOLDS['zero_std_high']}, else 'ok' (a metric never logged counts as fine)"
    )
    cases = flat_reward_cases(*real_histories)
    return check_against_reference("06.2 flat_reward_cause", learner, flat_reward_cause, cases, hint=hint)


def check_06_biggest_saving(answer: Any) -> bool:
    """Which single fix in ``memory.OOM_FIXES`` lowers the estimated peak memory of ``memory.OOM_BASE`` the most?"""
    singles = {label: change for label, change in OOM_FIXES.items() if not label.startswith("all")}
    table = what_if_table(OOM_BASE, singles).drop(index="as configured")
    expected = str(table["total_gb"].idxmin())
    correct = isinstance(answer, str) and answer.strip() == expected
    hint = "run what_if_table(OOM_BASE, OOM_FIXES) and compare total_gb; answer with the row's label"
    return report("06.3 biggest memory saving", correct, hint, answer)


# --- 07 GRPO variants ---------------------------------------------------------------------------------


def check_07_off_policy_field(answer: Any) -> bool:
    """Which ``GRPOConfig`` field, set to 2, makes GSPO's sequence ratio (and clip-higher) change anything?"""
    text = answer.strip().strip("`'\"") if isinstance(answer, str) else ""
    hint = "on-policy every ratio is 1; the field that reuses each generation batch for several updates (μ)"
    return report("07.1 the off-policy switch", text == "num_iterations", hint, answer)


def check_07_constant_normaliser(answer: Any) -> bool:
    """Which ``loss_type`` divides the summed token losses by a constant (``max_completion_length``), not a count?"""
    text = answer.strip().strip("`'\"") if isinstance(answer, str) else ""
    hint = "the variant named after the paper that diagnosed GRPO's length bias (read TRL's loss_type help)"
    return report("07.2 the length-unbiased constant", text == "dr_grpo", hint, answer)


def difference_cases() -> list[Case]:
    """Per-seed values of two variants: clear gaps, overlaps, ties, single seeds (no verdict from one seed)."""
    pairs = [
        ([0.9, 1.0], [0.4, 0.5]),
        ([0.4, 0.5], [0.9, 1.0]),
        ([0.4, 0.9], [0.5, 0.6]),
        ([0.5, 0.6], [0.6, 0.7]),
        ([0.5, 0.5], [0.5, 0.5]),
        ([1.0], [0.0]),
        ([0.1, 0.2, 0.3], [0.31, 0.5, 0.4]),
        ([0.02, 0.0], [0.04, 0.06]),
    ]
    return [Case(f"{a} vs {b}", (a, b)) for a, b in pairs]


def check_07_real_difference(learner: Any) -> bool:
    """The learner's ``is_real(first, second)``: do two variants' seeds not overlap (at least 2 seeds each)?"""
    hint = "a difference is real only when every seed of one variant beats every seed of the other (2+ seeds each)"
    return check_against_reference(
        "07.3 difference or noise", learner, real_difference, difference_cases(), hint=hint, same=lambda a, b: a == b
    )


# --- 99 appendix: CPU speed ----------------------------------------------------------------------------

PRECISION_CASES: tuple[tuple[str, frozenset[str]], ...] = (
    ("AVX512", frozenset({"avx2", "avx512f", "avx512_bf16"})),
    ("AVX512", frozenset({"avx2", "avx512f", "amx_bf16", "amx_tile"})),
    ("AVX512", frozenset({"avx2", "avx512f"})),
    ("AVX2", frozenset({"avx2", "fma"})),
    ("AVX2", frozenset({"avx2", "avx512f", "avx512_bf16"})),  # torch runs AVX2 kernels: bf16 is emulated
    ("DEFAULT", frozenset()),
)


def check_99_precision_rule(answer: Any) -> bool:
    """A function ``(capability, flags) -> "bf16" | "fp32"`` that picks the lab's path on a Linux machine."""
    hint = "bf16 only when torch runs AVX-512 kernels AND the flags list avx512_bf16 or amx_bf16"
    if is_unanswered(answer) or not callable(answer):
        return report("99.1 precision rule", False, hint, answer if is_unanswered(answer) else "not a function")
    differences = []
    for capability, flags in PRECISION_CASES:
        expected = "bf16" if native_bf16(capability, None, flags, "Linux")[0] else "fp32"
        try:
            got = answer(capability, set(flags))
        except Exception as error:  # a learner's bug is a verdict, not a crash
            got = f"{type(error).__name__}: {error}"
        if is_unanswered(got):
            return report("99.1 precision rule", False, hint, got)
        if got != expected:
            differences.append(f"{capability} with {sorted(flags)}: yours {got!r}, expected {expected!r}")
    for line in differences:
        print("   ", line)
    return report("99.1 precision rule", not differences, hint, answer)
