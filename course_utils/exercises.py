"""The checking functions for every notebook's exercises.

Each check prints a verdict with a hint and returns ``True`` or ``False``; it never raises, so a
notebook with an unanswered exercise still runs top to bottom (in CI too). An unanswered exercise
(``None`` or ``...``) is reported as such, not as wrong.
"""

from __future__ import annotations

from typing import Any


def is_unanswered(answer: Any) -> bool:
    """True for the placeholders the notebooks start with (``None`` or ``...``)."""
    return answer is None or answer is Ellipsis


def report(exercise: str, correct: bool, hint: str, answer: Any = None) -> bool:
    """Print the verdict for one exercise and return it."""
    if is_unanswered(answer):
        print(f"⏳ {exercise}: not answered yet. Hint: {hint}")
        return False
    print(f"✅ {exercise}: correct." if correct else f"❌ {exercise}: not yet. Hint: {hint}")
    return bool(correct)


def close_to(answer: Any, expected: float, tolerance: float = 1e-6) -> bool:
    """True when ``answer`` is a number within ``tolerance`` of ``expected`` (False for anything else)."""
    try:
        return abs(float(answer) - expected) <= tolerance
    except (TypeError, ValueError):
        return False
