"""Helpers for the GRPO course: one module per topic, imported by the notebooks.

Modules: ``profiles`` (hardware profiles), ``models`` (the model, online or offline), ``data`` (GSM8K to
chat prompts), ``rewards`` (the reward functions), ``grpo`` (advantages and loss by hand, and as the
installed TRL computes them), ``training`` (``GRPOTrainer`` from a profile), ``evaluation``, ``preflight``
and ``memory``, ``plotting``, ``widgets``, ``environment`` (the set-up report) and ``exercises`` (the
checking functions, including the comparison of a learner's function with the reference).
"""

__version__ = "0.1.0"
