"""Did GRPO help, and at what cost: held-out generation, intervals and paired tests, variants. Imports core to training.

Modules: ``stats``, ``metrics``, ``tables``, ``heldout``, ``sampling``, ``curves``, ``variants``, ``variant_tables``,
``reward_hack``, ``tool_eval``.
"""
