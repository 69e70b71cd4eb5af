"""The checking functions for every notebook's exercises.

Each check prints a verdict with a hint and returns ``True`` or ``False``; it never raises, so a
notebook with an unanswered exercise still runs top to bottom (in CI too). An unanswered exercise
(``None`` or ``...``) is reported as such, not as wrong.
"""

from __future__ import annotations

from typing import Any

from course_utils.hardware import native_bf16


def is_unanswered(answer: Any) -> bool:
    """True for the placeholders the notebooks start with (``None`` or ``...``)."""
    return answer is None or answer is Ellipsis


def report(exercise: str, correct: bool, hint: str, answer: Any = None) -> bool:
    """Print the verdict for one exercise and return it."""
    if is_unanswered(answer):
        print(f"⏳ {exercise}: not answered yet. Hint: {hint}")
        return False
    print(f"✅ {exercise}: correct." if correct else f"❌ {exercise}: not yet. Hint: {hint}")
    return bool(correct)


def close_to(answer: Any, expected: float, tolerance: float = 1e-6) -> bool:
    """True when ``answer`` is a number within ``tolerance`` of ``expected`` (False for anything else)."""
    try:
        return abs(float(answer) - expected) <= tolerance
    except (TypeError, ValueError):
        return False


# --- 00 set-up ---------------------------------------------------------------------------------------


def check_00_profile_variable(answer: Any) -> bool:
    """Which environment variable chooses the hardware profile?"""
    correct = isinstance(answer, str) and answer.strip() == "COURSE_PROFILE"
    return report("00.1 profile variable", correct, "look at course_utils.profiles.PROFILE_ENV_VAR", answer)


def check_00_completions_per_step(answer: Any) -> bool:
    """How many completions does one optimizer step of the ``colab-t4`` profile train on?"""
    from course_utils.profiles import get_profile

    expected = get_profile("colab-t4").effective_batch_size
    return report(
        "00.2 completions per step",
        close_to(answer, expected),
        "per-device batch x gradient accumulation steps (see profiles_table())",
        answer,
    )


# --- 02 GSM8K data -----------------------------------------------------------------------------------


def check_02_gold_answer(answer: Any) -> bool:
    """What gold answer does ``extract_hash_answer`` give for ``"... Total: $1,250.\\n#### $1,250 "``?"""
    from course_utils.data import extract_hash_answer

    expected = extract_hash_answer("She earned 5*250 = $<<5*250=1250>>1,250.\n#### $1,250 ")
    correct = isinstance(answer, str) and answer == expected
    return report(
        "02.1 gold answer",
        correct,
        "a string, with the thousands separator, the $ and the surrounding spaces removed",
        answer,
    )


def check_02_rows_lost(answer: Any, dataset: Any) -> bool:
    """How many rows of ``dataset`` does the ``int_cast`` pitfall lose (``apply_pitfall`` returns None)?"""
    from course_utils.data import pitfall_outcomes

    expected = len(pitfall_outcomes("int_cast", list(dataset["answer"]))["lost"])
    return report(
        "02.2 rows lost by int()",
        close_to(answer, expected),
        "count the answers int() cannot read: thousands separators, decimals, '$' (pitfall_report has it)",
        answer,
    )


def check_02_completion_length(answer: Any, stats: Any) -> bool:
    """A ``max_completion_length`` that fits at least 90% of reference solutions with their XML wrapper.

    Too short truncates (no ``<answer>``, zero reward); more than twice what is needed wastes compute.
    """
    needed = [length + stats.xml_overhead for length in stats.reasoning_lengths]
    try:
        fits = sum(length <= int(answer) for length in needed) / len(needed)
        correct = fits >= 0.9 and int(answer) <= 2 * max(needed)
    except (TypeError, ValueError):
        correct = False
    return report(
        "02.3 completion length",
        correct,
        "take the 90th percentile of stats.reasoning_lengths and add stats.xml_overhead",
        answer,
    )


# --- 01 GRPO concepts --------------------------------------------------------------------------------


def check_01_first_advantage(answer: Any) -> bool:
    """Advantage of the first completion in the group with rewards [1, 0, 0, 0] (scale="group")."""
    from course_utils.grpo import group_advantages

    expected = group_advantages([1.0, 0.0, 0.0, 0.0], num_generations=4)[0].item()
    return report(
        "01.1 first advantage",
        close_to(answer, expected, tolerance=0.01),
        "(reward - group mean) / (sample std + 1e-4); the sample std of [1, 0, 0, 0] is 0.5",
        answer,
    )


def check_01_zero_std_fraction(answer: Any) -> bool:
    """frac_reward_zero_std for two groups of 4: rewards [2, 2, 2, 2] and [0, 2, 0, 0]."""
    from course_utils.grpo import frac_reward_zero_std

    expected = frac_reward_zero_std([2.0] * 4 + [0.0, 2.0, 0.0, 0.0], num_generations=4)
    return report(
        "01.2 frac_reward_zero_std",
        close_to(answer, expected),
        "the share of completions whose group has all-equal rewards",
        answer,
    )


# --- 03 reward functions -----------------------------------------------------------------------------


def check_03_classic_comma(answer: Any) -> bool:
    """What does the classic correctness reward give '<answer>\\n1,000\\n</answer>' when the gold is '1000'?"""
    from course_utils.rewards import classic

    completion = [{"role": "assistant", "content": "<answer>\n1,000\n</answer>"}]
    expected = classic.correctness_reward_func(None, [completion], ["1000"])[0]
    return report(
        "03.1 classic correctness on 1,000",
        close_to(answer, expected),
        "the classic version compares strings with ==",
        answer,
    )


def check_03_dotall_flag(answer: Any) -> bool:
    """Which flag of Python's ``re`` module lets ``.`` match a newline?"""
    text = str(answer).strip().removeprefix("re.") if isinstance(answer, str) else ""
    hint = "look for the flag named after 'dot' in the re docs"
    return report("03.2 regex flag", text in {"DOTALL", "S"}, hint, answer)


def check_04_prompts_per_step(answer: Any) -> bool:
    """Golden config: batch 8, accumulation 16, num_generations 8: how many distinct prompts per optimizer step?"""
    hint = "completions per step = batch x accumulation; each prompt fills one group of num_generations"
    return report("04.1 prompts per step", close_to(answer, 8 * 16 / 8), hint, answer)


def check_04_kl_field(answer: Any) -> bool:
    """Which ``GRPOConfig`` field is the KL coefficient?"""
    text = answer.strip().lower() if isinstance(answer, str) else ""
    return report("04.2 KL coefficient field", text == "beta", "it is a Greek letter; TRL's default is 0.0", answer)


def check_04_monitoring_rule(answer: Any, log_history: Any) -> bool:
    """Which monitoring rule fires on ``log_history``? (a rule name such as ``"clipped_high"``)."""
    try:
        from course_utils.monitoring import monitor

        fired = {finding.rule for finding in monitor(log_history)}
    except (TypeError, ValueError) as exc:
        print(f"⚠️ 04.3: could not read the log history ({exc}); pass the one the notebook built.")
        return False
    text = answer.strip() if isinstance(answer, str) else ""
    hint = "run monitor(log_history) and read the rule names, or look at the last columns of the frame"
    return report("04.3 monitoring rule", text in fired, hint, answer)


# --- 05 evaluation -----------------------------------------------------------------------------------

CHECKER_OPTIONS_05 = ("1000", "1,000", "$1000", "1000.0", "one thousand", "100")


def check_05_wilson_lower(answer: Any) -> bool:
    """A model solves 4 of 8 held-out problems: the lower end of the 95% Wilson interval, to 2 decimals."""
    from course_utils.evaluation import wilson_interval

    expected = wilson_interval(4, 8)[0]
    hint = "call wilson_interval(successes, n) and read the first number; 50% on 8 problems is a wide range"
    return report("05.1 Wilson lower bound for 4/8", close_to(answer, expected, 0.006), hint, answer)


def _problems_for_half_width(target: float = 0.05, rate: float = 0.5) -> int:
    from course_utils.evaluation import wilson_interval

    n = 2
    while True:
        low, high = wilson_interval(round(rate * n), n)
        if (high - low) / 2 <= target:
            return n
        n += 2


def check_05_problems_needed(answer: Any) -> bool:
    """About how many problems give a 95% interval of at most ±5 points around an accuracy of 50%?"""
    expected = _problems_for_half_width(0.05, 0.5)
    within = close_to(answer, expected, 0.1 * expected)
    hint = "try wilson_interval(n // 2, n) for growing n until (high - low) / 2 <= 0.05; any answer within 10% counts"
    return report("05.2 problems for ±5 points", within, hint, answer)


def check_05_checker_matters(answer: Any) -> bool:
    """Which of ``CHECKER_OPTIONS_05`` does ``answers_match`` accept for the gold ``"1000"`` but exact match rejects?"""
    from course_utils.rewards import answers_match

    expected = {option for option in CHECKER_OPTIONS_05 if answers_match(option, "1000") and option != "1000"}
    given = {str(a).strip() for a in answer} if isinstance(answer, (list, tuple, set)) else None
    hint = "list the strings (e.g. ['1,000', ...]) that mean 1000 but are not written '1000'; try answers_match"
    return report("05.3 math-verify versus exact match", given == expected, hint, answer)


# --- 06 troubleshooting ------------------------------------------------------------------------------


def check_06_batch_size(answer: Any) -> bool:
    """Smallest ``per_device_train_batch_size`` that works with ``gradient_accumulation_steps=3`` and 6 generations."""
    from course_utils.preflight import check

    def accepted(batch: int) -> bool:
        config = {"per_device_train_batch_size": batch, "gradient_accumulation_steps": 3, "num_generations": 6}
        return "batch-not-divisible" not in {f.code for f in check(config, hardware={"device": "cuda", "bf16": True})}

    expected = next(b for b in range(1, 100) if accepted(b))
    hint = "the generation batch is batch x accumulation steps; it must be a multiple of num_generations"
    return report("06.1 smallest batch", close_to(answer, expected), hint, answer)


def check_06_kl_switch(answer: Any) -> bool:
    """Which ``GRPOConfig`` argument must be above 0 for TRL to log ``kl``?"""
    correct = isinstance(answer, str) and answer.strip().strip("`'\"") == "beta"
    hint = "the KL coefficient; its default is 0.0 (see preflight's kl-not-logged)"
    return report("06.2 the kl switch", correct, hint, answer)


def check_06_biggest_saving(answer: Any) -> bool:
    """Which single fix in ``memory.OOM_FIXES`` lowers the estimated peak memory of ``memory.OOM_BASE`` the most?"""
    from course_utils.memory import OOM_BASE, OOM_FIXES, what_if_table

    singles = {label: change for label, change in OOM_FIXES.items() if not label.startswith("all")}
    table = what_if_table(OOM_BASE, singles).drop(index="as configured")
    expected = str(table["total_gb"].idxmin())
    correct = isinstance(answer, str) and answer.strip() == expected
    hint = "run what_if_table(OOM_BASE, OOM_FIXES) and compare total_gb; answer with the row's label"
    return report("06.3 biggest memory saving", correct, hint, answer)


# --- 99 appendix: CPU speed ----------------------------------------------------------------------------

PRECISION_CASES: tuple[tuple[str, frozenset[str]], ...] = (
    ("AVX512", frozenset({"avx2", "avx512f", "avx512_bf16"})),
    ("AVX512", frozenset({"avx2", "avx512f", "amx_bf16", "amx_tile"})),
    ("AVX512", frozenset({"avx2", "avx512f"})),
    ("AVX2", frozenset({"avx2", "fma"})),
    ("AVX2", frozenset({"avx2", "avx512f", "avx512_bf16"})),  # torch runs AVX2 kernels: bf16 is emulated
    ("DEFAULT", frozenset()),
)


def check_99_precision_rule(answer: Any) -> bool:
    """A function ``(capability, flags) -> "bf16" | "fp32"`` that picks the lab's path on a Linux machine."""
    hint = "bf16 only when torch runs AVX-512 kernels AND the flags list avx512_bf16 or amx_bf16"
    if is_unanswered(answer) or not callable(answer):
        return report("99.1 precision rule", False, hint, answer if is_unanswered(answer) else "not a function")
    differences = []
    for capability, flags in PRECISION_CASES:
        expected = "bf16" if native_bf16(capability, None, flags, "Linux")[0] else "fp32"
        try:
            got = answer(capability, set(flags))
        except Exception as error:  # a learner's bug is a verdict, not a crash
            got = f"{type(error).__name__}: {error}"
        if is_unanswered(got):
            return report("99.1 precision rule", False, hint, got)
        if got != expected:
            differences.append(f"{capability} with {sorted(flags)}: yours {got!r}, expected {expected!r}")
    for line in differences:
        print("   ", line)
    return report("99.1 precision rule", not differences, hint, answer)
