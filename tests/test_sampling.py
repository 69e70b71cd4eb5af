"""Sampled evaluation: the pass@k estimator, majority votes, bootstrap intervals, samples drawn as GRPO draws them."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from course_utils.evaluation import sampling
from course_utils.evaluation.stats import bootstrap_interval, pass_at_k
from course_utils.lesson.data import load_gsm8k
from course_utils.lesson.generation import sample_generate


def _pass_at_k_by_counting(n: int, c: int, k: int) -> float:
    """The definition: over every subset of k of the n samples, the share holding a correct one."""
    samples = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(samples[i] for i in subset) for subset in subsets) / len(subsets)


@pytest.mark.parametrize(("n", "c", "k"), [(1, 0, 1), (1, 1, 1), (4, 1, 2), (6, 2, 3), (8, 1, 8), (8, 3, 1), (7, 6, 4)])
def test_pass_at_k_is_the_share_of_k_subsets_holding_a_correct_sample(n, c, k):
    assert pass_at_k(n, c, k) == pytest.approx(_pass_at_k_by_counting(n, c, k))


def test_pass_at_1_is_the_fraction_correct_and_large_n_stays_finite():
    assert pass_at_k(8, 3, 1) == pytest.approx(3 / 8)
    value = pass_at_k(10_000, 37, 1000)  # C(10000, 1000) overflows a float; the product form does not
    assert 0 < value < 1 and math.isfinite(value)
    assert value == pytest.approx(1 - math.exp(sum(math.log1p(-1000 / i) for i in range(10_000 - 37 + 1, 10_001))))


@pytest.mark.parametrize(
    ("n", "c", "k", "error"),
    [(0, 0, 1, ValueError), (8, 9, 1, ValueError), (8, -1, 1, ValueError), (8, 2, 9, ValueError),
     (8, 2, 0, ValueError), (8.0, 2, 1, TypeError), (8, True, 1, TypeError)],
)  # fmt: skip
def test_pass_at_k_refuses_impossible_counts(n, c, k, error):
    with pytest.raises(error):
        pass_at_k(n, c, k)


def test_bootstrap_interval_holds_the_mean_and_narrows_with_more_problems():
    rng = random.Random(1)
    few = [rng.random() for _ in range(20)]
    many = few * 25
    low, high = bootstrap_interval(few)
    assert low < sum(few) / len(few) < high
    many_low, many_high = bootstrap_interval(many)
    assert many_high - many_low < (high - low) / 2
    assert bootstrap_interval([0.5] * 10) == (0.5, 0.5)
    assert bootstrap_interval(few, seed=3) == bootstrap_interval(few, seed=3)


@pytest.mark.parametrize(("values", "kwargs"), [([], {}), ([1.0], {"confidence": 1.5}), ([1.0], {"resamples": 5})])
def test_bootstrap_interval_refuses_bad_input(values, kwargs):
    with pytest.raises(ValueError):
        bootstrap_interval(values, **kwargs)


def test_majority_answer_counts_numbers_by_value():
    assert sampling.majority_answer(["1,000", "999", "1000.00", "", "999"]) == "1,000"  # 2 each: first seen wins
    assert sampling.majority_answer(["7", "$7", "8"]) == "7"
    assert sampling.majority_answer(["", "  "]) == ""
    with pytest.raises(TypeError):
        sampling.majority_answer("18")


def test_problem_record_scores_each_sample_and_the_vote():
    texts = ["<answer>18</answer>", "<answer>17</answer>", "<answer>18.0</answer>", "no tags 18"]
    record = sampling.problem_record(texts, "18", ks=(1, 2, 4))
    assert record["correct_samples"] == 2 and record["samples"] == 4
    assert record["pass@1"] == pytest.approx(0.5) and record["pass@4"] == 1.0
    assert record["pass@2"] == pytest.approx(_pass_at_k_by_counting(4, 2, 2))
    assert record["majority"] == "18" and record["majority_correct"]


def test_summaries_and_paired_differences():
    golds = ["1", "2", "3", "4"]
    before = [sampling.problem_record(["<answer>0</answer>"] * 4, g, (1, 4)) for g in golds]
    after = [sampling.problem_record([f"<answer>{g}</answer>", "<answer>0</answer>"] * 2, g, (1, 4)) for g in golds]
    first, second = ({"records": r, **sampling.summarize_samples(r, (1, 4))} for r in (before, after))
    assert first["pass@1"] == 0 and second["pass@1"] == pytest.approx(0.5) and second["pass@4"] == 1.0
    assert "maj@4" in second
    change = sampling.paired_difference(first, second)
    assert change["difference"] == pytest.approx(0.5) and change["ci"] == (0.5, 0.5)
    with pytest.raises(ValueError, match="not on the same problems"):
        sampling.paired_difference(first, {"records": second["records"][:2]})
    with pytest.raises(ValueError, match="unknown measure"):
        sampling.paired_difference(first, second, key="pass@3")


@pytest.mark.slow
def test_sample_generate_draws_groups_reproducibly(offline_model_and_tokenizer):
    model, tokenizer = offline_model_and_tokenizer
    chats = [[{"role": "user", "content": "What is 2 + 3?"}], [{"role": "user", "content": "Name a colour."}]]
    first = sample_generate(model, tokenizer, chats, 3, max_new_tokens=6, seed=7)
    again = sample_generate(model, tokenizer, chats, 3, max_new_tokens=6, seed=7)
    assert [len(group) for group in first] == [3, 3]
    assert [[g.text for g in group] for group in first] == [[g.text for g in group] for group in again]
    assert len({g.text for group in first for g in group}) > 1, "sampling gave one text for every row"
    with pytest.raises(ValueError, match="num_samples"):
        sample_generate(model, tokenizer, chats, 0)
    with pytest.raises(ValueError, match="temperature"):
        sample_generate(model, tokenizer, chats, 2, temperature=0)


@pytest.mark.slow
def test_evaluate_sampled_on_real_problems(offline_model_and_tokenizer, gsm8k_dir):
    model, tokenizer = offline_model_and_tokenizer
    problems = load_gsm8k("test", formatted=True, limit=3, folder=gsm8k_dir, verbose=False)
    result = sampling.evaluate_sampled(model, tokenizer, problems, samples=2, ks=(1, 2), prompts_per_batch=2,
                                       max_new_tokens=8)  # fmt: skip
    assert result["n"] == 3 and len(result["records"]) == 3 and result["samples"] == 2
    for key in ("pass@1", "pass@2", "maj@2"):
        low, high = result[f"{key}_ci"]
        assert 0 <= low <= result[key] <= high <= 1
    with pytest.raises(ValueError, match="ks must be"):
        sampling.evaluate_sampled(model, tokenizer, problems, samples=2, ks=(4,))
