"""Every figure the notebooks show, one function per figure.

Each function takes plain data (lists, dicts, pandas objects, log histories), draws on a new
matplotlib figure and returns it, so notebooks show it and tests can check it without a display
(matplotlib picks its non-GUI backend by itself when there is none).
"""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

__all__ = ["Figure", "plt"]
