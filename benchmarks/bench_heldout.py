"""Does the `cpu` lab learn to solve? One lab run, then warm start and GRPO on the same held-out problems.

The held-out set is fixed before training by a rule that consults no model (``evaluation.heldout.heldout_set``:
the first 200 GSM8K test problems, in file order). Each model is evaluated
greedily (strict accuracy; McNemar's exact test on the problems only one of the two solves) and with 8 samples per
problem drawn as training draws a group (pass@1, pass@8 with the unbiased estimator, maj@8; the paired difference
of sampled pass@1 with its bootstrap interval). Prints ``name: value`` lines:

- ``cpu_lab_minutes``, ``cpu_lab_correctness_first_fifth`` / ``_last_fifth`` (the share of completions the
  correctness reward called right), ``cpu_lab_correctness_varied_steps``, ``cpu_lab_kl_last``;
- ``heldout_problems``, ``heldout_greedy_{stage}``, ``heldout_pass1_{stage}``, ``heldout_pass8_{stage}``,
  ``heldout_maj8_{stage}`` (each with ``_ci``), ``heldout_mcnemar_p``, ``heldout_pass1_difference`` (``_ci``);
- ``heldout_lenient_{stage}`` and ``heldout_lenient_mcnemar_p``: greedy answers read as the last number in the
  text, so a model that only learned the tags gains nothing there (a format gain against a maths gain);
- ``lab_problems_pass1_{stage}`` and ``lab_problems_pass1_difference`` (``_ci``): the same sampling on the lab's own
  training problems, before and after GRPO. Each step draws one problem, so the per-step share of right answers
  mostly says which problem came up; fresh samples of every training problem say whether solving them rose;
- with ``--curve``, ``heldout_curve_step_{N}``: each earlier checkpoint of the run sampled the same way, with the
  lab's minutes when it was saved and its paired pass@1 difference from the warm start: held-out solving against
  minutes of training, so a shorter lab can be read off one run.

About 45 minutes on a 2-core CPU: ``make bench-heldout`` writes ``benchmarks/results_heldout.txt``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import time
from collections.abc import Mapping
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from peft import PeftModel
from transformers import TrainerCallback

from course_utils import cpu_speed
from course_utils.core.profiles import get_profile
from course_utils.evaluation.curves import checkpoint_steps, load_warm_start_model
from course_utils.evaluation.heldout import (
    HELDOUT_SIZE,
    evaluate_model,
    heldout_set,
    load_for_evaluation,
    merged_unless_quantized,
)
from course_utils.evaluation.sampling import evaluate_sampled, paired_difference
from course_utils.evaluation.stats import mcnemar_exact
from course_utils.evaluation.tables import paired_counts
from course_utils.lesson.models import saved_model_kind
from course_utils.training import lab, monitoring, run_logs, trained_model
from course_utils.training.grpo_prompts import training_dataset

SAMPLES = 8
SEED = 1  # not the screening's seed 0: the held-out samples are fresh draws
# The CPU plug-in (appendix 99): the same training and samples, faster on a CPU; COURSE_CPU_SPEEDUPS=0 turns it off
SPEEDUPS = cpu_speed


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="cpu")
    parser.add_argument("--problems", type=int, default=HELDOUT_SIZE, help="held-out test problems")
    parser.add_argument("--seed", type=int, default=None, help="GRPOConfig's seed (default: the profile's config's)")
    parser.add_argument("--curve", action="store_true", help="also sample every earlier checkpoint (pass@1 by minutes)")
    return parser.parse_args()


def interval(result: Mapping[str, Any], key: str) -> str:
    low, high = result[f"{key}_ci"]
    return f"{low:.3f}-{high:.3f}"


def stage_lines(stage: str, greedy: Mapping[str, Any], sampled: Mapping[str, Any]) -> list[str]:
    """One model's held-out lines: greedy strict accuracy, sampled pass@1, pass@8 and maj@8, each with its interval."""
    lines = [f"heldout_greedy_{stage}: {greedy['accuracy']:.3f}",
             f"heldout_greedy_{stage}_ci: {interval(greedy, 'accuracy')}"]  # fmt: skip
    for key, name in (("pass@1", "pass1"), (f"pass@{SAMPLES}", f"pass{SAMPLES}"), (f"maj@{SAMPLES}", f"maj{SAMPLES}")):
        lines += [f"heldout_{name}_{stage}: {sampled[key]:.3f}",
                  f"heldout_{name}_{stage}_ci: {interval(sampled, key)}"]  # fmt: skip
    lines += [f"heldout_lenient_{stage}: {greedy['lenient_accuracy']:.3f}",  # the last number in the text: no format
              f"heldout_format_{stage}: {greedy['format_score']:.3f}",
              f"heldout_mean_tokens_{stage}: {greedy['mean_completion_tokens']:.1f}"]  # fmt: skip
    return lines


def evaluate_stage(model: Any, tokenizer: Any, problems: Any, profile: Any) -> tuple[dict, dict]:
    """Greedy and sampled evaluation of one model, at the lab's completion length."""
    length = profile.max_completion_length
    greedy = evaluate_model(model, tokenizer, problems, batch_size=profile.eval_batch_size, max_new_tokens=length,
                            progress=False, speedups=SPEEDUPS)  # fmt: skip
    return greedy, sample_stage(model, tokenizer, problems, profile)


def config_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """GRPOConfig fields the options change: the seed, and for the curve every checkpoint kept (not the last two)."""
    return ({} if args.seed is None else {"seed": args.seed}) | ({"save_total_limit": None} if args.curve else {})


class SaveClock(TrainerCallback):
    """Minutes since ``started`` at each checkpoint the trainer saves, by step."""

    def __init__(self, started: float) -> None:
        self.started = started
        self.minutes: dict[int, float] = {}

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.minutes[state.global_step] = (time.perf_counter() - self.started) / 60


def sample_stage(model: Any, tokenizer: Any, problems: Any, profile: Any) -> dict:
    """The sampled half of ``evaluate_stage``: the same draws, for the points of the curve."""
    return evaluate_sampled(model, tokenizer, problems, samples=SAMPLES, ks=(1, SAMPLES), prompts_per_batch=4,
                            max_new_tokens=profile.max_completion_length, temperature=profile.temperature, seed=SEED,
                            speedups=SPEEDUPS)  # fmt: skip


def curve_line(step: int, minutes: float, warm: Mapping[str, Any], sampled: Mapping[str, Any]) -> str:
    """One point of the curve: the lab's minutes at the save, sampled pass@1 and pass@k, the paired difference."""
    difference = paired_difference(warm, sampled, "pass@1")
    low, high = difference["ci"]
    return (f"heldout_curve_step_{step}: minutes {minutes:.1f}, pass1 {sampled['pass@1']:.3f}, "
            f"pass{SAMPLES} {sampled[f'pass@{SAMPLES}']:.3f}, "
            f"difference {difference['difference']:+.4f} ({low:+.4f} to {high:+.4f})")  # fmt: skip


def curve_lines(profile: Any, run_dir: Any, problems: Any, warm: Mapping[str, Any], minutes: Mapping[int, float],
                last_step: int) -> list[str]:  # fmt: skip
    """One line per checkpoint before the last: minutes into the lab, sampled pass@1, the paired difference."""
    lines = []
    for step, folder in checkpoint_steps(run_dir):
        if step >= last_step or saved_model_kind(folder) != "lora-adapter":
            continue
        with contextlib.redirect_stdout(sys.stderr):
            base, tokenizer = load_warm_start_model(profile, run_dir)
            model = merged_unless_quantized(PeftModel.from_pretrained(base, folder)).eval()
        lines.append(curve_line(step, minutes.get(step, float("nan")), warm,
                                sample_stage(model, tokenizer, problems, profile)))  # fmt: skip
        print(lines[-1], flush=True)
    return lines


def lab_problem_lines(profile: Any, models: Mapping[str, Any], tokenizer: Any) -> list[str]:
    """Sampled pass@1 on the problems the lab trains on, warm start and GRPO, with the paired difference."""
    with contextlib.redirect_stdout(sys.stderr):
        problems = training_dataset(profile, tokenizer=tokenizer)
    sampled = {stage: sample_stage(model, tokenizer, problems, profile) for stage, model in models.items()}
    return [
        f"lab_problems: {len(problems)}",
        *(f"lab_problems_pass1_{stage}: {result['pass@1']:.3f}" for stage, result in sampled.items()),
        *difference_lines("lab_problems_pass1", sampled["warm_start"], sampled["grpo"]),
    ]


def difference_lines(prefix: str, warm: Mapping[str, Any], grpo: Mapping[str, Any]) -> list[str]:
    """``<prefix>_difference`` and its ``_ci``: GRPO's sampled pass@1 minus the warm start's, paired by problem."""
    difference = paired_difference(warm, grpo, "pass@1")
    low, high = difference["ci"]
    return [
        f"{prefix}_difference: {difference['difference']:+.4f}",
        f"{prefix}_difference_ci: {low:+.4f} to {high:+.4f}",
    ]


def main() -> None:
    args = parse_args()
    profile = get_profile(args.profile)
    # A learner's first run has no saved warm start yet: time it, rather than reuse one from an earlier run
    shutil.rmtree(trained_model.warm_start_model_dir(trained_model.default_run_dir(profile)), ignore_errors=True)
    started = time.perf_counter()
    clock = SaveClock(started)
    with contextlib.redirect_stdout(sys.stderr):  # the trainers' per-step log lines are not results
        result = lab.run_training(profile, callbacks=[clock], speedups=SPEEDUPS, **config_overrides(args))
    figures = monitoring.lab_figures(result.trainer.state.log_history)
    print(
        f"cpu_lab_profile: {profile.name} (beta {profile.beta}, problem_list {profile.problem_list}, "
        f"seed {result.trainer.args.seed})"
    )
    lab_minutes = (time.perf_counter() - started) / 60
    print(f"cpu_lab_minutes: {lab_minutes:.1f}")
    for name, value in figures.items():
        print(f"cpu_lab_{name}: {value:.3f}")
    logs = run_logs.training_logs(result.trainer.state.log_history)
    shares = monitoring.correct_share_per_step(result.trainer.state.log_history)
    print("cpu_lab_correct_share_per_step: " + " ".join(f"{share:.2f}" for share in shares))
    print("cpu_lab_kl_per_step: " + " ".join(f"{e['kl']:.4f}" for e in logs if "kl" in e), flush=True)
    with contextlib.redirect_stdout(sys.stderr):
        problems = heldout_set(args.problems)
        warm_model, tokenizer = load_warm_start_model(profile, result.run_dir)
        grpo_model, _ = load_for_evaluation(profile)
    print(f"heldout_problems: {len(problems)}")
    print(
        f"heldout_rule: the first {len(problems)} GSM8K test problems; greedy and {SAMPLES} samples each "
        f"(seed {SEED}), {profile.max_completion_length} new tokens",
        flush=True,
    )
    results = {}
    for stage, model in (("warm_start", warm_model), ("grpo", grpo_model)):
        stage_started = time.perf_counter()
        results[stage] = evaluate_stage(model, tokenizer, problems, profile)
        print("\n".join(stage_lines(stage, *results[stage])))
        print(f"heldout_minutes_{stage}: {(time.perf_counter() - stage_started) / 60:.1f}", flush=True)
    only_warm, only_grpo = paired_counts(results["warm_start"][0], results["grpo"][0])
    print(f"heldout_greedy_only_warm_start_right: {only_warm}")
    print(f"heldout_greedy_only_grpo_right: {only_grpo}")
    print(f"heldout_mcnemar_p: {mcnemar_exact(only_warm, only_grpo):.4f}")
    only_warm, only_grpo = paired_counts(results["warm_start"][0], results["grpo"][0], key="lenient_correct")
    print(f"heldout_lenient_only_warm_start_right: {only_warm}")
    print(f"heldout_lenient_only_grpo_right: {only_grpo}")
    print(f"heldout_lenient_mcnemar_p: {mcnemar_exact(only_warm, only_grpo):.4f}")
    print("\n".join(difference_lines("heldout_pass1", results["warm_start"][1], results["grpo"][1])), flush=True)
    print("\n".join(lab_problem_lines(profile, {"warm_start": warm_model, "grpo": grpo_model}, tokenizer)), flush=True)
    if args.curve:
        last_step = result.trainer.state.global_step
        print(curve_line(last_step, lab_minutes, results["warm_start"][1], results["grpo"][1]), flush=True)
        curve_lines(profile, result.run_dir, problems, results["warm_start"][1], clock.minutes, last_step)


if __name__ == "__main__":
    main()
