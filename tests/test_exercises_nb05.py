"""Notebook 05's checks: the Wilson interval, the problems needed, the checker, the lenient reader."""

from __future__ import annotations

import re

import pytest
import torch

from course_utils.exercises import nb05_evaluate as nb05
from course_utils.lesson.data import load_gsm8k
from course_utils.lesson.rewards import answers_match, extract_xml_answer


def test_value_checks_of_05_accept_the_right_answers_only():
    assert nb05.check_05_wilson_lower(0.22) and not nb05.check_05_wilson_lower(0.5)
    assert nb05.check_05_problems_needed(380) and not nb05.check_05_problems_needed(100)
    assert nb05.check_05_checker_matters(["1,000", "$1000", "1000.0"])
    assert not nb05.check_05_checker_matters(["1000", "1,000"])


def learner_last_number(text):
    found = re.findall(r"-?\d[\d,]*(?:\.\d+)?", text)
    return found[-1].replace(",", "") if found else ""


def test_check_05_last_number(capsys):
    assert nb05.check_05_last_number(learner_last_number)
    first = lambda text: (re.findall(r"-?\d+", text) or [""])[0]  # noqa: E731
    assert not nb05.check_05_last_number(first)
    assert "several numbers, last wins" in capsys.readouterr().out
    keeps_commas = lambda text: (re.findall(r"-?\d[\d,]*(?:\.\d+)?", text) or [""])[-1]  # noqa: E731
    assert not nb05.check_05_last_number(keeps_commas)
    assert not nb05.check_05_last_number(lambda text: None)


# --- notebook 05's evaluation loop -------------------------------------------------------------------------


def learner_loop(model, tokenizer, problems, batch_size, max_new_tokens, whole_sequence=False):
    """What notebook 05's learner writes (``whole_sequence``: the classic slip of decoding the prompt too)."""
    records = []
    for start in range(0, len(problems), batch_size):
        batch = problems.select(range(start, min(start + batch_size, len(problems))))
        texts = tokenizer.apply_chat_template(list(batch["prompt"]), add_generation_prompt=True, tokenize=False)
        inputs = tokenizer(texts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False)
        with torch.inference_mode():
            output = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False,
                                    pad_token_id=tokenizer.pad_token_id)  # fmt: skip
        new = output if whole_sequence else output[:, inputs["input_ids"].shape[1] :]
        texts = tokenizer.batch_decode(new, skip_special_tokens=True)
        for completion, gold in zip(texts, batch["answer"], strict=True):
            extracted = extract_xml_answer(completion)
            records.append({"completion": completion, "extracted": extracted,
                            "correct": bool(extracted) and bool(answers_match(extracted, gold))})  # fmt: skip
    return records


@pytest.fixture(scope="module")
def three_problems():
    return load_gsm8k("test", formatted=True, limit=3, verbose=False)


@pytest.mark.slow
def test_the_evaluation_loop_check(offline_model_and_tokenizer, three_problems):
    model, tokenizer = offline_model_and_tokenizer
    settings = {"batch_size": 2, "max_new_tokens": 6}  # two batches, the second one short
    assert nb05.check_evaluation_loop(learner_loop, model, tokenizer, three_problems, **settings)

    two, short = three_problems.select(range(2)), {"batch_size": 1, "max_new_tokens": 2}  # each slip, cheaply

    def with_prompt(*args):
        return learner_loop(*args, whole_sequence=True)

    with pytest.raises(ValueError, match="problem 0, completion: yours"):
        nb05.check_evaluation_loop(with_prompt, model, tokenizer, two, **short)

    def first_batch_only(*args):
        return learner_loop(*args)[:1]

    with pytest.raises(ValueError, match="records: yours 1, reference 2"):
        nb05.check_evaluation_loop(first_batch_only, model, tokenizer, two, **short)

    def texts_only(*args):
        return [r["completion"] for r in learner_loop(*args)]

    with pytest.raises(ValueError, match="not a dict"):
        nb05.check_evaluation_loop(texts_only, model, tokenizer, two, **short)
