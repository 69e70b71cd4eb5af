"""Write constraints.txt: every package installed in this environment at its exact version (``make pins``).

Local version labels (``2.13.0+cpu``) are dropped, so one file pins both the CPU and the CUDA build of torch.
The course itself and pip's own tools are left out.
"""

from __future__ import annotations

import re
import sys
from importlib import metadata
from pathlib import Path

SKIPPED = {"grpo-course", "pip", "setuptools", "wheel"}
HEADER = """\
# The exact versions CI tested (Python 3.11, CPU torch), used by `make` and the Colab install cell as
# `pip install -c constraints.txt`. Written by `make pins` (scripts/write_constraints.py); don't edit by hand.
"""


def canonical(name: str) -> str:
    """The normalised project name (PEP 503): lower case, runs of ``-_.`` as one ``-``."""
    return re.sub(r"[-_.]+", "-", name).lower()


def installed_pins() -> list[str]:
    """``name==version`` for each installed distribution, sorted, local version labels dropped."""
    pins = {canonical(d.metadata["Name"]): d.version.split("+")[0] for d in metadata.distributions()}
    return [f"{name}=={version}" for name, version in sorted(pins.items()) if name not in SKIPPED]


def main() -> None:
    target = Path(sys.argv[1] if len(sys.argv) > 1 else "constraints.txt")
    target.write_text(HEADER + "\n".join(installed_pins()) + "\n")
    print(f"wrote {target}")


if __name__ == "__main__":
    main()
