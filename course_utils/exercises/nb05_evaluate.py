"""Notebook 05 (evaluation): the evaluation loop, pass@k, confidence intervals, the lenient reader, the checker.

05.1 is the loop the lesson is about: the check runs it next to ``evaluation.evaluate_model`` on a few problems and
hands back what the notebook continues with. 05.3-05.5 are values read off the lesson; 05.6 is ``last_number``,
checked on completions a lenient reader meets, numbers glued to tags, words and ``$`` included. 05.2 is the
unbiased pass@k estimator, checked on every small case, the edges (n = k, c = 0, c = n) and sample counts large
enough that factorials in floating point overflow.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from course_utils.evaluation.heldout import evaluate_model
from course_utils.evaluation.metrics import last_number
from course_utils.evaluation.stats import pass_at_k, wilson_interval
from course_utils.exercises.comparison import Case, check_against_reference, not_a_function
from course_utils.exercises.verdicts import field_differences, hand_back, list_problems, report, report_number
from course_utils.lesson.rewards import answers_match

CHECKER_OPTIONS_05 = ("1000", "1,000", "$1000", "1000.0", "one thousand", "100")


# --- 05.1: the evaluation loop ------------------------------------------------------------------------

RECORD_FIELDS = ("completion", "extracted", "correct")
LOOP_EXERCISE = "05.1 evaluation loop"
LOOP_HINT = (
    "render each batch with the chat template (assistant turn opened), tokenize with padding_side='left', "
    "generate greedily under torch.inference_mode, decode only the tokens after the prompt, then "
    "extract_xml_answer and answers_match; one record per problem, every batch"
)


def evaluate_loop_reference(
    model: Any, tokenizer: Any, problems: Any, batch_size: int, max_new_tokens: int
) -> list[dict[str, Any]]:
    """The package's loop with the exercise's signature: ``evaluate_model``'s records, in the dataset's order.

    ``sort_by_length=False`` keeps the learner's batches, so the same greedy generation gives the same text. Each
    record holds ``completion``, ``extracted`` and ``correct`` and more (``formatted``, ``tokens``...).
    """
    settings = {"batch_size": batch_size, "max_new_tokens": max_new_tokens, "progress": False}
    return evaluate_model(model, tokenizer, problems, sort_by_length=False, **settings)["records"]


def record_differences(yours: Any, reference: Sequence[Mapping[str, Any]]) -> list[str]:
    """One line per record field where the learner's records differ from the reference's (and for a wrong count)."""
    if isinstance(yours, (str, bytes, Mapping)) or not isinstance(yours, Iterable):
        return [f"your loop returns a {type(yours).__name__}, not a list of records (one dict per problem)"]
    yours = list(yours)
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
    return differences


def _loop_verdict(exercise: str, differences: Sequence[str], count: int, show: int = 6) -> bool:
    """Print the verdict of the loop: correct, or every difference (the first ``show``) and the hint."""
    if not differences:
        print(f"✅ {exercise}: the same records as the package's loop on all {count} problems.")
        return True
    list_problems(exercise, f"differs from the package's loop in {len(differences)} place(s)", differences, LOOP_HINT,
                  show)  # fmt: skip
    return False


def check_evaluation_loop(
    learner: Any, model: Any, tokenizer: Any, problems: Any, *, batch_size: int, max_new_tokens: int
) -> Callable[..., list[dict[str, Any]]]:
    """05.1: run the learner's loop and the package's on the same problems and batches; compare record by record.

    Prints the verdict (never raises: an error of the learner's loop is a difference) and hands back the loop the
    notebook continues with: the learner's when it gave the same records, else ``evaluate_loop_reference``.
    """
    passed = False
    if not not_a_function(LOOP_EXERCISE, learner, LOOP_HINT):
        passed = _run_and_compare(learner, model, tokenizer, problems, batch_size, max_new_tokens)
    return hand_back(LOOP_EXERCISE, passed, learner, evaluate_loop_reference, "evaluate_loop_reference")


# A model answer the check chooses: written "$1,000", right for gold "1000" (answers_match) but not as a string,
# and followed by the end token, which decoding must skip
SCRIPTED_ANSWER = "<reasoning>\n40 * 25 = 1000\n</reasoning>\n<answer>\n$1,000\n</answer>"
SCRIPTED_GOLDS = ("1000", "1001")


@contextlib.contextmanager
def scripted_generation(model: Any, tokenizer: Any, text: str) -> Iterator[int]:
    """Greedy generation steered to write ``text``, then the end token; yields the tokens that takes.

    Each token of ``text`` gets a bias once the tokens before it are written (``generation_config.sequence_bias``,
    longer prefixes weigh more), so any loop that calls ``model.generate`` greedily writes it.
    """
    eos = tokenizer.eos_token_id
    ids = [*tokenizer(text, add_special_tokens=False)["input_ids"], *([eos] if isinstance(eos, int) else [])]
    config = model.generation_config
    before = config.sequence_bias
    config.sequence_bias = {tuple(ids[: i + 1]): 100.0 * (i + 1) for i in range(len(ids))}
    try:
        yield len(ids)
    finally:
        config.sequence_bias = before


def _loop_differences(learner: Callable[..., Any], args: tuple[Any, ...]) -> list[str]:
    """The learner's records against the package's on ``args``, one line per difference (its error is one)."""
    try:
        yours = learner(*args)
        if isinstance(yours, Iterator):
            yours = list(yours)  # a generator runs only now: what it raises is the learner's too
    except NotImplementedError:
        raise
    except Exception as error:  # the learner's bug is a verdict, not a crash
        return [f"your loop raises {type(error).__name__}: {' '.join(str(error).split())[:160]}"]
    return record_differences(yours, evaluate_loop_reference(*args))


def _scripted_differences(learner: Callable[..., Any], model: Any, tokenizer: Any, problems: Any) -> list[str]:
    """The loops on a model steered to ``SCRIPTED_ANSWER``, gold answers ``SCRIPTED_GOLDS``: answers and tokens."""
    if not (hasattr(problems, "select") and hasattr(model, "generation_config")):
        return []
    rows = problems.select(range(min(len(SCRIPTED_GOLDS), len(problems))))
    golds = rows.remove_columns("answer").add_column("answer", list(SCRIPTED_GOLDS[: len(rows)]))
    with scripted_generation(model, tokenizer, SCRIPTED_ANSWER) as length:
        differences = _loop_differences(learner, (model, tokenizer, golds, len(SCRIPTED_GOLDS), length + 2))
    return [f"the model made to answer $1,000 then stop (gold {SCRIPTED_GOLDS}): {line}" for line in differences]


def _run_and_compare(
    learner: Callable[..., Any], model: Any, tokenizer: Any, problems: Any, batch_size: int, max_new_tokens: int
) -> bool:
    """Run the learner's loop (its error is a difference), then the package's, then both on a scripted answer."""
    try:
        differences = _loop_differences(learner, (model, tokenizer, problems, batch_size, max_new_tokens))
        differences = differences or _scripted_differences(learner, model, tokenizer, problems)
    except NotImplementedError:
        return report(LOOP_EXERCISE, False, LOOP_HINT, None)
    return _loop_verdict(LOOP_EXERCISE, differences, len(problems))


# --- 05.3-05.5: values read off the lesson -----------------------------------------------------------


def check_05_wilson_lower(answer: Any) -> bool:
    """05.3: a model solves 4 of 8 held-out problems: the lower end of the 95% Wilson interval, to 2 decimals."""
    expected = wilson_interval(4, 8)[0]
    hint = "call wilson_interval(successes, n) and read the first number; 50% on 8 problems is a wide range"
    return report_number("05.3 Wilson lower bound for 4/8", answer, expected, hint, tolerance=0.006)


def _problems_for_half_width(target: float = 0.05, rate: float = 0.5) -> int:
    n = 2
    while True:
        low, high = wilson_interval(round(rate * n), n)
        if (high - low) / 2 <= target:
            return n
        n += 2


def check_05_problems_needed(answer: Any) -> bool:
    """05.4: about how many problems give a 95% interval of at most ±5 points around an accuracy of 50%?"""
    expected = _problems_for_half_width(0.05, 0.5)
    hint = "try wilson_interval(n // 2, n) for growing n until (high - low) / 2 <= 0.05; any answer within 10% counts"
    return report_number("05.4 problems for ±5 points", answer, expected, hint, tolerance=0.1 * expected)


def check_05_checker_matters(answer: Any) -> bool:
    """05.5: which of ``CHECKER_OPTIONS_05`` does ``answers_match`` accept for gold ``"1000"``, exact match not?"""
    expected = {option for option in CHECKER_OPTIONS_05 if answers_match(option, "1000") and option != "1000"}
    given = {str(a).strip() for a in answer} if isinstance(answer, (list, tuple, set)) else None
    hint = "list the strings (e.g. ['1,000', ...]) that mean 1000 but are not written '1000'; try answers_match"
    return report("05.5 math-verify versus exact match", given == expected, hint, answer)


# --- 05.6: the lenient reader ------------------------------------------------------------------------

LAST_NUMBER_TEXTS = {
    "tagged answer": "<reasoning>\n9 + 9 = 18\n</reasoning>\n<answer>\n18\n</answer>",
    "plain sentence": "The answer is 72.",
    "thousands separator": "She earns 1,250 dollars.",
    "decimal": "Each costs 2.50, so 5.75 in all",
    "negative": "The temperature fell to -4 degrees",
    "several numbers, last wins": "3 boxes of 12 is 36 eggs, minus 6 is 30",
    "sentence-final full stop": "So the total is 42.",
    "no number at all": "I do not know.",
    "empty": "",
    # a number need not stand between spaces: splitting on whitespace loses each of these
    "glued to the tags": "<reasoning>9 + 9 = 18</reasoning><answer>18</answer>",
    "glued to $ and the tags": "<answer>$1,080</answer>",
    "glued to a word": "He ran 12km, then 5km more",
    "after an equals sign": "So 6 * 7=42",
    "in brackets": "the total (72)",
    "glued to a percent sign": "a rise of 15%",
    # a comma alone is no number: `[\d,]+` reads the commas of a list as one
    "a list with commas after the numbers": "She bought 3 apples, 4 pears, and more,",
    "a comma after the last number": "The answer is 18, I think, or so,",
}


def last_number_cases() -> list[Case]:
    """Completions a lenient reader meets: tagged answers, separators, decimals, signs, no number, glued numbers."""
    return [Case(label, (text,)) for label, text in LAST_NUMBER_TEXTS.items()]


def check_05_last_number(learner: Any) -> Callable[[str], str]:
    """05.6: ``text -> the last number in it`` (commas dropped, ``""`` when none) against ``evaluation.last_number``.

    Hands back the learner's function when it agrees on every case, else the package's ``last_number``.
    """
    exercise = "05.6 last number"
    hint = (
        "find every number with a regular expression (optional minus sign, digits and commas, optional decimals), "
        "wherever it stands; keep the last, drop its commas; '' when there is none"
    )
    passed = check_against_reference(exercise, learner, last_number, last_number_cases(), hint=hint)
    return hand_back(exercise, passed, learner, last_number, "evaluation.last_number")


# --- 05.2: the pass@k estimator ----------------------------------------------------------------------

# Sample counts where C(n, k) overflows a float (above about n = 1030): only an exact or a product form survives
LARGE_PASS_AT_K = ((2000, 3, 1000), (5000, 2500, 2500), (1200, 1, 1), (1500, 0, 700), (3000, 2990, 20))
# Inputs pass@k has no answer for: the reference raises on each, and so must yours (any ValueError or TypeError)
BAD_PASS_AT_K = {"k above n": (4, 1, 5), "c above n": (4, 5, 2), "negative c": (4, -1, 2), "no samples": (0, 0, 1),
                 "k of 0": (8, 2, 0)}  # fmt: skip


def pass_at_k_cases() -> list[Case]:
    """Every (n, c, k) with n up to 6, the named edges, large n, and inputs with no answer."""
    counts = [(n, c, k) for n in range(1, 7) for c in range(n + 1) for k in range(1, n + 1)]
    small = [Case(f"n={n}, c={c}, k={k}", (n, c, k)) for n, c, k in counts]
    edges = [Case("n = k, none right", (8, 0, 8)), Case("n = k, one right", (8, 1, 8)), Case("all right", (16, 16, 4)),
             Case("k = 1 is the right share", (16, 5, 1))]  # fmt: skip
    large = [Case(f"large n: n={n}, c={c}, k={k}", (n, c, k)) for n, c, k in LARGE_PASS_AT_K]
    bad = [Case(label, args) for label, args in BAD_PASS_AT_K.items()]
    return [*edges, *small, *large, *bad]


def check_05_pass_at_k(learner: Any) -> Callable[[int, int, int], float]:
    """05.2: ``pass_at_k(n, c, k)`` against ``evaluation.stats.pass_at_k``; hands back the learner's when it agrees."""
    exercise = "05.2 pass@k"
    hint = (
        "1 minus the chance that k samples drawn from the n (without putting back) are all among the n - c wrong ones; "
        "write that ratio of two binomial coefficients so that no huge number is ever formed (most factors "
        "cancel); mind the case where fewer than k are wrong, and refuse what n does not allow"
    )
    passed = check_against_reference(exercise, learner, pass_at_k, pass_at_k_cases(), hint=hint)
    return hand_back(exercise, passed, learner, pass_at_k, "evaluation.stats.pass_at_k")
