"""Stand-ins for Qwen2.5-0.5B-Instruct on disk: its architecture at toy sizes and at full size, with Qwen2.5's chat
template.

The GPU profiles train Qwen2.5-0.5B-Instruct, whose weights are not on our machines. ``save_tiny_qwen`` writes a
model folder that loads exactly as the real one does (``COURSE_MODEL_DIR``, ``from_pretrained``, 4-bit through
bitsandbytes): a randomly initialised ``Qwen2ForCausalLM`` with the same module names, tied embeddings and
grouped-query attention (``models.build_tiny_random_model``), and a tokenizer carrying Qwen2.5-Instruct's own chat
template (TRL ships it as ``trl.chat_template_utils.qwen2_5_chat_template``) and Qwen's special tokens: ``<|im_end|>``
ends a turn, ``<|endoftext|>`` pads. The vocabulary is the offline SmolLM2 tokenizer's (49,152 tokens, the same
``<|im_start|>``/``<|im_end|>`` markers), a third of Qwen's 151,936, so a CPU step stays seconds.

A random model almost never picks one token out of 49,152, so it would never end a completion. The end-of-turn
token's embedding row (tied to the output head) is scaled up, so its logit spreads wider than the others': some
completions end early and others run to ``max_completion_length``, and both branches of
``mask_truncated_completions`` run.

``save_full_size_qwen`` writes Qwen2.5-0.5B-Instruct's published shape (``QWEN25_05B_CONFIG``: 494,032,768
parameters, an embedding of 151,936 rows) with random weights and the same tokenizer, for measuring memory and step
time at the real sizes (``make gpu-check --full-size``): they depend on shapes and lengths, not on weight values.
Its generation config suppresses the end-of-turn and pad tokens, so every completion runs to the cap: the worst
case. Ids the tokenizer lacks (rows 49,152 and up, as Qwen's own 271 unused rows) decode to nothing, without error.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM
from trl.chat_template_utils import qwen2_5_chat_template

from course_utils.lesson.local_model import STAND_IN_MARKER
from course_utils.lesson.models import build_tiny_random_model
from course_utils.lesson.offline_model import materialize_offline_model

END_OF_TURN = "<|im_end|>"
PAD = "<|endoftext|>"
END_OF_TURN_SCALE = 40.0  # the end-of-turn row's scale: about half the sampled completions end within 32 tokens
MARKER = STAND_IN_MARKER
# Qwen2.5-0.5B-Instruct's config.json on the Hub, its shape and settings (the token ids are the tokenizer's, set when
# saved; transformers' own fields such as torch_dtype left out)
QWEN25_05B_CONFIG: dict[str, Any] = {
    "model_type": "qwen2",
    "architectures": ["Qwen2ForCausalLM"],
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "vocab_size": 151936,
    "tie_word_embeddings": True,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "max_position_embeddings": 32768,
    "use_sliding_window": False,
    "sliding_window": 32768,
    "max_window_layers": 21,
    "attention_dropout": 0.0,
    "initializer_range": 0.02,
    "use_cache": True,
}


def tiny_qwen_tokenizer() -> object:
    """The offline tokenizer with Qwen2.5-Instruct's chat template and Qwen's end-of-turn and pad tokens."""
    tokenizer = AutoTokenizer.from_pretrained(materialize_offline_model())
    tokenizer.chat_template = qwen2_5_chat_template
    tokenizer.eos_token, tokenizer.pad_token = END_OF_TURN, PAD
    return tokenizer


def save_tiny_qwen(folder: str | Path, seed: int = 0, end_of_turn_scale: float = END_OF_TURN_SCALE) -> Path:
    """Write the tiny Qwen2 model and its tokenizer to ``folder``, as a downloaded model folder looks; return it."""
    tokenizer = tiny_qwen_tokenizer()
    model = build_tiny_random_model(vocab_size=len(tokenizer), seed=seed)
    end_of_turn = tokenizer.convert_tokens_to_ids(END_OF_TURN)
    with torch.no_grad():
        model.get_input_embeddings().weight[end_of_turn] *= end_of_turn_scale
    return _save_stand_in(model, tokenizer, folder, {"seed": seed, "end_of_turn_scale": end_of_turn_scale})


def full_size_config(**changes: Any) -> Qwen2Config:
    """Qwen2.5-0.5B-Instruct's published configuration; ``changes`` replace fields (a test shrinks the layers)."""
    unknown = sorted(set(changes) - set(QWEN25_05B_CONFIG))
    if unknown:
        raise ValueError(f"Qwen2.5-0.5B's config has no field(s) {unknown}; valid fields: {sorted(QWEN25_05B_CONFIG)}")
    return Qwen2Config(**{**QWEN25_05B_CONFIG, **changes})


def save_full_size_qwen(folder: str | Path, seed: int = 0, config: Qwen2Config | None = None) -> Path:
    """Write Qwen2.5-0.5B-Instruct's shape with random bf16 weights, completions that never end, and the tokenizer.

    ``config`` defaults to ``full_size_config()`` (about 1 GB on disk, seconds to initialise).
    """
    tokenizer = tiny_qwen_tokenizer()
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config or full_size_config()).to(torch.bfloat16)
    model.generation_config.suppress_tokens = [tokenizer.convert_tokens_to_ids(t) for t in (END_OF_TURN, PAD)]
    return _save_stand_in(model, tokenizer, folder, {"seed": seed, "full_size": True, "completions_end": False})


def _save_stand_in(model: Any, tokenizer: Any, folder: str | Path, marker: dict[str, Any]) -> Path:
    """Save a stand-in as a downloaded model folder looks: Qwen's end-of-turn and pad ids in its configs."""
    folder = Path(folder)
    end_of_turn = tokenizer.convert_tokens_to_ids(END_OF_TURN)
    model.generation_config.eos_token_id = end_of_turn
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.config.eos_token_id, model.config.pad_token_id = end_of_turn, tokenizer.pad_token_id
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    (folder / MARKER).write_text(json.dumps(marker, indent=2))
    return folder
