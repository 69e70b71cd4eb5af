"""Preflight checks: catch a doomed GRPO run before its first step, and say how to fix it in plain words.

``check(config, model=None, dataset=None, hardware=None)`` returns a list of ``Finding`` objects. The
config is a ``trl.GRPOConfig`` or a plain dict of its arguments: a dict can hold settings that
``GRPOConfig`` itself refuses with a traceback (a generation batch that is not a multiple of the group
size, bf16 on a CPU); here they become a finding that explains the cause and the fix.

What it finds (``Finding.code``):

- ``group-too-small``: ``num_generations`` < 2, so no prompt has a group to compare against;
- ``batch-not-divisible``: the generation batch (per-device batch x steps per generation x processes)
  is not a whole number of groups; ``generation-settings-conflict``, ``generation-batch-not-divisible``;
- ``bf16-unsupported``: bf16 on a GPU without it (T4) or on the CPU; ``fp16-on-cpu``;
- ``completion-too-short``: ``max_completion_length`` below the 90th percentile of the reference solutions'
  token lengths (needs ``dataset`` and a tokenizer), so most answers would be cut off before the answer tag;
- ``kl-not-logged``: ``beta`` is 0, so TRL builds no reference model and logs no ``kl``;
- ``memory-too-high`` / ``memory-tight``: the estimate of ``course_utils.training.memory`` against the hardware
  (``preflight_memory``);
- ``vllm-missing``: vLLM generation asked for (``use_vllm``, or a profile with ``use_vllm``) but not installed;
- ``unknown-loss-type`` / ``unknown-importance-sampling-level``: a value the installed TRL does not know (the
  valid loss types are read from TRL, ``config_reading.trl_choices``);
- ``sequence-ratio-on-policy`` / ``clip-higher-on-policy``: GSPO's sequence ratio or clip-higher on an on-policy
  run, where the importance ratio is exactly 1 and they change nothing (info).
"""

from __future__ import annotations

import dataclasses
import difflib
from typing import Any

import pandas as pd

from course_utils.core.field_checks import check_value_types
from course_utils.core.findings import SEVERITIES, Finding
from course_utils.core.hardware import Hardware, as_hardware
from course_utils.core.profiles import Profile, get_profile
from course_utils.core.speedups import switched_on
from course_utils.lesson.token_lengths import reference_length_percentile
from course_utils.training.config_reading import config_values, generation_batch, on_policy, trl_choices
from course_utils.training.grpo_config import GenerationBatchError, check_generation_batch, vllm_available
from course_utils.training.memory import MemoryEstimate
from course_utils.training.preflight_memory import estimate_for_config, looks_like_tokenizer, memory_findings

COMPLETION_PERCENTILE = 90


class PreflightError(RuntimeError):
    """Raised by ``raise_for_errors`` when a finding says the run cannot work."""


# --- The checks -----------------------------------------------------------------------------------


GROUP_FIXES = {
    "batch-size-invalid": "Set per_device_train_batch_size, gradient_accumulation_steps (or steps_per_generation) and "
    "the number of processes to whole numbers >= 1.",
    "group-too-small": "Set num_generations to at least 2; 4 to 16 is usual (the course profiles use 2, 8 and 16).",
}


def _batch_finding_code(values: dict[str, Any], steps: int, num_processes: int) -> str:
    """Which part of ``check_generation_batch``'s rule failed, in the order it checks them."""
    sizes = (values["per_device_train_batch_size"], steps, num_processes)
    if any(not isinstance(size, int) or size < 1 for size in sizes):
        return "batch-size-invalid"
    g = values["num_generations"]
    return "group-too-small" if not isinstance(g, int) or g < 2 else "batch-not-divisible"


def _check_groups(values: dict[str, Any], num_processes: int, built: bool) -> list[Finding]:
    """The generation batch TRL would form, checked by training's rule (``grpo_config.check_generation_batch``)."""
    _, steps, problem = generation_batch(values, num_processes, built=built)
    if problem:
        return [
            Finding(
                "error",
                "generation-settings-conflict" if "both" in problem else "generation-batch-not-divisible",
                f"{problem}; GRPOConfig refuses this.",
                "Set only one of generation_batch_size / steps_per_generation (or neither: the default generates "
                "per_device_train_batch_size x gradient_accumulation_steps completions at a time).",
            )
        ]
    try:
        check_generation_batch(values["per_device_train_batch_size"], steps, values["num_generations"], num_processes)
    except GenerationBatchError as error:
        code = _batch_finding_code(values, steps, num_processes)
        message, _, fix = str(error).partition(" Fix: ")
        return [Finding("error", code, message, fix or GROUP_FIXES[code])]
    return []


def _check_precision(values: dict[str, Any], hardware: Hardware) -> list[Finding]:
    findings = []
    if values["bf16"] and values.get("fp16"):
        findings.append(Finding("error", "bf16-and-fp16", "bf16 and fp16 are both True.", "Keep at most one."))
    if values["bf16"] and hardware.device == "cuda" and not hardware.bf16:
        findings.append(
            Finding(
                "error",
                "bf16-unsupported",
                f"bf16 is requested (TRL turns it on unless fp16=True) but the {hardware.label} has no bfloat16 "
                "support (bf16 needs an Ampere GPU or newer: A100, A800, L4, H100; a T4 is older).",
                "Use fp16 instead: bf16=False, fp16=True, and load the model in float16 (the colab-t4 profile).",
            )
        )
    if values["bf16"] and hardware.device == "cpu" and not (values.get("use_cpu") and hardware.bf16):
        refused = not values.get("use_cpu")
        findings.append(
            Finding(
                "error" if refused else "warning",
                "bf16-unsupported",
                "bf16 is requested (TRL turns it on unless fp16=True) and the run is on the CPU: "
                + (
                    "GRPOConfig refuses it without use_cpu=True ('Your setup doesn't support bf16/gpu')."
                    if refused
                    else "this CPU has no native bfloat16 (AVX512-BF16/AMX), so bf16 is emulated, slower than fp32."
                ),
                "Set use_cpu=True, and bf16=False unless the CPU computes bf16 natively (then bf16=True is faster).",
            )
        )
    if values.get("fp16") and hardware.device == "cpu":
        findings.append(
            Finding(
                "warning",
                "fp16-on-cpu",
                "fp16 mixed precision is a GPU feature: on the CPU, Accelerate accepts the flag but has no fp16 "
                "autocast or gradient scaler, so the run is not the fp16 run you asked for (and a model loaded "
                "in float16 computes slowly and overflows easily).",
                "On the CPU train in fp32 (fp16=False, use_cpu=True), or bf16=True where the CPU supports it.",
            )
        )
    return findings


def _check_kl(values: dict[str, Any], expect_kl: bool | None) -> list[Finding]:
    if values.get("beta", 0.0) != 0.0 or expect_kl is False:
        return []
    return [
        Finding(
            "warning" if expect_kl else "info",
            "kl-not-logged",
            "beta is 0 (TRL's default): no reference model is built and the `kl` metric is not logged, so a KL "
            "plot will have nothing to show and nothing holds the policy near the starting model.",
            "Set beta > 0 (e.g. 0.04, as the ci and GPU profiles do) if you want the KL penalty and the `kl` curve.",
        )
    ]


def _check_loss_variant(values: dict[str, Any], num_processes: int, built: bool) -> list[Finding]:
    """An unknown ``loss_type`` (TRL fails only inside the first step), and variant fields that do nothing."""
    findings = []
    valid = trl_choices("loss_type")
    loss_type = values.get("loss_type")
    if valid and loss_type not in valid:
        close = difflib.get_close_matches(str(loss_type), valid, n=1)
        findings.append(
            Finding(
                "error",
                "unknown-loss-type",
                f"loss_type={loss_type!r} is not a loss the installed TRL knows: GRPOTrainer raises 'Unknown loss "
                f"type' inside the first training step. Valid values: {', '.join(valid)}.",
                (f"Did you mean {close[0]!r}? " if close else "") + "Use one of the valid values ('dapo' is TRL's "
                "default).",
            )
        )
    level = values.get("importance_sampling_level", "token")
    if level not in ("token", "sequence"):
        findings.append(
            Finding(
                "error",
                "unknown-importance-sampling-level",
                f"importance_sampling_level={level!r}: TRL knows 'token' and 'sequence' (GSPO).",
                "Set importance_sampling_level to 'token' (the default) or 'sequence'.",
            )
        )
    if level == "sequence" and on_policy(values, num_processes, built=built):
        findings.append(
            Finding(
                "info",
                "sequence-ratio-on-policy",
                "importance_sampling_level='sequence' with num_iterations=1 (and one update per generation): the run "
                "is on-policy, every importance ratio is exactly 1, so GSPO's sequence ratio is identical to token "
                "level on-policy.",
                "Set num_iterations=2 (or steps_per_generation above gradient_accumulation_steps) to make it matter.",
            )
        )
    high = values.get("epsilon_high")
    if high is not None and high != values.get("epsilon") and on_policy(values, num_processes, built=built):
        findings.append(
            Finding(
                "info",
                "clip-higher-on-policy",
                f"epsilon_high={high} on an on-policy run: the ratio is exactly 1, so no token is ever clipped and "
                "clip-higher changes nothing.",
                "Clip-higher acts only off-policy: num_iterations > 1 or steps_per_generation > "
                "gradient_accumulation_steps.",
            )
        )
    return findings


def _check_completion_length(values: dict[str, Any], dataset: Any, tokenizer: Any) -> list[Finding]:
    if dataset is None:
        return []
    if tokenizer is None:
        return [
            Finding(
                "info",
                "completion-length-unchecked",
                "A dataset was given but no tokenizer, so the completion length could not be compared with the "
                "reference solutions.",
                "Pass tokenizer=... to preflight.check.",
            )
        ]
    limit = values.get("max_completion_length")
    if limit is None:
        return []
    p90 = reference_length_percentile(dataset, tokenizer, q=COMPLETION_PERCENTILE)
    if limit >= p90:
        return []
    return [
        Finding(
            "warning",
            "completion-too-short",
            f"max_completion_length is {limit} tokens, but 10% of the reference solutions are longer than "
            f"{p90:.0f} tokens (90th percentile), before the <reasoning>/<answer> tags: many completions will be cut "
            "off before the answer, score 0, and the reward stays flat.",
            f"Raise max_completion_length to at least {p90 + 32} (p90 + room for the tags), or accept truncation "
            "knowingly (watch completions/clipped_ratio).",
        )
    ]


VLLM_INSTALL = 'pip install ".[vllm]"  (in the course folder; GPU machines only)'


def _check_vllm(values: dict[str, Any], profile: Profile | None, hardware: Hardware) -> list[Finding]:
    """vLLM asked for but missing: an error when the config uses it (TRL would stop), a warning for a profile."""
    if vllm_available():
        return []
    if values.get("use_vllm"):
        return [
            Finding(
                "error",
                "vllm-missing",
                "The config sets use_vllm=True, but the vllm package is not installed: TRL stops when it builds the "
                "trainer.",
                f"Install it with {VLLM_INSTALL}, or set use_vllm=False to generate with transformers.",
            )
        ]
    if profile is not None and profile.use_vllm and hardware.device == "cuda":
        return [
            Finding(
                "warning",
                "vllm-missing",
                f"Profile {profile.name!r} generates with vLLM (colocated), but the vllm package is not installed: "
                "this run generates with transformers instead, several times slower.",
                f"Install it with {VLLM_INSTALL}, then rebuild the config.",
            )
        ]
    return []


def _estimate(
    values: dict[str, Any], model: Any, hardware: Hardware, prompt_tokens: int | None, built: bool, speedups: bool
) -> MemoryEstimate | None:
    """``estimate_memory`` for the config's values and the model; None when the model or the batch is unknown."""
    _, steps, problem = generation_batch(values, hardware.num_processes, built=built)
    if model is None or problem or values["num_generations"] is None:
        return None
    return estimate_for_config(values, model, hardware, prompt_tokens, steps, speedups)


def memory_estimate(
    config: Any,
    model: Any,
    hardware: Hardware | dict[str, Any] | str | None = None,
    *,
    prompt_tokens: int | None = None,
    profile: Profile | str | None = None,
    speedups: bool | None = None,
) -> MemoryEstimate | None:
    """The estimate :func:`check` compares with the hardware's memory (None when the model or batch is unknown).

    ``speedups``: whether the CPU plug-in runs; None reads the switch as the estimator does
    (``core.speedups.switched_on(profile)``), so preflight, the measurement and notebook 06 count the same run.
    """
    values, built = config_values(config), not isinstance(config, dict)
    return _estimate(values, model, as_hardware(hardware), prompt_tokens, built, _speedups_on(profile, speedups))


def _speedups_on(profile: Profile | str | None, speedups: bool | None) -> bool:
    """``speedups`` where given, else the switch (``COURSE_CPU_SPEEDUPS`` and the profile's flag)."""
    return switched_on(profile) if speedups is None else speedups


def _check_memory(
    values: dict[str, Any], model: Any, hardware: Hardware, prompt_tokens: int | None, built: bool, speedups: bool
) -> list[Finding]:
    if hardware.available_memory_gb <= 0:
        return []
    estimate = _estimate(values, model, hardware, prompt_tokens, built, speedups)
    if estimate is None:
        return []
    return memory_findings(estimate, hardware)


# The fields a dict config is read for, by type: a quoted number fails here, not deep in a comparison
CONFIG_FIELD_TYPES: dict[str, type] = {
    "num_generations": int,
    "per_device_train_batch_size": int,
    "gradient_accumulation_steps": int,
    "max_completion_length": int,
    "learning_rate": float,
    "beta": float,
    "bf16": bool,
    "fp16": bool,
    "use_vllm": bool,
}


def check(
    config: Any,
    model: Any = None,
    dataset: Any = None,
    hardware: Hardware | dict[str, Any] | str | None = None,
    *,
    tokenizer: Any = None,
    expect_kl: bool | None = None,
    prompt_tokens: int | None = None,
    profile: Profile | str | None = None,
    speedups: bool | None = None,
) -> list[Finding]:
    """Every finding about a planned GRPO run, errors first; an empty list means nothing was found.

    ``config``: a ``GRPOConfig`` or a dict of its arguments. ``model``: the model (or a ``ModelSpec``, or a
    model id) for the memory estimate; a tokenizer passed here is used as the tokenizer. ``dataset``: the
    training set (``reasoning`` column) for the completion-length check, which needs a tokenizer.
    ``hardware``: a ``Hardware``, a dict of its fields, a known name (``"T4"``) or None for this machine.
    ``expect_kl=True`` turns the missing-``kl`` remark into a warning. ``profile``: the profile the config came
    from, whose wishes the config may not show (a profile asking for vLLM where it is not installed).
    ``speedups``: whether the CPU plug-in runs, for the memory estimate (None: the switch, as :func:`memory_estimate`).
    """
    values = config_values(config)
    built = not isinstance(config, dict)
    if not built:
        check_value_types(values, CONFIG_FIELD_TYPES, where="preflight.check config")
    machine = as_hardware(hardware)
    if tokenizer is None and model is not None and looks_like_tokenizer(model):
        tokenizer, model = model, None
    findings = [
        *_check_groups(values, machine.num_processes, built),
        *_check_precision(values, machine),
        *_check_completion_length(values, dataset, tokenizer),
        *_check_kl(values, expect_kl),
        *_check_loss_variant(values, machine.num_processes, built),
        *_check_memory(values, model, machine, prompt_tokens, built, _speedups_on(profile, speedups)),
        *_check_vllm(values, get_profile(profile) if profile is not None else None, machine),
    ]
    return sorted(findings, key=lambda f: SEVERITIES.index(f.severity))


# --- Showing the result ---------------------------------------------------------------------------


def format_findings(findings: list[Finding]) -> str:
    """Readable lines, one block per finding; a clear all-clear when there are none."""
    if not findings:
        return "Preflight: no problems found."
    icons = {"error": "❌", "warning": "⚠️", "info": "ℹ️"}
    counts = ", ".join(f"{sum(f.severity == s for f in findings)} {s}(s)" for s in SEVERITIES)
    lines = [f"Preflight: {counts}"]
    for f in findings:
        lines += [f"{icons[f.severity]} {f.severity.upper()} [{f.code}] {f.message}", f"   fix: {f.fix}"]
    return "\n".join(lines)


def findings_table(findings: list[Finding]) -> Any:
    """The findings as a pandas DataFrame (columns severity, code, message, fix) for notebook display."""
    return pd.DataFrame([dataclasses.asdict(f) for f in findings], columns=["severity", "code", "message", "fix"])


def raise_for_errors(findings: list[Finding]) -> None:
    """Raise ``PreflightError`` listing the errors, if any: call it right before ``trainer.train()``."""
    errors = [f for f in findings if f.severity == "error"]
    if errors:
        raise PreflightError(format_findings(errors))
