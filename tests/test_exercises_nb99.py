"""Appendix 99's check, three ways: the course's rule passes, the learner's stub reads "not answered yet" (and the
notebook continues with the package's rule), and plausible wrong rules fail, a forgotten ``return`` included.
"""

from __future__ import annotations

import pytest
from notebook_code import exercise

from course_utils.exercises import nb99_cpu_speed as nb99


def capability_only(capability, flags):  # no bf16 check: AVX-512 alone is not bf16
    return "bf16" if capability == "AVX512" else "fp32"


def flags_only(capability, flags):  # forgets that torch's AVX2 kernels emulate bf16
    return "bf16" if {"avx512_bf16", "amx_bf16"} & set(flags) else "fp32"


def missing_return(capability, flags):  # the fp32 branch forgets its return: None there
    if capability == "AVX512" and {"avx512_bf16", "amx_bf16"} & set(flags):
        return "bf16"


def any_amx_flag(capability, flags):  # AMX tiles are not AMX's bf16 instructions
    return "bf16" if capability == "AVX512" and any(f.startswith(("amx", "avx512_bf16")) for f in flags) else "fp32"


def always_fp32(capability, flags):
    return "fp32"


def crashes(capability, flags):
    return {"AVX512": "bf16", "AVX2": "fp32"}[capability]  # no DEFAULT


WRONG_RULES = {  # the wrong rule, the machine it must be caught on
    capability_only: "AVX512 with ['avx2', 'avx512f']: the reference returns 'fp32', yours returns 'bf16'",
    flags_only: "AVX2 with ['avx2', 'avx512_bf16', 'avx512f']: the reference returns 'fp32', yours returns 'bf16'",
    missing_return: "AVX512 with ['avx2', 'avx512f']: the reference returns 'fp32', yours returns None",
    any_amx_flag: "AVX512 with ['amx_tile', 'avx2', 'avx512f']",
    always_fp32: "AVX512 with ['avx2', 'avx512_bf16', 'avx512f']: the reference returns 'bf16'",
    crashes: "DEFAULT with []: the reference returns 'fp32', yours raises KeyError",
}


def test_99_1_solution_passes_and_is_handed_back(capsys):
    solution = exercise("99", "choose_precision")
    assert nb99.check_99_precision_rule(solution) is solution
    out = capsys.readouterr().out
    assert out.startswith("✅ 99.1 precision rule") and "continues with yours" in out


def test_99_1_stub_reads_not_answered_and_the_package_takes_over(capsys):
    stub = exercise("99", "choose_precision", copy="notebooks")
    assert nb99.check_99_precision_rule(stub) is nb99.precision_rule
    out = capsys.readouterr().out
    assert out.startswith("⏳ 99.1 precision rule: not answered yet")
    assert "continues with the package's precision_rule" in out


@pytest.mark.parametrize("wrong", sorted(WRONG_RULES, key=lambda f: f.__name__), ids=lambda f: f.__name__)
def test_99_1_wrong_rules_fail_naming_the_machine(wrong, capsys):
    assert nb99.check_99_precision_rule(wrong) is nb99.precision_rule
    out = capsys.readouterr().out
    assert out.startswith("❌ 99.1 precision rule: differs from the reference")  # a missing return too
    assert WRONG_RULES[wrong] in out


def test_99_1_the_package_s_rule_matches_native_bf16_on_every_case():
    assert [nb99.precision_rule(*case.args) for case in nb99.precision_cases()] == [
        "bf16", "bf16", "fp32", "fp32", "fp32", "fp32", "fp32", "fp32"
    ]  # fmt: skip
