"""The course to look at before running it: every complete notebook executed under a profile, outputs kept.

``make render`` runs ``solutions/NN_*.ipynb`` in order under ``COURSE_PROFILE`` (``cpu`` by default), in a fresh
kernel each, with their own outputs folder, and writes:

- ``rendered/NN_*.ipynb``: the executed notebooks, committed, so GitHub and Colab show them with their dashboards,
  plots and tables (as rasbt/reasoning-from-scratch commits its chapters). Each starts with a line naming the
  machine, the date and the profile it ran on;
- ``build/site/``: the same as static HTML pages (nbconvert) with an ``index.html``, to browse offline.

Committed notebooks rather than a site: they need no hosting, render where learners already look (GitHub, Colab),
and ``make render`` rebuilds them with one command.

    python scripts/render_course.py [--profile cpu] [--only 03 04] [--site-only]
"""

from __future__ import annotations

import argparse
import datetime
import html
import os
import sys
from pathlib import Path

import nbformat
from nbconvert import HTMLExporter

from course_utils.core.hardware import machine_summary
from course_utils.runner import course_notebooks, execute_notebook

REPO = Path(__file__).resolve().parents[1]
RENDERED = REPO / "rendered"
SITE = REPO / "build" / "site"
HEADER_TAG = "rendered-by"  # the cell tag of the first line, so a second render replaces it


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="cpu", help="COURSE_PROFILE for the run (default: cpu)")
    parser.add_argument("--only", nargs="*", default=None, help="notebooks whose names contain one of these")
    parser.add_argument("--site-only", action="store_true", help="rebuild build/site/ from rendered/, run nothing")
    return parser.parse_args(argv)


def machine_line(profile: str, when: datetime.datetime | None = None) -> str:
    """The first line of a rendered notebook: when, where (CPU kind and precision path) and under which profile."""
    facts = machine_summary()
    when = when or datetime.datetime.now(datetime.UTC)
    where = (f"{facts['machine_cpu']} ({facts.get('machine_cpu_family_model', 'model unknown')}), "
             f"{facts['machine_cores']} cores, {facts['cpu_capability']}, "
             f"{facts['cpu_precision_path']} path")  # fmt: skip
    return (f"*Rendered on {when:%Y-%m-%d} on {where}, profile `{profile}`, by `make render`. The outputs are that "
            "run's; yours will differ with your machine and seed.*")  # fmt: skip


def with_header(notebook: nbformat.NotebookNode, line: str) -> nbformat.NotebookNode:
    """``notebook`` with ``line`` as its first cell (replacing an earlier render's)."""
    cells = [c for c in notebook.cells if HEADER_TAG not in c.get("metadata", {}).get("tags", [])]
    header = nbformat.v4.new_markdown_cell(line, metadata={"tags": [HEADER_TAG]})
    header["id"] = HEADER_TAG
    notebook.cells = [header, *cells]
    return notebook


def render_notebooks(profile: str, only: list[str] | None) -> list[tuple[str, float]]:
    """Execute the complete notebooks under ``profile`` into ``rendered/``, each headed by the machine line."""
    os.environ["COURSE_PROFILE"] = profile
    os.environ.setdefault("COURSE_OUTPUT_DIR", str(REPO / "build" / "render-outputs"))
    line = machine_line(profile)
    timings = []
    for path in course_notebooks(REPO / "solutions"):
        if only and not any(part in path.name for part in only):
            continue
        print(f"rendering {path.name} under {profile} ...", flush=True)
        seconds = execute_notebook(path, RENDERED)
        target = RENDERED / path.name
        target.write_text(nbformat.writes(with_header(nbformat.read(target, as_version=4), line)) + "\n")
        timings.append((path.name, seconds))
        print(f"  done in {seconds:.0f} s", flush=True)
    return timings


def build_site(source: Path = RENDERED, site: Path = SITE) -> Path:
    """HTML pages of the rendered notebooks and an index linking them; returns the index."""
    notebooks = sorted(source.glob("[0-9][0-9]_*.ipynb"))
    if not notebooks:
        raise FileNotFoundError(f"no rendered notebooks in {source}: run `make render` first")
    site.mkdir(parents=True, exist_ok=True)
    exporter = HTMLExporter(template_name="lab")
    links = []
    for path in notebooks:
        body, _ = exporter.from_filename(str(path))
        (site / f"{path.stem}.html").write_text(body, encoding="utf-8")
        links.append(f'<li><a href="{path.stem}.html">{html.escape(path.stem)}</a></li>')
    index = site / "index.html"
    index.write_text("<!doctype html><meta charset='utf-8'><title>GRPO course, rendered</title>"
                     "<h1>GRPO course, rendered</h1><ul>" + "".join(links) + "</ul>\n", encoding="utf-8")  # fmt: skip
    return index


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not args.site_only:
        for name, seconds in render_notebooks(args.profile, args.only):
            print(f"render_seconds_{name.split('_')[0]}: {seconds:.0f}")
    print(f"site: {build_site()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
