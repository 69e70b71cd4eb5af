"""Notebook 99 (appendix, CPU speed): the rule that picks the CPU lab's precision path.

99.1 runs the learner's ``choose_precision(capability, flags)`` next to the package's rule (``native_bf16`` on a
Linux machine without torch's probe) with ``check_against_reference``, which reads only an untouched body as
unanswered: a rule that forgets ``return`` in one branch gives ``None`` there, and that is a wrong answer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from course_utils.core.hardware import native_bf16
from course_utils.exercises.comparison import Case, check_against_reference
from course_utils.exercises.verdicts import hand_back

# torch's kernel level, the CPU flags of a Linux machine
PRECISION_CASES: tuple[tuple[str, frozenset[str]], ...] = (
    ("AVX512", frozenset({"avx2", "avx512f", "avx512_bf16"})),
    ("AVX512", frozenset({"avx2", "avx512f", "amx_bf16", "amx_tile"})),
    ("AVX512", frozenset({"avx2", "avx512f"})),
    ("AVX512", frozenset({"avx2", "avx512f", "amx_tile"})),  # AMX tiles without its bf16 instructions
    ("AVX2", frozenset({"avx2", "fma"})),
    ("AVX2", frozenset({"avx2", "avx512f", "avx512_bf16"})),  # torch runs AVX2 kernels: bf16 is emulated
    ("DEFAULT", frozenset()),
    ("DEFAULT", frozenset({"avx512f", "avx512_bf16"})),  # a torch built without vector kernels
)


def precision_rule(capability: str, flags: Iterable[str]) -> str:
    """The package's rule: ``"bf16"`` where torch runs AVX-512 kernels and the flags list bf16 instructions."""
    return "bf16" if native_bf16(capability, None, frozenset(flags), "Linux")[0] else "fp32"


def precision_cases() -> list[Case]:
    """One case per machine, labelled with its kernel level and flags; the learner gets the flags as a set."""
    return [Case(f"{level} with {sorted(flags)}", (level, set(flags))) for level, flags in PRECISION_CASES]


def check_99_precision_rule(learner: Any) -> Callable[[str, Iterable[str]], str]:
    """99.1: a function ``(capability, flags) -> "bf16" | "fp32"`` that picks the lab's path on a Linux machine.

    Hands back the learner's rule when it agrees on every machine, else ``precision_rule``.
    """
    exercise = "99.1 precision rule"
    hint = "bf16 only when torch runs AVX-512 kernels AND the flags list avx512_bf16 or amx_bf16; 'fp32' otherwise"
    passed = check_against_reference(exercise, learner, precision_rule, precision_cases(), hint=hint)
    return hand_back(exercise, passed, learner, precision_rule, "precision_rule (hardware.native_bf16)")
