"""Run every notebook headless, in order, into ``build/`` with outputs, timing each one (``make course``).

For instructors: run it on a workshop machine the day before, read the timings, and open the executed
notebooks in ``build/`` to see what a finished run looks like. It runs the complete notebooks
(``solutions/``); ``--copy notebooks`` runs the learner copies, whose checks read "not answered yet" and
hand the package's reference on, so the timings are the same.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from course_utils.core.paths import repo_root
from course_utils.core.profiles import get_profile

COPIES = ("solutions", "notebooks")


def course_notebooks(folder: Path | None = None) -> list[Path]:
    """The course notebooks (``NN_name.ipynb``), in order; the complete ones (``solutions/``) by default."""
    folder = folder or repo_root() / "solutions"
    return sorted(path for path in folder.glob("[0-9][0-9]_*.ipynb"))


def execute_notebook(path: Path, output_dir: Path, timeout: int = 3600) -> float:
    """Execute one notebook in a fresh kernel, write it with its outputs to ``output_dir``; return seconds."""
    import nbformat  # here, not at the top: the notebook runner's imports take seconds and only this needs them
    from nbclient import NotebookClient

    notebook = nbformat.read(path, as_version=4)
    started = time.perf_counter()
    NotebookClient(
        notebook, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": path.parent}}
    ).execute()
    seconds = time.perf_counter() - started
    output_dir.mkdir(parents=True, exist_ok=True)
    nbformat.write(notebook, output_dir / path.name)
    return seconds


def run_course(output_dir: Path, only: list[str] | None = None, copy: str = "solutions") -> list[tuple[str, float]]:
    """Execute the notebooks in order (or those whose names contain one of ``only``); stop at the first failure."""
    if copy not in COPIES:
        raise ValueError(f"copy must be one of {COPIES}, got {copy!r}")
    timings = []
    for path in course_notebooks(repo_root() / copy):
        if only and not any(part in path.name for part in only):
            continue
        print(f"running {path.name} ...", flush=True)
        seconds = execute_notebook(path, output_dir)
        timings.append((path.name, seconds))
        print(f"  done in {seconds:.0f} s", flush=True)
    return timings


def main(argv: list[str] | None = None) -> int:
    """Command line: ``python -m course_utils.runner [--output build] [--only 04 05]``."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--output", type=Path, default=repo_root() / "build")
    parser.add_argument("--only", nargs="*", help="run only notebooks whose names contain these strings")
    parser.add_argument("--copy", choices=COPIES, default="solutions", help="the complete notebooks or the learners'")
    args = parser.parse_args(argv)
    profile = get_profile()
    print(f"profile: {profile.name}")
    try:
        timings = run_course(args.output, args.only, args.copy)
    except Exception as exc:  # report which notebook failed, in one line, for the instructor
        print(f"FAILED: {exc.__class__.__name__}: {str(exc)[-2000:]}", file=sys.stderr)
        return 1
    print(f"\nprofile {profile.name}: notebook timings (executed copies in {args.output})")
    for name, seconds in timings:
        print(f"  {name:<32} {seconds / 60:6.1f} min")
    print(f"  {'total':<32} {sum(s for _, s in timings) / 60:6.1f} min")
    return 0


if __name__ == "__main__":
    sys.exit(main())
