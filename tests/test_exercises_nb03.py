"""Notebook 03's checks, each tested three ways: the course's solution passes and is handed back, the learner's
stub reads "not answered yet" and the package's reward is handed back, and plausible wrong answers fail.

The solutions and stubs are the notebooks' own cells (``notebook_code.exercise``); the wrong answers are written
here as a learner writes them (the classic versions copied, a greedy ``.*``, ``isdigit``, a lone float...).
"""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
from notebook_code import exercise

from course_utils.core.answer_format import TAGS
from course_utils.exercises import nb03_reward_functions as nb03
from course_utils.exercises.nb03_reward_functions import case_banks, own_reward, trl_calls
from course_utils.lesson import rewards
from course_utils.lesson.rewards import answers_match, completion_texts, extract_xml_answer, plain_number

# name in the notebook: (check, exercise label, the package's reward the check hands back otherwise)
REWARD_EXERCISES = {
    "correctness_reward_func": (nb03.check_03_correctness, "03.1", rewards.correctness_reward_func),
    "int_reward_func": (nb03.check_03_int, "03.2", rewards.int_reward_func),
    "strict_format_reward_func": (nb03.check_03_strict_format, "03.3", rewards.strict_format_reward_func),
    "soft_format_reward_func": (nb03.check_03_soft_format, "03.4", rewards.soft_format_reward_func),
    "xmlcount_reward_func": (nb03.check_03_xmlcount, "03.5", rewards.xmlcount_reward_func),
}


@pytest.mark.parametrize("name", sorted(REWARD_EXERCISES))
def test_the_solution_passes_and_is_handed_back(name, gsm8k_train, capsys):
    check, label, _ = REWARD_EXERCISES[name]
    solution = exercise("03", name)
    assert check(solution, gsm8k_train) is solution
    out = capsys.readouterr().out
    assert f"✅ {label} {name}: same result as the reference" in out
    assert f"{label} {name}: the notebook continues with yours." in out


@pytest.mark.parametrize("name", sorted(REWARD_EXERCISES))
def test_the_stub_reads_not_answered_and_the_reference_is_handed_back(name, gsm8k_train, capsys):
    check, label, reference = REWARD_EXERCISES[name]
    stub = exercise("03", name, copy="notebooks")
    assert check(stub, gsm8k_train) is reference
    out = capsys.readouterr().out
    assert f"⏳ {label} {name}: not answered yet." in out
    assert f"continues with the package's rewards.{name}." in out
    assert check(None, gsm8k_train) is reference


# --- the wrong answers: what a learner writes when copying a tutorial or missing one case ---------------------


def _contents(completions):  # how the classic versions read completions: breaks on None and on plain text
    return [completion[0]["content"] for completion in completions]


def _classic_extract(text):
    return text.split("<answer>")[-1].split("</answer>")[0].strip()


def classic_correctness(prompts, completions, answer, **kwargs):  # the tutorial's: exact string comparison
    return [2.0 if _classic_extract(r) == a else 0.0 for r, a in zip(_contents(completions), answer, strict=False)]


def string_equality(prompts, completions, answer, **kwargs):  # the corrected extractor, but strings compared
    texts = completion_texts(completions)
    return [2.0 if extract_xml_answer(t) == gold else 0.0 for t, gold in zip(texts, answer, strict=True)]


def float_equality(prompts, completions, answer, **kwargs):  # float() cannot read "1,000" or "$72"
    def same(text, gold):
        try:
            return float(text) == float(gold)
        except ValueError:
            return False

    texts = completion_texts(completions)
    return [2.0 if same(extract_xml_answer(t), g) else 0.0 for t, g in zip(texts, answer, strict=True)]


def greedy_answer(prompts, completions, answer, **kwargs):  # `.*` runs from the first <answer> to the last
    def extract(text):
        found = re.search(r"<answer>(.*)</answer>", text, re.DOTALL)
        return found.group(1).strip() if found else ""

    texts = completion_texts(completions)
    return [2.0 if answers_match(extract(t), g) else 0.0 for t, g in zip(texts, answer, strict=True)]


def raises_on_none(prompts, completions, answer, **kwargs):  # right on text, but reads messages itself
    texts = _contents(completions)
    return [2.0 if answers_match(extract_xml_answer(t), g) else 0.0 for t, g in zip(texts, answer, strict=True)]


def classic_int(completions, **kwargs):
    return [0.5 if _classic_extract(r).isdigit() else 0.0 for r in _contents(completions)]


def isdigit_after_cleanup(completions, **kwargs):  # drops the sign and commas, but "²" is still a digit
    answers = [extract_xml_answer(t).lstrip("-$").replace(",", "") for t in completion_texts(completions)]
    return [0.5 if a.isdigit() else 0.0 for a in answers]


def int_parse(completions, **kwargs):  # int() refuses "18.00", "1,000" and "$72"
    def whole(text):
        try:
            int(text)
        except ValueError:
            return False
        return True

    return [0.5 if whole(extract_xml_answer(t)) else 0.0 for t in completion_texts(completions)]


def any_number(completions, **kwargs):  # forgets the whole-number test: 2.5 earns it too
    return [0.5 if plain_number(extract_xml_answer(t)) is not None else 0.0 for t in completion_texts(completions)]


CLASSIC_STRICT = r"^<reasoning>\n.*?\n</reasoning>\n<answer>\n.*?\n</answer>\n$"


def classic_strict(completions, **kwargs):  # no re.DOTALL: multi-line reasoning never matches
    return [0.5 if re.match(CLASSIC_STRICT, r) else 0.0 for r in _contents(completions)]


def strict_needs_final_newline(completions, **kwargs):  # re.DOTALL added, the trailing "\n$" kept
    return [0.5 if re.match(CLASSIC_STRICT, t, re.DOTALL) else 0.0 for t in completion_texts(completions)]


def greedy_strict(completions, **kwargs):  # `.*` with re.DOTALL swallows a second set of tags
    pattern = r"^<reasoning>\n.*\n</reasoning>\n<answer>\n.*\n</answer>\n?$"
    return [0.5 if re.match(pattern, t, re.DOTALL) else 0.0 for t in completion_texts(completions)]


def strict_allowing_blanks(completions, **kwargs):  # forgets that reasoning and answer must not be blank
    def strict(text):
        body = text.removesuffix("\n")
        if any(body.count(tag) != 1 for tag in TAGS):
            return False
        ends = body.startswith("<reasoning>\n") and body.endswith("\n</answer>")
        return ends and "\n</reasoning>\n<answer>\n" in body

    return [0.5 if strict(t) else 0.0 for t in completion_texts(completions)]


CLASSIC_SOFT = r"<reasoning>.*?</reasoning>\s*<answer>.*?</answer>"


def classic_soft(completions, **kwargs):  # no re.DOTALL: never matches the system prompt's own layout
    return [0.5 if re.match(CLASSIC_SOFT, r) else 0.0 for r in _contents(completions)]


def soft_without_strip(completions, **kwargs):  # re.DOTALL added, but spaces before the tags fail it
    return [0.5 if re.match(CLASSIC_SOFT, t, re.DOTALL) else 0.0 for t in completion_texts(completions)]


def soft_at_last_closing_tag(completions, **kwargs):  # rpartition: a stray </reasoning> inside is skipped
    def soft(text):
        body = text.strip()
        _, closed, rest = body.rpartition("</reasoning>")
        rest = rest.lstrip()
        return body.startswith("<reasoning>") and bool(closed) and rest.startswith("<answer>") and "</answer>" in rest

    return [0.5 if soft(t) else 0.0 for t in completion_texts(completions)]


def classic_xmlcount(completions, **kwargs):  # splits at "\n</answer>\n": charges the whole text without it
    def count(text):
        score = 0.125 * sum(text.count(tag) == 1 for tag in ("<reasoning>\n", "\n</reasoning>\n", "\n<answer>\n"))
        score -= len(text.split("\n</answer>\n")[-1]) * 0.001 if text.count("\n<answer>\n") == 1 else 0.0
        if text.count("\n</answer>") == 1:
            score += 0.125 - (len(text.split("\n</answer>")[-1]) - 1) * 0.001
        return score

    return [count(r) for r in _contents(completions)]


def _tags_alone(text):
    return [(tag, _tag_alone(text, tag)) for tag in TAGS]


def _tag_alone(text, tag):
    pos = text.find(tag)
    end = pos + len(tag)
    alone = text.count(tag) == 1 and (pos == 0 or text[pos - 1] == "\n") and (end == len(text) or text[end] == "\n")
    return pos if alone else -1


def _xmlcount(text, *, in_order=True, spaces=False, cap=True):
    score, previous = 0.0, -1
    for _, pos in _tags_alone(text):
        if pos > previous if in_order else pos >= 0:
            score += 0.125
            previous = pos
    _, closed, trailing = text.rpartition("</answer>")
    if closed:
        charged = len(trailing) if spaces else len("".join(trailing.split()))
        score -= min(0.001 * charged, 0.5) if cap else 0.001 * charged
    return score


def xmlcount_counting_spaces(completions, **kwargs):  # the newline after </answer> costs too
    return [_xmlcount(t, spaces=True) for t in completion_texts(completions)]


def xmlcount_any_order(completions, **kwargs):  # four tags alone on their lines count in any order
    return [_xmlcount(t, in_order=False) for t in completion_texts(completions)]


def xmlcount_without_cap(completions, **kwargs):  # a long ramble after </answer> costs without limit
    return [_xmlcount(t, cap=False) for t in completion_texts(completions)]


def constant(value):
    def reward(prompts=None, completions=None, answer=None, **kwargs):  # the same value for every completion
        return [value] * len(completions)

    return reward


def first_only(prompts, completions, answer, **kwargs):  # every batch of one passes; a real batch gets one reward
    text = completion_texts(completions)[0]
    return [2.0 if answers_match(extract_xml_answer(text), answer[0]) else 0.0]


def zip_not_strict(prompts, completions, answer, **kwargs):  # a missing gold answer drops a completion silently
    texts = completion_texts(completions)
    return [2.0 if answers_match(extract_xml_answer(t), g) else 0.0 for t, g in zip(texts, answer)]  # noqa: B905


def int_first_only(completions, **kwargs):
    number = plain_number(extract_xml_answer(completion_texts(completions)[0]))
    return [0.5 if number is not None and number == number.to_integral_value() else 0.0]


def strict_as_generator(completions, **kwargs):  # right values, but no list: TRL and reward_table need one
    return (rewards.strict_format_reward_func(completions=completions)[i] for i in range(len(completions)))


def soft_stops_at_a_bad_one(completions, **kwargs):  # returns early at the first completion without text
    scores = []
    for text in completion_texts(completions):
        if not text:
            return scores
        scores.append(rewards.soft_format_reward_func(completions=[text])[0])
    return scores


def xmlcount_last_only(completions, **kwargs):  # overwrites instead of appending
    score = 0.0
    for text in completion_texts(completions):
        score = rewards.xmlcount_reward_func(completions=[text])[0]
    return [score]


def float_after_cleanup(prompts, completions, answer, **kwargs):  # float() reads 1e3, 1_000 and nan as numbers
    def value(text):
        try:
            return float(text.replace(",", "").replace("$", ""))
        except ValueError:
            return None

    texts = completion_texts(completions)
    return [2.0 if (v := value(extract_xml_answer(t))) is not None and v == float(g) else 0.0
            for t, g in zip(texts, answer, strict=True)]


def int_by_float(completions, **kwargs):  # float().is_integer(): 1e3 and 1_000 count as whole numbers
    def whole(text):
        try:
            return float(text.replace(",", "").replace("$", "")).is_integer()
        except ValueError:
            return False

    return [0.5 if whole(extract_xml_answer(t)) else 0.0 for t in completion_texts(completions)]


WRONG_REWARDS = {  # (notebook name, wrong answer, what the check names: a case where the two differ)
    "float() after removing , and $": ("correctness_reward_func", float_after_cleanup, "answer 1e3 (an exponent)"),
    "float().is_integer()": ("int_reward_func", int_by_float, "answer 1_000 (an underscore)"),
    "scores the first completion only": ("correctness_reward_func", first_only, "list of 5, yours returns 1 reward(s)"),
    "zip without strict=True": ("correctness_reward_func", zip_not_strict, "3 completions, 2 gold answers"),
    "int: first completion only": ("int_reward_func", int_first_only, "1 reward(s) for 5 completion(s)"),
    "rewards as a generator": ("strict_format_reward_func", strict_as_generator, "returns a generator"),
    "stops at the first empty completion": ("soft_format_reward_func", soft_stops_at_a_bad_one, "a batch of"),
    "keeps the last score only": ("xmlcount_reward_func", xmlcount_last_only, "1 reward(s) for 5 completion(s)"),
    "0.5 for every layout": ("soft_format_reward_func", constant(0.5), "a sentence before <reasoning>"),
    "classic exact string comparison": ("correctness_reward_func", classic_correctness, "answer $1,000"),
    "strings compared, not values": ("correctness_reward_func", string_equality, "answer $1,000"),
    "float() on the answer": ("correctness_reward_func", float_equality, "answer $1,000"),
    "greedy .* in the answer pattern": ("correctness_reward_func", greedy_answer, "corrected after a long aside"),
    "raises on a None completion": ("correctness_reward_func", raises_on_none, "yours raises TypeError"),
    "2.0 for everything": ("correctness_reward_func", constant(2.0), "superscript two"),
    "classic isdigit": ("int_reward_func", classic_int, "negative answer"),
    "isdigit after stripping - and ,": ("int_reward_func", isdigit_after_cleanup, "superscript two"),
    "int() on the answer": ("int_reward_func", int_parse, "answer 18.00 for gold 18"),
    "any number, whole or not": ("int_reward_func", any_number, "decimal answer 2.5"),
    "0.5 for everything": ("int_reward_func", constant(0.5), "answer in words"),
    "classic strict, no re.DOTALL": ("strict_format_reward_func", classic_strict, "negative answer"),
    "a final newline required": ("strict_format_reward_func", strict_needs_final_newline, "negative answer"),
    "greedy .* with re.DOTALL": ("strict_format_reward_func", greedy_strict, "every tag twice"),
    "blank reasoning allowed": ("strict_format_reward_func", strict_allowing_blanks, "empty reasoning"),
    "classic soft, no re.DOTALL": ("soft_format_reward_func", classic_soft, "negative answer"),
    "no strip before the tags": ("soft_format_reward_func", soft_without_strip, "spaces before the tags"),
    "split at the last </reasoning>": ("soft_format_reward_func", soft_at_last_closing_tag, "closing tag twice"),
    "classic xmlcount": ("xmlcount_reward_func", classic_xmlcount, "yours returns 0.444"),
    "spaces counted after </answer>": ("xmlcount_reward_func", xmlcount_counting_spaces, "sample 'perfect'"),
    "tags counted in any order": ("xmlcount_reward_func", xmlcount_any_order, "tags in the wrong order"),
    "no cap on the penalty": ("xmlcount_reward_func", xmlcount_without_cap, "600 characters after"),
}


@pytest.mark.parametrize("mistake", sorted(WRONG_REWARDS))
def test_a_wrong_reward_fails_with_the_case_named_and_the_reference_handed_back(mistake, gsm8k_train, capsys):
    name, wrong, case = WRONG_REWARDS[mistake]
    check, label, reference = REWARD_EXERCISES[name]
    assert check(wrong, gsm8k_train) is reference
    out = capsys.readouterr().out
    assert f"❌ {label} {name}: differs from the reference" in out
    assert case in out, out
    assert f"continues with the package's rewards.{name}." in out


def test_the_package_reward_passed_as_an_answer_is_refused(gsm8k_train, capsys):
    assert nb03.check_03_int(rewards.int_reward_func, gsm8k_train) is rewards.int_reward_func
    assert "❌ 03.2 int_reward_func: that is the package's own" in capsys.readouterr().out


def test_reward_cases_are_real_rows_samples_and_edge_cases(gsm8k_train):
    cases = case_banks.reward_cases(gsm8k_train)
    labels = [case.label for case in cases]
    assert sum(label.startswith("row ") for label in labels) >= 40
    assert any(label.startswith("sample 'perfect'") for label in labels)
    assert any(label.startswith("no completion at all") for label in labels)
    (kwargs,) = cases[0].args
    trl_keywords = {"prompts", "completions", "completion_ids", "trainer_state", "log_extra", "log_metric"}
    assert trl_keywords | {"answer", "reasoning"} <= set(kwargs)


# --- 03.6 and 03.7: values ----------------------------------------------------------------------------------


def test_the_value_answers_of_the_solution_pass_and_the_stubs_read_not_answered(capsys):
    assert nb03.check_03_classic_comma(exercise("03", "answer_1"))
    assert nb03.check_03_dotall_flag(exercise("03", "answer_2"))
    assert "✅ 03.6" in capsys.readouterr().out
    assert exercise("03", "answer_1", copy="notebooks") is None
    assert not nb03.check_03_classic_comma(exercise("03", "answer_1", copy="notebooks"))
    assert not nb03.check_03_dotall_flag(exercise("03", "answer_2", copy="notebooks"))
    out = capsys.readouterr().out
    assert "⏳ 03.6 classic correctness on 1,000: not answered yet" in out and "⏳ 03.7 regex flag" in out


@pytest.mark.parametrize("right", [0.0, 0, np.float64(0.0)])
def test_03_6_accepts_zero(right):
    assert nb03.check_03_classic_comma(right)


@pytest.mark.parametrize("wrong", [2.0, 2, "1,000", 0.5, [0.0], "0", "0.0", False])
def test_03_6_refuses_what_the_corrected_reward_or_a_misreading_gives(wrong, capsys):
    assert not nb03.check_03_classic_comma(wrong)
    assert "❌ 03.6" in capsys.readouterr().out


@pytest.mark.parametrize("right", ["re.DOTALL", "DOTALL", "S", "re.S", " `re.DOTALL` ", re.DOTALL, re.S])
def test_03_7_accepts_the_flag_by_either_name_or_itself(right):
    assert nb03.check_03_dotall_flag(right)


@pytest.mark.parametrize("wrong", ["re.MULTILINE", "M", re.MULTILINE, "re.IGNORECASE", re.DOTALL | re.MULTILINE, 16])
def test_03_7_refuses_other_flags(wrong, capsys):
    assert not nb03.check_03_dotall_flag(wrong)
    assert "❌ 03.7 regex flag" in capsys.readouterr().out


# --- 03.8: a reward of the learner's own, judged on TRL's contract ------------------------------------------


def test_the_own_reward_of_the_solution_passes_inside_trl_and_is_handed_back(gsm8k_train, capsys):
    solution = exercise("03", "own_reward_func")
    assert nb03.check_03_own_reward(solution, gsm8k_train) is solution
    out = capsys.readouterr().out
    assert "✅ 03.8 your own reward:" in out and "GRPOTrainer's own reward code ran it" in out
    assert "03.8 your own reward: the notebook continues with yours." in out


def test_a_trl_that_renamed_its_reward_code_is_the_courses_fault_not_the_learners(gsm8k_train, capsys, monkeypatch):
    """A TRL release without ``_calculate_rewards``: the check says so and the notebook goes on with theirs."""
    from trl import GRPOTrainer

    solution = exercise("03", "own_reward_func")
    trl_calls._trl_extras.cache_clear()
    monkeypatch.delattr(GRPOTrainer, "_calculate_rewards")
    try:
        assert nb03.check_03_own_reward(solution, gsm8k_train) is solution
    finally:
        trl_calls._trl_extras.cache_clear()
    out = capsys.readouterr().out
    assert "⚠️ 03.8 your own reward: unchecked" in out and "_calculate_rewards" in out and "not your code" in out
    assert "could not use it" not in out


def test_the_own_reward_stub_reads_not_answered(gsm8k_train, capsys):
    stub = exercise("03", "own_reward_func", copy="notebooks")
    assert nb03.check_03_own_reward(stub, gsm8k_train) is own_reward.repetition_penalty_reference
    out = capsys.readouterr().out
    assert "⏳ 03.8 your own reward: not answered yet." in out
    assert "continues with the package's repetition_penalty_reference" in out


def length_penalty(completions, **kwargs):  # another idea: shorter is better
    return [-len(text) / 1000 for text in completion_texts(completions)]


def logs_a_metric(completions, log_metric, **kwargs):  # uses TRL's log_metric, returns None where it does not apply
    texts = completion_texts(completions)
    log_metric("own/answered", sum("</answer>" in t for t in texts) / len(texts))
    return [None if not t else float(t.count("\n")) for t in texts]


def as_numpy(completions, answer, **kwargs):  # an array of floats: TRL takes it too
    texts = completion_texts(completions)
    return np.array([float(answers_match(extract_xml_answer(t), g)) for t, g in zip(texts, answer, strict=True)])


@pytest.mark.parametrize("right", [length_penalty, logs_a_metric, as_numpy])
def test_other_rewards_that_keep_the_contract_pass(right, gsm8k_train, capsys):
    assert nb03.check_03_own_reward(right, gsm8k_train) is right
    assert "✅ 03.8" in capsys.readouterr().out


def single_float(completions, **kwargs):  # the share of repeated lines of the first completion only
    lines = [line.strip() for line in completion_texts(completions)[0].splitlines() if line.strip()]
    return -(len(lines) - len(set(lines))) / len(lines) if lines else 0.0


def reads_messages_itself(completions, **kwargs):  # breaks on None and on plain-text completions
    texts = [completion[0]["content"] for completion in completions]
    return [-float(len(t.splitlines()) > 10) for t in texts]


def no_kwargs(completions):  # TRL passes prompts, completion_ids, answer...: this one cannot take them
    return [-float(len(t) > 500) for t in completion_texts(completions)]


def skips_empty_completions(completions, **kwargs):  # one reward per completion with text: too few
    return [-float(t.count("\n") > 10) for t in completion_texts(completions) if t]


def nan_for_empty(completions, **kwargs):  # 0/0 on an empty completion
    return [t.count("\n\n") / t.count("\n") if "\n" in t else float("nan") for t in completion_texts(completions)]


def as_text(completions, **kwargs):
    return [f"{-len(t) / 1000:.3f}" for t in completion_texts(completions)]


WRONG_OWN_REWARDS = {
    "a single float": (single_float, "returns a single number, not a list"),
    "raises on None": (reads_messages_itself, "junk completions: raises TypeError"),
    "no **kwargs": (no_kwargs, "raises TypeError"),
    "one reward per non-empty completion": (skips_empty_completions, "junk completions: 3 reward(s) for 9"),
    "NaN for an empty completion": (nan_for_empty, "nan: TRL reads a NaN as None"),
    "rewards as text": (as_text, "is a str, not a float"),
    "the same reward for everything": (constant(0.0), "gives every completion the same reward (0)"),
}


@pytest.mark.parametrize("mistake", sorted(WRONG_OWN_REWARDS))
def test_an_own_reward_that_breaks_the_contract_fails(mistake, gsm8k_train, capsys):
    wrong, message = WRONG_OWN_REWARDS[mistake]
    assert nb03.check_03_own_reward(wrong, gsm8k_train) is own_reward.repetition_penalty_reference
    out = capsys.readouterr().out
    assert "❌ 03.8 your own reward: not yet:" in out
    assert message in out, out


async def async_penalty(completions, **kwargs):  # TRL 1.16 awaits an async def reward
    return length_penalty(completions)


async def async_correctness(prompts, completions, answer, **kwargs):
    return rewards.correctness_reward_func(prompts, completions, answer)


def test_an_async_own_reward_passes_and_the_notebook_gets_a_plain_function(gsm8k_train, capsys):
    handed_back = nb03.check_03_own_reward(async_penalty, gsm8k_train)
    assert "✅ 03.8" in capsys.readouterr().out
    assert handed_back.__name__ == "async_penalty"
    completions = [[{"role": "assistant", "content": "a\na\nb"}], "x"]
    assert handed_back(completions=completions) == length_penalty(completions)


def test_an_async_corrected_reward_passes_and_is_handed_back_awaited(gsm8k_train, capsys):
    handed_back = nb03.check_03_correctness(async_correctness, gsm8k_train)
    assert "✅ 03.1 correctness_reward_func" in capsys.readouterr().out
    completions = [[{"role": "assistant", "content": "<answer>\n1,000\n</answer>"}]]
    assert handed_back(prompts=None, completions=completions, answer=["1000"]) == [2.0]


def test_the_own_reward_is_run_by_trl_itself(gsm8k_train):
    calls = []

    def counted(completions, **kwargs):
        calls.append(sorted(kwargs))
        return length_penalty(completions)

    assert nb03.check_03_own_reward(counted, gsm8k_train) is counted
    assert all({"log_extra", "log_metric", "trainer_state", "answer"} <= set(keys) for keys in calls)
    assert len(calls) == len(own_reward.contract_batches(gsm8k_train)) + 1, "TRL's own call never happened"


# --- Round two: answers that change their inputs, cases that tell, rewards that are not finite ----------------


def strips_messages_in_place(completions, answer, **kwargs):
    """The right rewards, after editing TRL's message dicts in place."""
    for completion in completions:
        if isinstance(completion, list) and completion and isinstance(completion[0], dict):
            completion[0]["content"] = (completion[0].get("content") or "").strip() or completion[0].get("content")
    return rewards.correctness_reward_func(completions=completions, answer=answer, **kwargs)


def test_03_1_a_reward_that_edits_trl_s_messages_in_place_fails(gsm8k_train, capsys):
    assert nb03.check_03_correctness(strips_messages_in_place, gsm8k_train) is rewards.correctness_reward_func
    out = capsys.readouterr().out
    assert "❌ 03.1" in out and "changes its input in place" in out, out


def strict_with_rstrip(completions, **kwargs):
    """The strict format on ``text.rstrip()``: two final newlines or a final space pass."""
    return [0.5 if rewards.is_strict_format(text.rstrip() + "\n") else 0.0 for text in rewards.completion_texts(
        completions)]


def strict_counting_opening_tags(completions, **kwargs):
    """Each opening tag once, the closing ones not counted: a repeated closing tag passes."""
    scores = []
    for text in rewards.completion_texts(completions):
        body = text.removesuffix("\n")
        once = body.count("<reasoning>") == 1 and body.count("<answer>") == 1
        shape = body.startswith("<reasoning>\n") and body.endswith("\n</answer>")
        inner = body[len("<reasoning>\n") : -len("\n</answer>")]
        reasoning, separator, answer = inner.partition("\n</reasoning>\n<answer>\n")
        scores.append(0.5 if once and shape and separator and reasoning.strip() and answer.strip() else 0.0)
    return scores


def soft_with_text_before(completions, **kwargs):
    """The soft format from the first ``<reasoning>`` on: text before it passes."""
    texts = rewards.completion_texts(completions)
    return [0.5 if rewards.is_soft_format(text[text.find("<reasoning>"):]) else 0.0 for text in texts]


@pytest.mark.parametrize(("check", "wrong", "named"), [
    (nb03.check_03_strict_format, strict_with_rstrip, "two final newlines"),
    (nb03.check_03_strict_format, strict_counting_opening_tags, "closing answer tag twice at the end"),
    (nb03.check_03_soft_format, soft_with_text_before, "a sentence before <reasoning>"),
], ids=["rstrip", "opening tags only", "text before"])
def test_03_3_and_03_4_the_cases_tell_near_misses(check, wrong, named, gsm8k_train, capsys):
    assert check(wrong, gsm8k_train) is not wrong
    out = capsys.readouterr().out
    assert "differs from the reference" in out and named in out, out


def sorts_in_place(completions, **kwargs):
    """Shorter completions score higher, after sorting TRL's list in place: rewards in the wrong order."""
    completions.sort(key=lambda c: len(rewards.completion_text(c)))
    return [-len(rewards.completion_text(c)) / 1000 for c in completions]


def infinite_for_loops(completions, **kwargs):
    return [math.inf if text.count("\n") > 8 else len(text) / 1000 for text in rewards.completion_texts(completions)]


def minus_infinite_for_empty(completions, **kwargs):
    return [len(text) / 1000 if text.strip() else -math.inf for text in rewards.completion_texts(completions)]


def nan_for_blank(completions, **kwargs):
    return [len(text.strip()) / len(text.strip()) * 0.1 * len(text) if text.strip() else math.nan
            for text in rewards.completion_texts(completions)]


@pytest.mark.parametrize(("wrong", "named"), [
    (sorts_in_place, "changes its input in place"),
    (infinite_for_loops, "inf: TRL adds it into the completion's total"),
    (minus_infinite_for_empty, "-inf: TRL adds it into the completion's total"),
    (nan_for_blank, "nan: TRL reads a NaN as None"),
], ids=["sorts in place", "inf", "-inf", "nan"])
def test_03_8_mutating_and_non_finite_rewards_fail(wrong, named, gsm8k_train, capsys):
    assert nb03.check_03_own_reward(wrong, gsm8k_train) is own_reward.repetition_penalty_reference
    out = capsys.readouterr().out
    assert "❌ 03.8" in out and named in out, out
