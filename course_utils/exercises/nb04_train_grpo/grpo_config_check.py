"""04.1: the learner's ``GRPOConfig``, judged on what it does: every field that changes the run (``run_fields``),
whole groups in the generation batch, one generation a step, the run the profile measured (completions per step,
group size, steps, a learning rate and a ``beta`` in stated ranges around the profile's, ``beta`` above 0 where
the dashboard draws ``kl``), the precision this machine trains in, a completion length that fits the profile and
the reference answers, one weight per reward (notebook 03's), the run folder, and values TRL accepts. Extra
fields that change nothing the run depends on (``log_completions=True``, smaller passes with more accumulation)
pass.
"""

from __future__ import annotations

import os
from typing import Any

from trl import GRPOConfig

from course_utils.core.profiles import Profile
from course_utils.exercises.nb04_train_grpo.judging import TRL_CONFIG, judge, kind_problem, problems_of
from course_utils.exercises.nb04_train_grpo.machine_fit import (
    precision_problems,
    rate_problem,
    run_folder_problems,
    shown_number,
)
from course_utils.exercises.nb04_train_grpo.run_fields import GRPO_FIELDS, field_problems
from course_utils.exercises.verdicts import close_to, hand_back
from course_utils.lesson.data import load_gsm8k
from course_utils.lesson.models import load_tokenizer
from course_utils.lesson.rewards import REWARD_FUNCS
from course_utils.lesson.token_lengths import recommended_completion_length, token_length_stats
from course_utils.training.grpo_config import make_grpo_config, resolve_reward_weights, vllm_available

REFERENCE_ROWS = 200  # GSM8K train rows whose reference answers size max_completion_length


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
    if config.beta < 0:
        problems.append(f"beta={config.beta}: a KL coefficient is >= 0 (0 turns the KL term off)")
    if config.max_steps is None or config.max_steps < 1:
        problems.append("max_steps is not set: the run would last num_train_epochs over the whole dataset")
    if str(getattr(config.save_strategy, "value", config.save_strategy)) == "no":
        problems.append("save_strategy='no': no checkpoint to resume from (section 10) or for notebook 05's curve")
    if config.use_vllm and not vllm_available():
        problems.append('use_vllm=True, but vLLM is not installed here (pip install ".[vllm]" on a GPU)')
    return problems


# The largest beta as a multiple of the profile's: far above it the KL term holds the policy at the reference.
BETA_FACTOR = 5


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
    return (f"beta={shown_number(beta)}: the profile's is {wanted:g} (accepted: above 0, up to {high:g}); a larger "
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


def generation_round_problems(config: Any) -> list[str]:
    """One generation a step: completions reused over several steps are off-policy, which the run does not measure."""
    steps, accumulation = config.steps_per_generation, config.gradient_accumulation_steps
    if steps in (None, accumulation):
        return []
    return [f"steps_per_generation={steps} (or generation_batch_size={config.generation_batch_size}): the profile "
            f"generates once per optimizer step (gradient_accumulation_steps={accumulation}); another round size "
            "trains steps on completions an older policy sampled"]


def grpo_config_problems(config: Any, profile: Profile, reward_weights: Any = None) -> list[str]:
    """Everything a ``GRPOConfig`` gets wrong for this profile on this machine (empty: nothing)."""
    kind = kind_problem(config, GRPOConfig, "GRPOConfig")
    if kind:
        return kind
    reference = make_grpo_config(profile, reward_weights=reward_weights)
    return [
        *generation_batch_problems(config),
        *generation_round_problems(config),
        *run_size_problems(config, profile),
        *precision_problems(config, profile),
        *completion_length_problems(config, profile),
        *reward_weight_problems(config, reward_weights),
        *run_folder_problems(config.output_dir, profile, inside=False),
        *trl_value_problems(config),
        *field_problems(config, reference, GRPO_FIELDS, profile),
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
