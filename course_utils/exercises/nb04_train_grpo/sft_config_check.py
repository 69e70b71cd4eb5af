"""04.3: the warm start's ``SFTConfig``: the micro batch, the warm start's number of steps and learning rate, the
precision, a ``max_length`` that keeps every example whole, the run folder.
"""

from __future__ import annotations

import math
from typing import Any

from trl import SFTConfig

from course_utils.core.profiles import Profile
from course_utils.exercises.nb04_train_grpo.judging import TRL_CONFIG, judge, kind_problem, problems_of
from course_utils.exercises.nb04_train_grpo.machine_fit import precision_problems, rate_problem, run_folder_problems
from course_utils.exercises.nb04_train_grpo.run_fields import SFT_FIELDS, field_problems
from course_utils.exercises.verdicts import hand_back
from course_utils.training.warm_start import WARM_START_MICRO_BATCH, make_sft_config, warm_start_dataset


def warm_start_steps(examples: int, batch: int, epochs: float, max_steps: int = -1) -> int:
    """Optimizer steps of a warm start: ``max_steps`` when set, else epochs over the examples in batches."""
    if max_steps and max_steps > 0:
        return max_steps
    return math.ceil(math.ceil(examples / max(batch, 1)) * epochs)


def longest_warm_start_example(profile: Profile, tokenizer: Any) -> int:
    """Tokens of the longest warm-start example: its chat prompt and its target, as SFT reads them."""
    rows = warm_start_dataset(profile).to_list()
    texts = tokenizer.apply_chat_template([row["prompt"] + row["completion"] for row in rows], tokenize=False)
    return max(len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"])


def sft_length_problems(config: Any, profile: Profile, tokenizer: Any) -> list[str]:
    """``max_length`` keeps every warm-start example whole (a cut example loses its answer and closing tags)."""
    if tokenizer is None or profile.warm_start_examples < 1 or config.max_length is None:
        return []
    longest = longest_warm_start_example(profile, tokenizer)
    if config.max_length >= longest:
        return []
    return [f"max_length={config.max_length} cuts the longest warm-start example ({longest} tokens): "
            "the end it loses is the answer and the closing tags the warm start is for"]


def sft_config_problems(config: Any, profile: Profile, tokenizer: Any = None) -> list[str]:
    """Everything an ``SFTConfig`` gets wrong for the profile's warm start (empty: nothing)."""
    kind = kind_problem(config, SFTConfig, "SFTConfig")
    if kind:
        return kind
    problems = []
    micro, accumulation = config.per_device_train_batch_size, config.gradient_accumulation_steps
    if micro > WARM_START_MICRO_BATCH:
        problems.append(f"per_device_train_batch_size={micro}: more than WARM_START_MICRO_BATCH "
                        f"({WARM_START_MICRO_BATCH}) sequences per pass; SFT's logits over the whole vocabulary "
                        "outgrow the memory; keep the batch with gradient_accumulation_steps")
    examples = max(profile.warm_start_examples, 1)
    wanted = warm_start_steps(examples, profile.warm_start_batch_size, profile.warm_start_epochs)
    yours = warm_start_steps(examples, micro * accumulation, config.num_train_epochs, config.max_steps)
    if yours != wanted:
        problems.append(f"{yours} optimizer steps (batch {micro} x {accumulation}, {config.num_train_epochs} epochs"
                        f"{f', max_steps {config.max_steps}' if config.max_steps > 0 else ''}), the profile's warm "
                        f"start takes {wanted}: fewer leave the reasoning to chance (GRPO then drifts to a bare "
                        "number in tags, notebook 06's collapse), more copy the few examples word for word")
    wanted_steps = max(wanted, 1)
    if rate := rate_problem("learning_rate", config.learning_rate, profile.warm_start_learning_rate, wanted_steps):
        problems.append(f"{rate} (the warm start's rate, profile.warm_start_learning_rate)")
    return [*problems, *precision_problems(config, profile), *sft_length_problems(config, profile, tokenizer),
            *run_folder_problems(config.output_dir, profile, inside=True),
            *field_problems(config, make_sft_config(profile), SFT_FIELDS)]


SFT_HINT = ("at most WARM_START_MICRO_BATCH sequences a pass, accumulation making up the profile's "
            "warm_start_batch_size, the profile's warm-start epochs, a max_length with room for prompt and target, "
            "precision as in your GRPOConfig, a folder in run_dir")


def check_sft_config(config: Any, profile: Profile, tokenizer: Any = None) -> Any:
    """04.3: the warm start's ``SFTConfig``; hands back it when it passed, else ``warm_start.make_sft_config``."""
    exercise = "04.3 SFTConfig"
    passed = judge(exercise, config, problems_of(sft_config_problems, config, profile, tokenizer), SFT_HINT,
                   TRL_CONFIG)
    reference = None if passed else make_sft_config(profile)
    return hand_back(exercise, passed, config, reference, "warm_start.make_sft_config(profile)")
