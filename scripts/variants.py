"""The full variants table of notebook 07: every variant x several seeds, then the reward hack and its fix.

Prints `name: value` lines (the machine first). The variants go to <output>/<table>.csv, <table>_logs.csv and
<table>.txt (`--table`, default `variants`); the reward hack and its fix to hack.csv, hack_logs.csv,
hack_completions.csv and hack.txt. Notebook 07 reads them. `make variants` runs it on the cpu profile; on a 2-core
machine the full 30 steps x 10 variants x 2 seeds take hours, so `--steps` lowers the step count (the same for
every variant) and the lines say what ran.

    python scripts/variants.py --profile cpu --steps 10 --seeds 0 1
    python scripts/variants.py --profile cpu --no-variants --hack-steps 20   # the reward hack only
    python scripts/variants.py --steps 10 --eval-size 50 --variants dapo gdpo --no-hack --table variants_gdpo
"""

from __future__ import annotations

import argparse
import datetime
import shlex
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from course_utils import cpu_speed
from course_utils.core.hardware import cpu_precision, machine_summary
from course_utils.core.profiles import get_profile
from course_utils.evaluation.reward_hack import HACK_TXT, run_hack, write_hack_results
from course_utils.evaluation.variant_tables import (
    FULL_TABLE,
    differences_from_baseline,
    results_table,
    seed_summary,
    table_files,
    write_results,
)
from course_utils.evaluation.variants import BASELINE, VARIANTS, run_variant, starting_model
from course_utils.training.monitoring import monitor
from course_utils.training.run_logs import save_run_artifacts

REPO = Path(__file__).resolve().parents[1]
# The CPU plug-in (appendix 99): the same training and sampling, faster on a CPU; COURSE_CPU_SPEEDUPS=0 turns it off
SPEEDUPS = cpu_speed


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="cpu")
    parser.add_argument("--steps", type=int, default=None, help="GRPO steps per run (default: the profile's)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--no-variants", action="store_true", help="skip the variants table (the reward hack only)")
    parser.add_argument("--no-hack", action="store_true", help="skip the reward-hack runs")
    parser.add_argument("--hack-first", action="store_true", help="run the reward hack and its fix before the variants")
    parser.add_argument("--hack-steps", type=int, default=None, help="GRPO steps of the hack runs (default: --steps)")
    parser.add_argument("--eval-size", type=int, default=None, help="held-out problems per run (default: profile's)")
    parser.add_argument("--output", type=Path, default=REPO / "benchmarks")
    parser.add_argument("--table", default=FULL_TABLE, help="name of the variants' files (default: %(default)s)")
    return parser.parse_args(argv)


@dataclass
class Record:
    """One experiment's runs and `name: value` lines, rewritten to <output> after every run (cut short, it stays)."""

    output: Path
    txt: str
    lines: list[str]
    write: Callable[[list, Path], object]
    runs: list = field(default_factory=list)

    def emit(self, name: str, value: object) -> None:
        line = f"{name}: {value}"
        print(line, flush=True)
        self.lines.append(line)

    def save(self) -> None:
        (self.output / self.txt).write_text("\n".join(self.lines) + "\n")

    def keep(self, run, note: str = "") -> None:
        self.runs.append(run)
        save_run_artifacts(run.log_history, run.run_dir)
        row = run.row()
        self.emit(
            f"variant_{run.name}_seed{run.seed}",
            f"final_reward {row['final_reward']:.3f}, strict_format {row['strict_format']:.3f}, "
            f"accuracy {row['accuracy']:.3f} on {row['problems']} problems, {row['steps']} steps, "
            f"{row['seconds']:.0f} s{note}",
        )
        self.write(self.runs, self.output)
        self.save()


def header(args, profile, steps: int, hack_steps: int) -> list[str]:
    """The machine and the plan, first in both lines files."""
    pairs = [("measured_on", datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"))]
    pairs += list(machine_summary().items())
    pairs += [
        ("cpu_precision_reason", cpu_precision().reason),
        ("variants_command", shlex.join(["python", "scripts/variants.py", *sys.argv[1:]])),
        ("variants_profile", profile.name),
        ("variants_steps", "none" if args.no_variants else steps),
        ("variants_hack_steps", "none" if args.no_hack else hack_steps),
        ("variants_seeds", " ".join(map(str, args.seeds))),
        ("variants_eval_problems", profile.eval_size),
    ]
    lines = [f"{name}: {value}" for name, value in pairs]
    print("\n".join(lines), flush=True)
    return lines


def run_variants(args, profile, steps: int, start, record: Record) -> None:
    for seed in args.seeds:  # seed-major: a cut-short run still has every variant at the first seed
        for name in args.variants:
            record.keep(run_variant(name, profile=profile, seed=seed, max_steps=steps, start=start, speedups=SPEEDUPS))
    table = results_table(record.runs)
    for name, row in seed_summary(table).iterrows():
        record.emit(
            f"summary_{name}",
            f"{int(row['seeds'])} seeds, final_reward {row['final_reward']:.3f} ± {row['final_reward_spread']:.3f}, "
            f"strict_format {row['strict_format']:.3f} ± {row['strict_format_spread']:.3f}, "
            f"accuracy {row['accuracy']:.3f} ± {row['accuracy_spread']:.3f} (spread = max - min)",
        )
    if BASELINE in set(table["variant"]):
        gaps = differences_from_baseline(table)
        real = gaps[gaps["real"]]
        record.emit(
            f"real_differences_from_{BASELINE}",
            "; ".join(f"{r.variant} {r.metric} {r.gap:+.3f}" for r in real.itertuples()) or "none",
        )


def run_hacks(args, profile, steps: int, start, record: Record) -> None:
    for fixed in (False, True):
        run = run_hack(fixed, profile=profile, seed=args.seeds[0], max_steps=steps, start=start, speedups=SPEEDUPS)
        rules = sorted({finding.code for finding in monitor(run.log_history)}) or ["none"]
        record.keep(run, note=f", rules fired: {', '.join(rules)}")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.no_variants and args.no_hack:
        raise SystemExit("--no-variants and --no-hack together leave nothing to run")
    profile = get_profile(args.profile)
    if args.eval_size:
        profile = profile.override(eval_size=args.eval_size)
    steps = args.steps or profile.max_steps
    hack_steps = args.hack_steps or steps
    args.output.mkdir(parents=True, exist_ok=True)
    lines = header(args, profile, steps, hack_steps)
    table_txt = table_files(args.table)[2]
    table = Record(args.output, table_txt, list(lines), lambda runs, folder: write_results(runs, folder, args.table))
    hack = Record(args.output, HACK_TXT, list(lines), write_hack_results)
    started = time.perf_counter()
    start = starting_model(profile, SPEEDUPS)
    if not args.no_hack and args.hack_first:
        run_hacks(args, profile, hack_steps, start, hack)
    if not args.no_variants:
        run_variants(args, profile, steps, start, table)
    if not args.no_hack and not args.hack_first:
        run_hacks(args, profile, hack_steps, start, hack)
    for record in (table, hack):
        if record.runs:
            record.emit("variants_total_seconds", round(time.perf_counter() - started))
            record.save()
            print(f"written: {args.output / record.txt}")


if __name__ == "__main__":
    main()
