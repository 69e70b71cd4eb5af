"""Training benchmark: the `cpu` lab run once, as a learner runs it, with the cost of each GRPO step measured.

Prints ``name: value`` lines (run: ``.venv/bin/python benchmarks/bench_training.py``):

- ``train_step_seconds``: median wall time of one GRPO step (generation + rewards + forward/backward + update);
- ``train_completion_tokens_per_second``: completion tokens generated per second of training;
- ``train_peak_rss_gb``: peak resident memory of the process (target: under 4 GB);
- ``train_step_over_generate_ratio``: total step time / total time inside ``model.generate`` for the same
  prompts and completions (the trainer's own generate calls, timed in place): generation is the floor of a
  GRPO step, so the target is at most 1.5;
- ``cpu_lab_minutes`` (warm start made afresh + GRPO, model load included; target: 10),
  ``cpu_lab_reward_first_fifth``, ``cpu_lab_reward_last_fifth``, ``cpu_lab_reward_max``: the lab must gain at
  least 10% of the maximum; ``cpu_lab_correctness_first_fifth`` / ``_last_fifth``: the share of completions the
  correctness reward called right, what the lab learns to solve apart from the format;
  ``cpu_lab_correctness_varied_steps`` (steps whose group differed in correctness) and ``cpu_lab_kl_last``.

Timings depend on what else runs on the machine: ``machine_load_average`` is printed beside them, and
``cpu_lab_cpu_minutes`` (process CPU time / threads) estimates the run time on otherwise idle cores.
``cpu_lab_learning_rate``: the rate the lab ran at, which its rewards depend on.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import statistics
import sys
import time
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from transformers import TrainerCallback

from course_utils import cpu_speed
from course_utils.core.profiles import get_profile
from course_utils.training import grpo_config, lab, monitoring, run_logs, trained_model
from course_utils.training.memory_measurement import peak_rss_gb


class StepTimer(TrainerCallback):
    """Wall time of every optimizer step (``on_step_begin`` to ``on_step_end``)."""

    def __init__(self) -> None:
        self.seconds: list[float] = []
        self._started = 0.0

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._started = time.perf_counter()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.seconds.append(time.perf_counter() - self._started)


class GenerateTimer(TrainerCallback):
    """Times the trainer's own ``model.generate`` calls: same prompts, same completions as the step.

    Attached when training begins, inside ``cpu_speed.enabled``: the timer sees the whole grouped call (prefill
    and packing included).
    """

    def __init__(self) -> None:
        self.seconds: list[float] = []

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        original = model.generate

        @functools.wraps(original)
        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.seconds.append(time.perf_counter() - started)

        model.generate = timed
        self._restore = (model, original)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        model, original = self._restore
        model.generate = original


def main() -> None:
    import torch

    profile = get_profile("cpu")
    # A learner's first run has no saved warm start yet: time it, rather than reuse one from an earlier run
    shutil.rmtree(trained_model.warm_start_model_dir(trained_model.default_run_dir(profile)), ignore_errors=True)
    steps, generate = StepTimer(), GenerateTimer()
    load_before = os.getloadavg()[0]
    started, cpu_started = time.perf_counter(), time.process_time()
    with contextlib.redirect_stdout(sys.stderr):  # the trainers' per-step log lines are not results
        # The CPU lab as notebook 04 runs it: with the plug-in (COURSE_CPU_SPEEDUPS=0 times plain TRL)
        result = lab.run_training(profile, callbacks=[steps, generate], speedups=cpu_speed)
    lab_minutes = (time.perf_counter() - started) / 60
    cpu_minutes = (time.process_time() - cpu_started) / 60 / torch.get_num_threads()
    logs = run_logs.training_logs(result.trainer.state.log_history)
    config = result.trainer.args
    completions_per_step = config.per_device_train_batch_size * config.gradient_accumulation_steps
    tokens = sum(e["completions/mean_length"] * completions_per_step for e in logs)
    figures = monitoring.lab_figures(result.trainer.state.log_history)
    print(f"train_steps: {len(steps.seconds)}")
    print(f"train_step_seconds: {statistics.median(steps.seconds):.2f}")
    print(f"train_completion_tokens_per_second: {tokens / sum(steps.seconds):.1f}")
    print(f"train_peak_rss_gb: {peak_rss_gb():.2f}")
    print(f"train_step_over_generate_ratio: {sum(steps.seconds) / sum(generate.seconds):.2f}")
    print(f"cpu_lab_warm_start_seconds: {result.warm_start_seconds:.0f}")
    print(f"cpu_lab_grpo_seconds: {result.train_seconds:.0f}")
    print(f"cpu_lab_minutes: {lab_minutes:.1f}")
    print(f"cpu_lab_learning_rate: {config.learning_rate:g}")  # the rewards below depend on it
    print(f"cpu_lab_cpu_minutes: {cpu_minutes:.1f}")
    for name, value in figures.items():
        print(f"cpu_lab_{name}: {value:.3f}")
    print(f"cpu_lab_reward_max: {grpo_config.max_reward(config):.3f}")
    per_step = " ".join(f"{e['reward']:.2f}" for e in logs)
    print(f"cpu_lab_rewards_per_step: {per_step}")
    print(f"machine_load_average: {load_before:.1f} -> {os.getloadavg()[0]:.1f} (on {os.cpu_count()} cores)")


if __name__ == "__main__":
    main()
