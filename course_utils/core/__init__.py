"""The facts every group reads: profiles, paths, hardware, the answer format, findings. Imports nothing of ours.

Modules: ``profiles``, ``paths``, ``hardware``, ``answer_format``, ``findings``, ``field_checks``, ``rehearsal``,
``speedups``.
"""
