"""Notebook 04 (training): the checks of what the learner writes, and what each hands back.

In the lesson the learner writes ``GRPOConfig(...)`` (04.1), ``LoraConfig(...)`` (04.2), the warm start's
``SFTConfig(...)`` (04.3) and the ``GRPOTrainer(...)`` call (04.4); at the end, three values (04.5-04.7) and
``generation_batch`` (04.8). Each check judges what the object does, not whether it equals the package's:

- ``GRPOConfig``: whole groups in the generation batch, the run the profile measured (completions per step,
  group size, steps, a learning rate and a ``beta`` in stated ranges around the profile's, ``beta`` above 0
  where the dashboard draws ``kl``), the precision this machine trains in, a completion length that fits the
  profile and the reference answers, one weight per reward (notebook 03's), the run folder, and values TRL
  accepts. Extra fields (``log_completions=True``, smaller passes with more accumulation) pass.
- ``LoraConfig``: targets that are linear layers of the model, a rank near the profile's, and the profile's
  top layers as a list of indices (an int is one layer to peft, not a count).
- ``SFTConfig``: the micro batch, the warm start's number of steps and learning rate, the precision, a
  ``max_length`` that keeps every example whole, the run folder.
- ``GRPOTrainer``: the course's five rewards with their weights, the checked config, the tokenizer, the
  (warm-started) model with the checked LoRA, and training prompts none of which notebook 05 evaluates on.

Every check prints one verdict and hands back what the notebook continues with: the learner's object when
it passed, else the package's (``training.make_grpo_config``...). Checks never raise.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from peft import LoraConfig
from peft.tuners.tuners_utils import BaseTunerLayer
from peft.utils import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING
from trl import GRPOConfig, GRPOTrainer, SFTConfig

from course_utils.core.hardware import cpu_precision, cuda_available, cuda_bf16_supported
from course_utils.core.profiles import Profile
from course_utils.exercises.comparison import Case, check_against_reference
from course_utils.exercises.verdicts import (
    close_to,
    hand_back,
    is_unanswered,
    library_error,
    list_problems,
    report,
    report_name,
    report_number,
    shown,
)
from course_utils.lesson.data import load_gsm8k
from course_utils.lesson.models import load_tokenizer
from course_utils.lesson.rewards import REWARD_FUNCS
from course_utils.lesson.token_lengths import recommended_completion_length, token_length_stats
from course_utils.training.grpo_config import (
    check_generation_batch,
    make_grpo_config,
    precision_flags,
    resolve_reward_weights,
    vllm_available,
)
from course_utils.training.grpo_prompts import training_dataset
from course_utils.training.lora_setup import lora_targets_in, make_lora_config, top_layer_indices
from course_utils.training.monitoring import monitor
from course_utils.training.preflight import trl_choices
from course_utils.training.trained_model import default_run_dir
from course_utils.training.warm_start import WARM_START_MICRO_BATCH, make_sft_config, warm_start_dataset

REFERENCE_ROWS = 200  # GSM8K train rows whose reference answers size max_completion_length


# Where the library code a construct runs lives: an error raised there by the learner's call is the learner's mistake.
TRL_CONFIG = ("trl/trainer/grpo_config", "trl/trainer/sft_config", "transformers/training_args")
PEFT = ("peft/",)
TRL_TRAINER = ("trl/trainer/", "peft/", "transformers/trainer")


def judge(exercise: str, answer: Any, problems: Sequence[str], hint: str, raised_in: Sequence[str] = ()) -> bool:
    """Print the verdict on a construct: not answered, correct, or every problem found (one a line).

    An answer left at None because the learner's call raised inside the library (``raised_in``) is reported
    with the library's own message, not as unanswered.
    """
    if answer is None and (error := library_error(raised_in)):
        print(f"❌ {exercise}: your call raised an error in the library, so nothing was built:\n   {error}")
        return False
    if is_unanswered(answer) or not problems:
        return report(exercise, not problems, hint, answer)
    list_problems(exercise, f"not yet, {len(problems)} problem{'s' * (len(problems) > 1)}", problems, hint)
    return False


def problems_of(find: Callable[..., list[str]], *args: Any) -> list[str]:
    """``find(*args)``, with an error of the learner's object read as one more problem: a check never raises."""
    try:
        return find(*args)
    except Exception as exc:  # an object too odd to inspect is a verdict, not a crash of the notebook
        return [f"could not be checked ({type(exc).__name__}: {exc})"]


def _kind_problem(answer: Any, kind: type, name: str) -> list[str]:
    return [] if isinstance(answer, kind) else [f"a {type(answer).__name__}, not a {name}; build one with {name}(...)"]


# --- What a config must do on this machine --------------------------------------------------------------


def _bf16_problem(on: bool, profile: Profile) -> str:
    dtype = profile.training_dtype
    if not on:
        return "bf16=False, but the model trains in bfloat16 here (profile.training_dtype): set bf16=True"
    if profile.device == "cpu":
        return (f"bf16=True on this CPU, where the model trains in {dtype}: {cpu_precision().reason}; "
                "set bf16=False (TRL's GRPOConfig turns bf16 on unless you say otherwise)")
    reason = "this GPU has no bfloat16 (a T4)" if not cuda_bf16_supported() else f"the model trains in {dtype}"
    return f"bf16=True, but {reason}: set bf16=False"


def _fp16_problem(on: bool, profile: Profile) -> str:
    if not on:
        return "fp16=False, but the model trains in float16 here (a T4): set fp16=True and bf16=False"
    if profile.device == "cpu":
        return "fp16=True on the CPU: fp16 mixed precision is a GPU feature (no fp16 autocast or scaler on a CPU)"
    return f"fp16=True, but the model trains in {profile.training_dtype} here: set fp16=False"


def precision_problems(config: Any, profile: Profile) -> list[str]:
    """Mixed precision as the model trains on this machine (``profile.training_dtype``), on the profile's device."""
    wanted = precision_flags(profile)
    problems = []
    if bool(config.bf16) != wanted["bf16"]:
        problems.append(_bf16_problem(bool(config.bf16), profile))
    if bool(config.fp16) != wanted["fp16"]:
        problems.append(_fp16_problem(bool(config.fp16), profile))
    if profile.device == "cpu" and not config.use_cpu and cuda_available():
        problems.append("use_cpu=False with a GPU visible: this CPU profile's run would move to the GPU")
    if profile.device == "cuda" and config.use_cpu:
        problems.append("use_cpu=True: this GPU profile would train on the CPU")
    return problems


def run_folder_problems(output_dir: Any, profile: Profile, inside: bool) -> list[str]:
    """``output_dir`` is the run folder (``inside``: or a folder in it)."""
    run_dir = default_run_dir(profile).resolve()
    folder = Path(str(output_dir)).resolve()
    if folder == run_dir or (inside and run_dir in folder.parents):
        return []
    where = "in the run folder" if inside else "the run folder"
    return [f"output_dir {str(output_dir)!r} is not {where} {str(run_dir)!r} (run_dir): the resume (section 10) "
            "and notebook 05 look for checkpoints and the trained model there"]


# --- 04.1 GRPOConfig --------------------------------------------------------------------------------------


def generation_batch_problems(config: Any) -> list[str]:
    """Whole groups: the completions generated per round divide by ``num_generations`` >= 2."""
    group = config.num_generations
    steps = config.steps_per_generation or config.gradient_accumulation_steps
    completions = config.per_device_train_batch_size * int(os.environ.get("WORLD_SIZE", "1")) * steps
    if not isinstance(group, int) or group < 2:
        return [f"num_generations={group!r}: a group needs at least 2 completions to compare"]
    if completions % group:
        return [f"the generation batch, per_device_train_batch_size x gradient_accumulation_steps = {completions} "
                f"completions, is not whole groups of num_generations={group}"]
    return []


_REFERENCE_TOKENS: dict[tuple[str, str, str], int | None] = {}


def reference_completion_tokens(profile: Profile) -> int | None:
    """Tokens that fit 90% of the reference answers (reasoning + XML tags) in the profile's tokenizer; None if unknown.

    Measured once per model and data folder: the GRPOConfig check asks at every rerun of its cell.
    """
    key = (profile.model_source, profile.model_id, os.environ.get("GSM8K_DIR", ""))
    if key not in _REFERENCE_TOKENS:
        try:
            rows = load_gsm8k("train", limit=REFERENCE_ROWS, verbose=False)
            stats = token_length_stats(rows, load_tokenizer(profile))
            _REFERENCE_TOKENS[key] = recommended_completion_length(stats, q=90)
        except Exception:  # no tokenizer or no data here: the bounds fall back to the profile's own value
            _REFERENCE_TOKENS[key] = None
    return _REFERENCE_TOKENS[key]


def completion_length_bounds(profile: Profile) -> tuple[int, int, int | None]:
    """``(lowest, highest, needed)`` ``max_completion_length`` for the profile.

    ``needed`` fits 90% of the reference answers with their tags. Lowest: the profile's value or ``needed``,
    whichever is smaller (the CPU profiles cut on purpose, for speed; a GPU profile must fit the answers).
    Highest: the profile's value, ``needed`` or what the evaluation lets the model write, whichever is largest.
    """
    needed = reference_completion_tokens(profile)
    own = profile.max_completion_length
    if needed is None:
        return own, max(own, profile.eval_max_new_tokens), None
    return min(own, needed), max(own, needed, profile.eval_max_new_tokens), needed


def completion_length_problems(config: Any, profile: Profile) -> list[str]:
    """``max_completion_length`` between ``completion_length_bounds``."""
    length = config.max_completion_length
    low, high, needed = completion_length_bounds(profile)
    answers = f"90% of the reference answers need {needed} tokens with their tags" if needed else "the answers"
    if not isinstance(length, int) or length < low:
        return [f"max_completion_length={length!r} cuts completions short: the profile's is "
                f"{profile.max_completion_length} and {answers}; use at least {low}"]
    if length > high:
        return [f"max_completion_length={length} is longer than the profile's {profile.max_completion_length}, "
                f"than {answers} and than notebook 05 lets the model write ({profile.eval_max_new_tokens}): "
                f"slower steps for nothing; use at most {high}"]
    return []


def reward_weight_problems(config: Any, reward_weights: Any) -> list[str]:
    """One weight per reward function, the ones notebook 03 saved (None: TRL weighs every reward 1.0)."""
    saved = resolve_reward_weights(reward_weights)
    weights = config.reward_weights if config.reward_weights is not None else [1.0] * len(REWARD_FUNCS)
    if len(weights) != len(REWARD_FUNCS):
        return [f"reward_weights has {len(weights)} weights for the {len(REWARD_FUNCS)} reward functions of "
                "REWARD_FUNCS: one each, in that order"]
    if not all(close_to(mine, theirs) for mine, theirs in zip(weights, saved, strict=True)):
        return [f"reward_weights {list(weights)} are not the weights loaded above from notebook 03 {saved} "
                "(reward_weights)"]
    return []


def trl_value_problems(config: Any) -> list[str]:
    """Values TRL accepts and a run that can learn, resume and generate here."""
    problems = []
    losses = trl_choices("loss_type")
    if losses and config.loss_type not in losses:
        problems.append(f"loss_type={config.loss_type!r} is not one TRL knows ({', '.join(losses)})")
    if config.beta < 0:
        problems.append(f"beta={config.beta}: a KL coefficient is >= 0 (0 turns the KL term off)")
    if not config.temperature or config.temperature <= 0:
        problems.append(f"temperature={config.temperature}: without sampling every completion of a group is the "
                        "same, and the group teaches nothing")
    if config.max_steps is None or config.max_steps < 1:
        problems.append("max_steps is not set: the run would last num_train_epochs over the whole dataset")
    if str(getattr(config.save_strategy, "value", config.save_strategy)) == "no":
        problems.append("save_strategy='no': no checkpoint to resume from (section 10) or for notebook 05's curve")
    if config.use_vllm and not vllm_available():
        problems.append('use_vllm=True, but vLLM is not installed here (pip install ".[vllm]" on a GPU)')
    return problems


# How far a learning rate may stray from the profile's: within this factor either way the short run still
# learns about as the lesson says; TRL's default (1e-6, for full fine-tuning) is 100 times below LoRA's rates.
LEARNING_RATE_FACTOR = 5
# The largest beta as a multiple of the profile's: far above it the KL term holds the policy at the reference.
BETA_FACTOR = 5


def _shown_number(value: Any) -> str:
    return f"{value:g}" if isinstance(value, (int, float)) and not isinstance(value, bool) else repr(value)


def rate_problem(field: str, value: Any, wanted: float, steps: int) -> str | None:
    """A learning rate within ``LEARNING_RATE_FACTOR`` of the profile's ``wanted`` one, or why not."""
    low, high = wanted / LEARNING_RATE_FACTOR, wanted * LEARNING_RATE_FACTOR
    if isinstance(value, (int, float)) and not isinstance(value, bool) and low <= value <= high:
        return None
    return (f"{field}={_shown_number(value)}: the profile's is {wanted:g} (accepted: {low:g} to {high:g}); the run "
            f"has only {steps} steps: far below, the adapters barely move and nothing is learned; far above, the "
            "updates overshoot and the rewards collapse")


def beta_problem(beta: Any, profile: Profile) -> str | None:
    """``beta`` > 0 where the profile's is (the dashboard draws ``kl``), and not so large it pins the policy."""
    wanted = profile.beta
    if not wanted:
        return None
    high = wanted * BETA_FACTOR
    if isinstance(beta, (int, float)) and (0 < beta <= high or beta < 0):  # below 0: trl_value_problems says so
        return None
    if isinstance(beta, (int, float)) and beta == 0:
        return (f"beta=0: TRL then loads no reference model and logs no kl, but the dashboard draws a kl curve "
                f"(the profile's beta is {wanted:g}); use a beta above 0, up to {high:g}")
    return (f"beta={_shown_number(beta)}: the profile's is {wanted:g} (accepted: above 0, up to {high:g}); a larger "
            "KL penalty holds the policy at the reference model and the rewards cannot rise")


def run_size_problems(config: Any, profile: Profile) -> list[str]:
    """The run the profile measured: completions per step, group size, steps, learning rate and beta.

    A config may split a step into smaller passes (less memory, same run); more completions per step, another
    group size or more steps make another run, slower than the time the profile announces.
    """
    problems = []
    per_step = config.per_device_train_batch_size * config.gradient_accumulation_steps
    wanted = profile.per_device_train_batch_size * profile.gradient_accumulation_steps
    if per_step != wanted:
        problems.append(
            f"per_device_train_batch_size x gradient_accumulation_steps = {config.per_device_train_batch_size} x "
            f"{config.gradient_accumulation_steps} = {per_step} completions per step; the profile's run is {wanted} "
            f"({profile.per_device_train_batch_size} x {profile.gradient_accumulation_steps}): its time per step and "
            "memory were measured at that size"
        )
    if config.num_generations != profile.num_generations:
        problems.append(
            f"num_generations={config.num_generations}: the profile's group is {profile.num_generations}; the group "
            "size decides how many prompts a step sees and how often a group has no spread (frac_reward_zero_std)"
        )
    steps, low = config.max_steps, max(1, profile.max_steps // 2)
    if isinstance(steps, int) and steps >= 1 and not low <= steps <= profile.max_steps:
        problems.append(
            f"max_steps={steps}: the profile's run is {profile.max_steps} steps (accepted: {low} to "
            f"{profile.max_steps}); more outlasts the time the profile announces, fewer than half leaves the "
            "curves nothing to show next to both labs'"
        )
    return [*problems, *filter(None, [rate_problem("learning_rate", config.learning_rate, profile.learning_rate,
                                                   profile.max_steps), beta_problem(config.beta, profile)])]


def grpo_config_problems(config: Any, profile: Profile, reward_weights: Any = None) -> list[str]:
    """Everything a ``GRPOConfig`` gets wrong for this profile on this machine (empty: nothing)."""
    kind = _kind_problem(config, GRPOConfig, "GRPOConfig")
    if kind:
        return kind
    return [
        *generation_batch_problems(config),
        *run_size_problems(config, profile),
        *precision_problems(config, profile),
        *completion_length_problems(config, profile),
        *reward_weight_problems(config, reward_weights),
        *run_folder_problems(config.output_dir, profile, inside=False),
        *trl_value_problems(config),
    ]


GRPO_CONFIG_HINT = (
    "every size is a field of `profile`; the generation batch (batch x accumulation) must be whole groups of "
    "num_generations; say bf16, fp16 and use_cpu yourself, from profile.training_dtype and profile.device; the "
    "weights are the ones loaded above; the output goes to the run folder"
)


def check_grpo_config(config: Any, profile: Profile, reward_weights: Any = None) -> Any:
    """04.1: the learner's ``GRPOConfig``; hands back it when it passed, else ``training.make_grpo_config``."""
    exercise = "04.1 GRPOConfig"
    passed = judge(exercise, config, problems_of(grpo_config_problems, config, profile, reward_weights),
                   GRPO_CONFIG_HINT, TRL_CONFIG)
    reference = None if passed else make_grpo_config(profile, reward_weights=reward_weights)
    return hand_back(exercise, passed, config, reference, "training.make_grpo_config(profile)")


# --- 04.2 LoraConfig --------------------------------------------------------------------------------------


def linear_layer_names(model: Any) -> list[str]:
    """The full names of the model's ``nn.Linear`` layers (what LoRA adapts)."""
    return [name for name, module in model.named_modules() if isinstance(module, torch.nn.Linear)]


def target_problems(targets: Any, model: Any) -> list[str]:
    """``target_modules`` names linear layers of ``model`` (a list of names, a regex, ``"all-linear"``)."""
    linear = linear_layer_names(model)
    kinds = sorted({name.rsplit(".", 1)[-1] for name in linear})
    if targets is None:
        model_type = getattr(getattr(model, "config", None), "model_type", None)
        known = model_type in TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING
        return [] if known else [f"target_modules is not set; name some of the linear layers {kinds}"]
    if isinstance(targets, str):
        if targets == "all-linear" or any(re.fullmatch(targets, name) for name in linear):
            return []
        return [f"target_modules {targets!r} matches no linear layer of the model; its linear layers are {kinds}"]
    missing = sorted(t for t in targets if not any(n == t or n.endswith(f".{t}") for n in linear))
    if missing or not targets:
        return [f"target_modules {missing or []} are not linear layers of {type(model).__name__}, "
                f"whose linear layers are {kinds}"]
    return []


def adapted_kinds(targets: Any, model: Any) -> set[str]:
    """The kinds of linear layer (``q_proj``...) that ``target_modules`` adapts in ``model``, as peft reads it."""
    linear = linear_layer_names(model)
    if targets is None:  # peft's default for the architecture
        model_type = getattr(getattr(model, "config", None), "model_type", None)
        targets = TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING.get(model_type, [])
    if targets == "all-linear":  # every linear layer but the output head
        chosen = [n for n in linear if not n.endswith("lm_head")]
    elif isinstance(targets, str):
        chosen = [n for n in linear if re.fullmatch(targets, n)]
    else:
        chosen = [n for n in linear if any(n == t or n.endswith(f".{t}") for t in targets)]
    return {name.rsplit(".", 1)[-1] for name in chosen}


def target_kind_problems(targets: Any, profile: Profile, model: Any) -> list[str]:
    """The profile's targets, however written (a list in any order, a pattern, ``"all-linear"``)."""
    wanted = set(lora_targets_in(model, profile.lora_target_modules))
    given = adapted_kinds(targets, model)
    if given == wanted:
        return []
    fewer, more = sorted(wanted - given), sorted(given - wanted)
    parts = [f"leaves out {fewer}" if fewer else "", f"adds {more}" if more else ""]
    return [f"target_modules={shown(targets)} {' and '.join(p for p in parts if p)}: the profile adapts "
            f"{sorted(wanted)} (profile.lora_target_modules); fewer adapted layers learn less in the run's few "
            "steps, more cost memory and time the profile did not measure"]


def layer_problems(layers: Any, model: Any) -> list[str]:
    """``layers_to_transform``: None (every layer) or indices of decoder layers the model has."""
    if layers is None:
        return []
    depth = getattr(getattr(model, "config", None), "num_hidden_layers", None)
    indices = [layers] if isinstance(layers, int) else list(layers)
    bad = [i for i in indices if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < (depth or 0)]
    if bad or not indices:
        return [f"layers_to_transform {layers!r}: the model has decoder layers 0 to {(depth or 1) - 1}"
                + (f"; {bad} are not among them" if bad else "; an empty list adapts nothing")]
    return []


def top_layers_problems(layers: Any, profile: Profile, model: Any) -> list[str]:
    """The profile's ``lora_top_layers`` top decoder layers, as a list of indices (None: every layer)."""
    count = profile.lora_top_layers
    if count is None:
        return []
    wanted = top_layer_indices(model, count)
    given = [layers] if isinstance(layers, int) else sorted(layers) if layers is not None else None
    if given == wanted:
        return []
    why = ("the gradient then stops at the lowest adapted layer, so the backward pass covers only the top "
           f"{count} layers: that is the time per step the profile announces")
    if layers is None:
        return [f"layers_to_transform=None adapts every layer; the profile adapts only the top {count} ({wanted[0]} "
                f"to {wanted[-1]}): {why}"]
    if isinstance(layers, int):
        return [f"layers_to_transform={layers} adapts the one layer numbered {layers}, not the top {count}: peft "
                f"reads an int as one layer index; pass the list of indices {wanted[0]} to {wanted[-1]}"]
    return [f"layers_to_transform={shown(layers)}: the profile adapts the top {count} layers, {wanted[0]} to "
            f"{wanted[-1]}: {why}"]


# LoRA's rank may be halved or doubled: the adapters' capacity changes, the run's time and memory barely do.
RANK_FACTOR = 2


def rank_problems(config: Any, profile: Profile) -> list[str]:
    """A rank within ``RANK_FACTOR`` of the profile's, with ``lora_alpha / r`` keeping the update's scale."""
    r, wanted = config.r, profile.lora_r
    if not isinstance(r, int) or r < 1:
        return [f"r={r!r}: the rank of the two small matrices must be a whole number >= 1"]
    low, high = max(1, wanted // RANK_FACTOR), wanted * RANK_FACTOR
    if not low <= r <= high:
        return [f"r={r}: the profile's rank is {wanted} (accepted: {low} to {high}); a rank far off changes what "
                "the adapters can learn in the run's few steps and the memory the profile measured"]
    return []


def lora_config_problems(config: Any, profile: Profile, model: Any) -> list[str]:
    """Everything a ``LoraConfig`` gets wrong for this model (None is right only where the profile has no LoRA)."""
    if not profile.use_lora:
        return [] if config is None else ["this profile trains every weight (use_lora=False): set lora = None"]
    kind = _kind_problem(config, LoraConfig, "LoraConfig")
    if kind:
        return kind
    problems = rank_problems(config, profile)
    if not config.lora_alpha or config.lora_alpha <= 0:
        problems.append(f"lora_alpha={config.lora_alpha!r}: the update is scaled by lora_alpha / r, so it must be > 0")
    if not 0 <= config.lora_dropout < 1:
        problems.append(f"lora_dropout={config.lora_dropout}: a probability below 1")
    task = str(getattr(config.task_type, "value", config.task_type))
    if config.task_type is not None and task != "CAUSAL_LM":
        problems.append(f"task_type={task!r}: a language model that generates is 'CAUSAL_LM'")
    layers = layer_problems(config.layers_to_transform, model) or top_layers_problems(config.layers_to_transform,
                                                                                        profile, model)
    targets = target_problems(config.target_modules, model) or target_kind_problems(config.target_modules, profile,
                                                                                       model)
    return [*problems, *targets, *layers]


LORA_HINT = ("the profile's lora_* fields give the rank, alpha and target names (print(model) lists its layers); "
             "training.top_layer_indices turns a number of top layers into indices; None only where the profile "
             "trains every weight")


def check_lora_config(config: Any, profile: Profile, model: Any) -> Any:
    """04.2: the learner's ``LoraConfig`` for ``model``; hands back it when it passed, else ``make_lora_config``."""
    exercise = "04.2 LoraConfig"
    problems = problems_of(lora_config_problems, config, profile, model)
    if config is None and not profile.use_lora:
        passed = report(exercise, True, LORA_HINT, "no LoRA")
    else:
        passed = judge(exercise, config, problems, LORA_HINT, PEFT)
    reference = None if passed else make_lora_config(profile, model)
    return hand_back(exercise, passed, config, reference, "training.make_lora_config(profile, model)")


# --- 04.3 SFTConfig ---------------------------------------------------------------------------------------


def warm_start_steps(examples: int, batch: int, epochs: float, max_steps: int = -1) -> int:
    """Optimizer steps of a warm start: ``max_steps`` when set, else epochs over the examples in batches."""
    if max_steps and max_steps > 0:
        return max_steps
    return math.ceil(math.ceil(examples / max(batch, 1)) * epochs)


def longest_warm_start_example(profile: Profile, tokenizer: Any) -> int:
    """Tokens of the longest warm-start example: its chat prompt and its target, as SFT reads them."""
    rows = warm_start_dataset(profile).to_list()
    texts = tokenizer.apply_chat_template([row["prompt"] + row["completion"] for row in rows], tokenize=False)
    return max(len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"])


def sft_length_problems(config: Any, profile: Profile, tokenizer: Any) -> list[str]:
    """``max_length`` keeps every warm-start example whole (a cut example loses its answer and closing tags)."""
    if tokenizer is None or profile.warm_start_examples < 1 or config.max_length is None:
        return []
    longest = longest_warm_start_example(profile, tokenizer)
    if config.max_length >= longest:
        return []
    return [f"max_length={config.max_length} cuts the longest warm-start example ({longest} tokens): "
            "the end it loses is the answer and the closing tags the warm start is for"]


def sft_config_problems(config: Any, profile: Profile, tokenizer: Any = None) -> list[str]:
    """Everything an ``SFTConfig`` gets wrong for the profile's warm start (empty: nothing)."""
    kind = _kind_problem(config, SFTConfig, "SFTConfig")
    if kind:
        return kind
    problems = []
    micro, accumulation = config.per_device_train_batch_size, config.gradient_accumulation_steps
    if micro > WARM_START_MICRO_BATCH:
        problems.append(f"per_device_train_batch_size={micro}: more than WARM_START_MICRO_BATCH "
                        f"({WARM_START_MICRO_BATCH}) sequences per pass; SFT's logits over the whole vocabulary "
                        "outgrow the memory; keep the batch with gradient_accumulation_steps")
    examples = max(profile.warm_start_examples, 1)
    wanted = warm_start_steps(examples, profile.warm_start_batch_size, profile.warm_start_epochs)
    yours = warm_start_steps(examples, micro * accumulation, config.num_train_epochs, config.max_steps)
    if yours != wanted:
        problems.append(f"{yours} optimizer steps (batch {micro} x {accumulation}, {config.num_train_epochs} epochs"
                        f"{f', max_steps {config.max_steps}' if config.max_steps > 0 else ''}), the profile's warm "
                        f"start takes {wanted}: more steps teach the format every time (GRPO then has nothing to "
                        "compare), fewer may not teach it")
    wanted_steps = max(wanted, 1)
    if rate := rate_problem("learning_rate", config.learning_rate, profile.warm_start_learning_rate, wanted_steps):
        problems.append(f"{rate} (the warm start's rate, profile.warm_start_learning_rate)")
    return [*problems, *precision_problems(config, profile), *sft_length_problems(config, profile, tokenizer),
            *run_folder_problems(config.output_dir, profile, inside=True)]


SFT_HINT = ("at most WARM_START_MICRO_BATCH sequences a pass, accumulation making up the profile's "
            "warm_start_batch_size, the profile's warm-start epochs, a max_length with room for prompt and target, "
            "precision as in your GRPOConfig, a folder in run_dir")


def check_sft_config(config: Any, profile: Profile, tokenizer: Any = None) -> Any:
    """04.3: the warm start's ``SFTConfig``; hands back it when it passed, else ``warm_start.make_sft_config``."""
    exercise = "04.3 SFTConfig"
    passed = judge(exercise, config, problems_of(sft_config_problems, config, profile, tokenizer), SFT_HINT,
                   TRL_CONFIG)
    reference = None if passed else make_sft_config(profile)
    return hand_back(exercise, passed, config, reference, "warm_start.make_sft_config(profile)")


# --- 04.4 GRPOTrainer -------------------------------------------------------------------------------------


def reward_problems(trainer: Any, config: Any) -> list[str]:
    """The five rewards of notebook 03, each with the weight the checked config gives it."""
    names = [getattr(f, "__name__", type(f).__name__) for f in trainer.reward_funcs]
    expected = [f.__name__ for f in REWARD_FUNCS]
    if sorted(names) != sorted(expected):
        return [f"reward_funcs {names}: the five of notebook 03 are REWARD_FUNCS {expected}"]
    weights = [float(w) for w in config.reward_weights] if config.reward_weights is not None else [1.0] * len(names)
    wanted = [weights[expected.index(name)] for name in names]
    given = [float(w) for w in trainer.reward_weights]
    if not all(close_to(g, w) for g, w in zip(given, wanted, strict=True)):
        return [f"each reward's weight: yours {dict(zip(names, given, strict=True))}, the config's "
                f"{dict(zip(expected, weights, strict=True))} (reward_weights follow REWARD_FUNCS' order)"]
    return []


def training_questions(dataset: Any) -> list[str]:
    """The problem text of every training row: its ``question``, else the last user message of its ``prompt``."""
    if "question" in dataset.column_names:
        return list(dataset["question"])
    return [next((m["content"] for m in reversed(p) if m.get("role") == "user"), "") for p in dataset["prompt"]]


def dataset_problems(dataset: Any) -> list[str]:
    """``prompt`` and ``answer`` columns, and no problem of the GSM8K test split (notebook 05 evaluates on it)."""
    columns = set(getattr(dataset, "column_names", None) or [])
    if not {"prompt", "answer"} <= columns:
        return [f"train_dataset has columns {sorted(columns)}; GRPO generates from 'prompt' and the rewards read "
                "'answer'"]
    held_out = set(load_gsm8k("test", verbose=False)["question"])
    seen = sum(question in held_out for question in training_questions(dataset))
    if seen:
        return [f"train_dataset: {seen} of its {len(dataset)} problems are in GSM8K's test split, the held-out "
                "problems notebook 05 evaluates on; train on the train split"]
    return []


def _lora_values(config: Any) -> tuple[Any, ...]:
    targets = config.target_modules
    layers = config.layers_to_transform
    return (config.r, config.lora_alpha, set(targets) if not isinstance(targets, str) else targets,
            list(layers) if isinstance(layers, (list, tuple)) else layers)


def adapter_problems(trainer: Any, model: Any, lora: Any) -> list[str]:
    """The trainer trains ``model`` (the warm-started one), with the checked LoRA or none."""
    trained = trainer.model.get_base_model() if hasattr(trainer.model, "get_base_model") else trainer.model
    if trained is not model:
        return ["model: not the model loaded (and warm-started) above; pass model=model"]
    adapters = getattr(trainer.model, "peft_config", {})
    if lora is None:
        return ["peft_config: this profile trains every weight; pass peft_config=None"] if adapters else []
    if "default" not in adapters or _lora_values(adapters["default"]) != _lora_values(lora):
        return ["peft_config: the model carries no LoRA adapter as `lora` configures it; pass peft_config=lora"]
    return []


def trainer_problems(trainer: Any, model: Any, tokenizer: Any, config: Any, lora: Any) -> list[str]:
    """Everything a ``GRPOTrainer`` is given that the course's run is not (callbacks are the learner's own)."""
    kind = _kind_problem(trainer, GRPOTrainer, "GRPOTrainer")
    if kind:
        return kind
    problems = [] if trainer.args is config else ["args: not the GRPOConfig checked above; pass args=config"]
    if trainer.processing_class is not tokenizer:
        problems.append("processing_class: not the tokenizer loaded with the model; pass processing_class=tokenizer")
    return [*problems, *reward_problems(trainer, config), *adapter_problems(trainer, model, lora),
            *dataset_problems(trainer.train_dataset)]


def release_model(trainer: Any, model: Any) -> None:
    """Take a failed trainer's LoRA layers out of ``model`` (peft adds them in place): the reference adds its own."""
    wrapped = getattr(trainer, "model", None)
    if hasattr(wrapped, "unload") and hasattr(wrapped, "get_base_model") and wrapped.get_base_model() is model:
        wrapped.unload()


def strip_adapters(model: Any) -> None:
    """Take out the LoRA layers a failed ``GRPOTrainer(...)`` call left in ``model`` (peft adds them in place).

    Without this the reference trainer would add a second adapter next to the leftover one.
    """
    if not isinstance(model, torch.nn.Module):
        return
    for name, module in list(model.named_modules()):
        if isinstance(module, BaseTunerLayer):
            parent_name, _, child = name.rpartition(".")
            parent = model.get_submodule(parent_name) if parent_name else model
            setattr(parent, child, module.get_base_layer())
    if "peft_config" in vars(model):
        del model.peft_config


def reference_trainer(model: Any, tokenizer: Any, config: Any, lora: Any, train_dataset: Any,
                      callbacks: Sequence[Any] = ()) -> Any:
    """The ``GRPOTrainer`` the course builds (``training.build_trainer``'s call) from the checked pieces."""
    return GRPOTrainer(model=model, processing_class=tokenizer, reward_funcs=list(REWARD_FUNCS), args=config,
                       train_dataset=train_dataset, peft_config=lora, callbacks=list(callbacks))


TRAINER_HINT = ("every argument is a name defined above: the model, the tokenizer, REWARD_FUNCS, the checked config, "
                "the training prompts, the checked LoRA and the dashboard")


def check_grpo_trainer(trainer: Any, profile: Profile, *, model: Any, tokenizer: Any, config: Any, lora: Any,
                       train_dataset: Any = None, callbacks: Sequence[Any] = ()) -> Any:
    """04.4: the learner's ``GRPOTrainer``; hands back it when it passed, else the course's trainer on the same pieces.

    ``config`` and ``lora`` are what 04.1 and 04.2 handed back; ``train_dataset`` and ``callbacks`` are the
    notebook's, for the reference trainer.
    """
    exercise = "04.4 GRPOTrainer"
    passed = judge(exercise, trainer, problems_of(trainer_problems, trainer, model, tokenizer, config, lora),
                   TRAINER_HINT, TRL_TRAINER)
    reference = None
    if not passed:
        release_model(trainer, model)
        strip_adapters(model)
        data = train_dataset if train_dataset is not None else training_dataset(profile, tokenizer=tokenizer)
        reference = reference_trainer(model, tokenizer, config, lora, data, callbacks)
    return hand_back(exercise, passed, trainer, reference, "GRPOTrainer (training.build_trainer's call)")


# --- The exercises at the end -----------------------------------------------------------------------------


def check_04_prompts_per_step(answer: Any) -> bool:
    """Golden config: batch 8, accumulation 16, num_generations 8: how many distinct prompts per optimizer step?"""
    hint = "completions per step = batch x accumulation; each prompt fills one group of num_generations"
    return report_number("04.5 prompts per step", answer, 8 * 16 / 8, hint)


def check_04_group_size_field(answer: Any) -> bool:
    """Which ``GRPOConfig`` field is the group size (completions sampled per prompt)?"""
    hint = "the field that says how many completions are generated for each prompt; TRL's default is 8"
    return report_name("04.6 group size field", answer, {"num_generations"}, hint)


def check_04_monitoring_rule(answer: Any, log_history: Any) -> bool:
    """Which monitoring rule fires on ``log_history``? (a rule name such as ``"clipped_high"``)."""
    try:
        fired = {finding.code for finding in monitor(log_history)}
    except (TypeError, ValueError) as exc:
        print(f"⚠️ 04.7: could not read the log history ({exc}); pass the one the notebook built.")
        return False
    hint = "run monitor(log_history) and read the rule names, or section 9's table"
    return report_name("04.7 monitoring rule", answer, fired, hint)


def generation_batch_cases() -> list[Case]:
    """Sizes that form whole groups, sizes that do not, and sizes that are no sizes at all."""
    return [
        Case("the golden config: 8 x 16, groups of 8", (8, 16, 8)),
        Case("4 x 2, groups of 8", (4, 2, 8)),
        Case("the cpu lab: one pass of 8, groups of 8", (8, 1, 8)),
        Case("12 x 1, groups of 3", (12, 1, 3)),
        Case("6 x 1, groups of 4: not whole groups", (6, 1, 4)),
        Case("3 x 3, groups of 2: not whole groups", (3, 3, 2)),
        Case("a group of one compares nothing", (8, 1, 1)),
        Case("batch 0", (0, 1, 2)),
        Case("accumulation 0", (4, 0, 2)),
    ]


def check_04_generation_batch(learner: Any) -> Callable[..., int]:
    """04.8: ``(batch, accumulation, num_generations) -> completions per round``, ValueError when unusable.

    Hands back the learner's function when it passed, else ``training.check_generation_batch``.
    """
    exercise = "04.8 generation batch"
    hint = ("return batch x accumulation; raise ValueError when that is not a multiple of num_generations, when "
            "num_generations < 2, or when a size is < 1")
    passed = check_against_reference(exercise, learner, check_generation_batch, generation_batch_cases(), hint=hint)
    return hand_back(exercise, passed, learner, check_generation_batch, "training.check_generation_batch")
