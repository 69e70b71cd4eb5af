"""What ``cpu_allocator.reuse_freed_memory`` buys: TRL's CPU log-softmax over the vocabulary, forward + backward.

The shapes are the `cpu` lab's: one micro-batch of 8 completions of 96 tokens (768 positions: the lab scores
the completion tokens only), SmolLM2's hidden size 576 and vocabulary 49,152, in bfloat16. Each setting runs
in its own fresh process, because the C allocator's settings cannot be taken back inside one.

Prints, for ``default`` (glibc as it comes) and ``reuse`` (big freed blocks kept):

- ``allocator_logsoftmax_seconds_{setting}``: one forward + backward (best of 3, after a warm-up);
- ``allocator_page_faults_{setting}``: minor page faults during that call (fresh pages the kernel zero-filled);
- ``allocator_peak_rss_gb_{setting}``: the process's peak resident memory;
- ``allocator_speedup``: default seconds / reuse seconds.

Run: ``.venv/bin/python benchmarks/bench_cpu_allocator.py``.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time

POSITIONS, HIDDEN, VOCAB = 8 * 96, 576, 49_152
VOCAB_TILE = 32_768  # TRL's chunk of the vocabulary (trl.trainer.utils._CHUNKED_LOGPROB_CHUNK_SIZE)
SETTINGS = ("default", "reuse")


def measure(setting: str) -> dict[str, float]:
    """One setting, in this process: seconds and page faults of the fastest of 3 calls, and the peak RSS."""
    import torch
    from trl.kernels.chunked_logprob import ChunkedLogProbFunction

    from course_utils.cpu_speed.cpu_allocator import reuse_freed_memory
    from course_utils.training.memory_measurement import peak_rss_gb

    if setting == "reuse" and not reuse_freed_memory().applied:
        raise SystemExit("reuse_freed_memory is not available on this platform: nothing to compare")
    torch.manual_seed(0)
    hidden = torch.randn(POSITIONS, HIDDEN, dtype=torch.bfloat16, requires_grad=True)
    weight = torch.randn(VOCAB, HIDDEN, dtype=torch.bfloat16) * 0.02
    targets = torch.randint(0, VOCAB, (POSITIONS,))

    def forward_backward() -> tuple[float, int]:
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        started = time.perf_counter()
        log_probs, *_ = ChunkedLogProbFunction.apply(
            hidden, weight, None, targets, 1.0, VOCAB_TILE, None, 1.0, ("entropy",)
        )
        log_probs.sum().backward()
        return time.perf_counter() - started, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults

    forward_backward()  # warm-up: the first call also faults in the weights and the allocator's own pools
    seconds, faults = min(forward_backward() for _ in range(3))
    return {"seconds": seconds, "page_faults": faults, "peak_rss_gb": peak_rss_gb()}


def main() -> None:
    results = {}
    for setting in SETTINGS:
        output = subprocess.run([sys.executable, __file__, setting], check=True, capture_output=True, text=True).stdout
        results[setting] = json.loads(output.strip().splitlines()[-1])
    for setting, figures in results.items():
        print(f"allocator_logsoftmax_seconds_{setting}: {figures['seconds']:.3f}")
        print(f"allocator_page_faults_{setting}: {figures['page_faults']:.0f}")
        print(f"allocator_peak_rss_gb_{setting}: {figures['peak_rss_gb']:.2f}")
    print(f"allocator_speedup: {results['default']['seconds'] / results['reuse']['seconds']:.2f}")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        print(json.dumps(measure(sys.argv[1])))
    else:
        main()
