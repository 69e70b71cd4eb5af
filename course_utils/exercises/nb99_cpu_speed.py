"""Notebook 99 (appendix, CPU speed): the rule that picks the CPU lab's precision path."""

from __future__ import annotations

from typing import Any

from course_utils.core.hardware import native_bf16
from course_utils.exercises.comparison import is_unanswered, report

PRECISION_CASES: tuple[tuple[str, frozenset[str]], ...] = (
    ("AVX512", frozenset({"avx2", "avx512f", "avx512_bf16"})),
    ("AVX512", frozenset({"avx2", "avx512f", "amx_bf16", "amx_tile"})),
    ("AVX512", frozenset({"avx2", "avx512f"})),
    ("AVX2", frozenset({"avx2", "fma"})),
    ("AVX2", frozenset({"avx2", "avx512f", "avx512_bf16"})),  # torch runs AVX2 kernels: bf16 is emulated
    ("DEFAULT", frozenset()),
)


def check_99_precision_rule(answer: Any) -> bool:
    """A function ``(capability, flags) -> "bf16" | "fp32"`` that picks the lab's path on a Linux machine."""
    hint = "bf16 only when torch runs AVX-512 kernels AND the flags list avx512_bf16 or amx_bf16"
    if is_unanswered(answer) or not callable(answer):
        return report("99.1 precision rule", False, hint, answer if is_unanswered(answer) else "not a function")
    differences = []
    for capability, flags in PRECISION_CASES:
        expected = "bf16" if native_bf16(capability, None, flags, "Linux")[0] else "fp32"
        try:
            got = answer(capability, set(flags))
        except Exception as error:  # a learner's bug is a verdict, not a crash
            got = f"{type(error).__name__}: {error}"
        if is_unanswered(got):
            return report("99.1 precision rule", False, hint, got)
        if got != expected:
            differences.append(f"{capability} with {sorted(flags)}: yours {got!r}, expected {expected!r}")
    for line in differences:
        print("   ", line)
    return report("99.1 precision rule", not differences, hint, answer)
