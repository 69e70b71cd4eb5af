"""The callbacks a GRPO run is watched and stopped with (``TrainerCallback``s, notebook 04 and the script).

- ``LiveDashboard``: redraws the curves at every log;
- ``StopOnInterrupt``: Ctrl-C or SIGTERM ends a run after the step in progress, with a checkpoint of it.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Mapping
from typing import Any

import matplotlib.pyplot as plt
from IPython.display import clear_output, display
from transformers import TrainerCallback
from transformers.utils import is_in_notebook

from course_utils.lesson.plotting import plot_training_dashboard


class LiveDashboard(TrainerCallback):
    """Redraws the training curves at every log: reward, its std, KL, lengths, clipping, each reward, zero-std groups.

    In a notebook the figure is replaced in place; elsewhere (CI, scripts) it is only redrawn, so the
    callback never needs a display. ``figure`` holds the latest drawing for saving.
    """

    def __init__(self, show: bool | None = None, title: str = "GRPO training") -> None:
        self.show = is_in_notebook() if show is None else show
        self.title = title
        self.history: list[dict[str, Any]] = []
        self.figure: Any = None
        self.redraws = 0

    def on_log(self, args: Any, state: Any, control: Any, logs: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        if not logs or "reward" not in logs:
            return
        self.history.append({**logs, "step": state.global_step})
        self.redraw()

    def redraw(self) -> Any:
        """Draw the current history; in a notebook, replace the previous drawing.

        The figure is taken out of pyplot once drawn (it can still be saved): left there, the notebook's inline
        backend would show it a second time when the training cell ends.
        """
        self.figure = plot_training_dashboard(self.history, title=self.title)
        plt.close(self.figure)
        self.redraws += 1
        if self.show:
            clear_output(wait=True)
            display(self.figure)
        return self.figure


STOP_SIGNALS = {signal.SIGINT: "Ctrl-C", signal.SIGTERM: "SIGTERM"}  # SIGTERM: how Colab and job schedulers stop


class StopOnInterrupt(TrainerCallback):
    """The first Ctrl-C or SIGTERM ends the run after the step in progress, with a checkpoint; a second stops at once.

    Why: a plain Ctrl-C unwinds ``trainer.train`` mid-step, and a SIGTERM (what a notebook server, a job scheduler
    or Colab sends) ends the process, so every step since the last ``save_steps`` checkpoint is lost. Here the
    trainer itself saves (``control.should_save``) and stops (``control.should_training_stop``) at the end of the
    step, so ``resume_from_checkpoint`` continues from it. Use it as a context manager around ``trainer.train``,
    which installs the handlers (main thread only) and restores the previous ones; ``requested`` says afterwards
    whether the run was stopped, ``signal_name`` by which signal.
    """

    def __init__(self) -> None:
        self.requested = False
        self.signal_name = ""
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopOnInterrupt:
        if threading.current_thread() is threading.main_thread():
            self._previous = {number: signal.signal(number, self._on_signal) for number in STOP_SIGNALS}
        return self

    def __exit__(self, *exc: object) -> None:
        for number, previous in self._previous.items():
            signal.signal(number, previous)
        self._previous = {}

    def _on_signal(self, signum: int, frame: Any) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        self.signal_name = STOP_SIGNALS.get(signum, str(signum))
        print(f"\n{self.signal_name}: stopping after the step in progress, with a checkpoint of it "
              f"({self.signal_name} again: stop at once).", flush=True)  # fmt: skip

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.requested:
            control.should_save = True
            control.should_training_stop = True
