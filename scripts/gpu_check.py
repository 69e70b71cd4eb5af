"""``make gpu-check``: a few GRPO steps of the GPU profiles' code path on this machine's CUDA GPU.

For instructors before a workshop, and for anyone with a GPU at hand. Each set-up runs in its own process
(a fresh GPU each time) for ``--steps`` steps with the course's own functions (course_utils.training.run):

- ``4bit-lora``: the ``colab-t4`` path, 4-bit weights (bitsandbytes) + LoRA, gradient checkpointing;
- ``lora``: the ``gpu`` path, 16-bit weights + LoRA, generation with transformers;
- ``lora-vllm``: the ``gpu`` path with vLLM colocated, when vllm is installed.

Precision is bf16 where the card has it, else fp16. The model is Qwen2.5-0.5B-Instruct from the Hub or its
cache, else the offline SmolLM2-135M-Instruct. Results are ``name: value`` lines (step time, completion
tokens per second, peak GPU memory). Without a CUDA GPU it prints one line saying so and exits 0.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from typing import Any

SETUPS: dict[str, dict[str, Any]] = {
    "4bit-lora": {"base": "colab-t4", "use_vllm": False},
    "lora": {"base": "gpu", "use_vllm": False},
    "lora-vllm": {"base": "gpu", "use_vllm": True},
}


def setups_to_run(vllm_installed: bool) -> list[str]:
    """The set-ups this machine can run: vLLM's only where vllm is installed."""
    return [name for name, setup in SETUPS.items() if vllm_installed or not setup["use_vllm"]]


def check_profile(setup: str, bf16: bool, steps: int, offline: bool) -> Any:
    """The set-up's profile, cut to ``steps`` steps, in the precision the card has, on the model at hand."""
    from course_utils.core.profiles import OFFLINE_MODEL_ID, get_profile

    spec = SETUPS[setup]
    profile = get_profile(spec["base"])
    changes: dict[str, Any] = {
        "dtype": "bfloat16" if bf16 else "float16",
        "use_vllm": spec["use_vllm"],
        "max_steps": steps,
        "save_steps": steps + 1,
        "logging_steps": 1,
        "train_size": steps * profile.prompts_per_step,
    }
    if offline:
        changes.update(model_source="offline", model_id=OFFLINE_MODEL_ID)
    return profile.override(**changes)


def step_figures(log_history: list[dict[str, Any]], completions_per_step: int) -> dict[str, float]:
    """Mean step time and completion tokens per second over the logged steps, the first (warm-up) left out."""
    steps = [e for e in log_history if "step_time" in e and "completions/mean_length" in e]
    if not steps:
        raise ValueError("the log history has no step with step_time and completions/mean_length")
    measured = steps[1:] or steps
    seconds = sum(e["step_time"] for e in measured) / len(measured)
    tokens = sum(e["completions/mean_length"] for e in measured) / len(measured) * completions_per_step
    return {"step_time_s": seconds, "completion_tokens_per_s": tokens / seconds, "steps_measured": len(measured)}


def run_setup(setup: str, steps: int) -> dict[str, Any]:
    """One set-up, in this process: load, build the trainer as notebook 04 does, train, measure."""
    import torch

    from course_utils import cpu_speed
    from course_utils.core.profiles import bf16_supported
    from course_utils.lesson.models import ModelUnavailableError
    from course_utils.training.run import build_trainer, load_model_for_training, make_grpo_config

    bf16 = bf16_supported()
    profile = check_profile(setup, bf16, steps, offline=False)
    try:
        model, tokenizer = load_model_for_training(profile)
    except ModelUnavailableError:
        profile = check_profile(setup, bf16, steps, offline=True)
        model, tokenizer = load_model_for_training(profile)
    config = make_grpo_config(profile, save_strategy="no", report_to=[])
    trainer = build_trainer(model, tokenizer, profile, config=config)
    torch.cuda.reset_peak_memory_stats()
    started = time.perf_counter()
    with cpu_speed.enabled(trainer, profile=profile):  # a no-op on the GPU: the plug-in is for the CPU only
        trainer.train()
    figures = step_figures(trainer.state.log_history, profile.effective_batch_size)
    return {
        "model": profile.model_id,
        "precision": "bf16" if bf16 else "fp16",
        "use_vllm": bool(config.use_vllm),
        **figures,
        "wall_s": time.perf_counter() - started,
        "peak_vram_allocated_gb": torch.cuda.max_memory_allocated() / 1024**3,
        "peak_vram_reserved_gb": torch.cuda.max_memory_reserved() / 1024**3,
    }


def print_lines(prefix: str, values: dict[str, Any]) -> None:
    for name, value in values.items():
        print(f"{prefix}{name}: {value:.3f}" if isinstance(value, float) else f"{prefix}{name}: {value}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3, help="training steps per set-up (the first is a warm-up)")
    parser.add_argument("--run", choices=sorted(SETUPS), help=argparse.SUPPRESS)  # one set-up, in a child process
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("gpu-check: no CUDA GPU on this machine (torch sees none), nothing to measure; run it where a GPU is.")
        return 0
    if args.run:
        print("RESULT " + json.dumps(run_setup(args.run, args.steps)))
        return 0
    from course_utils.training.run import vllm_available

    print(f"gpu: {torch.cuda.get_device_name(0)}")
    print(f"gpu_memory_gb: {torch.cuda.get_device_properties(0).total_memory / 1024**3:.1f}")
    print(f"bf16: {torch.cuda.is_bf16_supported()}")
    print(f"vllm_installed: {vllm_available()}")
    failed = 0
    for setup in setups_to_run(vllm_available()):
        child = [sys.executable, __file__, "--run", setup, "--steps", str(args.steps)]
        done = subprocess.run(child, capture_output=True, text=True)
        results = [line[7:] for line in done.stdout.splitlines() if line.startswith("RESULT ")]
        if done.returncode or not results:
            failed += 1
            print(f"{setup}.error: exit {done.returncode}; last lines:\n{done.stderr[-2000:]}")
            continue
        print_lines(f"{setup}.", json.loads(results[-1]))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
