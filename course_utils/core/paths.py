"""Where the course reads and writes files.

Notebooks run with their own folder as the working directory (Jupyter, nbmake, Colab all differ), so
every path is resolved here, once, from the location of the course itself and never from the
current directory. Each location can be moved with an environment variable.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Protocol

PACKAGE_DIR = Path(__file__).resolve().parents[1]  # course_utils/, above this file's group


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
    return made_folder(Path(os.environ.get(OUTPUT_DIR_ENV_VAR, repo_root() / "outputs")), OUTPUT_DIR_ENV_VAR)


def made_folder(path: Path, variable: str) -> Path:
    """``path``, made if needed; a file in its place is named with the variable that moves it, instead of a bare
    ``FileExistsError`` from deep inside a run."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError) as exc:
        raise NotADirectoryError(
            f"{path} (set by {variable}) is a file or lies under one, not a folder: set {variable} to a folder, "
            "or move the file."
        ) from exc
    return path


OUTPUT_DIR_ENV_VAR = "COURSE_OUTPUT_DIR"
DRIVE_MOUNT_POINT = "/content/drive"
DRIVE_OUTPUT_FOLDER = "MyDrive/grpo-course/outputs"


def keep_outputs_on_drive(mount_point: str | Path = DRIVE_MOUNT_POINT) -> Path | None:
    """In Colab, mount Google Drive and point ``COURSE_OUTPUT_DIR`` at a folder on it; elsewhere do nothing.

    Colab gives each notebook its own runtime, so ``outputs/`` (notebook 03's weights, notebook 04's model) would
    be gone when the next notebook starts. On Drive they carry over: every notebook's install cell calls this, and
    each notebook then reads what the earlier ones saved. A declined or failed mount is said, and the run goes on
    with outputs kept in this runtime only.
    """
    try:
        from google.colab import drive  # only in Colab: elsewhere outputs/ already lasts
    except ImportError:
        return None
    try:
        drive.mount(str(mount_point))
    except Exception as exc:  # a declined authorisation raises whatever Colab raises
        print(f"Google Drive is not mounted ({exc}): this notebook's outputs stay in this runtime and the next "
              "notebooks will not find them. Run this cell again to mount it.")  # fmt: skip
        return None
    folder = Path(mount_point) / DRIVE_OUTPUT_FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    os.environ[OUTPUT_DIR_ENV_VAR] = str(folder)
    print(f"Outputs are kept on Google Drive in {folder}: the next notebooks find what this one saves.")
    return folder


def cache_dir() -> Path:
    """Materialized models live here, shared by every checkout: set by ``COURSE_CACHE_DIR``."""
    default = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "grpo-course"
    return made_folder(Path(os.environ.get("COURSE_CACHE_DIR", default)), "COURSE_CACHE_DIR")


BENCH_RESULTS_ENV_VAR = "COURSE_BENCH_RESULTS"


# Each results file and the command that writes it: the short benchmarks, and the held-out evaluation of the
# 10-minute cpu lab (45 minutes) and of the 30-minute cpu-long lab (65 minutes; with every checkpoint sampled, the
# curve of held-out pass@1 against the lab's minutes, 80 minutes, in two training seeds)
BENCH_FILES = {
    "results": "make bench",
    "results_heldout": "make bench-heldout",
    "results_heldout_seed1": "make bench-heldout HELDOUT_SEED=1",
    "results_heldout_cpu_long": "make bench-heldout HELDOUT_PROFILE=cpu-long",
    "results_heldout_cpu_long_curve": "make bench-heldout HELDOUT_PROFILE=cpu-long HELDOUT_CURVE=1",
    "results_heldout_cpu_long_seed1_curve": (
        "make bench-heldout HELDOUT_PROFILE=cpu-long HELDOUT_SEED=1 HELDOUT_CURVE=1"
    ),
    "results_tools": "make bench-tools",
    "results_levers": "make bench-levers",
    "results_collapse": "make bench-collapse",
}


def bench_results_path(results: str = "results") -> Path:
    """``benchmarks/<results>.txt``: the measured figures, headed by the machine (``BENCH_FILES`` says who writes it).

    ``COURSE_BENCH_RESULTS`` points the default ``results`` file elsewhere (tests use it).
    """
    if results not in BENCH_FILES:
        raise ValueError(f"unknown results file {results!r}; known: {sorted(BENCH_FILES)}")
    default = repo_root() / "benchmarks" / f"{results}.txt"
    return Path(os.environ.get(BENCH_RESULTS_ENV_VAR, default)) if results == "results" else default


def bench_figures(names: list[str] | tuple[str, ...], results: str = "results") -> dict[str, str]:
    """The ``name: value`` lines of ``bench_results_path(results)`` named in ``names`` (none before it is written).

    Why: figures that vary by machine have one home, this file, and text cites it instead of restating them.
    """
    path = bench_results_path(results)
    if not path.is_file():
        return {}
    figures = {}
    for line in path.read_text().splitlines():
        name, sep, value = line.partition(":")
        if sep and name.strip() in names:
            figures[name.strip()] = value.strip()
    return figures


def bench_names_starting(prefix: str, results: str = "results") -> list[str]:
    """The names of the lines of ``bench_results_path(results)`` that start with ``prefix``, in file order.

    Why: a series of lines named by their step (``heldout_curve_step_40``) is cited without restating its steps.
    """
    if not prefix:
        raise ValueError("prefix is empty: every line would match; give the start of the names, e.g. 'heldout_curve_'")
    path = bench_results_path(results)
    if not path.is_file():
        return []
    names = (line.partition(":")[0].strip() for line in path.read_text().splitlines() if ":" in line)
    return [name for name in names if name.startswith(prefix)]


def bench_series(name: str, results: str = "results") -> list[float]:
    """The numbers of one ``name: v1 v2 ...`` line (a per-step series); empty before the file or the line exists."""
    value = bench_figures([name], results).get(name)
    if value is None:
        return []
    try:
        return [float(item) for item in value.split()]
    except ValueError as error:
        raise ValueError(f"{bench_results_path(results)}: {name} should be numbers separated by spaces, got "
                         f"{value[:60]!r}; write the file again with `{BENCH_FILES[results]}`") from error  # fmt: skip


def describe_bench_figures(names: list[str] | tuple[str, ...], results: str = "results") -> str:
    """The figures as ``name: value`` lines, the machine's lines first, or how to measure them here."""
    machine = ("measured_on", "machine_cpu", "machine_cpu_family_model", "cpu_capability", "cpu_precision_path")
    figures = bench_figures((*machine, *names), results)
    if not any(name in figures for name in names):
        return (f"No measured figures yet in {bench_results_path(results)}: run `{BENCH_FILES[results]}` to measure "
                "this machine.")  # fmt: skip
    return "\n".join(f"{name}: {value}" for name, value in figures.items())


README_TABLE_HEADER = ("notebook", "what you do")  # the first two columns of the README's notebook table
README_NON_PROFILE_COLUMNS = {"notebook", "what you do", "colab"}
README_URL = "https://github.com/grpo-course/grpo-course#the-notebooks"


class _Named(Protocol):
    """Anything with a ``name``, such as a ``core.profiles.Profile`` (not imported: paths sits below it)."""

    name: str


def readme_path() -> Path:
    """The checkout's ``README.md``, home of the notebook table with each notebook's run time per profile."""
    return repo_root() / "README.md"


def _table_cells(line: str) -> list[str]:
    """The cells of one markdown table row (an escaped ``\\|`` stays inside its cell)."""
    return [cell.strip() for cell in re.split(r"(?<!\\)\|", line.strip().strip("|"))]


def _notebook_stem(cell: str) -> str | None:
    """``[`notebooks/03_x.ipynb`](notebooks/03_x.ipynb)`` -> ``03_x``; None for a cell naming no notebook."""
    match = re.search(r"notebooks/(\w+)\.ipynb", cell)
    return match.group(1) if match else None


def readme_run_times(readme: Path | None = None) -> dict[str, dict[str, str]]:
    """Notebook stem -> {profile: run time} from the README's notebook table.

    Why: the run times have one home, that table; notebooks print their row instead of restating it.
    A missing README raises FileNotFoundError; a missing table or a malformed row raises ValueError.
    """
    path = readme or readme_path()
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} not found: the notebook run times live in the course checkout's README.md; "
            "run from a clone of the course (or set the readme argument to its README.md)."
        )
    lines = path.read_text(encoding="utf-8").splitlines()
    start = next(
        (i for i, line in enumerate(lines) if tuple(c.lower() for c in _table_cells(line)[:2]) == README_TABLE_HEADER),
        None,
    )
    if start is None or start + 1 >= len(lines) or not re.fullmatch(r"[|:\-\s]+", lines[start + 1]):
        raise ValueError(
            f"{path} has no notebook table: add one whose header starts with '| notebook | what you do |', "
            "followed by a '| --- | --- | ... |' line."
        )
    header = [cell.lower() for cell in _table_cells(lines[start])]
    profiles = [name for name in header if name not in README_NON_PROFILE_COLUMNS]
    if not profiles:
        raise ValueError(f"{path}: the notebook table has no profile column (e.g. '| ci |') in its header.")
    table = {}
    for number, line in enumerate(lines[start + 2 :], start=start + 3):
        if not line.strip().startswith("|"):
            break
        cells = _table_cells(line)
        stem = _notebook_stem(cells[0])
        if stem is None or len(cells) != len(header):
            raise ValueError(
                f"{path}:{number}: malformed notebook row ({len(cells)} cells, the header has {len(header)}; "
                "the first cell must link notebooks/NN_name.ipynb): fix the row to match the header."
            )
        times = {name: cell for name, cell in zip(header, cells, strict=True) if name in profiles}
        empty = [name for name, time in times.items() if not time]
        if empty:
            raise ValueError(f"{path}:{number}: {stem} has no run time for {', '.join(empty)}: fill in the cell.")
        table[stem] = times
    return table


def _find_notebook(notebook: str, known: list[str]) -> str:
    """The stem ``notebook`` names: the stem itself, its ``NN`` number, or a ``.ipynb`` file name or path."""
    if not isinstance(notebook, str) or not notebook.strip():
        raise ValueError(f"notebook must be a name such as '03_reward_functions' or '03', not {notebook!r}.")
    name = Path(notebook.strip()).name.removesuffix(".ipynb")
    matches = [stem for stem in known if name in (stem, stem.split("_", 1)[0])]
    if len(matches) != 1:
        raise ValueError(
            f"Unknown notebook {notebook!r}: the README's notebook table has {', '.join(known)} "
            "(pass one of these stems or its two-digit number)."
        )
    return matches[0]


def notebook_run_times(notebook: str, readme: Path | None = None) -> dict[str, str]:
    """{profile: expected run time} of ``notebook`` (``"03_reward_functions"`` or ``"03"``), from the README."""
    table = readme_run_times(readme)
    return table[_find_notebook(notebook, list(table))]


def describe_run_time(notebook: str, profile: str | _Named, readme: Path | None = None) -> str:
    """One line with ``notebook``'s expected run time on ``profile`` (a name or a Profile), other profiles after.

    Why: a notebook prints its own row of the README's table instead of restating it. Without a README (an
    installed package without its checkout) it says where to read the table rather than failing.
    """
    name = getattr(profile, "name", profile)
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"profile must be a profile name such as 'ci' or a Profile, not {profile!r}.")
    key = name.strip().lower().replace("_", "-")
    try:
        table = readme_run_times(readme)
    except FileNotFoundError:
        return (
            f"Expected run time of {notebook}: no README.md at {readme or readme_path()} (course_utils runs without "
            f"the course checkout); read the notebook table at {README_URL}."
        )
    stem = _find_notebook(notebook, list(table))
    times = table[stem]
    others = ", ".join(f"{other} {time}" for other, time in times.items() if other != key)
    if key not in times:
        return (
            f"No expected run time of {stem} for the {key} profile: the README's notebook table has columns "
            f"for {', '.join(times)} only; add a '{key}' column to it ({others})."
        )
    return (
        f"Expected run time of {stem} on the {key} profile: {times[key]} "
        f"(README's notebook table; other profiles: {others})."
    )
