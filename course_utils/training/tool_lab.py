"""Notebook 08's run, notebook 04's with a calculator: a warm start on tool-call traces, then GRPO with ``tools=``.

The pieces, each from the profile (its ``tool_*`` fields, the rest as notebook 04's run):

1. ``tool_tokenizer``: a tokenizer whose chat template renders tool calls. SmolLM2's own template has no tool turns
   (TRL refuses it: "The provided chat template does not support tool calling"), so the CPU profiles set TRL's
   vendored Qwen2.5 template (``trl.chat_template_utils.qwen2_5_chat_template``). It is sound on SmolLM2's
   tokenizer: both are ChatML, with the same ``<|im_start|>``/``<|im_end|>`` special tokens in SmolLM2's vocabulary,
   so a turn is tokenized as SmolLM2 was trained to read it; the template only adds the tools block to the system
   turn and the ``<tool_call>``/``<tool_response>`` turns. TRL recognises that template by its text and sets the
   parser that reads ``<tool_call>`` JSON back (``add_response_schema``). The GPU profiles keep
   Qwen2.5-Instruct's own template, which renders tools (checked with TRL's ``supports_tool_calling``).
2. ``trace_dataset``: the warm start's examples, GSM8K's ``<<expr=result>>`` notes as calls
   (``lesson.tool_use.tool_call_trace``), with the ``tools`` column TRL's ``SFTTrainer`` renders into the prompt.
   ``trace_completion_tokens`` measures each as TRL counts it against ``max_completion_length`` and
   ``share_over_budget`` says how many a budget would cut: the profile's ``tool_max_completion_length`` comes from it.
3. ``make_tool_grpo_config``: notebook 04's ``GRPOConfig`` with the tool run's steps, length and
   ``max_tool_calling_iterations``, and one more reward weight (``tool_use_reward``).
4. ``run_tool_lab``: all of it in one call, for the benchmark, the notebook and the tests. ``with_tool=False`` runs
   the same recipe without the calculator (``plain_trace_example``): the model the tool model is compared with.

Generation in TRL's tool loop: after each round of calls, TRL generates again for the completions that called, each
from its prompt, its completion so far and the tool's answer, asking for ``max_completion_length`` new tokens and
cutting what exceeds the completion's budget afterwards. ``completion_budget`` asks for no more than the budget
left, so a round stops where TRL would cut it: the same tokens are kept, fewer are computed and thrown away.
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from datasets import Dataset
from transformers import TrainerCallback
from transformers.utils import get_json_schema
from trl import GRPOTrainer
from trl.chat_template_utils import add_response_schema, qwen2_5_chat_template, supports_tool_calling

from course_utils.core.paths import output_dir
from course_utils.core.profiles import Profile, get_profile
from course_utils.core.speedups import NO_SPEEDUPS, SpeedUps
from course_utils.lesson.data import from_bundled_sample, load_gsm8k
from course_utils.lesson.data_checks import solution_steps
from course_utils.lesson.formatting import build_prompt
from course_utils.lesson.rewards import REWARD_FUNCS, grpo_reward_weights
from course_utils.lesson.tool_use import calculator, tool_call_trace, tool_use_reward
from course_utils.training import problem_choice, run_folder
from course_utils.training.grpo_config import make_grpo_config
from course_utils.training.grpo_prompts import training_dataset
from course_utils.training.run import build_trainer, clear_run_dir, load_model_for_training
from course_utils.training.run_folder import FINAL_DIRNAME, WARM_START_DIRNAME
from course_utils.training.run_logs import save_run_artifacts
from course_utils.training.warm_start import warm_start

TOOL_TEMPLATES = ("own", "trl-qwen2.5")
END_OF_TURN = "<|im_end|>"  # ChatML's end of a turn: Qwen2.5's template ends each turn with it
TRACE_MAX_TOKENS = 512  # the warm start's max_length: a longer trace would be cut before its answer
TOOL_USE_WEIGHT = 1.0  # tool_use_reward's weight beside the course's five (their preset's weights)
# The tool run's own fields, each in place of notebook 04's where the profile sets it (None: notebook 04's)
TOOL_RUN_FIELDS = {
    "tool_max_steps": "max_steps",
    "tool_learning_rate": "learning_rate",
    "tool_max_completion_length": "max_completion_length",
    "tool_max_solution_steps": "max_solution_steps",
}


# --- The tokenizer ---------------------------------------------------------------------------------------


def tool_tokenizer(tokenizer: Any, profile: Profile | str | None = None) -> Any:
    """A copy of ``tokenizer`` whose chat template renders tool calls, with TRL's parser for them set.

    ``profile.tool_chat_template``: "trl-qwen2.5" sets TRL's vendored Qwen2.5 template and ChatML's end of turn as
    the end of sequence (SmolLM2's tokenizer has both markers); "own" keeps the model's template. Either way the
    template must render a whole tool exchange (TRL's ``supports_tool_calling``), else a ``ValueError`` says so.
    """
    p = get_profile(profile)
    if p.tool_chat_template not in TOOL_TEMPLATES:
        raise ValueError(f"Profile {p.name!r}: tool_chat_template={p.tool_chat_template!r}, expected one of "
                         f"{TOOL_TEMPLATES}")  # fmt: skip
    if not hasattr(tokenizer, "apply_chat_template"):
        raise TypeError(f"tokenizer must be a transformers tokenizer, got {type(tokenizer).__name__}")
    tokenizer = copy.deepcopy(tokenizer)
    if p.tool_chat_template == "trl-qwen2.5":
        if tokenizer.convert_tokens_to_ids(END_OF_TURN) == tokenizer.unk_token_id:
            raise ValueError(f"The tokenizer has no {END_OF_TURN} token: TRL's Qwen2.5 template needs ChatML's markers")
        tokenizer.chat_template, tokenizer.eos_token = qwen2_5_chat_template, END_OF_TURN
    if not supports_tool_calling(tokenizer):
        raise ValueError(
            f"Profile {p.name!r}: the chat template does not render tool calls and their answers (TRL's "
            "supports_tool_calling). Set tool_chat_template='trl-qwen2.5' for a ChatML model, or load a model whose "
            "template supports tools."
        )
    return add_response_schema(tokenizer)


def tool_schemas(tools: Iterable[Callable[..., Any]] = (calculator,)) -> list[dict[str, Any]]:
    """The JSON schema of each tool, read from its type hints and docstring (``transformers``' ``get_json_schema``)."""
    return [get_json_schema(tool) for tool in tools]


# --- The warm start's traces -----------------------------------------------------------------------------


def trace_example(row: Mapping[str, Any]) -> dict[str, Any]:
    """One warm-start example from a raw GSM8K row: notebook 04's ``prompt``, the trace's turns as ``completion``,
    and ``tools``, the calculator's schema as JSON text (TRL's ``SFTTrainer`` reads it and renders it into the
    prompt; text, because a dataset column holds one type)."""
    solution, answer = row["answer"].split("####", 1)
    trace = tool_call_trace(solution, answer.strip().replace(",", ""))
    return {"prompt": build_prompt(row["question"]), "completion": trace.messages, "tools": json.dumps(tool_schemas())}


def trace_tokens(tokenizer: Any, example: Mapping[str, Any]) -> int:
    """The tokens of a warm-start example as the tool tokenizer renders it, tools block included."""
    messages = [*example["prompt"], *example["completion"]]
    rendered = tokenizer.apply_chat_template(messages, tools=json.loads(example["tools"]), return_dict=True)
    return len(rendered["input_ids"])


def trace_completion_tokens(tokenizer: Any, example: Mapping[str, Any]) -> int:
    """The tokens of ``max_completion_length`` a warm-start example's completion takes, counted as TRL counts them:
    everything after the prompt's assistant header to the last end of turn, the calls and the tool's answer turns
    included. An example without a ``tools`` column is rendered without the tools block.

    Why: TRL cuts a completion at the budget and drops a tool answer that would not fit, so a budget below the
    traces' length cuts the very completions the warm start taught before their ``<answer>``.
    """
    if not isinstance(example, Mapping) or "prompt" not in example or "completion" not in example:
        raise TypeError("example must be a warm-start example with 'prompt' and 'completion' (trace_example's rows)")
    tools = json.loads(example["tools"]) if example.get("tools") else None
    prompt = tokenizer.apply_chat_template(list(example["prompt"]), tools=tools, add_generation_prompt=True,
                                           return_dict=True)["input_ids"]  # fmt: skip
    whole = tokenizer.apply_chat_template([*example["prompt"], *example["completion"]], tools=tools,
                                          return_dict=True)["input_ids"]  # fmt: skip
    if list(whole[: len(prompt)]) != list(prompt):
        raise ValueError(
            "The chat template renders the prompt otherwise inside the whole example: no completion to count"
        )
    ends = [i for i, token in enumerate(whole) if token == tokenizer.eos_token_id and i >= len(prompt)]
    if not ends:
        raise ValueError(f"The completion has no end of turn ({tokenizer.eos_token!r}): use the tool_tokenizer")
    return ends[-1] + 1 - len(prompt)


def share_over_budget(lengths: Iterable[int], budget: int) -> float:
    """The share of ``lengths`` (tokens per trace or completion) above ``budget``: what a ``max_completion_length``
    of ``budget`` would cut. Why: a budget is chosen from the lengths it must hold, not guessed."""
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
        raise ValueError(f"budget must be a positive whole number of tokens, got {budget!r}")
    if isinstance(lengths, (str, bytes, Mapping)):
        raise TypeError(f"lengths must be whole numbers of tokens, one per trace, got {type(lengths).__name__}")
    values = list(lengths)
    if not values:
        raise ValueError("lengths is empty: measure at least one trace (trace_completion_tokens)")
    if any(isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in values):
        raise ValueError(f"lengths must be whole numbers of tokens >= 0, got {values[:5]}")
    return sum(v > budget for v in values) / len(values)


def plain_trace_example(example: Mapping[str, Any]) -> dict[str, Any]:
    """A warm-start trace without the calculator, for the no-tool model trained by the same recipe: the same prompt,
    and one assistant turn with the trace's assistant text in order; no ``tools`` column, so no tools block.

    Why this is the same example less the tool: GSM8K writes each result right after its note (``48/2 = <<48/2=24>>24
    clips``), so a trace's turns stop at ``48/2 = `` and go on with ``24 clips``; joined, they read ``48/2 = 24
    clips``: the same problem, solution and arithmetic, with the model writing each result the calculator gave.
    """
    completion = example.get("completion") if isinstance(example, Mapping) else None
    if not isinstance(completion, list) or "prompt" not in example:
        raise TypeError("example must be a warm-start trace with 'prompt' and 'completion' (trace_example's rows)")
    text = "".join(
        m.get("content") or "" for m in completion if isinstance(m, Mapping) and m.get("role") == "assistant"
    )
    return {"prompt": list(example["prompt"]), "completion": [{"role": "assistant", "content": text}]}


def trace_rows(profile: Profile | str | None, tokenizer: Any, folder: str | Path | None = None) -> list[int]:
    """The train rows of the warm start's traces: from the end of the split back, the first
    ``tool_warm_start_examples`` whose solution has at most ``tool_max_solution_steps`` steps and whose trace fits
    in ``TRACE_MAX_TOKENS`` (the warm start's ``max_length``, which would cut a longer one before its answer). GRPO
    uses the rows before the first of them. How many were passed over, and why, is printed."""
    p = get_profile(profile)
    if p.tool_warm_start_examples < 1:
        raise ValueError(f"Profile {p.name!r} has tool_warm_start_examples={p.tool_warm_start_examples}: no traces")
    raw, limit = load_gsm8k("train", folder, verbose=False), p.tool_max_solution_steps
    listed = listed_rows(p, raw)
    rows, long_steps, too_long, grpo_problems = [], 0, 0, 0
    for index in range(len(raw) - 1, -1, -1):
        if len(rows) == p.tool_warm_start_examples:
            break
        if index in listed:
            grpo_problems += 1
        elif limit is not None and solution_steps(raw[index]["answer"]) > limit:
            long_steps += 1
        elif trace_tokens(tokenizer, trace_example(raw[index])) > TRACE_MAX_TOKENS:
            too_long += 1
        else:
            rows.append(index)
    if len(rows) < p.tool_warm_start_examples:
        raise ValueError(
            f"Only {len(rows)} train rows give a trace of at most {limit} solution steps and {TRACE_MAX_TOKENS} "
            "tokens: lower tool_warm_start_examples or raise tool_max_solution_steps"
        )
    print(
        f"Warm-start traces: the last {len(rows)} train rows of at most {limit} solution steps and {TRACE_MAX_TOKENS} "
        f"tokens ({long_steps} rows with more steps, {too_long} longer traces and {grpo_problems} of GRPO's problems "
        "passed over)."
    )
    return sorted(rows)


def listed_rows(p: Profile, raw: Any) -> set[int]:
    """The train rows of the profile's problem list (GRPO's problems, never a trace); none without a list or on the
    bundled sample, where no list applies."""
    if p.problem_list is None or from_bundled_sample(raw):
        return set()
    return set(problem_choice.listed_rows(raw["question"], problem_choice.load_problem_list(p.problem_list)))


def trace_dataset(profile: Profile | str | None, tokenizer: Any, folder: str | Path | None = None) -> Dataset:
    """The warm start's examples (``trace_example``) from the rows ``trace_rows`` picks; ``tokenizer`` is the
    ``tool_tokenizer`` that measures them."""
    raw = load_gsm8k("train", folder, verbose=False)
    return Dataset.from_list([trace_example(raw[index]) for index in trace_rows(profile, tokenizer, folder)])


# --- GRPO with the tool ----------------------------------------------------------------------------------


# Three passes over the traces, as notebook 04's warm start: after one, most of the tool model's completions missed the
# format (notebook 06's collapse lesson, again); three wrote it in most (make bench-tools measures the recipe)
TOOL_WARM_START_EPOCHS = 3.0


def tool_warm_start_profile(profile: Profile | str | None = None) -> Profile:
    """The profile as the warm start on traces reads it: ``tool_warm_start_examples`` traces, ``TOOL_WARM_START_EPOCHS``
    passes whatever notebook 04's profile says."""
    p = get_profile(profile)
    return p.override(warm_start_examples=p.tool_warm_start_examples, warm_start_epochs=TOOL_WARM_START_EPOCHS)


def tool_run_profile(profile: Profile | str | None = None) -> Profile:
    """The profile as the tool run reads it: its ``tool_*`` steps, rate and length in place of notebook 04's."""
    p = get_profile(profile)
    named = {field: getattr(p, tool_field) for tool_field, field in TOOL_RUN_FIELDS.items()}
    changes = {field: value for field, value in named.items() if value is not None}
    return p.override(name=f"{p.name}-tools", problem_list=None, **changes)


def make_tool_grpo_config(
    profile: Profile | str | None = None, output_dir: str | Path | None = None, **overrides: Any
) -> Any:
    """Notebook 04's ``GRPOConfig`` for the tool run: ``max_tool_calling_iterations``, the tool run's steps and
    completion length, and the weights of the course's rewards followed by ``TOOL_USE_WEIGHT``."""
    p = get_profile(profile)
    run = tool_run_profile(p)
    weights = [*grpo_reward_weights(p.reward_weights), TOOL_USE_WEIGHT]
    settings = {"max_tool_calling_iterations": p.max_tool_calling_iterations, "reward_weights": weights}
    return make_grpo_config(run, output_dir or tool_run_dir(p), **(settings | overrides))


NO_TOOL_SUFFIX = "-no-tool"  # the folder of the same recipe without the calculator: outputs/tools-<profile>-no-tool


def tool_run_dir(profile: Profile | str | None = None, with_tool: bool = True) -> Path:
    """Where the tool run writes: ``outputs/tools-<profile>``; its twin without the calculator, ``...-no-tool``."""
    return output_dir() / f"tools-{get_profile(profile).name}{'' if with_tool else NO_TOOL_SUFFIX}"


def tool_reward_funcs() -> list[Callable[..., list[float]]]:
    """The course's five rewards and ``tool_use_reward``, in the order of ``make_tool_grpo_config``'s weights."""
    return [*REWARD_FUNCS, tool_use_reward]


def tool_training_dataset(profile: Profile | str | None, tokenizer: Any, first_trace_row: int | None = None) -> Any:
    """The GRPO prompts of the tool run: notebook 04's. Where the profile has a problem list, its problems (ones a
    warm start solves sometimes, so that right answers occur in a few steps, and with them the tool reward, which
    pays only a right answer; ``trace_rows`` leaves them out of the traces); else from the rows before
    ``first_trace_row`` (the warm start's traces)."""
    p = get_profile(profile)
    rows = len(load_gsm8k("train", verbose=False))
    held = rows - first_trace_row if first_trace_row is not None else p.warm_start_examples
    return training_dataset(tool_run_profile(p).override(warm_start_examples=held, problem_list=p.problem_list),
                            tokenizer=tokenizer)  # fmt: skip


@contextmanager
def completion_budget(model: Any, tokenizer: Any, max_completion_length: int) -> Iterator[None]:
    """Inside: a ``model.generate`` call whose rows already hold part of a completion (TRL's rounds after a tool
    answer) asks for at most the longest row's budget left, not ``max_completion_length`` new tokens again.

    A row's completion starts after its first assistant header (the prompt ends with exactly one); TRL cuts every
    round to that budget afterwards, so the kept tokens are the same. Put back on exit.
    """
    header = tokenizer("<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]
    inner = model.__dict__.get("generate")
    original = model.generate

    def generate(*args: Any, **kwargs: Any) -> Any:
        ids, mask = kwargs.get("input_ids"), kwargs.get("attention_mask")
        if ids is not None and mask is not None and "max_new_tokens" not in kwargs:
            used = max(_completion_tokens(row[m.bool()].tolist(), header) for row, m in zip(ids, mask, strict=True))
            if used > 0:
                kwargs["max_new_tokens"] = max(1, max_completion_length - used)
        return original(*args, **kwargs)

    model.generate = generate
    try:
        yield
    finally:
        if inner is None:
            model.__dict__.pop("generate", None)
        else:
            model.generate = inner


def _completion_tokens(row: list[int], header: list[int]) -> int:
    """Tokens after the first assistant header of ``row`` (0 when there is none)."""
    width = len(header)
    for start in range(len(row) - width + 1):
        if row[start : start + width] == header:
            return len(row) - start - width
    return 0


@dataclass
class ToolLabResult:
    """What ``run_tool_lab`` did: the trainer and its log, the tool tokenizer, where it saved, how long it took."""

    trainer: Any
    tokenizer: Any
    run_dir: Path
    final_dir: Path
    warm_start_seconds: float
    train_seconds: float

    @property
    def log_history(self) -> list[dict[str, Any]]:
        return self.trainer.state.log_history


def build_tool_trainer(
    model: Any,
    tokenizer: Any,
    profile: Profile | str | None = None,
    train_dataset: Any = None,
    config: Any = None,
    callbacks: Iterable[TrainerCallback] = (),
    tools: Iterable[Callable[..., Any]] = (calculator,),
) -> GRPOTrainer:
    """``GRPOTrainer(..., tools=[calculator])`` on ``tool_reward_funcs`` with LoRA from the profile: exercise 08.4's
    call. ``tokenizer`` must be a ``tool_tokenizer``."""
    p = get_profile(profile)
    return build_trainer(
        model,
        tokenizer,
        p,
        train_dataset=train_dataset if train_dataset is not None else tool_training_dataset(p, tokenizer),
        config=config if config is not None else make_tool_grpo_config(p),
        callbacks=callbacks,
        reward_funcs=tool_reward_funcs(),
        tools=tools,
    )


def run_tool_lab(
    profile: Profile | str | None = None,
    speedups: SpeedUps = NO_SPEEDUPS,
    callbacks: Iterable[TrainerCallback] = (),
    with_tool: bool = True,
    **config_overrides: Any,
) -> ToolLabResult:
    """The whole tool lab in one call: load, tool template, warm start on traces, GRPO with the calculator, save.

    ``with_tool=False``: the same recipe without the calculator, so that the calculator is the one difference
    between two models: the same start model, traces (``plain_trace_example``: each result written, not called),
    problems, steps, rate, rewards and completion budget, with no tools offered; in ``tool_run_dir(p, False)``.
    ``speedups``: the plug-in the warm start and GRPO run with (``speedups=cpu_speed``), default plain TRL.
    ``config_overrides`` replace ``GRPOConfig`` fields. The warm start is kept in the run folder and reused when
    its settings and traces match (``training.warm_start``). Saves the log history and the merged model with its
    tool tokenizer in ``<run folder>/final``.
    """
    if not isinstance(with_tool, bool):
        raise TypeError(f"with_tool must be True or False, got {with_tool!r}")
    p = get_profile(profile)
    folder = Path(config_overrides.pop("output_dir", None) or tool_run_dir(p, with_tool))
    config = make_tool_grpo_config(p, folder, **config_overrides)
    started = time.perf_counter()
    model, tokenizer = load_model_for_training(p)
    tokenizer = tool_tokenizer(tokenizer, p)
    first_trace_row = None
    if p.tool_warm_start_examples:
        first_trace_row = trace_rows(p, tokenizer)[0]
        traces = trace_dataset(p, tokenizer)
        if not with_tool:
            traces = Dataset.from_list([plain_trace_example(row) for row in traces])
        cache = folder / WARM_START_DIRNAME / "model"
        model = warm_start(model, tokenizer, tool_warm_start_profile(p), dataset=traces, cache=cache, speedups=speedups)
    warm_seconds = time.perf_counter() - started
    dataset = tool_training_dataset(p, tokenizer, first_trace_row)
    tools = (calculator,) if with_tool else ()
    trainer = build_tool_trainer(model, tokenizer, p, dataset, config, callbacks, tools=tools)
    with run_folder.locked(Path(config.output_dir)):  # from the clearing to the saved model, one run in the folder
        run_dir = clear_run_dir(Path(config.output_dir))
        started = time.perf_counter()
        with (
            speedups.enabled(trainer, profile=p),
            completion_budget(trainer.model, tokenizer, config.max_completion_length),
        ):
            trainer.train()
        train_seconds = time.perf_counter() - started
        save_run_artifacts(trainer.state.log_history, run_dir)
        final_dir = save_tool_model(trainer, tokenizer, run_dir / FINAL_DIRNAME)
    return ToolLabResult(trainer, tokenizer, run_dir, final_dir, warm_seconds, train_seconds)


def save_tool_model(trainer: Any, tokenizer: Any, folder: str | Path) -> Path:
    """The trained model with its LoRA merged, and the tool tokenizer (its template), saved in ``folder``."""
    model = trainer.model
    merged = model.merge_and_unload() if hasattr(model, "merge_and_unload") else model
    folder = Path(folder)
    merged.to(torch.float32).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
