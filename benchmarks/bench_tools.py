"""Does the calculator help? The tool lab, then three models on the same held-out problems (notebook 08's figures).

The tool lab (``training.tool_lab.run_tool_lab``: warm start on GSM8K's notes as tool-call traces, then GRPO with
``tools=[calculator]``) is timed from the start, its last logged ``tools/call_frequency`` and
``tools/failure_frequency`` read from its log. Then three models meet the same held-out problems, fixed before
training by a rule that consults no model (``evaluation.heldout.heldout_set``: the first 200 GSM8K test problems,
in file order), greedily: notebook 04's model without tools (its own run, trained here when none is saved), the
tool model with its calculator, and the tool model with a calculator that refuses every call
(``unavailable_calculator``), on the same prompt. The last two apart say what the tool adds; the first two apart,
what the tool training added. Prints ``name: value`` lines:

- ``tools_lab_profile``, ``tools_lab_minutes`` (warm start and GRPO), ``tools_warm_start_minutes``,
  ``tools_call_frequency_last``, ``tools_failure_frequency_last``, ``tools_call_frequency_per_step``;
- ``tools_heldout_problems``, ``tools_heldout_rule``, ``tools_heldout_accuracy_{model}`` (with ``_ci``),
  ``tools_heldout_calls_per_problem_{model}``, ``tools_heldout_failure_frequency_{model}``;
- ``tools_mcnemar_p_{pair}`` with the counts of problems only one of the pair solves;
- sampled: ``tools_sampled_problems`` (the first ``--sampled-problems`` of the held-out set), ``tools_samples``,
  ``tools_sampled_pass@k_{model}`` (with ``_ci``, a bootstrap over problems) for k = 1 and ``--samples``, and
  ``tools_sampled_pass@1_difference_{pair}`` (second minus first, paired, with its interval).

``make bench-tools`` writes ``benchmarks/results_tools.txt`` (the machine's lines first).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import time
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from transformers import AutoModelForCausalLM, AutoTokenizer

from course_utils import cpu_speed
from course_utils.core.profiles import get_profile
from course_utils.evaluation.heldout import HELDOUT_SIZE, evaluate_model, heldout_set, load_for_evaluation
from course_utils.evaluation.sampling import evaluate_sampled, paired_difference
from course_utils.evaluation.tool_eval import evaluate_sampled_with_tool, evaluate_with_tool, tool_table
from course_utils.lesson.tool_use import calculator, unavailable_calculator
from course_utils.training import lab
from course_utils.training.run_folder import WARM_START_DIRNAME
from course_utils.training.tool_lab import run_tool_lab, tool_run_dir, tool_run_profile, tool_tokenizer
from course_utils.training.trained_model import find_trained_model

# The CPU plug-in (appendix 99): the same training and generation, faster on a CPU; COURSE_CPU_SPEEDUPS=0 turns it off
SPEEDUPS = cpu_speed
MODELS = ("notebook04", "with_tool", "tool_unavailable")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="cpu")
    parser.add_argument("--problems", type=int, default=HELDOUT_SIZE, help="held-out test problems")
    parser.add_argument("--notebook04-model", default=None,
                        help="a saved notebook 04 model (default: the profile's run, trained if absent)")  # fmt: skip
    parser.add_argument("--samples", type=int, default=4, help="sampled completions per problem for pass@k (0: none)")
    parser.add_argument("--sampled-problems", type=int, default=100,
                        help="how many of the held-out problems (the first) are sampled")  # fmt: skip
    return parser.parse_args()


def lab_lines(result: Any, minutes: float, profile: Any) -> list[str]:
    """The tool lab's lines: its time and the tool metrics of its last logged step, and per step."""
    logged = [row for row in result.log_history if "tools/call_frequency" in row]
    if not logged:
        raise RuntimeError("The tool lab logged no tools/call_frequency: was it trained with tools=?")
    run = tool_run_profile(profile)
    return [
        f"tools_lab_profile: {profile.name} ({run.max_steps} GRPO steps, {profile.tool_warm_start_examples} traces, "
        f"{run.max_completion_length} tokens, {profile.max_tool_calling_iterations} rounds of calls)",
        f"tools_lab_minutes: {minutes:.1f}",
        f"tools_warm_start_minutes: {result.warm_start_seconds / 60:.1f}",
        f"tools_call_frequency_last: {logged[-1]['tools/call_frequency']:.3f}",
        f"tools_failure_frequency_last: {logged[-1]['tools/failure_frequency']:.3f}",
        "tools_call_frequency_per_step: " + " ".join(f"{row['tools/call_frequency']:.2f}" for row in logged),
    ]


def notebook04_model(profile: Any, folder: str | None) -> tuple[Any, Any, str]:
    """Notebook 04's trained model and tokenizer (``folder``, else the profile's run, trained here when none is
    saved) and where it came from."""
    if folder is not None and find_trained_model(profile, folder) is None:
        raise FileNotFoundError(f"--notebook04-model {folder} holds no saved model")
    if folder is None and find_trained_model(profile) is None:
        started = time.perf_counter()
        lab.run_training(profile, speedups=SPEEDUPS)
        source = f"trained here in {(time.perf_counter() - started) / 60:.1f} minutes"
    else:
        source = f"read from {folder}" if folder else "saved before this run"
    model, tokenizer = load_for_evaluation(profile, folder)
    return model, tokenizer, source


def settings(profile: Any, length: int) -> dict[str, Any]:
    """The generation settings every model is evaluated with: the profile's batch, the tool run's length."""
    return {"batch_size": profile.eval_batch_size, "max_new_tokens": length, "speedups": SPEEDUPS}


def model_lines(name: str, result: dict[str, Any], seconds: float) -> list[str]:
    """One model's held-out lines: greedy accuracy with its Wilson interval, its calls and how long it took."""
    low, high = result["accuracy_ci"]
    return [
        f"tools_heldout_accuracy_{name}: {result['accuracy']:.3f}",
        f"tools_heldout_accuracy_{name}_ci: {low:.3f}-{high:.3f}",
        f"tools_heldout_calls_per_problem_{name}: {result.get('calls_per_problem', 0.0):.3f}",
        f"tools_heldout_failure_frequency_{name}: {result.get('failure_frequency', 0.0):.3f}",
        f"tools_heldout_format_{name}: {result['format_score']:.3f}",
        f"tools_heldout_mean_tokens_{name}: {result['mean_completion_tokens']:.1f}",
        f"tools_heldout_minutes_{name}: {seconds / 60:.1f}",
    ]


def sampled_lines(name: str, result: dict[str, Any]) -> list[str]:
    """One model's sampled lines: pass@k for each k with its bootstrap interval over problems."""
    lines = []
    for k in result["ks"]:
        low, high = result[f"pass@{k}_ci"]
        lines += [f"tools_sampled_pass@{k}_{name}: {result[f'pass@{k}']:.3f}",
                  f"tools_sampled_pass@{k}_{name}_ci: {low:.3f}-{high:.3f}"]  # fmt: skip
    return lines


def difference_lines(sampled: dict[str, dict[str, Any]]) -> list[str]:
    """Each pair's paired difference of sampled pass@1 (second minus first) with its interval."""
    lines = []
    for first, second in (
        ("notebook04", "with_tool"),
        ("tool_unavailable", "with_tool"),
        ("notebook04", "tool_unavailable"),
    ):
        diff = paired_difference(sampled[first], sampled[second], "pass@1")
        low, high = diff["ci"]
        lines += [f"tools_sampled_pass@1_difference_{second}_minus_{first}: {diff['difference']:+.3f}",
                  f"tools_sampled_pass@1_difference_{second}_minus_{first}_ci: {low:+.3f} to {high:+.3f}"]  # fmt: skip
    return lines


def sample_all(models: dict[str, Any], problems: Any, profile: Any, length: int, samples: int) -> dict[str, Any]:
    """Each model's ``samples`` completions per problem (the tool models with their tool), the same seeds."""
    sampled = {}
    common = {"samples": samples, "ks": sorted({1, samples}), "max_new_tokens": length, "speedups": SPEEDUPS}
    for name, (model, tokenizer, tool) in models.items():
        started = time.perf_counter()
        with contextlib.redirect_stdout(sys.stderr):
            if tool is None:
                sampled[name] = evaluate_sampled(model, tokenizer, problems, **common)
            else:
                calls = profile.max_tool_calling_iterations
                sampled[name] = evaluate_sampled_with_tool(model, tokenizer, problems, tool, max_calls=calls, **common)
        minutes = (time.perf_counter() - started) / 60
        print(
            "\n".join([*sampled_lines(name, sampled[name]), f"tools_sampled_minutes_{name}: {minutes:.1f}"]), flush=True
        )
    return sampled


def main() -> None:
    args = parse_args()
    profile = get_profile(args.profile)
    # A learner's first run has no saved warm start yet: time it, rather than reuse one from an earlier run
    shutil.rmtree(tool_run_dir(profile) / WARM_START_DIRNAME, ignore_errors=True)
    print("tools_load_average_at_start: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))  # other work on the machine
    started = time.perf_counter()
    with contextlib.redirect_stdout(sys.stderr):  # the trainers' per-step log lines are not results
        result = run_tool_lab(profile, speedups=SPEEDUPS)
    print("\n".join(lab_lines(result, (time.perf_counter() - started) / 60, profile)), flush=True)
    with contextlib.redirect_stdout(sys.stderr):
        problems = heldout_set(args.problems)
        tool_model = AutoModelForCausalLM.from_pretrained(result.final_dir).eval()
        tokenizer = tool_tokenizer(AutoTokenizer.from_pretrained(result.final_dir), profile)
        plain_model, plain_tokenizer, source = notebook04_model(profile, args.notebook04_model)
    length = tool_run_profile(profile).max_completion_length
    print(f"tools_heldout_problems: {len(problems)}")
    print(f"tools_heldout_rule: the first {len(problems)} GSM8K test problems, greedy, {length} new tokens "
          f"(tool answers included), up to {profile.max_tool_calling_iterations} rounds of calls; notebook 04's "
          f"model {source}")  # fmt: skip
    results = {}
    for name in MODELS:
        model_started = time.perf_counter()
        with contextlib.redirect_stdout(sys.stderr):
            if name == "notebook04":
                results[name] = evaluate_model(plain_model, plain_tokenizer, problems, progress=False,
                                               **settings(profile, length))  # fmt: skip
            else:
                tool = calculator if name == "with_tool" else unavailable_calculator
                results[name] = evaluate_with_tool(tool_model, tokenizer, problems, tool,
                                                   max_calls=profile.max_tool_calling_iterations,
                                                   **settings(profile, length))  # fmt: skip
        print("\n".join(model_lines(name, results[name], time.perf_counter() - model_started)), flush=True)
    _, pairs = tool_table(results)
    for comparison, row in pairs.iterrows():
        first, second = comparison.split(" vs ")
        key = f"{first}_vs_{second}"
        print(f"tools_only_{first}_right_vs_{second}: {int(row['only first'])}")
        print(f"tools_only_{second}_right_vs_{first}: {int(row['only second'])}")
        print(f"tools_mcnemar_p_{key}: {row['McNemar p']:.4f}")
    if args.samples > 0:
        subset = problems.select(range(min(args.sampled_problems, len(problems))))
        print(f"tools_sampled_problems: {len(subset)}")
        print(f"tools_samples: {args.samples} per problem, temperature 1.0, the same seeds for every model")
        models = {"notebook04": (plain_model, plain_tokenizer, None), "with_tool": (tool_model, tokenizer, calculator),
                  "tool_unavailable": (tool_model, tokenizer, unavailable_calculator)}  # fmt: skip
        sampled = sample_all(models, subset, profile, length, args.samples)
        print("\n".join(difference_lines(sampled)))
    print("tools_load_average_at_end: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))


if __name__ == "__main__":
    main()
