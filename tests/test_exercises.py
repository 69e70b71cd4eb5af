"""The exercise checks: right answers pass, wrong and unanswered ones do not, and no check ever raises."""

from __future__ import annotations

import inspect
import re

import pytest
import torch

from course_utils.core.answer_format import SYSTEM_PROMPT, TAGS
from course_utils.core.profiles import get_profile
from course_utils.exercises import comparison
from course_utils.exercises import nb00_setup as nb00
from course_utils.exercises import nb01_grpo_concepts as nb01
from course_utils.exercises import nb02_gsm8k_data as nb02
from course_utils.exercises import nb03_reward_functions as nb03
from course_utils.exercises import nb04_train_grpo as nb04
from course_utils.exercises import nb05_evaluate as nb05
from course_utils.exercises import nb06_troubleshooting as nb06
from course_utils.exercises import nb07_grpo_variants as nb07
from course_utils.exercises import nb99_cpu_speed as nb99
from course_utils.lesson.rewards import answers_match, classic, completion_texts, extract_xml_answer, plain_number


def _takes_only_the_answer(function) -> bool:
    required = [p for p in inspect.signature(function).parameters.values() if p.default is inspect.Parameter.empty]
    return len(required) == 1


# checks that also need context (a dataset, statistics) are tested beside their module
CHECKS = [
    f
    for module in (nb00, nb01, nb02, nb03, nb04, nb05, nb06, nb07, nb99)
    for name, f in inspect.getmembers(module, inspect.isfunction)
    if name.startswith("check_") and f.__module__ == module.__name__ and _takes_only_the_answer(f)
]


@pytest.mark.parametrize("check", CHECKS, ids=lambda f: f.__name__)
def test_unanswered_exercise_is_reported_not_failed(check, capsys):
    assert check(None) is False
    assert "not answered" in capsys.readouterr().out


@pytest.mark.parametrize("check", CHECKS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("wrong", ["nonsense", -987654, object()])
def test_wrong_answers_fail_without_raising(check, wrong):
    assert check(wrong) is False


def test_setup_exercises_accept_the_right_answers():
    assert nb00.check_00_profile_variable("COURSE_PROFILE")
    assert nb00.check_00_completions_per_step(get_profile("colab-t4").effective_batch_size)


def test_close_to_handles_non_numbers():
    assert comparison.close_to("3.0", 3) and not comparison.close_to("three", 3) and not comparison.close_to(None, 3)


def test_precision_rule_accepts_a_right_rule_and_names_a_wrong_ones_cases(capsys):
    def right(capability, flags):
        native = capability == "AVX512" and bool({"avx512_bf16", "amx_bf16"} & flags)
        return "bf16" if native else "fp32"

    def flags_only(capability, flags):  # forgets that torch's AVX2 kernels emulate bf16
        return "bf16" if {"avx512_bf16", "amx_bf16"} & flags else "fp32"

    def crashes(capability, flags):
        raise KeyError(capability)

    assert nb99.check_99_precision_rule(right)
    assert not nb99.check_99_precision_rule(flags_only)
    assert "AVX2 with ['avx2', 'avx512_bf16', 'avx512f']: yours 'bf16'" in capsys.readouterr().out
    assert not nb99.check_99_precision_rule(lambda capability, flags: "fp32")
    assert not nb99.check_99_precision_rule(crashes)
    assert not nb99.check_99_precision_rule(lambda capability, flags: ...)
    assert "not answered" in capsys.readouterr().out


def test_value_checks_of_01_03_06_accept_the_right_answers():
    assert nb01.check_01_first_advantage(1.5) and not nb01.check_01_first_advantage(0.75)
    assert nb01.check_01_zero_std_fraction(0.5) and not nb01.check_01_zero_std_fraction(0.25)
    assert nb03.check_03_classic_comma(0.0) and not nb03.check_03_classic_comma(2.0)
    assert nb03.check_03_dotall_flag("re.DOTALL") and nb03.check_03_dotall_flag("S")
    assert not nb03.check_03_dotall_flag("MULTILINE")
    assert nb06.check_06_batch_size(2) and not nb06.check_06_batch_size(1)


def test_biggest_memory_saving_names_one_fix():
    from course_utils.training.memory import OOM_FIXES

    accepted = [
        label for label in OOM_FIXES if not label.startswith("all") and nb06.check_06_biggest_saving(label)
    ]
    assert len(accepted) == 1


# --- comparing a learner's function with the reference ------------------------------------------------


def _parse_int(text):
    if not isinstance(text, str):
        raise TypeError("text must be a string")
    return int(text)


INT_CASES = [
    comparison.Case("plain", ("12",)),
    comparison.Case("negative", ("-3",)),
    comparison.Case("a word", ("seven",)),
    comparison.Case("not a string", (None,)),
]


def test_agreeing_functions_have_no_differences():
    assert comparison.compare_with_reference(lambda t: _parse_int(t), _parse_int, INT_CASES) == []


def test_a_wrong_value_is_reported_with_both_outcomes():
    differences = comparison.compare_with_reference(lambda t: abs(_parse_int(t)), _parse_int, INT_CASES)
    assert [str(d) for d in differences] == ["negative: the reference returns -3, yours returns 3"]


def test_raising_where_the_reference_returns_and_the_reverse_are_differences():
    def learner(text):
        if text == "12":
            raise KeyError("oops")
        return 0

    labels = {d.label: d for d in comparison.compare_with_reference(learner, _parse_int, INT_CASES)}
    assert set(labels) == {"plain", "negative", "a word", "not a string"}
    assert labels["plain"].yours == "raises KeyError: 'oops'"
    assert labels["a word"].reference.startswith("raises ValueError") and labels["a word"].yours == "returns 0"


def test_refusing_with_another_kind_of_error_is_a_difference():
    def learner(text):
        if text is None:
            raise ValueError("no text")
        return int(text)

    differences = comparison.compare_with_reference(learner, _parse_int, INT_CASES)
    assert [d.label for d in differences] == ["not a string"]


def test_a_subclass_of_a_builtin_error_is_matched_by_the_builtin():
    from course_utils.lesson.formatting import GSM8KFormatError

    def reference(text):
        raise GSM8KFormatError("bad")

    def learner(text):
        raise ValueError("also bad")

    assert comparison.compare_with_reference(learner, reference, INT_CASES[:1]) == []


def test_reference_args_give_the_reference_its_own_form_of_the_case():
    case = comparison.Case("sum", ((1, 2, 3),), reference_args=(1, 2, 3))
    assert comparison.compare_with_reference(sum, lambda *numbers: sum(numbers), [case]) == []
    assert comparison.compare_with_reference(len, lambda *numbers: sum(numbers), [case]) != []


def test_differences_inside_containers_name_the_place():
    (difference,) = comparison.compare_with_reference(
        lambda: {"prompt": [{"role": "user"}], "answer": "1,080"},
        lambda: {"prompt": [{"role": "user"}], "answer": "1080"},
        [comparison.Case("row 3", ())],
    )
    assert difference.label == "row 3, at ['answer']"
    assert (difference.reference, difference.yours) == ("returns '1080'", "returns '1,080'")


@pytest.mark.parametrize(
    ("expected", "got", "same"),
    [
        (torch.tensor([1.0, 2.0]), [1.0, 2.0 + 1e-7], True),
        (torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.1]), False),
        (torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.0, 3.0]), False),
        (torch.tensor([1.0]), "one", False),
        (0.5, 0.5000001, True),
        (0.5, True, False),
        ("72", 72, False),
        ((1, "a"), [1, "a"], True),
        ({"a": 1}, {"a": 1, "b": 2}, False),
    ],
)
def test_same_values(expected, got, same):
    assert comparison.same_values(expected, got) is same


def test_check_against_reference_prints_the_verdict(capsys):
    assert comparison.check_against_reference("x", _parse_int, _parse_int, INT_CASES, hint="h")
    assert "same result as the reference on all 4 cases" in capsys.readouterr().out
    assert not comparison.check_against_reference("x", lambda t: 0, _parse_int, INT_CASES, hint="use int()", show=1)
    out = capsys.readouterr().out
    assert "differs from the reference on 4 of 4 cases" in out and "... and 3 more" in out and "use int()" in out
    assert not comparison.check_against_reference("x", None, _parse_int, INT_CASES, hint="h")
    assert "not answered" in capsys.readouterr().out
    assert not comparison.check_against_reference("x", "int", _parse_int, INT_CASES, hint="h")


# --- 01: the learner's advantages and losses against the installed TRL ----------------------------------


def learner_advantages(rewards, num_generations):
    grouped = torch.tensor(rewards).view(-1, num_generations)
    return ((grouped - grouped.mean(dim=1, keepdim=True)) / (grouped.std(dim=1, keepdim=True) + 1e-4)).flatten()


def population_std_advantages(rewards, num_generations):
    grouped = torch.tensor(rewards).view(-1, num_generations)
    std = grouped.std(dim=1, keepdim=True, unbiased=False)
    return ((grouped - grouped.mean(dim=1, keepdim=True)) / (std + 1e-4)).flatten()


def per_token_loss(logps, old_logps, advantages, mask, epsilon=0.2):
    ratio = torch.exp(logps - old_logps)
    a = advantages.unsqueeze(1)
    return -torch.min(ratio * a, torch.clamp(ratio, 1 - epsilon, 1 + epsilon) * a) * mask


def token_mean_loss(logps, old_logps, advantages, mask):
    return per_token_loss(logps, old_logps, advantages, mask).sum() / mask.sum()


def sequence_mean_loss(logps, old_logps, advantages, mask):
    return (per_token_loss(logps, old_logps, advantages, mask).sum(dim=1) / mask.sum(dim=1)).mean()


def test_check_01_advantages():
    assert nb01.check_01_advantages(learner_advantages)
    assert not nb01.check_01_advantages(population_std_advantages)
    assert not nb01.check_01_advantages(lambda rewards, n: torch.tensor(rewards))


def test_check_01_losses():
    assert nb01.check_01_policy_loss(token_mean_loss)
    assert not nb01.check_01_policy_loss(sequence_mean_loss)
    assert not nb01.check_01_policy_loss(lambda logps, old, adv, mask: (logps - old).mean())
    assert nb01.check_01_sequence_mean_loss(sequence_mean_loss)
    assert not nb01.check_01_sequence_mean_loss(token_mean_loss)


# --- 02: the learner's parser, prompt and mapping against course_utils.lesson.formatting ---------------------------


def learner_extract(text):
    if not isinstance(text, str):
        raise TypeError("text must be a string")
    if text.count("####") != 1:
        raise ValueError("expected exactly one '####'")
    answer = text.split("####")[1].replace(",", "").replace("$", "").strip()
    if not re.fullmatch(r"-?\d+(\.\d+)?", answer):
        raise ValueError(f"{answer!r} is not a number")
    return answer


def learner_prompt(question, system_prompt=SYSTEM_PROMPT):
    if not isinstance(question, str) or not question.strip():
        raise ValueError("question must be a non-empty string")
    return [{"role": "system", "content": system_prompt}, {"role": "user", "content": question.strip()}]


def learner_row(row):
    return {"prompt": learner_prompt(row["question"]), "answer": learner_extract(row["answer"])}


@pytest.fixture(scope="module")
def gsm8k_train(gsm8k_dir):
    from course_utils.lesson.data import load_gsm8k

    return load_gsm8k("train", folder=gsm8k_dir, verbose=False)


def test_case_banks_hold_real_rows_and_edge_cases(gsm8k_train):
    cases = nb02.answer_cases(gsm8k_train)
    real = [c for c in cases if c.label.startswith("row ")]
    assert len(real) >= 20 and len(cases) == len(real) + len(nb02.ANSWER_EDGE_CASES)
    assert any("," in c.args[0].rsplit("####", 1)[-1] for c in real)  # rows one-liners get wrong are included


def test_check_02_extract_hash_answer(gsm8k_train, capsys):
    assert nb02.check_02_extract_hash_answer(learner_extract, gsm8k_train)
    assert not nb02.check_02_extract_hash_answer(lambda text: text.split("####")[1].strip(), gsm8k_train)
    assert "the reference returns '1080', yours returns '1,080'" in capsys.readouterr().out
    lenient = lambda text: learner_extract(text) if "####" in str(text) else ""  # noqa: E731
    assert not nb02.check_02_extract_hash_answer(lenient, gsm8k_train)


def test_check_02_build_prompt(gsm8k_train):
    assert nb02.check_02_build_prompt(learner_prompt, gsm8k_train)
    assert not nb02.check_02_build_prompt(lambda q, s=SYSTEM_PROMPT: learner_prompt(q, s)[::-1], gsm8k_train)
    unstripped = lambda q, s=SYSTEM_PROMPT: [{"role": "system", "content": s}, {"role": "user", "content": q}]  # noqa: E731
    assert not nb02.check_02_build_prompt(unstripped, gsm8k_train)


def test_check_02_mapping(gsm8k_train):
    mapped = gsm8k_train.map(learner_row)
    assert nb02.check_02_mapping(learner_row, mapped, gsm8k_train)
    assert not nb02.check_02_mapping(learner_row, mapped.select(range(10)), gsm8k_train)
    assert not nb02.check_02_mapping(learner_row, None, gsm8k_train)
    no_prompt = lambda row: {"answer": learner_extract(row["answer"])}  # noqa: E731
    assert not nb02.check_02_mapping(no_prompt, mapped, gsm8k_train)


def test_check_02_split_solution(gsm8k_train):
    def split_solution(text):
        return text.split("####")[0].strip(), learner_extract(text)

    assert nb02.check_02_split_solution(split_solution, gsm8k_train)
    assert not nb02.check_02_split_solution(lambda text: tuple(text.split("####")), gsm8k_train)


# --- 04 and 05 -------------------------------------------------------------------------------------------

MONITORING_HISTORY = [
    {"step": s, "reward": 0.4, "reward_std": 0.5, "completions/mean_length": 64.0,
     "completions/clipped_ratio": 0.8, "frac_reward_zero_std": 0.1}
    for s in range(1, 9)
]  # fmt: skip


def test_value_checks_of_04_and_05_accept_the_right_answers_only():
    assert nb04.check_04_prompts_per_step(16) and not nb04.check_04_prompts_per_step(128)
    assert nb04.check_04_group_size_field("num_generations")
    assert not nb04.check_04_group_size_field("beta") and not nb04.check_04_group_size_field("G")
    assert nb04.check_04_monitoring_rule("clipped_high", MONITORING_HISTORY)
    assert not nb04.check_04_monitoring_rule("kl_rising", MONITORING_HISTORY)
    assert nb05.check_05_wilson_lower(0.22) and not nb05.check_05_wilson_lower(0.5)
    assert nb05.check_05_problems_needed(380) and not nb05.check_05_problems_needed(100)
    assert nb05.check_05_checker_matters(["1,000", "$1000", "1000.0"])
    assert not nb05.check_05_checker_matters(["1000", "1,000"])


def test_the_kl_field_is_no_longer_an_answer_of_04():
    """06.2's answer is beta; no two exercises of the course share an answer."""
    assert not hasattr(nb04, "check_04_kl_field")
    assert not nb04.check_04_group_size_field("beta")


def learner_generation_batch(batch, accumulation, num_generations):
    if num_generations < 2 or batch < 1 or accumulation < 1:
        raise ValueError("sizes")
    completions = batch * accumulation
    if completions % num_generations:
        raise ValueError(f"{completions} completions are not whole groups of {num_generations}")
    return completions


def test_check_04_generation_batch(capsys):
    assert nb04.check_04_generation_batch(learner_generation_batch)
    assert not nb04.check_04_generation_batch(lambda b, a, g: b * a)  # never refuses
    assert "6 x 1, groups of 4: not whole groups: the reference raises" in capsys.readouterr().out
    assert not nb04.check_04_generation_batch(lambda b, a, g: b * a // g)  # prompts, not completions

    def refuses_with_assert(b, a, g):
        assert (b * a) % g == 0 and g > 1 and b > 0 and a > 0
        return b * a

    assert not nb04.check_04_generation_batch(refuses_with_assert)  # AssertionError is not a ValueError
    assert not nb04.check_04_generation_batch("b * a")


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


# --- 06: diagnosing a flat reward from a log history ---------------------------------------------------


def flat_reward_cause(log_history):
    logs = [entry for entry in log_history if "reward" in entry][-5:]
    clipped = [e["completions/clipped_ratio"] for e in logs if "completions/clipped_ratio" in e]
    zero_std = [e["frac_reward_zero_std"] for e in logs if "frac_reward_zero_std" in e]
    if clipped and sum(clipped) / len(clipped) > 0.3:
        return "truncated"
    if zero_std and sum(zero_std) / len(zero_std) > 0.5:
        return "no_signal"
    return "ok"


def _diagnosis(log_history, window=5, truncation_first=True):
    logs = [entry for entry in log_history if "reward" in entry][-window:] if window else log_history

    def high(key, threshold):
        values = [e[key] for e in logs if key in e]
        return bool(values) and sum(values) / len(values) > threshold

    checks = [("truncated", "completions/clipped_ratio", 0.3), ("no_signal", "frac_reward_zero_std", 0.5)]
    for cause, key, threshold in checks if truncation_first else checks[::-1]:
        if high(key, threshold):
            return cause
    return "ok"


def test_check_06_flat_reward_cause(capsys):
    assert nb06.check_06_flat_reward_cause(flat_reward_cause)
    assert nb06.check_06_flat_reward_cause(_diagnosis)
    assert not nb06.check_06_flat_reward_cause(lambda h: _diagnosis(h, window=None))  # the whole run
    assert not nb06.check_06_flat_reward_cause(lambda h: _diagnosis(h, truncation_first=False))
    assert not nb06.check_06_flat_reward_cause(lambda log_history: "ok")
    assert "differs from the reference" in capsys.readouterr().out
    assert not nb06.check_06_flat_reward_cause("ok")


def test_flat_reward_check_takes_real_histories_too():
    history = [{"step": 1, "reward": 0.0, "completions/clipped_ratio": 1.0}]
    cases = nb06.flat_reward_cases(history)
    assert cases[-1].label == "real run 1" and cases[-1].args == (history,)


def test_value_checks_of_07_accept_the_right_answers_only():
    assert nb07.check_07_off_policy_field("num_iterations")
    assert not nb07.check_07_off_policy_field("importance_sampling_level")
    assert not nb07.check_07_off_policy_field(None)
    assert nb07.check_07_constant_normaliser("dr_grpo") and nb07.check_07_constant_normaliser("'dr_grpo'")
    assert not nb07.check_07_constant_normaliser("dapo") and not nb07.check_07_constant_normaliser("bnpo")


def test_check_07_real_difference_compares_with_the_noise_rule(capsys):
    def right(first, second):
        if len(first) < 2 or len(second) < 2:
            return False
        return min(first) > max(second) or min(second) > max(first)

    def means_only(first, second):  # calls any gap in the means a difference
        return sum(first) / len(first) != sum(second) / len(second)

    def one_way(first, second):
        return len(first) > 1 and len(second) > 1 and min(first) > max(second)

    assert nb07.check_07_real_difference(right)
    assert not nb07.check_07_real_difference(means_only)
    assert "[1.0] vs [0.0]" in capsys.readouterr().out
    assert not nb07.check_07_real_difference(one_way)
    assert not nb07.check_07_real_difference(...)
