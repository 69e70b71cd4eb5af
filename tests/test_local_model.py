"""COURSE_MODEL_DIR: a GPU profile's model from a folder on disk, checked before loading; the tiny Qwen2 stand-in."""

from __future__ import annotations

import json
import shutil

import pytest
from transformers import Qwen2ForCausalLM

from course_utils.core import rehearsal
from course_utils.core.profiles import PROFILES, QWEN_LORA_TARGETS
from course_utils.lesson import models
from course_utils.lesson.local_model import MODEL_DIR_ENV_VAR, ModelFolderError, local_model_dir
from course_utils.lesson.tiny_qwen import END_OF_TURN, PAD, save_tiny_qwen


@pytest.fixture(scope="module")
def tiny_qwen(tmp_path_factory):
    return save_tiny_qwen(tmp_path_factory.mktemp("tiny") / "qwen")


@pytest.fixture
def copy_of(tiny_qwen, tmp_path):
    def copy() -> object:
        target = tmp_path / "copy"
        shutil.copytree(tiny_qwen, target)
        return target

    return copy


def test_unset_means_the_hub(monkeypatch):
    monkeypatch.delenv(MODEL_DIR_ENV_VAR, raising=False)
    assert local_model_dir(PROFILES["gpu"]) is None
    assert "Hugging Face Hub" in models.model_source_description("gpu")


def test_a_model_folder_is_read_for_the_gpu_profiles(monkeypatch, tiny_qwen):
    monkeypatch.setenv(MODEL_DIR_ENV_VAR, str(tiny_qwen))
    assert local_model_dir(PROFILES["colab-t4"]) == tiny_qwen
    assert str(tiny_qwen) in models.model_source_description("gpu")


def test_set_for_an_offline_profile_it_is_an_error_not_ignored(monkeypatch, tiny_qwen):
    monkeypatch.setenv(MODEL_DIR_ENV_VAR, str(tiny_qwen))
    with pytest.raises(ModelFolderError, match=r"profile 'cpu' loads the offline .*unset COURSE_MODEL_DIR"):
        models.load_tokenizer("cpu")


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda f: shutil.rmtree(f), r"is not a folder"),
        (lambda f: (f / "config.json").unlink(), r"is not a model folder \(no config.json\)"),
        (lambda f: (f / "model.safetensors").unlink(), r"has no weights \(model.safetensors"),
        (lambda f: [(f / n).unlink() for n in ("tokenizer.json", "tokenizer_config.json")], r"has no tokenizer"),
        (lambda f: (f / "config.json").write_text("{not json"), r"cannot be read"),
    ],
)
def test_a_folder_that_is_not_the_model_is_named_with_what_it_lacks(monkeypatch, copy_of, damage, message):
    folder = copy_of()
    damage(folder)
    monkeypatch.setenv(MODEL_DIR_ENV_VAR, str(folder))
    with pytest.raises(ModelFolderError, match=message) as caught:
        local_model_dir(PROFILES["gpu"])
    assert str(folder) in str(caught.value)


def test_another_architecture_is_refused_by_name(monkeypatch, copy_of):
    folder = copy_of()
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config | {"model_type": "llama"}))
    monkeypatch.setenv(MODEL_DIR_ENV_VAR, str(folder))
    with pytest.raises(ModelFolderError, match=r"holds a 'llama' model, but the profile trains Qwen/Qwen2.5-0.5B"):
        local_model_dir(PROFILES["colab-t4"])


def test_cut_weights_are_named_before_loading(monkeypatch, copy_of):
    folder = copy_of()
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1000])
    monkeypatch.setenv(MODEL_DIR_ENV_VAR, str(folder))
    with pytest.raises(ModelFolderError, match=r"model.safetensors is damaged: .*truncated"):
        models.load_tokenizer("gpu")


def test_the_gpu_profile_loads_the_tiny_qwen_from_its_folder(monkeypatch, tiny_qwen):
    monkeypatch.setenv(MODEL_DIR_ENV_VAR, str(tiny_qwen))
    monkeypatch.setenv(rehearsal.REHEARSAL_ENV_VAR, "1")
    model, tokenizer = models.load_model_and_tokenizer("gpu")
    assert isinstance(model, Qwen2ForCausalLM) and model.config.tie_word_embeddings
    assert model.get_input_embeddings().weight.data_ptr() == model.get_output_embeddings().weight.data_ptr()
    linear_names = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules() if name.endswith("proj")}
    assert set(QWEN_LORA_TARGETS) <= linear_names
    assert model.model.layers[0].self_attn.q_proj.bias is not None  # Qwen2's q/k/v biases
    assert (tokenizer.eos_token, tokenizer.pad_token, tokenizer.padding_side) == (END_OF_TURN, PAD, "left")
    text = tokenizer.apply_chat_template(
        [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}], add_generation_prompt=True,
        tokenize=False,
    )  # fmt: skip
    assert text == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n"
    no_system = tokenizer.apply_chat_template([{"role": "user", "content": "Q"}], tokenize=False)
    assert no_system.startswith("<|im_start|>system\nYou are Qwen, created by Alibaba Cloud.")  # Qwen2.5's own


def test_the_tiny_qwen_ends_some_sampled_completions_and_not_others(tiny_qwen):
    """Both branches of mask_truncated_completions run: some completions end, others are cut."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_qwen)
    tokenizer = AutoTokenizer.from_pretrained(tiny_qwen, padding_side="left")
    chats = [[{"role": "user", "content": f"What is {i} + {i}?"}] for i in range(16)]
    inputs = tokenizer.apply_chat_template(chats, add_generation_prompt=True, return_tensors="pt", return_dict=True,
                                           padding=True)  # fmt: skip
    torch.manual_seed(0)
    new = model.generate(**inputs, max_new_tokens=32, do_sample=True, top_k=None)[:, inputs["input_ids"].shape[1] :]
    ended = sum(bool((row == tokenizer.eos_token_id).any()) for row in new)
    assert 0 < ended < len(chats)
