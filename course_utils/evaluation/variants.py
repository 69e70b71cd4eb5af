"""GRPO's modern variants as ``GRPOConfig`` fields, each trained from one start (notebook 07, ``scripts/variants.py``).

Each variant is a handful of real ``GRPOConfig`` fields (``VARIANTS``) on top of the profile's config: same
data, same warm-started model, same seed and steps, so the fields are the only difference. ``run_variant``
trains one (TRL's ``GRPOTrainer`` through ``course_utils.training.run``) and evaluates it on held-out test
problems. ``variant_tables`` compares and records the runs; ``reward_hack`` trains with an exploitable bonus.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from transformers import set_seed

from course_utils.core.paths import output_dir
from course_utils.core.profiles import Profile, get_profile
from course_utils.core.speedups import NO_SPEEDUPS, SpeedUps
from course_utils.evaluation.heldout import evaluate_model, test_problems
from course_utils.training.grpo_config import make_grpo_config
from course_utils.training.grpo_prompts import training_dataset
from course_utils.training.monitoring import reward_fifths
from course_utils.training.run import build_trainer, load_model_for_training
from course_utils.training.run_logs import training_logs
from course_utils.training.warm_start import warm_start

BASELINE = "dapo"
# GDPO (TRL's multi_objective_aggregation="normalize_then_sum") is compared with this run: the same loss, the rewards
# summed with their weights first (TRL's default "sum_then_normalize"), as every other variant sums them.
WEIGHTED_SUM = BASELINE
# name: the GRPOConfig fields that make the variant (everything else is the profile's config, loss_type "dapo").
VARIANTS: dict[str, dict[str, Any]] = {
    "dapo": {"loss_type": "dapo", "scale_rewards": "group"},  # TRL's default: the baseline
    "grpo": {"loss_type": "grpo"},
    "dr_grpo": {"loss_type": "dr_grpo"},
    "bnpo": {"loss_type": "bnpo"},
    "scale_none": {"loss_type": "dapo", "scale_rewards": "none"},
    "mask_truncated": {"loss_type": "dapo", "mask_truncated_completions": True},
    "two_iterations": {"loss_type": "dapo", "num_iterations": 2},  # off-policy baseline for the two below
    "clip_higher": {"loss_type": "dapo", "num_iterations": 2, "epsilon_high": 0.28},
    "gspo": {
        "loss_type": "grpo",
        "importance_sampling_level": "sequence",
        "num_iterations": 2,
        "epsilon": 3e-4,
        "epsilon_high": 4e-4,
    },
    # each reward normalised within its group first, then the weighted sum (scale_rewards does not apply)
    "gdpo": {"loss_type": "dapo", "multi_objective_aggregation": "normalize_then_sum"},
}
# Each variant changes TRL's defaults, not the lab's choices: a profile's scale_rewards ("none" in the cpu lab) gives
# way to TRL's "group" unless the variant names its own
VARIANT_BASE: dict[str, Any] = {"scale_rewards": "group"}
# How much each profile runs live in notebook 07 (the full table comes from scripts/variants.py).
LIVE_PLAN: dict[str, dict[str, Any]] = {
    # ci: a masked loss, an off-policy sequence-level one and GDPO's per-reward normalisation (TRL's distinct paths;
    # the hack runs train the baseline's plain dapo loss), one step each, on the profile's one group of two
    # completions, of 8 tokens ("fields", added to every live run): the paths run, in seconds
    "ci": {
        "variants": ("mask_truncated", "gspo", "gdpo"),
        "seeds": (0,),
        "max_steps": 1,
        "hack_steps": 1,
        "eval_size": 1,
        "fields": {"max_completion_length": 8},
    },
    "cpu": {
        "variants": ("dapo", "dr_grpo", "gdpo"),
        "seeds": (0, 1),
        "max_steps": 8,
        "hack_steps": 20,
        "eval_size": 20,
        "fields": {},
    },
}


@dataclass
class VariantRun:
    """One trained variant: its name, seed, TRL's log history, the held-out evaluation (on ``problems`` test problems)
    and how long it took."""

    name: str
    seed: int
    log_history: list[dict[str, Any]]
    accuracy: float
    strict_format: float
    seconds: float
    run_dir: Path
    problems: int = 0

    @property
    def final_reward(self) -> float:
        """Mean total reward over the last fifth of the logged steps."""
        return reward_fifths(self.log_history)[1]

    def row(self) -> dict[str, Any]:
        return {
            "variant": self.name,
            "seed": self.seed,
            "final_reward": self.final_reward,
            "strict_format": self.strict_format,
            "accuracy": self.accuracy,
            "problems": self.problems,
            "steps": len(training_logs(self.log_history)),
            "seconds": round(self.seconds, 1),
        }


def variant_fields(name: str) -> dict[str, Any]:
    """The ``GRPOConfig`` fields of a variant; an unknown name is an error listing the known ones."""
    if name not in VARIANTS:
        raise ValueError(f"Unknown variant {name!r}; known variants: {', '.join(VARIANTS)}")
    return dict(VARIANTS[name])


def variant_config(
    profile: Profile | str | None,
    run_dir: Path,
    fields: Mapping[str, Any],
    *,
    seed: int = 0,
    max_steps: int | None = None,
    log_completions: bool = False,
    reward_weights: Sequence[float] | None = None,
) -> Any:
    """The ``GRPOConfig`` of one variant run: the profile's config on ``VARIANT_BASE``, then the variant's fields."""
    p = get_profile(profile)
    overrides: dict[str, Any] = {
        **VARIANT_BASE,
        "seed": seed,
        "max_steps": max_steps or p.max_steps,
        "save_strategy": "no",
        "logging_steps": 1,
        "log_completions": log_completions,
        "num_completions_to_print": 1,  # TRL's live table, one completion a step: the logged files keep them all
        **fields,
    }
    if reward_weights is not None:
        overrides["reward_weights"] = list(reward_weights)
    return make_grpo_config(p, run_dir, **overrides)


class StartingPoint(NamedTuple):
    """What every run of one profile shares: the warm-started model (copied per run), its tokenizer, the prompts."""

    model: Any
    tokenizer: Any
    dataset: Any


def starting_model(profile: Profile | str | None = None, speedups: SpeedUps = NO_SPEEDUPS) -> StartingPoint:
    """The profile's model after its (cached) warm start, the tokenizer and the GRPO prompts, built once for all.

    ``speedups``: the plug-in the warm start trains with (``speedups=cpu_speed``), default plain TRL.
    """
    p = get_profile(profile)
    model, tokenizer = load_model_for_training(p)
    if p.warm_start_examples:
        model = warm_start(model, tokenizer, p, cache=True, speedups=speedups)
    return StartingPoint(model, tokenizer, training_dataset(p, tokenizer=tokenizer))


def live_plan(profile: Profile | str | None = None) -> dict[str, Any]:
    """What notebook 07 trains live under ``profile``: variants, seeds, steps, and the ``GRPOConfig`` fields every
    live run adds (GPU profiles run the cpu plan)."""
    p = get_profile(profile)
    plan = copy.deepcopy(LIVE_PLAN["ci" if p.name.startswith("ci") else "cpu"])
    return plan


def run_variant(
    name: str,
    fields: Mapping[str, Any] | None = None,
    *,
    profile: Profile | str | None = None,
    seed: int = 0,
    max_steps: int | None = None,
    reward_funcs: Sequence[Callable[..., list[float]]] | None = None,
    reward_weights: Sequence[float] | None = None,
    log_completions: bool = False,
    eval_size: int | None = None,
    start: StartingPoint | None = None,
    speedups: SpeedUps = NO_SPEEDUPS,
) -> VariantRun:
    """Train one variant from the profile's warm-started model and evaluate it on held-out test problems.

    ``fields`` (default: ``VARIANTS[name]``) are ``GRPOConfig`` fields; ``reward_funcs`` / ``reward_weights``
    replace the course's five rewards (the reward-hack runs). ``log_completions`` makes TRL save every
    step's completions under ``<run>/completions/`` (``logged_completions`` reads them). ``start``: the
    ``StartingPoint`` of ``starting_model``, whose model is copied instead of loaded again (every run starts from the
    same weights either way). ``eval_size``: how many held-out test problems (default: the profile's).
    ``speedups``: the plug-in the run trains and generates with (``speedups=cpu_speed``), default plain TRL.
    """
    p = get_profile(profile)
    fields = variant_fields(name) if fields is None else dict(fields)
    run_dir = output_dir() / "07-variants" / f"{name}-seed{seed}"
    started = time.perf_counter()
    set_seed(seed)
    if start is None:
        start = starting_model(p, speedups)  # a fresh model, trained in place
        model = start.model
    else:
        model = copy.deepcopy(start.model)  # every run trains its own copy of the shared start
    config = variant_config(p, run_dir, fields, seed=seed, max_steps=max_steps, log_completions=log_completions,
                            reward_weights=reward_weights)  # fmt: skip
    trainer = build_trainer(model, start.tokenizer, p, start.dataset, config, reward_funcs=reward_funcs)
    with speedups.enabled(trainer, profile=p):
        trainer.train()
    result = _held_out_result(trainer.model, start.tokenizer, p, eval_size, speedups)
    return VariantRun(
        name=name,
        seed=seed,
        log_history=list(trainer.state.log_history),
        accuracy=float(result["accuracy"]),
        strict_format=float(result["format_score"]),
        seconds=time.perf_counter() - started,
        run_dir=run_dir,
        problems=int(result["n"]),
    )


def _held_out_result(
    model: Any, tokenizer: Any, profile: Profile, eval_size: int | None, speedups: SpeedUps
) -> dict[str, Any]:
    """The trained variant scored on ``eval_size`` held-out test problems (default: the profile's), greedily."""
    problems = test_problems(profile if eval_size is None else profile.override(eval_size=eval_size))
    return evaluate_model(
        model,
        tokenizer,
        problems,
        batch_size=profile.eval_batch_size,
        max_new_tokens=profile.eval_max_new_tokens,
        progress=False,
        speedups=speedups,
    )


# --- The learner's variants dict ------------------------------------------------------------------------


def compare_variant_fields(learner: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """What differs between a learner's ``{name: fields}`` and ``VARIANTS``, one line per difference."""
    if not isinstance(learner, Mapping):
        return [f"expected a dict of variant name -> GRPOConfig fields, got {type(learner).__name__}"]
    lines = [f"missing variant {name!r}" for name in VARIANTS if name not in learner]
    lines += [f"unknown variant {name!r}" for name in learner if name not in VARIANTS]
    for name in VARIANTS.keys() & learner.keys():
        theirs = dict(learner[name]) if isinstance(learner[name], Mapping) else {}
        if theirs != VARIANTS[name]:
            lines.append(f"{name}: yours {theirs}, the reference {VARIANTS[name]}")
    return lines
