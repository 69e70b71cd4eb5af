"""Which training problems can the lab learn from? The warm start's pass@8 on GSM8K train problems, by difficulty.

GRPO learns only from groups whose rewards differ. For the correctness reward that means a problem the model
solves *sometimes*: a group of 8 that is all wrong (or all right) gives zero advantages. This script draws 8
samples per problem from the profile's warm-started model, exactly as training draws a group, on training
problems bucketed by the number of steps of their worked solution (``lesson.data_checks.solution_steps``), and
prints per bucket: greedy-free pass@1 and pass@8, and the share of problems solved sometimes (0 < right < 8),
which is the share of groups whose correctness reward is not constant (``1 - frac_reward_zero_std`` for it).

With ``--screen N`` it draws a group for each of the first N problems the lab would train on instead, and writes
the ones solved sometimes to ``data/problem_lists/<profile>.json`` (``training.problem_choice``): the list that a
profile's ``problem_list`` names. The list and the output record how they were made.

With ``--rescreen`` it draws ``--samples`` again for each problem of the profile's list and writes the list back,
each problem's right samples counted over both screens, most often solved first: a few samples per problem find the
candidates cheaply, more of them measure each rate, and a profile that trains on the first ``train_size`` of the
list then trains on the problems whose groups most often hold a right answer.

    python scripts/choose_problems.py --profile cpu --per-bucket 24 --output benchmarks/problem_choice.txt
    python scripts/choose_problems.py --profile cpu-long --screen 1000 --samples 4
    python scripts/choose_problems.py --profile cpu-long --rescreen --samples 16
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path
from typing import Any

from course_utils import cpu_speed
from course_utils.core.hardware import cpu_precision, machine_summary
from course_utils.core.profiles import Profile, get_profile
from course_utils.evaluation.sampling import evaluate_sampled
from course_utils.evaluation.variants import starting_model
from course_utils.lesson.data import load_gsm8k
from course_utils.lesson.data_checks import solution_steps
from course_utils.training import problem_choice

REPO = Path(__file__).resolve().parents[1]
# The CPU plug-in (appendix 99): the same warm start and samples, faster on a CPU; COURSE_CPU_SPEEDUPS=0 turns it off
SPEEDUPS = cpu_speed


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="cpu", help="the profile whose warm start is measured")
    parser.add_argument("--per-bucket", type=int, default=24, help="problems per number of solution steps")
    parser.add_argument("--steps", type=int, nargs="+", default=[1, 2, 3, 4, 5, 6], help="the buckets measured")
    parser.add_argument("--samples", type=int, default=8, help="samples per problem (a GRPO group)")
    parser.add_argument("--max-new-tokens", type=int, default=None, help="default: the profile's completion length")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", type=Path, default=None, help="also write the lines to this file")
    parser.add_argument("--screen", type=int, default=None, metavar="N",
                        help="draw a group for each of the first N lab problems; list those solved sometimes")
    parser.add_argument("--rescreen", action="store_true",
                        help="draw --samples again for each problem of the profile's list; most often solved first")
    args = parser.parse_args(argv)
    if args.rescreen and args.screen:
        parser.error("--screen N makes a list and --rescreen measures an existing one again: give one of them")
    return args


def bucketed_problems(dataset: object, steps: list[int], per_bucket: int) -> dict[int, list[int]]:
    """The first ``per_bucket`` row indices of each number of solution steps, in file order."""
    buckets: dict[int, list[int]] = {s: [] for s in steps}
    for index, reasoning in enumerate(dataset["reasoning"]):
        count = solution_steps(reasoning)
        if count in buckets and len(buckets[count]) < per_bucket:
            buckets[count].append(index)
        if all(len(found) == per_bucket for found in buckets.values()):
            break
    return buckets


def bucket_lines(step: int, result: dict) -> list[str]:
    """The ``name: value`` lines of one bucket."""
    records = result["records"]
    samples = result["samples"]
    sometimes = len(problem_choice.sometimes_solved(records)) / len(records)
    return [
        f"steps_{step}_problems: {len(records)}",
        f"steps_{step}_pass1: {result['pass@1']:.3f}",
        f"steps_{step}_pass{samples}: {result[f'pass@{samples}']:.3f}",
        f"steps_{step}_solved_sometimes: {sometimes:.3f}",
        f"steps_{step}_correctness_zero_std: {1 - sometimes:.3f}",
    ]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    profile = get_profile(args.profile)
    made_by = f"python scripts/choose_problems.py {' '.join(argv if argv is not None else sys.argv[1:])}"
    lines = [f"measured_on: {datetime.datetime.now(datetime.UTC).strftime('%Y-%m-%d %H:%M UTC')}"]
    lines += [f"{name}: {value}" for name, value in machine_summary().items()]
    lines += [f"cpu_precision_reason: {cpu_precision().reason}", f"profile: {profile.name}", f"made_by: {made_by}",
              f"samples_per_problem: {args.samples}", f"temperature: {profile.temperature}"]  # fmt: skip
    print("\n".join(lines), flush=True)
    settings = {"samples": args.samples, "ks": (1, args.samples), "prompts_per_batch": max(1, 32 // args.samples),
                "max_new_tokens": args.max_new_tokens or profile.max_completion_length,
                "temperature": profile.temperature, "seed": args.seed}  # fmt: skip
    if args.rescreen:
        lines += rescreen(profile, settings, made_by)
    else:
        lines += screen(profile, args.screen, settings, made_by) if args.screen else by_steps(profile, args, settings)
    if args.output:
        args.output.write_text("\n".join(lines) + "\n")
    return 0


def by_steps(profile: Profile, args: argparse.Namespace, settings: dict[str, Any]) -> list[str]:
    """The warm start's pass@k on training problems, bucket by bucket of solution steps."""
    start = starting_model(profile, SPEEDUPS)
    train = load_gsm8k("train", formatted=True, verbose=False)
    train = train.select(range(len(train) - profile.warm_start_examples))  # the warm start's own rows left out
    lines = []
    for step, indices in bucketed_problems(train, args.steps, args.per_bucket).items():
        if not indices:
            print(f"steps_{step}_problems: 0", flush=True)  # no training problem has this many steps
            lines.append(f"steps_{step}_problems: 0")
            continue
        result = evaluate_sampled(start.model, start.tokenizer, train.select(indices), speedups=SPEEDUPS, **settings)
        new = [*bucket_lines(step, result), f"steps_{step}_seconds: {result['elapsed_seconds']:.0f}"]
        print("\n".join(new), flush=True)
        lines += new
    return lines


def screen(profile: Profile, count: int, settings: dict[str, Any], made_by: str) -> list[str]:
    """A group for each of the first ``count`` problems the lab would train on; the list of those solved sometimes."""
    start = starting_model(profile.override(problem_list=None, train_size=count), SPEEDUPS)
    result = evaluate_sampled(start.model, start.tokenizer, start.dataset, speedups=SPEEDUPS, **settings)
    facts = {"profile": profile.name, "max_new_tokens": settings["max_new_tokens"], "seed": settings["seed"],
             "temperature": settings["temperature"], "precision_path": cpu_precision().path,
             "screened_pass1": round(result["pass@1"], 4)}  # fmt: skip
    listing = problem_choice.problem_list(list(start.dataset["question"]), result["records"], made_by, **facts)
    path = problem_choice.problem_list_path(profile.name)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(listing, indent=1) + "\n")
    chosen, samples = len(listing["problems"]), result["samples"]
    lines = [f"screened_problems: {len(result['records'])}", f"screened_pass1: {result['pass@1']:.3f}",
             f"screened_pass{samples}: {result[f'pass@{samples}']:.3f}", f"screened_solved_sometimes: {chosen}",
             f"screened_correctness_zero_std: {1 - chosen / len(result['records']):.3f}",
             f"screened_seconds: {result['elapsed_seconds']:.0f}",
             f"list_written: {path.relative_to(REPO)}"]  # fmt: skip
    print("\n".join(lines), flush=True)
    return lines


def rescreen(profile: Profile, settings: dict[str, Any], made_by: str) -> list[str]:
    """Every problem of the profile's list sampled again; the list written back, most often solved first."""
    if profile.problem_list is None:
        raise SystemExit(f"profile {profile.name!r} names no problem_list: --rescreen measures a list again")
    earlier = problem_choice.load_problem_list(profile.problem_list)
    start = starting_model(profile.override(train_size=len(earlier["problems"])), SPEEDUPS)
    result = evaluate_sampled(start.model, start.tokenizer, start.dataset, speedups=SPEEDUPS, **settings)
    facts = {"profile": profile.name, "max_new_tokens": settings["max_new_tokens"], "seed": settings["seed"],
             "temperature": settings["temperature"], "precision_path": cpu_precision().path,
             "screened_pass1": round(result["pass@1"], 4)}  # fmt: skip
    listing = problem_choice.rescreened_list(earlier, list(start.dataset["question"]), result["records"], made_by,
                                             **facts)  # fmt: skip
    path = problem_choice.problem_list_path(profile.problem_list)
    path.write_text(json.dumps(listing, indent=1) + "\n")
    rates = [p["correct_samples"] for p in listing["problems"]][: profile.train_size]
    lines = [f"rescreened_problems: {len(result['records'])}", f"rescreened_pass1: {result['pass@1']:.3f}",
             f"rescreened_solved_again: {sum(r['correct_samples'] > 0 for r in result['records'])}",
             f"list_correct_of_{listing['samples_per_problem']}_first_{len(rates)}: {rates}",
             f"rescreened_seconds: {result['elapsed_seconds']:.0f}",
             f"list_written: {path.relative_to(REPO)}"]  # fmt: skip
    print("\n".join(lines), flush=True)
    return lines


if __name__ == "__main__":
    sys.exit(main())
