"""scripts/choose_problems.py: the warm start's pass@k on training problems, bucketed by solution steps."""

from __future__ import annotations

import pytest


@pytest.fixture
def choose(load_script):
    return load_script("choose_problems")


def test_buckets_take_the_first_problems_of_each_step_count_in_order(choose):
    reasoning = ["a\nb", "a", "a\nb\nc", "a", "a\nb", "a\n\nb\n", "a"]
    assert choose.bucketed_problems({"reasoning": reasoning}, [1, 2, 5], per_bucket=2) == {1: [1, 3], 2: [0, 4], 5: []}


def test_bucket_lines_say_how_often_a_group_is_solved_sometimes(choose):
    records = [{"samples": 8, "correct_samples": c} for c in (0, 3, 8, 1)]  # as evaluation.sampling writes them
    lines = choose.bucket_lines(2, {"records": records, "samples": 8, "pass@1": 0.375, "pass@8": 0.5})
    assert "steps_2_solved_sometimes: 0.500" in lines and "steps_2_correctness_zero_std: 0.500" in lines
    assert "steps_2_pass8: 0.500" in lines and "steps_2_problems: 4" in lines


@pytest.mark.long
def test_the_script_measures_the_warm_start_and_records_how(choose, gsm8k_env, tmp_path, capsys):
    output = tmp_path / "choice.txt"
    argv = ["--profile", "ci", "--per-bucket", "1", "--steps", "2", "3", "--samples", "2", "--max-new-tokens", "4",
            "--output", str(output)]  # fmt: skip
    assert choose.main(argv) == 0
    text = output.read_text()
    for name in ("measured_on", "profile: ci", "made_by: python scripts/choose_problems.py --profile ci",
                 "steps_2_pass2", "steps_3_solved_sometimes", "cpu_precision_path"):  # fmt: skip
        assert name in text, name


def test_screen_and_rescreen_together_are_refused(choose):
    with pytest.raises(SystemExit):
        choose.parse_args(["--screen", "10", "--rescreen"])


def test_rescreen_needs_a_profile_with_a_list(choose):
    with pytest.raises(SystemExit, match="names no problem_list"):
        choose.rescreen(choose.get_profile("ci"), {}, "made by a test")
