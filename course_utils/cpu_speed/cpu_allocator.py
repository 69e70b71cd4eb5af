"""Keep big freed blocks in the process, so that CPU training does not pay the kernel for fresh pages each op.

Why this matters: on a CPU, TRL scores the vocabulary in tiles of tokens x 32,768 entries, and its backward
pass makes about ten float32 temporaries of that size per tile (about 90 MB each in the `cpu` lab). glibc's
``malloc`` hands every request above 32 MB to the kernel (``mmap``) and gives it back on ``free``
(``munmap``), so each temporary starts as untouched pages that fault in one by one, zero-filled by the
kernel. ``benchmarks/bench_cpu_allocator.py`` measures the page faults and seconds of one forward + backward of
the log-softmax on the lab's shapes, with and without freed blocks kept for reuse.

The fix is two ``mallopt`` settings of the C library, the same thing jemalloc or tcmalloc do by design:
serve big blocks from the heap instead of ``mmap`` (``M_MMAP_MAX = 0``), and give freed memory back to
the kernel only once more than ``trim_threshold_bytes`` lies unused at the heap's top (``M_TRIM_THRESHOLD``).
A heap that keeps everything also fragments and creeps up, so the setting lasts only while a trainer trains
(``freed_memory_reused``, which then puts back the two settings as they were before it: the last ones set here,
else those the environment gave glibc at start, else glibc's defaults), and the free pages go back to the OS
once per optimizer step (``release_freed_memory``, glibc's ``malloc_trim``): they fault in once per step instead
of once per temporary. This changes only how memory is recycled, never what is computed. GPU memory has its own caching
allocator in PyTorch already.
"""

from __future__ import annotations

import ctypes
import os
import platform
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

# glibc's mallopt parameter numbers (malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4

DEFAULT_TRIM_THRESHOLD_BYTES = 1 << 30  # 1 GiB: above the lab's log-softmax workspace, far below its RAM
# glibc's own defaults, where neither the environment nor this module set others (malloc.c: DEFAULT_MMAP_MAX,
# DEFAULT_TRIM_THRESHOLD)
DEFAULT_MMAP_MAX = 65_536
DEFAULT_TRIM_BYTES = 128 * 1024
# Where glibc reads each setting at start: its tunable in GLIBC_TUNABLES, else the older variable
START_VARIABLES = {
    "mmap_max": ("glibc.malloc.mmap_max", "MALLOC_MMAP_MAX_"),
    "trim_threshold": ("glibc.malloc.trim_threshold", "MALLOC_TRIM_THRESHOLD_"),
}


@dataclass(frozen=True)
class AllocatorLimits:
    """The two glibc settings the reuse changes: how many big blocks may be ``mmap``-ed, and how much free memory
    the heap's top keeps before it goes back to the OS."""

    mmap_max: int = DEFAULT_MMAP_MAX
    trim_threshold: int = DEFAULT_TRIM_BYTES


def _tunables(environ: dict[str, str]) -> dict[str, str]:
    """``GLIBC_TUNABLES=a=1:b=2`` as ``{"a": "1", "b": "2"}``."""
    pairs = (item.split("=", 1) for item in environ.get("GLIBC_TUNABLES", "").split(":") if "=" in item)
    return {name: value for name, value in pairs}


def limits_from_environment(environ: dict[str, str] | None = None) -> AllocatorLimits:
    """The limits glibc starts a process with under ``environ`` (this process's by default): each setting's
    tunable, else its ``MALLOC_*_`` variable, else glibc's default; a value that is no whole number is skipped."""
    environ = dict(os.environ if environ is None else environ)
    tunables, found = _tunables(environ), {}
    for field, (tunable, variable) in START_VARIABLES.items():
        value = tunables.get(tunable, environ.get(variable, "")).strip()
        if value.isdigit():
            found[field] = int(value)
    return AllocatorLimits(**found)


_AT_START = limits_from_environment()
_SET_HERE: list[AllocatorLimits] = []  # the limits this module set last, if it set any


def current_limits() -> AllocatorLimits:
    """The limits glibc runs with now: the last set here, else those the environment gave it at start (glibc has
    no call that reads them back, and nothing else in the course sets them)."""
    return _SET_HERE[-1] if _SET_HERE else _AT_START


def set_limits(limits: AllocatorLimits) -> bool:
    """Set both limits through glibc's ``mallopt``; False (and nothing recorded) where glibc is absent or refuses."""
    mallopt = _glibc_function("mallopt")
    if mallopt is None or not mallopt(M_MMAP_MAX, limits.mmap_max):
        return False
    if not mallopt(M_TRIM_THRESHOLD, limits.trim_threshold):
        return False
    _SET_HERE[:] = [limits]
    return True


@dataclass(frozen=True)
class AllocatorSetting:
    """What ``reuse_freed_memory`` did: whether the C allocator now keeps big freed blocks, and why (not)."""

    applied: bool
    detail: str


def glibc_available() -> bool:
    """Whether this process runs on glibc (most Linux, Colab, WSL): the only C library this module tunes."""
    return platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"


def _glibc_function(name: str) -> Callable[..., int] | None:
    """The process's C function ``name`` (``mallopt``, ``malloc_trim``) when the C library is glibc; else None."""
    return getattr(ctypes.CDLL(None), name, None) if glibc_available() else None


def reuse_freed_memory(trim_threshold_bytes: int = DEFAULT_TRIM_THRESHOLD_BYTES) -> AllocatorSetting:
    """Make this process reuse big freed blocks instead of returning them to the kernel at once.

    Safe to call more than once. Where the C library is not glibc (macOS, Windows, musl) nothing changes
    and the returned setting says so: those allocators, like jemalloc or tcmalloc, already cache big blocks.
    """
    if isinstance(trim_threshold_bytes, bool) or not isinstance(trim_threshold_bytes, int):
        raise TypeError(f"trim_threshold_bytes must be an int number of bytes, got {trim_threshold_bytes!r}.")
    if not 0 < trim_threshold_bytes < 2**31:
        raise ValueError(
            f"trim_threshold_bytes={trim_threshold_bytes:,} is outside 1 .. {2**31 - 1:,} (mallopt takes a C int); "
            f"the default keeps up to {DEFAULT_TRIM_THRESHOLD_BYTES >> 20} MiB of freed memory for reuse."
        )
    if _glibc_function("mallopt") is None:
        system = f"{platform.system()} with {platform.libc_ver()[0] or 'a non-glibc C library'}"
        return AllocatorSetting(False, f"allocator unchanged: {system} has no glibc mallopt to tune")
    if not set_limits(AllocatorLimits(mmap_max=0, trim_threshold=trim_threshold_bytes)):
        return AllocatorSetting(False, "allocator unchanged: glibc refused the mallopt settings")
    return AllocatorSetting(
        True,
        f"big freed blocks stay in the process for reuse (up to {trim_threshold_bytes / 2**20:,.0f} MiB "
        "unused before any goes back to the OS)",
    )


def release_freed_memory() -> bool:
    """Give the free pages the heap holds back to the OS now (glibc's ``malloc_trim``); False where unavailable.

    Why: a heap that never hands memory back also fragments, and the process's resident size creeps up by
    step (measured in the `cpu` lab: 3.0, 3.1, 3.3 GB after steps 1, 2 and 3). Released once per training
    step, the pages are faulted in once per step instead of once per temporary.
    """
    malloc_trim = _glibc_function("malloc_trim")
    return bool(malloc_trim and malloc_trim(0))


@contextmanager
def freed_memory_reused(trim_threshold_bytes: int = DEFAULT_TRIM_THRESHOLD_BYTES) -> Iterator[AllocatorSetting]:
    """Inside: big freed blocks are kept for reuse (:func:`reuse_freed_memory`, printed); on exit, however the
    block ends, the limits are back as they were before it (:func:`current_limits`, not glibc's defaults: a user's
    ``MALLOC_MMAP_MAX_`` or an outer block stays in force) and the free pages released. Why restore at all:
    outside training a cache of freed blocks only holds RAM (loading, merging and saving allocate once).

    ``course_utils.cpu_speed.enabled`` holds it open while a trainer trains, and releases the free pages after
    each optimizer step (:func:`release_freed_memory`).
    """
    before = current_limits()
    setting = reuse_freed_memory(trim_threshold_bytes)
    print(f"CPU allocator: {setting.detail}.")
    try:
        yield setting
    finally:
        if setting.applied:
            set_limits(before)
            release_freed_memory()
