"""The lab's problem list: made from a screen's records, found in the data by question text, refused when wrong."""

from __future__ import annotations

import json
import math

import pytest

from course_utils.core.profiles import PROFILES, get_profile
from course_utils.evaluation.sampling import problem_record
from course_utils.training import grpo_prompts, problem_choice
from course_utils.training.monitoring import (
    correct_share_fifths,
    correct_share_per_step,
    lab_figures,
    metric_fifths,
    varied_correctness_share,
)

QUESTIONS = ["Tom has 3 apples and buys 2. How many?", "A cat sleeps 4 hours a day. How many in 2 days?", "7-5?"]


def records(corrects: list[int], samples: int = 8) -> list[dict]:
    """Scored problems with ``corrects[i]`` right samples of ``samples`` (gold "5": right ones answer it)."""
    right, wrong = "<answer>5</answer>", "<answer>6</answer>"
    return [problem_record([right] * c + [wrong] * (samples - c), "5", (1, samples)) for c in corrects]


def test_question_key_ignores_spacing_and_tells_questions_apart():
    assert problem_choice.question_key("How  many\napples?") == problem_choice.question_key("How many apples?")
    assert problem_choice.question_key(QUESTIONS[0]) != problem_choice.question_key(QUESTIONS[1])


@pytest.mark.parametrize("bad", ["", "   ", None, 3])
def test_question_key_refuses_what_is_no_question(bad):
    with pytest.raises(ValueError, match="question must be a non-empty string"):
        problem_choice.question_key(bad)


def test_only_problems_solved_sometimes_are_listed():
    scored = records([0, 3, 8])
    assert problem_choice.sometimes_solved(scored) == [1]
    listing = problem_choice.problem_list(QUESTIONS, scored, "made by a test", seed=0)
    assert listing["screened"] == 3 and listing["samples_per_problem"] == 8 and listing["seed"] == 0
    assert [p["correct_samples"] for p in listing["problems"]] == [3]
    assert listing["problems"][0]["key"] == problem_choice.question_key(QUESTIONS[1])


def test_a_list_needs_one_record_per_question():
    with pytest.raises(ValueError, match="pair one to one"):
        problem_choice.problem_list(QUESTIONS[:2], records([1, 2, 3]), "test")


def test_listed_rows_finds_problems_in_another_order():
    listing = problem_choice.problem_list(QUESTIONS, records([2, 5, 0]), "test")
    shuffled = [QUESTIONS[2], "another question", QUESTIONS[1], QUESTIONS[0]]
    assert problem_choice.listed_rows(shuffled, listing) == [3, 2]


def test_listed_rows_refuses_data_the_list_was_not_made_from():
    listing = problem_choice.problem_list(QUESTIONS, records([2, 5, 0]), "test")
    with pytest.raises(ValueError, match=r"1 of the list's 2 problems are not in this data.*GSM8K_DIR"):
        problem_choice.listed_rows(QUESTIONS[1:], listing)


@pytest.mark.parametrize("bad", ["", "cpu.json", "a/b", None])
def test_list_names_are_file_stems(bad):
    with pytest.raises(ValueError, match="file stem"):
        problem_choice.problem_list_path(bad)


def test_a_missing_list_names_the_known_ones():
    with pytest.raises(FileNotFoundError, match=r"known lists: .*'cpu-long'.*choose_problems.py --screen"):
        problem_choice.load_problem_list("no-such-list")


def test_a_file_that_is_no_list_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(problem_choice, "data_dir", lambda: tmp_path)
    (tmp_path / problem_choice.LIST_FOLDER).mkdir()
    (tmp_path / problem_choice.LIST_FOLDER / "broken.json").write_text(json.dumps({"problems": []}))
    with pytest.raises(ValueError, match=r"is not a problem list.*made_by"):
        problem_choice.load_problem_list("broken")


def test_a_list_sampled_again_counts_both_screens_and_puts_the_most_often_solved_first():
    earlier = problem_choice.problem_list(QUESTIONS, records([1, 1, 1], samples=4), "first screen")
    again = problem_choice.rescreened_list(earlier, QUESTIONS, records([3, 9, 0], samples=16), "second", seed=1)
    keys = [problem_choice.question_key(q) for q in QUESTIONS]
    assert [(p["key"], p["correct_samples"]) for p in again["problems"]] == [(keys[1], 10), (keys[0], 4), (keys[2], 1)]
    assert again["samples_per_problem"] == 20 and again["screened"] == 3 and again["seed"] == 1
    assert again["first_screen"] == {"made_by": "first screen", "screened": 3, "samples_per_problem": 4}


def test_a_list_sampled_again_must_be_sampled_in_its_own_order():
    earlier = problem_choice.problem_list(QUESTIONS, records([1, 1, 1], samples=4), "first screen")
    with pytest.raises(ValueError, match="not the earlier list's problems in its order"):
        problem_choice.rescreened_list(earlier, QUESTIONS[::-1], records([3, 9, 2], samples=16), "second")


LISTED_PROFILES = sorted(name for name, profile in PROFILES.items() if profile.problem_list)


def test_the_offline_labs_name_their_lists():
    assert LISTED_PROFILES == ["cpu", "cpu-long"]


@pytest.mark.parametrize("name", LISTED_PROFILES)
def test_each_list_records_how_it_was_made_and_holds_problems_solved_sometimes(name):
    listing = problem_choice.load_problem_list(get_profile(name).problem_list)
    assert "scripts/choose_problems.py" in listing["made_by"]
    assert "--screen" in listing["made_by"] or "--screen" in listing["first_screen"]["made_by"]
    samples = listing["samples_per_problem"]
    assert all(0 < p["correct_samples"] < samples for p in listing["problems"])
    assert len(listing["problems"]) <= listing["screened"]


@pytest.mark.parametrize("name", LISTED_PROFILES)
def test_each_listed_profile_trains_on_its_list_and_every_problem_is_found(gsm8k_env, name):
    profile = get_profile(name)
    dataset = grpo_prompts.training_dataset(profile)
    listing = problem_choice.load_problem_list(profile.problem_list)
    assert len(dataset) == min(profile.train_size, len(listing["problems"]))
    assert [problem_choice.question_key(q) for q in dataset["question"]] == [
        p["key"] for p in listing["problems"]
    ][: len(dataset)]


def logs(correct_means: list[float], correct_stds: list[float], kls: list[float] | None = None) -> list[dict]:
    history = []
    for step, (mean, std) in enumerate(zip(correct_means, correct_stds, strict=True), start=1):
        entry = {"step": step, "reward": 1.0 + mean, "rewards/correctness_reward_func/mean": mean,
                 "rewards/correctness_reward_func/std": std}  # fmt: skip
        if kls is not None:
            entry["kl"] = kls[step - 1]
        history.append(entry)
    return history


def test_correct_share_is_the_correctness_mean_over_its_two_points_by_fifth():
    history = logs([0.0] * 5 + [0.5] * 5, [0.0] * 10)
    assert correct_share_fifths(history) == (0.0, 0.25)
    assert metric_fifths(history, "reward") == (1.0, 1.5)


def test_correct_share_per_step_is_each_steps_correctness_mean_over_two_points():
    history = [*logs([0.0, 0.25, 0.5], [0.0, 0.7, 0.9]), {"train_runtime": 12.0, "step": 3}]
    assert correct_share_per_step(history) == [0.0, 0.125, 0.25]
    with pytest.raises(ValueError, match="correctness_reward_func among the reward functions"):
        correct_share_per_step([{"step": 1, "reward": 1.0}])


def test_varied_correctness_counts_steps_with_any_spread():
    assert varied_correctness_share(logs([0.0, 0.5, 1.0, 0.0], [0.0, 0.9, 1.0, 0.0])) == 0.5


def test_lab_figures_without_kl_says_nan_and_with_kl_the_last_value():
    assert math.isnan(lab_figures(logs([0.0, 1.0], [0.0, 1.0]))["kl_last"])
    assert lab_figures(logs([0.0, 1.0], [0.0, 1.0], kls=[0.0, 0.02]))["kl_last"] == 0.02


def test_a_metric_never_logged_is_an_error_naming_what_was():
    with pytest.raises(ValueError, match=r"No training step logged 'kl'.*reward"):
        metric_fifths(logs([0.0], [0.0]), "kl")
    with pytest.raises(ValueError, match="correctness_reward_func among the reward functions"):
        varied_correctness_share([{"step": 1, "reward": 1.0}])
