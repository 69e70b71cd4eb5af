"""The warm start: short strict-format targets, examples disjoint from GRPO's prompts, a clear error without one.

The warm start itself (a real ``SFTTrainer`` run) is exercised by the ``ci`` end-to-end run in test_training.
"""

from __future__ import annotations

import pytest
import torch

from course_utils.core.profiles import get_profile
from course_utils.lesson.models import build_tiny_random_model, profile_dtype
from course_utils.lesson.rewards import correctness_reward_func, is_strict_format
from course_utils.training import grpo_prompts
from course_utils.training.warm_start import (
    equations_target,
    load_saved_warm_start,
    make_sft_config,
    warm_start_dataset,
    warm_start_target,
)


def test_warm_start_target_is_strict_format_and_correct():
    solution = "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nAltogether 48+24 = <<48+24=72>>72.\n#### 72"
    target = warm_start_target(solution, reasoning_lines=1)
    assert "<<" not in target and "Altogether" not in target
    assert is_strict_format(target)
    completion = [{"role": "assistant", "content": target}]
    assert correctness_reward_func(prompts=[None], completions=[completion], answer=["72"]) == [2.0]
    with pytest.raises(ValueError, match="reasoning_lines"):
        warm_start_target(solution, -1)


NATALIA = "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nAltogether 48+24 = <<48+24=72>>72.\n#### 72"


def test_an_equations_target_reasons_with_the_computation_it_answers_with():
    target = equations_target(NATALIA)
    assert target == "<reasoning>\n48/2=24\n48+24=72\n</reasoning>\n<answer>\n72\n</answer>"
    assert is_strict_format(target)


@pytest.mark.parametrize(
    ("solution", "kept"),
    [
        (NATALIA, True),
        ("He has 3+4 = <<3+4=7>>7.\nThen 7*2 = 14.\n#### 14", False),  # the last note does not reach the answer
        ("No notes at all.\n#### 5", False),
        ("A wrong note 2+2 = <<2+2=5>>5.\n#### 5", False),  # a note that its expression does not give
        ("<<1+1=2>>\n<<2+1=3>>\n<<3+1=4>>\n#### 4", False),  # more notes than warm_start_reasoning_lines
    ],
)
def test_the_equations_warm_start_takes_only_solutions_whose_notes_reach_the_answer(solution, kept):
    profile = get_profile("ci").override(warm_start_reasoning="equations", warm_start_reasoning_lines=2,
                                         warm_start_examples=1)  # fmt: skip
    filler = "No notes.\n#### 1"
    if kept:
        assert grpo_prompts.warm_start_rows(profile, [filler, solution, filler]) == [1]
    else:
        with pytest.raises(ValueError, match=r"Only 0 train problems have at most 2 calculator notes.*lower it"):
            grpo_prompts.warm_start_rows(profile, [filler, solution, filler])


def test_the_equations_warm_start_walks_back_from_the_end():
    profile = get_profile("ci").override(warm_start_reasoning="equations", warm_start_reasoning_lines=2,
                                         warm_start_examples=2)  # fmt: skip
    assert grpo_prompts.warm_start_rows(profile, [NATALIA, "x\n#### 1", NATALIA, NATALIA, "y\n#### 2"]) == [2, 3]
    lines = profile.override(warm_start_reasoning="lines")
    assert grpo_prompts.warm_start_rows(lines, [NATALIA] * 5) == [3, 4]


def test_an_unknown_warm_start_reasoning_is_refused_with_the_choices():
    with pytest.raises(ValueError, match=r"warm_start_reasoning.*equations"):
        get_profile("ci").override(warm_start_reasoning="equation")


def test_the_equations_warm_start_is_disjoint_from_training(gsm8k_env, offline_model_and_tokenizer):
    profile = get_profile("ci").override(warm_start_reasoning="equations", warm_start_reasoning_lines=2,
                                         max_prompt_tokens=None, max_solution_steps=99, train_size=7472)  # fmt: skip
    warm = warm_start_dataset(profile)
    train = grpo_prompts.training_dataset(profile, tokenizer=offline_model_and_tokenizer[1])
    assert all(is_strict_format(row["completion"][0]["content"]) for row in warm)
    assert not {row["prompt"][-1]["content"] for row in warm} & {row["question"] for row in train}


def test_warm_start_dataset_is_disjoint_from_training(gsm8k_env, offline_model_and_tokenizer):
    profile = get_profile("ci")
    warm = warm_start_dataset(profile)
    train = grpo_prompts.training_dataset(profile, tokenizer=offline_model_and_tokenizer[1])
    assert len(warm) == profile.warm_start_examples and len(train) == profile.train_size
    train_questions = {row["question"] for row in train}
    assert not {row["prompt"][-1]["content"] for row in warm} & train_questions


def test_no_warm_start_is_an_error():
    with pytest.raises(ValueError, match="warm_start_examples=0"):
        warm_start_dataset(get_profile("ci").override(warm_start_examples=0))


def test_warm_start_dataset_needs_enough_rows(monkeypatch, tmp_path, gsm8k_dir):
    """Real data too small for the profile is an error (the bundled sample shrinks the profile instead)."""
    for split in ("train", "test"):
        rows = (gsm8k_dir / f"{split}.jsonl").read_text().splitlines()[:40]
        (tmp_path / f"{split}.jsonl").write_text("\n".join(rows) + "\n")
    monkeypatch.setenv("GSM8K_DIR", str(tmp_path))
    with pytest.raises(ValueError, match="fewer than train_size \\+ warm_start_examples"):
        warm_start_dataset(get_profile("ci").override(train_size=40, warm_start_examples=16))


def test_sft_config_keeps_the_effective_batch_in_micro_batches(tmp_path):
    config = make_sft_config(get_profile("cpu"), tmp_path)
    profile = get_profile("cpu")
    assert config.per_device_train_batch_size * config.gradient_accumulation_steps == profile.warm_start_batch_size
    assert config.learning_rate == profile.warm_start_learning_rate and config.save_strategy == "no"


def test_a_saved_warm_start_loads_in_the_dtype_asked_for_and_an_adapter_folder_is_none(tmp_path):
    tiny = build_tiny_random_model(vocab_size=64, hidden_size=16, num_layers=1).to(torch.bfloat16)
    tiny.save_pretrained(tmp_path / "whole")
    loaded = load_saved_warm_start(tmp_path / "whole", profile_dtype("ci"))
    assert loaded.dtype == torch.float32  # the ci profile's dtype, whatever the run saved
    assert torch.equal(loaded.lm_head.weight, tiny.lm_head.weight.float())
    (tmp_path / "adapter").mkdir()
    (tmp_path / "adapter" / "adapter_config.json").write_text("{}")
    assert load_saved_warm_start(tmp_path / "adapter", torch.float32) is None
    assert load_saved_warm_start(tmp_path / "missing", torch.float32) is None
