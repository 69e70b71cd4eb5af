"""Does the `cpu` lab collapse, seed by seed? The lab as notebook 04 runs it, then what the model learned.

Per seed: one lab run (the same warm start, GRPO with that seed, completions logged), then
``training.collapse.collapse_report`` over the last fifth of the steps' completions, the correct share of the
first and last fifth, greedy accuracy on the whole GSM8K test split (a change of a point or two of 200 problems is
within noise: the fixed and broken counts and McNemar's p say whether a change is one), sampled pass@1 on fewer
held-out problems, and sampled pass@1 on the lab's own training problems, each paired against the warm start with a
bootstrap interval.
Prints ``name: value`` lines, ``lab_collapsed_seeds: K of N`` last.

``--set field=value`` changes a profile field for every run (one lever at a time: ``learning_rate=2e-4``,
``reward_weights=(1.0,0,0,0,0)``, ``warm_start_reasoning_lines=8``); ``make bench-collapse`` runs the profile as it is.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import os
import re
import shutil
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from course_utils import cpu_speed
from course_utils.core.hardware import machine_summary
from course_utils.core.paths import repo_root
from course_utils.core.profiles import get_profile
from course_utils.evaluation.curves import load_warm_start_model
from course_utils.evaluation.heldout import evaluate_model, heldout_set, load_for_evaluation
from course_utils.evaluation.sampling import evaluate_sampled, paired_difference
from course_utils.evaluation.stats import mcnemar_exact
from course_utils.evaluation.tables import paired_counts
from course_utils.evaluation.variant_tables import logged_completions, recorded_folder
from course_utils.training import lab, monitoring
from course_utils.training.collapse import collapse_report, first_fifth, last_fifth
from course_utils.training.grpo_prompts import training_dataset

SAMPLES = 8
LAB_SAMPLES = 16  # the lab's 20 problems: 16 samples each, so the paired interval is not mostly sampling noise
SAMPLE_SEED = 1  # fresh draws, as bench_heldout's
SPEEDUPS = cpu_speed  # the CPU plug-in (appendix 99): the same training and samples, faster
TEST_SPLIT_PROBLEMS = 1319  # GSM8K's test split, all of it
EARLIER_GREEDY_PROBLEMS = 200  # the held-out set of the earlier results files, reported too so they compare


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="cpu")
    parser.add_argument("--seeds", default="42,1,2,3", help="GRPO seeds, comma-separated")
    parser.add_argument("--greedy-problems", type=int, default=TEST_SPLIT_PROBLEMS,
                        help="held-out problems, greedy (the first N of the test split; default: all)")
    parser.add_argument("--sampled-problems", type=int, default=50, help="held-out problems, sampled")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="a profile field changed")
    parser.add_argument("--grpo", action="append", default=[], metavar="FIELD=VALUE", help="a GRPOConfig field changed")
    parser.add_argument("--record", nargs=2, metavar=("KEPT_RUN", "NAME"),
                        help="instead of running: write a kept run (build/collapse/<label>/seed_<n>) into "
                             f"notebook 06's {COLLAPSE_LOGS_CSV}, {COLLAPSE_COMPLETIONS_CSV} as NAME")  # fmt: skip
    return parser.parse_args()


COLLAPSE_LOGS_CSV = "collapse_logs.csv"
COLLAPSE_COMPLETIONS_CSV = "collapse_completions.csv"
LOG_COLUMNS = ("step", "reward", "reward_std", "frac_reward_zero_std", "completions/mean_length", "kl",
               "rewards/correctness_reward_func/mean", "rewards/int_reward_func/mean",
               "rewards/strict_format_reward_func/mean", "rewards/soft_format_reward_func/mean",
               "rewards/xmlcount_reward_func/mean")  # fmt: skip


def record(kept: Path, name: str) -> None:
    """Notebook 06's recorded runs: every logged step, and the completions of the first and last fifth of the steps,
    of the kept run under ``name`` (its earlier rows under that name replaced)."""
    logs = pd.read_csv(kept / "log_history.csv")
    facts = machine_summary()
    machine = f"{facts['machine_cpu']} ({facts['machine_cpu_family_model']}), {facts['machine_cores']} cores, " \
              f"{facts['cpu_precision_path']} path"  # fmt: skip
    logs = logs[logs["reward"].notna()].reindex(columns=LOG_COLUMNS).assign(run=name, machine=machine)
    frame = logged_completions(kept)
    steps = list(frame["step"])
    fifths = [("first fifth" if first else "last fifth") if first or last else None
              for first, last in zip(first_fifth(steps), last_fifth(steps), strict=True)]  # fmt: skip
    completions = frame.assign(window=fifths).dropna(subset=["window"])[["step", "window", "prompt", "completion"]]
    for rows, filename in ((logs, COLLAPSE_LOGS_CSV), (completions.assign(run=name), COLLAPSE_COMPLETIONS_CSV)):
        path = recorded_folder() / filename
        earlier = pd.read_csv(path) if path.is_file() else pd.DataFrame(columns=["run"])
        pd.concat([earlier[earlier["run"] != name], rows], ignore_index=True).to_csv(path, index=False)
        print(f"{path}: {len(rows)} rows of run {name!r}")


def field_values(pairs: list[str]) -> dict[str, Any]:
    """``["learning_rate=2e-4", "reward_weights=tuned"]`` as fields and values (Python literals, else strings)."""
    changes = {}
    for pair in pairs:
        name, sep, text = pair.partition("=")
        if not sep or not name:
            raise SystemExit(f"--set and --grpo take FIELD=VALUE, got {pair!r}")
        try:
            changes[name] = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            changes[name] = text
    return changes


def keep_run(run_dir: Any, label: str, seed: int) -> None:
    """Copy the run's logged completions and log history to build/collapse/<label>/seed_<seed> (the next run clears
    the run folder), for notebook 06's recorded collapse."""
    target = repo_root() / "build" / "collapse" / label / f"seed_{seed}"
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(run_dir / "completions", target / "completions")
    shutil.copy2(run_dir / "log_history.csv", target / "log_history.csv")


def run_label(args: argparse.Namespace) -> str:
    return re.sub(r"[^A-Za-z0-9.=,-]+", "_", "+".join(args.set + args.grpo)) or "as-defined"


def sampled(model: Any, tokenizer: Any, problems: Any, profile: Any, samples: int = SAMPLES) -> dict:
    return evaluate_sampled(model, tokenizer, problems, samples=samples, ks=(1,), prompts_per_batch=4,
                            max_new_tokens=profile.max_completion_length, temperature=profile.temperature,
                            seed=SAMPLE_SEED, speedups=SPEEDUPS)  # fmt: skip


def greedy(model: Any, tokenizer: Any, problems: Any, profile: Any) -> dict:
    return evaluate_model(model, tokenizer, problems, batch_size=profile.eval_batch_size,
                          max_new_tokens=profile.max_completion_length, progress=False, speedups=SPEEDUPS)  # fmt: skip


def evaluate(model: Any, tokenizer: Any, sets: Mapping[str, Any], profile: Any) -> dict[str, dict]:
    """Greedy on the held-out set, sampled on the smaller held-out set and on the lab's problems."""
    with contextlib.redirect_stdout(sys.stderr):
        return {
            "greedy": greedy(model, tokenizer, sets["greedy"], profile),
            "heldout": sampled(model, tokenizer, sets["sampled"], profile) if len(sets["sampled"]) else None,
            "lab": sampled(model, tokenizer, sets["lab"], profile, LAB_SAMPLES),
        }


def difference(prefix: str, warm: Mapping[str, Any], grpo: Mapping[str, Any]) -> str:
    d = paired_difference(warm, grpo, "pass@1")
    low, high = d["ci"]
    return f"{prefix}: {warm['pass@1']:.3f} -> {grpo['pass@1']:.3f}, {d['difference']:+.4f} ({low:+.4f} to {high:+.4f})"


def greedy_lines(seed: int, warm: Mapping[str, Any], grpo: Mapping[str, Any]) -> list[str]:
    """Greedy held-out accuracy, warm start -> GRPO, with the problems each alone solved and McNemar's p; and the
    same on the first 200 problems, the earlier files' held-out set."""
    broken, fixed = paired_counts(warm, grpo)
    p_value = mcnemar_exact(broken, fixed)
    first = [sum(r["correct"] for r in result["records"][:EARLIER_GREEDY_PROBLEMS]) for result in (warm, grpo)]
    return [
        f"seed_{seed}_heldout_greedy: {warm['accuracy']:.3f} -> {grpo['accuracy']:.3f} ({warm['n']} problems; "
        f"fixed {fixed}, broken {broken}, McNemar p {p_value:.2f})",
        f"seed_{seed}_heldout_greedy_first_{EARLIER_GREEDY_PROBLEMS}: {first[0]} -> {first[1]} of "
        f"{min(warm['n'], EARLIER_GREEDY_PROBLEMS)}",
    ]


def stage_lines(seed: int, warm: Mapping[str, dict], grpo: Mapping[str, dict]) -> list[str]:
    return greedy_lines(seed, warm["greedy"], grpo["greedy"]) + [
        f"seed_{seed}_heldout_format: {warm['greedy']['format_score']:.3f} -> {grpo['greedy']['format_score']:.3f}",
        difference(f"seed_{seed}_lab_problems_pass1", warm["lab"], grpo["lab"]),
    ] + ([difference(f"seed_{seed}_heldout_pass1", warm["heldout"], grpo["heldout"])] if grpo["heldout"] else [])


def collapse_lines(seed: int, run_dir: Any, tokenizer: Any, log_history: Any) -> tuple[bool, list[str]]:
    frame = logged_completions(run_dir)
    last, first = last_fifth(list(frame["step"])), first_fifth(list(frame["step"]))

    def window_report(rows: list[bool]) -> Any:
        return collapse_report(list(frame["completion"][rows]), list(frame["prompt"][rows]),
                               lambda text: len(tokenizer(text, add_special_tokens=False).input_ids))  # fmt: skip

    report, start = window_report(last), window_report(first)
    first_share, last_share = monitoring.correct_share_fifths(log_history)
    lines = [
        f"seed_{seed}_collapsed: {report.collapsed}",
        f"seed_{seed}_collapse: {report.summary()}",
        f"seed_{seed}_first_fifth: {start.summary('first fifth')}",
        f"seed_{seed}_last_fifth_median_completion_tokens: {report.median_completion_tokens:.0f}",
        f"seed_{seed}_last_fifth_median_reasoning_tokens: {report.median_reasoning_tokens:.0f}",
        f"seed_{seed}_last_fifth_top_answer_share: {report.top_answer_share:.3f}",
        f"seed_{seed}_correct_share_first_fifth: {first_share:.3f}",
        f"seed_{seed}_correct_share_last_fifth: {last_share:.3f}",
        f"seed_{seed}_correct_share_per_step: "
        + " ".join(f"{share:.2f}" for share in monitoring.correct_share_per_step(log_history)),
    ]
    examples = list(frame["completion"][first])[:1] + list(frame["completion"][last])[-2:]
    for text in examples:
        print(f"# seed {seed} completion: {text!r}", file=sys.stderr)
    return report.collapsed, lines


def main() -> None:
    args = parse_args()
    if args.record:
        record(Path(args.record[0]), args.record[1])
        return
    changes, grpo_changes = field_values(args.set), field_values(args.grpo)
    profile = get_profile(args.profile).override(**changes) if changes else get_profile(args.profile)
    seeds = [int(s) for s in args.seeds.split(",")]
    print(f"collapse_profile: {profile.name} {(changes | grpo_changes) or '(as defined)'}; seeds {seeds}")
    warm_scores, collapsed = None, 0
    for seed in seeds:
        started = time.perf_counter()
        with contextlib.redirect_stdout(sys.stderr):
            result = lab.run_training(profile, speedups=SPEEDUPS, seed=seed, log_completions=True,
                                      num_completions_to_print=0, **grpo_changes)  # fmt: skip
        print(f"seed_{seed}_lab_minutes: {(time.perf_counter() - started) / 60:.1f}", flush=True)
        keep_run(result.run_dir, run_label(args), seed)
        is_collapsed, lines = collapse_lines(seed, result.run_dir, result.tokenizer, result.trainer.state.log_history)
        collapsed += is_collapsed
        print("\n".join(lines), flush=True)
        with contextlib.redirect_stdout(sys.stderr):
            sets = {"greedy": heldout_set(args.greedy_problems),
                    "sampled": heldout_set(args.sampled_problems) if args.sampled_problems else [],
                    "lab": training_dataset(profile, tokenizer=result.tokenizer)}  # fmt: skip
            if warm_scores is None:
                warm_model, tokenizer = load_warm_start_model(profile, result.run_dir)
                warm_scores = evaluate(warm_model, tokenizer, sets, profile)
            grpo_model, tokenizer = load_for_evaluation(profile)
        print("\n".join(stage_lines(seed, warm_scores, evaluate(grpo_model, tokenizer, sets, profile))), flush=True)
    print(f"lab_collapsed_seeds: {collapsed} of {len(seeds)}")


if __name__ == "__main__":
    main()
