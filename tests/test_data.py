"""Tests for GSM8K in the lesson group (``data``, ``formatting``, ``data_checks``, ``token_lengths``): every real
GSM8K row, bad input, sources, prompts, splits, lengths."""

from __future__ import annotations

import json
import math
import re
import warnings
from decimal import Decimal, InvalidOperation
from pathlib import Path

import numpy as np
import pytest
from datasets import Dataset
from transformers import AutoTokenizer

from course_utils.core.answer_format import SYSTEM_PROMPT, extract_xml_answer
from course_utils.exercises.nb02_gsm8k_data import check_02_completion_length, check_02_gold_answer, check_02_rows_lost
from course_utils.lesson import data
from course_utils.lesson.data import (
    SAMPLE_TEST_ROWS,
    load_gsm8k,
    load_splits,
    measure_dataset_vs_dicts,
    sample_path,
    save_splits,
    train_val_split,
)
from course_utils.lesson.data_checks import (
    PITFALL_PARSERS,
    apply_pitfall,
    calculator_notes,
    check_calculator_notes,
    evaluate_arithmetic,
    pitfall_outcomes,
    pitfall_report,
)
from course_utils.lesson.formatting import (
    GSM8KFormatError,
    build_prompt,
    extract_hash_answer,
    find_bad_rows,
    format_gsm8k,
    format_row,
    swapped_roles_prompt,
)
from course_utils.lesson.generation import continuation_probability
from course_utils.lesson.offline_model import ModelUnavailableError, materialize_offline_model
from course_utils.lesson.plotting import plot_token_lengths
from course_utils.lesson.token_lengths import (
    prompt_token_lengths,
    recommended_completion_length,
    reference_length_percentile,
    rows_with_short_prompts,
    token_length_stats,
)

GOOD = {"question": "Ann has 2 bags of 3 apples. How many apples?", "answer": "2*3 = <<2*3=6>>6\n#### 6"}


# --- helpers written independently of the package ------------------------------------------------


def read_jsonl(path: Path) -> list[dict]:
    with path.open(encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def independent_gold(solution: str) -> Decimal:
    """Last line must be '#### <number>'; parse it with Decimal after dropping ',', '$' and spaces.

    Line-based with ``rpartition`` and ``Decimal``, unlike the package's split-on-marker and regex.
    """
    _, _, last_line = solution.rstrip("\n").rpartition("\n")
    assert last_line.startswith("####"), f"last line is not the answer line: {last_line!r}"
    cleaned = "".join(ch for ch in last_line[4:] if ch not in ", $\t")
    try:
        return Decimal(cleaned)
    except InvalidOperation:
        pytest.fail(f"not a number after normalisation: {last_line!r}")


def raw_final(solution: str) -> str:
    """The text after the last line's '####', untouched (for predicting what the pitfalls break)."""
    return solution.rstrip("\n").rpartition("\n")[2][4:]


@pytest.fixture(scope="module")
def real_rows(gsm8k_dir: Path) -> dict[str, list[dict]]:
    return {split: read_jsonl(gsm8k_dir / f"{split}.jsonl") for split in ("train", "test")}


@pytest.fixture(scope="module")
def sample_rows() -> list[dict]:
    return read_jsonl(sample_path())


@pytest.fixture(scope="module")
def tokenizer():
    try:
        return AutoTokenizer.from_pretrained(materialize_offline_model())
    except ModelUnavailableError as exc:
        pytest.skip(f"offline model unavailable: {exc}")


@pytest.fixture
def offline_sample(monkeypatch):
    """No GSM8K_DIR and no Hub: load_gsm8k must fall back to the bundled sample."""
    monkeypatch.delenv("GSM8K_DIR", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


# --- every real row ---------------------------------------------------------------------------------


@pytest.mark.parametrize("split", ["train", "test"])
def test_every_real_row_parses_and_matches_an_independent_parse(gsm8k_dir, real_rows, split):
    raw = real_rows[split]
    loaded = load_gsm8k(split, gsm8k_dir, verbose=False)
    formatted = format_gsm8k(loaded)
    assert len(loaded) == len(formatted) == len(raw), "rows were lost between the file and the formatted dataset"
    assert formatted["question"] == [row["question"].strip() for row in raw]
    for index, (row, gold) in enumerate(zip(raw, formatted["answer"], strict=True)):
        assert math.isfinite(float(gold)), f"row {index}: {gold!r}"
        assert Decimal(gold) == independent_gold(row["answer"]), f"row {index}: {row['answer'][-40:]!r}"
        assert "," not in gold and "$" not in gold and gold == gold.strip()


def test_real_gsm8k_has_its_documented_size(real_rows):
    assert (len(real_rows["train"]), len(real_rows["test"])) == (7473, 1319)  # OpenAI's published split sizes


def test_no_real_row_is_reported_bad(gsm8k_dir):
    assert find_bad_rows(load_gsm8k("test", gsm8k_dir, verbose=False)) == []


# --- extract_hash_answer ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("a\n#### 72", "72"),
        ("a\n#### 1,000", "1000"),
        ("a\n#### 109,200,000", "109200000"),
        ("a\n#### $1,200", "1200"),
        ("a\n#### -5", "-5"),
        ("a\n#### -1,500", "-1500"),
        ("a\n#### 2.5", "2.5"),
        ("a\n####\t 72 \n", "72"),
        ("a\n####72", "72"),
    ],
)
def test_extract_hash_answer_normalises(text, expected):
    assert extract_hash_answer(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("no marker here 7", "no '####'"),
        ("a #### 1\nb #### 2", "2 '####' markers"),
        ("a\n#### ", "empty answer"),
        ("a\n#### seven", "not a number"),
        ("a\n#### 1/2", "not a number"),
    ],
)
def test_extract_hash_answer_rejects_malformed(text, message):
    with pytest.raises(GSM8KFormatError, match=message):
        extract_hash_answer(text)


@pytest.mark.parametrize("value", [None, 72, b"#### 72", ["#### 72"]])
def test_extract_hash_answer_rejects_non_strings(value):
    with pytest.raises(TypeError, match="must be a string"):
        extract_hash_answer(value)


# --- bad rows: strict and lenient -------------------------------------------------------------------

BAD_ROWS = [
    ({"question": "Q?", "answer": "The answer is 7"}, "no '####'", "The answer is 7"),
    ({"question": "Q?", "answer": "#### 1\n#### 2"}, "2 '####' markers", "#### 1"),
    ({"question": "Q?", "answer": "so\n#### "}, "empty answer", "so"),
    ({"question": "Q?", "answer": "so\n#### lots"}, "not a number", "lots"),
    ({"question": "Q?", "answer": 42}, "must be a string", "42"),
    ({"question": "", "answer": "#### 1"}, "missing or empty question", ""),
    ({"answer": "#### 1"}, "missing or empty question", ""),
    ("question,answer", "row is a str, not a dict", "question,answer"),
    (None, "row is a NoneType, not a dict", "None"),
]


@pytest.mark.parametrize(("bad", "reason", "excerpt"), BAD_ROWS)
def test_format_gsm8k_names_the_bad_row(bad, reason, excerpt):
    with pytest.raises(ValueError, match=r"row 2 \(index 1\)") as caught:
        format_gsm8k([GOOD, bad, GOOD])
    message = str(caught.value)
    assert reason in message and excerpt in message and "lenient=True" in message


def test_lenient_mode_skips_and_reports_which_rows():
    rows = [GOOD, BAD_ROWS[0][0], GOOD, "not a row", BAD_ROWS[3][0]]
    with pytest.warns(UserWarning, match=r"skipped 3 of 5 rows") as caught:
        kept = format_gsm8k(rows, lenient=True)
    text = str(caught[0].message)
    assert "row 2 (index 1):" in text and "row 4 (index 3):" in text and "row 5 (index 4):" in text
    assert "row 1 " not in text and "row 3 " not in text
    assert len(kept) == 2 and kept["answer"] == ["6", "6"]


def test_a_bad_row_of_a_gsm8k_file_is_named_with_the_file(tmp_path):
    """A row number alone does not say which file to open: load_gsm8k's source goes into every row error."""
    rows = [GOOD, {"question": "How many?", "answer": "no marker here"}, GOOD]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    source = f"GSM8K train from folder: {re.escape(str(tmp_path / 'train.jsonl'))}"
    named = rf"row 2 \(index 1\) of {source}: no '####' marker"
    with pytest.raises(GSM8KFormatError, match=named):
        load_gsm8k("train", tmp_path, formatted=True, verbose=False)
    raw = load_gsm8k("train", tmp_path, verbose=False)
    with pytest.warns(UserWarning, match=rf"skipped 1 of 3 rows of {source}: row 2"):
        format_gsm8k(raw, lenient=True)
    with pytest.raises(GSM8KFormatError, match=rf"Cannot measure {named}"):
        token_length_stats(raw, None)


def test_lenient_mode_is_silent_without_bad_rows():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(format_gsm8k([GOOD, GOOD], lenient=True)) == 2


def test_all_bad_rows_is_an_error_even_when_lenient():
    with pytest.warns(UserWarning), pytest.raises(ValueError, match="No usable rows"):
        format_gsm8k([BAD_ROWS[0][0]], lenient=True)


def test_find_bad_rows_lists_index_and_reason():
    bad = find_bad_rows([GOOD, BAD_ROWS[1][0], None])
    assert [b.index for b in bad] == [1, 2]
    assert "markers" in bad[0].reason and "not a dict" in bad[1].reason and str(bad[0]).startswith("row 2 (index 1):")


def test_format_gsm8k_columns_and_content():
    ds = format_gsm8k(Dataset.from_list([GOOD]))
    assert set(ds.column_names) == {"prompt", "answer", "question", "reasoning"}
    assert ds[0]["prompt"] == build_prompt(GOOD["question"]) and ds[0]["answer"] == "6"
    assert "####" not in ds[0]["reasoning"] and ds[0]["reasoning"].startswith("2*3")


def test_format_row_is_what_format_gsm8k_maps():
    row = {"question": "  How much?  ", "answer": "5 * 240 = 1200\n#### $1,200"}
    assert format_row(row) == {
        "prompt": build_prompt("How much?"),
        "answer": "1200",
        "question": "How much?",
        "reasoning": "5 * 240 = 1200",
    }
    assert format_row(row, "Answer briefly.")["prompt"][0] == {"role": "system", "content": "Answer briefly."}
    assert [format_row(row)] == format_gsm8k([row]).to_list()
    with pytest.raises(ValueError, match="missing or empty question"):
        format_row({"question": " ", "answer": "#### 7"})
    with pytest.raises(ValueError, match="no '####' marker"):
        format_row({"question": "Q?", "answer": "7"})


# --- load_gsm8k sources ---------------------------------------------------------------------------


def write_split(folder: Path, split: str, count: int) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    rows = [
        {"question": f"{folder.name} question {i}?", "answer": f"{i}+1 = <<{i}+1={i + 1}>>{i + 1}\n#### {i + 1}"}
        for i in range(count)
    ]
    (folder / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def test_folder_argument_beats_gsm8k_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("GSM8K_DIR", str(write_split(tmp_path / "env", "train", 3)))
    ds = load_gsm8k("train", write_split(tmp_path / "arg", "train", 2), verbose=False)
    assert len(ds) == 2 and ds[0]["question"].startswith("arg") and "folder" in ds.info.description


def test_gsm8k_dir_is_used_without_argument(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("GSM8K_DIR", str(write_split(tmp_path / "env", "test", 3)))
    ds = load_gsm8k("test")
    assert len(ds) == 3 and ds[0]["question"].startswith("env")
    assert "from folder" in capsys.readouterr().out


def test_bad_gsm8k_dir_is_an_error_not_the_sample(tmp_path, monkeypatch):
    monkeypatch.setenv("GSM8K_DIR", str(tmp_path / "missing"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(FileNotFoundError, match=r"missing \(from GSM8K_DIR; found: the folder does not exist\)"):
        load_gsm8k("train", verbose=False)


def test_sample_when_offline(offline_sample, sample_rows):
    train, test = load_gsm8k("train", verbose=False), load_gsm8k("test", verbose=False)
    assert len(test) == SAMPLE_TEST_ROWS and len(train) + len(test) == len(sample_rows)
    assert set(train["question"]).isdisjoint(test["question"])
    assert test["question"] == [row["question"] for row in sample_rows[-SAMPLE_TEST_ROWS:]]


def test_explicit_folder_without_files_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="GSM8K_DIR"):
        load_gsm8k("train", tmp_path, verbose=False)


def test_load_gsm8k_formatted_and_limit(offline_sample):
    ds = load_gsm8k("train", formatted=True, limit=5, verbose=False)
    assert len(ds) == 5 and "prompt" in ds.column_names


@pytest.mark.parametrize(("kwargs", "message"), [({"split": "dev"}, "split"), ({"limit": 0}, "limit")])
def test_load_gsm8k_rejects_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        load_gsm8k(**{"split": "train", **kwargs})


# --- the bundled sample ---------------------------------------------------------------------------


def test_sample_calculator_notes_are_all_correct(sample_rows):
    problems = {i: p for i, row in enumerate(sample_rows) if (p := check_calculator_notes(row["answer"]))}
    assert problems == {}


def test_sample_covers_every_normalisation(sample_rows):
    finals = [raw_final(row["answer"]).strip() for row in sample_rows]
    assert len(sample_rows) >= 64 and len({row["question"] for row in sample_rows}) == len(sample_rows)
    for part in (finals[:-SAMPLE_TEST_ROWS], finals[-SAMPLE_TEST_ROWS:]):
        assert any("," in f for f in part) and any("." in f for f in part) and any(f.startswith("-") for f in part)
        assert any(f.startswith("$") for f in part)
    assert sum("$" in row["answer"].split("####")[0] for row in sample_rows) >= 10  # money in the reasoning


def test_sample_is_not_copied_from_gsm8k(sample_rows, real_rows):
    real_questions = {row["question"] for split in real_rows.values() for row in split}
    assert not real_questions & {row["question"] for row in sample_rows}


def test_check_calculator_notes_catches_mistakes():
    assert any("gives 4" in p for p in check_calculator_notes("2+2 = <<2+2=5>>5\n#### 5"))
    assert any("differs" in p for p in check_calculator_notes("2+2 = <<2+2=4>>4\n#### 5"))
    assert check_calculator_notes("just 4\n#### 4") == ["no calculator notes"]
    assert calculator_notes("a <<48/2=24>>24 b <<24+48=72>>72") == [("48/2", "24"), ("24+48", "72")]


@pytest.mark.parametrize("expression", ["__import__('os')", "2**3", "x+1", "1/0", "3 %", "True+1"])
def test_evaluate_arithmetic_refuses_anything_but_arithmetic(expression):
    with pytest.raises(ValueError):
        evaluate_arithmetic(expression)


def test_evaluate_arithmetic_computes():
    assert evaluate_arithmetic("-(2+3)*4/8") == -2.5 and evaluate_arithmetic("1,200+3") == 1203


# --- pitfalls lose exactly what the notebook says -------------------------------------------------


def expected_damage(name: str, final: str) -> str | None:
    """'lost', 'wrong' or None for one raw final answer, predicted from its characters alone."""
    stripped = final.strip()
    predictions = {
        "regex_digits": "lost" if stripped[:1] in "-$" else ("wrong" if any(c in stripped for c in ",.") else None),
        "isdigit_filter": "lost" if any(c in stripped for c in ",.-$") else None,
        "int_cast": "lost" if any(c in stripped for c in ",.$") else None,
        "keep_commas": "wrong" if any(c in stripped for c in ",$") else None,
        "keep_dollar": "wrong" if "$" in stripped else None,
        "no_strip": "wrong" if final != stripped else None,
    }
    return predictions[name]


@pytest.mark.parametrize("name", list(PITFALL_PARSERS))
def test_pitfalls_damage_exactly_the_predicted_rows(name, real_rows, sample_rows):
    for rows in (real_rows["train"], real_rows["test"], sample_rows):
        answers = [row["answer"] for row in rows]
        outcome = pitfall_outcomes(name, answers)
        for kind in ("lost", "wrong"):
            predicted = [i for i, text in enumerate(answers) if expected_damage(name, raw_final(text)) == kind]
            assert outcome[kind] == predicted, f"{name} {kind}"


def test_pitfall_report_matches_outcomes_and_every_pitfall_shows_on_the_sample(sample_rows):
    report = {row["pitfall"]: row for row in pitfall_report(sample_rows)}
    answers = [row["answer"] for row in sample_rows]
    for name, row in report.items():
        outcome = pitfall_outcomes(name, answers)
        assert (row["lost"], row["wrong"]) == (len(outcome["lost"]), len(outcome["wrong"]))
        assert row["lost"] + row["wrong"] + row["right"] == len(sample_rows)
        assert row["lost"] + row["wrong"] > 0, f"the sample does not exercise {name}"


def test_keep_dollar_is_harmless_on_real_gsm8k_but_not_on_the_sample(real_rows, sample_rows):
    real = {row["pitfall"]: row for row in pitfall_report(real_rows["train"])}
    assert real["keep_dollar"]["wrong"] == 0 and real["keep_commas"]["wrong"] > 0 and real["regex_digits"]["lost"] > 0
    assert {row["pitfall"]: row for row in pitfall_report(sample_rows)}["keep_dollar"]["wrong"] > 0


def test_apply_pitfall_unknown_name():
    with pytest.raises(KeyError, match="Unknown pitfall"):
        apply_pitfall("nope", "#### 1")


# --- prompts --------------------------------------------------------------------------------------


def test_build_prompt_roles_and_order():
    messages = build_prompt("  What is 2+2?  ")
    assert [m["role"] for m in messages] == ["system", "user"]
    assert messages[0]["content"] == SYSTEM_PROMPT and messages[1]["content"] == "What is 2+2?"
    assert build_prompt("Q?", system_prompt="Be brief.")[0]["content"] == "Be brief."
    assert swapped_roles_prompt("Q?") == build_prompt("Q?")[::-1]


@pytest.mark.parametrize("question", ["", "   ", None, 5, ["Q?"]])
def test_build_prompt_rejects_bad_questions(question):
    with pytest.raises(ValueError, match="question must be a non-empty string"):
        build_prompt(question)


def test_build_prompt_rejects_bad_system_prompt():
    with pytest.raises(TypeError, match="system_prompt"):
        build_prompt("Q?", system_prompt=None)


def test_system_prompt_asks_for_the_xml_the_parser_reads():
    for tag in ("<reasoning>", "</reasoning>", "<answer>", "</answer>"):
        assert tag in SYSTEM_PROMPT


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<reasoning>r</reasoning>\n<answer>\n 42 \n</answer>", "42"),
        ("<answer>1</answer> then <answer>2</answer>", "2"),
        ("<answer>1</answer> then <answer>2", "1"),
        ("<answer>7", ""),
        ("7</answer>", ""),
        ("</answer><answer>", ""),
        ("<answer></answer>", ""),
        ("no tags at all", ""),
        ("", ""),
        (None, ""),
        (42, ""),
        ("<answer>a <answer>b</answer>", "b"),
    ],
)
def test_extract_xml_answer_edge_cases(text, expected):
    assert extract_xml_answer(text) == expected


# --- train/validation split -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def small_formatted():
    rows = [{"question": f"Q{i}?", "answer": f"<<{i}+0={i}>>{i}\n#### {i}"} for i in range(50)]
    return format_gsm8k(rows)


@pytest.mark.parametrize("fraction", [0.2, 0.1, 0.5])
def test_split_sizes_and_disjointness(small_formatted, fraction):
    splits = train_val_split(small_formatted, val_fraction=fraction, seed=3)
    train_q, val_q = set(splits["train"]["question"]), set(splits["validation"]["question"])
    assert len(splits["validation"]) == round(50 * fraction) and len(splits["train"]) == 50 - round(50 * fraction)
    assert train_q.isdisjoint(val_q) and train_q | val_q == set(small_formatted["question"])


def test_split_is_seeded(small_formatted):
    first = train_val_split(small_formatted, seed=7)["validation"]["question"]
    assert train_val_split(small_formatted, seed=7)["validation"]["question"] == first
    assert train_val_split(small_formatted, seed=8)["validation"]["question"] != first


@pytest.mark.parametrize("fraction", [0, 1, -0.2, 1.5, 0.001])
def test_split_rejects_bad_fractions(small_formatted, fraction):
    with pytest.raises(ValueError, match="val_fraction"):
        train_val_split(small_formatted, val_fraction=fraction)


def test_split_rejects_tiny_datasets(small_formatted):
    with pytest.raises(ValueError, match="at least 2 rows"):
        train_val_split(small_formatted.select([0]))


def test_save_and_reload_round_trip(small_formatted, tmp_path, monkeypatch):
    monkeypatch.setenv("COURSE_OUTPUT_DIR", str(tmp_path))
    splits = train_val_split(small_formatted)
    folder = save_splits(splits, "round_trip")
    assert folder == tmp_path / "datasets" / "round_trip"
    for reloaded in (load_splits("round_trip"), load_splits(folder)):
        assert {name: reloaded[name].to_list() for name in reloaded} == {n: splits[n].to_list() for n in splits}


def test_save_and_load_bad_input(small_formatted, tmp_path, monkeypatch):
    monkeypatch.setenv("COURSE_OUTPUT_DIR", str(tmp_path))
    with pytest.raises(ValueError, match="plain folder name"):
        save_splits(train_val_split(small_formatted), "../escape")
    with pytest.raises(FileNotFoundError, match="save_splits"):
        load_splits("never_saved")


def test_default_output_folder_is_git_ignored():
    ignored = (Path(data.__file__).parents[2] / ".gitignore").read_text().split()
    assert "outputs/" in ignored or "outputs" in ignored


# --- token lengths --------------------------------------------------------------------------------


def template_ids(tokenizer, messages) -> list[int]:
    ids = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def test_token_length_stats_match_direct_tokenization(tokenizer, offline_sample):
    raw = load_gsm8k("train", verbose=False)
    stats = token_length_stats(raw, tokenizer)
    formatted = format_gsm8k(raw)
    assert stats.prompt_lengths == [len(template_ids(tokenizer, p)) for p in formatted["prompt"]]
    assert stats.reasoning_lengths == [
        len(tokenizer.encode(r, add_special_tokens=False)) for r in formatted["reasoning"]
    ]
    assert token_length_stats(formatted, tokenizer) == stats  # raw or formatted rows give the same numbers
    assert stats.xml_overhead > len(tokenizer.encode("<answer></answer>", add_special_tokens=False))


def test_prompt_token_lengths_count_what_the_model_receives(tokenizer):
    prompts = [build_prompt(GOOD["question"]), build_prompt("What is 12 times 11, minus 7, divided by 5?")]
    assert prompt_token_lengths(tokenizer, prompts) == [len(template_ids(tokenizer, p)) for p in prompts]
    assert prompt_token_lengths(tokenizer, []) == []


def test_rows_with_short_prompts_filters_in_order():
    lengths = [90, 60, 75, 80, 81, 40]
    assert rows_with_short_prompts(lengths, 80) == [1, 2, 3, 5]  # 80 itself fits
    assert rows_with_short_prompts(lengths, 80, limit=2) == [1, 2]
    assert rows_with_short_prompts(lengths, 30) == []
    assert rows_with_short_prompts([], 80) == []


@pytest.mark.parametrize("max_tokens, limit, field", [(0, None, "max_tokens"), (-5, 3, "max_tokens"), (80, 0, "limit")])
def test_rows_with_short_prompts_rejects_bad_bounds(max_tokens, limit, field):
    with pytest.raises(ValueError, match=field):
        rows_with_short_prompts([50, 60], max_tokens, limit=limit)


def test_percentiles_and_recommendation(tokenizer, offline_sample):
    raw = load_gsm8k("train", verbose=False)
    stats = token_length_stats(raw, tokenizer)
    p90 = reference_length_percentile(raw, tokenizer, q=90)
    assert p90 == stats.percentile("reasoning", 90)
    assert np.mean(np.array(stats.reasoning_lengths) <= p90) >= 0.9 and p90 <= max(stats.reasoning_lengths)
    assert stats.percentile("reasoning", 50) <= p90 <= stats.percentile("reasoning", 99)
    recommended = recommended_completion_length(stats)
    assert recommended % 16 == 0 and p90 + stats.xml_overhead <= recommended < p90 + stats.xml_overhead + 16
    assert stats.fraction_truncated(recommended) <= 0.1 and stats.fraction_truncated(0) == 1.0
    assert set(stats.summary()) == {"prompt", "reasoning"}


def test_token_length_bad_input(tokenizer, offline_sample):
    stats = token_length_stats(load_gsm8k("test", verbose=False), tokenizer)
    with pytest.raises(ValueError, match="which"):
        stats.percentile("completion", 90)
    with pytest.raises(ValueError, match="percentile"):
        stats.percentile("reasoning", 101)
    with pytest.raises(ValueError, match="multiple"):
        recommended_completion_length(stats, multiple=0)
    with pytest.raises(ValueError, match="empty"):
        token_length_stats([], tokenizer)
    with pytest.raises(ValueError, match=r"row 2 \(index 1\)"):
        token_length_stats([GOOD, BAD_ROWS[0][0]], tokenizer)
    with pytest.raises(ValueError, match="no reference solutions"):
        token_length_stats([{"prompt": build_prompt("Q?"), "answer": "6"}], tokenizer)


def test_real_reference_p90_is_plausible(gsm8k_dir, tokenizer):
    """On real GSM8K the reference p90 is a few hundred tokens at most: a sanity bound, not a copied number."""
    p90 = reference_length_percentile(load_gsm8k("test", gsm8k_dir, verbose=False), tokenizer)
    assert 50 < p90 < 512


def test_plot_token_lengths_draws_two_panels():
    fig = plot_token_lengths([10, 20, 30, 40], [5, 50, 60, 70], completion_length=55, overhead=3)
    assert len(fig.axes) == 2 and "completion limit 55" in " ".join(fig.axes[1].get_legend_handles_labels()[1])


# --- the role-order demonstration (uses the model) -------------------------------------------------


@pytest.mark.slow
def test_continuation_probability(offline_model_and_tokenizer):
    model, tokenizer = offline_model_and_tokenizer
    right, wrong = build_prompt(GOOD["question"]), swapped_roles_prompt(GOOD["question"])
    chances = [continuation_probability(model, tokenizer, m, "<reasoning>") for m in (right, wrong)]
    assert all(0 < c <= 1 for c in chances) and chances[0] != chances[1]
    with pytest.raises(ValueError, match="continuation"):
        continuation_probability(model, tokenizer, right, "")


# --- measurement helper and exercises ---------------------------------------------------------------


def test_measure_dataset_vs_dicts_reports_each_job(offline_sample):
    results = measure_dataset_vs_dicts(load_gsm8k("test", verbose=False), repeats=1)
    assert [r["job"] for r in results] == [
        "iterate rows",
        "read one column",
        "read one column, sliced",
        "parse gold answers",
    ]
    assert all(r["Dataset_s"] > 0 and r["dicts_s"] > 0 and r["rows"] == SAMPLE_TEST_ROWS for r in results)
    with pytest.raises(ValueError, match="repeats"):
        measure_dataset_vs_dicts(load_gsm8k("test", verbose=False), repeats=0)


def test_exercise_checks(capsys, sample_rows, tokenizer, offline_sample):
    assert check_02_gold_answer("1250") and not check_02_gold_answer("$1,250") and not check_02_gold_answer(None)
    assert "not answered yet" in capsys.readouterr().out
    train = load_gsm8k("train", verbose=False)
    lost = sum(any(c in raw_final(a) for c in ",.$") for a in train["answer"])
    assert check_02_rows_lost(lost, train) and not check_02_rows_lost(lost + 1, train)
    stats = token_length_stats(train, tokenizer)
    assert check_02_completion_length(recommended_completion_length(stats), stats)
    assert not check_02_completion_length(1, stats) and not check_02_completion_length("many", stats)
