"""The memory estimate checked against reality: real runs' peak resident memory, each in a fresh process.

- ``measure_grpo_step_peak``: real ``GRPOTrainer`` steps of a CPU profile, against ``estimate_for_profile`` for
  the same settings (``tests/test_memory.py`` holds it within +-30%; ``benchmarks/bench_memory.py`` prints it);
- ``measure_logprob_workspace``: TRL's chunked log-softmax alone, against ``logprob_workspace_bytes``;
- ``peak_rss_gb``: this process's peak resident memory (the benchmarks report it too).

A fresh process for each measurement, so that nothing the calling process already allocated hides in the peak;
the ``_run_*`` functions are what that process runs.
"""

from __future__ import annotations

import importlib
import json
import os
import resource
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import psutil
import torch
from trl.kernels import ChunkedLogProbFunction

from course_utils.core.profiles import Profile, get_profile
from course_utils.core.speedups import NO_SPEEDUPS, SpeedUps
from course_utils.lesson.data import load_gsm8k
from course_utils.training.grpo_config import make_grpo_config
from course_utils.training.memory import estimate_for_profile
from course_utils.training.memory_parts import BYTES_PER_DTYPE, GB, LOGPROB_TOKEN_CHUNK, LOGPROB_VOCAB_CHUNK
from course_utils.training.model_shape import ModelSpec, smollm2_spec
from course_utils.training.run import build_trainer, load_model_for_training

# A fixed mmap threshold makes glibc return every large freed block to the OS at once, so the resident
# size follows the live tensors instead of the allocator's cache (otherwise it only ever grows).
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "131072"}


# --- Reading resident memory -----------------------------------------------------------------------


def _rss_gb() -> float:
    return psutil.Process().memory_info().rss / GB


def peak_rss_gb() -> float:
    """Peak resident memory of this process's address space in GB: ``VmHWM`` from ``/proc/self/status``.

    Not ``getrusage().ru_maxrss``: Linux carries the *parent's* peak into a child started with fork or
    vfork + exec, so a measurement subprocess would report at least its parent's peak whatever it did. ``VmHWM``
    belongs to the address space the child got at exec. Falls back to ``ru_maxrss`` where there is no
    ``/proc`` (macOS reports it in bytes, Linux in kilobytes).
    """
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024 / GB
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / GB if sys.platform == "darwin" else peak * 1024 / GB


def _resident_bytes() -> int:
    """This process's resident size now, from ``/proc/self/statm``."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _take_high_water_mark() -> int | None:
    """The kernel's peak resident memory since the last reset (``VmHWM``), reset now; None where it can't be."""
    try:
        with open("/proc/self/status") as status:
            peak = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmHWM:"))
        with open("/proc/self/clear_refs", "w") as clear:
            clear.write("5")  # Linux: start a new high-water mark from the current resident size
    except (OSError, StopIteration, ValueError):
        return None
    return peak


def _peak_while(run: Callable[[], Any]) -> int:
    """Peak resident memory above the start, in bytes, while ``run()`` works.

    The kernel's own high-water mark where Linux lets it be reset (exact); elsewhere sampled every millisecond,
    which can miss a short peak while both cores compute.
    """
    start = _resident_bytes()
    if _take_high_water_mark() is not None:
        run()
        return max((_take_high_water_mark() or start) - start, 0)
    peak, running = [0], [True]

    def sample() -> None:
        while running[0]:
            peak[0] = max(peak[0], _resident_bytes() - start)
            time.sleep(0.001)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        run()
    finally:
        running[0] = False
        sampler.join()
    return peak[0]


def _run_in_fresh_process(function: str, args: list[Any], env: dict[str, str], timeout: float) -> Any:
    """``function(*args)`` of this module in a new Python process; arguments and result travel as JSON."""
    code = (
        f"import sys, json; from course_utils.training.memory_measurement import {function} as run; "
        "print(json.dumps(run(*json.loads(sys.argv[1]))))"
    )
    command = [sys.executable, "-c", code, json.dumps(args)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"The measurement subprocess failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


# --- A real GRPO run -------------------------------------------------------------------------------


def _length_reward(completions: list, **_: Any) -> list[float]:
    """A reward that needs no answer: the measurement is about memory, not learning."""
    return [len(c[0]["content"]) / 100 for c in completions]


def _plugin_name(speedups: SpeedUps) -> str | None:
    """The module the fresh process imports the plug-in from, None for plain TRL: only a module's name travels."""
    if speedups is NO_SPEEDUPS:
        return None
    if not isinstance(speedups, ModuleType):
        raise TypeError(f"speedups must be a plug-in module (course_utils.cpu_speed) or NO_SPEEDUPS, got {speedups!r}")
    return speedups.__name__


def _run_measurement(profile_fields: dict[str, Any], steps: int, plugin: str | None = None) -> dict[str, Any]:
    """Inside the fresh subprocess: one real GRPOTrainer run; peak RSS above the post-import baseline.

    The libraries are imported at the top of this module, before the baseline: their memory is not the run's.
    ``plugin``: the module of the speed-ups the caller chose (imported before the baseline too), or None.
    """
    speedups: Any = importlib.import_module(plugin) if plugin else NO_SPEEDUPS
    p = Profile(**{k: tuple(v) if isinstance(v, list) else v for k, v in profile_fields.items()})
    torch.manual_seed(0)
    rows = p.per_device_train_batch_size * p.gradient_accumulation_steps * steps // p.num_generations
    dataset = load_gsm8k("train", formatted=True, limit=max(rows, 1), verbose=False)
    baseline = _rss_gb()
    model, tokenizer = load_model_for_training(p)  # the lab's own loading: its train_dtype and all
    after_load = _rss_gb()
    prompts = [tokenizer.apply_chat_template(r, add_generation_prompt=True, tokenize=False) for r in dataset["prompt"]]
    prompt_tokens = max(len(tokenizer(text)["input_ids"]) for text in prompts)
    config = make_grpo_config(
        p,
        output_dir=Path(os.environ.get("TMPDIR", "/tmp")) / "course-memory-measure",
        max_steps=steps,
        save_strategy="no",
        reward_weights=None,
        generation_kwargs={"min_new_tokens": p.max_completion_length},  # full-length completions: the worst case
    )
    trainer = build_trainer(model, tokenizer, p, train_dataset=dataset, config=config, reward_funcs=[_length_reward])
    with speedups.enabled(trainer, profile=p) as handle:
        trainer.train()
    peak = peak_rss_gb()
    return {
        "baseline_gb": baseline,
        "peak_gb": peak,
        "increase_gb": peak - baseline,
        "after_load_gb": after_load - baseline,
        "prompt_tokens": prompt_tokens,
        "training_dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
        "speedups": bool(getattr(handle, "active", ())),
    }


def measure_grpo_step_peak(
    profile: Profile | str = "ci", steps: int = 2, timeout: float = 900, *, speedups: SpeedUps = NO_SPEEDUPS
) -> dict[str, Any]:
    """Run ``steps`` real GRPOTrainer steps on the CPU in a fresh Python process; compare with the estimate.

    Two steps by default: the optimizer state only exists after the first step, so the second step is
    the first to hold weights, optimizer state, activations and gradients together (the estimate's peak).

    The peak resident set size (``VmHWM``, see ``peak_rss_gb``) minus the resident size after the imports is
    the training run's own memory. Completions are forced to full length (the estimate's worst case). Returns
    the measurement, the estimate for the same settings and the error in percent. ``speedups``: the plug-in to
    train with (``course_utils.cpu_speed``), default plain TRL; the estimate counts the speed-ups exactly when
    they ran (``speedups`` in the result), so both sides describe the same run.
    """
    p = get_profile(profile)
    if p.device != "cpu" or p.model_source != "offline":
        raise ValueError(
            f"Measuring needs a CPU profile with the offline model; {p.name!r} is {p.device}/{p.model_source}"
        )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", **MALLOC_ENV}
    measured = _run_in_fresh_process("_run_measurement", [p.as_dict(), steps, _plugin_name(speedups)], env, timeout)
    estimate = estimate_for_profile(p, prompt_tokens=measured["prompt_tokens"], speedups=measured["speedups"])
    error = 100 * (estimate.total_gb - measured["increase_gb"]) / measured["increase_gb"]
    return {**measured, "profile": p.name, "estimate_gb": estimate.total_gb, "error_pct": error, "estimate": estimate}


# --- TRL's log-softmax alone -----------------------------------------------------------------------


def _run_logprob_workspace(positions: int, hidden: int, vocab: int, dtype: str) -> dict[str, float]:
    """Inside the fresh subprocess: TRL's chunked log-softmax forward and backward, peak RSS of each phase."""
    torch.manual_seed(0)
    weight = torch.randn(vocab, hidden, dtype=getattr(torch, dtype)) * 0.02
    states = torch.randn(positions, hidden, dtype=weight.dtype, requires_grad=True)
    labels = torch.randint(0, vocab, (positions,))
    outputs: dict[str, Any] = {}

    def forward() -> None:
        outputs["logps"], outputs["entropy"], *_ = ChunkedLogProbFunction.apply(
            states, weight, None, labels, 1.0, LOGPROB_VOCAB_CHUNK, None, 1.0, ("log_probs", "entropy")
        )

    forward_peak = _peak_while(forward)
    backward_peak = _peak_while(lambda: outputs["logps"].sum().backward())
    tile = min(positions, LOGPROB_TOKEN_CHUNK) * min(vocab, LOGPROB_VOCAB_CHUNK) * 4
    return {"forward_gb": forward_peak / GB, "backward_gb": backward_peak / GB, "tile_gb": tile / GB}


def measure_logprob_workspace(
    positions: int = 800, spec: ModelSpec | None = None, dtype: str = "bfloat16", timeout: float = 300
) -> dict[str, float]:
    """Peak memory of TRL's chunked log-softmax (forward, backward) over ``positions`` positions, on the CPU.

    Runs TRL's own ``ChunkedLogProbFunction`` (random weights of the model's output-head shape, SmolLM2 by
    default) in a fresh process, so that ``logprob_workspace_bytes`` stays a measurement of the installed TRL.
    """
    if not isinstance(positions, int) or positions < 1:
        raise ValueError(f"positions must be a positive integer, got {positions!r}")
    if dtype not in BYTES_PER_DTYPE:
        raise ValueError(f"dtype must be one of {sorted(BYTES_PER_DTYPE)}, got {dtype!r}")
    spec = spec or smollm2_spec()
    args = [positions, spec.hidden_size, spec.vocab_size, dtype]
    return _run_in_fresh_process("_run_logprob_workspace", args, {**os.environ, **MALLOC_ENV}, timeout)
