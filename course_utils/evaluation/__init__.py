"""Did GRPO help, and at what cost: held-out generation, pass@k, intervals, variants. Imports core to training.

Modules: ``heldout``, ``variants``.
"""
