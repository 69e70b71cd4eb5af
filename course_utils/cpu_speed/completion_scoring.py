"""TRL's training pass on a CPU: the completion tokens scored only.

To train, TRL needs the log-probability of every completion token: a log-softmax over the whole vocabulary at
each position (49,152 entries for SmolLM2), the largest single cost of the training pass. The prompt's positions are
masked out of the loss. On devices with Triton, TRL first keeps the unmasked positions and scores only those.
Elsewhere it scores every position, prompt included, and zeroes the prompt's afterwards: accelerators that compile
for each tensor shape would otherwise compile again at every batch. An eager CPU compiles nothing, so there that
rule only costs time and memory.

:func:`completion_tokens_only` makes TRL take its compact path on a CPU too. The completion tokens get the same
log-probabilities and gradients; the prompt's positions are zero either way. It is a context manager;
``course_utils.cpu_speed.enabled`` holds it open while a ``GRPOTrainer`` trains.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
import trl.trainer.utils as trl_utils

# The function TRL's fused log-prob forward asks whether to score only the unmasked positions
TRL_COMPACT_RULE = "_use_triton"


def trl_has_compact_rule() -> bool:
    """Whether this TRL decides compact scoring through ``trl.trainer.utils._use_triton`` (TRL 1.x does)."""
    return callable(getattr(trl_utils, TRL_COMPACT_RULE, None))


@contextmanager
def completion_tokens_only() -> Iterator[None]:
    """Inside: TRL's fused log-prob forward scores only the unmasked (completion) positions on a CPU as well."""
    if not trl_has_compact_rule():
        raise RuntimeError(
            f"This TRL has no trl.trainer.utils.{TRL_COMPACT_RULE}: install the course's pinned TRL "
            "(make setup), or run without it (cpu_speed.enabled(trainer, parts=...) or COURSE_CPU_SPEEDUPS=0)."
        )
    original = getattr(trl_utils, TRL_COMPACT_RULE)

    def compact(device: torch.device) -> bool:
        return original(device) or device.type == "cpu"

    setattr(trl_utils, TRL_COMPACT_RULE, compact)
    try:
        yield
    finally:
        setattr(trl_utils, TRL_COMPACT_RULE, original)
