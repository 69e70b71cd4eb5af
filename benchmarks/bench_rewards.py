"""Benchmark: score 10,000 completions with all five corrected rewards (target: < 1 s on 2 CPU cores).

Prints ``name: value`` lines. The completions are varied like a real GRPO batch: strict and sloppy
formats, right and wrong answers, ``1,000``-style and LaTeX answers (which go to math-verify), junk
and conversational messages. Unique texts per completion (a counter inside the reasoning) so no
cache hides the per-completion cost (a fresh batch for every timed run).

Run: ``.venv/bin/python benchmarks/bench_rewards.py``
"""

from __future__ import annotations

import itertools
import random
import time

from course_utils.lesson.rewards import REWARD_FUNCS, answers_match, classic

N = 10_000
_SEEDS = itertools.count(1)  # every batch is new: math-verify's cache never sees a repeat
# (weight, template): mostly what a model in training writes; LaTeX answers (math-verify's slow path) are rare.
TEMPLATES = [
    (30, "<reasoning>\nStep {i}: {a} * {b} = {p}\n</reasoning>\n<answer>\n{p}\n</answer>\n"),
    (20, "<reasoning>\nStep {i}.\nThen {a} * {b} = {p}.\n</reasoning>\n<answer>\n{pc}\n</answer>"),
    (15, "<reasoning>{i}: {a}*{b}</reasoning> <answer>{w}</answer>"),
    (15, "The product of {a} and {b} is {p} (case {i})."),
    (14, "<reasoning>\nCase {i}, {a} times {b}\n</reasoning>\n<answer>\n{p}.00\n</answer>\nHope this helps!"),
    (5, "<reasoning>\nCase {i}, {a} times {b}\n</reasoning>\n<answer>\n{p} dollars\n</answer>"),
    (1, "<reasoning>\nCase {i}\n</reasoning>\n<answer>\n\\frac{{{p2}}}{{2}}\n</answer>"),
]


def make_batch(n: int, seed: int = 0) -> tuple[list, list[str]]:
    """``n`` unique completions (a counter inside each) and their gold answers; every other one conversational."""
    rng = random.Random(seed)
    weights, templates = zip(*TEMPLATES, strict=True)
    completions, answers = [], []
    for i in range(n):
        a, b = rng.randint(2, 99), rng.randint(2, 99)
        p = a * b
        template = rng.choices(templates, weights)[0]
        text = template.format(i=i, a=a, b=b, p=p, pc=f"{p:,}", w=p + 1, p2=2 * p + seed * 1_000_000)
        completions.append([{"role": "assistant", "content": text}] if i % 2 else text)
        answers.append(str(p + seed * 500_000) if "frac" in template else str(p))
    return completions, answers


def time_fresh(funcs, repeats: int = 3) -> float:
    """Best of ``repeats`` runs, each on a fresh batch (new seed), so math-verify's cache never helps."""
    best = float("inf")
    for _ in range(repeats):
        completions, answers = make_batch(N, next(_SEEDS))
        start = time.perf_counter()
        for func in funcs:
            func(prompts=None, completions=completions, answer=answers)
        best = min(best, time.perf_counter() - start)
    return best


def time_once(func, completions, answers=None) -> float:
    start = time.perf_counter()
    func(prompts=None, completions=completions, answer=answers)
    return time.perf_counter() - start


def main() -> None:
    answers_match("\\frac{4}{2}", "2")  # import math-verify and sympy once, outside the timing
    print(f"rewards_10k_completions_seconds: {time_fresh(REWARD_FUNCS):.3f}")
    for func in REWARD_FUNCS:
        print(f"{func.__name__}_10k_seconds: {time_fresh([func]):.3f}")
    print(f"classic_rewards_10k_completions_seconds: {time_fresh(classic.REWARD_FUNCS):.3f}")
    adversarial = ["<reasoning></reasoning><answer>" * 1_000]  # 31 kB on one line, no </answer>
    print(
        f"classic_soft_format_31kb_adversarial_seconds: {time_once(classic.soft_format_reward_func, adversarial):.3f}"
    )
    print(f"corrected_soft_format_31kb_adversarial_seconds: {time_once(REWARD_FUNCS[3], adversarial):.5f}")


if __name__ == "__main__":
    main()
