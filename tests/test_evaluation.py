"""Tests for the evaluation group: metrics from hand-written completions, intervals and paired tests, tables,
real generation, checkpoint curves."""

from __future__ import annotations

import math
import shutil
from statistics import NormalDist

import pytest
import torch
from peft import LoraConfig, get_peft_model

from course_utils.evaluation import curves
from course_utils.evaluation.curves import (
    checkpoint_curve,
    checkpoint_steps,
    load_curve,
    load_warm_start_model,
    save_curve,
)
from course_utils.evaluation.heldout import (
    evaluate_model,
    evaluate_one_at_a_time,
    load_for_evaluation,
    validation_problems,
)
from course_utils.evaluation.metrics import RATE_METRICS, last_number, score_completions
from course_utils.evaluation.stats import mcnemar_exact, reward_swing, wilson_interval
from course_utils.evaluation.tables import (
    change_counts,
    compare_results,
    fixed_and_broken,
    mcnemar_table,
    paired_counts,
    records_dataframe,
    stage_table,
)
from course_utils.exercises.nb05_evaluate import (
    check_05_checker_matters,
    check_05_problems_needed,
    check_05_wilson_lower,
)
from course_utils.lesson.data import load_gsm8k, train_val_split
from course_utils.lesson.evaluation_plots import plot_before_after_rates, plot_speed_and_length
from course_utils.lesson.models import load_model_and_tokenizer
from course_utils.training.trained_model import final_model_dir as trained_model_dir
from course_utils.training.trained_model import find_trained_model, warm_start_model_dir

# --- Hand-written completions, each annotated with what it must count as -------------------------------------

PERFECT = "<reasoning>\n2 + 2 = 4\n</reasoning>\n<answer>\n4\n</answer>"  # right, exact, strict, soft
DOLLARS = "<reasoning>\n10 boxes of $100\n</reasoning>\n<answer>\n$1,000\n</answer>"  # right (not exact), strict
SOFT_ONLY = "<reasoning>Half of 10 is 5.</reasoning> <answer>5</answer>"  # right, exact, soft only
UNFORMATTED = "The answer is 7."  # no <answer> block: nothing extracted, nothing counts
TRUNCATED = "<reasoning>\nFirst we add 3 and"  # cut off by max_new_tokens
WRONG = "<reasoning>\n3 * 4 = 12\n</reasoning>\n<answer>\n13\n</answer>"  # formatted, wrong

COMPLETIONS = [PERFECT, DOLLARS, SOFT_ONLY, UNFORMATTED, TRUNCATED, WRONG]
GOLDS = ["4", "1000", "5", "7", "9", "12"]
QUESTIONS = [f"question {i}" for i in range(len(COMPLETIONS))]
TRUNCATED_FLAGS = [False, False, False, False, True, False]
TOKENS = [10, 20, 30, 40, 50, 60]


@pytest.fixture
def scored() -> dict:
    return score_completions(
        COMPLETIONS,
        GOLDS,
        questions=QUESTIONS,
        truncated=TRUNCATED_FLAGS,
        completion_tokens=TOKENS,
        elapsed_seconds=7.0,
    )


def test_hand_written_completions_give_known_rates(scored: dict) -> None:
    assert scored["n"] == 6
    assert scored["accuracy"] == pytest.approx(3 / 6)  # PERFECT, DOLLARS, SOFT_ONLY
    assert scored["exact_match_accuracy"] == pytest.approx(2 / 6)  # "$1,000" != "1000" as strings
    assert scored["format_score"] == pytest.approx(3 / 6)  # PERFECT, DOLLARS, WRONG
    assert scored["soft_format_score"] == pytest.approx(4 / 6)  # the strict three plus SOFT_ONLY
    assert scored["truncation_rate"] == pytest.approx(1 / 6)
    assert scored["accuracy_count"] == 3 and scored["truncation_rate_count"] == 1


def test_token_and_speed_metrics(scored: dict) -> None:
    assert scored["total_completion_tokens"] == 210
    assert scored["mean_completion_tokens"] == pytest.approx(35.0)
    assert scored["tokens_per_second"] == pytest.approx(210 / 7.0)
    assert scored["problems_per_second"] == pytest.approx(6 / 7.0)


def test_every_rate_has_its_wilson_interval(scored: dict) -> None:
    for metric in RATE_METRICS:
        low, high = scored[f"{metric}_ci"]
        assert (low, high) == wilson_interval(scored[f"{metric}_count"], 6)
        assert low <= scored[metric] <= high


def test_per_problem_records(scored: dict) -> None:
    records = scored["records"]
    assert [r["extracted"] for r in records] == ["4", "$1,000", "5", "", "", "13"]
    assert [r["correct"] for r in records] == [True, True, True, False, False, False]
    assert [r["formatted"] for r in records] == [True, True, False, False, False, True]
    assert [r["truncated"] for r in records] == TRUNCATED_FLAGS
    assert [r["question"] for r in records] == QUESTIONS
    frame = records_dataframe(scored)
    assert list(frame.index) == list(range(6))
    assert frame["tokens"].tolist() == TOKENS
    assert frame.loc[1, "gold"] == "1000"


def test_conversational_completions_score_like_plain_text(scored: dict) -> None:
    chats = [[{"role": "assistant", "content": text}] for text in COMPLETIONS]
    as_chat = score_completions(chats, GOLDS, questions=QUESTIONS, truncated=TRUNCATED_FLAGS)
    for metric in RATE_METRICS:
        assert as_chat[metric] == scored[metric]


def test_unknown_tokens_and_time_are_nan_not_invented() -> None:
    result = score_completions([PERFECT, WRONG], ["4", "12"])
    assert result["truncation_rate"] == 0.0  # hand-written texts default to "not truncated"
    assert math.isnan(result["mean_completion_tokens"])
    assert math.isnan(result["tokens_per_second"]) and math.isnan(result["problems_per_second"])


def test_empty_input_gives_nan_rates_and_the_widest_interval() -> None:
    result = score_completions([], [])
    assert result["n"] == 0 and result["records"] == []
    assert math.isnan(result["accuracy"])
    assert result["accuracy_ci"] == (0.0, 1.0)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"completions": [PERFECT], "golds": ["4", "5"]}, ValueError, "gold"),
        ({"completions": PERFECT, "golds": ["4"]}, TypeError, "lists"),
        ({"completions": [PERFECT], "golds": ["4"], "truncated": [True, False]}, ValueError, "truncated"),
        ({"completions": [PERFECT], "golds": ["4"], "completion_tokens": []}, ValueError, "completion_tokens"),
        ({"completions": [PERFECT], "golds": ["4"], "elapsed_seconds": 0}, ValueError, "elapsed_seconds"),
        ({"completions": [42], "golds": ["4"]}, TypeError, "completion 0"),
        ({"completions": [PERFECT], "golds": ["4"], "completion_tokens": [-1]}, ValueError, "whole numbers"),
    ],
)
def test_score_completions_rejects_bad_input(kwargs: dict, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        score_completions(**kwargs)


# --- The Wilson interval -------------------------------------------------------------------------------------


def _wilson_by_quadratic(successes: int, n: int, confidence: float) -> tuple[float, float]:
    """Independent reference: the Wilson bounds are the p with |p_hat - p| = z * sqrt(p (1 - p) / n).

    Squaring gives (1 + z²/n) p² - (2 p_hat + z²/n) p + p_hat² = 0; its two roots are the bounds.
    """
    z = NormalDist().inv_cdf((1 + confidence) / 2)
    p_hat = successes / n
    a, b, c = 1 + z**2 / n, -(2 * p_hat + z**2 / n), p_hat**2
    root = math.sqrt(b * b - 4 * a * c)
    return ((-b - root) / (2 * a), (-b + root) / (2 * a))


@pytest.mark.parametrize(("successes", "n"), [(0, 1), (1, 1), (3, 8), (0, 8), (8, 8), (45, 50), (123, 1319)])
@pytest.mark.parametrize("confidence", [0.8, 0.95, 0.99])
def test_wilson_matches_the_quadratic_reference(successes: int, n: int, confidence: float) -> None:
    expected = _wilson_by_quadratic(successes, n, confidence)
    assert wilson_interval(successes, n, confidence) == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize(
    ("successes", "n", "low", "high"),
    [  # Newcombe (1998), Statistics in Medicine 17:857-872, Table I, method 3 (Wilson score, no correction)
        (81, 263, 0.2553, 0.3662),
        (15, 148, 0.0624, 0.1605),
        (0, 20, 0.0, 0.1611),
        (1, 29, 0.0061, 0.1718),
    ],
)
def test_wilson_textbook_values(successes: int, n: int, low: float, high: float) -> None:
    assert wilson_interval(successes, n) == pytest.approx((low, high), abs=5e-5)


def test_wilson_properties() -> None:
    assert wilson_interval(0, 0) == (0.0, 1.0)  # no data: every rate is plausible
    low, high = wilson_interval(3, 10)
    mirrored = wilson_interval(7, 10)
    assert low == pytest.approx(1 - mirrored[1]) and high == pytest.approx(1 - mirrored[0])
    narrow, wide = wilson_interval(30, 100, 0.8), wilson_interval(30, 100, 0.99)
    assert wide[0] < narrow[0] < 0.3 < narrow[1] < wide[1]
    assert wilson_interval(300, 1000)[1] - wilson_interval(300, 1000)[0] < high - low  # more data, narrower
    assert wilson_interval(0, 5)[0] == 0.0 and wilson_interval(5, 5)[1] == 1.0


@pytest.mark.parametrize(
    ("args", "error", "message"),
    [
        ((1, -1), ValueError, "n must be >= 0"),
        ((-1, 5), ValueError, "successes"),
        ((6, 5), ValueError, "successes"),
        ((1, 5, 0.0), ValueError, "confidence"),
        ((1, 5, 1.0), ValueError, "confidence"),
        ((1, 5, 95), ValueError, "confidence"),
        ((1, 5, "0.95"), ValueError, "confidence"),
        ((2.5, 5), TypeError, "successes"),
        ((1, 5.0), TypeError, "n must be a whole number"),
        ((True, 5), TypeError, "successes"),
    ],
)
def test_wilson_rejects_bad_input(args: tuple, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        wilson_interval(*args)


# --- Before/after tables -------------------------------------------------------------------------------------


def _result(completions: list[str]) -> dict:
    return score_completions(completions, GOLDS, questions=QUESTIONS, completion_tokens=TOKENS, elapsed_seconds=2.0)


def test_fixed_and_broken() -> None:
    before = _result(COMPLETIONS)  # right: 0, 1, 2
    after_texts = list(COMPLETIONS)
    after_texts[0] = UNFORMATTED  # problem 0 broken
    after_texts[3] = "<reasoning>\nseven\n</reasoning>\n<answer>\n7\n</answer>"  # problem 3 fixed
    after_texts[5] = "<reasoning>\n3 * 4 = 12\n</reasoning>\n<answer>\n12\n</answer>"  # problem 5 fixed
    after = _result(after_texts)
    table = fixed_and_broken(before, after)
    assert table["change"].to_dict() == {0: "broken", 3: "fixed", 5: "fixed"}
    assert table.loc[5, "before_answer"] == "13" and table.loc[5, "after_answer"] == "12"
    counts = change_counts(before, after)
    assert counts == {"fixed": 2, "broken": 1, "stayed right": 2, "stayed wrong": 1}
    assert sum(counts.values()) == before["n"]


def test_compare_results_table() -> None:
    before = _result(COMPLETIONS)
    after = _result([PERFECT] * 2 + COMPLETIONS[2:])
    table = compare_results(before, after, labels=("base", "trained"))
    assert table.loc["accuracy", "base"] == pytest.approx(0.5)
    assert table.loc["accuracy", "change"] == pytest.approx(after["accuracy"] - before["accuracy"])
    assert (table.loc["accuracy", "trained_ci_low"], table.loc["accuracy", "trained_ci_high"]) == after["accuracy_ci"]
    assert math.isnan(table.loc["tokens_per_second", "base_ci_low"])
    assert set(RATE_METRICS) <= set(table.index)


def test_comparisons_refuse_different_problems() -> None:
    before = _result(COMPLETIONS)
    other = score_completions(COMPLETIONS, GOLDS, questions=[f"other {i}" for i in range(6)])
    with pytest.raises(ValueError, match="same dataset"):
        compare_results(before, other)
    with pytest.raises(ValueError, match="same set"):
        fixed_and_broken(before, score_completions(COMPLETIONS[:2], GOLDS[:2]))
    with pytest.raises(ValueError, match="not an evaluation result"):
        compare_results({"accuracy": 0.5}, before)


# --- Finding the trained model -------------------------------------------------------------------------------


def test_find_trained_model(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("COURSE_OUTPUT_DIR", str(tmp_path))
    assert trained_model_dir("ci") == tmp_path / "grpo-ci" / "final"
    assert find_trained_model("ci") is None
    trained_model_dir("ci").mkdir(parents=True)
    assert find_trained_model("ci") is None  # an empty folder is not a model
    (trained_model_dir("ci") / "adapter_config.json").write_text("{}")
    assert find_trained_model("ci") == trained_model_dir("ci")
    assert find_trained_model(path=tmp_path) is None


def test_load_for_evaluation_rejects_a_folder_without_a_model(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match="No trained model"):
        load_for_evaluation("ci", tmp_path)


# --- Real generation with the offline model ------------------------------------------------------------------


@pytest.fixture(scope="module")
def model_and_tokenizer():
    return load_model_and_tokenizer("ci")


@pytest.fixture(scope="module")
def problems():
    return load_gsm8k("test", formatted=True, limit=3, verbose=False)


def test_evaluate_model_rejects_bad_input(model_and_tokenizer, problems) -> None:
    model, tokenizer = model_and_tokenizer
    with pytest.raises(ValueError, match="batch_size"):
        evaluate_model(model, tokenizer, problems, batch_size=0)
    with pytest.raises(ValueError, match="max_new_tokens"):
        evaluate_model(model, tokenizer, problems, max_new_tokens=-3)
    with pytest.raises(ValueError, match="empty"):
        evaluate_model(model, tokenizer, [])
    with pytest.raises(ValueError, match="formatted=True"):
        evaluate_model(model, tokenizer, [{"question": "1+1?", "answer": "2"}])


@pytest.mark.slow
@pytest.mark.long  # over 20 s; notebooks 02-05 run the same path in make test
def test_evaluate_model_on_real_problems(model_and_tokenizer, problems) -> None:
    model, tokenizer = model_and_tokenizer
    model.train()  # evaluate_model must switch to eval and back
    max_new = 12
    batched = evaluate_model(model, tokenizer, problems, batch_size=2, max_new_tokens=max_new, progress=False)
    assert model.training
    model.eval()
    assert batched["n"] == 3
    assert [r["question"] for r in batched["records"]] == problems["question"]  # order restored after sorting
    assert [r["gold"] for r in batched["records"]] == problems["answer"]
    for record in batched["records"]:
        assert record["tokens"] == max_new if record["truncated"] else record["tokens"] < max_new
        assert record["completion"].strip() or record["tokens"] == 0
    assert batched["tokens_per_second"] > 0 and batched["mean_completion_tokens"] <= max_new
    rescored = score_completions(
        [r["completion"] for r in batched["records"]],
        problems["answer"],
        truncated=[r["truncated"] for r in batched["records"]],
    )
    for metric in RATE_METRICS:
        assert rescored[metric] == batched[metric]
    # Without padding (batch of one) the batched path and the tutorial loop must generate the very same text.
    single = evaluate_model(model, tokenizer, problems, batch_size=1, max_new_tokens=max_new, progress=False)
    loop = evaluate_one_at_a_time(model, tokenizer, problems, max_new_tokens=max_new, progress=False)
    assert [r["completion"] for r in single["records"]] == [r["completion"] for r in loop["records"]]
    assert loop["batch_size"] == 1 and single["n"] == loop["n"] == 3


@pytest.mark.slow
def test_load_trained_model_applies_the_adapter(model_and_tokenizer, tmp_path) -> None:
    base, tokenizer = load_model_and_tokenizer("ci")
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    adapted = get_peft_model(base, config)
    adapted.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    assert find_trained_model(path=tmp_path) == tmp_path
    loaded, loaded_tokenizer = load_for_evaluation("ci", tmp_path)
    assert not hasattr(loaded, "peft_config")  # merged: generation runs at the base model's speed
    inputs = tokenizer("Two plus two is", return_tensors="pt")
    with torch.inference_mode():
        expected = adapted(**inputs).logits
        got = loaded(**inputs).logits
        plain = model_and_tokenizer[0](**inputs).logits
    assert torch.allclose(got, expected, atol=1e-4)  # the adapter is in the loaded weights
    assert not torch.allclose(got, plain, atol=1e-3)  # and it changed the model
    assert loaded_tokenizer.padding_side == "left"


def test_tokens_are_counted_with_the_tokenizer(model_and_tokenizer) -> None:
    _, tokenizer = model_and_tokenizer
    result = score_completions([PERFECT, PERFECT + "\n" + PERFECT], ["4", "4"], tokenizer=tokenizer)
    short, long = (r["tokens"] for r in result["records"])
    assert short > 0 and long >= 2 * short
    assert result["mean_completion_tokens"] == pytest.approx((short + long) / 2)


# --- Figures and exercises -----------------------------------------------------------------------------------


def test_figures_draw_from_the_comparison_table() -> None:
    before = _result(COMPLETIONS)
    table = compare_results(before, _result([PERFECT] * 6), labels=("base", "trained"))
    rates = plot_before_after_rates(table)
    assert len(rates.axes[0].patches) == 2 * len(RATE_METRICS)  # one bar per model and rate
    speed = plot_speed_and_length(table)
    assert len(speed.axes) == 3 and all(len(ax.patches) == 2 for ax in speed.axes)


def test_exercise_checks(capsys) -> None:
    assert check_05_wilson_lower(None) is False and "not answered" in capsys.readouterr().out
    assert check_05_wilson_lower(0.22) and not check_05_wilson_lower(0.5)
    z = NormalDist().inv_cdf(0.975)
    assert check_05_problems_needed(round(z**2 * 0.25 / 0.05**2))  # the normal approximation is close enough
    assert not check_05_problems_needed(100)
    assert check_05_checker_matters(["1,000", "$1000", "1000.0"])
    assert not check_05_checker_matters(["1000", "one thousand"]) and not check_05_checker_matters("1,000")


# --- Strict versus lenient accuracy, McNemar, the stage table ---------------------------------------------------


def test_lenient_accuracy_reads_the_last_number(scored: dict) -> None:
    assert last_number("so 3 boxes, 1,200 pencils.") == "1200"
    assert last_number("I owe -4.5 dollars") == "-4.5"
    assert last_number("no number here") == ""
    with pytest.raises(TypeError, match="string"):
        last_number(None)
    lenient = score_completions(["The answer is 18.", "<answer>\n7\n</answer> then 18", "18 or 19"], ["18"] * 3)
    assert [r["lenient_correct"] for r in lenient["records"]] == [True, True, False]
    assert [r["correct"] for r in lenient["records"]] == [False, False, False]  # no answer inside the tags
    assert lenient["lenient_accuracy"] == pytest.approx(2 / 3) and lenient["accuracy"] == 0.0
    assert "lenient_accuracy_ci" in scored


def _exact_two_sided(b: int, c: int) -> float:
    """The reference: 2 x P(X <= min(b, c)), X ~ Binomial(b + c, 1/2), in exact integer arithmetic."""
    n, k = b + c, min(b, c)
    if n == 0:
        return 1.0
    return min(1.0, 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2**n)


@pytest.mark.parametrize(
    ("b", "c", "expected"),
    [
        (0, 0, 1.0),  # no disagreement: no evidence of a difference
        (3, 3, 1.0),
        (0, 5, 0.0625),  # 2 / 2**5
        (5, 0, 0.0625),
        (1, 9, 0.021484375),  # binom.test(1, 10) in R: 0.02148
        (0, 1, 1.0),
        (2, 8, 0.109375),
    ],
)
def test_mcnemar_exact_known_cases(b: int, c: int, expected: float) -> None:
    assert mcnemar_exact(b, c) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize(("b", "c"), [(7, 20), (40, 60), (480, 520), (1000, 1100), (4000, 4200)])
def test_mcnemar_exact_matches_the_binomial_test_at_large_counts(b: int, c: int) -> None:
    assert mcnemar_exact(b, c) == pytest.approx(_exact_two_sided(b, c), rel=1e-9)
    assert mcnemar_exact(b, c) == mcnemar_exact(c, b)
    # and the normal approximation agrees at large counts (continuity-corrected McNemar)
    if b + c > 1000:
        z = (abs(b - c) - 1) / math.sqrt(b + c)
        assert mcnemar_exact(b, c) == pytest.approx(2 * (1 - NormalDist().cdf(z)), rel=0.05)


@pytest.mark.parametrize(
    ("args", "error", "message"),
    [
        ((-1, 3), ValueError, "only_first_right must be >= 0"),
        ((2, -5), ValueError, "only_second_right"),
        ((1.5, 3), TypeError, "whole number"),
        ((2, "3"), TypeError, "whole number"),
        ((True, 3), TypeError, "int"),
    ],
)
def test_mcnemar_exact_rejects_bad_counts(args: tuple, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        mcnemar_exact(*args)


def test_paired_counts_stage_and_mcnemar_tables() -> None:
    golds = ["1", "2", "3", "4"]
    tagged = [f"<reasoning>\nr\n</reasoning>\n<answer>\n{g}\n</answer>" for g in golds]
    base = score_completions([f"It is {g}." for g in golds[:2]] + ["?", "?"], golds)  # right twice, no tags
    warm = score_completions([*tagged[:1], "?", "?", "?"], golds)  # formatted and right once
    grpo = score_completions([*tagged[:3], "<answer>\n0\n</answer>"], golds)
    assert paired_counts(base, warm) == (0, 1)  # "It is 1." has no tags: not strictly right
    assert paired_counts(base, warm, key="lenient_correct") == (1, 0)  # but its last number is
    assert paired_counts(warm, grpo) == (0, 2)
    table = stage_table({"base": base, "warm start": warm, "GRPO": grpo})
    assert table.loc["base", "accuracy"] == 0.0 and table.loc["base", "lenient_accuracy"] == 0.5
    assert table.loc["GRPO", "format_score"] == 0.75  # the last one has no reasoning block
    assert list(table.index) == ["base", "warm start", "GRPO"]
    tests = mcnemar_table({"base": base, "warm start": warm, "GRPO": grpo})
    assert list(tests["only second"]) == [1, 2] and tests["p"].between(0, 1).all()
    with pytest.raises(ValueError):
        paired_counts(base, score_completions(["1"], ["1"]))


def test_checkpoint_steps_sorted_by_step(tmp_path) -> None:
    for name in ("checkpoint-10", "checkpoint-2", "checkpoint-x", "final"):
        (tmp_path / name).mkdir()
    assert [step for step, _ in checkpoint_steps(tmp_path)] == [2, 10]
    assert checkpoint_steps(tmp_path / "missing") == []


def test_validation_problems_exclude_what_was_trained_on(gsm8k_env) -> None:
    full = validation_problems("ci", size=30)
    assert len(full) == 30
    expected = train_val_split(load_gsm8k("train", formatted=True, verbose=False), 0.2, 42)["validation"]
    assert full["question"] == expected["question"][:30]
    fewer = validation_problems("ci", exclude=full["question"][:5], size=30)
    assert not set(full["question"][:5]) & set(fewer["question"])


@pytest.mark.slow
@pytest.mark.long  # over 20 s; notebooks 02-05 run the same path in make test
def test_checkpoint_curve_and_warm_start_model(model_and_tokenizer, problems, tmp_path) -> None:
    """A run folder with a warm-start model and a no-op LoRA checkpoint: step 0 and the checkpoint score alike."""
    model, _ = model_and_tokenizer
    assert load_warm_start_model("ci", tmp_path) is None  # no warm start in this run
    model.save_pretrained(warm_start_model_dir(tmp_path))
    warm, tokenizer = load_warm_start_model("ci", tmp_path)
    assert tokenizer.padding_side == "left" and not warm.training
    adapter = get_peft_model(warm, LoraConfig(r=2, target_modules=["q_proj"], task_type="CAUSAL_LM"))
    adapter.save_pretrained(tmp_path / "checkpoint-5")  # LoRA starts as a no-op (B = 0)
    subset = problems.select(range(2))
    curve = checkpoint_curve("ci", tmp_path, subset, batch_size=2, max_new_tokens=8)
    assert [p["step"] for p in curve] == [0, 5] and all(p["n"] == 2 for p in curve)
    assert curve[0]["accuracy"] == curve[1]["accuracy"] and curve[0]["format_score"] == curve[1]["format_score"]
    save_curve(curve, tmp_path)
    assert load_curve(tmp_path) == curve and load_curve(tmp_path / "elsewhere") is None


def test_each_checkpoint_is_merged_into_the_untouched_starting_model(
    model_and_tokenizer, problems, tmp_path, monkeypatch, capsys
):
    """Checkpoint 1 moves the weights, checkpoint 2 is a no-op adapter: step 2 is evaluated on step 0's weights;
    checkpoint 3, its adapter cut short, is named and left out (not a traceback in notebook 05)."""
    model, _ = model_and_tokenizer
    model.save_pretrained(warm_start_model_dir(tmp_path))
    for step, scale in ((1, 0.5), (2, 0.0)):
        torch.manual_seed(step)
        adapter = get_peft_model(load_warm_start_model("ci", tmp_path)[0], LoraConfig(
            r=2, target_modules=["q_proj"], layers_to_transform=[0], task_type="CAUSAL_LM"))
        for name, weight in adapter.named_parameters():
            if "lora_B" in name:
                torch.nn.init.normal_(weight, std=scale) if scale else torch.nn.init.zeros_(weight)
        adapter.save_pretrained(tmp_path / f"checkpoint-{step}")
    evaluated, evaluate = [], curves.evaluate_model

    def recording(model, *args, **kwargs):
        evaluated.append(model.model.layers[0].self_attn.q_proj.weight.detach().clone())
        return evaluate(model, *args, **kwargs)

    monkeypatch.setattr(curves, "evaluate_model", recording)
    torn = tmp_path / "checkpoint-3"  # a kill or a full disk while checkpoint 3's adapter was saved
    shutil.copytree(tmp_path / "checkpoint-2", torn)
    (torn / "adapter_model.safetensors").write_bytes((torn / "adapter_model.safetensors").read_bytes()[:-100])
    curve = checkpoint_curve("ci", tmp_path, problems.select(range(1)), batch_size=1, max_new_tokens=2)
    assert f"{torn} is left out of the curve: adapter_model.safetensors: it has" in capsys.readouterr().out
    assert [point["step"] for point in curve] == [0, 1, 2]
    assert not torch.equal(evaluated[1], evaluated[0]), "checkpoint 1's adapter was not merged"
    assert torch.equal(evaluated[2], evaluated[0]), "checkpoint 2 was merged into weights checkpoint 1 had changed"


def test_the_decode_timer_splits_prefill_from_decoding(offline_model_and_tokenizer):
    from course_utils.lesson.generation import DecodeTimer, greedy_generate

    model, tokenizer = offline_model_and_tokenizer
    timer = DecodeTimer()
    chats = [[{"role": "user", "content": "Count from one to twenty, in words, separated by commas."}]]
    texts = [g.text for g in greedy_generate(model, tokenizer, chats, 12, timer)]
    assert timer.batches == 1 and timer.prefill_seconds > 0 and timer.decode_seconds > 0
    assert texts == [g.text for g in greedy_generate(model, tokenizer, chats, 12)], "the timer changes nothing"
    with pytest.raises(RuntimeError, match="without start"):
        DecodeTimer().stop()


def test_evaluate_model_reports_decoding_apart_from_prefill(offline_model_and_tokenizer, gsm8k_dir):
    model, tokenizer = offline_model_and_tokenizer
    problems = load_gsm8k("test", formatted=True, limit=2, folder=gsm8k_dir, verbose=False)
    result = evaluate_model(model, tokenizer, problems, batch_size=2, max_new_tokens=6, progress=False)
    assert result["prefill_seconds"] > 0 and result["decode_seconds"] > 0
    assert result["prefill_seconds"] + result["decode_seconds"] <= result["elapsed_seconds"]
    tokens = result["total_completion_tokens"]
    assert result["decode_tokens_per_second"] == pytest.approx(tokens / result["decode_seconds"])
    assert result["seconds_per_problem"] == pytest.approx(result["elapsed_seconds"] / 2)
    table = compare_results(result, result)
    assert table.loc["decode_tokens_per_second", "change"] == 0



def test_heldout_set_is_the_first_test_problems_in_file_order(gsm8k_env) -> None:
    from course_utils.evaluation.heldout import heldout_set

    chosen = heldout_set(12)
    assert list(chosen["question"]) == list(load_gsm8k("test", formatted=True, limit=12, verbose=False)["question"])
    assert {"prompt", "answer"} <= set(chosen.column_names)


@pytest.mark.parametrize("size", [0, -1, 2.5, True, "200"])
def test_heldout_set_refuses_a_size_that_is_no_count(size) -> None:
    from course_utils.evaluation.heldout import heldout_set

    with pytest.raises(ValueError, match="size must be a positive whole number"):
        heldout_set(size)


def test_an_adapter_on_a_4bit_base_is_evaluated_unmerged_and_elsewhere_merged() -> None:
    """Merging into 4-bit weights re-quantizes them: the evaluated model would differ from the trained one."""
    from peft import LoraConfig, get_peft_model

    from course_utils.evaluation.heldout import merged_unless_quantized
    from course_utils.lesson.models import build_tiny_random_model

    def adapted(quantized: bool):
        base = build_tiny_random_model(vocab_size=64, hidden_size=16, num_layers=1)
        if quantized:
            base.is_loaded_in_4bit = True  # what transformers sets on a model it loaded through bitsandbytes
        return get_peft_model(base, LoraConfig(r=2, target_modules=["q_proj"]))

    assert not hasattr(merged_unless_quantized(adapted(False)), "peft_config")
    kept = adapted(True)
    assert merged_unless_quantized(kept) is kept
    plain = build_tiny_random_model(vocab_size=64, hidden_size=16, num_layers=1)
    assert merged_unless_quantized(plain) is plain


def test_the_reward_swing_shrinks_like_one_over_the_root_of_the_completions_per_step():
    pool = [0.0, 1.0] * 50  # a reward right half the time: a single draw swings by 0.5
    assert reward_swing(pool, 1, steps=4000) == pytest.approx(0.5, abs=0.03)
    assert reward_swing(pool, 16, steps=4000) == pytest.approx(0.5 / 4, abs=0.01)
    assert reward_swing(pool, 16, seed=3) == reward_swing(pool, 16, seed=3)  # seeded: the notebook's figure is fixed
    with pytest.raises(ValueError, match="empty"):
        reward_swing([], 4)


def test_a_bad_evaluation_row_is_named_from_1_with_its_source():
    from datasets import Dataset

    from course_utils.evaluation.heldout import rows_to_evaluate

    rows = Dataset.from_list([{"prompt": [{"role": "user", "content": "Q"}], "answer": "4"},
                              {"prompt": [{"role": "user", "content": "Q"}], "answer": " "}])  # fmt: skip
    rows.info.description = "GSM8K test from /data/gsm8k/test.jsonl"
    with pytest.raises(ValueError, match=r"row 2 of GSM8K test from /data/gsm8k/test.jsonl has no gold 'answer'"):
        rows_to_evaluate(rows)
