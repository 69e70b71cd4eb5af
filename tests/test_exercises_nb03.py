"""Notebook 03's checks: the five corrected rewards and the learner's own, on real rows and the sample bank."""

from __future__ import annotations

import re

import pytest

from course_utils.core.answer_format import TAGS
from course_utils.exercises import nb03_reward_functions as nb03
from course_utils.lesson.rewards import answers_match, classic, completion_texts, extract_xml_answer, plain_number


def test_value_checks_of_03_accept_the_right_answers():
    assert nb03.check_03_classic_comma(0.0) and not nb03.check_03_classic_comma(2.0)
    assert nb03.check_03_dotall_flag("re.DOTALL") and nb03.check_03_dotall_flag("S")
    assert not nb03.check_03_dotall_flag("MULTILINE")



# --- 03: the learner's five rewards and a reward of their own, against course_utils.lesson.rewards ---------------



def correctness_reward_func(prompts, completions, answer, **kwargs):
    texts = completion_texts(completions)
    return [2.0 if answers_match(extract_xml_answer(t), gold) else 0.0 for t, gold in zip(texts, answer, strict=True)]


def int_reward_func(completions, **kwargs):
    numbers = [plain_number(extract_xml_answer(t)) for t in completion_texts(completions)]
    return [0.5 if n is not None and n == n.to_integral_value() else 0.0 for n in numbers]


def is_strict_format(text):
    body = text.removesuffix("\n")
    if any(body.count(tag) != 1 for tag in TAGS):
        return False
    if not (body.startswith("<reasoning>\n") and body.endswith("\n</answer>")):
        return False
    inner = body[len("<reasoning>\n") : -len("\n</answer>")]
    reasoning, separator, answer = inner.partition("\n</reasoning>\n<answer>\n")
    return bool(separator) and bool(reasoning.strip()) and bool(answer.strip())


def strict_format_reward_func(completions, **kwargs):
    return [0.5 if is_strict_format(t) else 0.0 for t in completion_texts(completions)]


def is_soft_format(text):
    body = text.strip()
    if not body.startswith("<reasoning>"):
        return False
    _, closed, rest = body[len("<reasoning>") :].partition("</reasoning>")
    rest = rest.lstrip()
    return bool(closed) and rest.startswith("<answer>") and "</answer>" in rest[len("<answer>") :]


def soft_format_reward_func(completions, **kwargs):
    return [0.5 if is_soft_format(t) else 0.0 for t in completion_texts(completions)]


def tag_alone_on_its_line(text, tag):
    pos = text.find(tag)
    end = pos + len(tag)
    alone = text.count(tag) == 1 and (pos == 0 or text[pos - 1] == "\n") and (end == len(text) or text[end] == "\n")
    return pos if alone else -1


def xmlcount_score(text):
    score, previous = 0.0, -1
    for tag in TAGS:
        pos = tag_alone_on_its_line(text, tag)
        if pos > previous:
            score += 0.125
            previous = pos
    _, closed, trailing = text.rpartition("</answer>")
    if closed:
        score -= min(0.001 * len("".join(trailing.split())), 0.5)
    return score


def xmlcount_reward_func(completions, **kwargs):
    return [xmlcount_score(t) for t in completion_texts(completions)]


def soft_format_without_strip(completions, **kwargs):  # the classic pattern with re.DOTALL: misses leading spaces
    return [0.5 if re.match(r"<reasoning>.*?</reasoning>\s*<answer>.*?</answer>", t, re.DOTALL) else 0.0
            for t in completion_texts(completions)]


def xmlcount_counting_spaces(completions, **kwargs):  # charges the newline after </answer> too
    scores = []
    for text in completion_texts(completions):
        trailing = text.rpartition("</answer>")[2]
        scores.append(xmlcount_score(text) - 0.001 * (len(trailing) - len("".join(trailing.split()))))
    return scores


RIGHT_AND_WRONG_REWARDS = {
    "check_03_correctness": (
        correctness_reward_func,
        [classic.correctness_reward_func, lambda prompts, completions, answer, **kw: [2.0] * len(completions)],
    ),
    "check_03_int": (int_reward_func, [classic.int_reward_func, lambda completions, **kw: [0.5] * len(completions)]),
    "check_03_strict_format": (strict_format_reward_func, [classic.strict_format_reward_func, soft_format_reward_func]),
    "check_03_soft_format": (soft_format_reward_func, [classic.soft_format_reward_func, soft_format_without_strip]),
    "check_03_xmlcount": (xmlcount_reward_func, [classic.xmlcount_reward_func, xmlcount_counting_spaces]),
}


@pytest.mark.parametrize("name", sorted(RIGHT_AND_WRONG_REWARDS))
def test_check_03_rewards_accept_the_corrected_and_refuse_the_classic(name, gsm8k_train, capsys):
    check = getattr(nb03, name)
    right, wrongs = RIGHT_AND_WRONG_REWARDS[name]
    assert check(right, gsm8k_train)
    for wrong in wrongs:
        assert not check(wrong, gsm8k_train)
    assert "differs from the reference" in capsys.readouterr().out
    assert not check(None, gsm8k_train) and "not answered" in capsys.readouterr().out


def test_reward_cases_are_real_rows_samples_and_edge_cases(gsm8k_train):
    labels = [case.label for case in nb03.reward_cases(gsm8k_train)]
    assert sum(label.startswith("row ") for label in labels) >= 40
    assert any(label.startswith("sample 'perfect'") for label in labels)
    assert any(label.startswith("no completion at all") for label in labels)
    (kwargs,) = nb03.reward_cases(gsm8k_train)[0].args
    assert {"prompts", "completions", "completion_ids", "answer", "trainer_state"} <= set(kwargs)


def test_classic_bug_is_named_with_the_case(gsm8k_train, capsys):
    nb03.check_03_correctness(classic.correctness_reward_func, gsm8k_train)
    out = capsys.readouterr().out
    assert "answer written '$72' (gold '72'), at [0]: the reference returns 2.0, yours returns 0.0" in out


def repetition_penalty(completions, **kwargs):
    scores = []
    for text in completion_texts(completions):
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        scores.append(-(len(lines) - len(set(lines))) / len(lines) if lines else 0.0)
    return scores


def test_check_03_own_reward(gsm8k_train, capsys):
    assert nb03.check_03_own_reward(repetition_penalty, gsm8k_train)
    assert "TRL called it" in capsys.readouterr().out

    def unstripped(completions, **kwargs):  # "x" and "  x" count as different lines
        lines = [[line for line in t.splitlines() if line.strip()] for t in completion_texts(completions)]
        return [-(len(ls) - len(set(ls))) / len(ls) if ls else 0.0 for ls in lines]

    def no_kwargs(completions):  # GRPOTrainer passes prompts, completion_ids, answer...: this one cannot take them
        return repetition_penalty(completions)

    assert not nb03.check_03_own_reward(unstripped, gsm8k_train)
    assert not nb03.check_03_own_reward(no_kwargs, gsm8k_train)
    assert "yours raises TypeError" in capsys.readouterr().out
    assert not nb03.check_03_own_reward(lambda completions, **kw: [0.0] * len(completions), gsm8k_train)
    assert not nb03.check_03_own_reward(None, gsm8k_train)


def test_own_reward_is_also_run_by_trl(gsm8k_train, capsys):
    calls = []

    def counted(completions, **kwargs):
        calls.append(sorted(kwargs))
        return repetition_penalty(completions)

    assert nb03.check_03_own_reward(counted, gsm8k_train)
    assert any("log_metric" in keys for keys in calls), "TRL's own call (it alone passes log_metric) never happened"
