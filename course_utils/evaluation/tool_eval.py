"""Held-out problems solved with a tool: generation that runs the calls, and the arms of notebook 08 compared on it.

``tool_generate`` writes completions as ``GRPOTrainer(tools=...)`` does in training: the prompt rendered with the
calculator's schema, the reply parsed by TRL's own parser (``trl.chat_template_utils.parse_response``, which reads
the template's ``<tool_call>`` JSON), each call run, its answer appended as the template's tool turn, and the
model continuing from there, token ids concatenated rather than re-tokenized, within one budget of
``max_new_tokens`` for the whole completion (tool answers included). A refused call reads back as TRL writes it
(``str({'error': ...})``) and counts as a failure. ``tool=None`` offers no tool, as ``GRPOTrainer`` without
``tools=``: no tools block in the prompt, and a call the model writes anyway ends its completion unanswered.

``ARMS`` are the three models notebook 08 and ``make bench-tools`` compare, each with the same budget and problems:
the tool model with its calculator, a model trained by the same recipe without it, and the tool model offered no
tool. ``evaluate_with_tool`` (greedy) and ``evaluate_sampled_with_tool`` (pass@k) score the completions as the rest
of the evaluation does (``metrics.score_completions``, ``sampling.problem_record``); ``tool_table`` puts the arms
side by side with Wilson intervals, format and truncation, and each pair's paired differences; ``measured_tool_table``
reads the same figures from ``benchmarks/results_tools.txt``, naming the lines it lacks.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from numbers import Integral
from typing import Any

import pandas as pd
import torch
from trl.chat_template_utils import parse_response

from course_utils.core.paths import bench_figures
from course_utils.core.speedups import NO_SPEEDUPS, SpeedUps
from course_utils.evaluation.heldout import rows_to_evaluate
from course_utils.evaluation.metrics import score_completions
from course_utils.evaluation.sampling import paired_difference, problem_record, summarize_samples
from course_utils.evaluation.stats import mcnemar_exact
from course_utils.evaluation.tables import paired_counts
from course_utils.lesson.rewards import completion_text
from course_utils.lesson.tool_use import TOOL_NAME, calculator

ToolFunction = Callable[[str], str]
# The arms notebook 08 and make bench-tools compare: line-name key -> what it is. Trained by one recipe (the same start
# model, traces, problems, steps, rate, rewards and budget), the first two differ only in the calculator; the third is
# the first offered no tool, so a model that learned to call is measured doing the arithmetic itself
ARMS = {
    "with_tool": "tool model, calculator",
    "same_recipe_no_tool": "same recipe, no tool",
    "tool_model_no_tool": "tool model, no tool offered",
}
# The paired differences reported, first minus second: what the calculator adds over the same recipe without it, what
# it adds to the tool model's own arithmetic, and what training with the tool did to that arithmetic
DIFFERENCES = (
    ("with_tool", "same_recipe_no_tool"),
    ("with_tool", "tool_model_no_tool"),
    ("tool_model_no_tool", "same_recipe_no_tool"),
)


@dataclass
class ToolRollout:
    """One completion written with a tool: its turns, the text the rewards read, its calls and its length."""

    messages: list[dict[str, Any]] = field(default_factory=list)
    calls: int = 0
    failures: int = 0
    tokens: int = 0  # completion tokens, the tool's answers included
    truncated: bool = False  # stopped by the budget, not by the model

    @property
    def text(self) -> str:
        """What the rewards and the scoring read: every turn's text, in order (``rewards.completion_text``)."""
        return completion_text(self.messages)

    @property
    def ends_in_call(self) -> bool:
        """Whether the completion ends on a call that got no answer (no tool offered, the rounds used up, or no room
        left for the answer): it stopped before any ``<answer>``."""
        return bool(self.messages and self.messages[-1].get("tool_calls"))


def _check_positive(**values: Any) -> None:
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, Integral) or value < 1:
            raise ValueError(f"{name} must be a positive whole number, got {value!r}")


def _check_tool(tool: Any) -> None:
    if tool is None:
        return
    if not callable(tool):
        raise TypeError(f"tool must be a function such as calculator, or None for no tool, got {tool!r}")
    if getattr(getattr(tool, "__code__", None), "co_argcount", 1) != 1:
        raise TypeError(f"tool must take one argument (the expression), as calculator does: {tool!r}")


def call_tool(tool: ToolFunction, tool_call: Mapping[str, Any]) -> tuple[str, bool]:
    """Run one parsed call with ``tool``: (what the model reads back, whether it failed), as TRL's loop does.

    A call to another name, bad arguments or an exception read back as ``{'error': ...}``.
    """
    function = tool_call.get("function") or {}
    if tool_call.get("type", "function") != "function":
        return str({"error": f"Unsupported tool call type: {tool_call.get('type')}"}), True
    if function.get("name") != TOOL_NAME:
        return str({"error": f"Tool {function.get('name')} not found."}), True
    try:
        return str(tool(**(function.get("arguments") or {}))), False
    except Exception as exc:  # the model reads every refusal back, as in training
        return str({"error": str(exc)}), True


def tool_suffix_ids(tokenizer: Any, tool_messages: list[dict[str, Any]]) -> list[int]:
    """The tokens the template puts after an assistant turn that called: the tool turns and the next assistant
    header. Rendered from a minimal conversation and cut at its end of turn, as TRL's trainer does."""
    calls = [{"type": "function", "function": {"name": tool_messages[0]["name"], "arguments": {}}}]
    dummy = [{"role": "user", "content": "dummy"}, {"role": "assistant", "content": "", "tool_calls": calls}]
    prefix = tokenizer.apply_chat_template(dummy, tokenize=True, return_dict=True)["input_ids"]
    full = tokenizer.apply_chat_template(dummy + tool_messages, add_generation_prompt=True, tokenize=True,
                                         return_dict=True)["input_ids"]  # fmt: skip
    ends = [i for i, token in enumerate(prefix) if token == tokenizer.eos_token_id]
    prefix = prefix[: ends[-1] + 1] if ends else prefix
    if full[: len(prefix)] != prefix:
        raise ValueError("The chat template renders a tool turn that does not extend the assistant turn before it")
    return full[len(prefix) :]


def _prompt_ids(tokenizer: Any, prompt: list[dict[str, Any]], tools: list[Any] | None) -> list[int]:
    rendered = tokenizer.apply_chat_template(prompt, tools=tools, add_generation_prompt=True, tokenize=True,
                                             return_dict=True)  # fmt: skip
    return list(rendered["input_ids"])


def _generate(model: Any, tokenizer: Any, rows: list[list[int]], new_tokens: int, sample: bool, temperature: float):
    """One batched ``generate`` over ``rows`` (left-padded); the new ids of each row."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    width = max(len(r) for r in rows)
    ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    settings = {"do_sample": sample, "temperature": temperature if sample else None, "top_p": None, "top_k": None}
    with torch.inference_mode():
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens, pad_token_id=pad,
                             **settings)  # fmt: skip
    return [row.tolist() for row in out[:, width:]]


def _until_end(ids: list[int], eos: int) -> tuple[list[int], bool]:
    """The ids up to and with the first end of turn, and whether there was one."""
    return (ids[: ids.index(eos) + 1], True) if eos in ids else (ids, False)


def tool_generate(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[list[dict[str, Any]]],
    tool: ToolFunction | None = calculator,
    *,
    max_new_tokens: int = 256,
    max_calls: int = 3,
    sample: bool = False,
    temperature: float = 1.0,
) -> list[ToolRollout]:
    """Complete each chat in ``prompts`` with ``tool`` answering the calculator's calls, batched (see the module).

    ``tokenizer``: a tool tokenizer (``training.tool_lab.tool_tokenizer``, or the one saved with a tool model).
    ``max_calls``: rounds of calls per completion (``max_tool_calling_iterations``); after the last, a call is left
    unanswered and the completion ends there. ``tool=None``: no tool offered (no schema in the prompt, no round of
    calls). Greedy unless ``sample`` (seed torch before for reproducible draws).
    """
    _check_positive(max_new_tokens=max_new_tokens, max_calls=max_calls)
    _check_tool(tool)
    if getattr(tokenizer, "response_template", None) is None and getattr(tokenizer, "response_schema", None) is None:
        raise ValueError("The tokenizer has no parser for tool calls: build it with training.tool_lab.tool_tokenizer")
    rollouts = [ToolRollout() for _ in prompts]
    tools, rounds = ([calculator], max_calls) if tool is not None else (None, 0)
    ids = [_prompt_ids(tokenizer, p, tools) for p in prompts]
    starts = [len(i) for i in ids]
    active, eos = list(range(len(prompts))), tokenizer.eos_token_id
    for round_ in range(rounds + 1):
        budgets = [max_new_tokens - (len(ids[i]) - starts[i]) for i in active]
        new = _generate(model, tokenizer, [ids[i] for i in active], max(budgets), sample, temperature)
        still = []
        for i, budget, generated in zip(active, budgets, new, strict=True):
            turn, ended = _until_end(generated[:budget], eos)
            message = parse_response(tokenizer, turn, prefix=ids[i], tools=tools)
            ids[i] += turn
            rollouts[i].messages.append(message)
            rollouts[i].truncated = not ended
            calls = message.get("tool_calls") or []
            if tool is None or not calls or not ended or round_ == rounds:
                continue
            replies = [call_tool(tool, call) for call in calls]
            answers = [{"role": "tool", "name": TOOL_NAME, "content": text} for text, _ in replies]
            suffix = tool_suffix_ids(tokenizer, answers)
            rollouts[i].calls += len(calls)
            rollouts[i].failures += sum(failed for _, failed in replies)
            if len(ids[i]) + len(suffix) - starts[i] >= max_new_tokens:
                rollouts[i].truncated = True  # no room left for the answers: the completion ends at its call
                continue
            rollouts[i].messages += answers
            ids[i] += suffix
            still.append(i)
        active = still
        if not active:
            break
    for i, rollout in enumerate(rollouts):
        rollout.tokens = len(ids[i]) - starts[i] - (0 if rollout.truncated else 1)  # the last end of turn not counted
    return rollouts


def _tool_stats(rollouts: Sequence[ToolRollout]) -> dict[str, float]:
    calls = sum(r.calls for r in rollouts)
    return {
        "calls_per_problem": calls / len(rollouts),  # TRL's tools/call_frequency: calls per completion
        "failure_frequency": sum(r.failures for r in rollouts) / calls if calls else 0.0,
        "share_with_calls": sum(r.calls > 0 for r in rollouts) / len(rollouts),
        "ending_in_call_share": sum(r.ends_in_call for r in rollouts) / len(rollouts),
    }


def evaluate_with_tool(
    model: Any,
    tokenizer: Any,
    dataset: Any,
    tool: ToolFunction | None = calculator,
    *,
    batch_size: int = 16,
    max_new_tokens: int = 256,
    max_calls: int = 3,
    speedups: SpeedUps = NO_SPEEDUPS,
) -> dict[str, Any]:
    """Greedy completions of ``dataset``'s problems with ``tool`` (None: no tool offered), scored
    (``metrics.score_completions``'s dict: accuracy, ``format_score``, ``truncation_rate``...), plus
    ``calls_per_problem``, ``failure_frequency``, ``share_with_calls``, ``ending_in_call_share`` and each record's
    ``calls`` and ``failures``. ``speedups``: the plug-in to generate through (``speedups=cpu_speed``)."""
    _check_positive(batch_size=batch_size)
    rows = rows_to_evaluate(dataset)
    started, rollouts = time.perf_counter(), []
    with speedups.for_generation(model):
        for start in range(0, len(rows), batch_size):
            batch = [r["prompt"] for r in rows[start : start + batch_size]]
            rollouts += tool_generate(model, tokenizer, batch, tool, max_new_tokens=max_new_tokens, max_calls=max_calls)
    result = score_completions(
        [r.text for r in rollouts],
        [str(row["answer"]) for row in rows],
        questions=[str(row.get("question", "")) for row in rows],
        truncated=[r.truncated for r in rollouts],
        completion_tokens=[r.tokens for r in rollouts],
        elapsed_seconds=time.perf_counter() - started,
    )
    for record, rollout in zip(result["records"], rollouts, strict=True):
        record.update(calls=rollout.calls, failures=rollout.failures)
    return result | _tool_stats(rollouts) | {"tool": "none" if tool is None else getattr(tool, "__name__", repr(tool))}


def evaluate_sampled_with_tool(
    model: Any,
    tokenizer: Any,
    dataset: Any,
    tool: ToolFunction | None = calculator,
    *,
    samples: int = 8,
    ks: Sequence[int] = (1, 8),
    prompts_per_batch: int = 4,
    max_new_tokens: int = 256,
    max_calls: int = 3,
    temperature: float = 1.0,
    seed: int = 0,
    speedups: SpeedUps = NO_SPEEDUPS,
) -> dict[str, Any]:
    """``samples`` completions per problem with ``tool`` (None: no tool offered): pass@k for each of ``ks`` and
    maj@samples, as ``sampling.evaluate_sampled`` reports them, and over every sample the ``format_score`` and
    ``truncation_rate``; each batch seeded with ``seed`` plus its index."""
    _check_positive(samples=samples, prompts_per_batch=prompts_per_batch)
    if not ks or any(isinstance(k, bool) or not isinstance(k, Integral) or not 1 <= k <= samples for k in ks):
        raise ValueError(f"ks must be whole numbers from 1 to samples={samples}, got {ks!r}")
    rows = rows_to_evaluate(dataset)
    started, records, rollouts, golds = time.perf_counter(), [], [], []
    with speedups.for_generation(model):
        for index, start in enumerate(range(0, len(rows), prompts_per_batch)):
            batch = rows[start : start + prompts_per_batch]
            torch.manual_seed(seed + index)
            prompts = [row["prompt"] for row in batch for _ in range(samples)]
            drawn = tool_generate(model, tokenizer, prompts, tool, max_new_tokens=max_new_tokens, max_calls=max_calls,
                                  sample=True, temperature=temperature)  # fmt: skip
            rollouts += drawn
            golds += [str(row["answer"]) for row in batch for _ in range(samples)]
            for j, row in enumerate(batch):
                group = drawn[j * samples : (j + 1) * samples]
                records.append(problem_record([r.text for r in group], str(row["answer"]), list(ks)))
    elapsed = time.perf_counter() - started
    every = score_completions([r.text for r in rollouts], golds, truncated=[r.truncated for r in rollouts])
    shares = {key: every[key] for key in ("format_score", "truncation_rate")}
    return summarize_samples(records, list(ks)) | _tool_stats(rollouts) | shares | {
        "records": records, "samples": samples, "ks": list(ks), "elapsed_seconds": elapsed}  # fmt: skip


# The lines make bench-tools writes for each arm and each difference ({arm}, {first}, {second}: ARMS keys), by the
# column of the tables that show them: one home for the names the bench writes and notebook 08 reads
ARM_LINES = {
    "greedy": "tools_heldout_accuracy_{arm}",
    "greedy 95% CI": "tools_heldout_accuracy_{arm}_ci",
    "format": "tools_heldout_format_{arm}",
    "truncated": "tools_heldout_truncation_{arm}",
    "calls per problem": "tools_heldout_calls_per_problem_{arm}",
    "pass@1": "tools_sampled_pass@1_{arm}",
    "pass@1 95% CI": "tools_sampled_pass@1_{arm}_ci",
    "sampled truncated": "tools_sampled_truncation_{arm}",
}
DIFFERENCE_LINES = {
    "greedy difference": "tools_greedy_{first}_minus_{second}",
    "greedy 95% CI": "tools_greedy_{first}_minus_{second}_ci",
    "pass@1 difference": "tools_pass1_{first}_minus_{second}",
    "pass@1 95% CI": "tools_pass1_{first}_minus_{second}_ci",
}
MISSING = "missing"


def _label(name: str) -> str:
    return ARMS.get(name, name)


def _model_row(result: Mapping[str, Any], sampled: Mapping[str, Any] | None) -> dict[str, Any]:
    low, high = result["accuracy_ci"]
    row = {"n": result["n"], "greedy": result["accuracy"], "greedy 95% CI": f"{low:.3f}-{high:.3f}",
           "format": result["format_score"], "truncated": result["truncation_rate"],
           "calls per problem": result.get("calls_per_problem", 0.0),
           "ending in a call": result.get("ending_in_call_share", 0.0)}  # fmt: skip
    for key, value in (sampled or {}).items():
        if key.startswith(("pass@", "maj@")) and not key.endswith("_ci"):
            low, high = sampled[f"{key}_ci"]
            row[key], row[f"{key} 95% CI"] = value, f"{low:.3f}-{high:.3f}"
    if sampled and "truncation_rate" in sampled:
        row["sampled truncated"] = sampled["truncation_rate"]
    return row


def tool_table(
    greedy: Mapping[str, Mapping[str, Any]],
    sampled: Mapping[str, Mapping[str, Any]] | None = None,
    differences: Sequence[tuple[str, str]] | None = None,
) -> tuple[Any, Any]:
    """(models, differences) on the same problems (checked), each model under its ``ARMS`` label where it has one.

    models: greedy accuracy with its Wilson interval, strict format, the share cut by the budget, calls per problem,
    the share ending on an unanswered call, and pass@k with bootstrap intervals where ``sampled`` has the model.
    differences: for each (first, second) of ``differences`` (default ``DIFFERENCES`` when ``greedy`` holds the three
    arms, else every pair in order), first minus second in greedy accuracy and, where both were sampled, in pass@1,
    each with a paired interval, and the problems only one solves greedily with McNemar's exact p. Why paired: both
    meet the same problems, so what both find easy or hard cancels out.
    """
    if len(greedy) < 1:
        raise ValueError("greedy must map at least one model's name to its evaluation result")
    sampled = sampled or {}
    models = {_label(name): _model_row(result, sampled.get(name)) for name, result in greedy.items()}
    if differences is None:
        differences = DIFFERENCES if set(ARMS) <= set(greedy) else tuple(itertools.combinations(greedy, 2))
    rows = {}
    for first, second in differences:
        if first not in greedy or second not in greedy:
            raise ValueError(f"difference ({first!r}, {second!r}) names a model greedy lacks; it has {list(greedy)}")
        only_first, only_second = paired_counts(greedy[first], greedy[second])
        diff = paired_difference(greedy[second], greedy[first], "correct")  # the first's minus the second's
        low, high = diff["ci"]
        row = {"greedy difference": diff["difference"], "greedy 95% CI": f"{low:+.3f} to {high:+.3f}",
               "only first": only_first, "only second": only_second,
               "McNemar p": mcnemar_exact(only_first, only_second)}  # fmt: skip
        if first in sampled and second in sampled:
            diff = paired_difference(sampled[second], sampled[first], "pass@1")
            low, high = diff["ci"]
            row |= {"pass@1 difference": diff["difference"], "pass@1 95% CI": f"{low:+.3f} to {high:+.3f}"}
        rows[f"{_label(first)} minus {_label(second)}"] = row
    frames = pd.DataFrame(models).T, pd.DataFrame(rows).T if rows else pd.DataFrame()
    return tuple(frame.infer_objects() for frame in frames)  # numbers as numbers, so .round() reaches them


def measured_tool_table(results: str = "results_tools") -> tuple[Any, Any, list[str]]:
    """(models, differences, missing): ``tool_table``'s columns as ``make bench-tools`` measured them, read by line
    name (``ARM_LINES``, ``DIFFERENCE_LINES``) from ``benchmarks/<results>.txt``; a line it lacks shows as
    ``"missing"`` and is named in ``missing``. Why: the measured figures have one home, the file; text cites it."""
    wanted = {column: [template.format(arm=arm) for arm in ARMS] for column, template in ARM_LINES.items()}
    pairs = {column: [template.format(first=a, second=b) for a, b in DIFFERENCES]
             for column, template in DIFFERENCE_LINES.items()}  # fmt: skip
    names = [name for group in (*wanted.values(), *pairs.values()) for name in group]
    figures = bench_figures(names, results)
    models = pd.DataFrame({column: [figures.get(name, MISSING) for name in lines] for column, lines in wanted.items()},
                          index=[_label(arm) for arm in ARMS])  # fmt: skip
    labels = [f"{_label(a)} minus {_label(b)}" for a, b in DIFFERENCES]
    differences = pd.DataFrame({column: [figures.get(name, MISSING) for name in lines]
                                for column, lines in pairs.items()}, index=labels)  # fmt: skip
    return models, differences, [name for name in names if name not in figures]


def _interval_bounds(interval: Any) -> tuple[float, float]:
    """(low, high) from a pair of numbers or the text ``tool_table`` and the bench write (``"-0.010 to +0.025"``)."""
    try:
        low, high = (float(x) for x in interval.split(" to ")) if isinstance(interval, str) else interval
    except (TypeError, ValueError):
        raise ValueError(f"interval must be (low, high) or 'low to high', got {interval!r}") from None
    return float(low), float(high)


def describe_differences(differences: Any) -> list[str]:
    """One sentence per paired difference of a ``tool_table`` or ``measured_tool_table`` differences frame: its value
    and interval, and whether the interval lies above 0, below 0 or across it; a figure not measured says so.

    Why: the words follow the figures, whatever they are; an interval across 0 is no evidence either way.
    """
    sentences = []
    for label, row in differences.iterrows():
        for measure, column in (("greedy accuracy", "greedy"), ("sampled pass@1", "pass@1")):
            value, interval = row.get(f"{column} difference"), row.get(f"{column} 95% CI")
            if value is None or interval is None or MISSING in (value, interval) or value != value:  # NaN: not sampled
                sentences.append(f"{label}, {measure}: not measured.")
                continue
            low, high = _interval_bounds(interval)
            if low > 0:
                verdict = "the interval lies above 0: higher on these problems"
            elif high < 0:
                verdict = "the interval lies below 0: lower on these problems"
            else:
                verdict = "the interval spans 0: this measurement cannot tell the two apart"
            sentences.append(f"{label}, {measure}: {float(value):+.3f} (paired 95% interval {low:+.3f} to "
                             f"{high:+.3f}); {verdict}.")  # fmt: skip
    return sentences
