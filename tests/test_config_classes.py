"""Every profile's settings built into TRL's and PEFT's real config classes, the GPU profiles included, on a CPU.

A TRL release that renames or removes a field a profile sets (as 1.16 removed ``max_prompt_length``) then fails
here, in CI, and not in a workshop's first Colab cell. The GPU profiles ask for fp16 or bf16 autocast, which
``TrainingArguments`` refuses on a machine whose GPU lacks it; the test stands in for the card's answer to that one
question (``is_torch_bf16_gpu_available``) and lets the real classes check everything else.

Notebook 04's checks class every field of the three classes (``run_fields``): the tables are compared here with the
installed TRL's and peft's own field lists, so a field a new release adds is classed, not ignored; every field
classed as changing the run, changed, is named with its value, the expected one and why; a free one never is.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import io

import pytest
import transformers.training_args
from peft import LoraConfig
from trl import GRPOConfig, SFTConfig

from course_utils.core.profiles import PROFILES, get_profile
from course_utils.exercises.nb04_train_grpo import run_fields
from course_utils.lesson.models import build_tiny_random_model
from course_utils.training.grpo_config import grpo_config_kwargs, make_grpo_config
from course_utils.training.lora_setup import make_lora_config
from course_utils.training.warm_start import make_sft_config

GPU_PROFILES = [name for name, p in PROFILES.items() if p.device == "cuda"]


@pytest.fixture
def a_bf16_gpu(monkeypatch):
    """``TrainingArguments`` told the GPU computes bf16, as an A100 answers; every other check stays real."""
    monkeypatch.setattr(transformers.training_args, "is_torch_bf16_gpu_available", lambda: True)


def grpo_kwargs(name: str, tmp_path) -> dict:
    with contextlib.redirect_stdout(io.StringIO()):  # the gpu profile's "vLLM is not installed" line
        kwargs = grpo_config_kwargs(PROFILES[name], tmp_path)
    return kwargs | {"use_vllm": PROFILES[name].use_vllm}  # the GPU run's choice, not this machine's


@pytest.fixture(scope="module")
def thirty_layers():
    """A model as deep as SmolLM2-135M (30 layers), for the profiles that adapt only the top layers."""
    return build_tiny_random_model(vocab_size=64, hidden_size=16, num_layers=30)


@pytest.mark.parametrize("name", list(PROFILES))
def test_every_profile_builds_a_real_grpo_config(name, tmp_path, a_bf16_gpu):
    kwargs = grpo_kwargs(name, tmp_path)
    config = GRPOConfig(**kwargs)
    profile = PROFILES[name]
    assert config.num_generations == profile.num_generations
    assert config.max_completion_length == profile.max_completion_length
    assert config.mask_truncated_completions == profile.mask_truncated_completions
    assert config.beta == profile.beta and config.learning_rate == profile.learning_rate
    assert config.use_vllm == profile.use_vllm
    assert config.gradient_checkpointing == profile.gradient_checkpointing  # set through activation_checkpointing
    assert config.fp16 == (profile.training_dtype == "float16")
    assert config.bf16 == (profile.training_dtype == "bfloat16")


@pytest.mark.parametrize("name", list(PROFILES))
def test_every_profile_builds_a_real_sft_config(name, tmp_path, a_bf16_gpu):
    config = make_sft_config(PROFILES[name], tmp_path)
    assert isinstance(config, SFTConfig)
    assert config.learning_rate == PROFILES[name].warm_start_learning_rate


@pytest.mark.parametrize("name", list(PROFILES))
def test_every_profile_builds_a_real_lora_config_on_its_architecture(name, thirty_layers):
    profile = PROFILES[name]
    config = make_lora_config(profile, thirty_layers)
    assert isinstance(config, LoraConfig)
    assert sorted(config.target_modules) == sorted(profile.lora_target_modules)
    assert config.r == profile.lora_r and config.lora_alpha == profile.lora_alpha
    if profile.lora_top_layers is None:
        assert config.layers_to_transform is None
    else:
        assert config.layers_to_transform == list(range(30 - profile.lora_top_layers, 30))


@pytest.mark.parametrize("name", GPU_PROFILES)
def test_a_field_trl_rejects_fails_the_gpu_profiles_config(name, tmp_path, a_bf16_gpu):
    """``max_prompt_length``, removed in TRL 1.16 (popular tutorials still set it): the build above would fail."""
    with pytest.raises(TypeError, match="max_prompt_length"):
        GRPOConfig(**grpo_kwargs(name, tmp_path), max_prompt_length=512)


def test_without_the_stand_in_a_cpu_refuses_bf16_autocast(tmp_path):
    """The stand-in answers one question only: without it, this machine's own answer decides (it has no GPU)."""
    with pytest.raises(ValueError, match="bf16"):
        GRPOConfig(**grpo_kwargs("gpu", tmp_path))


# --- Every field classed: changes the run, or not ---------------------------------------------------------


TABLES = {"GRPOConfig": (run_fields.GRPO_FIELDS, GRPOConfig), "SFTConfig": (run_fields.SFT_FIELDS, SFTConfig),
          "LoraConfig": (run_fields.LORA_FIELDS, LoraConfig)}  # fmt: skip


@pytest.mark.parametrize("name", list(TABLES))
def test_the_field_tables_class_every_field_trl_and_peft_offer(name):
    """A field a new TRL or peft adds is classed (changes the run or not), never ignored by the checks."""
    table, config = TABLES[name]
    offered = {field.name for field in dataclasses.fields(config)}
    assert set(table) == offered, (sorted(offered - set(table)), sorted(set(table) - offered))
    assert set(table.values()) <= {run_fields.FREE, run_fields.JUDGED, *run_fields.WHY}
    assert {*run_fields.RANGES, *run_fields.SAME_RUN, *run_fields.EFFECTIVE, *run_fields.FIELD_WHY} <= set(
        run_fields.GRPO_FIELDS) | set(run_fields.SFT_FIELDS) | set(run_fields.LORA_FIELDS)


def test_a_field_classed_twice_is_refused():
    with pytest.raises(ValueError, match="classed twice"):
        run_fields._fields(free="seed", trained="seed")


@pytest.fixture(scope="module")
def references(thirty_layers, tmp_path_factory):
    """The package's three configs for the cpu lab (fp32, so that they build on any CPU), writing nowhere."""
    folder = tmp_path_factory.mktemp("run")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("COURSE_CPU_PRECISION", "fp32")
        profile = get_profile("cpu")
        return {"GRPOConfig": make_grpo_config(profile, folder), "SFTConfig": make_sft_config(profile, folder),
                "LoraConfig": make_lora_config(profile, thirty_layers)}  # fmt: skip


def another_value(value):
    """A value of ``value``'s field that makes another run (outside every range, in no ``SAME_RUN`` group)."""
    value = run_fields.plain(value)
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value * 10 + 1
    if isinstance(value, str):
        return f"{value}-other"
    return ["other"] if isinstance(value, list) else "other"


@pytest.mark.parametrize("name", list(TABLES))
def test_every_run_changing_field_changed_is_named_with_value_expected_and_why(name, references):
    """One changed field, one problem: ``field=value``, the profile's value or range, and why it matters."""
    table, _ = TABLES[name]
    reference, missed = references[name], []
    for field, kind in table.items():
        if kind in (run_fields.FREE, run_fields.JUDGED):
            continue
        changed = copy.copy(reference)
        setattr(changed, field, another_value(getattr(reference, field)))
        problems = run_fields.field_problems(changed, reference, table)
        why = run_fields.RANGES[field][3] if field in run_fields.RANGES else run_fields.reason(field, kind)
        named = [p for p in problems if p.startswith(f"{field}=") and why in p and "the profile's" in p]
        if len(problems) != 1 or not named:
            missed.append((field, problems))
    assert not missed, missed


@pytest.mark.parametrize("name", list(TABLES))
def test_a_free_field_changed_is_never_a_problem(name, references):
    """Logging, saving, speed, a field the trainer does not read: the learner's own."""
    table, _ = TABLES[name]
    reference = references[name]
    for field in [field for field, kind in table.items() if kind == run_fields.FREE]:
        changed = copy.copy(reference)
        setattr(changed, field, another_value(getattr(reference, field, None)))
        assert run_fields.field_problems(changed, reference, table) == [], field


# What the package's GRPOConfig sets that changes nothing the run depends on; every other field it sets is judged or
# compared. A field the builder starts to set is added here only if it changes nothing.
FREE_FIELDS_THE_BUILDER_SETS = {"activation_checkpointing", "vllm_mode", "vllm_gpu_memory_utilization",
                                "dataloader_num_workers", "logging_steps", "save_steps", "save_total_limit",
                                "report_to", "seed"}  # fmt: skip


@pytest.mark.parametrize("name", list(PROFILES))
def test_every_field_the_grpo_builder_sets_changes_the_run_or_is_named_free(name, tmp_path):
    """A profile field the builder starts to write (as ``scale_rewards``) is judged in 04.1, not let through."""
    written = grpo_kwargs(name, tmp_path)
    free = {field for field in written if run_fields.GRPO_FIELDS[field] == run_fields.FREE}
    assert free == FREE_FIELDS_THE_BUILDER_SETS
