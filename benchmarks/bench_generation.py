"""Generation speed in the CPU lab's settings, against plain ``model.generate`` in fp32.

Prints `name: value` lines:

- ``generate_tokens_per_second``: the lab's generation (its model in this machine's precision path, LoRA
  applied as the trainer applies it, sampled through ``course_utils.cpu_speed.group_generation`` as the trainer samples,
  the frozen layers' packs kept between calls as during a training run, one prompt times ``num_generations``,
  ``max_completion_length`` new tokens, sampled with the trainer's settings from ``GRPOConfig``);
- ``generate_hf_default_tokens_per_second``: the same prompts, sampling settings and token count through plain
  ``model.generate`` on the fp32 model without adapters (transformers' default cache);
- ``generate_linear_kernels``: which packed kernel this machine measured fastest for each weight shape;
- ``generate_speedup_vs_hf_default``: how many times faster the lab generates, the median over pairs of runs
  taken in turns in the same process (target: at least 2);
- ``machine_read_bandwidth_gb_s_<n>_threads`` and ``machine_matmul_gflop_s_<dtype>_<n>_threads``: this machine's
  memory and arithmetic rates, one thread and every core (``course_utils.core.machine_limits``);
- ``generate_limit_tokens_per_second`` (and ``generate_limit_bound``, memory or arithmetic): the fastest decoding
  those rates allow for the lab's model and group; ``generate_fraction_of_limit``: the lab's measured speed over it.

Every row makes exactly ``max_completion_length`` tokens because generation does not stop at the end-of-sequence
token (``eos_token_id=None``). ``min_new_tokens`` would do it too, but adds two logits processors that scan the
vocabulary at every token, which the trainer never runs.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from peft import get_peft_model

from course_utils import cpu_speed
from course_utils.core.hardware import cpu_precision
from course_utils.core.machine_limits import decode_limit, measure_limits
from course_utils.core.profiles import get_profile
from course_utils.cpu_speed.adapters import adapters_beside_the_base
from course_utils.cpu_speed.lean_decoder import lean_layers
from course_utils.cpu_speed.packed_linear import describe_kernels, fastest_kernels, packable_layers
from course_utils.lesson.data import load_gsm8k
from course_utils.lesson.models import load_model_and_tokenizer
from course_utils.training.grpo_config import make_grpo_config
from course_utils.training.lora_setup import make_lora_config
from course_utils.training.run import load_model_for_training

REPEATS = 5


def trainer_sampling(profile: Any) -> dict[str, Any]:
    """The sampling settings ``GRPOTrainer`` passes to ``generate`` for this profile (TRL's defaults included)."""
    with tempfile.TemporaryDirectory() as folder:
        config = make_grpo_config(profile, output_dir=folder)
    names = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")
    return {"do_sample": True, **{name: getattr(config, name) for name in names}}


def seconds_for(model: Any, inputs: dict[str, Any], new_tokens: int, sampling: dict[str, Any], seed: int) -> float:
    """Wall seconds of one sampled ``generate`` of exactly ``new_tokens`` per row."""
    torch.manual_seed(seed)
    with torch.no_grad():
        started = time.perf_counter()
        output = model.generate(
            **inputs,
            max_new_tokens=new_tokens,
            eos_token_id=None,  # exactly new_tokens per row, with the trainer's (absent) logits processors
            **sampling,
        )
        seconds = time.perf_counter() - started
    made = output.shape[1] - inputs["input_ids"].shape[1]
    if made != new_tokens:
        raise RuntimeError(f"generate made {made} new tokens per row, not {new_tokens}: the figures would mislead")
    return seconds


def paired_seconds(
    models: tuple[Any, Any], inputs: dict[str, Any], new_tokens: int, sampling: dict[str, Any]
) -> tuple[list[float], list[float]]:
    """Seconds of ``REPEATS`` generations by each model, taken in turns after one warm-up each.

    In turns, so that a slower spell of a shared machine slows both sides of a pair alike.
    """
    times: tuple[list[float], list[float]] = ([], [])
    for repeat in range(REPEATS + 1):
        for model, seconds in zip(models, times, strict=True):
            seconds.append(seconds_for(model, inputs, new_tokens, sampling, seed=repeat))
    return times[0][1:], times[1][1:]


def main() -> None:
    profile = get_profile("cpu")
    problem = load_gsm8k("train", formatted=True, limit=1, verbose=False)[0]
    lab_model, tokenizer = load_model_for_training(profile)
    text = tokenizer.apply_chat_template(problem["prompt"], add_generation_prompt=True, tokenize=False)
    inputs = tokenizer([text] * profile.num_generations, return_tensors="pt")
    new_tokens = profile.max_completion_length
    sampling = {**trainer_sampling(profile), "pad_token_id": tokenizer.pad_token_id}
    lab_model = get_peft_model(lab_model, make_lora_config(profile, lab_model)).eval()
    grouped = cpu_speed.switched_on(profile)
    plain_model, _ = load_model_and_tokenizer(profile.override(dtype="float32"))
    with cpu_speed.for_generation(lab_model, profile=profile):  # packs kept between calls, as in a training run
        lab_seconds, plain_seconds = paired_seconds((lab_model, plain_model.eval()), inputs, new_tokens, sampling)
    kernels = {}
    if grouped:
        rows = len(inputs["input_ids"])
        with torch.no_grad(), adapters_beside_the_base(lab_model) as idle, lean_layers(lab_model, rows) as steps:
            unpacked = [*idle, *steps.stood_for]  # the layers group generation packs alone, and its stacked products
            packed = [layer for layer in packable_layers(lab_model) if all(layer is not m for m in unpacked)]
            kernels = {**fastest_kernels(packed, rows), **steps.kernels}
    tokens = len(inputs["input_ids"]) * new_tokens
    speedup = statistics.median(plain / lab for lab, plain in zip(lab_seconds, plain_seconds, strict=True))
    print(
        f"generate_settings: {profile.num_generations} completions x {new_tokens} tokens, "
        f"prompt {inputs['input_ids'].shape[1]} tokens, {cpu_precision().dtype} lab model with LoRA, "
        f"group generation {'on' if grouped else 'off'}, sampling "
        + ", ".join(f"{name}={value}" for name, value in sampling.items() if name != "pad_token_id")
    )
    print(f"generate_linear_kernels: {describe_kernels(kernels) or 'not packed'}")
    print(f"generate_tokens_per_second: {tokens / statistics.median(lab_seconds):.1f}")
    print(f"generate_hf_default_tokens_per_second: {tokens / statistics.median(plain_seconds):.1f}")
    print(f"generate_speedup_vs_hf_default: {speedup:.2f}")
    print_limit(lab_model, len(inputs["input_ids"]), tokens / statistics.median(lab_seconds))


def print_limit(model: Any, batch: int, measured_tokens_per_second: float) -> None:
    """This machine's rates, the decoding ceiling they set for ``model`` at ``batch`` rows, and the measured share."""
    dtype = cpu_precision().dtype
    limits = measure_limits(dtype)
    for threads in sorted(limits.bandwidth_gb_s):
        print(f"machine_read_bandwidth_gb_s_{threads}_threads: {limits.bandwidth_gb_s[threads]:.1f}")
        print(f"machine_matmul_gflop_s_{dtype}_{threads}_threads: {limits.matmul_gflop_s[threads]:.1f}")
    parameters = sum(p.numel() for p in model.parameters())
    every_core = limits.threads
    limit = decode_limit(parameters, dtype, batch, limits.bandwidth_gb_s[every_core], limits.matmul_gflop_s[every_core])
    bound = "memory" if limit["memory_seconds_per_step"] >= limit["arithmetic_seconds_per_step"] else "arithmetic"
    print(f"generate_limit_tokens_per_second: {limit['tokens_per_second']:.1f}")
    print(f"generate_limit_bound: {bound} ({parameters:,} parameters in {dtype}, {batch} rows, {every_core} threads)")
    print(f"generate_fraction_of_limit: {measured_tokens_per_second / limit['tokens_per_second']:.2f}")


if __name__ == "__main__":
    main()
