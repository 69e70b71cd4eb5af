"""A ``GRPOTrainer`` run from a profile, and what is checked before and during it. Imports core and lesson.

Modules: ``grpo_config``, ``config_tables``, ``lora_setup``, ``grpo_prompts``, ``run``, ``trained_model``,
``run_folder``, ``warm_start``, ``run_logs``, ``run_callbacks``, ``monitoring``, ``collapse``, ``preflight``,
``config_reading``, ``preflight_memory``, ``model_shape``, ``memory``, ``memory_parts``, ``memory_measurement``,
``problem_choice``, ``lab``, ``tool_lab``.
"""
