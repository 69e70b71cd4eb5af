"""What a learner builds in notebooks 01 to 03: data, model loading, rewards, GRPO by hand. Imports core.

Modules: ``data``, ``formatting``, ``data_checks``, ``token_lengths``, ``models``, ``offline_model``,
``generation``, ``local_model``, ``tiny_qwen``, ``tool_use``, ``rewards`` (a package), ``grpo``, ``trl_grpo``,
``multi_reward``, ``plotting``, ``evaluation_plots``, ``widgets``, ``environment``.
"""
