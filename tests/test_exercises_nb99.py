"""Appendix 99's check: the precision rule."""

from __future__ import annotations

from course_utils.exercises import nb99_cpu_speed as nb99


def test_precision_rule_accepts_a_right_rule_and_names_a_wrong_ones_cases(capsys):
    def right(capability, flags):
        native = capability == "AVX512" and bool({"avx512_bf16", "amx_bf16"} & flags)
        return "bf16" if native else "fp32"

    def flags_only(capability, flags):  # forgets that torch's AVX2 kernels emulate bf16
        return "bf16" if {"avx512_bf16", "amx_bf16"} & flags else "fp32"

    def crashes(capability, flags):
        raise KeyError(capability)

    assert nb99.check_99_precision_rule(right)
    assert not nb99.check_99_precision_rule(flags_only)
    assert "AVX2 with ['avx2', 'avx512_bf16', 'avx512f']: yours 'bf16'" in capsys.readouterr().out
    assert not nb99.check_99_precision_rule(lambda capability, flags: "fp32")
    assert not nb99.check_99_precision_rule(crashes)
    assert not nb99.check_99_precision_rule(lambda capability, flags: ...)
    assert "not answered" in capsys.readouterr().out
