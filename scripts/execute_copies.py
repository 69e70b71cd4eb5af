"""Execute both copies of the course with nbmake, side by side: ``make test`` calls this.

``solutions/`` and ``notebooks/`` are copied to ``build/executed/`` and each copy runs in its own pytest
process, its notebooks in order (notebook 05 reads what 04 trained), with its own ``COURSE_OUTPUT_DIR`` so the
two never read each other's runs. ``--overwrite`` keeps the outputs in the executed copies, where
``tests/test_executed_notebooks.py`` reads the verdicts. Two processes at once use both cores: most of a
notebook's time is spent in one thread (the kernel's start and imports, tokenising, Python loops).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COPIES = ("solutions", "notebooks")


def prepare(target: Path) -> None:
    """A fresh ``target`` holding both copies and an empty output folder for each."""
    shutil.rmtree(target, ignore_errors=True)
    for copy in COPIES:
        shutil.copytree(ROOT / copy, target / copy)
        (target / f"outputs-{copy}").mkdir(parents=True)


def start(copy: str, target: Path, threads: int) -> subprocess.Popen[bytes]:
    """One copy's nbmake run, its output to ``<copy>.log``."""
    env = {**os.environ, "COURSE_OUTPUT_DIR": str(target / f"outputs-{copy}"), "OMP_NUM_THREADS": str(threads)}
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--durations=0", "--nbmake",
               "--overwrite", str(target / copy)]  # fmt: skip
    log = (target / f"{copy}.log").open("wb")
    return subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", type=Path, default=ROOT / "build" / "executed")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per copy (OMP_NUM_THREADS)")
    args = parser.parse_args(argv)
    prepare(args.target)
    started = time.perf_counter()
    runs = {copy: start(copy, args.target, args.threads) for copy in COPIES}
    codes = {copy: run.wait() for copy, run in runs.items()}
    for copy in COPIES:
        print(f"--- {copy}/ executed (exit {codes[copy]}):")
        print((args.target / f"{copy}.log").read_text(errors="replace")[-6000:])
    print(f"both copies: {time.perf_counter() - started:.0f} s")
    return 0 if not any(codes.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
