"""Every field of ``GRPOConfig``, ``SFTConfig`` and ``LoraConfig``, classed by whether it changes the run.

A field that changes what is trained, sampled, kept or scored must equal the package's config for the profile
(``training.make_grpo_config``, ``warm_start.make_sft_config``, ``lora_setup.make_lora_config``) or lie in the
range ``RANGES`` states; ``JUDGED`` fields have a rule of their own in the config's check (the batch, the
precision...); ``FREE`` fields change nothing the run depends on (logging, saving, the hub, evaluation, speed
and memory for the same result, a field the trainer does not read) and are the learner's. A config's own line
overrides the shared ``TrainingArguments`` one where its trainer reads the field differently. Values are compared
as the trainer acts on them (``EFFECTIVE``, ``SAME_RUN``). The tests compare these tables with the installed TRL's
and peft's fields, so a field a new release adds gets classed, not ignored.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any

JUDGED, FREE = "judged", "free"
# Why a run-changing field must match, by what it changes: the second half of its verdict line
WHY = {
    "sampled": "it changes how completions are sampled, and so what each group compares",
    "trained": "it changes the loss the model is trained on",
    "scored": "it changes how the rewards become advantages",
    "kept": "it changes which examples and columns reach the run",
    "optimized": "it changes the optimizer's steps, which the profile's learning rate was measured with",
    "saved": "a checkpoint without the optimizer's state cannot resume the run (section 10)",
    "adapted": "it changes which weights train and how they start",
}
# Where one field's reason says more than its kind's
FIELD_WHY = {
    "remove_unused_columns": "TRL then drops every column but 'prompt', and the rewards lose 'answer'",
    "scale_rewards": "'group' divides each advantage by its group's reward std, 'none' keeps the rewards' own scale",
}


def reason(field: str, kind: str) -> str:
    """Why a run-changing ``field`` must match: its own reason, else its kind's."""
    return FIELD_WHY.get(field, WHY[kind])


def _fields(**kinds: str) -> dict[str, str]:
    """``{field: kind}`` from ``kind="field field ..."``: the tables below, one line per kind (a field in one only)."""
    table = {name: kind for kind, names in kinds.items() for name in names.split()}
    if len(table) != sum(len(names.split()) for names in kinds.values()):
        raise ValueError("a field is classed twice")
    return table


TRAINING_ARGUMENTS = _fields(
    free=(
        "accelerator_config activation_checkpointing activation_checkpointing_kwargs average_tokens_across_devices "
        "batch_eval_metrics bf16_full_eval data_seed dataloader_in_order dataloader_multiprocessing_context "
        "dataloader_num_workers dataloader_persistent_workers dataloader_pin_memory dataloader_prefetch_factor "
        "ddp_backend ddp_broadcast_buffers ddp_bucket_cap_mb ddp_find_unused_parameters ddp_static_graph ddp_timeout "
        "debug deepspeed disable_tqdm do_eval do_predict do_train enable_jit_checkpoint eval_accumulation_steps "
        "eval_delay eval_do_concat_batches eval_on_start eval_steps eval_strategy eval_use_gather_object "
        "fp16_full_eval fsdp fsdp_config full_determinism gradient_checkpointing gradient_checkpointing_kwargs "
        "greater_is_better hub_always_push hub_model_id hub_private_repo hub_revision hub_strategy hub_token "
        "include_for_metrics include_num_input_tokens_seen label_names length_column_name liger_kernel_config "
        "load_best_model_at_end local_rank log_level log_level_replica log_on_each_node logging_first_step "
        "logging_nan_inf_filter logging_steps logging_strategy metric_for_best_model num_train_epochs "
        "parallelism_config per_device_eval_batch_size prediction_loss_only project push_to_hub report_to "
        "restore_callback_states_from_checkpoint resume_from_checkpoint run_name save_on_each_node save_steps "
        "save_total_limit seed skip_memory_metrics tf32 torch_compile torch_compile_backend torch_compile_mode "
        "torch_empty_cache_steps trackio_bucket_id trackio_space_id trackio_static_space_id train_sampling_strategy "
        "use_cache"
    ),
    judged="bf16 fp16 use_cpu gradient_accumulation_steps per_device_train_batch_size learning_rate max_steps "
           "output_dir save_strategy",
    optimized="adam_beta1 adam_beta2 adam_epsilon lr_scheduler_kwargs lr_scheduler_type optim optim_args "
              "optim_target_modules weight_decay warmup_steps max_grad_norm",
    trained="label_smoothing_factor neftune_noise_alpha use_liger_kernel",
    kept="auto_find_batch_size dataloader_drop_last ignore_data_skip remove_unused_columns",
    saved="save_only_model",
)

# GRPOConfig: the TrainingArguments above and TRL's own; the sapo_*, vespo_*, entropy_coef_* and ref_model_* fields
# are read only by a loss type or a switch that is itself classed (loss_type, use_adaptive_entropy, sync_ref_model).
# GRPO computes its own loss (no label smoothing) and its sampler yields whole generation batches (nothing to drop).
GRPO_FIELDS = {
    **TRAINING_ARGUMENTS,
    **_fields(
        free="label_smoothing_factor dataloader_drop_last model_init_kwargs trust_remote_code router_aux_loss_coef "
             "disable_dropout num_generations_eval "
             "ds3_gather_for_generation pad_to_multiple_of cache_implementation vllm_mode vllm_model_impl "
             "vllm_enable_sleep_mode vllm_server_base_url vllm_server_host vllm_server_port vllm_server_timeout "
             "vllm_group_port vllm_gpu_memory_utilization vllm_max_model_length vllm_tensor_parallel_size "
             "sapo_temperature_neg sapo_temperature_pos vespo_k_pos vespo_lambda_pos vespo_k_neg vespo_lambda_neg "
             "ref_model_mixup_alpha ref_model_sync_steps entropy_coef_min entropy_coef_max entropy_coef_delta "
             "entropy_target max_tool_calling_iterations log_completions log_multimodal num_completions_to_print "
             "log_unique_prompts log_completions_hub_repo use_transformers_continuous_batching "
             "transformers_continuous_batching_config use_transformers_paged",
        judged="num_generations max_completion_length generation_batch_size steps_per_generation use_vllm beta "
               "reward_weights",
        sampled="temperature top_p top_k min_p generation_kwargs chat_template_kwargs repetition_penalty "
                "vllm_structured_outputs_regex",
        trained="cast_lm_head_to_fp32 num_iterations epsilon delta epsilon_high importance_sampling_level loss_type "
                "mask_truncated_completions sync_ref_model top_entropy_quantile entropy_coef use_adaptive_entropy "
                "vllm_importance_sampling_correction vllm_importance_sampling_mode vllm_importance_sampling_clip_max "
                "vllm_importance_sampling_clip_min vllm_importance_sampling_cap off_policy_mask_threshold "
                "use_bias_correction_kl",
        scored="multi_objective_aggregation scale_rewards",
        kept="shuffle_dataset",
    ),
}

# SFTConfig: nothing is saved (the merged model is), the number of steps is judged from the epochs, and nothing is
# cut (max_length is judged), so neither how it would be cut nor packing's strategy matters; SFT's collator reads
# only the token columns, so the columns it leaves (remove_unused_columns=False) reach nothing
SFT_FIELDS = {
    **TRAINING_ARGUMENTS,
    **_fields(
        free="remove_unused_columns model_init_kwargs trust_remote_code router_aux_loss_coef dataset_text_field "
             "dataset_num_proc truncation_mode packing_strategy pad_to_multiple_of eval_packing activation_offloading "
             "save_strategy",
        judged="max_length num_train_epochs",
        trained="chat_template_path eos_token packing padding_free completion_only_loss assistant_only_loss "
                "loss_type pad_token",
        kept="dataset_kwargs shuffle_dataset",
    ),
}

# LoraConfig: the targets, layers, rank and scale are judged on what peft makes of them; the configs of the
# initialisations and variants are read only when init_lora_weights or a variant switch (classed) asks for them;
# peft sets fan_in_fan_out back to False on an nn.Linear, the only kind of layer the targets may name
LORA_FIELDS = _fields(
    free="fan_in_fan_out peft_type auto_mapping peft_version base_model_name_or_path revision megatron_config "
         "megatron_core runtime_config qalora_group_size loftq_config eva_config corda_config lora_ga_config "
         "ensure_weight_tying",
    judged="task_type r lora_alpha use_rslora target_modules exclude_modules layers_to_transform layers_pattern",
    adapted="inference_mode lora_dropout bias modules_to_save init_lora_weights rank_pattern "
            "alpha_pattern trainable_token_indices use_dora velora_config alora_invocation_tokens use_qalora "
            "monteclora_config layer_replication lora_bias target_parameters use_bdlora arrow_config kasa_config",
)

# Run-changing fields that may differ from the profile within a range: (lowest, highest, relative to the
# profile's value, why the range)
RANGES: dict[str, tuple[float, float, bool, str]] = {
    "temperature": (0.8, 1.2, True, "colder sampling makes a group's completions alike (more groups with no "
                                    "spread, nothing to compare), hotter makes them babble"),
    "max_grad_norm": (0.5, 2.0, True, "clipping far below the profile's norm shrinks every update; far above it "
                                      "(or 0, no clipping) one outlier batch throws the adapters off"),
    "lora_dropout": (0.0, 0.1, False, "a run of a few steps does not overfit, and dropout makes the pass that is "
                                      "trained differ from the one that sampled"),
    "weight_decay": (0.0, 0.1, False, "AdamW shrinks every weight by learning_rate x weight_decay a step, under "
                                      "0.1% at the accepted rates up to 0.1; more pulls the adapters back toward 0 "
                                      "as they learn"),
}
# Values that mean the same run
SAME_RUN: dict[str, tuple[frozenset[Any], ...]] = {
    "optim": (frozenset({"adamw_torch", "adamw_torch_fused"}),),  # the same AdamW, fused or not
    "completion_only_loss": (frozenset({None, True}),),  # None: completion only for prompt-completion data
    "min_p": (frozenset({None, 0.0}),),  # no min_p filter either way: every token stays
}


def _clip_high(config: Any) -> Any:
    """TRL clips the ratio above at ``epsilon`` when ``epsilon_high`` is None: 0.2 and None are then one run."""
    high = getattr(config, "epsilon_high", None)
    return getattr(config, "epsilon", None) if high is None else high


def _schedule(config: Any) -> Any:
    """A rate ``constant_with_warmup`` over no warmup steps is the ``constant`` one."""
    name = plain(getattr(config, "lr_scheduler_type", None))
    return "constant" if name == "constant_with_warmup" and not getattr(config, "warmup_steps", 0) else name


# Fields whose value the trainer acts on depends on another field: what it then is
EFFECTIVE: dict[str, Callable[[Any], Any]] = {"epsilon_high": _clip_high, "lr_scheduler_type": _schedule}


def plain(value: Any) -> Any:
    """A field's value as compared: an enum's value, a tuple or set as a sorted list, an empty container as None."""
    value = getattr(value, "value", value)
    if isinstance(value, (list, tuple, set, frozenset, Mapping)) and not value:
        return None
    if isinstance(value, (set, frozenset)):
        return sorted(value, key=repr)
    return list(value) if isinstance(value, tuple) else value


def same_run(field: str, yours: Any, theirs: Any) -> bool:
    """The two values make the same run: equal (floats within 1e-9 relative), or named the same by ``SAME_RUN``."""
    yours, theirs = plain(yours), plain(theirs)
    if any(yours in group and theirs in group for group in SAME_RUN.get(field, ()) if _hashable(yours, theirs)):
        return True
    if isinstance(yours, float) or isinstance(theirs, float):
        numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (yours, theirs))
        return numbers and math.isclose(yours, theirs, rel_tol=1e-9)
    return type(yours) is type(theirs) and yours == theirs


def _hashable(*values: Any) -> bool:
    try:
        return all(hash(v) is not None for v in values)
    except TypeError:
        return False


def range_problem(field: str, yours: Any, theirs: Any) -> str | None:
    """Why ``yours`` lies outside ``RANGES[field]`` around the profile's ``theirs``, or None."""
    low, high, relative, why = RANGES[field]
    if relative:
        low, high = low * theirs, high * theirs
    if isinstance(yours, (int, float)) and not isinstance(yours, bool) and low <= yours <= high:
        return None
    return f"{field}={yours!r}: the profile's is {plain(theirs)!r} (accepted: {low:g} to {high:g}); {why}"


def acted_on(config: Any, field: str) -> Any:
    """The value of ``field`` the trainer acts on (``EFFECTIVE``), else the one written."""
    return EFFECTIVE[field](config) if field in EFFECTIVE else getattr(config, field, None)


def class_default(kind: type, field: str) -> Any:
    """``field``'s default in the dataclass ``kind``; ``dataclasses.MISSING`` when it has none."""
    spec = next((f for f in dataclasses.fields(kind) if f.name == field), None)
    if spec is None:
        return dataclasses.MISSING
    return spec.default_factory() if spec.default_factory is not dataclasses.MISSING else spec.default


def value_source(field: str, reference: Any, profile: Any = None) -> str:
    """Where the expected value comes from, for the learner to copy: ``profile.<field>`` or the library's default."""
    theirs = getattr(reference, field)
    if profile is not None and hasattr(profile, field) and same_run(field, getattr(profile, field), theirs):
        return f" (profile.{field})"
    default = class_default(type(reference), field) if dataclasses.is_dataclass(reference) else dataclasses.MISSING
    if default is dataclasses.MISSING or not same_run(field, default, theirs):
        return ""
    library = type(reference).__module__.split(".")[0]
    return f" ({'TRL' if library == 'trl' else library}'s default)"


def field_problem(field: str, kind: str, config: Any, reference: Any, profile: Any = None) -> str | None:
    """Why ``config``'s ``field`` makes another run than ``reference``'s (name, value, expected, why), or None.

    Written as the reference writes it, or acted on the same: the same run (a difference that comes from the
    field an ``EFFECTIVE`` value reads is named on that field).
    """
    written, expected = getattr(config, field, None), getattr(reference, field)
    if field in RANGES:
        return range_problem(field, written, expected)
    if same_run(field, written, expected) or same_run(field, acted_on(config, field), acted_on(reference, field)):
        return None
    written, expected = plain(written), plain(expected)
    return (f"{field}={written!r}: the profile's run uses {expected!r}{value_source(field, reference, profile)}; "
            f"{reason(field, kind)}")


def field_problems(config: Any, reference: Any, table: Mapping[str, str], profile: Any = None) -> list[str]:
    """Every run-changing field of ``config`` that differs from ``reference``'s beyond its range, in words.

    ``profile``: the one ``reference`` was built from, where its fields carry the profile's names (``GRPOConfig``).
    """
    problems = (field_problem(field, kind, config, reference, profile) for field, kind in table.items()
                if kind not in (FREE, JUDGED) and hasattr(reference, field))
    return [problem for problem in problems if problem]
