"""The CPU plug-in as the rest of the package sees it: its switch, its shape, and what it costs in memory.

The package never imports ``course_utils.cpu_speed``: a function that trains or generates takes the plug-in
from its caller (``speedups=cpu_speed``, one visible line in a notebook or a script) and defaults to
:data:`NO_SPEEDUPS`, plain TRL and transformers. What the memory estimate must know of the plug-in (is it on,
how much its kept logits take) lives here, so that the estimate and the plug-in read one switch and one budget.
"""

from __future__ import annotations

import os
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Protocol

from course_utils.core.profiles import Profile, get_profile

ENV_VAR = "COURSE_CPU_SPEEDUPS"
OFF_VALUES = ("0", "false", "off", "no")
ON_VALUES = ("1", "true", "on", "yes")
# The most memory the kept logit tiles of one call may take; a larger call recomputes its tiles as TRL does
KEPT_TILES_BUDGET_BYTES = 1024**3


def env_switch() -> bool | None:
    """``COURSE_CPU_SPEEDUPS`` read: False (0/false/off/no), True (1/true/on/yes), None when unset or empty."""
    value = os.environ.get(ENV_VAR, "").strip().lower()
    if not value:
        return None
    if value in OFF_VALUES or value in ON_VALUES:
        return value in ON_VALUES
    raise ValueError(
        f"{ENV_VAR}={os.environ[ENV_VAR]!r} is not a switch: use one of {', '.join(OFF_VALUES)} (off) or "
        f"{', '.join(ON_VALUES)} (on, where the profile allows), case-insensitive."
    )


def switched_off_because(profile: Profile | str | None) -> str | None:
    """Why the switch is off for ``profile`` (the variable, the profile's flag, its device), or None when on."""
    if env_switch() is False:
        return f"{ENV_VAR}={os.environ[ENV_VAR]}"
    p = get_profile(profile)
    if not p.cpu_speedups:
        return f"profile {p.name!r} has cpu_speedups=False"
    if p.device != "cpu":
        return f"profile {p.name!r} runs on {p.device}"
    return None


def switched_on(profile: Profile | str | None = None) -> bool:
    """The single switch: False when ``COURSE_CPU_SPEEDUPS`` is 0/false/off/no, when the profile (``profile``, else
    ``COURSE_PROFILE``'s) has ``cpu_speedups=False``, or when its device is not the CPU. A value of the variable
    that is no switch is a ``ValueError``."""
    return switched_off_because(profile) is None


def kept_tiles_bytes(positions: int, vocab_size: int, bytes_per_logit: float) -> float:
    """The memory one call's kept logit tiles take: a logit per position and vocabulary entry."""
    return positions * vocab_size * bytes_per_logit


def tiles_fit(
    positions: int, vocab_size: int, bytes_per_logit: float, token_chunk: int, budget: int = KEPT_TILES_BUDGET_BYTES
) -> bool:
    """Whether a call of ``positions`` keeps its tiles: one token chunk of TRL's (``token_chunk``), within
    ``budget`` bytes."""
    return positions <= token_chunk and kept_tiles_bytes(positions, vocab_size, bytes_per_logit) <= budget


class SpeedUps(Protocol):
    """What a training or evaluation function asks of the plug-in it is handed (``course_utils.cpu_speed`` is one)."""

    def enabled(
        self, trainer: Any, parts: Any = None, *, profile: Profile | str | None = None
    ) -> AbstractContextManager:
        """The speed-ups on ``trainer`` while the block runs."""
        ...

    def for_generation(self, model: Any, *, profile: Profile | str | None = None) -> AbstractContextManager:
        """The speed-ups on ``model.generate`` while the block runs."""
        ...


class _NoSpeedUps:
    """Plain TRL and transformers: what a function runs when its caller hands it no plug-in."""

    def enabled(
        self, trainer: Any, parts: Any = None, *, profile: Profile | str | None = None
    ) -> AbstractContextManager:
        return nullcontext()

    def for_generation(self, model: Any, *, profile: Profile | str | None = None) -> AbstractContextManager:
        return nullcontext()

    def __repr__(self) -> str:
        return "NO_SPEEDUPS"


NO_SPEEDUPS: SpeedUps = _NoSpeedUps()
