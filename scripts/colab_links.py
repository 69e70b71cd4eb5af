"""Point the course at a fork: ``make colab-links REPO=owner/name`` (or ``python scripts/colab_links.py owner/name``).

The repository URL lives in one place, ``[project.urls] Repository`` in ``pyproject.toml``. This rewrites it,
every Colab badge in the README, and the ``git clone`` of every notebook's install cell (its first code
cell) to ``https://github.com/owner/name``, in both copies: ``solutions/`` (the source) and ``notebooks/`` (the
learner copies made from it), so the two stay in step without a ``make notebooks``. Notebooks are edited as text,
so nothing else in them changes.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SLUG = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?/[A-Za-z0-9._-]+")
URL_LINE = re.compile(r'^(Repository\s*=\s*")https://github\.com/[^"]+(")', re.M)
BADGE = re.compile(r"(colab\.research\.google\.com/github/)[^/\s]+/[^/\s]+(/blob/)")
CLONE = re.compile(r"(git clone -q --depth 1 )\S+( /content/)")


def repository_url(root: Path = ROOT) -> str:
    """The course's repository URL, from ``pyproject.toml`` (the one place it is written)."""
    match = re.search(r'^Repository\s*=\s*"([^"]+)"', (root / "pyproject.toml").read_text(), re.M)
    if not match:
        raise SystemExit('error: pyproject.toml has no [project.urls] Repository = "https://github.com/..."')
    return match[1]


def _rewrite(path: Path, pattern: re.Pattern[str], replacement: str) -> int:
    text = path.read_text(encoding="utf-8")
    new, count = pattern.subn(replacement, text)
    if count:
        path.write_text(new, encoding="utf-8")
    return count


def set_repository(slug: str, root: Path = ROOT) -> dict[str, int]:
    """Rewrite the URL, the badges and the install cells to ``https://github.com/<slug>``; count each kind."""
    if not SLUG.fullmatch(slug or ""):
        raise SystemExit(
            f"error: REPO must look like owner/name (a GitHub repository), got {slug!r}. "
            "Example: make colab-links REPO=my-org/grpo-course"
        )
    url = f"https://github.com/{slug}"
    counts = {
        "pyproject.toml": _rewrite(root / "pyproject.toml", URL_LINE, rf"\g<1>{url}\g<2>"),
        "README badges": _rewrite(root / "README.md", BADGE, rf"\g<1>{slug}\g<2>"),
        "notebook install cells": sum(
            _rewrite(path, CLONE, rf"\g<1>{url}\g<2>")
            for folder in ("solutions", "notebooks")
            for path in sorted((root / folder).glob("*.ipynb"))
        ),
    }
    if not counts["pyproject.toml"]:
        raise SystemExit("error: pyproject.toml has no [project.urls] Repository line on github.com to rewrite")
    return counts


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("repo", nargs="?", default="", help="the fork, as owner/name")
    args = parser.parse_args(argv)
    counts = set_repository(args.repo)
    print(f"now pointing at {repository_url()}: " + ", ".join(f"{n} {k}" for k, n in counts.items()))


if __name__ == "__main__":
    main()
