"""course_utils.cpu_speed.cpu_allocator: big freed blocks are reused (measured in page faults), bad input is refused."""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys

import pytest

from course_utils.core.profiles import PROFILES
from course_utils.cpu_speed import cpu_allocator
from course_utils.cpu_speed.cpu_allocator import (
    DEFAULT_MMAP_MAX,
    DEFAULT_TRIM_BYTES,
    DEFAULT_TRIM_THRESHOLD_BYTES,
    AllocatorLimits,
    AllocatorSetting,
    current_limits,
    freed_memory_reused,
    glibc_available,
    limits_from_environment,
    release_freed_memory,
    reuse_freed_memory,
    set_limits,
)

GLIBC = glibc_available()

# TRL's chunked log-softmax (the lab's hot spot: float32 temporaries of 400 x 32,768 entries, 52 MB each),
# forward + backward, in a fresh process: page faults of three calls with glibc as it comes, then three with freed
# blocks reused, each time after two warm-up calls.
FAULTS_SCRIPT = """
import json, resource, torch
from trl.kernels.chunked_logprob import ChunkedLogProbFunction
from course_utils.cpu_speed.cpu_allocator import reuse_freed_memory

torch.manual_seed(0)
hidden = torch.randn(400, 576, requires_grad=True)
weight = torch.randn(49_152, 576) * 0.02
targets = torch.randint(0, 49_152, (400,))

def faults_of_one_call():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    log_probs, *_ = ChunkedLogProbFunction.apply(hidden, weight, None, targets, 1.0, 32_768, None, 1.0, ())
    log_probs.sum().backward()
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

def faults_of_three_calls():  # after two warm-up calls: a changed setting may take two calls to settle the heap
    for _ in range(2):
        faults_of_one_call()
    return [faults_of_one_call() for _ in range(3)]

default = faults_of_three_calls()
applied = reuse_freed_memory().applied
print(json.dumps({"default": default, "reuse": faults_of_three_calls(), "applied": applied}))
"""


@pytest.mark.skipif(not GLIBC, reason="the setting tunes glibc's malloc; other C libraries are left alone")
@pytest.mark.long  # over 10 s: make test-slow
def test_log_softmax_reuses_freed_blocks_without_page_faults():
    output = subprocess.run([sys.executable, "-c", FAULTS_SCRIPT], check=True, capture_output=True, text=True)
    calls = json.loads(output.stdout.strip().splitlines()[-1])
    assert calls["applied"], calls
    # A typical call as glibc comes (the median) against the setting's settled heap (the fewest): the heap's layout
    # still moves from call to call, so now and then one call faults in a tile or two either way.
    default, reuse = statistics.median(calls["default"]), min(calls["reuse"])
    fresh_tile_pages = 400 * 32_768 * 4 // 4096
    if default < fresh_tile_pages:
        pytest.skip(f"few page faults even without the setting (transparent huge pages?): {calls}")
    assert default > 5 * fresh_tile_pages, calls  # glibc as it comes: every temporary is fresh pages
    assert reuse < default / 5, calls


# An 800 MB block allocated, filled and freed: how much resident memory it leaves behind while freed blocks
# are reused, then after the limits from before are restored and the kept blocks released (as training ends).
# Page faults of a later call are no measure of the restore: glibc may serve it from free chunks still in the heap.
RESTORE_SCRIPT = """
import json, torch
from course_utils.cpu_speed.cpu_allocator import current_limits, release_freed_memory, reuse_freed_memory, set_limits

def resident_mb():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) // 1024 for line in status if line.startswith("VmRSS:"))

def left_behind_by_a_freed_block_mb():
    before = resident_mb()
    block = torch.empty(200_000_000).fill_(1.0)
    del block
    return resident_mb() - before

before = current_limits()
reuse_freed_memory()
kept = left_behind_by_a_freed_block_mb()
restored = set_limits(before) and release_freed_memory()
print(json.dumps({"kept": kept, "restored_ok": restored, "after_restore": left_behind_by_a_freed_block_mb()}))
"""


@pytest.mark.skipif(not GLIBC, reason="glibc only")
@pytest.mark.long  # over 10 s: make test-slow
def test_restoring_the_defaults_gives_big_freed_blocks_back_again():
    output = subprocess.run([sys.executable, "-c", RESTORE_SCRIPT], check=True, capture_output=True, text=True)
    memory = json.loads(output.stdout.strip().splitlines()[-1])
    assert memory["restored_ok"], memory
    assert memory["kept"] > 700, memory  # reused: the freed 800 MB stays resident for the next temporary
    assert memory["after_restore"] < 50, memory  # restored: the freed block went back to the OS


# Keeps three freed 100 MB blocks in the heap (small live tensors between them stop a trim at the top),
# then releases them: resident memory before and after, in MB.
RELEASE_SCRIPT = """
import json, torch
from course_utils.cpu_speed.cpu_allocator import release_freed_memory, reuse_freed_memory

def resident_mb():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) // 1024 for line in status if line.startswith("VmRSS:"))

reuse_freed_memory()
blocks = []
for _ in range(3):
    blocks += [torch.empty(25_000_000).fill_(1.0), torch.ones(1000)]
del blocks[0::2]
kept = resident_mb()
released = release_freed_memory()
print(json.dumps({"kept": kept, "after": resident_mb(), "released": released}))
"""


@pytest.mark.skipif(not GLIBC, reason="malloc_trim is glibc's")
@pytest.mark.long  # over 10 s: make test-slow
def test_release_gives_the_kept_blocks_back():
    output = subprocess.run([sys.executable, "-c", RELEASE_SCRIPT], check=True, capture_output=True, text=True)
    memory = json.loads(output.stdout.strip().splitlines()[-1])
    assert memory["released"], memory
    assert memory["kept"] - memory["after"] > 250, memory  # most of the 300 MB went back to the OS


def test_reuse_lasts_for_the_block_and_each_step_releases(monkeypatch, capsys):
    import course_utils.cpu_speed as cpu_speed

    calls = []
    monkeypatch.setattr(
        cpu_allocator, "reuse_freed_memory", lambda _: calls.append("reuse") or AllocatorSetting(True, "kept")
    )
    monkeypatch.setattr(cpu_allocator, "release_freed_memory", lambda: calls.append("release") or True)
    monkeypatch.setattr(cpu_allocator, "set_limits", lambda limits: calls.append("restore") or True)
    monkeypatch.setattr(cpu_speed, "release_freed_memory", lambda: calls.append("release") or True)
    with pytest.raises(KeyboardInterrupt), freed_memory_reused():  # an interrupted run restores too
        step = cpu_speed._ReleaseFreedMemoryEachStep()  # what cpu_speed.enabled adds to the trainer
        for _ in range(2):
            step.on_step_end(args=None, state=None, control=None)
        raise KeyboardInterrupt
    assert calls == ["reuse", "release", "release", "restore", "release"]
    assert "CPU allocator: kept." in capsys.readouterr().out


def test_release_without_glibc_does_nothing(monkeypatch):
    monkeypatch.setattr(platform, "system", lambda: "Windows")
    assert release_freed_memory() is False


@pytest.mark.skipif(not GLIBC, reason="glibc only")
def test_the_setting_says_what_it_keeps():
    setting = reuse_freed_memory(512 * 2**20)
    assert setting.applied
    assert "512 MiB" in setting.detail
    reuse_freed_memory()  # back to the default threshold, and calling twice is fine


@pytest.mark.parametrize("threshold", [0, -1, 2**31])
def test_thresholds_outside_a_c_int_are_refused(threshold):
    with pytest.raises(ValueError, match="trim_threshold_bytes"):
        reuse_freed_memory(threshold)


@pytest.mark.parametrize("threshold", [1.5, "1024", True, None])
def test_thresholds_that_are_not_integers_are_refused(threshold):
    with pytest.raises(TypeError, match="int number of bytes"):
        reuse_freed_memory(threshold)


def test_without_glibc_nothing_changes_and_it_says_so(monkeypatch):
    monkeypatch.setattr(platform, "system", lambda: "Darwin")
    setting = reuse_freed_memory()
    assert not setting.applied
    assert "allocator unchanged" in setting.detail and "Darwin" in setting.detail


def test_default_threshold_is_a_positive_c_int():
    assert 0 < DEFAULT_TRIM_THRESHOLD_BYTES < 2**31
    assert cpu_allocator.M_MMAP_MAX == -4 and cpu_allocator.M_TRIM_THRESHOLD == -1  # malloc.h


def test_cpu_profiles_switch_the_speed_ups_on_and_gpu_profiles_leave_them_off():
    for name, profile in PROFILES.items():
        assert profile.cpu_speedups == (profile.device == "cpu"), name


# --- Restoring what was there before, not glibc's defaults ------------------------------------------------------

# In a fresh process started with ``environ``: the limits before and after a freed_memory_reused block, and whether a
# 64 MB block malloc-ed after it is mmap-ed (glibc's mallinfo2 counts mmap-ed regions): the allocator's behaviour,
# not only this module's record of it.
MMAP_AFTER_SCRIPT = """
import ctypes, json
from course_utils.cpu_speed.cpu_allocator import current_limits, freed_memory_reused

class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                     "fsmblks", "uordblks", "fordblks", "keepcost")]

libc = ctypes.CDLL(None)
libc.mallinfo2.restype = MallInfo2
libc.malloc.restype, libc.malloc.argtypes, libc.free.argtypes = ctypes.c_void_p, [ctypes.c_size_t], [ctypes.c_void_p]

def mmapped_regions_of_a_big_block():
    before = libc.mallinfo2().hblks
    block = libc.malloc(64 << 20)
    regions = libc.mallinfo2().hblks - before
    libc.free(block)
    return regions

before = current_limits()
with freed_memory_reused():
    inside = mmapped_regions_of_a_big_block()
after = current_limits()
print(json.dumps({"before": [before.mmap_max, before.trim_threshold], "after": [after.mmap_max, after.trim_threshold],
                  "inside": inside, "mmapped_after": mmapped_regions_of_a_big_block()}))
"""


def run_with(environ: dict[str, str]) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    done = subprocess.run([sys.executable, "-c", MMAP_AFTER_SCRIPT], check=True, capture_output=True, text=True,
                          env={**env, **environ})  # fmt: skip
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not GLIBC, reason="glibc only")
@pytest.mark.parametrize(
    "environ",
    [{"MALLOC_MMAP_MAX_": "0"}, {"GLIBC_TUNABLES": "glibc.malloc.mmap_max=0"}],
    ids=["MALLOC_MMAP_MAX_", "GLIBC_TUNABLES"],
)
def test_a_users_allocator_setting_is_back_after_the_block_not_glibcs_default(environ):
    """A process started with mmap switched off keeps it off after training: a big block still comes from the heap."""
    seen = run_with(environ)
    assert seen["before"] == seen["after"] == [0, DEFAULT_TRIM_BYTES], seen
    assert seen["inside"] == 0 and seen["mmapped_after"] == 0, seen


@pytest.mark.skipif(not GLIBC, reason="glibc only")
def test_glibcs_defaults_are_back_where_nothing_was_set_before():
    seen = run_with({})
    assert seen["before"] == seen["after"] == [DEFAULT_MMAP_MAX, DEFAULT_TRIM_BYTES], seen
    assert seen["inside"] == 0 and seen["mmapped_after"] == 1, seen  # glibc mmaps a 64 MB block again


@pytest.mark.skipif(not GLIBC, reason="glibc only")
def test_an_outer_setting_is_back_after_an_inner_block(capsys):
    original = current_limits()
    outer = AllocatorLimits(mmap_max=7, trim_threshold=3 << 20)
    try:
        assert set_limits(outer)
        with freed_memory_reused():
            assert current_limits().mmap_max == 0
        assert current_limits() == outer
    finally:
        set_limits(original)


def test_the_start_limits_are_read_as_glibc_reads_them():
    assert limits_from_environment({}) == AllocatorLimits(DEFAULT_MMAP_MAX, DEFAULT_TRIM_BYTES)
    old_names = {"MALLOC_MMAP_MAX_": "12", "MALLOC_TRIM_THRESHOLD_": "4096"}
    assert limits_from_environment(old_names) == AllocatorLimits(12, 4096)
    tunables = {**old_names, "GLIBC_TUNABLES": "glibc.malloc.trim_threshold=8192:glibc.other=1"}
    assert limits_from_environment(tunables) == AllocatorLimits(12, 8192)  # the tunable wins over the old name
    assert limits_from_environment({"MALLOC_MMAP_MAX_": "lots"}) == AllocatorLimits()  # not a number: glibc's
