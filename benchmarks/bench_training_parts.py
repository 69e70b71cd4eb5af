"""Where a `cpu` GRPO step's time goes, on fixed sequences: generation, the training pass, and the prompt's share.

The lab's own ratio (``bench_training.py``) moves with what the model writes: once it learns short answers,
the fixed prompt weighs more. Here the sequences are fixed, so two settings can be compared directly:

- ``parts_generate_seconds_c{C}``: ``model.generate`` of 8 completions of exactly C tokens (best of 2);
- ``parts_train_seconds_p{P}_c{C}``: TRL's scoring forward + backward over the same 8 sequences of P prompt
  and C completion tokens, in the lab's micro-batches (best of 3);
- ``parts_head_seconds_p{P}_c{C}``: the part of that spent in TRL's chunked log-softmax over the vocabulary
  (TRL scores every position on a CPU, prompt included, unless the CPU speed-ups score the completion tokens only);
- ``parts_step_over_generate_p{P}_c{C}``: 1 + train / generate, the step/generate ratio of such a step;
- ``parts_completion_tokens_only``: whether the log-softmax scored the completion tokens only, as the lab does;
- ``parts_reference_seconds_p{P}_c{C}``: what ``beta > 0`` adds to a step: TRL's reference scoring of the same
  sequences, a forward pass without gradients through the model with its LoRA adapter switched off (best of 3),
  and ``parts_reference_share_p{P}_c{C}``, that time over the step's generate + training pass.

P is the mean prompt length of all GSM8K train problems and of those under the profile's ``max_prompt_tokens``;
C is a short (45) and a full-length (96) completion. Freed memory is reused as while the lab trains
(``course_utils.cpu_speed.cpu_allocator``; ``bench_cpu_allocator.py`` compares with and without).
Run: ``.venv/bin/python benchmarks/bench_training_parts.py``.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch

from course_utils import cpu_speed
from course_utils.core.profiles import get_profile
from course_utils.lesson.data import load_gsm8k
from course_utils.lesson.token_lengths import prompt_token_lengths, rows_with_short_prompts
from course_utils.training import run as training
from course_utils.training.grpo_config import make_grpo_config

COMPLETION_LENGTHS = (45, 96)
SEQUENCES = 8


def _seconds(result: float | tuple[float, ...]) -> float:
    return result[0] if isinstance(result, tuple) else result


def best_of(repeats: int, run: Callable[..., Any], *args: Any) -> Any:
    """The fastest of ``repeats`` runs (by total seconds): the one least disturbed by the rest of the machine."""
    return min((run(*args) for _ in range(repeats)), key=_seconds)


def prompt_lengths_to_compare(tokenizer: Any, cap: int) -> tuple[int, int]:
    """Mean prompt tokens over every train problem, and over those the cap keeps."""
    prompts = load_gsm8k("train", formatted=True, verbose=False)["prompt"]
    lengths = prompt_token_lengths(tokenizer, prompts)
    kept = rows_with_short_prompts(lengths, cap)
    return round(statistics.mean(lengths)), round(statistics.mean(lengths[i] for i in kept))


def time_generate(model: Any, tokenizer: Any, prompt_tokens: int, completion_tokens: int) -> float:
    ids = torch.randint(100, 40_000, (1, prompt_tokens)).repeat(SEQUENCES, 1)
    started = time.perf_counter()
    with torch.no_grad():
        model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=completion_tokens,
            min_new_tokens=completion_tokens,
            do_sample=True,
            pad_token_id=tokenizer.pad_token_id,
        )
    return time.perf_counter() - started


def time_training_pass(trainer: Any, prompt_tokens: int, completion_tokens: int) -> tuple[float, float]:
    """Scoring forward + backward over SEQUENCES sequences in the trainer's micro-batches: (total, head) seconds."""
    from trl.trainer import utils as trl_utils

    model, micro_batch = trainer.model, trainer.args.per_device_train_batch_size
    ids = torch.randint(100, 40_000, (SEQUENCES, prompt_tokens + completion_tokens))
    mask = torch.ones_like(ids)
    head_seconds = 0.0
    function = trl_utils._ChunkedLogProbFunction
    original_forward, original_backward = function.forward, function.backward

    def timed(original: Callable[..., Any]) -> staticmethod:
        """``original`` (the forward or backward of TRL's log-softmax), adding its wall time to ``head_seconds``."""

        def run(*args: Any) -> Any:
            nonlocal head_seconds
            started = time.perf_counter()
            try:
                return original(*args)
            finally:
                head_seconds += time.perf_counter() - started

        return staticmethod(run)

    function.forward, function.backward = timed(original_forward), timed(original_backward)
    try:
        started = time.perf_counter()
        for start in range(0, SEQUENCES, micro_batch):
            with trainer.accelerator.autocast():
                rows = slice(start, start + micro_batch)
                logps, _, _ = trainer._get_per_token_logps_and_entropies(
                    model, ids[rows], mask[rows], completion_tokens, compute_entropy=True
                )
            logps.mean().backward()
        return time.perf_counter() - started, head_seconds
    finally:
        function.forward, function.backward = staticmethod(original_forward), staticmethod(original_backward)


def time_reference_pass(trainer: Any, prompt_tokens: int, completion_tokens: int) -> float:
    """TRL's reference log-probabilities for SEQUENCES sequences: the adapter switched off, no gradients."""
    from trl.trainer.utils import use_adapter

    ids = torch.randint(100, 40_000, (SEQUENCES, prompt_tokens + completion_tokens))
    started = time.perf_counter()
    with torch.no_grad(), use_adapter(trainer.accelerator.unwrap_model(trainer.model), adapter_name=None):
        micro_batch = trainer.args.per_device_train_batch_size
        trainer._get_per_token_logps_and_entropies(
            trainer.model, ids, torch.ones_like(ids), completion_tokens, batch_size=micro_batch
        )
    return time.perf_counter() - started


def main() -> None:
    profile = get_profile("cpu").override(warm_start_examples=0, max_steps=1)
    model, tokenizer = training.load_model_for_training(profile)
    with tempfile.TemporaryDirectory() as folder:
        trainer = training.build_trainer(model, tokenizer, profile, config=make_grpo_config(profile, folder))
        # the plug-in's parts that act on this bench's training passes, as while the lab trains
        parts = ("reuse_freed_memory", "score_completions_only")
        with cpu_speed.enabled(trainer, parts=parts, profile=profile) as speedups:
            print(f"parts_freed_memory_reused: {'reuse_freed_memory' in speedups.active}")
            print(f"parts_completion_tokens_only: {'score_completions_only' in speedups.active}")
            all_mean, capped_mean = prompt_lengths_to_compare(tokenizer, profile.max_prompt_tokens or 10_000)
            print(f"parts_prompt_tokens_all: {all_mean}")
            print(f"parts_prompt_tokens_capped: {capped_mean}")
            time_training_pass(trainer, capped_mean, COMPLETION_LENGTHS[0])  # warm-up: first calls allocate
            for completion in COMPLETION_LENGTHS:
                generate = best_of(2, time_generate, trainer.model, tokenizer, capped_mean, completion)
                print(f"parts_generate_seconds_c{completion}: {generate:.2f}")
                for prompt in (all_mean, capped_mean):
                    total, head = best_of(3, time_training_pass, trainer, prompt, completion)
                    tag = f"p{prompt}_c{completion}"
                    print(f"parts_train_seconds_{tag}: {total:.2f}")
                    print(f"parts_head_seconds_{tag}: {head:.2f}")
                    print(f"parts_step_over_generate_{tag}: {1 + total / generate:.2f}")
                    reference = best_of(3, time_reference_pass, trainer, prompt, completion)
                    print(f"parts_reference_seconds_{tag}: {reference:.2f}")
                    print(f"parts_reference_share_{tag}: {reference / (generate + total):.2f}")


if __name__ == "__main__":
    main()
