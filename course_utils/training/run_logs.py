"""A GRPO run's log history: its training entries, as dicts or a DataFrame, saved, read back and compared.

``trainer.state.log_history`` holds one dict per logged step (``reward``, ``reward_std``, ``kl`` when
``beta > 0``, completion lengths, clipped ratio, ``frac_reward_zero_std``, each reward's mean). Here:

- ``training_logs`` / ``step_logs`` / ``log_history_frame`` / ``reward_columns``: the entries, as dicts or a DataFrame;
- ``save_run_artifacts`` / ``load_log_history``: ``log_history.csv`` and ``dashboard.png``, and back;
- ``compare_runs``: one metric of several saved runs, side by side (TensorBoard does it live with ``report_to``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import pandas as pd

from course_utils.lesson.plotting import plot_training_dashboard


def _entries_with(log_history: Sequence[Mapping[str, Any]], key: str) -> list[dict[str, Any]]:
    if not isinstance(log_history, Sequence) or isinstance(log_history, str):
        raise TypeError(
            f"log_history must be a list of dicts (trainer.state.log_history), got {type(log_history).__name__}"
        )
    return [dict(entry) for entry in log_history if isinstance(entry, Mapping) and key in entry]


def training_logs(log_history: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The GRPO training entries of a log history (those with a ``reward``), without the run summary."""
    return _entries_with(log_history, "reward")


def step_logs(log_history: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Every logged optimizer step (the entries with a ``loss``), without the run summary.

    With ``num_iterations > 1`` a generated batch is used for several steps; TRL logs the reused steps' loss and
    clip ratios but no reward (nothing new was generated), so ``training_logs`` leaves them out. Those are the
    only steps where the ratio differs from 1 and clipping can act.
    """
    return _entries_with(log_history, "loss")


def log_history_frame(log_history: Sequence[Mapping[str, Any]]) -> Any:
    """The training logs as a DataFrame indexed by step (one column per metric)."""
    frame = pd.DataFrame(training_logs(log_history))
    if frame.empty:
        return frame
    if "step" not in frame:
        frame["step"] = range(1, len(frame) + 1)
    return frame.set_index("step")


def reward_columns(frame: Any) -> list[str]:
    """The per-reward mean columns (``rewards/<name>/mean``) of a log frame."""
    return [c for c in frame.columns if c.startswith("rewards/") and c.endswith("/mean")]


def save_run_artifacts(log_history: Sequence[Mapping[str, Any]], run_dir: str | Path) -> dict[str, Path]:
    """Write the log history as ``log_history.csv`` and the dashboard as ``dashboard.png``; return both paths.

    Never over a longer log: a failed or resumed run whose history is shorter (a resume that stopped at step 0)
    leaves the longer file as it is and says so. The csv is written aside and renamed, so it is never half-written.
    """
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    csv_path = run_dir / "log_history.csv"
    png_path = run_dir / "dashboard.png"
    kept = logged_rows(csv_path)
    if kept is None or kept > len(log_history):
        why = "it cannot be read (delete it to let runs write theirs)" if kept is None else f"it has {kept} rows"
        print(f"kept {csv_path}: {why}, and this run's log history has {len(log_history)}")
        return {"csv": csv_path, "png": png_path}
    partial = csv_path.with_name(csv_path.name + ".partial")
    pd.DataFrame(list(log_history)).to_csv(partial, index=False)
    os.replace(partial, csv_path)
    figure = plot_training_dashboard(training_logs(log_history))
    figure.savefig(png_path, dpi=100, bbox_inches="tight")
    plt.close(figure)
    return {"csv": csv_path, "png": png_path}


def logged_rows(csv_path: Path) -> int | None:
    """How many rows a saved ``log_history.csv`` holds: 0 when there is none, None when it cannot be read.

    A file that cannot be read is not replaced: it may be the only copy of a run's history.
    """
    if not csv_path.is_file():
        return 0
    try:
        return len(pd.read_csv(csv_path))
    except pd.errors.EmptyDataError:
        return 0
    except (ValueError, UnicodeDecodeError, pd.errors.ParserError):
        return None


def load_log_history(path: str | Path) -> list[dict[str, Any]]:
    """Read a ``log_history.csv`` back (or a ``trainer_state.json``) as a list of dicts."""
    path = Path(path)
    fix = "train the run again, or pass another run folder"
    try:
        if path.suffix == ".json":
            return list(json.loads(path.read_text(encoding="utf-8"))["log_history"])
        frame = pd.read_csv(path)
    except (ValueError, KeyError, TypeError, UnicodeDecodeError, pd.errors.ParserError) as exc:
        raise ValueError(f"{path} is damaged or not a log history ({exc.__class__.__name__}: {exc}); {fix}") from exc
    return [{k: v for k, v in row.items() if pd.notna(v)} for row in frame.to_dict("records")]


def compare_runs(run_dirs: Sequence[str | Path], metric: str = "reward") -> Any:
    """One metric of several saved runs as a DataFrame: one row per step, one column per run folder.

    Each run folder needs the ``log_history.csv`` that ``save_run_artifacts`` writes (notebook 04 and
    ``scripts/train_grpo.py`` both do). Runs trained with ``report_to="tensorboard"`` can also be compared live:
    ``tensorboard --logdir outputs``.
    """
    if not run_dirs:
        raise ValueError("compare_runs needs at least one run folder (each holding log_history.csv)")
    folders = [Path(folder) for folder in run_dirs]
    names = [folder.name for folder in folders]
    columns = {}
    for folder in folders:
        path = folder / "log_history.csv"
        if not path.is_file():
            raise FileNotFoundError(f"No log_history.csv in {folder}: save the run with save_run_artifacts first")
        frame = log_history_frame(load_log_history(path))
        if metric not in frame.columns:
            raise ValueError(f"Run {folder.name} logged no {metric!r}; its metrics: {sorted(frame.columns)}")
        columns[folder.name if names.count(folder.name) == 1 else str(folder)] = frame[metric]
    return pd.DataFrame(columns)
