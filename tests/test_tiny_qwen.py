"""lesson.tiny_qwen's full-size stand-in: Qwen2.5-0.5B-Instruct's published shape, completions that run to the cap,
ids past the tokenizer decoded. The count is checked on the meta device (no weights); the rest on a stand-in with the
full vocabulary and toy hidden sizes, saved and loaded as ``make gpu-check --full-size`` does."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig, Qwen2ForCausalLM

from course_utils.lesson.tiny_qwen import END_OF_TURN, PAD, full_size_config, save_full_size_qwen
from course_utils.training.model_shape import QWEN25_05B, spec_from_config

PUBLISHED_PARAMETERS = 494_032_768  # Qwen2.5-0.5B(-Instruct)'s count, the model card's "0.49B"
TOY_SIZES = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
             "num_key_value_heads": 1}  # fmt: skip


@pytest.fixture(scope="module")
def full_vocabulary_stand_in(tmp_path_factory):
    """The full-size stand-in's folder at toy hidden sizes: its 151,936-row embedding, tokenizer and generation."""
    return save_full_size_qwen(tmp_path_factory.mktemp("full") / "qwen", config=full_size_config(**TOY_SIZES))


def test_the_full_size_config_is_qwen25_05b_instructs_published_one():
    config = full_size_config()
    with torch.device("meta"):
        model = Qwen2ForCausalLM(config)
    assert sum(p.numel() for p in model.parameters()) == PUBLISHED_PARAMETERS
    assert model.lm_head.weight is model.model.embed_tokens.weight, "tied embeddings"
    assert model.model.layers[0].self_attn.q_proj.bias is not None, "q/k/v projections with bias"
    shape = (config.num_hidden_layers, config.hidden_size, config.intermediate_size, config.num_attention_heads,
             config.num_key_value_heads, config.vocab_size)  # fmt: skip
    assert shape == (24, 896, 4864, 14, 2, 151936)
    assert config.rope_parameters["rope_theta"] == 1_000_000.0 and config.max_position_embeddings == 32768
    assert config.rms_norm_eps == 1e-6 and config.tie_word_embeddings and config.hidden_act == "silu"
    assert spec_from_config(config, name=QWEN25_05B.name) == QWEN25_05B, "the estimator counts the same shape"
    assert QWEN25_05B.num_parameters == PUBLISHED_PARAMETERS


def test_a_field_the_config_lacks_is_named():
    with pytest.raises(ValueError, match="hidden_sise"):
        full_size_config(hidden_sise=8)


def _favour_end_of_turn(model, end_of_turn: int):
    """A hook that makes the end-of-turn token the model's overwhelming pick at every step."""

    def hook(module, inputs, logits):
        logits[..., end_of_turn] += 1e4
        return logits

    return model.lm_head.register_forward_hook(hook)


def _completions(model, prompt: dict, asked: GenerationConfig) -> torch.Tensor:
    """Four sampled completions of ``prompt``, the prompt cut off."""
    return model.generate(**prompt, generation_config=asked, num_return_sequences=4)[:, prompt["input_ids"].shape[1] :]


def test_completions_run_to_the_cap_even_where_the_model_would_end_them(full_vocabulary_stand_in):
    model = AutoModelForCausalLM.from_pretrained(full_vocabulary_stand_in)
    tokenizer = AutoTokenizer.from_pretrained(full_vocabulary_stand_in, padding_side="left")
    end_of_turn, pad = tokenizer.convert_tokens_to_ids([END_OF_TURN, PAD])
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "What is 2 + 2?"}], add_generation_prompt=True,
                                           return_tensors="pt", return_dict=True)  # fmt: skip
    # GRPOTrainer passes its own generation config, naming the end-of-turn id; the model's own suppression still holds
    asked = GenerationConfig(max_new_tokens=12, do_sample=True, eos_token_id=[end_of_turn], pad_token_id=pad)
    _favour_end_of_turn(model, end_of_turn)
    torch.manual_seed(0)
    completions = _completions(model, prompt, asked)
    assert completions.shape == (4, 12)
    assert not torch.isin(completions, torch.tensor([end_of_turn, pad])).any()
    assert (completions >= len(tokenizer)).any(), "the model samples rows the tokenizer lacks"
    assert len(tokenizer.batch_decode(completions, skip_special_tokens=True)) == 4
    model.generation_config.suppress_tokens = None
    ended = _completions(model, prompt, asked)
    assert (ended[:, 0] == end_of_turn).all(), "without the suppression the favoured end-of-turn ends every completion"


def test_ids_past_the_tokenizer_decode_to_nothing_without_error(full_vocabulary_stand_in):
    tokenizer = AutoTokenizer.from_pretrained(full_vocabulary_stand_in)
    rows = AutoModelForCausalLM.from_pretrained(full_vocabulary_stand_in).get_input_embeddings().num_embeddings
    assert rows == 151936 > len(tokenizer)
    past = [*range(len(tokenizer), rows, 4999), rows - 1]
    assert tokenizer.decode(past) == ""
    known = tokenizer.encode("4", add_special_tokens=False)
    assert tokenizer.batch_decode([past + known + past], skip_special_tokens=True) == ["4"]
