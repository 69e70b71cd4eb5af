"""What this machine computes fast, in one place: the CPU's precision path and the GPU's abilities.

The CPU lab trains a bfloat16 copy of the model only where the CPU computes bfloat16 natively
(AVX512-BF16 or AMX). Elsewhere bfloat16 is emulated with float32 instructions and runs slower than
float32 itself, so the lab stays in float32. ``COURSE_CPU_PRECISION`` forces either path, so both can
be run and tested on one machine.
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass
from pathlib import Path

PRECISION_ENV_VAR = "COURSE_CPU_PRECISION"
PRECISION_CHOICES = ("auto", "bf16", "fp32")
NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")
# What torch.backends.cpu.get_cpu_capability() says when its kernels use AVX-512 (the only x86 level with bf16)
AVX512_CAPABILITIES = ("AVX512", "AVX512_BF16", "AMX")
# Variables that cap the instructions of torch's own kernels, oneDNN and MKL: on an AVX-512 machine, setting all
# three to AVX2 runs the kernels an AVX2 laptop runs (a proxy for it: same kernels, another processor)
KERNEL_LIMIT_VARIABLES = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS")


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
    import torch

    return str(torch.backends.cpu.get_cpu_capability())


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
    import torch

    probes = [getattr(torch.cpu, name, None) for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported")]
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
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def cuda_bf16_supported() -> bool:
    """True when the CUDA GPU computes bfloat16 (Ampere or newer; a T4 does not)."""
    import torch

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


def machine_summary() -> dict[str, str]:
    """The facts every measured figure is reported with: CPU, cores, kernels, precision path."""
    import torch

    precision = cpu_precision()
    return {
        "machine_cpu": cpu_model_name(),
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
