"""Memory estimate versus the measured peak of a real GRPOTrainer run on the CPU.

Runs ``course_utils.training.memory_measurement.measure_grpo_step_peak``: two real GRPOTrainer steps in a fresh
Python process, peak resident memory (``VmHWM``) above the post-import baseline, against ``estimate_for_profile``
for the same settings. Prints ``name: value`` lines.

    python benchmarks/bench_memory.py                 # ci sizes, full fine-tuning (the test's setting)
    python benchmarks/bench_memory.py --lora          # ci profile as is (LoRA)
    python benchmarks/bench_memory.py --profile cpu --lora   # the CPU lab as it trains (about a minute)
    python benchmarks/bench_memory.py --head                 # TRL's log-softmax workspace alone
"""

from __future__ import annotations

import argparse

from course_utils import cpu_speed
from course_utils.core.profiles import get_profile
from course_utils.training.memory import memory_table
from course_utils.training.memory_measurement import measure_grpo_step_peak, measure_logprob_workspace
from course_utils.training.memory_parts import GB, logprob_workspace_bytes
from course_utils.training.model_shape import smollm2_spec


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="ci", help="a CPU profile: ci (default) or cpu")
    parser.add_argument(
        "--lora", action="store_true", help="keep the profile's LoRA setting (default: full fine-tuning)"
    )
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--table", action="store_true", help="also print the memory table for the course's hardware")
    parser.add_argument("--head", action="store_true", help="measure TRL's log-softmax workspace alone, then stop")
    args = parser.parse_args()
    if args.head:
        for positions in (400, 1000):
            measured = measure_logprob_workspace(positions=positions)
            estimate = logprob_workspace_bytes(smollm2_spec(), positions, "cpu") / GB
            print(f"logprob_workspace_{positions}_positions_measured_gb: {measured['backward_gb']:.3f}")
            print(f"logprob_workspace_{positions}_positions_estimate_gb: {estimate:.3f}")
        return

    profile = get_profile(args.profile)
    if not args.lora:  # full fine-tuning trains fp32 weights: bf16 ones would lose small updates to rounding
        profile = profile.override(use_lora=False, beta=0.0, train_dtype=None)
    # The CPU lab trains with the plug-in: measure what it runs (COURSE_CPU_SPEEDUPS=0 measures plain TRL)
    result = measure_grpo_step_peak(profile, steps=args.steps, speedups=cpu_speed)
    estimate = result["estimate"]
    print(f"profile: {profile.name} ({'LoRA' if profile.use_lora else 'full fine-tuning'}, {args.steps} steps)")
    print(f"prompt_tokens: {result['prompt_tokens']}")
    print(f"cpu_speedups: {result['speedups']}")
    for part in ("weights_gb", "gradients_gb", "optimizer_gb", "activations_gb", "logprob_gb", "kv_cache_gb"):
        print(f"estimate_{part}: {getattr(estimate, part):.3f}")
    print(f"memory_estimate_gb: {result['estimate_gb']:.3f}")
    print(f"memory_measured_peak_gb: {result['increase_gb']:.3f}")
    print(f"memory_estimate_error_pct: {result['error_pct']:.1f}")
    if args.table:
        print(memory_table().to_string(index=False))


if __name__ == "__main__":
    main()
