"""Generation on held-out problems: the test split, notebook 02's validation split, and the trained model.

Generation is greedy (reproducible), through the chat template, batched with left padding, and sorted by prompt
length so that each batch pads as little as possible (the original order is restored afterwards). Both loops end
in ``metrics.score_completions``, so batching changes the speed and nothing else.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from numbers import Integral
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from course_utils.core.profiles import get_profile
from course_utils.core.speedups import NO_SPEEDUPS, SpeedUps
from course_utils.evaluation.metrics import score_completions
from course_utils.lesson.data import load_gsm8k, load_splits, train_val_split
from course_utils.lesson.generation import DecodeTimer, Generation, greedy_generate
from course_utils.lesson.token_lengths import prompt_token_lengths
from course_utils.training.trained_model import load_trained_model


def rows_to_evaluate(dataset: Any) -> list[dict[str, Any]]:
    """The evaluation rows as dicts, checked: each needs a chat ``prompt`` and a gold ``answer``.

    A bad row is named as a person counts (row 1 is the first) and with the data's source, where the dataset has one.
    """
    rows = [dict(row) for row in dataset]
    source = getattr(getattr(dataset, "info", None), "description", None)
    where = f" of {source}" if source else ""
    if not rows:
        raise ValueError(f"The evaluation dataset{where} is empty: pass at least one problem")
    for number, row in enumerate(rows, start=1):
        prompt, answer = row.get("prompt"), row.get("answer")
        if not isinstance(prompt, list) or not prompt or not all(isinstance(m, Mapping) for m in prompt):
            raise ValueError(
                f"row {number}{where} has no chat 'prompt' (a list of messages); use load_gsm8k(..., formatted=True) "
                "or format_gsm8k(dataset) to build one"
            )
        if answer is None or not str(answer).strip():
            raise ValueError(f"row {number}{where} has no gold 'answer'; every evaluated problem needs one")
    return rows


def _question(row: Mapping[str, Any]) -> str:
    if isinstance(row.get("question"), str):
        return row["question"]
    users = [m.get("content", "") for m in row["prompt"] if m.get("role") == "user"]
    return users[-1] if users else ""


def _check_generation_args(batch_size: int, max_new_tokens: int) -> None:
    for name, value in (("batch_size", batch_size), ("max_new_tokens", max_new_tokens)):
        if isinstance(value, bool) or not isinstance(value, Integral) or value < 1:
            raise ValueError(f"{name} must be a positive whole number, got {value!r}")


def _progress_bar(total: int, enabled: bool, description: str) -> Any:
    return tqdm(total=total, disable=not enabled, desc=description, unit="problem")


def evaluate_model(
    model: Any,
    tokenizer: Any,
    dataset: Any,
    *,
    batch_size: int = 16,
    max_new_tokens: int = 256,
    progress: bool = True,
    sort_by_length: bool = True,
    confidence: float = 0.95,
    description: str = "evaluating",
    speedups: SpeedUps = NO_SPEEDUPS,
) -> dict[str, Any]:
    """Greedy, batched evaluation of ``model`` on ``dataset`` (rows with a chat ``prompt`` and a gold ``answer``).

    Prompts go through ``tokenizer.apply_chat_template(..., add_generation_prompt=True)``, are sorted by length
    (``sort_by_length``) so each batch pads little, left-padded (generation appends on the right), and generated
    under ``torch.inference_mode`` (through ``speedups.for_generation`` where the caller hands the plug-in,
    ``speedups=cpu_speed``: the same tokens, faster on a CPU); the order of ``records`` is the dataset's. A
    generation that reaches ``max_new_tokens`` without an end-of-sequence token counts as truncated. Returns
    ``score_completions``'s dict, timed over the whole loop (tokenizing, generating, decoding), plus ``batch_size``,
    ``max_new_tokens``, and the two phases of generation apart (``lesson.generation.DecodeTimer``): ``prefill_seconds``
    (reading the prompts), ``decode_seconds`` and ``decode_tokens_per_second`` (writing the answers).
    """
    _check_generation_args(batch_size, max_new_tokens)
    rows = rows_to_evaluate(dataset)
    started = time.perf_counter()
    prompts = [row["prompt"] for row in rows]
    lengths = prompt_token_lengths(tokenizer, prompts) if sort_by_length else [0] * len(rows)
    order = sorted(range(len(rows)), key=lambda i: -lengths[i])  # stable: unsorted when every length is 0
    generations: list[Generation | None] = [None] * len(rows)
    timer = DecodeTimer()
    with _progress_bar(len(rows), progress, description) as bar, speedups.for_generation(model):
        for start in range(0, len(order), batch_size):
            batch = order[start : start + batch_size]
            outputs = greedy_generate(model, tokenizer, [prompts[i] for i in batch], max_new_tokens, timer)
            for i, generation in zip(batch, outputs, strict=True):
                generations[i] = generation
            bar.update(len(batch))
    elapsed = time.perf_counter() - started
    return _score_generations(rows, generations, elapsed, confidence) | _phases(timer, generations) | {
        "batch_size": batch_size,
        "max_new_tokens": max_new_tokens,
    }


def _phases(timer: DecodeTimer, generations: Sequence[Generation | None]) -> dict[str, float]:
    """Reading the prompts apart from writing the answers: seconds of each, and tokens written per decoding second."""
    tokens = sum(g.tokens for g in generations if g is not None)
    return {
        "prefill_seconds": timer.prefill_seconds,
        "decode_seconds": timer.decode_seconds,
        "decode_tokens_per_second": tokens / timer.decode_seconds if timer.decode_seconds > 0 else math.nan,
    }


def _score_generations(
    rows: list[Any], generations: Sequence[Generation | None], elapsed: float, confidence: float
) -> dict[str, Any]:
    """Score generated texts against their rows' gold answers: the one place both generation loops end."""
    done = [g for g in generations if g is not None]
    return score_completions(
        [g.text for g in done],
        [str(row["answer"]) for row in rows],
        questions=[_question(row) for row in rows],
        truncated=[g.truncated for g in done],
        completion_tokens=[g.tokens for g in done],
        elapsed_seconds=elapsed,
        confidence=confidence,
    )


def evaluate_one_at_a_time(
    model: Any,
    tokenizer: Any,
    dataset: Any,
    *,
    max_new_tokens: int = 256,
    progress: bool = True,
    confidence: float = 0.95,
    speedups: SpeedUps = NO_SPEEDUPS,
) -> dict[str, Any]:
    """The popular tutorial's loop, one problem per ``generate`` call: kept only as the speed baseline.

    It renders the chat template to text, tokenizes that one prompt, generates greedily, decodes, and moves on,
    so the hardware works on a single sequence at a time. Scored by the same ``score_completions``, so its
    metrics are comparable with ``evaluate_model``'s; only the speed should differ.
    """
    _check_generation_args(1, max_new_tokens)
    rows = rows_to_evaluate(dataset)
    started = time.perf_counter()
    timer = DecodeTimer()
    with speedups.for_generation(model):  # as evaluate_model generates: only the batching differs
        generations = [
            greedy_generate(model, tokenizer, [row["prompt"]], max_new_tokens, timer)[0]
            for row in tqdm(rows, disable=not progress, desc="one at a time", unit="problem")
        ]
    elapsed = time.perf_counter() - started
    return _score_generations(rows, generations, elapsed, confidence) | _phases(timer, generations) | {
        "batch_size": 1,
        "max_new_tokens": max_new_tokens,
    }


def load_for_evaluation(profile: Any = None, folder: str | Path | None = None) -> tuple[Any, Any]:
    """The trained model and tokenizer (``training.load_trained_model``), a LoRA adapter merged in where it can be.

    Merging (``merge_and_unload``) makes generation run at the base model's speed, so the speed comparison
    measures what GRPO changed (longer answers, say), not the overhead of unmerged LoRA layers.
    """
    model, tokenizer = load_trained_model(profile, folder)
    return merged_unless_quantized(model).eval(), tokenizer


def merged_unless_quantized(model: Any) -> Any:
    """A LoRA model merged into its base weights, except on a 4- or 8-bit base, where the adapter stays beside it.

    Why not on a quantized base: merging re-quantizes the weights with the update added (peft warns of rounding
    errors), so the model evaluated would not be the one trained. Unmerged, the ``colab-t4`` run is evaluated as
    it trained, at the cost of the adapters' extra products in each generated token.
    """
    if not hasattr(model, "merge_and_unload"):
        return model
    if getattr(model, "is_loaded_in_4bit", False) or getattr(model, "is_loaded_in_8bit", False):
        return model
    return model.merge_and_unload()


def test_problems(profile: Any = None) -> Any:
    """The profile's ``eval_size`` first GSM8K test problems, formatted (never used for training or choices)."""
    return load_gsm8k("test", formatted=True, limit=get_profile(profile).eval_size)


HELDOUT_SIZE = 200


def heldout_set(size: int = HELDOUT_SIZE) -> Any:
    """The held-out problems a run's before/after is judged on: the first ``size`` GSM8K test problems, in file order.

    A rule fixed before training that consults no model: the test split is never trained on nor used to choose
    anything, so the warm start and the GRPO model meet these problems fresh.
    """
    if isinstance(size, bool) or not isinstance(size, Integral) or size < 1:
        raise ValueError(f"size must be a positive whole number of problems, got {size!r}")
    return load_gsm8k("test", formatted=True, limit=size, verbose=False)


def validation_problems(profile: Any = None, exclude: Any = None, size: int | None = None) -> Any:
    """Notebook 02's validation split (saved, else rebuilt with the same seed), minus questions in ``exclude``.

    The split holds out a fifth of the *train* split; ``exclude`` (a dataset with ``question``, or questions)
    removes any problem the run trained on, so the curve measures unseen problems. ``size`` defaults to the
    profile's ``eval_size``.
    """
    p = get_profile(profile)
    try:
        validation = load_splits()["validation"]
    except FileNotFoundError:
        validation = train_val_split(load_gsm8k("train", formatted=True, verbose=False), 0.2, 42)["validation"]
    if exclude is not None:
        seen = set(exclude["question"] if hasattr(exclude, "column_names") else exclude)
        validation = validation.filter(lambda row: row["question"] not in seen)
    size = p.eval_size if size is None else size
    return validation.select(range(min(size, len(validation))))
