"""The full variants table of notebook 07: every variant x several seeds, then the reward hack and its fix.

Prints `name: value` lines (the machine first) and writes the per-run table to <output>/variants.csv and the
lines to <output>/variants.txt, which notebook 07 reads. `make variants` runs it on the cpu profile; on a
2-core machine the full 30 steps x 9 variants x 2 seeds take hours, so `--steps` lowers the step count (the
same for every variant) and the lines say what ran.

    python scripts/variants.py --profile cpu --steps 10 --seeds 0 1
"""

from __future__ import annotations

import argparse
import datetime
import time
from pathlib import Path

from course_utils.hardware import cpu_precision, machine_summary
from course_utils.monitoring import monitor, save_run_artifacts
from course_utils.profiles import get_profile
from course_utils.variants import (
    VARIANTS,
    differences_from_baseline,
    results_table,
    run_hack,
    run_variant,
    seed_summary,
    starting_model,
    write_results,
)

REPO = Path(__file__).resolve().parents[1]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="cpu")
    parser.add_argument("--steps", type=int, default=None, help="GRPO steps per run (default: the profile's)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--no-hack", action="store_true", help="skip the reward-hack runs")
    parser.add_argument("--hack-first", action="store_true", help="run the reward hack and its fix before the variants")
    parser.add_argument("--hack-steps", type=int, default=None, help="GRPO steps of the hack runs (default: --steps)")
    parser.add_argument("--eval-size", type=int, default=None, help="held-out problems per run (default: profile's)")
    parser.add_argument("--output", type=Path, default=REPO / "benchmarks")
    return parser.parse_args(argv)


def emit(lines: list[str], name: str, value: object) -> None:
    line = f"{name}: {value}"
    print(line, flush=True)
    lines.append(line)


def record(run, runs: list, lines: list[str], output: Path, note: str = "") -> None:
    """Keep a finished run: artifacts, its `name: value` line, the results files rewritten (cut short, it stays)."""
    runs.append(run)
    save_run_artifacts(run.log_history, run.run_dir)
    row = run.row()
    emit(
        lines,
        f"variant_{run.name}_seed{run.seed}",
        f"final_reward {row['final_reward']:.3f}, strict_format {row['strict_format']:.3f}, "
        f"accuracy {row['accuracy']:.3f}, {row['steps']} steps, {row['seconds']:.0f} s{note}",
    )
    write_results(runs, output)
    (output / "variants.txt").write_text("\n".join(lines) + "\n")


def run_variants(args, profile, steps: int, start, runs: list, lines: list[str]) -> None:
    for seed in args.seeds:  # seed-major: a cut-short run still has every variant at the first seed
        for name in args.variants:
            record(
                run_variant(name, profile=profile, seed=seed, max_steps=steps, start=start), runs, lines, args.output
            )


def run_hacks(args, profile, steps: int, start, runs: list, lines: list[str]) -> None:
    for fixed in (False, True):
        run = run_hack(fixed, profile=profile, seed=args.seeds[0], max_steps=steps, start=start)
        rules = sorted({finding.code for finding in monitor(run.log_history)}) or ["none"]
        record(run, runs, lines, args.output, note=f", rules fired: {', '.join(rules)}")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    profile = get_profile(args.profile)
    if args.eval_size:
        profile = profile.override(eval_size=args.eval_size)
    steps = args.steps or profile.max_steps
    lines: list[str] = []
    emit(lines, "measured_on", datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"))
    for name, value in machine_summary().items():
        emit(lines, name, value)
    emit(lines, "cpu_precision_reason", cpu_precision().reason)
    emit(lines, "variants_profile", profile.name)
    emit(lines, "variants_steps", steps)
    emit(lines, "variants_hack_steps", "none" if args.no_hack else args.hack_steps or steps)
    emit(lines, "variants_seeds", " ".join(map(str, args.seeds)))
    emit(lines, "variants_eval_problems", profile.eval_size)
    runs: list = []
    started = time.perf_counter()
    start = starting_model(profile)
    hack_steps = args.hack_steps or steps
    if not args.no_hack and args.hack_first:
        run_hacks(args, profile, hack_steps, start, runs, lines)
    run_variants(args, profile, steps, start, runs, lines)
    if not args.no_hack and not args.hack_first:
        run_hacks(args, profile, hack_steps, start, runs, lines)
    table = results_table(runs)
    summary = seed_summary(table[~table["variant"].str.startswith("hack")])
    for name, row in summary.iterrows():
        emit(
            lines,
            f"summary_{name}",
            f"{int(row['seeds'])} seeds, final_reward {row['final_reward']:.3f} ± {row['final_reward_spread']:.3f}, "
            f"strict_format {row['strict_format']:.3f} ± {row['strict_format_spread']:.3f}, "
            f"accuracy {row['accuracy']:.3f} ± {row['accuracy_spread']:.3f} (spread = max - min)",
        )
    if "dapo" in set(table["variant"]):
        gaps = differences_from_baseline(table[~table["variant"].str.startswith("hack")])
        real = gaps[gaps["real"]]
        emit(
            lines,
            "real_differences_from_dapo",
            "; ".join(f"{r.variant} {r.metric} {r.gap:+.3f}" for r in real.itertuples()) or "none",
        )
    emit(lines, "variants_total_seconds", round(time.perf_counter() - started))
    (args.output / "variants.txt").write_text("\n".join(lines) + "\n")
    print(f"written: {write_results(runs, args.output)}, its curves and {args.output / 'variants.txt'}")


if __name__ == "__main__":
    main()
