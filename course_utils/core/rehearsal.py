"""The GPU profiles rehearsed on a CPU: only what a CPU cannot do changes, and each change is said.

``COURSE_REHEARSAL=1`` (set by ``make rehearse``, ``scripts/rehearse.py``) makes ``get_profile`` hand out the
``colab-t4`` and ``gpu`` profiles changed for a CPU: the device, the 16-bit autocast a CPU does not train in, vLLM,
and the sizes a 2-core machine needs cut for time. Every other field stays the profile's own (group size, batch,
lengths, ``mask_truncated_completions``, ``beta``, LoRA, 4-bit loading, gradient checkpointing, loss type), so the
notebooks' cells, checks and TRL's classes meet the GPU run's settings. Each change prints once per process as
``rehearsal: <what> (on the GPU: <what>)``. Offline profiles are never changed: they already run on a CPU.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

REHEARSAL_ENV_VAR = "COURSE_REHEARSAL"
ON_VALUES = ("1", "true", "yes", "on")
OFF_VALUES = ("", "0", "false", "no", "off")

# Cut for time on 2 cores: two GRPO steps (a checkpoint after each, so a resume has one to continue from), a few
# held-out problems, and 32-token completions (at 512-768 tokens the output head's backward over a 49k vocabulary
# alone takes minutes a step on a CPU); group size, batch and every switch stay the profile's own
REHEARSAL_SIZES: dict[str, Any] = {
    "max_steps": 2,
    "max_completion_length": 32,
    "eval_max_new_tokens": 16,
    "save_steps": 1,
    "logging_steps": 1,
    "train_size": 16,
    "eval_size": 4,
    "eval_batch_size": 4,
    "pass_k_problems": 2,
}


@dataclass(frozen=True)
class RehearsalChange:
    """One field the rehearsal sets differently from the GPU run, and why."""

    field: str
    rehearsal: Any
    gpu: Any
    why: str

    def line(self) -> str:
        """``rehearsal: <what> (on the GPU: <what>)``, the one line printed for this change."""
        return f"rehearsal: {self.field}={self.rehearsal!r}, {self.why} (on the GPU: {self.field}={self.gpu!r})"


def rehearsal_requested() -> bool:
    """True when ``COURSE_REHEARSAL`` asks for the rehearsal; a value that is neither on nor off is an error."""
    value = os.environ.get(REHEARSAL_ENV_VAR, "").strip().lower()
    if value in ON_VALUES:
        return True
    if value in OFF_VALUES:
        return False
    raise ValueError(
        f"{REHEARSAL_ENV_VAR}={os.environ[REHEARSAL_ENV_VAR]!r} is neither on ({', '.join(ON_VALUES)}) nor off "
        f"({', '.join(repr(v) for v in OFF_VALUES)}). Fix: export {REHEARSAL_ENV_VAR}=1 to rehearse the GPU profiles "
        f"on a CPU, or unset it."
    )


def _precision_change(profile: Any) -> RehearsalChange:
    autocast = {"float16": "fp16 autocast", "bfloat16": "bf16 autocast"}.get(profile.dtype, "no autocast")
    return RehearsalChange("dtype", "float32", profile.dtype, f"no {autocast}: a CPU trains the rehearsal in fp32")


def rehearsal_changes(profile: Any) -> list[RehearsalChange]:
    """What the rehearsal changes in a GPU ``profile`` (a ``Profile``); nothing for a profile that runs on a CPU."""
    if profile.device != "cuda":
        return []
    changes = [RehearsalChange("device", "cpu", "cuda", "no CUDA device here")]
    if profile.dtype != "float32":
        changes.append(_precision_change(profile))
    if profile.use_vllm:
        changes.append(RehearsalChange("use_vllm", False, True, "generation with transformers, vLLM needs CUDA"))
    for field, value in REHEARSAL_SIZES.items():
        gpu_value = getattr(profile, field)
        if gpu_value != value:
            changes.append(RehearsalChange(field, value, gpu_value, "cut for time on a 2-core CPU"))
    return changes


_SAID: set[tuple[str, str]] = set()


def rehearse(profile: Any) -> Any:
    """``profile`` as the rehearsal runs it (``Profile.override``), its changes printed once per process."""
    changes = rehearsal_changes(profile)
    for change in changes:
        if (profile.name, change.field) not in _SAID:
            _SAID.add((profile.name, change.field))
            print(change.line())
    return profile.override(**{c.field: c.rehearsal for c in changes}) if changes else profile
