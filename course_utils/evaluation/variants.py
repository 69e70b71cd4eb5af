"""GRPO's modern variants side by side, and a reward hack caught (notebook 07 and ``scripts/variants.py``).

Each variant is a handful of real ``GRPOConfig`` fields (``VARIANTS``) on top of the profile's config: same
data, same warm-started model, same seed and steps, so the fields are the only difference. ``run_variant``
trains one (TRL's ``GRPOTrainer`` through ``course_utils.training.run``) and evaluates it on held-out test
problems; ``results_table`` and ``seed_summary`` turn runs into the table, and ``real_difference`` says
whether a gap is larger than the seed-to-seed noise.
"""

from __future__ import annotations

import copy
import csv
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import pandas as pd
from transformers import set_seed

from course_utils.core.paths import output_dir, repo_root
from course_utils.core.profiles import Profile, get_profile
from course_utils.core.speedups import NO_SPEEDUPS, SpeedUps
from course_utils.evaluation.heldout import evaluate_model, test_problems
from course_utils.lesson.rewards import REWARD_FUNCS
from course_utils.lesson.rewards.hacking import length_bonus_reward_func, paid_length_bonus_reward_func
from course_utils.training.grpo_config import make_grpo_config, resolve_reward_weights
from course_utils.training.grpo_prompts import training_dataset
from course_utils.training.monitoring import reward_fifths
from course_utils.training.run import build_trainer, load_model_for_training
from course_utils.training.run_logs import step_logs, training_logs
from course_utils.training.warm_start import warm_start

BASELINE = "dapo"
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
}
# The metrics notebook 07 plots per variant (TRL's log_history keys).
CURVE_METRICS = (
    "reward",
    "completions/mean_length",
    "completions/clipped_ratio",
    "clip_ratio/low_mean",
    "clip_ratio/high_mean",
    "entropy",
)
TABLE_METRICS = ("final_reward", "strict_format", "accuracy")
# How much each profile runs live in notebook 07 (the full table comes from scripts/variants.py).
LIVE_PLAN: dict[str, dict[str, Any]] = {
    # ci: a masked loss and an off-policy sequence-level one (TRL's distinct paths; the hack runs train the baseline's
    # plain dapo loss), one step each, on the profile's one group of two completions, of 8 tokens ("fields", added
    # to every live run): the paths run, in seconds
    "ci": {
        "variants": ("mask_truncated", "gspo"),
        "seeds": (0,),
        "max_steps": 1,
        "hack_steps": 1,
        "eval_size": 1,
        "fields": {"max_completion_length": 8},
    },
    "cpu": {
        "variants": ("dapo", "dr_grpo"),
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
    overrides: dict[str, Any] = {
        "seed": seed,
        "max_steps": max_steps or p.max_steps,
        "save_strategy": "no",
        "logging_steps": 1,
        "log_completions": log_completions,
        "num_completions_to_print": 2,
        **fields,
    }
    if reward_weights is not None:
        overrides["reward_weights"] = list(reward_weights)
    config = make_grpo_config(p, run_dir, **overrides)
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


def hack_rewards(fixed: bool = False) -> tuple[list[Callable[..., list[float]]], list[float]]:
    """The reward functions and weights of the reward-hack runs: the five rewards plus a thoroughness bonus.

    ``fixed=False``: ``length_bonus_reward_func``, paid per word to any completion (exploitable: write on past the
    limit); ``fixed=True``: ``paid_length_bonus_reward_func``, paid only to correct answers and capped.
    """
    bonus = paid_length_bonus_reward_func if fixed else length_bonus_reward_func
    return [*REWARD_FUNCS, bonus], [*resolve_reward_weights(None), 1.0]


def run_hack(
    fixed: bool = False,
    *,
    profile: Profile | str | None = None,
    seed: int = 0,
    max_steps: int | None = None,
    eval_size: int | None = None,
    start: StartingPoint | None = None,
    speedups: SpeedUps = NO_SPEEDUPS,
) -> VariantRun:
    """Train with the exploitable thoroughness bonus (``fixed=False``) or its fix, completions logged."""
    funcs, weights = hack_rewards(fixed)
    name = "hack_fixed" if fixed else "hack"
    return run_variant(
        name,
        {"loss_type": "dapo"},
        profile=profile,
        seed=seed,
        max_steps=max_steps,
        reward_funcs=funcs,
        reward_weights=weights,
        log_completions=True,
        eval_size=eval_size,
        start=start,
        speedups=speedups,
    )


# --- Reading the runs -------------------------------------------------------------------------------


def logged_completions(run_dir: str | Path) -> Any:
    """Every completion TRL logged (``log_completions=True``) in ``run_dir``, one row each, with its rewards.

    Columns: step, prompt, completion (text), one column per reward function, advantage.
    """
    files = sorted((Path(run_dir) / "completions").glob("completions_*.parquet"))
    if not files:
        raise FileNotFoundError(f"No logged completions in {run_dir}: train with log_completions=True")
    frame = pd.concat([pd.read_parquet(path) for path in files], ignore_index=True)
    frame["completion"] = [_text(c) for c in frame["completion"]]
    frame["prompt"] = [_text(c) for c in frame["prompt"]]
    return frame


def _text(message: Any) -> str:
    """The last message's content of a conversation (as TRL logs it), or the text itself."""
    if isinstance(message, str):
        return message
    try:
        return str(list(message)[-1]["content"])
    except (TypeError, KeyError, IndexError):
        return str(message)


def results_table(runs: Iterable[VariantRun | Mapping[str, Any]]) -> Any:
    """One row per run (variant, seed, final reward, strict format, accuracy, steps, seconds), a DataFrame."""
    rows = [run.row() if isinstance(run, VariantRun) else dict(run) for run in runs]
    if not rows:
        raise ValueError("results_table needs at least one run")
    return pd.DataFrame(rows)


def seed_summary(table: Any, metrics: Sequence[str] = TABLE_METRICS) -> Any:
    """Per variant: the mean of each metric over seeds and its spread (max - min), plus how many seeds ran."""
    missing = sorted({"variant", "seed", *metrics} - set(table.columns))
    if missing:
        raise ValueError(f"the results table lacks column(s) {missing}; build it with results_table(runs)")
    grouped = table.groupby("variant", sort=False)
    columns = {"seeds": grouped["seed"].nunique()}
    for metric in metrics:
        columns[metric] = grouped[metric].mean()
        columns[f"{metric}_spread"] = grouped[metric].max() - grouped[metric].min()
    return pd.DataFrame(columns)


def real_difference(first: Sequence[float], second: Sequence[float]) -> bool:
    """True when the two variants' seeds do not overlap: every seed of one beats every seed of the other.

    With a few seeds per variant this is the honest test: a gap smaller than the seed-to-seed spread is noise.
    One seed each says nothing, so it is never a real difference.
    """
    first, second = [float(v) for v in first], [float(v) for v in second]
    if len(first) < 2 or len(second) < 2:
        return False
    return min(first) > max(second) or min(second) > max(first)


def differences_from_baseline(table: Any, baseline: str = BASELINE, metrics: Sequence[str] = TABLE_METRICS) -> Any:
    """For each variant and metric: the gap of the means to ``baseline`` and whether it beats the noise."""
    if baseline not in set(table["variant"]):
        raise ValueError(f"baseline {baseline!r} is not in the table (variants: {sorted(set(table['variant']))})")
    base = table[table["variant"] == baseline]
    rows = []
    for name, runs in table.groupby("variant", sort=False):
        if name == baseline:
            continue
        for metric in metrics:
            gap = runs[metric].mean() - base[metric].mean()
            rows.append(
                {"variant": name, "metric": metric, "gap": gap, "real": real_difference(runs[metric], base[metric])}
            )
    return pd.DataFrame(rows, columns=["variant", "metric", "gap", "real"])


def mean_curves(runs: Iterable[VariantRun]) -> dict[str, list[dict[str, Any]]]:
    """Per variant, the logged metrics averaged over its seeds step by step (for ``plot_variant_curves``)."""
    return curves_from_rows(curve_rows(runs))


# --- The results file of scripts/variants.py ----------------------------------------------------------

RESULTS_CSV = "variants.csv"
LOGS_CSV = "variants_logs.csv"
RESULTS_TXT = "variants.txt"
HACK_RESULTS_CSV = "hack.csv"
HACK_LOGS_CSV = "hack_logs.csv"
HACK_COMPLETIONS_CSV = "hack_completions.csv"
HACK_TXT = "hack.txt"


def is_hack(run: VariantRun) -> bool:
    """The reward-hack runs are their own experiment, recorded apart from the variants table."""
    return run.name.startswith("hack")


def write_results(runs: Sequence[VariantRun], folder: str | Path) -> list[Path]:
    """Record the runs in ``folder`` (notebook 07 reads these files); returns the paths written.

    Variant runs: the per-run table ``variants.csv`` and every logged step ``variants_logs.csv``. Reward-hack runs:
    ``hack.csv``, ``hack_logs.csv`` and their first and last logged completions ``hack_completions.csv``. Only the
    kinds present in ``runs`` are written, so recording the hack does not erase a recorded table, and back.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    table_runs = [run for run in runs if not is_hack(run)]
    hack_runs = [run for run in runs if is_hack(run)]
    kinds = ((table_runs, RESULTS_CSV, LOGS_CSV), (hack_runs, HACK_RESULTS_CSV, HACK_LOGS_CSV))
    for kind, table_csv, logs_csv in kinds:
        if kind:
            results_table(kind).to_csv(folder / table_csv, index=False, quoting=csv.QUOTE_MINIMAL)
            curve_rows(kind).to_csv(folder / logs_csv, index=False)
            written += [folder / table_csv, folder / logs_csv]
    if hack_runs:
        samples = []
        for run in hack_runs:
            logged = logged_completions(run.run_dir)
            ends = logged[logged["step"].isin([logged["step"].min(), logged["step"].max()])]
            samples.append(ends.drop(columns=["prompt"]).assign(variant=run.name))
        pd.concat(samples, ignore_index=True).to_csv(folder / HACK_COMPLETIONS_CSV, index=False)
        written.append(folder / HACK_COMPLETIONS_CSV)
    return written


def curve_rows(runs: Iterable[VariantRun]) -> Any:
    """Every run's logged optimizer steps, one row per (variant, seed, step): the curves, kept with the results.

    Steps that reuse a batch (``num_iterations > 1``) are kept: they carry the clip ratios but no reward.
    """
    rows = [{"variant": run.name, "seed": run.seed, **entry} for run in runs for entry in step_logs(run.log_history)]
    frame = pd.DataFrame(rows)
    keep = ["variant", "seed", "step", *CURVE_METRICS]
    keep += [c for c in frame.columns if c.startswith("rewards/") and c.endswith("/mean")]
    return frame[[c for c in keep if c in frame.columns]]


def curves_from_rows(frame: Any) -> dict[str, list[dict[str, Any]]]:
    """``curve_rows``' table back to ``{variant: seeds' mean per step}`` (what ``plot_variant_curves`` draws)."""
    curves = {}
    for name, rows in frame.groupby("variant", sort=False):
        mean = rows.drop(columns=["variant", "seed"]).groupby("step").mean(numeric_only=True).reset_index()
        curves[str(name)] = mean.to_dict("records")
    return curves


def recorded_folder() -> Path:
    """Where ``scripts/variants.py`` records the full table by default: the checkout's ``benchmarks/``."""
    return repo_root() / "benchmarks"


def recorded_lines(folder: str | Path | None = None, name: str = RESULTS_TXT) -> dict[str, str]:
    """The ``name: value`` lines of ``variants.txt`` or ``hack.txt`` (machine first): which machine, steps and seeds.

    An empty dict when the script has not recorded anything yet.
    """
    path = Path(folder or recorded_folder()) / name
    if not path.is_file():
        return {}
    pairs = (line.split(": ", 1) for line in path.read_text().splitlines() if ": " in line)
    return dict(pairs)


def read_results(path: str | Path) -> Any:
    """The per-run table written by ``write_results``; a clear error when the script has not run yet."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"No {path}: run `make variants` (scripts/variants.py) to measure the full table")
    return pd.read_csv(path)


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
