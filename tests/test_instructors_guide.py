"""The instructor's guide quotes the README's run times; they must stay the README's (one home for the figures)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from course_utils.core.paths import readme_run_times

GUIDE = Path(__file__).resolve().parents[1] / "INSTRUCTORS.md"
PLANS = {"Plan A: Colab T4": "colab-t4", "Plan B: offline CPUs": "cpu"}


def plan_rows(heading: str) -> dict[str, str]:
    """``{notebook number: run time}`` from the table under the guide's ``## <heading>`` section."""
    section = GUIDE.read_text().split(f"## {heading}", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[1:-1] for line in section.splitlines() if re.match(r"\| (\d+|opt\.) \| \d\d \|", line)]
    return {cells[1].strip(): cells[2].strip() for cells in rows}


@pytest.mark.parametrize(("heading", "profile"), PLANS.items())
def test_each_plan_quotes_the_readme_run_time_of_every_notebook(heading, profile):
    readme = {stem[:2]: times[profile] for stem, times in readme_run_times().items()}
    rows = plan_rows(heading)
    assert set(rows) == set(readme), f"{heading}: notebooks {sorted(set(readme) ^ set(rows))} differ from the README"
    for number, time in rows.items():
        said = f"{heading}, notebook {number}: {time!r}, the README says {readme[number]!r}"
        assert time.startswith(readme[number]), said
