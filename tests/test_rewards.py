"""Tests for course_utils.lesson.rewards: corrected rewards, classic originals, shaping, weights and tables."""

from __future__ import annotations

import math
import re
import threading
import time

import pandas as pd
import pytest

from course_utils.lesson import rewards as R
from course_utils.lesson.rewards import classic

MB = 1_000_000
GOOD = "<reasoning>\nstep one\nstep two\n</reasoning>\n<answer>\n1000\n</answer>"
ONE_LINE = "<reasoning>\n40 * 25 = 1000\n</reasoning>\n<answer>\n1000\n</answer>\n"


def conv(text):
    """A conversational completion as TRL passes it."""
    return [{"role": "assistant", "content": text}]


def score(func, text, gold="1000"):
    return func(prompts=[None], completions=[text], answer=[gold])[0]


# --- answers_match -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("predicted", "gold"),
    [
        ("1,000", "1000"),
        ("18.00", "18"),
        ("$18", "18"),
        ("72 dollars", "72"),
        ("-3", "-3.0"),
        ("1000", "1,000"),
        ("\\frac{144}{2}", "72"),  # needs math-verify
        ("\\boxed{72}", "72"),  # needs math-verify
        ("0.5", "1/2"),  # needs math-verify (gold not a plain number)
    ],
)
def test_answers_match_equivalent_forms(predicted, gold):
    assert R.answers_match(predicted, gold)


@pytest.mark.parametrize(
    ("predicted", "gold"),
    [("73", "72"), ("", "72"), (None, "72"), ("72", ""), ("72", None), ("seventy-two", "72"), ("7 2", "72")],
)
def test_answers_match_rejects_different_or_missing(predicted, gold):
    assert not R.answers_match(predicted, gold)


def test_answers_match_refuses_power_towers_fast():
    # sympy would try to evaluate 9^9^9^9 (math-verify's own timeout is 5 s per comparison).
    start = time.perf_counter()
    assert not R.answers_match("9^9^9^9", "72")
    assert not R.answers_match("100!", "72")
    assert time.perf_counter() - start < 0.5


@pytest.mark.parametrize("weird", [b"1000", 1000, 1000.0, float("nan"), ["1000"], object(), "1" * MB, "\x00"])
def test_answers_match_never_raises(weird):
    assert R.answers_match(weird, "1000") in (True, False)
    assert R.answers_match("1000", weird) in (True, False)


def test_answers_match_non_string_numbers_compare_by_value():
    assert R.answers_match(1000, "1000")
    assert R.answers_match("1000", 1000)


def test_answers_match_works_outside_the_main_thread():
    # math-verify's signal-based timeout raises ValueError outside the main thread; we switch it off there.
    results = []
    worker = threading.Thread(target=lambda: results.append(R.answers_match("\\frac{10}{5}", "2")))
    worker.start()
    worker.join()
    assert results == [True]


# --- completion reading ----------------------------------------------------------------------------------


def test_completion_text_reads_every_shape():
    assert R.completion_text("abc") == "abc"
    assert R.completion_text(conv("abc")) == "abc"
    assert R.completion_text({"role": "assistant", "content": "abc"}) == "abc"
    assert R.completion_text([{"role": "assistant", "content": [{"type": "text", "text": "abc"}]}]) == "abc"
    assert R.completion_text(None) == ""
    assert R.completion_text(conv(None)) == ""
    assert R.completion_text([{}]) == ""
    assert R.completion_text(42) == ""


def test_completions_must_be_a_list():
    with pytest.raises(TypeError, match="wrap a single completion"):
        R.correctness_reward_func(completions="just one string", answer=["1"])


def test_correctness_needs_answers_and_says_so():
    with pytest.raises(ValueError, match="'answer' column"):
        R.correctness_reward_func(prompts=None, completions=[GOOD])
    with pytest.raises(ValueError, match="pair up"):
        R.correctness_reward_func(prompts=None, completions=[GOOD, GOOD], answer=["1000"])
    with pytest.raises(TypeError, match=r"\[gold\] \* len"):
        R.correctness_reward_func(prompts=None, completions=[GOOD], answer="1000")


# --- the five corrected rewards, one by one ------------------------------------------------------------------


@pytest.mark.parametrize("wrap", [lambda t: t, conv], ids=["plain", "conversational"])
def test_correctness(wrap):
    f = R.correctness_reward_func
    assert score(f, wrap(GOOD)) == R.CORRECT_REWARD
    assert score(f, wrap(GOOD.replace("1000", "1,000"))) == R.CORRECT_REWARD
    assert score(f, wrap(GOOD.replace("1000", "1000.00"))) == R.CORRECT_REWARD
    assert score(f, wrap(GOOD.replace("1000", "999"))) == 0.0
    assert score(f, wrap("The answer is 1000.")) == 0.0  # no <answer> block: nothing to check


def test_correctness_uses_the_last_answer_block():
    text = "<answer>\n5\n</answer> no wait <answer>\n1000\n</answer>"
    assert score(R.correctness_reward_func, text) == R.CORRECT_REWARD


@pytest.mark.parametrize(
    ("answer", "expected"),
    [("1000", 0.5), ("-3", 0.5), ("1,000", 0.5), ("18.00", 0.5), ("18.5", 0.0), ("²", 0.0), ("abc", 0.0), ("", 0.0)],
)
def test_int_reward(answer, expected):
    assert score(R.int_reward_func, f"<answer>\n{answer}\n</answer>") == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (GOOD, 0.5),  # multi-line reasoning, no final newline
        (GOOD + "\n", 0.5),  # one final newline allowed
        (GOOD + "\n\n", 0.0),  # but not more
        (" " + GOOD, 0.0),  # nothing before <reasoning>
        (GOOD + "\nthanks", 0.0),  # nothing after </answer>
        ("<reasoning>\n\n</reasoning>\n<answer>\n1000\n</answer>", 0.0),  # empty reasoning
        ("<reasoning>\nr\n</reasoning>\n<answer>\n \n</answer>", 0.0),  # empty answer
        ("<reasoning>\nr\n</reasoning>\n<answer>\n1\n</answer>\n<answer>\n2\n</answer>", 0.0),  # repeated
        ("<reasoning>\n<reasoning>\nr\n</reasoning>\n</reasoning>\n<answer>\n1\n</answer>", 0.0),  # nested
        ("<reasoning>r</reasoning><answer>1</answer>", 0.0),  # tags not on their own lines
    ],
)
def test_strict_format(text, expected):
    assert score(R.strict_format_reward_func, text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (GOOD, 0.5),
        ("<reasoning>r</reasoning><answer>1</answer>", 0.5),
        ("  <reasoning>r</reasoning>\n\n  <answer>1</answer>  ", 0.5),
        ("<answer>1</answer><reasoning>r</reasoning>", 0.0),  # wrong order
        ("<reasoning>r</reasoning> text <answer>1</answer>", 0.0),  # text between the blocks
        ("<reasoning>r</reasoning><answer>1", 0.0),  # unclosed answer
        ("<reasoning>r", 0.0),
    ],
)
def test_soft_format(text, expected):
    assert score(R.soft_format_reward_func, text) == expected


def test_xmlcount_partial_credit_and_penalty():
    f = R.xmlcount_reward_func
    assert score(f, GOOD) == 4 * R.TAG_REWARD
    assert score(f, "<reasoning>\nr\n</reasoning>\n") == 2 * R.TAG_REWARD
    assert score(f, "<reasoning>r</reasoning>") == 0.0  # tags not on their own lines
    chatter = "\nHope it helps"  # 11 non-space characters after </answer>
    assert score(f, GOOD + chatter) == pytest.approx(4 * R.TAG_REWARD - 0.001 * len("Hopeithelps"))
    # Repeated tags earn nothing for that tag; out-of-order tags lose the later ones.
    assert score(f, GOOD + "\n<answer>\n") == pytest.approx(3 * R.TAG_REWARD - 0.001 * len("<answer>"))
    swapped = "<answer>\n1\n</answer>\n<reasoning>\nr\n</reasoning>"  # the reasoning block is also trailing text
    assert score(f, swapped) == pytest.approx(2 * R.TAG_REWARD - 0.001 * len("<reasoning>r</reasoning>"))


def test_xmlcount_penalty_is_bounded():
    assert score(R.xmlcount_reward_func, GOOD + "\n" + "x" * MB) == pytest.approx(
        4 * R.TAG_REWARD - R.MAX_TRAILING_PENALTY
    )


BAD_COMPLETIONS = {
    "none": None,
    "empty": "",
    "none_content": conv(None),
    "empty_message": [{}],
    "int": 42,
    "int_content": [{"role": "assistant", "content": 5}],
    "bytes": b"<answer>1000</answer>",
    "empty_list": [],
    "unicode": conv("<reasoning>\n数学 🧮 — ünïcödé\n</reasoning>\n<answer>\n١٠٠٠\n</answer>"),
    "only_tags": "<reasoning></reasoning><answer></answer>" * 3,
    "nested": "<answer><answer>1000</answer></answer>",
    "1mb_text": "a" * MB,
    "1mb_tags": "<reasoning>\n" * (MB // 12),
}


@pytest.mark.parametrize("func", R.REWARD_FUNCS, ids=R.REWARD_NAMES)
@pytest.mark.parametrize("name", list(BAD_COMPLETIONS))
def test_corrected_rewards_never_raise_and_stay_finite(func, name):
    values = func(prompts=[None], completions=[BAD_COMPLETIONS[name]], answer=["1000"])
    assert len(values) == 1
    assert isinstance(values[0], float) and math.isfinite(values[0])


def test_unicode_digits_are_numbers():
    # Arabic-Indic ١٠٠٠ is 1000: Python's Decimal reads it, so the answer counts.
    assert score(R.correctness_reward_func, BAD_COMPLETIONS["unicode"]) == R.CORRECT_REWARD


# --- linear time on adversarial input (the issue demands a time bound) ------------------------------------

ADVERSARIAL = {
    "open_tags": "<reasoning>\n" * (MB // 12),
    "block_no_close": "<reasoning></reasoning>\n<answer>" * (MB // 32),
    "close_answers": "\n</answer>" * (MB // 10),
    "huge_number": "<reasoning>\nr\n</reasoning>\n<answer>\n" + "1," * (MB // 2) + "\n</answer>",
    "spaces_in_answer": "<answer>" + " 1" * (MB // 2) + "</answer>",
    "newlines": "<reasoning>" + "\n" * MB + "</reasoning>",
}


def _best_of_3(func, completions):
    times = []
    for _ in range(3):
        start = time.perf_counter()
        func(prompts=[None], completions=completions, answer=["1000"])
        times.append(time.perf_counter() - start)
    return min(times)


@pytest.mark.parametrize("func", R.REWARD_FUNCS, ids=R.REWARD_NAMES)
@pytest.mark.parametrize("name", list(ADVERSARIAL))
def test_one_megabyte_adversarial_completion_under_50ms(func, name):
    text = ADVERSARIAL[name]
    assert len(text) >= 0.9 * MB
    assert _best_of_3(func, [text]) < 0.050


# --- classic: exactly the originals' values ---------------------------------------------------------------


def spec_values(t: str, answer: str) -> list[float]:
    """The issue's written specification of the classic rewards, term by term (an independent oracle)."""
    x = t.split("<answer>")[-1].split("</answer>")[0].strip()
    xml = 0.0
    if t.count("<reasoning>\n") == 1:
        xml += 0.125
    if t.count("\n</reasoning>\n") == 1:
        xml += 0.125
    if t.count("\n<answer>\n") == 1:
        xml += 0.125 - 0.001 * len(t.split("\n</answer>\n")[-1])
    if t.count("\n</answer>") == 1:
        xml += 0.125 - 0.001 * (len(t.split("\n</answer>")[-1]) - 1)
    strict = re.match(r"^<reasoning>\n.*?\n</reasoning>\n<answer>\n.*?\n</answer>\n$", t)
    soft = re.match(r"<reasoning>.*?</reasoning>\s*<answer>.*?</answer>", t)
    return [2.0 if x == answer else 0.0, 0.5 if x.isdigit() else 0.0, 0.5 if strict else 0.0, 0.5 if soft else 0.0, xml]


CLASSIC_CASES = [
    ONE_LINE,
    ONE_LINE.rstrip("\n"),
    GOOD,
    GOOD + "\n",
    ONE_LINE.replace("1000", "1,000"),
    ONE_LINE.replace("\n1000\n", "\n1000.00\n"),
    "<reasoning>r</reasoning> <answer>1000</answer>",
    "<reasoning>r</reasoning>\n<answer>-3</answer>",
    "<answer>\n²\n</answer>",
    ONE_LINE + "Hope this helps!",
    "no tags at all",
    "",
    "<answer>1</answer><answer>1000</answer>",
]


def classic_values(text, answer="1000"):
    return [f(prompts=[None], completions=[conv(text)], answer=[answer])[0] for f in classic.REWARD_FUNCS]


@pytest.mark.parametrize("text", CLASSIC_CASES)
def test_classic_matches_the_issue_specification(text):
    assert classic_values(text) == pytest.approx(spec_values(text, "1000"), abs=1e-12)


def test_classic_known_values_by_hand():
    # Single-line reasoning, final newline: every classic check passes except soft (newline after <reasoning>).
    assert classic_values(ONE_LINE) == pytest.approx([2.0, 0.5, 0.5, 0.0, 0.5])
    # No final newline: strict fails and xmlcount charges the whole text (len) then adds 0.001 back.
    t = ONE_LINE.rstrip("\n")
    assert classic_values(t)[2] == 0.0
    assert classic_values(t)[4] == pytest.approx(0.5 - 0.001 * len(t) + 0.001)
    # Exact string comparison: "1,000" is wrong against "1000".
    assert classic_values(ONE_LINE.replace("1000", "1,000"))[0] == 0.0
    # isdigit: "-3" is not an integer, "²" is.
    assert classic_values("<answer>-3</answer>")[1] == 0.0
    assert classic_values("<answer>²</answer>")[1] == 0.5


def test_classic_patterns_are_the_originals_without_dotall():
    assert classic.STRICT_PATTERN == r"^<reasoning>\n.*?\n</reasoning>\n<answer>\n.*?\n</answer>\n$"
    assert classic.SOFT_PATTERN == r"<reasoning>.*?</reasoning>\s*<answer>.*?</answer>"
    assert classic_values(GOOD + "\n")[2] == 0.0  # multi-line reasoning never matches without re.DOTALL


def test_classic_crashes_where_the_originals_crash():
    with pytest.raises(AttributeError):
        classic.int_reward_func(completions=[conv(None)])


@pytest.mark.parametrize(
    ("text", "gold", "index"),
    [
        (ONE_LINE.replace("1000", "1,000"), "1000", 0),  # correctness: 1,000
        (ONE_LINE.replace("\n1000\n", "\n18.00\n"), "18", 0),  # correctness: 18.00
        ("<answer>\n-3\n</answer>", "-3", 1),  # int: negative numbers
        (GOOD + "\n", "1000", 2),  # strict: multi-line reasoning
        (GOOD, "1000", 3),  # soft: multi-line reasoning
        (GOOD, "1000", 4),  # xmlcount: whole-text penalty when no final newline
    ],
)
def test_corrected_fixes_each_classic_bug(text, gold, index):
    corrected = R.REWARD_FUNCS[index](prompts=[None], completions=[conv(text)], answer=[gold])[0]
    original = classic.REWARD_FUNCS[index](prompts=[None], completions=[conv(text)], answer=[gold])[0]
    assert corrected > original


def test_get_reward_funcs_switch():
    assert R.get_reward_funcs() == R.REWARD_FUNCS
    assert R.get_reward_funcs("classic") == classic.REWARD_FUNCS
    assert [f.__name__ for f in R.get_reward_funcs("classic")] == list(R.REWARD_NAMES)
    with pytest.raises(ValueError, match="corrected"):
        R.get_reward_funcs("fixed")


# --- shaping -----------------------------------------------------------------------------------------------


def test_length_reward_peaks_at_target_and_is_symmetric():
    f = R.make_length_reward(target=100, width=20)
    at, near_lo, near_hi, far = f(completions=["x" * 100, "x" * 80, "x" * 120, "x" * 300])
    assert at == 1.0
    assert near_lo == pytest.approx(near_hi) == pytest.approx(math.exp(-0.5))
    assert far < 1e-6


def test_length_reward_counts_tokens_when_asked():
    f = R.make_length_reward(target=3, width=1, unit="tokens")
    assert f(completions=["a", "b"], completion_ids=[[1, 2, 3], [1]]) == pytest.approx([1.0, math.exp(-2)])
    with pytest.raises(ValueError, match="completion_ids"):
        f(completions=["a"])
    with pytest.raises(ValueError, match="unit"):
        R.make_length_reward(unit="words")
    with pytest.raises(ValueError, match="width"):
        R.make_length_reward(width=0)


def test_combined_reward_is_the_weighted_sum():
    combined = R.combine_rewards([R.length_reward_func, R.soft_format_reward_func], [0.6, 0.4])
    completions = [GOOD, "no tags"]
    length = R.length_reward_func(completions=completions)
    fmt = R.soft_format_reward_func(completions=completions)
    assert combined(completions=completions) == pytest.approx(
        [0.6 * a + 0.4 * b for a, b in zip(length, fmt, strict=True)]
    )
    assert combined.__name__ == "combined_length_soft_format"
    with pytest.raises(ValueError, match="one weight per function"):
        R.combine_rewards([R.length_reward_func], [0.6, 0.4])


def test_staged_reward_follows_trainer_state():
    from transformers import TrainerState

    staged = R.make_staged_format_reward(switch_fraction=0.5)
    one_line = "<reasoning>r</reasoning> <answer>1</answer>"  # lenient yes, strict no
    early, late = TrainerState(global_step=10, max_steps=100), TrainerState(global_step=50, max_steps=100)
    assert R.format_stage(early) == "lenient" and R.format_stage(late) == "strict"
    assert staged(completions=[one_line, GOOD], trainer_state=early) == [0.5, 0.5]
    assert staged(completions=[one_line, GOOD], trainer_state=late) == [0.0, 0.5]
    assert staged(completions=[one_line]) == [0.5]  # no state: lenient
    assert staged(completions=[one_line], trainer_state=early, stage="strict") == [0.0]
    with pytest.raises(ValueError, match="stage"):
        staged(completions=[one_line], stage="medium")
    with pytest.raises(ValueError, match="switch_fraction"):
        R.make_staged_format_reward(switch_fraction=2.0)


def test_rewards_accept_everything_trl_passes():
    # GRPOTrainer._calculate_rewards calls each function with these keywords (trl/trainer/grpo_trainer.py).
    from transformers import TrainerState

    kwargs = {
        "prompts": [[{"role": "user", "content": "q"}]] * 2,
        "completions": [conv(GOOD), conv("nope")],
        "completion_ids": [[1, 2], [3]],
        "answer": ["1000", "1000"],
        "question": ["q", "q"],
        "trainer_state": TrainerState(),
        "log_extra": lambda *a, **k: None,
        "log_metric": lambda *a, **k: None,
    }
    funcs = [*R.REWARD_FUNCS, *classic.REWARD_FUNCS, R.length_reward_func, R.staged_format_reward_func]
    for func in funcs:
        values = func(**kwargs)
        assert len(values) == 2 and all(math.isfinite(v) for v in values)


# --- weights and tables ----------------------------------------------------------------------------------


def test_weight_presets_and_max_total():
    # The article's tables give each reward's size; the functions return the "initial" sizes, so the weights
    # (multipliers) are 1.0 for "initial" and tuned size / initial size for "tuned"
    assert R.max_total_reward("initial") == pytest.approx(2.0 + 0.5 + 0.5 + 0.5 + 4 * 0.125) == 4.0
    assert R.max_total_reward("tuned") == pytest.approx(3.0 + 0.3 + 0.8 + 0.2 + 4 * 0.15) == pytest.approx(4.9)
    assert list(R.reward_points("initial").values()) == pytest.approx([2.0, 0.5, 0.5, 0.5, 0.5])
    assert list(R.reward_points("tuned").values()) == pytest.approx([3.0, 0.3, 0.8, 0.2, 0.6])
    assert R.DEFAULT_WEIGHTS["initial"] == (1.0, 1.0, 1.0, 1.0, 1.0)
    for preset in R.DEFAULT_WEIGHTS:
        weights = R.resolve_weights(preset)
        assert R.max_total_reward(preset) == pytest.approx(
            sum(w * m for w, m in zip(weights, R.REWARD_MAX, strict=True))
        )
    named = dict(zip(R.REWARD_NAMES, R.DEFAULT_WEIGHTS["tuned"], strict=True))
    assert R.grpo_reward_weights(named) == list(R.DEFAULT_WEIGHTS["tuned"])


@pytest.mark.parametrize(
    ("weights", "error"),
    [("best", "preset"), ([1.0, 2.0], "need 5"), ([1, 1, 1, 1, float("inf")], "finite"), ({"x": 1}, "unknown")],
)
def test_bad_weights_say_what_is_wrong(weights, error):
    with pytest.raises(ValueError, match=error):
        R.resolve_weights(weights)


def test_best_completion_earns_the_preset_maximum():
    """A perfect completion scored by the real functions with a preset's weights earns max_total_reward."""
    for preset, best in (("initial", 4.0), ("tuned", 4.9)):
        table = R.reward_table([conv(GOOD)], "1000", weights=preset)
        assert table.at[0, R.TOTAL_COLUMN] == pytest.approx(best)


def test_saved_weights_round_trip(tmp_path, capsys):
    path = tmp_path / "weights.json"
    assert R.load_weights(path) == [1.0] * 5  # nothing saved: the "initial" preset, said aloud
    assert "initial" in capsys.readouterr().out
    R.save_weights([1.5, 0.0, 2.0, 0.5, 1.0], path)
    assert R.load_weights(path) == [1.5, 0.0, 2.0, 0.5, 1.0]
    assert R.load_weights(tmp_path / "missing.json", default="tuned") == list(R.DEFAULT_WEIGHTS["tuned"])


def test_bad_saved_weights_fail_loudly(tmp_path):
    path = tmp_path / "weights.json"
    path.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        R.load_weights(path)
    path.write_text('{"correctness_reward_func": 1.0}')
    with pytest.raises(ValueError, match="missing names"):
        R.load_weights(path)
    with pytest.raises(ValueError, match="need 5"):
        R.save_weights([1.0, 2.0], path)


def test_weights_file_lives_in_the_outputs_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("COURSE_OUTPUT_DIR", str(tmp_path))
    assert R.save_weights("tuned") == tmp_path / "reward_weights.json" == R.weights_path()
    assert R.load_weights() == list(R.DEFAULT_WEIGHTS["tuned"])


def test_reward_table():
    completions = [conv(GOOD), "no tags", conv(GOOD.replace("1000", "7"))]
    table = R.reward_table(completions, "1000", weights="tuned")
    assert list(table.columns) == ["completion", *R.REWARD_NAMES, R.TOTAL_COLUMN]
    assert len(table) == 3
    expected = [
        sum(w * table.at[i, n] for w, n in zip(R.DEFAULT_WEIGHTS["tuned"], R.REWARD_NAMES, strict=True))
        for i in range(3)
    ]
    assert table[R.TOTAL_COLUMN].tolist() == pytest.approx(expected)
    assert table.at[0, R.TOTAL_COLUMN] == pytest.approx(R.max_total_reward("tuned"))
    assert "⏎" in table.at[0, "completion"]


def test_reward_table_custom_funcs_and_errors():
    table = R.reward_table(["ab", "abcd"], funcs=[R.make_length_reward(4, 1)], weights=[2.0])
    assert table[R.TOTAL_COLUMN].tolist() == pytest.approx([2 * math.exp(-2), 2.0])
    with pytest.raises(ValueError, match="non-empty"):
        R.reward_table([], "1")
    with pytest.raises(ValueError, match="need 1 weights"):
        R.reward_table(["a"], funcs=[R.length_reward_func], weights=[1.0, 2.0])
    with pytest.raises(ValueError, match="stage"):
        R.reward_table(["a"], "1", stage="medium")


def test_compare_variants_shows_where_they_differ():
    table = R.compare_variants([conv(ONE_LINE), conv(ONE_LINE.replace("1000", "1,000"))], "1000")
    assert isinstance(table, pd.DataFrame)
    differs = table[table["differs"]]
    assert ("correctness_reward_func" in set(differs["reward"])) and ("total" in set(differs["reward"]))
    same = table[(table["reward"] == "int_reward_func")]
    assert not same.iloc[0]["differs"]


def test_extract_xml_answer_is_the_data_modules():
    from course_utils.core.answer_format import extract_xml_answer

    assert R.extract_xml_answer is extract_xml_answer


def test_answers_match_leaves_an_outer_alarm_alone():
    # math-verify's signal.alarm(0) would cancel a pending alarm (e.g. a test timeout); we skip its timeout then.
    import signal

    previous = signal.signal(signal.SIGALRM, lambda *_: None)
    try:
        signal.alarm(100)
        assert R.answers_match("\\frac{6}{3}", "2")
        assert signal.getitimer(signal.ITIMER_REAL)[0] > 90
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
