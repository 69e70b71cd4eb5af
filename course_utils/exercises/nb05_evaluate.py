"""Notebook 05 (evaluation): confidence intervals, the lenient answer reader, why the checker matters."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from course_utils.evaluation.heldout import evaluate_model
from course_utils.evaluation.metrics import last_number
from course_utils.evaluation.stats import wilson_interval
from course_utils.exercises.comparison import Case, check_against_reference, close_to, field_differences, report
from course_utils.lesson.rewards import answers_match

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


# --- notebook 05: the evaluation loop ------------------------------------------------------------------

RECORD_FIELDS = ("completion", "extracted", "correct")


def check_evaluation_loop(
    learner: Callable[..., Sequence[Mapping[str, Any]]],
    model: Any,
    tokenizer: Any,
    problems: Any,
    *,
    batch_size: int,
    max_new_tokens: int,
) -> bool:
    """Run the learner's loop and ``evaluation.evaluate_model`` on the same problems; compare per problem.

    The reference runs in the dataset's order with the same batches (``sort_by_length=False``), so the
    same greedy generation gives the same text; each record's ``completion``, ``extracted`` and ``correct``
    must match.
    """
    yours = list(learner(model, tokenizer, problems, batch_size, max_new_tokens))
    settings = {"batch_size": batch_size, "max_new_tokens": max_new_tokens, "progress": False}
    reference = evaluate_model(model, tokenizer, problems, sort_by_length=False, **settings)["records"]
    differences = []
    if len(yours) != len(reference):
        differences.append(f"records: yours {len(yours)}, reference {len(reference)} (one per problem)")
    for index, (mine, theirs) in enumerate(zip(yours, reference, strict=False)):
        if not isinstance(mine, Mapping):
            differences.append(f"problem {index}: yours is a {type(mine).__name__}, not a dict of {RECORD_FIELDS}")
            continue
        got = {name: mine.get(name, "(not set)") for name in RECORD_FIELDS}
        wanted = {name: theirs[name] for name in RECORD_FIELDS}
        differences += [f"problem {index}, {line}" for line in field_differences(got, wanted)]
    fix = ("Each record is {'completion': text, 'extracted': extract_xml_answer(text), 'correct': "
           "answers_match(...)}; generate greedily, left-padded, with skip_special_tokens when decoding.")
    return _loop_verdict(f"Your evaluation loop ({len(reference)} problems)", differences, fix)


def _loop_verdict(what: str, differences: Sequence[str], fix: str) -> bool:
    """Print the verdict; raise with every difference listed when there is one."""
    if not differences:
        print(f"✅ {what}: the same as the package's reference, problem by problem.")
        return True
    listing = "\n".join(f"  - {line}" for line in differences)
    raise ValueError(f"{what} differs from the package's reference in {len(differences)} place(s):\n{listing}\n{fix}")
