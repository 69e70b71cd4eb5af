"""COURSE_MODEL_DIR: a GPU profile's model from a folder on disk, checked before loading; the tiny Qwen2 stand-in."""

from __future__ import annotations

import json
import os
import shutil

import pytest
from transformers import Qwen2ForCausalLM

from course_utils.core import rehearsal
from course_utils.core.profiles import PROFILES, QWEN_LORA_TARGETS
from course_utils.lesson import models
from course_utils.lesson.local_model import MODEL_DIR_ENV_VAR, ModelFolderError, local_model_dir
from course_utils.lesson.tiny_qwen import END_OF_TURN, MARKER, PAD, save_tiny_qwen


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
    monkeypatch.setenv(rehearsal.REHEARSAL_ENV_VAR, "1")  # a stand-in of another size
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


# --- The folder checked whole: tokenizer, shapes against config.json, the profile's size ------------------------


def test_a_folder_without_tokenizer_json_is_refused_not_trained_on_a_3_token_tokenizer(monkeypatch, copy_of):
    folder = copy_of()
    (folder / "tokenizer.json").unlink()
    monkeypatch.setenv(MODEL_DIR_ENV_VAR, str(folder))
    monkeypatch.setenv(rehearsal.REHEARSAL_ENV_VAR, "1")
    with pytest.raises(ModelFolderError, match=r"tokenizer in .* has 3 tokens and encodes 'Natalia"):
        models.load_model_and_tokenizer("gpu")


def test_a_config_that_does_not_match_the_weights_is_named(monkeypatch, copy_of):
    folder = copy_of()
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config | {"hidden_size": 128, "num_hidden_layers": 3}))
    monkeypatch.setenv(MODEL_DIR_ENV_VAR, str(folder))
    with pytest.raises(ModelFolderError, match=r"config.json does not match its weights \(num_hidden_layers 3 in "
                                               r"config.json, 2 in the weights; hidden_size 128 .* 64 in the weights"):
        models.load_tokenizer("gpu")


@pytest.mark.parametrize(
    ("change", "named"),
    [({"intermediate_size": 256}, "intermediate_size 256 in config.json, 128 in the weights"),
     ({"num_key_value_heads": 4}, "num_key_value_heads 4 in config.json, 2 in the weights")],
)  # fmt: skip
def test_a_config_whose_widths_or_heads_the_weights_do_not_have_is_named(monkeypatch, copy_of, change, named):
    """Shapes from_pretrained would refuse with a bare size-mismatch traceback, named before any work."""
    folder = copy_of()
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config | change))
    monkeypatch.setenv(MODEL_DIR_ENV_VAR, str(folder))
    with pytest.raises(ModelFolderError, match=rf"config.json does not match its weights \({named}\)"):
        models.load_tokenizer("gpu")


@pytest.mark.parametrize("change", [{"tie_word_embeddings": False}, {"tie_word_embeddings": None}])
def test_an_untied_config_without_an_output_layer_is_named(monkeypatch, copy_of, change):
    """Untied (false, or left out: Qwen2's default) with no lm_head.weight: from_pretrained would start the output
    layer random with a warning only, and the run would train on noise."""
    folder = copy_of()
    config = json.loads((folder / "config.json").read_text())
    config = {k: v for k, v in (config | change).items() if v is not None}
    (folder / "config.json").write_text(json.dumps(config))
    monkeypatch.setenv(MODEL_DIR_ENV_VAR, str(folder))
    monkeypatch.setenv(rehearsal.REHEARSAL_ENV_VAR, "1")
    with pytest.raises(ModelFolderError, match=r"tie_word_embeddings false, but the weights hold no lm_head.weight"):
        models.load_tokenizer("gpu")


def test_a_model_of_another_size_is_refused_unless_rehearsed_or_the_stand_in_and_then_said(
    monkeypatch, copy_of, capsys
):
    folder = copy_of()
    (folder / MARKER).unlink()  # a Qwen2 of another size from elsewhere
    monkeypatch.setenv(MODEL_DIR_ENV_VAR, str(folder))
    monkeypatch.delenv(rehearsal.REHEARSAL_ENV_VAR, raising=False)
    with pytest.raises(ModelFolderError, match=r"another size than the profile's Qwen/Qwen2.5-0.5B-Instruct: "
                                               r"hidden_size 64 \(the profile's: 896\).*COURSE_REHEARSAL=1"):
        local_model_dir(PROFILES["gpu"])
    monkeypatch.setenv(rehearsal.REHEARSAL_ENV_VAR, "1")
    assert local_model_dir(PROFILES["gpu"]) == folder
    out = capsys.readouterr().out
    assert "stand-in of another size" in out and "allowed by COURSE_REHEARSAL=1" in out


def test_the_courses_own_stand_in_of_another_size_is_allowed_and_said(monkeypatch, tiny_qwen, capsys):
    """``scripts/gpu_check.py`` runs the stand-in on a real GPU, outside the rehearsal: its size said, not refused."""
    monkeypatch.setenv(MODEL_DIR_ENV_VAR, str(tiny_qwen))
    monkeypatch.delenv(rehearsal.REHEARSAL_ENV_VAR, raising=False)
    assert local_model_dir(PROFILES["gpu"]) == tiny_qwen
    out = capsys.readouterr().out
    assert "stand-in of another size than Qwen/Qwen2.5-0.5B-Instruct (hidden_size 64" in out
    assert f"allowed by {MARKER}" in out


def test_a_missing_shard_is_named_not_blamed_on_the_hub(monkeypatch, copy_of):
    folder = copy_of()
    (folder / "model.safetensors").rename(folder / "model-00001-of-00002.safetensors")
    index = {"metadata": {}, "weight_map": {"model.embed_tokens.weight": "model-00001-of-00002.safetensors",
                                            "lm_head.weight": "model-00002-of-00002.safetensors"}}  # fmt: skip
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    monkeypatch.setenv(MODEL_DIR_ENV_VAR, str(folder))
    with pytest.raises(ModelFolderError, match=r"lacks the weight file\(s\) model-00002-of-00002") as caught:
        models.load_tokenizer("gpu")
    assert "Hub" not in str(caught.value)


@pytest.mark.skipif(os.geteuid() != 0, reason="switches to another user, as only root can")
def test_unreadable_weights_are_called_unreadable_not_damaged(copy_of):
    """In a forked child running as nobody (root reads every file): the weights without read permission."""
    from course_utils.lesson.local_model import weights_problem

    folder = copy_of()
    (folder / "model.safetensors").chmod(0o200)
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # the child: as nobody, judge the file, report, and leave without running pytest's teardown
        os.close(read)
        os.setuid(65534)
        os.write(write, str(weights_problem(folder / "model.safetensors")).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        said = pipe.read()
    os.waitpid(child, 0)
    assert "cannot be read by this user (permission denied). Fix: chmod a+r" in said and "damaged" not in said
