"""Where the course reads and writes files.

Notebooks run with their own folder as the working directory (Jupyter, nbmake, Colab all differ), so
every path is resolved here, once, from the location of the course itself and never from the
current directory. Each location can be moved with an environment variable.
"""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent


def repo_root() -> Path:
    """The course checkout (the folder holding ``notebooks/`` and ``course_utils/``).

    When the package is installed without its checkout (a wheel), the current directory stands in.
    """
    candidate = PACKAGE_DIR.parent
    if (candidate / "notebooks").is_dir():
        return candidate
    return Path.cwd()


def data_dir() -> Path:
    """The course's own small data files (``data/`` in the checkout)."""
    return repo_root() / "data"


def output_dir() -> Path:
    """Training runs, adapters, saved datasets and figures: git-ignored, set by ``COURSE_OUTPUT_DIR``."""
    path = Path(os.environ.get("COURSE_OUTPUT_DIR", repo_root() / "outputs"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def cache_dir() -> Path:
    """Materialized models live here, shared by every checkout: set by ``COURSE_CACHE_DIR``."""
    default = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "grpo-course"
    path = Path(os.environ.get("COURSE_CACHE_DIR", default))
    path.mkdir(parents=True, exist_ok=True)
    return path


BENCH_RESULTS_ENV_VAR = "COURSE_BENCH_RESULTS"


def bench_results_path() -> Path:
    """``benchmarks/results.txt``, written by ``make bench``: the measured figures, headed by the machine."""
    return Path(os.environ.get(BENCH_RESULTS_ENV_VAR, repo_root() / "benchmarks" / "results.txt"))


def bench_figures(names: list[str] | tuple[str, ...]) -> dict[str, str]:
    """The ``name: value`` lines of ``bench_results_path()`` named in ``names`` (none before ``make bench``).

    Why: figures that vary by machine have one home, this file, and text cites it instead of restating them.
    """
    path = bench_results_path()
    if not path.is_file():
        return {}
    figures = {}
    for line in path.read_text().splitlines():
        name, sep, value = line.partition(":")
        if sep and name.strip() in names:
            figures[name.strip()] = value.strip()
    return figures


def describe_bench_figures(names: list[str] | tuple[str, ...]) -> str:
    """The figures as ``name: value`` lines, the machine's lines first, or how to measure them here."""
    machine = ("measured_on", "machine_cpu", "cpu_capability", "cpu_precision_path")
    figures = bench_figures((*machine, *names))
    if not any(name in figures for name in names):
        return f"No measured figures yet in {bench_results_path()}: run `make bench` to measure this machine."
    return "\n".join(f"{name}: {value}" for name, value in figures.items())
