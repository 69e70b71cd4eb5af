"""The machine's facts: the CPU precision decision (every combination of torch's report, the CPU flags, the
system, the override) and the ``Hardware`` a run uses, from a name, a dict or this machine."""

from __future__ import annotations

from pathlib import Path

import pytest

from course_utils.core import hardware
from course_utils.core.hardware import (
    KNOWN_HARDWARE,
    PRECISION_CHOICES,
    PRECISION_ENV_VAR,
    Hardware,
    as_hardware,
    cpu_flags,
    cpu_precision,
    forced_precision,
    native_bf16,
    resolve_train_dtype,
)

NO_FLAGS: frozenset[str] = frozenset()
AVX2_FLAGS = frozenset({"sse4_2", "avx", "avx2", "fma"})
AVX512_FLAGS = AVX2_FLAGS | {"avx512f", "avx512bw"}


@pytest.mark.parametrize(
    ("capability", "torch_bf16", "flags", "system", "native"),
    [
        # torch's own report decides first
        ("AVX512", True, NO_FLAGS, "Linux", True),
        ("AVX512", False, AVX512_FLAGS | {"avx512_bf16"}, "Linux", False),
        ("AVX2", True, AVX512_FLAGS | {"avx512_bf16", "amx_bf16"}, "Linux", False),  # AVX2 kernels: emulated bf16
        ("DEFAULT", None, AVX512_FLAGS | {"amx_bf16"}, "Linux", False),
        ("NO AVX", None, NO_FLAGS, "Linux", False),
        # where torch has no bf16 probe, the CPU flags answer
        ("AVX512", None, AVX512_FLAGS | {"avx512_bf16"}, "Linux", True),
        ("AVX512", None, AVX512_FLAGS | {"amx_bf16"}, "Linux", True),
        ("AVX512", None, AVX512_FLAGS | {"avx512_bf16", "amx_bf16"}, "Linux", True),
        ("AVX512", None, AVX512_FLAGS, "Linux", False),
        ("avx512", None, AVX512_FLAGS | {"avx512_bf16"}, "Linux", True),
        # other systems stay in fp32
        ("AVX512", True, NO_FLAGS, "Darwin", False),
        ("AVX512", True, NO_FLAGS, "Windows", False),
        ("DEFAULT", None, NO_FLAGS, "Darwin", False),
    ],
)
def test_native_bf16_decision(capability, torch_bf16, flags, system, native):
    decided, reason = native_bf16(capability, torch_bf16, flags, system)
    assert decided is native
    assert reason  # every decision says why
    if system != "Linux":
        assert system in reason
    elif capability.upper() == "AVX2":
        assert "emulated" in reason


def test_override_forces_either_path():
    assert forced_precision({PRECISION_ENV_VAR: "bf16"}) == "bf16"
    assert forced_precision({PRECISION_ENV_VAR: " FP32 "}) == "fp32"
    assert forced_precision({PRECISION_ENV_VAR: "auto"}) is None
    assert forced_precision({}) is None
    for path in ("bf16", "fp32"):
        chosen = cpu_precision({PRECISION_ENV_VAR: path})
        assert chosen.path == path and chosen.forced and PRECISION_ENV_VAR in chosen.reason
        assert chosen.dtype == {"bf16": "bfloat16", "fp32": "float32"}[path]


@pytest.mark.parametrize("bad", ["fp16", "bfloat16", "yes", "1"])
def test_bad_override_lists_the_valid_values(bad):
    with pytest.raises(ValueError, match=PRECISION_ENV_VAR) as error:
        forced_precision({PRECISION_ENV_VAR: bad})
    for choice in PRECISION_CHOICES:
        assert choice in str(error.value)


def test_auto_follows_what_this_machine_reports(monkeypatch):
    monkeypatch.delenv(PRECISION_ENV_VAR, raising=False)
    chosen = cpu_precision()
    assert not chosen.forced
    assert chosen.capability == hardware.cpu_capability()
    assert chosen.path == ("bf16" if hardware.cpu_supports_bf16() else "fp32")


def test_non_linux_machine_takes_fp32(monkeypatch):
    monkeypatch.delenv(PRECISION_ENV_VAR, raising=False)
    monkeypatch.setattr(hardware.platform, "system", lambda: "Darwin")
    chosen = cpu_precision()
    assert chosen.path == "fp32" and "Darwin" in chosen.reason


def test_cpu_flags_read_the_flags_line(tmp_path: Path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512_bf16 amx_bf16\nbogomips\t: 1\n")
    assert cpu_flags(info) == {"fpu", "avx2", "avx512_bf16", "amx_bf16"}
    assert cpu_flags(tmp_path / "missing") == frozenset()
    info.write_text("processor\t: 0\n")
    assert cpu_flags(info) == frozenset()


def test_train_dtype_resolution(monkeypatch):
    monkeypatch.setenv(PRECISION_ENV_VAR, "fp32")
    assert resolve_train_dtype("cpu", "float32", "auto") == "float32"
    monkeypatch.setenv(PRECISION_ENV_VAR, "bf16")
    assert resolve_train_dtype("cpu", "float32", "auto") == "bfloat16"
    assert resolve_train_dtype("cuda", "float16", None) == "float16"
    assert resolve_train_dtype("cpu", "float32", "bfloat16") == "bfloat16"
    with pytest.raises(ValueError, match="auto"):
        resolve_train_dtype("cuda", "float16", "auto")


def test_kernel_limits_name_the_capping_variables_that_are_set():
    assert hardware.kernel_limits({}) == "none"
    assert hardware.kernel_limits({"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "", "HOME": "/"}) == (
        "ATEN_CPU_CAPABILITY=avx2"
    )
    every = {name: "AVX2" for name in hardware.KERNEL_LIMIT_VARIABLES}
    assert hardware.kernel_limits(every).count("=AVX2") == 3
    assert "cpu_kernel_limits" in hardware.machine_summary()


def test_known_hardware_and_detection():
    assert not KNOWN_HARDWARE["T4"].bf16 and KNOWN_HARDWARE["A800"].bf16
    assert KNOWN_HARDWARE["H100"].bf16 and KNOWN_HARDWARE["H100"].total_memory_gb == pytest.approx(79.1)
    here = as_hardware(None)
    assert here.device in ("cpu", "cuda") and 0 < here.available_memory_gb <= here.total_memory_gb


def test_hardware_is_read_from_a_name_a_dict_or_itself_and_bad_input_is_named():
    t4 = KNOWN_HARDWARE["T4"]
    assert as_hardware("T4") is t4 and as_hardware(t4) is t4
    assert as_hardware({"device": "cpu", "total_memory_gb": 8.0}) == Hardware("cpu", total_memory_gb=8.0)
    assert t4.label == "Tesla T4" and Hardware("cpu").label == "CPU"
    with pytest.raises(ValueError, match="Unknown hardware field"):
        as_hardware({"device": "cuda", "memory": 16})
    with pytest.raises(ValueError, match="known"):
        as_hardware("V100")
    with pytest.raises(TypeError, match="a Hardware, a dict"):
        as_hardware(16)
    with pytest.raises(ValueError, match="device"):
        Hardware(device="tpu")
    with pytest.raises(ValueError, match="num_processes"):
        Hardware("cpu", num_processes=0)


def test_cpu_family_model_tells_generations_of_one_model_name_apart(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\ncpu family\t: 25\nmodel\t\t: 1\nmodel name\t: AMD EPYC\n\nprocessor\t: 1\n"
                       "cpu family\t: 25\nmodel\t\t: 1\n")
    assert hardware.cpu_family_model(cpuinfo) == "family 25, model 1"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: Some CPU\n")
    assert hardware.cpu_family_model(cpuinfo) == "unknown"
    assert hardware.cpu_family_model(tmp_path / "missing") == "unknown"
