"""Evaluation throughput: batched ``evaluate_model`` against the tutorial's one-problem-per-``generate`` loop.

Same model (the ``cpu`` profile's offline SmolLM2), same GSM8K test problems, same ``max_new_tokens`` (by default
the ``cpu`` profile's ``eval_max_new_tokens``, what notebook 05 generates), greedy in both. Target:
``eval_speedup_vs_one_at_a_time`` of at least 3 on the CPU. Reading the prompts (prefill) and writing the answers
(decoding) are timed apart: ``eval_decode_tokens_per_second`` and ``eval_prefill_seconds`` for each loop. The
machine may be shared, so run it twice before trusting a number.

Threads: one by default (``--threads 0`` keeps torch's default, one per core). On a shared 2-core machine, torch's
default thread pool waits on busy cores and both loops run 3-10x slower (a 48-token run did not finish in 10
minutes with 2 threads at load 5, and took 2 minutes with 1); one thread gives numbers that can be compared.

Prints `name: value` lines. Run with `make bench` or `python benchmarks/bench_evaluation.py [--problems N ...]`.
"""

from __future__ import annotations

import argparse

import torch

from course_utils import cpu_speed
from course_utils.core.profiles import get_profile
from course_utils.evaluation.heldout import evaluate_model, evaluate_one_at_a_time
from course_utils.lesson.data import load_gsm8k
from course_utils.lesson.models import load_model_and_tokenizer


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problems", type=int, default=16, help="GSM8K test problems (the first N)")
    parser.add_argument("--max-new-tokens", type=int, default=get_profile("cpu").eval_max_new_tokens,
                        help="generation budget per problem, both loops (default: the cpu profile's)")
    parser.add_argument("--batch-size", type=int, default=16, help="evaluate_model's batch size")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (0: torch's default)")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    print(f"eval_torch_threads: {torch.get_num_threads()}", flush=True)
    model, tokenizer = load_model_and_tokenizer("cpu")
    problems = load_gsm8k("test", formatted=True, limit=args.problems, verbose=False)
    # Both loops generate through the CPU plug-in, as the notebooks do: only the batching differs
    settings = {"max_new_tokens": args.max_new_tokens, "progress": False, "speedups": cpu_speed}
    evaluate_model(model, tokenizer, problems.select(range(2)), batch_size=2, **settings)  # warm-up, not timed
    print(f"eval_problems: {len(problems)}")
    print(f"eval_max_new_tokens: {args.max_new_tokens}")
    batched = evaluate_model(model, tokenizer, problems, batch_size=args.batch_size, **settings)
    print(f"eval_problems_per_second: {batched['problems_per_second']:.3f}")
    print(f"eval_tokens_per_second: {batched['tokens_per_second']:.1f}")
    print(f"eval_decode_tokens_per_second: {batched['decode_tokens_per_second']:.1f}")
    print(f"eval_prefill_seconds: {batched['prefill_seconds']:.1f}", flush=True)
    loop = evaluate_one_at_a_time(model, tokenizer, problems, **settings)
    print(f"eval_one_at_a_time_problems_per_second: {loop['problems_per_second']:.3f}")
    print(f"eval_one_at_a_time_tokens_per_second: {loop['tokens_per_second']:.1f}")
    print(f"eval_one_at_a_time_decode_tokens_per_second: {loop['decode_tokens_per_second']:.1f}")
    print(f"eval_one_at_a_time_prefill_seconds: {loop['prefill_seconds']:.1f}")
    same = sum(a["completion"] == b["completion"] for a, b in zip(batched["records"], loop["records"], strict=True))
    print(f"eval_speedup_vs_one_at_a_time: {batched['problems_per_second'] / loop['problems_per_second']:.2f}")
    print(f"eval_same_completions_fraction: {same / batched['n']:.2f}")  # padding may change a few greedy tokens
    print(f"eval_accuracy_batched_vs_loop: {batched['accuracy']:.3f} vs {loop['accuracy']:.3f}")


if __name__ == "__main__":
    main()
