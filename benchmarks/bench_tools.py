"""What does the calculator add? Two models trained by one recipe, with and without it, on the same held-out problems.

The tool lab (``training.tool_lab.run_tool_lab``: a warm start on GSM8K's notes as tool-call traces, then GRPO with
``tools=[calculator]``) and its twin without the calculator (``run_tool_lab(..., with_tool=False)``: the same start
model, the same traces with each result written instead of called, the same problems, steps, learning rate, rewards
and completion budget, no tools offered) are each timed from the start. Then the three arms of
``evaluation.tool_eval.ARMS`` meet the same held-out problems, fixed before training by a rule that consults no model
(``evaluation.heldout.heldout_set``: the first 200 GSM8K test problems, in file order), greedily and sampled: the
tool model with its calculator, the same recipe without it, and the tool model offered no tool. The first two apart
say what the calculator adds; the first and third apart, what it adds to the tool model's own arithmetic. Prints
``name: value`` lines:

- ``tools_lab_profile``, ``tools_lab_minutes`` (warm start and GRPO), ``tools_warm_start_minutes``,
  ``tools_same_recipe_no_tool_minutes``; ``tools_traces_over_budget`` (the share of warm-start traces longer than
  the completion budget) and ``tools_trace_tokens``;
- from the training logs: ``tools_call_frequency_last``, ``tools_failure_frequency_last``,
  ``tools_call_frequency_per_step``, ``tools_tool_reward_mean_over_training`` (``rewards/tool_use_reward/mean``
  over the logged steps) with ``tools_tool_reward_steps_above_0``, and ``tools_training_clipped_ratio_{arm}``
  (``completions/clipped_ratio`` over the steps: the share of completions the budget cut) for the two trained arms;
- per arm, greedy: ``evaluation.tool_eval.ARM_LINES`` (accuracy with its Wilson interval, format, truncation,
  calls per problem), ``tools_heldout_failure_frequency_{arm}``, ``tools_heldout_ending_in_call_{arm}``,
  ``tools_heldout_mean_tokens_{arm}``, ``tools_heldout_minutes_{arm}``; sampled: ``tools_sampled_pass@k_{arm}``
  (with ``_ci``, a bootstrap over problems) for k = 1 and ``--samples``, ``tools_sampled_truncation_{arm}``,
  ``tools_sampled_format_{arm}``, ``tools_sampled_minutes_{arm}``;
- per pair of ``tool_eval.DIFFERENCES``, first minus second: ``DIFFERENCE_LINES`` (greedy accuracy and sampled pass@1,
  each with its paired interval; ``tools_pass1_with_tool_minus_same_recipe_no_tool`` is the calculator's effect),
  ``tools_only_{first}_right_vs_{second}`` and back, and ``tools_mcnemar_p_{first}_vs_{second}``.

``make bench-tools`` writes ``benchmarks/results_tools.txt`` (the machine's lines first).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from transformers import AutoModelForCausalLM, AutoTokenizer

from course_utils import cpu_speed
from course_utils.core.profiles import get_profile
from course_utils.evaluation.heldout import HELDOUT_SIZE, heldout_set
from course_utils.evaluation.tool_eval import (
    ARM_LINES,
    ARMS,
    DIFFERENCE_LINES,
    DIFFERENCES,
    evaluate_sampled_with_tool,
    evaluate_with_tool,
    tool_table,
)
from course_utils.lesson.tool_use import calculator
from course_utils.training.run_folder import WARM_START_DIRNAME
from course_utils.training.run_logs import training_logs
from course_utils.training.tool_lab import (
    run_tool_lab,
    share_over_budget,
    tool_run_dir,
    tool_run_profile,
    tool_tokenizer,
    trace_completion_tokens,
    trace_dataset,
)

# The CPU plug-in (appendix 99): the same training and generation, faster on a CPU; COURSE_CPU_SPEEDUPS=0 turns it off
SPEEDUPS = cpu_speed
TOOL_REWARD_KEY = "rewards/tool_use_reward/mean"
CLIPPED_KEY = "completions/clipped_ratio"  # TRL: the share of a step's completions that end without an end of turn


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="cpu")
    parser.add_argument("--problems", type=int, default=HELDOUT_SIZE, help="held-out test problems")
    parser.add_argument("--samples", type=int, default=4, help="sampled completions per problem for pass@k (0: none)")
    parser.add_argument("--sampled-problems", type=int, default=HELDOUT_SIZE,
                        help="how many of the held-out problems (the first) are sampled")  # fmt: skip
    return parser.parse_args()


def _mean(rows: Sequence[Mapping[str, Any]], key: str) -> tuple[float, list[float]]:
    values = [float(row[key]) for row in rows if row.get(key) is not None]
    return (sum(values) / len(values) if values else float("nan")), values


def lab_lines(result: Any, minutes: float, profile: Any) -> list[str]:
    """The tool lab's lines: its time, the tool metrics of its last logged step and per step, the tool reward's
    mean over training and the share of completions the budget cut."""
    logged = [row for row in result.log_history if "tools/call_frequency" in row]
    if not logged:
        raise RuntimeError("The tool lab logged no tools/call_frequency: was it trained with tools=?")
    run = tool_run_profile(profile)
    reward, rewards = _mean(training_logs(result.log_history), TOOL_REWARD_KEY)
    return [
        f"tools_lab_profile: {profile.name} ({run.max_steps} GRPO steps, {profile.tool_warm_start_examples} traces, "
        f"{run.max_completion_length} tokens, {profile.max_tool_calling_iterations} rounds of calls)",
        f"tools_lab_minutes: {minutes:.1f}",
        f"tools_warm_start_minutes: {result.warm_start_seconds / 60:.1f}",
        f"tools_call_frequency_last: {logged[-1]['tools/call_frequency']:.3f}",
        f"tools_failure_frequency_last: {logged[-1]['tools/failure_frequency']:.3f}",
        "tools_call_frequency_per_step: " + " ".join(f"{row['tools/call_frequency']:.2f}" for row in logged),
        f"tools_tool_reward_mean_over_training: {reward:.4f}",
        f"tools_tool_reward_steps_above_0: {sum(v > 0 for v in rewards)} of {len(rewards)}",
        *clipped_lines("with_tool", result.log_history),
    ]


def clipped_lines(arm: str, log_history: Sequence[Mapping[str, Any]]) -> list[str]:
    """The share of a run's completions that its budget cut, over its logged steps (TRL's clipped ratio)."""
    mean, values = _mean(training_logs(log_history), CLIPPED_KEY)
    return [f"tools_training_clipped_ratio_{arm}: {mean:.3f} (mean of {len(values)} steps)"]


def trace_lines(profile: Any, tokenizer: Any) -> list[str]:
    """How the warm-start traces fit the completion budget, counted as TRL counts a completion."""
    budget = tool_run_profile(profile).max_completion_length
    lengths = [trace_completion_tokens(tokenizer, row) for row in trace_dataset(profile, tokenizer)]
    over = share_over_budget(lengths, budget)
    return [
        f"tools_traces_over_budget: {over:.3f} ({sum(n > budget for n in lengths)} of {len(lengths)} traces longer "
        f"than {budget} tokens)",
        f"tools_trace_tokens: {min(lengths)}-{max(lengths)} (median {sorted(lengths)[len(lengths) // 2]})",
    ]


def model_lines(arm: str, result: Mapping[str, Any], seconds: float) -> list[str]:
    """One arm's greedy lines: ``ARM_LINES``' greedy figures, its calls, failures, unanswered calls, length, time."""
    low, high = result["accuracy_ci"]
    values = {"greedy": f"{result['accuracy']:.3f}", "greedy 95% CI": f"{low:.3f}-{high:.3f}",
              "format": f"{result['format_score']:.3f}", "truncated": f"{result['truncation_rate']:.3f}",
              "calls per problem": f"{result.get('calls_per_problem', 0.0):.3f}"}  # fmt: skip
    return [f"{ARM_LINES[column].format(arm=arm)}: {value}" for column, value in values.items()] + [
        f"tools_heldout_failure_frequency_{arm}: {result.get('failure_frequency', 0.0):.3f}",
        f"tools_heldout_ending_in_call_{arm}: {result.get('ending_in_call_share', 0.0):.3f}",
        f"tools_heldout_mean_tokens_{arm}: {result['mean_completion_tokens']:.1f}",
        f"tools_heldout_minutes_{arm}: {seconds / 60:.1f}",
    ]


def sampled_lines(arm: str, result: Mapping[str, Any]) -> list[str]:
    """One arm's sampled lines: pass@k for each k with its bootstrap interval over problems, truncation, format."""
    lines = []
    for k in result["ks"]:
        low, high = result[f"pass@{k}_ci"]
        lines += [f"tools_sampled_pass@{k}_{arm}: {result[f'pass@{k}']:.3f}",
                  f"tools_sampled_pass@{k}_{arm}_ci: {low:.3f}-{high:.3f}"]  # fmt: skip
    return [*lines, f"{ARM_LINES['sampled truncated'].format(arm=arm)}: {result['truncation_rate']:.3f}",
            f"tools_sampled_format_{arm}: {result['format_score']:.3f}"]  # fmt: skip


def difference_lines(greedy: Mapping[str, Any], sampled: Mapping[str, Any] | None) -> list[str]:
    """Each pair of ``DIFFERENCES``, first minus second: greedy accuracy on the greedy problems and (where sampled)
    pass@1 on the sampled ones, each with its paired interval, and who alone solved what greedily with McNemar's
    exact p (``tool_table``'s differences)."""
    _, table = tool_table(greedy, sampled or None, DIFFERENCES)
    lines = []
    for (first, second), (_, row) in zip(DIFFERENCES, table.iterrows(), strict=True):
        names = {column: template.format(first=first, second=second) for column, template in DIFFERENCE_LINES.items()}
        lines += [f"{names['greedy difference']}: {row['greedy difference']:+.3f}",
                  f"{names['greedy 95% CI']}: {row['greedy 95% CI']}",
                  f"tools_only_{first}_right_vs_{second}: {int(row['only first'])}",
                  f"tools_only_{second}_right_vs_{first}: {int(row['only second'])}",
                  f"tools_mcnemar_p_{first}_vs_{second}: {row['McNemar p']:.4f}"]  # fmt: skip
        sampled_difference = row.get("pass@1 difference")
        if sampled_difference is not None and sampled_difference == sampled_difference:  # NaN: a pair not sampled
            lines += [f"{names['pass@1 difference']}: {row['pass@1 difference']:+.3f}",
                      f"{names['pass@1 95% CI']}: {row['pass@1 95% CI']}"]  # fmt: skip
    return lines


def train_both(profile: Any) -> dict[str, Any]:
    """The tool lab and its twin without the calculator, each timed from a fresh warm start; prints their lines."""
    runs = {}
    for arm, with_tool in (("with_tool", True), ("same_recipe_no_tool", False)):
        # A learner's first run has no saved warm start yet: time it, rather than reuse one from an earlier run
        shutil.rmtree(tool_run_dir(profile, with_tool) / WARM_START_DIRNAME, ignore_errors=True)
        started = time.perf_counter()
        with contextlib.redirect_stdout(sys.stderr):  # the trainers' per-step log lines are not results
            runs[arm] = run_tool_lab(profile, speedups=SPEEDUPS, with_tool=with_tool)
        minutes = (time.perf_counter() - started) / 60
        if with_tool:
            lines = lab_lines(runs[arm], minutes, profile)
        else:
            lines = [f"tools_same_recipe_no_tool_minutes: {minutes:.1f}", *clipped_lines(arm, runs[arm].log_history)]
        print("\n".join(lines), flush=True)
    return runs


def main() -> None:
    args = parse_args()
    profile = get_profile(args.profile)
    print("tools_load_average_at_start: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))  # other work on the machine
    runs = train_both(profile)
    with contextlib.redirect_stdout(sys.stderr):
        problems = heldout_set(args.problems)
        loaded = {}
        for arm, run in runs.items():
            model = AutoModelForCausalLM.from_pretrained(run.final_dir).eval()
            loaded[arm] = model, tool_tokenizer(AutoTokenizer.from_pretrained(run.final_dir), profile)
        traces = trace_lines(profile, loaded["with_tool"][1])
    print("\n".join(traces), flush=True)
    tool_model, no_tool_model = loaded["with_tool"], loaded["same_recipe_no_tool"]
    arms = {"with_tool": (*tool_model, calculator), "same_recipe_no_tool": (*no_tool_model, None),
            "tool_model_no_tool": (*tool_model, None)}  # fmt: skip
    if set(arms) != set(ARMS):
        raise RuntimeError(f"The arms evaluated {sorted(arms)} are not tool_eval.ARMS {sorted(ARMS)}")
    length, calls = tool_run_profile(profile).max_completion_length, profile.max_tool_calling_iterations
    print(f"tools_heldout_problems: {len(problems)}")
    print(f"tools_heldout_rule: the first {len(problems)} GSM8K test problems, greedy, {length} new tokens "
          f"(tool answers included), up to {calls} rounds of calls where the calculator is offered")  # fmt: skip
    greedy = {}
    for arm, (model, tokenizer, tool) in arms.items():
        started = time.perf_counter()
        with contextlib.redirect_stdout(sys.stderr):
            greedy[arm] = evaluate_with_tool(model, tokenizer, problems, tool, max_calls=calls, max_new_tokens=length,
                                             batch_size=profile.eval_batch_size, speedups=SPEEDUPS)  # fmt: skip
        print("\n".join(model_lines(arm, greedy[arm], time.perf_counter() - started)), flush=True)
    sampled = {}
    if args.samples > 0:
        subset = problems.select(range(min(args.sampled_problems, len(problems))))
        print(f"tools_sampled_problems: {len(subset)}")
        print(f"tools_samples: {args.samples} per problem, temperature 1.0, the same seeds for every arm")
        common = {"samples": args.samples, "ks": sorted({1, args.samples}), "max_new_tokens": length,
                  "max_calls": calls, "speedups": SPEEDUPS}  # fmt: skip
        for arm, (model, tokenizer, tool) in arms.items():
            started = time.perf_counter()
            with contextlib.redirect_stdout(sys.stderr):
                sampled[arm] = evaluate_sampled_with_tool(model, tokenizer, subset, tool, **common)
            minutes = (time.perf_counter() - started) / 60
            print("\n".join([*sampled_lines(arm, sampled[arm]), f"tools_sampled_minutes_{arm}: {minutes:.1f}"]),
                  flush=True)  # fmt: skip
    print("\n".join(difference_lines(greedy, sampled)))
    print("tools_load_average_at_end: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))


if __name__ == "__main__":
    main()
