"""Preflight: every finding has a config that triggers it and one that does not.

Where ``GRPOConfig`` itself refuses a setting, the test also shows the real refusal, so the finding is
known to explain something that would otherwise be a traceback.
"""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer
from trl import GRPOConfig

from course_utils.core.hardware import KNOWN_HARDWARE
from course_utils.lesson import token_lengths
from course_utils.lesson.data import load_gsm8k
from course_utils.lesson.models import load_model_and_tokenizer
from course_utils.lesson.offline_model import materialize_offline_model
from course_utils.lesson.token_lengths import reference_length_percentile
from course_utils.training import preflight
from course_utils.training.config_reading import config_values, generation_batch, trl_choices
from course_utils.training.grpo_config import (
    GenerationBatchError,
    check_generation_batch,
    grpo_config_kwargs,
    vllm_available,
)
from course_utils.training.model_shape import QWEN25_05B
from course_utils.training.preflight import (
    Finding,
    PreflightError,
    check,
    findings_table,
    format_findings,
    raise_for_errors,
)

CPU = {"device": "cpu", "total_memory_gb": 24.0, "available_memory_gb": 20.0}
T4 = {"device": "cuda", "gpu_name": "Tesla T4", "bf16": False, "total_memory_gb": 15.0, "available_memory_gb": 15.0}
A100 = {"device": "cuda", "gpu_name": "A100", "bf16": True, "total_memory_gb": 40.0, "available_memory_gb": 39.5}
CPU_OK = {"use_cpu": True, "bf16": False, "per_device_train_batch_size": 4, "num_generations": 2, "beta": 0.04}


def codes(findings: list[Finding]) -> set[str]:
    return {f.code for f in findings}


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(materialize_offline_model())


@pytest.fixture(scope="module")
def gsm8k():
    return load_gsm8k("train", formatted=True, limit=300, verbose=False)


def test_clean_cpu_config_has_no_findings():
    assert check(CPU_OK, hardware=CPU) == []


def test_batch_not_divisible_is_found_where_grpo_config_raises():
    bad = {**CPU_OK, "per_device_train_batch_size": 6, "num_generations": 4}
    with pytest.raises(ValueError, match="divisible by num_generations"):
        GRPOConfig(output_dir="unused", **bad)
    (finding,) = [f for f in check(bad, hardware=CPU) if f.code == "batch-not-divisible"]
    assert finding.severity == "error"
    assert "6" in finding.message and "num_generations=4" in finding.message


def test_divisibility_counts_accumulation_and_processes():
    # 3 x 2 accumulation steps = 6 completions per generation: groups of 4 do not fit, groups of 3 do.
    base = {**CPU_OK, "per_device_train_batch_size": 3, "gradient_accumulation_steps": 2}
    assert "batch-not-divisible" in codes(check({**base, "num_generations": 4}, hardware=CPU))
    assert "batch-not-divisible" not in codes(check({**base, "num_generations": 3}, hardware=CPU))
    two_gpus = {**A100, "num_processes": 2}
    assert "batch-not-divisible" not in codes(check({**base, "num_generations": 4, "bf16": True}, hardware=two_gpus))


@pytest.mark.parametrize(
    ("sizes", "code"),
    [((6, 1, 4), "batch-not-divisible"), ((4, 1, 1), "group-too-small"), ((0, 1, 2), "batch-size-invalid")],
)
def test_generation_batch_findings_say_what_training_would_raise(sizes, code):
    """Preflight applies training's own rule (``grpo_config.check_generation_batch``): the same refusal and words."""
    batch, accumulation, groups = sizes
    config = {**CPU_OK, "per_device_train_batch_size": batch, "gradient_accumulation_steps": accumulation}
    (finding,) = [f for f in check({**config, "num_generations": groups}, hardware=CPU) if f.severity == "error"]
    with pytest.raises(GenerationBatchError) as refusal:
        check_generation_batch(batch, accumulation, groups)
    assert finding.code == code and str(refusal.value).startswith(finding.message) and finding.fix


def test_preflight_reads_reference_lengths_with_the_datas_own_function():
    assert preflight.reference_length_percentile is token_lengths.reference_length_percentile


def test_generation_batch_follows_grpo_config_defaults():
    built = GRPOConfig(output_dir="unused", **{**CPU_OK, "gradient_accumulation_steps": 3})
    size, steps, problem = generation_batch(config_values({**CPU_OK, "gradient_accumulation_steps": 3}))
    assert (size, steps, problem) == (built.generation_batch_size, built.steps_per_generation, None)


def test_conflicting_generation_settings():
    bad = {**CPU_OK, "generation_batch_size": 8, "steps_per_generation": 2}
    with pytest.raises(ValueError, match="can not be both configured"):
        GRPOConfig(output_dir="unused", **bad)
    assert "generation-settings-conflict" in codes(check(bad, hardware=CPU))
    assert "generation-batch-not-divisible" in codes(check({**CPU_OK, "generation_batch_size": 6}, hardware=CPU))
    assert codes(check({**CPU_OK, "generation_batch_size": 8}, hardware=CPU)) == set()


def test_group_of_one():
    bad = {**CPU_OK, "num_generations": 1}
    with pytest.raises(ValueError, match="at least 2 generations"):
        GRPOConfig(output_dir="unused", **bad)
    assert "group-too-small" in codes(check(bad, hardware=CPU))
    assert "group-too-small" not in codes(check(CPU_OK, hardware=CPU))


def test_bf16_on_t4_and_not_on_a100():
    config = {"per_device_train_batch_size": 8, "num_generations": 8}  # bf16 left to TRL's default: on
    found = [f for f in check(config, hardware=T4) if f.code == "bf16-unsupported"]
    assert found and found[0].severity == "error" and "fp16=True" in found[0].fix
    assert "bf16-unsupported" not in codes(check(config, hardware=A100))
    assert "bf16-unsupported" not in codes(check({**config, "fp16": True}, hardware=T4))


def test_bf16_on_cpu_is_what_grpo_config_refuses():
    config = {"per_device_train_batch_size": 4, "num_generations": 2}
    with pytest.raises(ValueError, match="bf16"):
        GRPOConfig(output_dir="unused", **config)
    (refused,) = [f for f in check(config, hardware=CPU) if f.code == "bf16-unsupported"]
    assert refused.severity == "error" and "use_cpu=True" in refused.fix
    assert "bf16-unsupported" not in codes(check(CPU_OK, hardware=CPU))


def test_bf16_autocast_on_cpu_depends_on_native_support():
    config = {**CPU_OK, "bf16": True}
    emulated = [f for f in check(config, hardware=CPU) if f.code == "bf16-unsupported"]
    assert [f.severity for f in emulated] == ["warning"]
    assert "bf16-unsupported" not in codes(check(config, hardware={**CPU, "bf16": True}))


def test_fp16_on_cpu():
    assert "fp16-on-cpu" in codes(check({**CPU_OK, "fp16": True}, hardware=CPU))
    assert "fp16-on-cpu" not in codes(check({**CPU_OK, "fp16": True}, hardware=T4))


def test_kl_not_logged_when_beta_is_zero():
    (info,) = [f for f in check({**CPU_OK, "beta": 0.0}, hardware=CPU) if f.code == "kl-not-logged"]
    assert info.severity == "info"
    warned = check({**CPU_OK, "beta": 0.0}, hardware=CPU, expect_kl=True)
    assert [f.severity for f in warned if f.code == "kl-not-logged"] == ["warning"]
    assert "kl-not-logged" not in codes(check(CPU_OK, hardware=CPU, expect_kl=True))
    assert "kl-not-logged" not in codes(check({**CPU_OK, "beta": 0.0}, hardware=CPU, expect_kl=False))


def test_completion_length_against_reference_solutions(tokenizer, gsm8k):
    p90 = reference_length_percentile(gsm8k, tokenizer)
    lengths = sorted(len(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in gsm8k["reasoning"])
    assert lengths[0] < p90 <= lengths[-1]
    assert sum(n > p90 for n in lengths) <= 0.1 * len(lengths) + 1
    short = check({**CPU_OK, "max_completion_length": int(p90) - 1}, tokenizer, gsm8k, hardware=CPU)
    assert "completion-too-short" in codes(short)
    long_enough = check(
        {**CPU_OK, "max_completion_length": int(p90) + 1}, dataset=gsm8k, tokenizer=tokenizer, hardware=CPU
    )
    assert "completion-too-short" not in codes(long_enough)


def test_completion_length_without_tokenizer_is_reported(gsm8k):
    assert "completion-length-unchecked" in codes(check(CPU_OK, dataset=gsm8k, hardware=CPU))


def test_reference_lengths_from_raw_gsm8k(tokenizer):
    raw = load_gsm8k("train", limit=50, verbose=False)
    formatted = load_gsm8k("train", limit=50, verbose=False, formatted=True)
    assert reference_length_percentile(raw, tokenizer) == reference_length_percentile(formatted, tokenizer)
    with pytest.raises(ValueError, match="answer"):
        reference_length_percentile(raw.remove_columns("answer"), tokenizer)


def test_memory_too_high_for_a_t4_but_not_with_the_colab_settings():
    # GRPOConfig turns gradient checkpointing on by default: switched off here, as many learners do.
    huge = {"fp16": True, "per_device_train_batch_size": 16, "num_generations": 8, "max_completion_length": 2048}
    huge["gradient_checkpointing"] = False
    found = [f for f in check(huge, model=QWEN25_05B, hardware=T4) if f.code == "memory-too-high"]
    assert found and "out-of-memory" in found[0].message
    colab = {
        "fp16": True,
        "per_device_train_batch_size": 8,
        "num_generations": 8,
        "gradient_checkpointing": True,
        "gradient_accumulation_steps": 2,
        "max_completion_length": 256,
    }
    assert not {"memory-too-high", "memory-tight"} & codes(check(colab, model=QWEN25_05B, hardware=T4))


def test_memory_tight_warning():
    config = {"fp16": True, "per_device_train_batch_size": 8, "num_generations": 8, "max_completion_length": 256}
    need = next(f for f in check(config, model=QWEN25_05B, hardware={**T4, "available_memory_gb": 1.0}))
    estimate_gb = float(need.message.split("memory ")[1].split(" GB")[0])
    tight = check(config, model=QWEN25_05B, hardware={**T4, "available_memory_gb": estimate_gb / 0.95})
    assert "memory-tight" in codes(tight)
    assert not {"memory-tight", "memory-too-high"} & codes(
        check(config, model=QWEN25_05B, hardware={**T4, "available_memory_gb": estimate_gb * 2})
    )


def test_real_model_object_feeds_the_memory_check():
    model, tok = load_model_and_tokenizer("ci")
    assert "memory-too-high" in codes(check(CPU_OK, model=model, hardware={**CPU, "available_memory_gb": 0.5}))
    assert "memory-too-high" not in codes(check(CPU_OK, model=model, hardware=CPU))
    # A tokenizer passed as `model` is used as the tokenizer, not estimated.
    assert check(CPU_OK, model=tok, hardware={**CPU, "available_memory_gb": 0.1}) == []


def test_a_built_grpo_config_is_accepted():
    built = GRPOConfig(output_dir="unused", **CPU_OK)
    assert check(built, hardware=CPU) == []
    assert "bf16-unsupported" not in codes(check(built, hardware=T4))


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="did you mean 'num_generations'"):
        check({"num_generation": 4}, hardware=CPU)
    with pytest.raises(TypeError, match="GRPOConfig or a dict"):
        check(["num_generations", 4], hardware=CPU)
    with pytest.raises(ValueError, match="Unknown hardware field"):
        check(CPU_OK, hardware={"device": "cuda", "memory": 16})
    with pytest.raises(ValueError, match="known"):
        check(CPU_OK, hardware="V100")
    with pytest.raises(ValueError, match="severity"):
        Finding("fatal", "x", "y", "z")


def test_display_helpers():
    findings = check({"per_device_train_batch_size": 6, "num_generations": 4, "beta": 0.0}, hardware=T4)
    text = format_findings(findings)
    assert "batch-not-divisible" in text and "bf16-unsupported" in text and "fix:" in text
    assert [f.severity for f in findings] == sorted(
        (f.severity for f in findings), key=["error", "warning", "info"].index
    )
    table = findings_table(findings)
    assert list(table.columns) == ["severity", "code", "message", "fix"] and len(table) == len(findings)
    assert format_findings([]) == "Preflight: no problems found."
    with pytest.raises(PreflightError, match="batch-not-divisible"):
        raise_for_errors(findings)
    raise_for_errors([f for f in findings if f.severity != "error"])


# --- vLLM --------------------------------------------------------------------------------------------


def test_vllm_asked_for_in_the_config_but_not_installed_is_an_error():
    if vllm_available():
        pytest.skip("vllm is installed here")
    config = {"per_device_train_batch_size": 8, "num_generations": 8, "use_vllm": True}
    found = [f for f in check(config, hardware=A100) if f.code == "vllm-missing"]
    assert [f.severity for f in found] == ["error"] and 'pip install ".[vllm]"' in found[0].fix


def test_a_profile_that_wants_vllm_where_it_is_missing_gets_a_warning():
    if vllm_available():
        pytest.skip("vllm is installed here")
    values = grpo_config_kwargs("gpu")
    values.pop("output_dir")
    warned = [f for f in check(values, hardware=A100, profile="gpu") if f.code == "vllm-missing"]
    assert [f.severity for f in warned] == ["warning"] and "several times slower" in warned[0].message
    assert not [f for f in check(values, hardware=A100, profile="ci") if f.code == "vllm-missing"]
    assert not [f for f in check(values, hardware="T4") if f.code == "vllm-missing"], "no profile, no wish"


def test_colocated_vllm_counts_its_share_of_the_gpu():
    config = {"per_device_train_batch_size": 8, "num_generations": 8, "fp16": True, "bf16": False}
    t4 = KNOWN_HARDWARE["T4"]
    assert not [f for f in check(config, model=QWEN25_05B, hardware=t4) if f.code.startswith("memory")]
    greedy = {**config, "use_vllm": True, "vllm_mode": "colocate", "vllm_gpu_memory_utilization": 0.95}
    found = [f for f in check(greedy, model=QWEN25_05B, hardware=t4) if f.code == "memory-too-high"]
    assert found and "vLLM 14.25" in found[0].message
    served = {**greedy, "vllm_mode": "server"}
    assert not [f for f in check(served, model=QWEN25_05B, hardware=t4) if f.code.startswith("memory")]


# --- The loss variants: valid values read from TRL, fields that do nothing on-policy ---------------------


def test_trl_choices_reads_the_loss_types_from_the_installed_trl():
    valid = trl_choices("loss_type")
    assert {"grpo", "dapo", "dr_grpo", "bnpo"} <= set(valid)
    assert GRPOConfig.__dataclass_fields__["loss_type"].default in valid
    assert trl_choices("no_such_field") == ()


@pytest.mark.parametrize("field_name", ["multi_objective_aggregation", "scale_rewards", "loss_type"])
def test_trl_choices_reads_every_value_of_a_list_whose_sentences_end_inside_it(field_name):
    """multi_objective_aggregation's values are each followed by a description of several sentences; every value
    TRL's code accepts is read, not only the one before the first full stop."""
    valid = trl_choices(field_name)
    assert GRPOConfig.__dataclass_fields__[field_name].default in valid
    for value in valid:  # TRL accepts each value it documents
        GRPOConfig(output_dir="unused", **{field_name: value}, report_to=[], use_cpu=True, bf16=False)
    if field_name == "multi_objective_aggregation":
        assert set(valid) == {"sum_then_normalize", "normalize_then_sum"}  # both branches of TRL's advantage code


def test_unknown_loss_type_is_an_error_listing_the_valid_ones():
    [finding] = [f for f in check({**CPU_OK, "loss_type": "drgrpo"}, hardware=CPU) if f.code == "unknown-loss-type"]
    assert finding.severity == "error"
    assert all(name in finding.message for name in trl_choices("loss_type"))
    assert "did you mean 'dr_grpo'" in finding.fix.lower()
    with pytest.raises(PreflightError, match="unknown-loss-type"):
        raise_for_errors(check({**CPU_OK, "loss_type": "ppo"}, hardware=CPU))
    for loss_type in trl_choices("loss_type"):
        assert "unknown-loss-type" not in codes(check({**CPU_OK, "loss_type": loss_type}, hardware=CPU))


def test_sequence_ratio_on_policy_is_an_info_finding_and_off_policy_is_not():
    on_policy = check({**CPU_OK, "importance_sampling_level": "sequence"}, hardware=CPU)
    [finding] = [f for f in on_policy if f.code == "sequence-ratio-on-policy"]
    assert finding.severity == "info" and "identical to token level on-policy" in finding.message
    for off_policy in ({"num_iterations": 2}, {"steps_per_generation": 2}):
        config = {**CPU_OK, "importance_sampling_level": "sequence", **off_policy}
        assert "sequence-ratio-on-policy" not in codes(check(config, hardware=CPU))
    assert "sequence-ratio-on-policy" not in codes(check(CPU_OK, hardware=CPU))


def test_sequence_ratio_finding_reads_a_built_config_too(tmp_path):
    config = GRPOConfig(output_dir=str(tmp_path), importance_sampling_level="sequence", report_to=[], **CPU_OK)
    assert "sequence-ratio-on-policy" in codes(check(config, hardware=CPU))


def test_unknown_importance_sampling_level_and_idle_clip_higher():
    bad = check({**CPU_OK, "importance_sampling_level": "sentence"}, hardware=CPU)
    assert [f.severity for f in bad if f.code == "unknown-importance-sampling-level"] == ["error"]
    idle = check({**CPU_OK, "epsilon_high": 0.28}, hardware=CPU)
    assert [f.severity for f in idle if f.code == "clip-higher-on-policy"] == ["info"]
    assert "clip-higher-on-policy" not in codes(
        check({**CPU_OK, "epsilon_high": 0.28, "num_iterations": 2}, hardware=CPU)
    )
