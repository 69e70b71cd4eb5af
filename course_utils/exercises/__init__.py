"""The checks the notebooks call, one module a notebook, on the machinery of ``verdicts``, ``comparison`` and
``real_rows``. Imports every group.

Modules: ``verdicts``, ``comparison``, ``real_rows``, ``nb00_setup``, ``nb01_grpo_concepts``, ``nb02_gsm8k_data``,
``nb03_reward_functions`` and ``nb04_train_grpo`` (packages, one module a job), ``nb05_evaluate``,
``nb06_troubleshooting``, ``nb07_grpo_variants``, ``nb08_tool_use``, ``nb99_cpu_speed``.
"""
