"""Each new token drawn by inverse CDF in two steps: one uniform number per row and step.

transformers samples each token with ``torch.multinomial``, whose CPU kernel draws an exponential number for every
entry of the vocabulary. :func:`inverse_cdf_sample` draws from the same distribution through running sums over
block totals and one block; :func:`sampling_by_inverse_cdf` routes ``torch.multinomial`` through it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F

SAMPLING_BLOCK = 256  # entries per block of the vocabulary in the two-step draw


def _blocks_and_totals(probs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``probs`` (rows, vocabulary) as (rows, blocks, SAMPLING_BLOCK), zero-padded, and each block's total."""
    rows, vocabulary = probs.shape
    padding = -vocabulary % SAMPLING_BLOCK
    blocks = (F.pad(probs, (0, padding)) if padding else probs).reshape(rows, -1, SAMPLING_BLOCK)
    accumulate = torch.float64 if probs.dtype == torch.float64 else torch.float32  # 256 entries: fp32 holds the sum
    return blocks, blocks.sum(-1, dtype=accumulate).double()


def _draw_from_running_sum(running: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """For each row, the first index whose running sum passes a uniform number times the row's total."""
    totals = running[:, -1:]
    drawn = torch.rand(totals.shape, dtype=torch.float64, generator=generator, device=running.device) * totals
    return torch.searchsorted(running, drawn, right=True).clamp_(max=running.shape[-1] - 1)


def _draw_in_blocks(blocks: torch.Tensor, totals: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    block = _draw_from_running_sum(totals.cumsum(-1), generator)
    chosen = blocks[torch.arange(blocks.shape[0], device=blocks.device), block.squeeze(1)]
    return block * SAMPLING_BLOCK + _draw_from_running_sum(chosen.double().cumsum(-1), generator)


def inverse_cdf_sample(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One index per row of ``probs`` (rows, vocabulary), drawn with probability proportional to each entry.

    Two draws by inverse CDF, one uniform number each: a block of ``SAMPLING_BLOCK`` entries in proportion to
    its total, then an entry of that block in proportion to its probability. P(block) x P(entry | block) is the
    entry's share of the row, so the distribution is that of one draw over the whole row, and the running sums
    cover the block totals and one block rather than the whole vocabulary. Running sums are kept in float64;
    an entry (or block) of probability 0 is never drawn.
    """
    return _draw_in_blocks(*_blocks_and_totals(probs), generator)


@contextmanager
def sampling_by_inverse_cdf() -> Iterator[None]:
    """Inside: ``torch.multinomial(probs, 1)`` on CPU rows draws through :func:`inverse_cdf_sample`.

    transformers samples each new token with ``torch.multinomial``, whose CPU kernel draws an exponential number
    for every vocabulary entry. Other calls (several samples,
    bad probabilities, another device) go to ``torch.multinomial`` itself, errors included. The block totals
    drawn from also check the rows, so the vocabulary is read twice per token.
    """
    multinomial = torch.multinomial

    def draw(
        probs: torch.Tensor,
        num_samples: int,
        replacement: bool = False,
        *,
        generator: torch.Generator | None = None,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        one_cpu_draw_per_row = num_samples == 1 and probs.dim() == 2 and probs.device.type == "cpu" and out is None
        if one_cpu_draw_per_row and probs.numel() > 0 and bool(probs.min() >= 0):  # NaN and negatives fail
            blocks, totals = _blocks_and_totals(probs)
            row_totals = totals.sum(-1)  # finite and positive in every row: what torch.multinomial accepts
            if bool(torch.isfinite(row_totals).all() and (row_totals > 0).all()):
                return _draw_in_blocks(blocks, totals, generator)
        return multinomial(probs, num_samples, replacement, generator=generator, out=out)

    torch.multinomial = draw
    try:
        yield
    finally:
        torch.multinomial = multinomial
