"""Notebook 07's variants: real GRPOConfig fields, the live plan, a real run, GDPO's step, the script."""

from __future__ import annotations

import math

import numpy as np
import pytest

from course_utils.core.profiles import get_profile
from course_utils.evaluation import variants
from course_utils.evaluation.reward_hack import hack_rewards
from course_utils.evaluation.variant_tables import GDPO_TABLE, logged_completions, table_files
from course_utils.lesson.models import build_tiny_random_model
from course_utils.lesson.multi_reward import gdpo_advantages
from course_utils.training.config_reading import on_policy
from course_utils.training.grpo_config import make_grpo_config
from course_utils.training.preflight import check
from course_utils.training.run import build_trainer


def test_every_variant_is_a_real_grpo_config(tmp_path):
    for name, fields in variants.VARIANTS.items():
        config = make_grpo_config("ci", tmp_path / name, **fields)
        for field, value in fields.items():
            assert getattr(config, field) == value, (name, field)


def test_a_variant_scales_rewards_as_trl_does_unless_it_names_its_own_scale(tmp_path):
    assert get_profile("cpu").scale_rewards == "none"  # the lab's own choice, which the variants must not inherit
    for name, fields in variants.VARIANTS.items():
        config = variants.variant_config("cpu", tmp_path / name, fields, seed=3, max_steps=5)
        assert config.scale_rewards == fields.get("scale_rewards", "group"), name
        assert (config.seed, config.max_steps, config.save_strategy) == (3, 5, "no"), name
    hacked = variants.variant_config("ci", tmp_path / "hack", {}, reward_weights=[1.0, 0.5])
    assert hacked.reward_weights == [1.0, 0.5]


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
    assert any(fields.get("multi_objective_aggregation") == "normalize_then_sum" for fields in ci), "GDPO's path"
    cpu = variants.live_plan("cpu")
    assert len(cpu["seeds"]) >= 2 and set(cpu["variants"]) <= set(variants.VARIANTS)
    assert cpu["fields"] == {}, "the cpu lab's live runs train with the profile's own sizes"
    assert {"gdpo", variants.WEIGHTED_SUM} <= set(cpu["variants"]), "GDPO trains beside the weighted sum"
    assert variants.live_plan("gpu") == cpu


def test_the_ci_plans_fields_are_real_config_fields_that_shrink_each_run(tmp_path):
    plan, profile = variants.live_plan("ci"), variants.get_profile("ci")
    config = make_grpo_config(profile, tmp_path, **variants.VARIANTS["gspo"], **plan["fields"])
    assert config.per_device_train_batch_size == config.num_generations, "one group a step"
    assert config.max_completion_length < profile.max_completion_length
    plan["fields"]["max_completion_length"] = 1
    assert variants.live_plan("ci")["fields"]["max_completion_length"] == config.max_completion_length, "a copy"


def test_compare_variant_fields_says_what_differs():
    assert variants.compare_variant_fields(variants.VARIANTS) == []
    wrong = {**variants.VARIANTS, "gspo": {"importance_sampling_level": "sequence"}, "ppo": {}}
    del wrong["bnpo"]
    lines = variants.compare_variant_fields(wrong)
    assert "missing variant 'bnpo'" in lines and "unknown variant 'ppo'" in lines
    assert any(line.startswith("gspo: yours") for line in lines)
    [line] = variants.compare_variant_fields(["dapo"])
    assert line == "expected a dict of variant name -> GRPOConfig fields, got list"


def test_gdpo_is_trls_normalize_then_sum_beside_the_weighted_sum_it_is_compared_with(tmp_path):
    gdpo = make_grpo_config("ci", tmp_path / "gdpo", **variants.VARIANTS["gdpo"])
    weighted = make_grpo_config("ci", tmp_path / "weighted", **variants.VARIANTS[variants.WEIGHTED_SUM])
    assert gdpo.multi_objective_aggregation == "normalize_then_sum"
    assert weighted.multi_objective_aggregation == "sum_then_normalize", "TRL's default: the weighted sum"
    assert "normalize_then_sum" in type(gdpo).__dataclass_fields__["multi_objective_aggregation"].metadata["help"]
    same = {k: v for k, v in gdpo.to_dict().items() if k not in ("output_dir", "logging_dir", "run_name")}
    other = {k: v for k, v in weighted.to_dict().items() if k not in ("output_dir", "logging_dir", "run_name")}
    assert {k for k in same if same[k] != other[k]} == {"multi_objective_aggregation"}
    assert gdpo.reward_weights == weighted.reward_weights, "the same weights, applied after normalising"


@pytest.mark.slow  # a few seconds: one real GRPO step of a tiny model under TRL's normalize_then_sum
def test_a_cpu_step_under_gdpo_logs_every_reward_and_trls_advantages_are_gdpos(gsm8k_env, offline_model_and_tokenizer):
    _, tokenizer = offline_model_and_tokenizer
    funcs, weights = hack_rewards()  # the five rewards and a length bonus that tells every completion apart
    profile = variants.get_profile("ci").override(train_size=4, max_completion_length=8, lora_top_layers=None)
    run_dir = gsm8k_env / "gdpo-step"
    config = make_grpo_config(
        profile,
        run_dir,
        **variants.VARIANTS["gdpo"],
        max_steps=1,
        logging_steps=1,
        save_strategy="no",
        reward_weights=weights,
        log_completions=True,
    )
    trainer = build_trainer(build_tiny_random_model(), tokenizer, profile, config=config, reward_funcs=funcs)
    trainer.train()
    [logs] = [entry for entry in trainer.state.log_history if "reward" in entry]
    names = [func.__name__ for func in funcs]
    assert all(math.isfinite(logs[f"rewards/{name}/mean"]) for name in names)
    logged = logged_completions(run_dir)
    assert len(logged) == config.generation_batch_size and logged[names].notna().all().all()
    ours = gdpo_advantages(logged[names].to_numpy(), weights, config.num_generations)
    assert np.abs(ours).max() > 0.1, "the length bonus differs within each group, so some advantage is not 0"
    np.testing.assert_allclose(logged["advantage"], ours, atol=1e-4)


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


def test_the_gdpo_pair_is_measured_under_its_own_table_name(load_script):
    script = load_script("variants")
    args = script.parse_args(["--variants", "dapo", "gdpo", "--no-hack", "--table", GDPO_TABLE])
    assert args.table == GDPO_TABLE and table_files(args.table)[2] == "variants_gdpo.txt"
    assert script.parse_args([]).table == "variants"
