"""Notebook 05's checks, three ways each: the course's solution passes, the learner's stub reads "not answered
yet" (and the notebook continues with the package's function), and plausible wrong answers fail.

The solutions and stubs are the notebooks' own cells (``tests/notebook_code.exercise``). 05.1 is the evaluation
loop (run on the offline model, so ``slow``); 05.3-05.5 are values; 05.6 is the lenient reader ``last_number``,
with the issue's wrong answer that splits on whitespace and loses every number glued to a tag; 05.2 is the pass@k
estimator, whose reference is checked against brute force over every subset.
"""

from __future__ import annotations

import itertools
import json
import math
import re
from pathlib import Path
from statistics import NormalDist

import pytest
import torch
from datasets import Dataset
from notebook_code import exercise

from course_utils.evaluation.metrics import last_number as package_last_number
from course_utils.evaluation.stats import pass_at_k
from course_utils.exercises import nb05_evaluate as nb05
from course_utils.lesson.rewards import answers_match, extract_xml_answer

# --- 05.1: the evaluation loop ----------------------------------------------------------------------------------


def make_loop(*, prompt_too=False, padding_side="left", sample=False, first_batch_only=False, drop=None,
              exact=False, special=False):
    """The learner's loop, or one of its classic slips (each keyword is one)."""

    def loop(model, tokenizer, problems, batch_size, max_new_tokens):
        records = []
        for start in range(0, len(problems), batch_size):
            batch = problems.select(range(start, min(start + batch_size, len(problems))))
            texts = tokenizer.apply_chat_template(list(batch["prompt"]), add_generation_prompt=True, tokenize=False)
            inputs = tokenizer(texts, return_tensors="pt", padding=True, padding_side=padding_side,
                               add_special_tokens=False)  # fmt: skip
            with torch.inference_mode():
                output = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=sample,
                                        pad_token_id=tokenizer.pad_token_id)  # fmt: skip
            new = output if prompt_too else output[:, inputs["input_ids"].shape[1] :]
            for completion, gold in zip(tokenizer.batch_decode(new, skip_special_tokens=not special), batch["answer"],
                                        strict=True):  # fmt: skip
                extracted = extract_xml_answer(completion)
                same = extracted == gold if exact else answers_match(extracted, gold)
                record = {"completion": completion, "extracted": extracted,
                          "correct": bool(extracted) and bool(same)}  # fmt: skip
                records.append({k: v for k, v in record.items() if k != drop})
            if first_batch_only:
                break
        return records

    return loop


def test_05_1_stub_reads_not_answered_and_the_package_takes_over(capsys):
    stub = exercise("05", "evaluate_loop", copy="notebooks")
    # the stub is not run, nor is the reference: no model is needed to say "not answered"
    assert nb05.check_evaluation_loop(stub, None, None, None, batch_size=2, max_new_tokens=4) is (
        nb05.evaluate_loop_reference
    )
    out = capsys.readouterr().out
    assert out.startswith("⏳ 05.1 evaluation loop: not answered yet")
    assert "continues with the package's evaluate_loop_reference" in out


@pytest.mark.parametrize("answer", ["loop", nb05.evaluate_loop_reference], ids=["a string", "the package's own"])
def test_05_1_what_is_not_a_loop_of_ones_own_fails_without_running(answer, capsys):
    assert nb05.check_evaluation_loop(answer, None, None, None, batch_size=2, max_new_tokens=4) is (
        nb05.evaluate_loop_reference
    )
    assert capsys.readouterr().out.startswith("❌ 05.1 evaluation loop")


def test_05_1_a_loop_that_raises_is_a_verdict_not_a_crash(capsys):
    def generator_that_fails(model, tokenizer, problems, batch_size, max_new_tokens):
        yield {"completion": "", "extracted": "", "correct": False}
        raise RuntimeError("out of problems")  # raised only when the records are read

    for loop in (generator_that_fails, lambda *args: 1 / 0):
        assert nb05.check_evaluation_loop(loop, None, None, [], batch_size=2, max_new_tokens=4) is (
            nb05.evaluate_loop_reference
        )
    out = capsys.readouterr().out
    assert "❌ 05.1 evaluation loop" in out and "your loop raises RuntimeError: out of problems" in out
    assert "your loop raises ZeroDivisionError" in out


@pytest.fixture(autouse=True)
def plain_generation(monkeypatch):
    """The loops compared here read three problems for a few tokens: the CPU plug-in's packing would cost more
    than it saves (it gives the same tokens; tests/test_cpu_speed_equivalence.py shows that)."""
    monkeypatch.setenv("COURSE_CPU_SPEEDUPS", "0")


@pytest.fixture(scope="module")
def three_problems():
    """Three short chats, the first one the shortest: right padding garbles it. Short prompts keep the test fast;
    the notebook checks the same loop on GSM8K problems under nbmake."""
    chats = [
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2 + 3?"}],
        [{"role": "system", "content": "Answer with one number inside <answer> tags."},
         {"role": "user", "content": "Four dozen eggs: how many eggs is that?"}],
        [{"role": "user", "content": "How many legs do 3 cats have?"}],
    ]  # fmt: skip
    golds = ["5", "48", "12"]
    return Dataset.from_list([{"prompt": chat, "answer": gold} for chat, gold in zip(chats, golds, strict=True)])


@pytest.mark.slow
def test_05_1_solution_passes_and_is_handed_back(offline_model_and_tokenizer, three_problems, capsys):
    model, tokenizer = offline_model_and_tokenizer
    solution = exercise("05", "evaluate_loop")
    settings = {"batch_size": 2, "max_new_tokens": 6}  # two batches, the second one short: as the notebook checks
    assert nb05.check_evaluation_loop(solution, model, tokenizer, three_problems, **settings) is solution
    out = capsys.readouterr().out
    assert out.startswith("✅ 05.1 evaluation loop: the same records as the package's loop on all 3 problems")
    assert "continues with yours" in out
    reference = nb05.evaluate_loop_reference(model, tokenizer, three_problems, 2, 6)
    wanted = [{name: record[name] for name in nb05.RECORD_FIELDS} for record in reference]
    assert make_loop()(model, tokenizer, three_problems, 2, 6) == wanted  # the tests' own loop is right too


def raises(model, tokenizer, problems, batch_size, max_new_tokens):
    return [problems[i]["prompt"]["content"] for i in range(len(problems))]  # a list of messages has no ["content"]


WRONG_LOOPS = {  # the slip, the difference the check must name
    "decodes the prompt too": (make_loop(prompt_too=True), "problem 0, completion: yours"),
    "right padding": (make_loop(padding_side="right"), "problem 0, completion: yours"),  # the shortest prompt
    "samples instead of greedy": (make_loop(sample=True), ", completion: yours"),
    "only the first batch": (make_loop(first_batch_only=True), "records: yours 2, reference 3"),
    "records without extracted": (make_loop(drop="extracted"), "problem 0, extracted: yours '(not set)'"),
    "raises": (raises, "your loop raises TypeError"),
    "compares answers as strings": (make_loop(exact=True), "the model made to answer $1,000 then stop"),
    "keeps special tokens": (make_loop(special=True), "the model made to answer $1,000 then stop"),
}


@pytest.mark.slow
@pytest.mark.parametrize("slip", sorted(WRONG_LOOPS))
def test_05_1_wrong_loops_fail_naming_what_differs(slip, offline_model_and_tokenizer, three_problems, capsys):
    model, tokenizer = offline_model_and_tokenizer
    loop, named = WRONG_LOOPS[slip]
    torch.manual_seed(0)  # the sampling slip draws the same tokens every run
    settings = {"batch_size": 2, "max_new_tokens": 4}
    assert nb05.check_evaluation_loop(loop, model, tokenizer, three_problems, **settings) is (
        nb05.evaluate_loop_reference
    )  # never raises: the learner's error is a verdict
    out = capsys.readouterr().out
    assert out.startswith("❌ 05.1 evaluation loop: differs from the package's loop")
    assert named in out and "continues with the package's evaluate_loop_reference" in out


def test_05_1_record_differences_name_the_field_and_the_count():
    reference = [{"completion": "a", "extracted": "1", "correct": True, "tokens": 3}] * 2
    assert nb05.record_differences([{"completion": "a", "extracted": "1", "correct": True}] * 2, reference) == []
    assert nb05.record_differences(None, reference) == [
        "your loop returns a NoneType, not a list of records (one dict per problem)"
    ]
    assert nb05.record_differences(iter(reference), reference) == []  # any iterable of records will do
    wrong = [{"completion": "a", "extracted": "1", "correct": False}, {"completion": "a", "extracted": "1"}]
    assert nb05.record_differences(wrong, reference) == [
        "problem 0, correct: yours False, reference True",
        "problem 1, correct: yours '(not set)', reference True",
    ]


# --- 05.3-05.5: values ----------------------------------------------------------------------------------------

VALUES = {  # name in the notebook, its check, plausible wrong answers
    "wilson_lower": (nb05.check_05_wilson_lower, "05.3", [0.5, 0.15, 0.78, 21.5, "0.22"]),  # rate, normal, upper, %
    "problems_needed": (nb05.check_05_problems_needed, "05.4", [100, 96, 1537, 0.05, "382"]),  # ±10, ±2.5 points
    "accepted_only_by_math_verify": (
        nb05.check_05_checker_matters,
        "05.5",
        [["1000", "1,000", "$1000", "1000.0"], ["1,000", "$1000"], ["1,000", "$1000", "1000.0", "one thousand"],
         "1,000", ["1,000", "$1000", "100"]],
    ),
}


@pytest.mark.parametrize("name", sorted(VALUES))
def test_05_values_solution_passes_and_stub_reads_not_answered(name, capsys):
    check, label, _ = VALUES[name]
    assert check(exercise("05", name)) is True
    assert capsys.readouterr().out.startswith(f"✅ {label} ")
    assert exercise("05", name, copy="notebooks") is None
    assert check(None) is False
    assert capsys.readouterr().out.startswith(f"⏳ {label} ")


@pytest.mark.parametrize(("name", "wrong"), [(n, w) for n, (_, _, ws) in VALUES.items() for w in ws])
def test_05_values_wrong_answers_fail(name, wrong, capsys):
    check, label, _ = VALUES[name]
    assert check(wrong) is False
    assert capsys.readouterr().out.startswith(f"❌ {label} ")


def test_05_4_accepts_the_normal_approximation():
    assert nb05.check_05_problems_needed(round(NormalDist().inv_cdf(0.975) ** 2 * 0.25 / 0.05**2))


# --- 05.6: the lenient reader ---------------------------------------------------------------------------------


def split_and_strip(text):
    """The issue's wrong answer: split on whitespace, strip punctuation, keep the last word that is a number."""
    found = ""
    for word in text.split():
        word = word.strip(".,;:!?$").replace(",", "")
        try:
            float(word)
        except ValueError:
            continue
        found = word
    return found


def first_number(text):
    return (re.findall(r"-?\d[\d,]*(?:\.\d+)?", text) or [""])[0].replace(",", "")


def keeps_commas(text):
    return (re.findall(r"-?\d[\d,]*(?:\.\d+)?", text) or [""])[-1]


def whole_numbers_only(text):
    return (re.findall(r"-?\d[\d,]*", text) or [""])[-1].replace(",", "")


def no_minus_sign(text):
    return (re.findall(r"\d[\d,]*(?:\.\d+)?", text) or [""])[-1].replace(",", "")


def none_when_no_number(text):
    found = re.findall(r"-?\d[\d,]*(?:\.\d+)?", text)
    return found[-1].replace(",", "") if found else None


def lone_commas(text):
    """``[\\d,]+`` reads a comma alone as a number: the last match of a list is then ','."""
    found = re.findall(r"-?[\d,]+(?:\.\d+)?", text)
    return found[-1].replace(",", "") if found else ""


WRONG_READERS = {  # the wrong answer, a case it must be caught on
    split_and_strip: "glued to the tags",
    first_number: "several numbers, last wins",
    keeps_commas: "thousands separator",
    whole_numbers_only: "decimal",
    no_minus_sign: "negative",
    none_when_no_number: "no number at all",
    lone_commas: "a list with commas after the numbers",
}


def test_05_6_solution_passes_and_is_handed_back(capsys):
    solution = exercise("05", "last_number")
    assert nb05.check_05_last_number(solution) is solution
    out = capsys.readouterr().out
    assert out.startswith("✅ 05.6 last number") and "continues with yours" in out


def test_05_6_stub_reads_not_answered_and_the_package_takes_over(capsys):
    stub = exercise("05", "last_number", copy="notebooks")
    assert nb05.check_05_last_number(stub) is package_last_number
    out = capsys.readouterr().out
    assert out.startswith("⏳ 05.6 last number: not answered yet")
    assert "continues with the package's evaluation.last_number" in out


@pytest.mark.parametrize("wrong", sorted(WRONG_READERS, key=lambda f: f.__name__), ids=lambda f: f.__name__)
def test_05_6_wrong_readers_fail_naming_the_case(wrong, capsys):
    assert nb05.check_05_last_number(wrong) is package_last_number
    out = capsys.readouterr().out
    assert out.startswith("❌ 05.6 last number: differs from the reference")
    assert f"- {WRONG_READERS[wrong]}" in out


def test_05_6_the_issue_s_reader_passes_the_old_cases_and_loses_a_tagged_answer():
    """Why the bank grew: splitting on whitespace agrees on the nine cases it used to have, not on a glued tag."""
    old_cases = list(nb05.LAST_NUMBER_TEXTS.values())[:9]
    assert [split_and_strip(text) for text in old_cases] == [package_last_number(text) for text in old_cases]
    assert split_and_strip("<answer>18</answer>") == "" and package_last_number("<answer>18</answer>") == "18"
    glued = [c for c in nb05.last_number_cases() if split_and_strip(*c.args) != package_last_number(*c.args)]
    assert len(glued) >= 3


# --- 05.2: the pass@k estimator -----------------------------------------------------------------------------


def brute_force_pass_at_k(n: int, c: int, k: int) -> float:
    """pass@k by listing every subset of k of the n samples (c right): the definition, for small n."""
    samples = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(samples[i] for i in subset) for subset in subsets) / len(subsets)


def with_replacement(n, c, k):
    """k draws with replacement: 1 - (1 - c/n)^k, biased below the estimator for k > 1."""
    if n < 1 or not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError("out of range")
    return 1 - (1 - c / n) ** k


def float_factorials(n, c, k):
    """The textbook formula with factorials in floating point: overflows once n passes 170."""
    if n < 1 or not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError("out of range")

    def comb(a, b):
        return float(math.factorial(a)) / (float(math.factorial(b)) * float(math.factorial(a - b))) if a >= b else 0.0

    return 1 - comb(n - c, k) / comb(n, k)


def no_range_checks(n, c, k):
    """The product form without refusing what n does not allow (k > n gives a value above 1)."""
    all_wrong = 1.0
    for i in range(n - c + 1, n + 1):
        all_wrong *= 1 - k / i
    return 1 - all_wrong


def right_share(n, c, k):
    """pass@1 for every k."""
    if n < 1 or not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError("out of range")
    return c / n


def as_text(n, c, k):
    """The right value as a string: a later cell adds and plots it."""
    return f"{pass_at_k(n, c, k):.6f}"


def as_percent(n, c, k):
    return 100 * pass_at_k(n, c, k)


WRONG_ESTIMATORS = {
    with_replacement: "n=2, c=1, k=2",
    float_factorials: "large n",
    no_range_checks: "k above n",
    right_share: "n = k, one right",
    as_text: "n = k, one right: the reference returns 1.0, yours returns '1.000000'",
    as_percent: "n = k, one right: the reference returns 1.0, yours returns 100.0",
}


@pytest.mark.parametrize("n", range(1, 8))
def test_05_2_reference_equals_brute_force_on_every_small_case(n):
    for c in range(n + 1):
        for k in range(1, n + 1):
            assert math.isclose(pass_at_k(n, c, k), brute_force_pass_at_k(n, c, k), abs_tol=1e-12), (n, c, k)


def test_05_2_known_values_and_large_n():
    assert pass_at_k(8, 0, 8) == 0.0 and pass_at_k(8, 1, 8) == 1.0 and pass_at_k(16, 16, 4) == 1.0
    assert math.isclose(pass_at_k(16, 5, 1), 5 / 16)
    exact = 1 - math.comb(4999, 2500) / math.comb(5000, 2500)  # Python's exact integers: no overflow, just slow
    assert math.isclose(pass_at_k(5000, 1, 2500), exact) and math.isclose(exact, 0.5)
    assert all(0.0 <= pass_at_k(n, c, k) <= 1.0 for n, c, k in nb05.LARGE_PASS_AT_K)


def test_05_2_solution_passes_and_is_handed_back(capsys):
    solution = exercise("05", "pass_at_k")
    assert nb05.check_05_pass_at_k(solution) is solution
    out = capsys.readouterr().out
    assert out.startswith("✅ 05.2 pass@k") and "continues with yours" in out


def test_05_2_stub_reads_not_answered_and_the_package_takes_over(capsys):
    stub = exercise("05", "pass_at_k", copy="notebooks")
    assert nb05.check_05_pass_at_k(stub) is pass_at_k
    out = capsys.readouterr().out
    assert out.startswith("⏳ 05.2 pass@k: not answered yet")
    assert "continues with the package's evaluation.stats.pass_at_k" in out


@pytest.mark.parametrize("wrong", list(WRONG_ESTIMATORS), ids=lambda f: f.__name__)
def test_05_2_wrong_estimators_fail_naming_a_case(wrong, capsys):
    assert nb05.check_05_pass_at_k(wrong) is pass_at_k
    out = capsys.readouterr().out
    assert out.startswith("❌ 05.2 pass@k: differs from the reference")
    assert f"- {WRONG_ESTIMATORS[wrong]}" in out


def test_05_2_the_package_s_own_estimator_is_refused(capsys):
    assert nb05.check_05_pass_at_k(pass_at_k) is pass_at_k
    assert "that is the package's own" in capsys.readouterr().out


# --- the order of the exercises -------------------------------------------------------------------------------------

EXERCISE_STATEMENT = r"\(exercise (\d\d\.\d+)\)|\*\*Exercise (\d\d\.\d+)|^\*\*(\d\d\.\d+)\*\*"


@pytest.mark.parametrize("path", sorted(Path(__file__).resolve().parents[1].glob("solutions/*.ipynb")),
                         ids=lambda p: p.stem)
def test_every_notebook_states_its_exercises_in_order(path):
    """A learner reads 05.2 before 05.3: the numbers follow the notebook's own order."""
    notebook = json.loads(path.read_text(encoding="utf-8"))
    text = "\n".join("".join(c["source"]) for c in notebook["cells"] if c["cell_type"] == "markdown")
    numbers = [next(g for g in m.groups() if g) for m in re.finditer(EXERCISE_STATEMENT, text, re.M)]
    order = [tuple(int(part) for part in n.split(".")) for n in numbers]
    assert order == sorted(order) and len(set(order)) == len(order), numbers
