"""The machine, in one place: the CPU's precision path, the GPU's abilities, and the ``Hardware`` a run will use.

The CPU lab trains a bfloat16 copy of the model only where the CPU computes bfloat16 natively
(AVX512-BF16 or AMX). Elsewhere bfloat16 is emulated with float32 instructions and runs slower than
float32 itself, so the lab stays in float32. ``COURSE_CPU_PRECISION`` forces either path, so both can
be run and tested on one machine.

``hub_reachable`` tells whether the Hugging Face Hub answers (offline rooms and CI: it does not).

``Hardware`` describes a machine the way the preflight checks need it (device, GPU, native bf16, memory);
``KNOWN_HARDWARE`` holds the GPUs the course plans for, so a check can be run for a T4 on any machine.

torch is imported on first use (``_torch``), not at the top: core is loaded by the profiles and by the
notebook runner, which start without torch and report it missing instead of failing to import.
"""

from __future__ import annotations

import dataclasses
import os
import platform
import socket
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import psutil

PRECISION_ENV_VAR = "COURSE_CPU_PRECISION"
PRECISION_CHOICES = ("auto", "bf16", "fp32")
NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")
# What torch.backends.cpu.get_cpu_capability() says when its kernels use AVX-512 (the only x86 level with bf16)
AVX512_CAPABILITIES = ("AVX512", "AVX512_BF16", "AMX")
# Variables that cap the instructions of torch's own kernels, oneDNN and MKL: on an AVX-512 machine, setting all
# three to AVX2 runs the kernels an AVX2 laptop runs (a proxy for it: same kernels, another processor)
KERNEL_LIMIT_VARIABLES = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS")
# Memory (GB) torch reports on the GPUs the course plans for
GPU_MEMORY_GB = {"T4": 15.0, "A100-40GB": 39.5, "A100-80GB": 79.3, "A800-80GB": 79.3, "H100-80GB": 79.1}


def _torch() -> ModuleType:
    """torch, imported on first use (see the module docstring: core loads without it)."""
    import torch  # inside on purpose: the runner and the profiles import core before torch is needed

    return torch


@dataclass(frozen=True)
class CpuPrecision:
    """The precision the CPU lab trains and generates in, and why."""

    path: str  # "bf16" or "fp32"
    reason: str
    capability: str  # what torch reports, e.g. "AVX2" or "AVX512"
    forced: bool = False

    @property
    def dtype(self) -> str:
        """The torch dtype name of this path."""
        return "bfloat16" if self.path == "bf16" else "float32"

    def __str__(self) -> str:
        return f"{self.path} ({self.reason})"


def cpu_capability() -> str:
    """The vector instruction level torch's CPU kernels use here ("AVX2", "AVX512", "DEFAULT", ...)."""
    return str(_torch().backends.cpu.get_cpu_capability())


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    """The CPU's feature flags as Linux lists them (empty where there is no /proc/cpuinfo)."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith("flags"):
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()


def torch_reports_native_bf16() -> bool | None:
    """What torch's own CPU probe says about bfloat16 instructions (None where this torch cannot tell)."""
    probes = [getattr(_torch().cpu, name, None) for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported")]
    if not all(callable(probe) for probe in probes):
        return None
    return any(probe() for probe in probes)


def native_bf16(capability: str, torch_bf16: bool | None, flags: frozenset[str], system: str) -> tuple[bool, str]:
    """Does this CPU compute bfloat16 natively? The decision and its reason, from plain facts (testable).

    torch's own report comes first: its kernel level (bf16 needs AVX-512 kernels), then its bf16 probe.
    The Linux CPU flags answer only where this torch has no probe.
    """
    if system != "Linux":
        return False, f"{system}: bf16 speed is not checked there, float32 is the safe choice"
    if capability.upper() not in AVX512_CAPABILITIES:
        return False, f"torch runs {capability} kernels here, so bf16 would be emulated (slower than fp32)"
    if torch_bf16 is not None:
        if torch_bf16:
            return True, f"torch runs {capability} kernels and reports native bf16 (AVX512-BF16 or AMX)"
        return False, f"torch runs {capability} kernels but reports no AVX512-BF16 or AMX instructions"
    found = sorted(set(NATIVE_BF16_FLAGS) & flags)
    if found:
        return True, f"torch runs {capability} kernels and the CPU flags list {', '.join(found)}"
    return False, f"torch runs {capability} kernels but the CPU flags list neither avx512_bf16 nor amx_bf16"


def forced_precision(environ: dict[str, str] | None = None) -> str | None:
    """The path ``COURSE_CPU_PRECISION`` forces ("bf16" or "fp32"), None for auto; a bad value is an error."""
    value = (os.environ if environ is None else environ).get(PRECISION_ENV_VAR, "auto").strip().lower() or "auto"
    if value not in PRECISION_CHOICES:
        raise ValueError(
            f"{PRECISION_ENV_VAR}={value!r} is not a precision path; use one of {', '.join(PRECISION_CHOICES)} "
            "(auto: bf16 where the CPU computes it natively, fp32 elsewhere)."
        )
    return None if value == "auto" else value


def cpu_precision(environ: dict[str, str] | None = None) -> CpuPrecision:
    """The CPU lab's precision path on this machine: bf16 where native, fp32 elsewhere, or what is forced."""
    forced = forced_precision(environ)
    if forced is not None:
        return CpuPrecision(forced, f"forced by {PRECISION_ENV_VAR}={forced}", cpu_capability(), forced=True)
    native, reason = detect_native_bf16()
    return CpuPrecision("bf16" if native else "fp32", reason, cpu_capability())


def detect_native_bf16() -> tuple[bool, str]:
    """``native_bf16`` for this machine: torch's report, the CPU flags and the operating system."""
    return native_bf16(cpu_capability(), torch_reports_native_bf16(), cpu_flags(), platform.system())


def cpu_supports_bf16() -> bool:
    """True when this CPU computes bfloat16 natively, whatever ``COURSE_CPU_PRECISION`` forces."""
    return detect_native_bf16()[0]


def resolve_train_dtype(device: str, dtype: str, train_dtype: str | None) -> str:
    """The dtype a profile's model trains in: ``train_dtype="auto"`` on a CPU follows ``cpu_precision()``."""
    if train_dtype is None:
        return dtype
    if train_dtype != "auto":
        return train_dtype
    if device != "cpu":
        raise ValueError("train_dtype='auto' picks a CPU precision path; on a GPU set dtype/train_dtype explicitly.")
    return cpu_precision().dtype


def cuda_available() -> bool:
    """True when torch sees a CUDA GPU."""
    try:
        torch = _torch()
    except ImportError:
        return False
    return torch.cuda.is_available()


def cuda_bf16_supported() -> bool:
    """True when the CUDA GPU computes bfloat16 (Ampere or newer; a T4 does not)."""
    torch = _torch()
    return torch.cuda.is_available() and torch.cuda.is_bf16_supported()


def cpu_model_name(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU's model name as Linux reports it (else what the platform module knows)."""
    try:
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_family_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU's family and model numbers ("family 25, model 1"): one model name covers generations that differ
    several-fold in speed (AMD's "AMD EPYC" names Zen 1 to Zen 5 alike). "unknown" where Linux does not say."""
    try:
        lines = cpuinfo.read_text().splitlines()
    except OSError:
        return "unknown"
    fields: dict[str, str] = {}
    for line in lines:  # the first processor's lines come first
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    if "cpu family" not in fields or "model" not in fields:
        return "unknown"
    return f"family {fields['cpu family']}, model {fields['model']}"


def machine_summary() -> dict[str, str]:
    """The facts every measured figure is reported with: CPU, cores, kernels, precision path."""
    torch = _torch()
    precision = cpu_precision()
    return {
        "machine_cpu": cpu_model_name(),
        "machine_cpu_family_model": cpu_family_model(),
        "machine_cores": str(os.cpu_count()),
        "machine_torch_threads": str(torch.get_num_threads()),
        "cpu_capability": precision.capability,
        "cpu_native_bf16": str(cpu_supports_bf16()),
        "cpu_precision_path": precision.path + (" (forced)" if precision.forced else ""),
        "cpu_kernel_limits": kernel_limits(),
        "torch_version": torch.__version__,
    }


def kernel_limits(environ: dict[str, str] | None = None) -> str:
    """The kernel-capping variables set here, e.g. ``ATEN_CPU_CAPABILITY=avx2``, or ``none``."""
    environ = os.environ if environ is None else environ
    return ", ".join(f"{name}={environ[name]}" for name in KERNEL_LIMIT_VARIABLES if environ.get(name)) or "none"


# --- The machine a run will use -------------------------------------------------------------------


@dataclass(frozen=True)
class Hardware:
    """The machine a run will use: what the preflight checks need to know about it."""

    device: str  # "cpu" or "cuda"
    gpu_name: str | None = None
    bf16: bool = False  # native bfloat16: Ampere+ GPUs; CPUs with AVX512-BF16 or AMX
    total_memory_gb: float = 0.0
    available_memory_gb: float = 0.0
    num_processes: int = 1

    def __post_init__(self) -> None:
        if self.device not in ("cpu", "cuda"):
            raise ValueError(f"Hardware.device must be 'cpu' or 'cuda', got {self.device!r}")
        if self.available_memory_gb < 0 or self.total_memory_gb < 0:
            raise ValueError("Hardware memory sizes must be >= 0 GB")
        if self.num_processes < 1:
            raise ValueError(f"num_processes must be >= 1, got {self.num_processes}")

    @property
    def label(self) -> str:
        """How findings name the machine: the GPU's name, or "CPU"."""
        return self.gpu_name or "CPU"


def _gpu(name: str, key: str, bf16: bool) -> Hardware:
    size = GPU_MEMORY_GB[key]
    return Hardware("cuda", name, bf16, size, size)


KNOWN_HARDWARE: dict[str, Hardware] = {
    "T4": _gpu("Tesla T4", "T4", bf16=False),
    "A100": _gpu("NVIDIA A100-SXM4-40GB", "A100-40GB", bf16=True),
    "A100-80GB": _gpu("NVIDIA A100-SXM4-80GB", "A100-80GB", bf16=True),
    "A800": _gpu("NVIDIA A800-SXM4-80GB", "A800-80GB", bf16=True),
    "H100": _gpu("NVIDIA H100 80GB HBM3", "H100-80GB", bf16=True),
}


def detect_hardware() -> Hardware:
    """This machine: the first CUDA GPU if there is one (free memory as available), else the CPU and its RAM."""
    torch = _torch()
    if torch.cuda.is_available():
        free, total = torch.cuda.mem_get_info(0)
        return Hardware(
            device="cuda",
            gpu_name=torch.cuda.get_device_name(0),
            bf16=torch.cuda.is_bf16_supported(),
            total_memory_gb=total / 1024**3,
            available_memory_gb=free / 1024**3,
        )
    memory = psutil.virtual_memory()
    return Hardware("cpu", None, cpu_supports_bf16(), memory.total / 1024**3, memory.available / 1024**3)


def as_hardware(hardware: Hardware | dict[str, Any] | str | None) -> Hardware:
    """A ``Hardware`` from itself, a dict of its fields, a known name (``"T4"``, ``"A100"``...), or None (detect)."""
    if hardware is None:
        return detect_hardware()
    if isinstance(hardware, Hardware):
        return hardware
    if isinstance(hardware, str):
        if hardware not in KNOWN_HARDWARE:
            raise ValueError(f"Unknown hardware {hardware!r}; known: {sorted(KNOWN_HARDWARE)} (or pass a dict)")
        return KNOWN_HARDWARE[hardware]
    if isinstance(hardware, dict):
        names = {f.name for f in dataclasses.fields(Hardware)}
        unknown = sorted(set(hardware) - names)
        if unknown:
            raise ValueError(f"Unknown hardware field(s) {unknown}; valid fields: {sorted(names)}")
        return Hardware(**hardware)
    raise TypeError(f"hardware must be a Hardware, a dict, a name or None, got {type(hardware).__name__}")


def hub_reachable(timeout: float = 3.0) -> bool:
    """True when the Hugging Face Hub answers; False offline or with ``HF_HUB_OFFLINE=1``.

    A plain TCP connection is enough to tell, and fails within ``timeout`` seconds instead of hanging.
    """
    if os.environ.get("HF_HUB_OFFLINE", "0").lower() in {"1", "true", "yes"}:
        return False
    try:
        with socket.create_connection(("huggingface.co", 443), timeout=timeout):
            return True
    except OSError:
        return False
