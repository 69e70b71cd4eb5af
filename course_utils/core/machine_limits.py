"""What this machine's memory and arithmetic allow a decoding step: the ceiling for the lab's generation.

Decoding one token for a batch of ``B`` completions reads every weight of the model once (the tied output head reads
the whole embedding matrix) and does about ``2 x parameters x B`` floating-point operations. So a step takes at
least the longer of ``weight bytes / memory bandwidth`` and ``operations / matmul throughput``, and ``B`` divided by
that is the most tokens per second this machine can decode, whatever the software. ``measure_limits`` measures both
rates here with one thread and with every core, and ``decode_limit`` turns them into that ceiling; ``make bench``
prints the lab's measured speed as a fraction of it (``generate_fraction_of_limit``).

torch is imported on first use, as in ``core.hardware``: core loads without it.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any

BANDWIDTH_MB = 512  # far larger than any cache, so the sum streams from memory
MATMUL_SIZE = 1024
REPEATS = 5
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class MachineLimits:
    """Read bandwidth (GB/s) and matmul throughput (GFLOP/s, in ``dtype``), measured per thread count."""

    threads: int
    dtype: str
    bandwidth_gb_s: dict[int, float]
    matmul_gflop_s: dict[int, float]


def _torch() -> Any:
    import torch  # inside on purpose: core loads without torch (see the module docstring)

    return torch


def _median_seconds(run: Any, repeats: int = REPEATS) -> float:
    run()  # a warm-up: first touches of the memory and kernel selection are not the rate
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def read_bandwidth_gb_s(megabytes: int = BANDWIDTH_MB) -> float:
    """GB/s of reading a float32 tensor of ``megabytes`` once (a sum), with torch's current thread count."""
    torch = _torch()
    if megabytes < 64:
        raise ValueError(f"megabytes must be at least 64 (larger than the caches), got {megabytes}")
    data = torch.ones(megabytes * 2**20 // 4)
    seconds = _median_seconds(lambda: data.sum())
    return megabytes * 2**20 / seconds / 1e9


def matmul_gflop_s(dtype: str = "float32", size: int = MATMUL_SIZE) -> float:
    """GFLOP/s of a ``size`` x ``size`` matrix product in ``dtype``, with torch's current thread count."""
    torch = _torch()
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"dtype must be one of {sorted(DTYPE_BYTES)}, got {dtype!r}")
    left = torch.randn(size, size).to(getattr(torch, dtype))
    right = torch.randn(size, size).to(getattr(torch, dtype))
    seconds = _median_seconds(lambda: left @ right)
    return 2 * size**3 / seconds / 1e9


def measure_limits(dtype: str = "float32", threads: int | None = None) -> MachineLimits:
    """Bandwidth and matmul throughput with one thread and with ``threads`` (default: torch's), torch restored after."""
    torch = _torch()
    before = torch.get_num_threads()
    threads = threads or before
    bandwidth, gflops = {}, {}
    try:
        for count in sorted({1, threads}):
            torch.set_num_threads(count)
            bandwidth[count] = read_bandwidth_gb_s()
            gflops[count] = matmul_gflop_s(dtype)
    finally:
        torch.set_num_threads(before)
    return MachineLimits(threads, dtype, bandwidth, gflops)


def decode_limit(parameters: int, dtype: str, batch: int, bandwidth_gb_s: float, gflop_s: float) -> dict[str, float]:
    """The fastest decoding these rates allow: seconds per step from memory and from arithmetic, and tokens/s.

    ``parameters`` are the weights read per step (all of them: the output head reads the whole embedding), stored in
    ``dtype``; ``batch`` completions share each read.
    """
    if parameters < 1 or batch < 1 or bandwidth_gb_s <= 0 or gflop_s <= 0:
        raise ValueError(
            f"parameters and batch must be >= 1 and the rates > 0, got parameters={parameters}, batch={batch}, "
            f"bandwidth {bandwidth_gb_s} GB/s, {gflop_s} GFLOP/s"
        )
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"dtype must be one of {sorted(DTYPE_BYTES)}, got {dtype!r}")
    memory_seconds = parameters * DTYPE_BYTES[dtype] / (bandwidth_gb_s * 1e9)
    arithmetic_seconds = 2 * parameters * batch / (gflop_s * 1e9)
    return {
        "memory_seconds_per_step": memory_seconds,
        "arithmetic_seconds_per_step": arithmetic_seconds,
        "tokens_per_second": batch / max(memory_seconds, arithmetic_seconds),
    }
