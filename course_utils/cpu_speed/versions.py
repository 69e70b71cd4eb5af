"""The versions the CPU speed-ups were tested with, and the internals of those libraries they build on.

The speed-ups replace pieces of TRL, transformers, PEFT and torch that are not public API (a TRL kernel called
by name, a function TRL asks, transformers' attention registries). Those can change in any release, so the
plug-in runs only on the minor versions it was tested with (``constraints.txt`` pins them) and only where every
internal it touches is there; elsewhere :func:`gate` says why, and training runs as plain TRL.
"""

from __future__ import annotations

import importlib
import inspect
from importlib.metadata import PackageNotFoundError, version

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

# Minor-version ranges of what constraints.txt installs and the tests ran on (torch 2.13.0, transformers 5.24.0,
# trl 1.16.0, peft 0.21.2): a new minor release may rename or change any internal below
TESTED: dict[str, str] = {
    "torch": ">=2.13,<2.14",
    "transformers": ">=5.24,<5.25",
    "trl": ">=1.16,<1.17",
    "peft": ">=0.21,<0.22",
}

# module -> the attributes of it the speed-ups use
INTERNALS: dict[str, tuple[str, ...]] = {
    "trl.trainer.utils": ("_use_triton", "_ChunkedLogProbFunction"),
    "trl.kernels.chunked_logprob": (
        "_forward_tile",
        "_backward_tile",
        "_addmm_fp32",
        "OPTIONAL_OUTPUTS",
        "TOKEN_CHUNK_SIZE",
        "_BLOCK_SIZE",
    ),
    "transformers.masking_utils": ("sdpa_mask",),
    "transformers.integrations.sdpa_attention": ("sdpa_attention_forward",),
    "transformers.cache_utils": ("DynamicLayer",),
    "peft.tuners.lora": ("LoraLayer",),
}
# TRL kernels called by keyword (cpu_speed.logit_tiles): the parameters they must take
KEYWORDS: dict[tuple[str, str], tuple[str, ...]] = {
    ("trl.kernels.chunked_logprob", "_forward_tile"): (
        "tile", "tile_stride", "targets", "running_max", "sum_exp", "x_sum_exp", "sq_sum_exp", "z_sum",
        "max_before_target", "target_logit", "vocab_start", "n_cols", "logit_scale", "softcap", "inv_t",
        "HAS_SOFTCAP", "BLOCK_SIZE",
    ),
    ("trl.kernels.chunked_logprob", "_backward_tile"): (
        "tile", "tile_stride", "targets", "log_z", "entropy", "grad_logprobs", "grad_entropy", "vocab_start",
        "n_cols", "logit_scale", "softcap", "inv_t", "HAS_SOFTCAP", "HAS_LOGPROB_GRAD", "HAS_ENTROPY_GRAD",
        "BLOCK_SIZE",
    ),
    ("trl.kernels.chunked_logprob", "_addmm_fp32"): ("acc", "a", "b"),
}  # fmt: skip


def installed_versions() -> dict[str, str | None]:
    """Each library of :data:`TESTED` and its installed version (None when it is not installed)."""
    found: dict[str, str | None] = {}
    for name in TESTED:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = None
    return found


def untested_versions() -> list[str]:
    """One line per library whose installed version lies outside its tested range: name, installed, tested."""
    problems = []
    for name, installed in installed_versions().items():
        try:
            ok = installed is not None and SpecifierSet(TESTED[name]).contains(Version(installed), prereleases=True)
        except InvalidVersion:
            ok = False
        if not ok:
            problems.append(f"{name} {installed or 'not installed'} (tested: {name}{TESTED[name]})")
    return problems


def missing_internals() -> list[str]:
    """The internals the speed-ups use that this installation lacks (or whose parameters changed)."""
    missing = []
    for module_name, names in INTERNALS.items():
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            missing.append(module_name)
            continue
        missing.extend(f"{module_name}.{name}" for name in names if not hasattr(module, name))
    for (module_name, name), wanted in KEYWORDS.items():
        function = getattr(importlib.import_module(module_name), name, None) if module_name not in missing else None
        if function is None:
            continue
        try:
            parameters = inspect.signature(function).parameters
        except (TypeError, ValueError):
            parameters = {}
        absent = [keyword for keyword in wanted if keyword not in parameters]
        if absent:
            missing.append(f"{module_name}.{name}'s parameters {', '.join(absent)}")
    return missing


def gate() -> str | None:
    """None where the speed-ups may run; else why not, naming each library (installed and tested versions)
    or each missing internal."""
    untested, missing = untested_versions(), missing_internals()
    if not (untested or missing):
        return None
    parts = []
    if untested:
        parts.append("untested versions: " + "; ".join(untested))
    if missing:
        parts.append("missing internals: " + ", ".join(missing))
    return ". ".join(parts)
