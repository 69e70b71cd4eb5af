"""The facts every group reads, and the one gate per library to its private methods. Imports nothing of ours.

Modules: ``profiles``, ``paths``, ``hardware``, ``answer_format``, ``findings``, ``field_checks``, ``rehearsal``,
``speedups``, ``trl_internals``, ``transformers_internals``, ``machine_limits``.
"""
