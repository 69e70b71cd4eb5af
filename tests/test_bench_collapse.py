"""bench_collapse's command line: the levers it changes and the folder each run is kept in."""

from __future__ import annotations

import argparse

import pytest


@pytest.fixture(scope="module")
def bench(load_benchmark):
    return load_benchmark("bench_collapse")


def test_levers_are_read_as_python_values_else_strings(bench) -> None:
    changes = bench.field_values(["learning_rate=2e-4", "reward_weights=(1.0, 0.0, 0.0, 0.0, 0.0)",
                                  "scale_rewards=none", "mask_truncated_completions=True"])  # fmt: skip
    assert changes == {"learning_rate": 2e-4, "reward_weights": (1.0, 0.0, 0.0, 0.0, 0.0),
                       "scale_rewards": "none", "mask_truncated_completions": True}  # fmt: skip


@pytest.mark.parametrize("pair", ["learning_rate", "=2e-4", ""])
def test_a_lever_without_field_and_value_is_refused(bench, pair: str) -> None:
    with pytest.raises(SystemExit, match="FIELD=VALUE"):
        bench.field_values([pair])


def test_each_set_of_levers_keeps_its_runs_in_a_folder_of_its_own(bench) -> None:
    def label(sets: list[str], grpo: list[str]) -> str:
        return bench.run_label(argparse.Namespace(set=sets, grpo=grpo))

    assert label([], []) == "as-defined"
    weights = label(["reward_weights=(1.0, 0.0, 0.0, 0.0, 0.0)"], [])
    assert "/" not in weights and " " not in weights and "(" not in weights
    assert weights != label(["reward_weights=(1.0, 0.2, 0.2, 0.2, 0.2)"], [])
    assert label(["learning_rate=2e-4"], ["beta=0.0"]) == "learning_rate=2e-4_beta=0.0"


def kept_run(folder, steps: int = 10, per_step: int = 2):
    """A kept run as bench_collapse keeps it: TRL's completions parquet files and the log history."""
    import pandas as pd

    (folder / "completions").mkdir(parents=True)
    for step in range(1, steps + 1):
        rows = [{"step": step, "prompt": [{"role": "user", "content": f"question {step}"}],
                 "completion": [{"role": "assistant", "content": f"<answer>{step}.{i}</answer>"}], "advantage": 0.0}
                for i in range(per_step)]  # fmt: skip
        pd.DataFrame(rows).to_parquet(folder / "completions" / f"completions_{step:05d}.parquet")
    logs = [{"step": s, "reward": 1.0 + s / 10, "reward_std": 0.2, "loss": 0.0} for s in range(1, steps + 1)]
    pd.DataFrame([*logs, {"step": steps, "train_runtime": 1.0}]).to_csv(folder / "log_history.csv", index=False)
    return folder


def test_a_kept_run_is_recorded_for_notebook_06_and_recording_again_replaces_it(bench, tmp_path, monkeypatch) -> None:
    import pandas as pd

    monkeypatch.setattr(bench, "recorded_folder", lambda: tmp_path)
    run = kept_run(tmp_path / "kept")
    bench.record(run, "weak")
    bench.record(run, "strong")
    bench.record(run, "weak")  # a new recording of the same name replaces the old rows
    logs = pd.read_csv(tmp_path / bench.COLLAPSE_LOGS_CSV)
    completions = pd.read_csv(tmp_path / bench.COLLAPSE_COMPLETIONS_CSV)
    assert sorted(logs["run"].value_counts().items()) == [("strong", 10), ("weak", 10)]  # the summary row left out
    assert logs["machine"].str.contains("cores").all() and "kl" in logs.columns
    weak = completions[completions["run"] == "weak"]
    assert sorted(set(weak["step"])) == [1, 2, 9, 10]  # the first and the last fifth of the steps only
    assert set(weak["window"]) == {"first fifth", "last fifth"} and weak["completion"].str.startswith("<answer>").all()


def greedy_result(correct: list[bool]) -> dict:
    """A greedy evaluation's result as evaluate_model returns it, reduced to what the greedy lines read."""
    records = [{"index": i, "question": f"q{i}", "gold": str(i), "correct": right} for i, right in enumerate(correct)]
    return {"n": len(correct), "accuracy": sum(correct) / len(correct), "records": records}


def test_greedy_lines_count_fixed_and_broken_problems_and_the_first_200_apart(bench) -> None:
    warm = [False] * 300
    warm[5] = warm[250] = warm[260] = True  # one right among the first 200, two after
    grpo = list(warm)
    grpo[5] = False  # broken, in the first 200
    grpo[100] = grpo[270] = grpo[280] = True  # fixed: one in the first 200, two after
    overall, first = bench.greedy_lines(7, greedy_result(warm), greedy_result(grpo))
    assert overall == "seed_7_heldout_greedy: 0.010 -> 0.017 (300 problems; fixed 3, broken 1, McNemar p 0.62)"
    assert first == "seed_7_heldout_greedy_first_200: 1 -> 1 of 200"


def test_greedy_lines_refuse_results_on_different_problems(bench) -> None:
    with pytest.raises(ValueError, match="same set"):
        bench.greedy_lines(7, greedy_result([True] * 3), greedy_result([True] * 4))
