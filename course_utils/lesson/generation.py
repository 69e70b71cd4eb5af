"""Text from a loaded model: greedy and sampled replies to chats, and how likely a reply's first words are.

``greedy_generate`` is the course's one generator (evaluation, the notebooks' demos); ``sample_generate`` draws a
group of replies per chat as ``GRPOTrainer`` does; ``DecodeTimer`` splits ``generate``'s time into reading the
prompt and writing tokens; ``continuation_probability`` says how strongly a prompt steers the first words.
Plain ``generate`` throughout: a caller that wants the CPU plug-in opens it around the call.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers import LogitsProcessorList

from course_utils.lesson.token_lengths import render_prompt


@dataclass(frozen=True)
class Generation:
    """One completion: its text, its token count (end-of-sequence not counted), and whether it was cut."""

    text: str
    tokens: int
    truncated: bool  # stopped at max_new_tokens without an end-of-sequence token


def _eos_ids(model: Any, tokenizer: Any) -> set[int]:
    ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids.update(configured if isinstance(configured, list) else [configured] if configured is not None else [])
    if not ids:
        raise ValueError("Neither the tokenizer nor the model's generation config names an end-of-sequence token")
    return ids


def _greedy_config(model: Any, max_new_tokens: int, pad_id: int) -> Any:
    """A copy of the model's generation config set to plain greedy decoding.

    A copy, so the model is left as it was; sampling settings (temperature, top_p, top_k) are cleared, so
    transformers does not warn that they are ignored under greedy decoding.
    """
    config = copy.deepcopy(model.generation_config)
    config.do_sample, config.temperature, config.top_p, config.top_k = False, None, None, None
    config.max_new_tokens, config.pad_token_id = max_new_tokens, pad_id
    return config


def _split_at_eos(new_ids: list[int], eos: set[int]) -> tuple[list[int], bool]:
    """The generated ids up to (not including) the first EOS, and whether there was no EOS (truncated)."""
    for position, token in enumerate(new_ids):
        if token in eos:
            return new_ids[:position], False
    return new_ids, True


def _check_conversations(conversations: Any, max_new_tokens: Any) -> None:
    if isinstance(conversations, (str, Mapping)) or (conversations and isinstance(conversations[0], Mapping)):
        raise TypeError("conversations must be a list of chats (each a list of messages); wrap one chat as [messages]")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be a positive whole number, got {max_new_tokens!r}")


def _pad_id(tokenizer: Any) -> int:
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    if pad_id is None:
        raise ValueError("The tokenizer has neither a pad token nor an EOS token; set tokenizer.pad_token first")
    return pad_id


class DecodeTimer:
    """Splits ``generate``'s time into reading the prompt (prefill) and writing tokens (decoding), batch after batch.

    ``generate`` calls its logits processors once per new token, after the model's forward for that token:
    the first call comes right after the prompt was read, the last after the last token. Passing this as a
    logits processor (it returns the scores untouched) times both phases without a second pass. Why it
    matters: tokens per second over the whole call counts the prompt's reading as if it were writing, so a
    model that learned to answer shorter looks slower per token.
    """

    def __init__(self) -> None:
        self.prefill_seconds = 0.0
        self.decode_seconds = 0.0
        self.batches = 0
        self._started: float | None = None
        self._first: float | None = None
        self._last: float | None = None

    def start(self) -> None:
        """Call right before ``generate``."""
        self._started, self._first, self._last = time.perf_counter(), None, None

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        now = time.perf_counter()
        self._first = self._first if self._first is not None else now
        self._last = now
        return scores

    def stop(self) -> None:
        """Call right after ``generate``: adds this batch's two phases to the totals."""
        if self._started is None:
            raise RuntimeError("DecodeTimer.stop() without start(): call start() right before generate")
        end = time.perf_counter()
        first = self._first if self._first is not None else end
        self.prefill_seconds += first - self._started
        self.decode_seconds += end - first
        self.batches += 1
        self._started = None


def _generate(
    model: Any,
    tokenizer: Any,
    conversations: Sequence[Sequence[Mapping[str, str]]],
    config: Any,
    timer: DecodeTimer | None = None,
) -> list[Generation]:
    """One batch through the chat template, left-padded, in eval mode and inference mode; cut at the first EOS."""
    eos = _eos_ids(model, tokenizer)
    texts = tokenizer.apply_chat_template([list(c) for c in conversations], add_generation_prompt=True, tokenize=False)
    inputs = tokenizer(texts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False)
    inputs = inputs.to(model.device)
    was_training = model.training
    model.eval()
    extra = {"logits_processor": LogitsProcessorList([timer])} if timer is not None else {}
    try:
        with torch.inference_mode():
            if timer is not None:
                timer.start()
            output = model.generate(**inputs, generation_config=config, **extra)
            if timer is not None:
                timer.stop()
    finally:
        model.train(was_training)
    generations = []
    for new_ids in output[:, inputs["input_ids"].shape[1] :].tolist():
        kept, truncated = _split_at_eos(new_ids, eos)
        generations.append(Generation(tokenizer.decode(kept, skip_special_tokens=True), len(kept), truncated))
    return generations


def greedy_generate(
    model: Any,
    tokenizer: Any,
    conversations: Sequence[Sequence[Mapping[str, str]]],
    max_new_tokens: int = 256,
    timer: DecodeTimer | None = None,
) -> list[Generation]:
    """The model's greedy (reproducible) reply to each chat, generated as one batch; the course's one generator.

    The chat template opens the assistant turn; the tokenizer pads on the left (``padding_side="left"``:
    generation appends on the right, so every prompt must end where the new tokens start). The model is
    put in eval mode for the call and restored after. Plain ``generate``: evaluation makes it faster on a CPU
    around the call with the plug-in its caller hands it (``speedups.for_generation``). A ``DecodeTimer`` splits
    the time into prefill and decoding.
    """
    _check_conversations(conversations, max_new_tokens)
    if not conversations:
        return []
    config = _greedy_config(model, max_new_tokens, _pad_id(tokenizer))
    return _generate(model, tokenizer, conversations, config, timer)


def _sampling_config(model: Any, max_new_tokens: int, pad_id: int, temperature: float, top_p: float) -> Any:
    """A copy of the model's generation config set to plain sampling (no top-k): how GRPOTrainer samples."""
    config = copy.deepcopy(model.generation_config)
    config.do_sample, config.temperature, config.top_p, config.top_k = True, temperature, top_p, None
    config.max_new_tokens, config.pad_token_id = max_new_tokens, pad_id
    return config


def sample_generate(
    model: Any,
    tokenizer: Any,
    conversations: Sequence[Sequence[Mapping[str, str]]],
    num_samples: int,
    max_new_tokens: int = 256,
    *,
    temperature: float = 1.0,
    top_p: float = 1.0,
    seed: int = 0,
) -> list[list[Generation]]:
    """``num_samples`` sampled replies to each chat, as GRPO samples a group: one list per chat.

    Each chat is repeated ``num_samples`` times in a row, as TRL's sampler lays out a group (so the CPU
    plug-in reads each prompt once), with TRL's defaults (``temperature=1.0``, ``top_p=1.0``, no top-k).
    ``seed`` seeds torch first: the same model, chats and seed give the same samples.
    """
    _check_conversations(conversations, max_new_tokens)
    if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1:
        raise ValueError(f"num_samples must be a positive whole number, got {num_samples!r}")
    if not (isinstance(temperature, (int, float)) and temperature > 0) or not (0 < top_p <= 1):
        raise ValueError(f"temperature must be > 0 and top_p in (0, 1], got {temperature!r} and {top_p!r}")
    if not conversations:
        return []
    torch.manual_seed(seed)
    config = _sampling_config(model, max_new_tokens, _pad_id(tokenizer), float(temperature), float(top_p))
    repeated = [chat for chat in conversations for _ in range(num_samples)]
    flat = _generate(model, tokenizer, repeated, config)
    return [flat[i : i + num_samples] for i in range(0, len(flat), num_samples)]


def continuation_probability(model: Any, tokenizer: Any, messages: list[dict[str, str]], continuation: str) -> float:
    """Probability that the model's reply to ``messages`` starts with ``continuation`` (one forward pass).

    Cheaper and more telling than sampling: it shows how strongly a prompt steers the model towards,
    say, ``"<reasoning>"`` as its first words, before any training.
    """
    if not continuation:
        raise ValueError("continuation must be a non-empty string")
    prompt_ids = tokenizer(render_prompt(tokenizer, messages), add_special_tokens=False)["input_ids"]
    continuation_ids = tokenizer(continuation, add_special_tokens=False)["input_ids"]
    ids = torch.tensor([prompt_ids + continuation_ids], device=model.device)
    with torch.inference_mode():
        log_probs = torch.log_softmax(model(ids).logits[0, :-1].float(), dim=-1)
    targets = ids[0, len(prompt_ids) :]
    picked = log_probs[len(prompt_ids) - 1 :].gather(1, targets.unsqueeze(1))
    return float(picked.sum().exp())
