"""Notebook 07's reward hack: its runs recorded apart from the variants table, with their logged completions."""

from __future__ import annotations

import pandas as pd
import pytest

from course_utils.evaluation import reward_hack
from course_utils.evaluation.variant_tables import RESULTS_CSV, read_results, write_results
from course_utils.evaluation.variants import VariantRun


def _run(name, seed, rewards, run_dir=None):
    logs = [{"step": i + 1, "loss": 0.0, "reward": r, "entropy": 0.5} for i, r in enumerate(rewards)]
    return VariantRun(name, seed, [*logs, {"train_runtime": 1.0}], 0.1, 0.5, 3.0, run_dir=run_dir)


def test_hack_runs_are_recorded_apart_and_keep_a_recorded_table(tmp_path):
    bench = tmp_path / "bench"
    write_results([_run("dapo", 0, [1.0] * 5)], bench)
    table_before = (bench / RESULTS_CSV).read_text()
    run_dir = tmp_path / "hack-run"
    (run_dir / "completions").mkdir(parents=True)
    steps = {"step": [1, 1, 9], "prompt": ["q"] * 3, "completion": ["short", "x " * 60, "y " * 90]}
    pd.DataFrame({**steps, "length_bonus_reward_func": [0.1, 6.0, 9.0]}).to_parquet(
        run_dir / "completions" / "completions_00001.parquet"
    )
    written = reward_hack.write_hack_results([_run("hack", 0, [1.0, 2.0, 3.0, 4.0, 5.0], run_dir)], bench)
    names = [reward_hack.HACK_RESULTS_CSV, reward_hack.HACK_LOGS_CSV, reward_hack.HACK_COMPLETIONS_CSV]
    assert [p.name for p in written] == names
    assert (bench / RESULTS_CSV).read_text() == table_before
    samples = pd.read_csv(bench / reward_hack.HACK_COMPLETIONS_CSV)
    assert sorted(samples["step"]) == [1, 1, 9] and set(samples["variant"]) == {"hack"}
    assert "prompt" not in samples
    assert read_results(bench / reward_hack.HACK_RESULTS_CSV)["variant"].tolist() == ["hack"]


def test_hack_results_need_runs_and_their_logged_completions(tmp_path):
    with pytest.raises(ValueError, match="at least one run"):
        reward_hack.write_hack_results([], tmp_path)
    with pytest.raises(FileNotFoundError, match="log_completions=True"):
        reward_hack.write_hack_results([_run("hack", 0, [1.0] * 5, tmp_path / "never-logged")], tmp_path)

