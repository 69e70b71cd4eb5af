"""Notebook 07's variants: real GRPOConfig fields, the seed table, the noise rule, the logged completions."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from course_utils.evaluation import variants
from course_utils.training.config_reading import on_policy
from course_utils.training.grpo_config import make_grpo_config
from course_utils.training.preflight import check


def test_every_variant_is_a_real_grpo_config(tmp_path):
    for name, fields in variants.VARIANTS.items():
        config = make_grpo_config("ci", tmp_path / name, **fields)
        for field, value in fields.items():
            assert getattr(config, field) == value, (name, field)


def test_no_variant_has_a_preflight_error_and_the_off_policy_ones_are_off_policy(tmp_path):
    for name, fields in variants.VARIANTS.items():
        config = make_grpo_config("ci", tmp_path / name, **fields)
        findings = check(config, hardware={"device": "cpu"})
        assert not [f for f in findings if f.severity == "error" and f.code != "bf16-unsupported"], name
        assert not {"sequence-ratio-on-policy", "clip-higher-on-policy"} & {f.code for f in findings}, name
        values = {k: getattr(config, k) for k in ("num_iterations", "gradient_accumulation_steps")}
        values |= {"per_device_train_batch_size": config.per_device_train_batch_size}
        values |= {"steps_per_generation": config.steps_per_generation, "generation_batch_size": None}
        assert on_policy(values) == (fields.get("num_iterations", 1) == 1), name


def test_unknown_variant_names_the_known_ones():
    with pytest.raises(ValueError, match="known variants: dapo, grpo"):
        variants.variant_fields("ppo")
    assert variants.variant_fields("gspo")["importance_sampling_level"] == "sequence"


def test_live_plan_covers_trls_distinct_paths_under_ci_and_a_seeded_slice_elsewhere():
    ci = [variants.variant_fields(name) for name in variants.live_plan("ci")["variants"]]
    assert any(fields.get("loss_type") == variants.BASELINE for fields in ci), "the baseline's loss"
    assert any(fields.get("mask_truncated_completions") for fields in ci)
    assert any(fields.get("num_iterations", 1) > 1 for fields in ci), "an off-policy variant (old log-probs, clipping)"
    assert any(fields.get("importance_sampling_level") == "sequence" for fields in ci)
    cpu = variants.live_plan("cpu")
    assert len(cpu["seeds"]) >= 2 and set(cpu["variants"]) <= set(variants.VARIANTS)
    assert cpu["fields"] == {}, "the cpu lab's live runs train with the profile's own sizes"
    assert variants.live_plan("gpu") == cpu


def test_the_ci_plans_fields_are_real_config_fields_that_shrink_each_run(tmp_path):
    plan, profile = variants.live_plan("ci"), variants.get_profile("ci")
    config = make_grpo_config(profile, tmp_path, **variants.VARIANTS["gspo"], **plan["fields"])
    assert config.per_device_train_batch_size == config.num_generations, "one group a step"
    assert config.max_completion_length < profile.max_completion_length
    plan["fields"]["max_completion_length"] = 1
    assert variants.live_plan("ci")["fields"]["max_completion_length"] == config.max_completion_length, "a copy"


def _table():
    rows = []
    for name, values in {"dapo": (1.0, 1.2), "grpo": (1.1, 1.3), "dr_grpo": (1.6, 1.7)}.items():
        for seed, reward in enumerate(values):
            rows.append(
                {"variant": name, "seed": seed, "final_reward": reward, "strict_format": 0.5, "accuracy": 0.02 * seed}
            )
    return pd.DataFrame(rows)


def test_seed_summary_gives_means_and_spreads():
    summary = variants.seed_summary(_table())
    assert list(summary.index) == ["dapo", "grpo", "dr_grpo"]
    assert summary.loc["dapo", "final_reward"] == pytest.approx(1.1)
    assert summary.loc["dapo", "final_reward_spread"] == pytest.approx(0.2)
    assert summary.loc["grpo", "seeds"] == 2 and summary.loc["grpo", "strict_format_spread"] == 0
    with pytest.raises(ValueError, match="lacks column"):
        variants.seed_summary(_table().drop(columns="accuracy"))


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
    assert variants.real_difference(first, second) is real


def test_differences_from_baseline_flag_only_gaps_beyond_the_noise():
    gaps = variants.differences_from_baseline(_table())
    reward = gaps[gaps["metric"] == "final_reward"].set_index("variant")
    assert reward.loc["dr_grpo", "real"] and not reward.loc["grpo", "real"]
    assert reward.loc["grpo", "gap"] == pytest.approx(0.1)
    with pytest.raises(ValueError, match="baseline 'bnpo' is not in the table"):
        variants.differences_from_baseline(_table(), baseline="bnpo")


def _run(name, seed, rewards):
    logs = [
        {"step": i + 1, "loss": 0.0, "reward": r, "entropy": 0.5, "clip_ratio/low_mean": 0.0}
        for i, r in enumerate(rewards)
    ]
    return variants.VariantRun(name, seed, [*logs, {"train_runtime": 1.0}], 0.1, 0.5, 3.0, run_dir=None)


def test_runs_make_rows_tables_and_mean_curves():
    runs = [_run("dapo", 0, [0.0] * 4 + [1.0]), _run("dapo", 1, [0.0] * 4 + [3.0])]
    table = variants.results_table(runs)
    assert list(table["final_reward"]) == [1.0, 3.0] and list(table["steps"]) == [5, 5]
    curves = variants.mean_curves(runs)
    assert curves["dapo"][-1]["reward"] == 2.0 and curves["dapo"][-1]["step"] == 5
    assert "completions/mean_length" not in curves["dapo"][0]
    with pytest.raises(ValueError, match="at least one run"):
        variants.results_table([])


def test_curves_keep_the_clip_ratios_of_the_steps_that_reuse_a_batch():
    run = _run("gspo", 0, [1.0])
    run.log_history.insert(1, {"step": 2, "loss": 0.01, "clip_ratio/low_mean": 0.25, "entropy": 0.5})
    rows = variants.curve_rows([run])
    assert list(rows["step"]) == [1, 2] and list(rows["clip_ratio/low_mean"]) == [0.0, 0.25]
    assert variants.results_table([run])["final_reward"].tolist() == [1.0]  # the reward comes from step 1 only


def test_results_files_round_trip_and_missing_file(tmp_path):
    runs = [_run("dapo", 0, [0.0, 1.0, 2.0, 3.0, 4.0]), _run("grpo", 0, [1.0] * 5)]
    bench = tmp_path / "bench"
    written = variants.write_results(runs, bench)
    assert written == [bench / variants.RESULTS_CSV, bench / variants.LOGS_CSV]
    assert variants.read_results(written[0]).equals(variants.results_table(runs))
    curves = variants.curves_from_rows(variants.read_results(bench / variants.LOGS_CSV))
    assert curves == variants.mean_curves(runs) and curves["dapo"][-1]["reward"] == 4.0
    assert not (bench / variants.HACK_RESULTS_CSV).exists() and not (bench / variants.HACK_COMPLETIONS_CSV).exists()
    with pytest.raises(FileNotFoundError, match="make variants"):
        variants.read_results(tmp_path / "nothing.csv")


def test_hack_runs_are_recorded_apart_and_keep_a_recorded_table(tmp_path):
    bench = tmp_path / "bench"
    variants.write_results([_run("dapo", 0, [1.0] * 5)], bench)
    table_before = (bench / variants.RESULTS_CSV).read_text()
    run_dir = tmp_path / "hack-run"
    (run_dir / "completions").mkdir(parents=True)
    steps = {"step": [1, 1, 9], "prompt": ["q"] * 3, "completion": ["short", "x " * 60, "y " * 90]}
    pd.DataFrame({**steps, "length_bonus_reward_func": [0.1, 6.0, 9.0]}).to_parquet(
        run_dir / "completions" / "completions_00001.parquet"
    )
    hack = _run("hack", 0, [1.0, 2.0, 3.0, 4.0, 5.0])
    hack.run_dir = run_dir
    written = variants.write_results([hack], bench)
    names = [variants.HACK_RESULTS_CSV, variants.HACK_LOGS_CSV, variants.HACK_COMPLETIONS_CSV]
    assert [p.name for p in written] == names
    assert (bench / variants.RESULTS_CSV).read_text() == table_before
    samples = pd.read_csv(bench / variants.HACK_COMPLETIONS_CSV)
    assert sorted(samples["step"]) == [1, 1, 9] and set(samples["variant"]) == {"hack"}
    assert variants.read_results(bench / variants.HACK_RESULTS_CSV)["variant"].tolist() == ["hack"]


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
    logged = variants.logged_completions(tmp_path)
    assert list(logged["completion"]) == ["4", "five"] and logged["prompt"][0] == "2+2?"
    with pytest.raises(FileNotFoundError, match="log_completions=True"):
        variants.logged_completions(tmp_path / "empty")


def test_compare_variant_fields_says_what_differs():
    assert variants.compare_variant_fields(variants.VARIANTS) == []
    wrong = {**variants.VARIANTS, "gspo": {"importance_sampling_level": "sequence"}, "ppo": {}}
    del wrong["bnpo"]
    lines = variants.compare_variant_fields(wrong)
    assert "missing variant 'bnpo'" in lines and "unknown variant 'ppo'" in lines
    assert any(line.startswith("gspo: yours") for line in lines)
    [line] = variants.compare_variant_fields(["dapo"])
    assert line == "expected a dict of variant name -> GRPOConfig fields, got list"


@pytest.mark.long  # over 20 s; notebook 07 runs every variant under nbmake
def test_a_real_variant_run_logs_the_plotted_metrics_and_evaluates():
    run = variants.run_variant("gspo", profile="ci", seed=0, max_steps=1, eval_size=1)
    [logs] = [e for e in run.log_history if "reward" in e]
    assert {"entropy", "clip_ratio/low_mean", "clip_ratio/high_mean", "completions/mean_length"} <= set(logs)
    assert 0.0 <= run.accuracy <= 1.0 and 0.0 <= run.strict_format <= 1.0 and not math.isnan(run.final_reward)
    assert run.problems == 1 and run.row()["problems"] == 1


def test_variants_script_arguments(load_script, tmp_path):
    script = load_script("variants")
    args = script.parse_args(["--steps", "5", "--seeds", "0", "1", "2", "--variants", "dapo", "gspo", "--hack-first"])
    assert args.steps == 5 and args.seeds == [0, 1, 2] and args.variants == ["dapo", "gspo"] and args.hack_first
    assert script.parse_args([]).variants == list(variants.VARIANTS)
    with pytest.raises(SystemExit):
        script.parse_args(["--variants", "ppo"])
    assert script.parse_args(["--no-variants", "--hack-steps", "20"]).no_variants
    with pytest.raises(SystemExit, match="nothing to run"):
        script.main(["--no-variants", "--no-hack", "--output", str(tmp_path)])


def test_recorded_lines_read_name_value_pairs(tmp_path):
    assert variants.recorded_lines(tmp_path) == {}
    (tmp_path / "variants.txt").write_text("machine_cpu: Some CPU: 2 GHz\nvariants_steps: 6\nnot a pair\n")
    assert variants.recorded_lines(tmp_path) == {"machine_cpu": "Some CPU: 2 GHz", "variants_steps": "6"}
    (tmp_path / variants.HACK_TXT).write_text("variants_hack_steps: 20\n")
    assert variants.recorded_lines(tmp_path, variants.HACK_TXT) == {"variants_hack_steps": "20"}
    assert variants.recorded_folder().name == "benchmarks"
