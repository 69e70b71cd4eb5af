"""Prompts and reference solutions measured in tokens, as the model receives them (chat template applied).

``render_prompt`` shows the exact text the model sees; ``prompt_token_lengths`` / ``rows_with_short_prompts``
give the prompt cap of the ``cpu`` lab; ``token_length_stats`` / ``reference_length_percentile`` /
``recommended_completion_length`` size ``max_completion_length`` so that a model can finish the solutions the
reference writes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from course_utils.core.answer_format import SYSTEM_PROMPT, XML_TEMPLATE
from course_utils.lesson.formatting import GSM8KFormatError, data_source, parse_row


def render_prompt(tokenizer: Any, messages: list[dict[str, str]]) -> str:
    """The exact text the model sees: the chat template applied, with the assistant turn opened."""
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def count_tokens(tokenizer: Any, texts: Sequence[str]) -> list[int]:
    """Token counts of already-rendered texts (no special tokens added: the template wrote them)."""
    if not texts:
        return []
    encoded = tokenizer(list(texts), add_special_tokens=False, return_attention_mask=False)  # ids only: no masks
    return [len(ids) for ids in encoded["input_ids"]]


def prompt_token_lengths(tokenizer: Any, prompts: Sequence[list[dict[str, str]]]) -> list[int]:
    """Token count of each chat prompt as the model receives it: template applied, assistant turn opened."""
    if not prompts:
        return []
    rendered = tokenizer.apply_chat_template(list(prompts), tokenize=False, add_generation_prompt=True)
    return count_tokens(tokenizer, rendered)


def rows_with_short_prompts(lengths: Sequence[int], max_tokens: int, limit: int | None = None) -> list[int]:
    """Indices, in order, of the rows whose prompt has at most ``max_tokens`` tokens (the first ``limit`` of them).

    A filter, never a truncation: a GSM8K question cut short loses the numbers it needs, and its gold
    answer no longer follows from what the model reads.
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be a positive number of tokens, got {max_tokens}")
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be a positive number of rows or None, got {limit}")
    kept = [index for index, length in enumerate(lengths) if length <= max_tokens]
    return kept[:limit] if limit is not None else kept


@dataclass(frozen=True)
class TokenLengthStats:
    """Token lengths per row: the rendered prompt, the reference reasoning, and the XML wrapper around it."""

    prompt_lengths: list[int] = field(repr=False)
    reasoning_lengths: list[int] = field(repr=False)
    xml_overhead: int

    def percentile(self, which: str, q: float) -> int:
        """The ``q``-th percentile of ``"prompt"`` or ``"reasoning"`` lengths: at least ``q`` % of rows fit in it.

        ``method="higher"`` (an observed length, never an interpolated one below it) keeps that promise
        on small datasets too: with linear interpolation, the 90th percentile of the 48-row sample fits
        fewer than 90 % of its rows.
        """
        values = {"prompt": self.prompt_lengths, "reasoning": self.reasoning_lengths}.get(which)
        if values is None:
            raise ValueError(f"which must be 'prompt' or 'reasoning', got {which!r}")
        if not 0 <= q <= 100:
            raise ValueError(f"q must be a percentile between 0 and 100, got {q}")
        return int(np.percentile(values, q, method="higher"))

    def fraction_truncated(self, completion_length: int) -> float:
        """Share of reference solutions (reasoning plus XML wrapper) longer than ``completion_length`` tokens."""
        needed = [length + self.xml_overhead for length in self.reasoning_lengths]
        return sum(length > completion_length for length in needed) / len(needed)

    def summary(self, qs: Sequence[float] = (50, 90, 95, 99, 100)) -> dict[str, dict[str, int]]:
        """``{"prompt": {"p50": ..., ...}, "reasoning": {...}}``, ready for ``pandas.DataFrame``."""
        return {which: {f"p{q:g}": self.percentile(which, q) for q in qs} for which in ("prompt", "reasoning")}


def _texts_for_lengths(dataset: Any) -> tuple[list[list[dict[str, str]]], list[str], list[str]]:
    """Prompts, reference reasonings and gold answers from raw or formatted rows."""
    rows = dataset.to_list() if hasattr(dataset, "to_list") else list(dataset)
    if not rows:
        raise ValueError("Cannot measure token lengths of an empty dataset.")
    first = rows[0] if isinstance(rows[0], dict) else {}
    if "prompt" in first and "reasoning" in first:
        return [r["prompt"] for r in rows], [r["reasoning"] for r in rows], [r["answer"] for r in rows]
    if "prompt" in first:
        raise ValueError(
            f"Token lengths need raw GSM8K rows (question, answer) or format_gsm8k output (prompt, reasoning); "
            f"got columns {sorted(first)}. A trainer dataset without 'reasoning' has no reference solutions."
        )
    parsed = []
    for index, row in enumerate(rows):
        good, problem = parse_row(index, row, SYSTEM_PROMPT)
        if problem is not None:
            raise GSM8KFormatError(f"Cannot measure {problem.described(data_source(dataset))}. Fix the row or drop it "
                                   "with format_gsm8k(lenient=True).")  # fmt: skip
        parsed.append(good)
    return [r["prompt"] for r in parsed], [r["reasoning"] for r in parsed], [r["answer"] for r in parsed]


def token_length_stats(dataset: Any, tokenizer: Any) -> TokenLengthStats:
    """Token lengths of every prompt (through the chat template) and every reference reasoning.

    ``dataset`` holds raw GSM8K rows or ``format_gsm8k`` output. The XML overhead is the wrapper
    ``<reasoning>...</reasoning><answer>...</answer>`` around the longest gold answer, plus the end
    token: what a completion needs on top of its reasoning to earn the format rewards.
    """
    prompts, reasonings, answers = _texts_for_lengths(dataset)
    prompt_lengths = prompt_token_lengths(tokenizer, prompts)
    reasoning_lengths = count_tokens(tokenizer, reasonings)
    longest_answer = max(answers, key=len)
    overhead = count_tokens(tokenizer, [XML_TEMPLATE.format(reasoning="", answer=longest_answer)])[0] + 1
    return TokenLengthStats(prompt_lengths, reasoning_lengths, overhead)


def reference_length_percentile(dataset: Any, tokenizer: Any, q: float = 90) -> int:
    """The ``q``-th percentile of the reference reasoning lengths in tokens.

    A ``max_completion_length`` below the 90th percentile truncates the model before it can finish
    more than one solution in ten the way the reference does, and a truncated completion has no
    ``<answer>``: zero reward. Preflight checks compare the setting against this number. Raw GSM8K rows
    work too (the reasoning is the part before ``####``).
    """
    return token_length_stats(dataset, tokenizer).percentile("reasoning", q)


def recommended_completion_length(stats: TokenLengthStats, q: float = 90, multiple: int = 16) -> int:
    """``max_completion_length`` that fits the ``q``-th percentile reference reasoning plus the XML wrapper.

    Rounded up to a ``multiple`` of tokens. Reference solutions are terse (and their ``<<...>>`` notes
    are not what a model writes), so treat this as a floor: a model's reasoning is usually longer.
    """
    if multiple < 1:
        raise ValueError(f"multiple must be a positive number of tokens, got {multiple}")
    needed = stats.percentile("reasoning", q) + stats.xml_overhead
    return math.ceil(needed / multiple) * multiple
