"""The facts every group reads, and the one gate to TRL's private methods. Imports nothing of ours.

Modules: ``profiles``, ``paths``, ``hardware``, ``answer_format``, ``findings``, ``field_checks``, ``rehearsal``,
``speedups``, ``trl_internals``, ``machine_limits``.
"""
