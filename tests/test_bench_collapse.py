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
