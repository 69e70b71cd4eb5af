"""Notebook 04 (training): the checks of what the learner writes, and what each hands back.

In the lesson the learner writes ``GRPOConfig(...)`` (04.1), ``LoraConfig(...)`` (04.2), the warm start's
``SFTConfig(...)`` (04.3) and the ``GRPOTrainer(...)`` call (04.4); at the end, three values (04.5-04.7) and
``generation_batch`` (04.8). Each check judges what the object does, not whether it equals the package's; every
field that changes what is trained, sampled, kept or scored matches the profile's config or lies in a stated
range (``run_fields`` classes every field of the three configs):

- ``GRPOConfig``: whole groups in the generation batch, the run the profile measured (completions per step,
  group size, steps, a learning rate and a ``beta`` in stated ranges around the profile's, ``beta`` above 0
  where the dashboard draws ``kl``), the precision this machine trains in, a completion length that fits the
  profile and the reference answers, one weight per reward (notebook 03's), the run folder, and values TRL
  accepts. Extra fields (``log_completions=True``, smaller passes with more accumulation) pass.
- ``LoraConfig``: the linear layers peft adapts with it (however the targets and layers are written) are the
  profile's, a rank and an update scale near the profile's.
- ``SFTConfig``: the micro batch, the warm start's number of steps and learning rate, the precision, a
  ``max_length`` that keeps every example whole, the run folder.
- ``GRPOTrainer``: the course's five rewards with their weights, the checked config, the tokenizer, the
  (warm-started) model with the checked LoRA, and the notebook's training prompts, none of which notebook 05
  evaluates on.

Every check prints one verdict and hands back what the notebook continues with: the learner's object when
it passed, else the package's (``training.make_grpo_config``...). Checks never raise.

The notebook imports its checks from here. Modules: ``judging`` (one verdict a construct, the library's own
error shown), ``machine_fit`` (precision, run folder and learning rate, for both configs), ``run_fields`` (the
fields' classes), ``grpo_config_check`` (04.1), ``lora_config_check`` (04.2), ``sft_config_check`` (04.3),
``grpo_trainer_check`` (04.4), ``value_questions`` (04.5-04.7), ``generation_batch_check`` (04.8).
"""

from course_utils.exercises.nb04_train_grpo.generation_batch_check import check_04_generation_batch
from course_utils.exercises.nb04_train_grpo.grpo_config_check import check_grpo_config
from course_utils.exercises.nb04_train_grpo.grpo_trainer_check import check_grpo_trainer
from course_utils.exercises.nb04_train_grpo.lora_config_check import check_lora_config
from course_utils.exercises.nb04_train_grpo.sft_config_check import check_sft_config
from course_utils.exercises.nb04_train_grpo.value_questions import (
    check_04_group_size_field,
    check_04_monitoring_rule,
    check_04_prompts_per_step,
)

__all__ = [
    "check_04_generation_batch",
    "check_04_group_size_field",
    "check_04_monitoring_rule",
    "check_04_prompts_per_step",
    "check_grpo_config",
    "check_grpo_trainer",
    "check_lora_config",
    "check_sft_config",
]
