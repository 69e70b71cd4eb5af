"""A stand-in for Qwen2.5-0.5B-Instruct on disk: its architecture at toy sizes, with Qwen2.5's chat template.

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
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import AutoTokenizer
from trl.chat_template_utils import qwen2_5_chat_template

from course_utils.lesson.local_model import STAND_IN_MARKER
from course_utils.lesson.models import build_tiny_random_model
from course_utils.lesson.offline_model import materialize_offline_model

END_OF_TURN = "<|im_end|>"
PAD = "<|endoftext|>"
END_OF_TURN_SCALE = 40.0  # the end-of-turn row's scale: about half the sampled completions end within 32 tokens
MARKER = STAND_IN_MARKER


def tiny_qwen_tokenizer() -> object:
    """The offline tokenizer with Qwen2.5-Instruct's chat template and Qwen's end-of-turn and pad tokens."""
    tokenizer = AutoTokenizer.from_pretrained(materialize_offline_model())
    tokenizer.chat_template = qwen2_5_chat_template
    tokenizer.eos_token, tokenizer.pad_token = END_OF_TURN, PAD
    return tokenizer


def save_tiny_qwen(folder: str | Path, seed: int = 0, end_of_turn_scale: float = END_OF_TURN_SCALE) -> Path:
    """Write the tiny Qwen2 model and its tokenizer to ``folder``, as a downloaded model folder looks; return it."""
    folder = Path(folder)
    tokenizer = tiny_qwen_tokenizer()
    model = build_tiny_random_model(vocab_size=len(tokenizer), seed=seed)
    end_of_turn = tokenizer.convert_tokens_to_ids(END_OF_TURN)
    with torch.no_grad():
        model.get_input_embeddings().weight[end_of_turn] *= end_of_turn_scale
    model.generation_config.eos_token_id = end_of_turn
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.config.eos_token_id, model.config.pad_token_id = end_of_turn, tokenizer.pad_token_id
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    (folder / MARKER).write_text(json.dumps({"seed": seed, "end_of_turn_scale": end_of_turn_scale}, indent=2))
    return folder
