"""One ``Finding`` type for every check that reports on a run: the preflight checks before it, the monitoring rules
during it. Both say the same things (how bad, which check, what is wrong, what to do), so both use this type.
"""

from __future__ import annotations

from dataclasses import dataclass

SEVERITIES = ("error", "warning", "info")


@dataclass(frozen=True)
class Finding:
    """What a check noticed: how bad, a short id, what is wrong, how to fix it; ``step`` when it came from a log."""

    severity: str
    code: str
    message: str
    fix: str
    step: int | None = None

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"severity must be one of {SEVERITIES}, got {self.severity!r}")
        if not self.code:
            raise ValueError("code must name the check that fired (e.g. 'batch-not-divisible'), got an empty string")

    def __str__(self) -> str:
        where = f" at step {self.step}" if self.step is not None else ""
        return f"[{self.severity}] {self.code}{where}: {self.message} Fix: {self.fix}"


__all__ = ["SEVERITIES", "Finding"]
