"""TRL's log-probabilities over the output head on a CPU, with the forward pass's logits kept for the backward.

TRL scores each completion token with a log-softmax over the whole vocabulary, in tiles of positions x vocabulary
chunk, so that the (positions x vocabulary) logits never exist at once. Its backward pass computes every tile again:
a third pass over the output head, the price of that memory saving. On a GPU with thousands of positions the
logits would take gigabytes; a CPU micro-batch of a few hundred completion tokens keeps them in tens of megabytes
(300 positions x 49,152 entries: 59 MB in fp32, 30 MB in bf16).

:func:`logit_tiles_kept` has TRL's fused log-prob forward keep each tile for its backward, within a memory budget
(larger calls, and calls off the CPU, get TRL's own function). The forward runs TRL's own tile products and folds,
so the log-probabilities and entropies are TRL's, bit for bit; the backward runs TRL's own tile fold on the kept
tiles. TRL sums the gradient's products in fp32; for bf16 tiles and head, which its CPU path converts to fp32 first,
the product runs in oneDNN's bf16 kernels instead, which multiply bf16 numbers exactly and sum in fp32 (the same
sums, in another order). TRL's tile folds are called by keyword (``cpu_speed.versions`` checks their parameters).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import trl.kernels.chunked_logprob as trl_logprob
import trl.trainer.utils as trl_utils

from course_utils.core import speedups
from course_utils.core.speedups import KEPT_TILES_BUDGET_BYTES as KEPT_TILES_BUDGET_BYTES
from course_utils.core.speedups import kept_tiles_bytes as kept_tiles_bytes

# The autograd function TRL's fused log-prob forward applies, and the tile folds and product it runs
TRL_LOGPROB_FUNCTION = "_ChunkedLogProbFunction"
TRL_PARTS = ("_forward_tile", "_backward_tile", "_addmm_fp32", "OPTIONAL_OUTPUTS", "TOKEN_CHUNK_SIZE", "_BLOCK_SIZE")


def tiles_fit(positions: int, vocab_size: int, bytes_per_logit: float, budget: int = KEPT_TILES_BUDGET_BYTES) -> bool:
    """Whether a call of ``positions`` keeps its tiles: one token chunk of TRL's, within ``budget`` bytes."""
    return speedups.tiles_fit(positions, vocab_size, bytes_per_logit, trl_logprob.TOKEN_CHUNK_SIZE, budget)


def compute_dtype(hidden: torch.Tensor) -> torch.dtype:
    """The dtype TRL computes the logit tiles in on the CPU: autocast's, else the hidden states'."""
    return torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else hidden.dtype


def keeps_tiles(hidden: torch.Tensor, weight: torch.Tensor, budget: int = KEPT_TILES_BUDGET_BYTES) -> bool:
    """Whether this call keeps its tiles: on the CPU, and :func:`tiles_fit` in the dtype the tiles are computed in."""
    bytes_per_logit = torch.empty((), dtype=compute_dtype(hidden)).element_size()
    return hidden.device.type == "cpu" and tiles_fit(hidden.shape[0], weight.shape[0], bytes_per_logit, budget)


def bf16_math_product(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """``acc += a @ b`` for bf16 ``a`` and ``b`` into an fp32 ``acc``, in oneDNN's bf16 kernels: fp32 sums.

    Their fp32 copies hold the same numbers, so oneDNN reads them back as bf16 without rounding; where the CPU has no
    bf16 kernels oneDNN keeps to fp32 math. The setting it changes is restored, even on an error.
    """
    matmul = torch.backends.mkldnn.matmul
    before = matmul.fp32_precision
    matmul.fp32_precision = "bf16"
    try:
        acc.addmm_(a.float(), b.float())
    finally:
        matmul.fp32_precision = before


def head_product(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """``acc += a @ b`` summed in fp32: bf16 factors on the CPU in bf16 kernels, anything else as TRL does."""
    if acc.device.type == "cpu" and acc.dtype == torch.float32 and a.dtype == b.dtype == torch.bfloat16:
        bf16_math_product(acc, a, b)
    else:
        trl_logprob._addmm_fp32(acc=acc, a=a, b=b)


def _kernel_args(temperature: float, softcapping: float | None, logit_scale: float) -> dict[str, Any]:
    """The transform TRL's tile folds apply to each logit (scale, optional softcap, temperature)."""
    return {
        "logit_scale": logit_scale,
        "softcap": softcapping or 1.0,
        "inv_t": 1 / temperature,
        "HAS_SOFTCAP": softcapping is not None,
    }


class KeptTilesLogProb(torch.autograd.Function):
    """TRL's ``ChunkedLogProbFunction`` (same arguments, same outputs) with each logit tile kept for the backward."""

    @staticmethod
    def forward(
        ctx: Any,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        targets: torch.Tensor,
        temperature: float,
        chunk_size: int,
        final_logit_softcapping: float | None = None,
        logit_scale: float = 1.0,
        outputs: tuple[str, ...] = trl_logprob.OPTIONAL_OUTPUTS,
    ) -> tuple[torch.Tensor | None, ...]:
        ctx.set_materialize_grads(False)
        positions, vocab, dtype = hidden.shape[0], weight.shape[0], compute_dtype(hidden)
        kernel_args = _kernel_args(temperature, final_logit_softcapping, logit_scale)
        flags = {f"HAS_{name.upper()}": name in outputs for name in trl_logprob.OPTIONAL_OUTPUTS}

        def per_position(fill: float = 0.0) -> torch.Tensor:  # one of the running statistics TRL's fold updates
            return torch.full((positions,), fill, dtype=torch.float32, device=hidden.device)

        running_max, max_before_target = per_position(-math.inf), per_position(-math.inf)
        sum_exp, x_sum_exp, sq_sum_exp, z_sum, target_logit = (per_position() for _ in range(5))
        hidden_chunk = hidden.to(dtype)
        tiles = []
        for start in range(0, vocab, chunk_size):
            end = min(start + chunk_size, vocab)
            tile = torch.mm(hidden_chunk, weight[start:end].to(dtype).t())
            if bias is not None:
                tile.add_(bias[start:end].to(dtype))
            trl_logprob._forward_tile(
                tile=tile,
                tile_stride=tile.stride(0),
                targets=targets,
                running_max=running_max,
                sum_exp=sum_exp,
                x_sum_exp=x_sum_exp,
                sq_sum_exp=sq_sum_exp,
                z_sum=z_sum,
                max_before_target=max_before_target,
                target_logit=target_logit,
                vocab_start=start,
                n_cols=end - start,
                BLOCK_SIZE=trl_logprob._BLOCK_SIZE,
                **flags,
                **kernel_args,
            )
            tiles.append(tile)
        log_z = running_max + torch.log(sum_exp)
        entropy = log_z - x_sum_exp / sum_exp if "entropy" in outputs else None
        log_sum_sq_probs = torch.log(sq_sum_exp) - 2 * torch.log(sum_exp) if "log_sum_sq_probs" in outputs else None
        mean_logits = z_sum / vocab if "mean_logits" in outputs else None
        is_top1 = (target_logit >= running_max) & (target_logit > max_before_target) if "is_top1" in outputs else None
        ctx.save_for_backward(hidden, weight, bias, targets, log_z, log_z if entropy is None else entropy, *tiles)
        ctx.chunk_size, ctx.kernel_args = chunk_size, kernel_args
        ctx.mark_non_differentiable(*(x for x in (log_sum_sq_probs, mean_logits, is_top1) if x is not None))
        return target_logit - log_z, entropy, log_sum_sq_probs, mean_logits, is_top1

    @staticmethod
    def backward(ctx: Any, grad_logprobs: torch.Tensor | None, grad_entropy: torch.Tensor | None, *_: Any) -> tuple:
        # A second backward through the same call fails here: its tiles hold the first one's gradients now
        hidden, weight, bias, targets, log_z, entropy, *tiles = ctx.saved_tensors
        wants_hidden, wants_weight, wants_bias = ctx.needs_input_grad[:3]
        dtype = tiles[0].dtype
        grad_hidden = torch.zeros(hidden.shape, dtype=torch.float32) if wants_hidden else None
        grad_weight = torch.zeros(weight.shape, dtype=torch.float32) if wants_weight else None
        grad_bias = torch.zeros(bias.shape, dtype=torch.float32) if wants_bias else None
        hidden_chunk = hidden.to(dtype)
        grad_logprobs = None if grad_logprobs is None else grad_logprobs.float().contiguous()
        grad_entropy = None if grad_entropy is None else grad_entropy.float().contiguous()
        for tile, start in zip(tiles, range(0, weight.shape[0], ctx.chunk_size), strict=True):
            end = start + tile.shape[1]
            trl_logprob._backward_tile(
                tile=tile,
                tile_stride=tile.stride(0),
                targets=targets,
                log_z=log_z,
                entropy=entropy,
                grad_logprobs=log_z if grad_logprobs is None else grad_logprobs,
                grad_entropy=log_z if grad_entropy is None else grad_entropy,
                vocab_start=start,
                n_cols=end - start,
                HAS_LOGPROB_GRAD=grad_logprobs is not None,
                HAS_ENTROPY_GRAD=grad_entropy is not None,
                BLOCK_SIZE=trl_logprob._BLOCK_SIZE,
                **ctx.kernel_args,
            )
            if grad_hidden is not None:
                head_product(grad_hidden, tile, weight[start:end].to(dtype))
            if grad_weight is not None:
                head_product(grad_weight[start:end], tile.t(), hidden_chunk)
            if grad_bias is not None:
                grad_bias[start:end] += tile.sum(dim=0, dtype=torch.float32)
        return (
            None if grad_hidden is None else grad_hidden.to(hidden.dtype),
            None if grad_weight is None else grad_weight.to(weight.dtype),
            None if grad_bias is None else grad_bias.to(bias.dtype),
            *([None] * 6),
        )


class _KeepTilesWhereTheyFit:
    """What TRL's fused forward applies inside :func:`logit_tiles_kept`: kept tiles where they fit, else TRL's."""

    def __init__(self, trls: Any, budget: int) -> None:
        self.trls, self.budget = trls, budget

    def apply(self, hidden: torch.Tensor, weight: torch.Tensor, *args: Any) -> Any:
        function = KeptTilesLogProb if keeps_tiles(hidden, weight, self.budget) else self.trls
        return function.apply(hidden, weight, *args)


def trl_has_logprob_parts() -> bool:
    """Whether this TRL has the log-prob function and tile parts :func:`logit_tiles_kept` builds on (TRL 1.16)."""
    return hasattr(trl_utils, TRL_LOGPROB_FUNCTION) and all(hasattr(trl_logprob, name) for name in TRL_PARTS)


@contextmanager
def logit_tiles_kept(budget: int = KEPT_TILES_BUDGET_BYTES) -> Iterator[None]:
    """Inside: TRL's fused log-prob forward keeps its logit tiles for the backward, on the CPU, within ``budget``."""
    if not isinstance(budget, int) or budget < 0:
        raise ValueError(f"budget must be a number of bytes (an int >= 0), got {budget!r}")
    if not trl_has_logprob_parts():
        raise RuntimeError(
            f"This TRL lacks trl.trainer.utils.{TRL_LOGPROB_FUNCTION} or one of trl.kernels.chunked_logprob's "
            f"{', '.join(TRL_PARTS)}: install the course's pinned TRL (make setup), or leave the part keep_logit_tiles "
            "out (cpu_speed.enabled's parts=)."
        )
    original = getattr(trl_utils, TRL_LOGPROB_FUNCTION)
    setattr(trl_utils, TRL_LOGPROB_FUNCTION, _KeepTilesWhereTheyFit(original, budget))
    try:
        yield
    finally:
        setattr(trl_utils, TRL_LOGPROB_FUNCTION, original)
