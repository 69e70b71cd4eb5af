"""core.machine_limits: the decoding ceiling a machine's bandwidth and arithmetic set, and their measurement."""

from __future__ import annotations

import pytest
import torch

from course_utils.core.machine_limits import decode_limit, matmul_gflop_s, measure_limits, read_bandwidth_gb_s


def test_a_memory_bound_step_reads_the_weights_once_per_token_of_the_group():
    # 100M fp32 weights = 0.4 GB at 20 GB/s: 20 ms a step; arithmetic 2 x 100M x 8 at 1000 GFLOP/s: 1.6 ms
    limit = decode_limit(100_000_000, "float32", 8, bandwidth_gb_s=20.0, gflop_s=1000.0)
    assert limit["memory_seconds_per_step"] == pytest.approx(0.02)
    assert limit["arithmetic_seconds_per_step"] == pytest.approx(0.0016)
    assert limit["tokens_per_second"] == pytest.approx(8 / 0.02)


def test_bf16_halves_the_bytes_and_a_slow_core_makes_the_step_arithmetic_bound():
    fp32 = decode_limit(100_000_000, "float32", 8, bandwidth_gb_s=20.0, gflop_s=1e6)
    bf16 = decode_limit(100_000_000, "bfloat16", 8, bandwidth_gb_s=20.0, gflop_s=1e6)
    assert bf16["tokens_per_second"] == pytest.approx(2 * fp32["tokens_per_second"])
    slow = decode_limit(100_000_000, "float32", 64, bandwidth_gb_s=1000.0, gflop_s=10.0)
    assert slow["tokens_per_second"] == pytest.approx(64 / (2 * 100_000_000 * 64 / 10e9))


@pytest.mark.parametrize(
    "arguments",
    [(0, "float32", 8, 20.0, 100.0), (10, "float32", 0, 20.0, 100.0), (10, "float32", 8, 0.0, 100.0),
     (10, "float32", 8, 20.0, -1.0), (10, "int4", 8, 20.0, 100.0)],
)  # fmt: skip
def test_impossible_inputs_are_refused(arguments):
    with pytest.raises(ValueError, match="must be"):
        decode_limit(*arguments)


def test_the_measurements_are_positive_rates_and_refuse_what_would_mislead():
    assert read_bandwidth_gb_s(64) > 0 and matmul_gflop_s("float32", size=128) > 0
    with pytest.raises(ValueError, match="at least 64"):
        read_bandwidth_gb_s(8)  # a cache-sized tensor measures the cache, not the memory
    with pytest.raises(ValueError, match="dtype must be one of"):
        matmul_gflop_s("float64")


def test_measuring_restores_torch_threads():
    before = torch.get_num_threads()
    limits = measure_limits("float32", threads=2)
    assert torch.get_num_threads() == before
    assert set(limits.bandwidth_gb_s) == {1, 2} == set(limits.matmul_gflop_s)
