"""Paths come from the course's location, never from the current directory; each can be moved by a variable."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from course_utils.core import paths
from course_utils.core.profiles import PROFILES, get_profile


def test_repo_root_holds_the_notebooks_whatever_the_working_directory(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    assert (paths.repo_root() / "notebooks" / "00_setup.ipynb").is_file()
    assert paths.data_dir() == paths.repo_root() / "data"


def test_output_and_cache_dirs_follow_their_variables(monkeypatch, tmp_path):
    monkeypatch.setenv("COURSE_OUTPUT_DIR", str(tmp_path / "out"))
    monkeypatch.setenv("COURSE_CACHE_DIR", str(tmp_path / "cache"))
    assert paths.output_dir() == tmp_path / "out" and (tmp_path / "out").is_dir()
    assert paths.cache_dir() == tmp_path / "cache" and (tmp_path / "cache").is_dir()


def test_default_output_dir_is_the_ignored_outputs_folder(monkeypatch):
    monkeypatch.delenv("COURSE_OUTPUT_DIR", raising=False)
    assert paths.output_dir() == paths.repo_root() / "outputs"
    assert "outputs/" in (paths.repo_root() / ".gitignore").read_text().split()


def test_default_cache_is_under_the_user_cache(monkeypatch, tmp_path):
    monkeypatch.delenv("COURSE_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert paths.cache_dir() == Path(tmp_path) / "grpo-course"


NOTEBOOK_TABLE = """# Course

## The notebooks

| notebook | what you do | ci | cpu | Colab |
| --- | --- | --- | --- | --- |
| [`notebooks/00_setup.ipynb`](notebooks/00_setup.ipynb) | check the set-up | 0.5 min | 1 min | [badge](x) |
| [`notebooks/03_reward_functions.ipynb`](notebooks/03_reward_functions.ipynb) | a \\| b | 2 min | 3 min | [b](y) |

## Next section
"""


def write_readme(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "README.md"
    path.write_text(text, encoding="utf-8")
    return path


def test_the_real_readme_has_a_row_with_every_profile_for_every_notebook():
    table = paths.readme_run_times()
    assert sorted(table) == sorted(p.stem for p in (paths.repo_root() / "notebooks").glob("*.ipynb"))
    for stem, times in table.items():
        assert set(times) == set(PROFILES), f"{stem}: columns {sorted(times)}, profiles {sorted(PROFILES)}"
        assert all(re.search(r"\d", time) for time in times.values()), (stem, times)


def test_run_times_are_read_by_stem_number_or_file_name(tmp_path):
    readme = write_readme(tmp_path, NOTEBOOK_TABLE)
    expected = {"ci": "2 min", "cpu": "3 min"}
    for name in ("03_reward_functions", "03", "03_reward_functions.ipynb", "notebooks/03_reward_functions.ipynb"):
        assert paths.notebook_run_times(name, readme) == expected
    assert paths.notebook_run_times("00", readme) == {"ci": "0.5 min", "cpu": "1 min"}


def test_describe_run_time_gives_this_profile_first_then_the_others(tmp_path):
    readme = write_readme(tmp_path, NOTEBOOK_TABLE)
    line = paths.describe_run_time("03", get_profile("cpu"), readme)
    assert line == (
        "Expected run time of 03_reward_functions on the cpu profile: 3 min "
        "(README's notebook table; other profiles: ci 2 min)."
    )
    assert paths.describe_run_time("03_reward_functions", "CI", readme).startswith(
        "Expected run time of 03_reward_functions on the ci profile: 2 min"
    )


def test_the_real_readme_describes_every_notebook_on_every_profile():
    for stem in paths.readme_run_times():
        for name in PROFILES:
            line = paths.describe_run_time(stem, get_profile(name))
            assert line.startswith(f"Expected run time of {stem} on the {name} profile: "), line


def test_a_profile_without_a_column_is_named_with_the_fix(tmp_path):
    line = paths.describe_run_time("00", "gpu", write_readme(tmp_path, NOTEBOOK_TABLE))
    assert "No expected run time of 00_setup for the gpu profile" in line
    assert "columns for ci, cpu only" in line and "add a 'gpu' column" in line


def test_a_missing_readme_is_an_error_for_the_parser_and_a_pointer_in_the_notebook(tmp_path):
    missing = tmp_path / "README.md"
    with pytest.raises(FileNotFoundError, match=r"README\.md not found"):
        paths.notebook_run_times("00", missing)
    line = paths.describe_run_time("00_setup", "ci", missing)
    assert f"no README.md at {missing}" in line and paths.README_URL in line


def test_an_unknown_notebook_raises_listing_the_known_ones(tmp_path):
    readme = write_readme(tmp_path, NOTEBOOK_TABLE)
    for bad in ("08", "0", "setup", "04_train_grpo"):
        with pytest.raises(ValueError, match=r"Unknown notebook .*00_setup, 03_reward_functions"):
            paths.notebook_run_times(bad, readme)
    with pytest.raises(ValueError, match="Unknown notebook"):
        paths.describe_run_time("08", "ci", readme)


@pytest.mark.parametrize("bad", ["", "  ", None, 3])
def test_a_notebook_that_is_not_a_name_is_refused(tmp_path, bad):
    with pytest.raises(ValueError, match="notebook must be a name"):
        paths.notebook_run_times(bad, write_readme(tmp_path, NOTEBOOK_TABLE))


@pytest.mark.parametrize("bad", ["", None, 3])
def test_a_profile_that_is_not_a_name_is_refused(tmp_path, bad):
    with pytest.raises(ValueError, match="profile must be a profile name"):
        paths.describe_run_time("00", bad, write_readme(tmp_path, NOTEBOOK_TABLE))


def test_a_notebook_without_a_row_is_unknown(tmp_path):
    lines = NOTEBOOK_TABLE.splitlines(keepends=True)
    readme = write_readme(tmp_path, "".join(line for line in lines if "03_reward" not in line))
    assert list(paths.readme_run_times(readme)) == ["00_setup"]
    with pytest.raises(ValueError, match=r"Unknown notebook '03'.*has 00_setup \("):
        paths.notebook_run_times("03", readme)


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ("| 2 min | 3 min |", "| 2 min |", r"README.md:8: malformed notebook row \(4 cells, the header has 5"),
        ("[`notebooks/00_setup.ipynb`](notebooks/00_setup.ipynb)", "setup", r"README.md:7: malformed notebook row"),
        ("| 0.5 min |", "|  |", r"README.md:7: 00_setup has no run time for ci"),
        ("| notebook | what you do |", "| file | what you do |", "has no notebook table"),
        ("| --- | --- | --- | --- | --- |\n", "", "has no notebook table"),
    ],
)
def test_a_malformed_table_is_an_error_naming_the_line_and_the_fix(tmp_path, old, new, message):
    assert old in NOTEBOOK_TABLE
    readme = write_readme(tmp_path, NOTEBOOK_TABLE.replace(old, new, 1))
    with pytest.raises(ValueError, match=message):
        paths.readme_run_times(readme)


def test_a_table_without_profile_columns_is_an_error(tmp_path):
    readme = write_readme(tmp_path, "| notebook | what you do | Colab |\n| --- | --- | --- |\n")
    with pytest.raises(ValueError, match="no profile column"):
        paths.readme_run_times(readme)


def test_bench_figures_read_the_named_lines_of_a_results_file(monkeypatch, tmp_path):
    results = tmp_path / "results.txt"
    results.write_text("# benchmarks/x.py\nmachine_cpu: Some CPU\neval_speedup: 3.10\nother: 1\nnot a line\n")
    monkeypatch.setenv(paths.BENCH_RESULTS_ENV_VAR, str(results))
    assert paths.bench_figures(["eval_speedup", "absent"]) == {"eval_speedup": "3.10"}
    assert paths.describe_bench_figures(["eval_speedup"]) == "machine_cpu: Some CPU\neval_speedup: 3.10"


def test_without_figures_the_description_names_the_command_that_measures_them(monkeypatch, tmp_path):
    monkeypatch.setenv(paths.BENCH_RESULTS_ENV_VAR, str(tmp_path / "none.txt"))
    assert "run `make bench`" in paths.describe_bench_figures(["eval_speedup"])
    monkeypatch.setattr(paths, "repo_root", lambda: tmp_path)
    assert "run `make bench-heldout`" in paths.describe_bench_figures(["heldout_pass1_grpo"], "results_heldout")
    long_lab = paths.describe_bench_figures(["heldout_pass1_grpo"], "results_heldout_cpu_long")
    assert "run `make bench-heldout HELDOUT_PROFILE=cpu-long`" in long_lab


def test_an_unknown_results_file_is_refused_with_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown results file 'result'.*results_heldout"):
        paths.bench_results_path("result")


def test_a_series_line_is_read_as_numbers_and_a_missing_one_as_none_yet(monkeypatch, tmp_path):
    results = tmp_path / "results.txt"
    results.write_text("machine_cpu: Some CPU\ncpu_lab_correct_share_per_step: 0.00 0.12 0.25\nbroken: 0.1 x\n")
    monkeypatch.setenv(paths.BENCH_RESULTS_ENV_VAR, str(results))
    assert paths.bench_series("cpu_lab_correct_share_per_step") == [0.0, 0.12, 0.25]
    assert paths.bench_series("cpu_lab_kl_per_step") == []
    with pytest.raises(ValueError, match=r"broken should be numbers.*'0.1 x'.*make bench"):
        paths.bench_series("broken")
    monkeypatch.setenv(paths.BENCH_RESULTS_ENV_VAR, str(tmp_path / "absent.txt"))
    assert paths.bench_series("cpu_lab_correct_share_per_step") == []


def test_names_by_prefix_come_in_file_order_and_an_empty_prefix_is_refused(monkeypatch, tmp_path):
    results = tmp_path / "results.txt"
    results.write_text("# benchmarks/x.py\nmachine_cpu: Some CPU\nheldout_curve_step_80: minutes 7.0\n"
                       "heldout_curve_step_40: minutes 3.5\nheldout_pass1_grpo: 0.02\nnot a line\n")  # fmt: skip
    monkeypatch.setenv(paths.BENCH_RESULTS_ENV_VAR, str(results))
    assert paths.bench_names_starting("heldout_curve_step_") == ["heldout_curve_step_80", "heldout_curve_step_40"]
    assert paths.bench_names_starting("absent_") == []
    with pytest.raises(ValueError, match="prefix is empty"):
        paths.bench_names_starting("")
    monkeypatch.setenv(paths.BENCH_RESULTS_ENV_VAR, str(tmp_path / "absent.txt"))
    assert paths.bench_names_starting("heldout_curve_step_") == []


@pytest.mark.parametrize("results", sorted(paths.BENCH_FILES))
def test_each_results_file_is_the_one_its_command_writes(results):
    """The command ``describe_bench_figures`` names, dry-run by make, ends by writing that file and no other."""
    make, *arguments = paths.BENCH_FILES[results].split()
    dry_run = subprocess.run([make, "-n", *arguments], cwd=paths.repo_root(), capture_output=True, text=True,
                             check=True).stdout  # fmt: skip
    assert re.findall(r"written: ([\w/.]+)", dry_run) == [f"benchmarks/{results}.txt"]
