"""Variant runs compared and recorded (notebook 07, ``scripts/variants.py``): tables, seed noise, the results files.

``results_table`` and ``seed_summary`` turn runs into a table, ``real_difference`` says whether a gap is larger than
the seed-to-seed noise, ``curve_rows`` keeps every logged step; ``write_results`` records them under a name (the
full table ``variants``, or a pair measured apart, such as ``variants_gdpo``) and ``recorded_lines`` /
``read_results`` read them back; ``logged_completions`` reads what TRL logged with ``log_completions=True``.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from course_utils.core.paths import repo_root
from course_utils.evaluation.variants import BASELINE, VariantRun
from course_utils.training.run_logs import step_logs

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

# The recorded tables: <name>.csv (one row per run), <name>_logs.csv (every logged step), <name>.txt (the lines).
FULL_TABLE = "variants"
GDPO_TABLE = "variants_gdpo"  # GDPO beside the weighted sum, measured side by side on one machine
RESULTS_CSV = f"{FULL_TABLE}.csv"
LOGS_CSV = f"{FULL_TABLE}_logs.csv"
RESULTS_TXT = f"{FULL_TABLE}.txt"


def table_files(name: str = FULL_TABLE) -> tuple[str, str, str]:
    """The file names of the recorded table ``name``: its runs (csv), its logged steps (csv), its lines (txt)."""
    if not name or Path(name).name != name or "." in name:
        raise ValueError(f"table name {name!r}: give a bare name such as {FULL_TABLE!r}, without folder or suffix")
    return f"{name}.csv", f"{name}_logs.csv", f"{name}.txt"


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


def mean_curves(runs: Iterable[VariantRun]) -> dict[str, list[dict[str, Any]]]:
    """Per variant, the logged metrics averaged over its seeds step by step (for ``plot_variant_curves``)."""
    return curves_from_rows(curve_rows(runs))


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


def write_results(runs: Sequence[VariantRun], folder: str | Path, name: str = FULL_TABLE) -> list[Path]:
    """Record the runs as table ``name`` in ``folder`` (notebook 07 reads these files); returns the paths written.

    ``<name>.csv`` holds one row per run and ``<name>_logs.csv`` every logged step; ``<name>.txt`` (the machine and
    the plan, then one line per run) is the script's to write.
    """
    table_csv, logs_csv, _ = table_files(name)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    results_table(runs).to_csv(folder / table_csv, index=False, quoting=csv.QUOTE_MINIMAL)
    curve_rows(runs).to_csv(folder / logs_csv, index=False)
    return [folder / table_csv, folder / logs_csv]


def recorded_folder() -> Path:
    """Where ``scripts/variants.py`` records its tables by default: the checkout's ``benchmarks/``."""
    return repo_root() / "benchmarks"


def recorded_lines(folder: str | Path | None = None, name: str = RESULTS_TXT) -> dict[str, str]:
    """The ``name: value`` lines of a recorded ``.txt`` file (machine first): which machine, steps and seeds.

    An empty dict when the script has not recorded anything yet.
    """
    path = Path(folder or recorded_folder()) / name
    if not path.is_file():
        return {}
    pairs = (line.split(": ", 1) for line in path.read_text().splitlines() if ": " in line)
    return dict(pairs)


def read_results(path: str | Path) -> Any:
    """A table written by ``write_results``; a clear error when the script has not run yet."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"No {path}: run `make variants` (scripts/variants.py) to measure the full table")
    return pd.read_csv(path)
