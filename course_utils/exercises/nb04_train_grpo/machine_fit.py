"""What both training configs (04.1 ``GRPOConfig``, 04.3 ``SFTConfig``) must do on this machine: the precision
the model trains in on the profile's device, the run folder, and a learning rate near the profile's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from course_utils.core.hardware import cpu_precision, cuda_available, cuda_bf16_supported
from course_utils.core.profiles import Profile
from course_utils.training.grpo_config import precision_flags
from course_utils.training.trained_model import default_run_dir


def _bf16_problem(on: bool, profile: Profile) -> str:
    dtype = profile.training_dtype
    if not on:
        return "bf16=False, but the model trains in bfloat16 here (profile.training_dtype): set bf16=True"
    if profile.device == "cpu":
        return (f"bf16=True on this CPU, where the model trains in {dtype}: {cpu_precision().reason}; "
                "set bf16=False (TRL's GRPOConfig turns bf16 on unless you say otherwise)")
    reason = "this GPU has no bfloat16 (a T4)" if not cuda_bf16_supported() else f"the model trains in {dtype}"
    return f"bf16=True, but {reason}: set bf16=False"


def _fp16_problem(on: bool, profile: Profile) -> str:
    if not on:
        return "fp16=False, but the model trains in float16 here (a T4): set fp16=True and bf16=False"
    if profile.device == "cpu":
        return "fp16=True on the CPU: fp16 mixed precision is a GPU feature (no fp16 autocast or scaler on a CPU)"
    return f"fp16=True, but the model trains in {profile.training_dtype} here: set fp16=False"


def precision_problems(config: Any, profile: Profile) -> list[str]:
    """Mixed precision as the model trains on this machine (``profile.training_dtype``), on the profile's device."""
    wanted = precision_flags(profile)
    problems = []
    if bool(config.bf16) != wanted["bf16"]:
        problems.append(_bf16_problem(bool(config.bf16), profile))
    if bool(config.fp16) != wanted["fp16"]:
        problems.append(_fp16_problem(bool(config.fp16), profile))
    if profile.device == "cpu" and not config.use_cpu and cuda_available():
        problems.append("use_cpu=False with a GPU visible: this CPU profile's run would move to the GPU")
    if profile.device == "cuda" and config.use_cpu:
        problems.append("use_cpu=True: this GPU profile would train on the CPU")
    return problems


def run_folder_problems(output_dir: Any, profile: Profile, inside: bool) -> list[str]:
    """``output_dir`` is the run folder (``inside``: or a folder in it)."""
    run_dir = default_run_dir(profile).resolve()
    folder = Path(str(output_dir)).resolve()
    if folder == run_dir or (inside and run_dir in folder.parents):
        return []
    where = "in the run folder" if inside else "the run folder"
    return [f"output_dir {str(output_dir)!r} is not {where} {str(run_dir)!r} (run_dir): the resume (section 10) "
            "and notebook 05 look for checkpoints and the trained model there"]


# How far a learning rate may stray from the profile's: within this factor either way the short run still
# learns about as the lesson says; TRL's default (1e-6, for full fine-tuning) is 100 times below LoRA's rates.
LEARNING_RATE_FACTOR = 5


def shown_number(value: Any) -> str:
    """A number as a verdict prints it (``1e-05``), anything else as its repr."""
    return f"{value:g}" if isinstance(value, (int, float)) and not isinstance(value, bool) else repr(value)


def rate_problem(field: str, value: Any, wanted: float, steps: int) -> str | None:
    """A learning rate within ``LEARNING_RATE_FACTOR`` of the profile's ``wanted`` one, or why not."""
    low, high = wanted / LEARNING_RATE_FACTOR, wanted * LEARNING_RATE_FACTOR
    if isinstance(value, (int, float)) and not isinstance(value, bool) and low <= value <= high:
        return None
    return (f"{field}={shown_number(value)}: the profile's is {wanted:g} (accepted: {low:g} to {high:g}); the run "
            f"has only {steps} steps: far below, the adapters barely move and nothing is learned; far above, the "
            "updates overshoot and the rewards collapse")
