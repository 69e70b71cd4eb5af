"""Notebook 07's variant runs compared and recorded: the seed table, the noise rule, the results files."""

from __future__ import annotations

import pandas as pd
import pytest

from course_utils.evaluation import variant_tables as tables
from course_utils.evaluation.reward_hack import HACK_TXT
from course_utils.evaluation.variants import VariantRun


def _table():
    rows = []
    for name, values in {"dapo": (1.0, 1.2), "grpo": (1.1, 1.3), "dr_grpo": (1.6, 1.7)}.items():
        for seed, reward in enumerate(values):
            rows.append(
                {"variant": name, "seed": seed, "final_reward": reward, "strict_format": 0.5, "accuracy": 0.02 * seed}
            )
    return pd.DataFrame(rows)


def test_seed_summary_gives_means_and_spreads():
    summary = tables.seed_summary(_table())
    assert list(summary.index) == ["dapo", "grpo", "dr_grpo"]
    assert summary.loc["dapo", "final_reward"] == pytest.approx(1.1)
    assert summary.loc["dapo", "final_reward_spread"] == pytest.approx(0.2)
    assert summary.loc["grpo", "seeds"] == 2 and summary.loc["grpo", "strict_format_spread"] == 0
    with pytest.raises(ValueError, match="lacks column"):
        tables.seed_summary(_table().drop(columns="accuracy"))


@pytest.mark.parametrize(
    ("first", "second", "real"),
    [
        ([1.6, 1.7], [1.0, 1.2], True),
        ([1.0, 1.2], [1.6, 1.7], True),
        ([1.1, 1.3], [1.0, 1.2], False),
        ([1.0, 1.0], [1.0, 1.0], False),
        ([2.0], [0.0], False),
    ],
)
def test_real_difference_needs_non_overlapping_seeds(first, second, real):
    assert tables.real_difference(first, second) is real


def test_differences_from_baseline_flag_only_gaps_beyond_the_noise():
    gaps = tables.differences_from_baseline(_table())
    reward = gaps[gaps["metric"] == "final_reward"].set_index("variant")
    assert reward.loc["dr_grpo", "real"] and not reward.loc["grpo", "real"]
    assert reward.loc["grpo", "gap"] == pytest.approx(0.1)
    with pytest.raises(ValueError, match="baseline 'bnpo' is not in the table"):
        tables.differences_from_baseline(_table(), baseline="bnpo")


def _run(name, seed, rewards):
    logs = [
        {"step": i + 1, "loss": 0.0, "reward": r, "entropy": 0.5, "clip_ratio/low_mean": 0.0}
        for i, r in enumerate(rewards)
    ]
    return VariantRun(name, seed, [*logs, {"train_runtime": 1.0}], 0.1, 0.5, 3.0, run_dir=None)


def test_runs_make_rows_tables_and_mean_curves():
    runs = [_run("dapo", 0, [0.0] * 4 + [1.0]), _run("dapo", 1, [0.0] * 4 + [3.0])]
    table = tables.results_table(runs)
    assert list(table["final_reward"]) == [1.0, 3.0] and list(table["steps"]) == [5, 5]
    curves = tables.mean_curves(runs)
    assert curves["dapo"][-1]["reward"] == 2.0 and curves["dapo"][-1]["step"] == 5
    assert "completions/mean_length" not in curves["dapo"][0]
    with pytest.raises(ValueError, match="at least one run"):
        tables.results_table([])


def test_curves_keep_the_clip_ratios_of_the_steps_that_reuse_a_batch():
    run = _run("gspo", 0, [1.0])
    run.log_history.insert(1, {"step": 2, "loss": 0.01, "clip_ratio/low_mean": 0.25, "entropy": 0.5})
    rows = tables.curve_rows([run])
    assert list(rows["step"]) == [1, 2] and list(rows["clip_ratio/low_mean"]) == [0.0, 0.25]
    assert tables.results_table([run])["final_reward"].tolist() == [1.0]  # the reward comes from step 1 only


def test_results_files_round_trip_and_missing_file(tmp_path):
    runs = [_run("dapo", 0, [0.0, 1.0, 2.0, 3.0, 4.0]), _run("grpo", 0, [1.0] * 5)]
    bench = tmp_path / "bench"
    written = tables.write_results(runs, bench)
    assert written == [bench / tables.RESULTS_CSV, bench / tables.LOGS_CSV]
    assert tables.read_results(written[0]).equals(tables.results_table(runs))
    curves = tables.curves_from_rows(tables.read_results(bench / tables.LOGS_CSV))
    assert curves == tables.mean_curves(runs) and curves["dapo"][-1]["reward"] == 4.0
    assert sorted(path.name for path in bench.iterdir()) == sorted(p.name for p in written), "nothing else"
    with pytest.raises(FileNotFoundError, match="make variants"):
        tables.read_results(tmp_path / "nothing.csv")


def test_logged_completions_reads_trls_parquet_files(tmp_path):
    folder = tmp_path / "completions"
    folder.mkdir()
    frame = pd.DataFrame(
        {
            "step": [1, 1],
            "prompt": [[{"role": "user", "content": "2+2?"}]] * 2,
            "completion": [[{"role": "assistant", "content": "4"}], [{"role": "assistant", "content": "five"}]],
            "novelty_reward_func": [0.1, 0.9],
            "advantage": [-0.7, 0.7],
        }
    )
    frame.to_parquet(folder / "completions_00001.parquet")
    logged = tables.logged_completions(tmp_path)
    assert list(logged["completion"]) == ["4", "five"] and logged["prompt"][0] == "2+2?"
    with pytest.raises(FileNotFoundError, match="log_completions=True"):
        tables.logged_completions(tmp_path / "empty")


def test_recorded_lines_read_name_value_pairs(tmp_path):
    assert tables.recorded_lines(tmp_path) == {}
    (tmp_path / tables.RESULTS_TXT).write_text("machine_cpu: Some CPU: 2 GHz\nvariants_steps: 6\nnot a pair\n")
    assert tables.recorded_lines(tmp_path) == {"machine_cpu": "Some CPU: 2 GHz", "variants_steps": "6"}
    (tmp_path / HACK_TXT).write_text("variants_hack_steps: 20\n")
    assert tables.recorded_lines(tmp_path, HACK_TXT) == {"variants_hack_steps": "20"}
    assert tables.recorded_folder().name == "benchmarks"


def test_a_table_is_recorded_under_its_own_name_beside_the_full_table(tmp_path):
    tables.write_results([_run("dapo", 0, [1.0] * 5)], tmp_path)
    full = (tmp_path / tables.RESULTS_CSV).read_text()
    written = tables.write_results([_run("gdpo", 0, [2.0] * 5)], tmp_path, tables.GDPO_TABLE)
    assert [p.name for p in written] == ["variants_gdpo.csv", "variants_gdpo_logs.csv"]
    assert (tmp_path / tables.RESULTS_CSV).read_text() == full
    assert tables.table_files(tables.GDPO_TABLE)[2] == "variants_gdpo.txt"
    for bad in ("", "benchmarks/variants", "variants.csv"):
        with pytest.raises(ValueError, match="bare name"):
            tables.table_files(bad)
