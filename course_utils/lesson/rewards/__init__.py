"""The reward functions that drive GRPO on GSM8K: corrected versions, classic versions, shaping, tables.

Public API (import from ``course_utils.lesson.rewards``):

- the five corrected rewards under TRL's signature ``(prompts, completions, answer, **kwargs)``:
  ``correctness_reward_func`` (2.0), ``int_reward_func`` (0.5), ``strict_format_reward_func`` (0.5),
  ``soft_format_reward_func`` (0.5), ``xmlcount_reward_func`` (0.125 per tag, minus trailing text),
  and ``REWARD_FUNCS`` (that order); ``answers_match`` (math-verify equivalence with a numeric fast path);
- ``course_utils.lesson.rewards.classic``: the popular originals, bugs included; ``get_reward_funcs(variant)``;
- weights (multipliers of each function's output; "initial" = all 1.0): ``DEFAULT_WEIGHTS`` (presets
  ``"initial"``, ``"tuned"``), ``max_total_reward``, ``reward_points``, ``grpo_reward_weights`` (for
  ``GRPOConfig(reward_weights=...)``), ``save_weights`` / ``load_weights`` (notebook 03 -> notebook 04);
- shaping: ``length_reward_func``, ``combine_rewards``, ``staged_format_reward_func``;
- tables: ``reward_table``, ``compare_variants``.
"""

from course_utils.core.answer_format import extract_xml_answer
from course_utils.lesson.rewards.corrected import (
    CORRECT_REWARD,
    INT_REWARD,
    MAX_TRAILING_PENALTY,
    REWARD_FUNCS,
    REWARD_MAX,
    REWARD_MIN,
    REWARD_NAMES,
    SOFT_FORMAT_REWARD,
    STRICT_FORMAT_REWARD,
    TAG_REWARD,
    TAGS,
    TRAILING_CHAR_PENALTY,
    answers_match,
    completion_text,
    completion_texts,
    correctness_reward_func,
    int_reward_func,
    is_soft_format,
    is_strict_format,
    plain_number,
    soft_format_reward_func,
    strict_format_reward_func,
    tag_alone_on_its_line,
    xmlcount_reward_func,
    xmlcount_score,
)
from course_utils.lesson.rewards.scoring import (
    TOTAL_COLUMN,
    VARIANTS,
    compare_variants,
    get_reward_funcs,
    preview,
    reward_table,
)
from course_utils.lesson.rewards.shaping import (
    combine_rewards,
    format_stage,
    gaussian_length_score,
    length_reward_func,
    make_length_reward,
    make_staged_format_reward,
    staged_format_reward_func,
)
from course_utils.lesson.rewards.weights import (
    DEFAULT_PRESET,
    DEFAULT_WEIGHTS,
    WEIGHT_PRESETS,
    grpo_reward_weights,
    load_weights,
    max_total_reward,
    resolve_weights,
    reward_points,
    save_weights,
    weights_path,
)

__all__ = [
    "CORRECT_REWARD",
    "DEFAULT_PRESET",
    "DEFAULT_WEIGHTS",
    "INT_REWARD",
    "MAX_TRAILING_PENALTY",
    "REWARD_FUNCS",
    "REWARD_MAX",
    "REWARD_MIN",
    "REWARD_NAMES",
    "SOFT_FORMAT_REWARD",
    "STRICT_FORMAT_REWARD",
    "TAGS",
    "TAG_REWARD",
    "TOTAL_COLUMN",
    "TRAILING_CHAR_PENALTY",
    "VARIANTS",
    "WEIGHT_PRESETS",
    "answers_match",
    "combine_rewards",
    "compare_variants",
    "completion_text",
    "completion_texts",
    "correctness_reward_func",
    "extract_xml_answer",
    "format_stage",
    "gaussian_length_score",
    "get_reward_funcs",
    "grpo_reward_weights",
    "int_reward_func",
    "is_soft_format",
    "is_strict_format",
    "length_reward_func",
    "load_weights",
    "make_length_reward",
    "make_staged_format_reward",
    "max_total_reward",
    "plain_number",
    "preview",
    "resolve_weights",
    "reward_points",
    "reward_table",
    "save_weights",
    "soft_format_reward_func",
    "staged_format_reward_func",
    "strict_format_reward_func",
    "tag_alone_on_its_line",
    "weights_path",
    "xmlcount_reward_func",
    "xmlcount_score",
]
