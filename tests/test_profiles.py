"""The hardware profiles: selection by COURSE_PROFILE, clear errors, and sizes that fit together."""

from __future__ import annotations

import pytest

from course_utils.core import hardware, profiles
from course_utils.core.profiles import PROFILES, UnknownProfileError, describe_profile, get_profile, profiles_table
from course_utils.training.grpo_config import make_grpo_config


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_each_profile_is_selected_by_the_environment_variable(monkeypatch, name):
    monkeypatch.setenv("COURSE_PROFILE", name)
    assert get_profile().name == name


def test_names_are_forgiving_about_case_and_underscores():
    assert get_profile("COLAB_T4").name == "colab-t4"


def test_unknown_profile_lists_the_valid_ones(monkeypatch):
    monkeypatch.setenv("COURSE_PROFILE", "laptop")
    with pytest.raises(UnknownProfileError) as error:
        get_profile()
    message = str(error.value)
    assert "'laptop'" in message
    for name in [*PROFILES, "auto"]:
        assert name in message


def test_auto_picks_cpu_without_cuda(monkeypatch):
    monkeypatch.setattr(profiles, "cuda_available", lambda: False)
    assert get_profile("auto").name == "cpu"


def test_auto_picks_cpu_when_the_hub_is_unreachable_even_with_a_gpu(monkeypatch):
    monkeypatch.setattr(profiles, "cuda_available", lambda: True)
    monkeypatch.setattr(profiles, "hub_reachable", lambda: False)
    assert profiles.detect_profile_name() == "cpu"


def test_hub_is_unreachable_when_offline_mode_is_set(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert hardware.hub_reachable() is False


@pytest.mark.parametrize("profile", PROFILES.values(), ids=list(PROFILES))
def test_group_sizes_fit_the_batches(profile):
    assert profile.num_generations >= 2, "a group of one has no relative advantage"
    assert profile.effective_batch_size % profile.num_generations == 0
    assert profile.prompts_per_step >= 1


@pytest.mark.parametrize("profile", PROFILES.values(), ids=list(PROFILES))
def test_precision_matches_the_device(profile):
    if profile.device == "cpu":
        assert profile.dtype == "float32" and not profile.load_in_4bit
    if profile.load_in_4bit:
        assert profile.use_lora, "a 4-bit model can only be trained through adapters"


def test_gpu_profiles_use_qwen_from_the_hub_and_offline_ones_smollm2():
    assert {p.model_id for p in PROFILES.values() if p.model_source == "hub"} == {profiles.HUB_MODEL_ID}
    assert {p.model_id for p in PROFILES.values() if p.model_source == "offline"} == {profiles.OFFLINE_MODEL_ID}
    assert get_profile("colab-t4").dtype == "float16" and get_profile("gpu").dtype == "bfloat16"


def test_override_returns_a_changed_copy_and_rejects_unknown_fields():
    base = get_profile("ci")
    changed = base.override(max_steps=7)
    assert changed.max_steps == 7 and base.max_steps != 7
    with pytest.raises(ValueError, match="max_step"):
        base.override(max_step=7)


def test_profiles_are_frozen():
    with pytest.raises(AttributeError):
        get_profile("ci").max_steps = 1  # type: ignore[misc]


def test_description_and_table_cover_every_profile():
    assert "ci" in describe_profile("ci") and "completions per prompt" in describe_profile("ci")
    table = profiles_table()
    assert list(table.index) == list(PROFILES)
    assert (table["effective_batch_size"] % table["num_generations"] == 0).all()


# --- The GPU profiles' settings, from evidence -------------------------------------------------------

QWEN_GSM8K_MEDIAN_COMPLETION = 274  # tokens: Qwen2.5-0.5B-Instruct on GSM8K, measured in trl#6263


@pytest.mark.parametrize("name", ["colab-t4", "gpu"])
def test_gpu_profiles_train_lora_at_about_ten_times_the_full_fine_tuning_rate(name):
    from course_utils.training.config_tables import GOLDEN_CONFIG

    profile = get_profile(name)
    assert profile.use_lora
    assert 5 <= profile.learning_rate / GOLDEN_CONFIG["learning_rate"] <= 20
    assert profile.learning_rate <= get_profile("cpu").learning_rate


@pytest.mark.parametrize("name", ["colab-t4", "gpu"])
def test_gpu_profiles_leave_room_for_qwen_completions_and_mask_the_cut_ones(name):
    profile = get_profile(name)
    assert profile.max_completion_length >= 1.5 * QWEN_GSM8K_MEDIAN_COMPLETION
    assert profile.mask_truncated_completions
    assert profile.eval_max_new_tokens >= profile.max_completion_length


def test_new_fields_default_to_the_old_behaviour():
    for name in ("ci", "cpu"):
        profile = get_profile(name)
        assert profile.report_to == "none" and not profile.mask_truncated_completions
    assert get_profile("gpu").use_vllm and 0 < get_profile("gpu").vllm_gpu_memory_utilization < 1


def test_scale_rewards_takes_grpo_configs_choices_and_reaches_the_config(tmp_path):
    with pytest.raises(ValueError, match=r"scale_rewards.*'group', 'batch', 'none'"):
        get_profile("ci").override(scale_rewards="std")
    for choice in ("group", "batch", "none"):
        config = make_grpo_config(get_profile("ci").override(scale_rewards=choice), tmp_path / choice)
        assert config.scale_rewards == choice
