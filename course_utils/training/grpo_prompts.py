"""The GRPO training prompts from a profile: GSM8K train problems, a problem list, short solutions or short prompts.

``training_dataset(profile)`` is what ``build_trainer`` trains on; ``fit_to_data`` shrinks a profile to the bundled
sample's rows for offline rooms.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from pathlib import Path
from statistics import fmean
from typing import Any

from course_utils.core.profiles import Profile, get_profile
from course_utils.lesson.data import from_bundled_sample, load_gsm8k
from course_utils.lesson.data_checks import calculator_notes, check_calculator_notes, solution_steps
from course_utils.lesson.token_lengths import prompt_token_lengths, rows_with_short_prompts
from course_utils.training import problem_choice

PROMPT_BLOCK_ROWS = 512  # GSM8K prompts rendered and counted at a time while looking for the short ones


def training_dataset(
    profile: Profile | str | None = None, folder: str | Path | None = None, tokenizer: Any = None
) -> Any:
    """The GRPO prompts: the first ``train_size`` GSM8K train problems, with ``prompt`` and gold ``answer``.

    With ``profile.problem_list`` set, the problems of that list (``training.problem_choice``), nothing else.
    With ``profile.max_solution_steps`` set, only problems whose worked solution has at most that many steps
    (``lesson.data_checks.solution_steps``). With ``profile.max_prompt_tokens`` set, the first ``train_size``
    problems whose prompt fits (the ``tokenizer`` counts them), from the rows the warm start does not use; how
    many fit is printed.
    """
    problems = load_gsm8k("train", folder, formatted=True)
    p = fit_to_data(get_profile(profile), problems)
    if p.problem_list is not None:
        return _listed_dataset(p, problems)
    if p.max_prompt_tokens is None and p.max_solution_steps is None:
        return problems.select(range(min(p.train_size, len(problems))))
    pairs = zip(problems["reasoning"], problems["answer"], strict=True)
    solutions = [f"{text}\n#### {answer}" for text, answer in pairs]
    problems = problems.select(range(min(warm_start_rows(p, solutions), default=len(problems))))  # warm start's out
    problems = _within_solution_steps(p, problems)
    if p.max_prompt_tokens is None:
        return problems.select(range(min(p.train_size, len(problems))))
    if tokenizer is None:
        raise ValueError(
            f"Profile {p.name!r} trains on prompts of at most {p.max_prompt_tokens} tokens (max_prompt_tokens): "
            "pass the tokenizer that counts them, training_dataset(profile, tokenizer=tokenizer)."
        )
    return _short_prompt_dataset(p, problems, tokenizer)


def warm_start_rows(p: Profile, solutions: Sequence[str]) -> list[int]:
    """Which train rows the warm start takes: from the *end* of the split, so GRPO's prompts (from the start) never
    include them.

    ``warm_start_reasoning="lines"``: the last ``warm_start_examples`` rows. ``"equations"``: walking back from the
    end, the rows whose calculator notes are right, end on the answer and number at most
    ``warm_start_reasoning_lines``.
    """
    if p.warm_start_reasoning == "lines":
        return list(range(max(len(solutions) - p.warm_start_examples, 0), len(solutions)))
    picked: list[int] = []
    for i in range(len(solutions) - 1, -1, -1):
        if len(picked) == p.warm_start_examples:
            break
        notes = calculator_notes(solutions[i])
        if len(notes) <= p.warm_start_reasoning_lines and not check_calculator_notes(solutions[i]):
            picked.append(i)
    if len(picked) < p.warm_start_examples:
        raise ValueError(
            f"Only {len(picked)} train problems have at most {p.warm_start_reasoning_lines} calculator notes that "
            f"are right and end on the answer; profile {p.name!r} asks for warm_start_examples="
            f"{p.warm_start_examples}: lower it, raise warm_start_reasoning_lines, or set warm_start_reasoning='lines'."
        )
    return picked[::-1]


def fit_to_data(p: Profile, train_rows: Any) -> Profile:
    """``p`` as it fits the data: unchanged for GSM8K; shrunk to the bundled sample's rows, said in one line.

    The sample (a few dozen problems, for offline rooms) holds fewer rows than a profile's warm start and GRPO
    prompts: the warm start then takes a third of them, GRPO the rest, and no problem list applies (its problems
    come from GSM8K). Other data too small for the profile stays an error (``warm_start_dataset``).
    """
    needed = p.train_size + p.warm_start_examples
    if not from_bundled_sample(train_rows) or (len(train_rows) >= needed and p.problem_list is None):
        return p
    warm = min(p.warm_start_examples, len(train_rows) // 3)
    train_size = min(p.train_size, len(train_rows) - warm)
    fitted = p.override(warm_start_examples=warm, train_size=train_size, problem_list=None)
    print(f"The bundled sample has {len(train_rows)} train problems (profile {p.name!r} wants {needed}"
          f"{f', from list {p.problem_list!r}' if p.problem_list else ''}): the warm start takes {warm} of them and "
          f"GRPO up to {fitted.train_size}. For the full lab, point GSM8K_DIR at OpenAI's GSM8K files.")  # fmt: skip
    return fitted


def _listed_dataset(p: Profile, problems: Any) -> Any:
    """The problems of the profile's ``problem_list`` (at most ``train_size``), in the list's order, said aloud."""
    listing = problem_choice.load_problem_list(p.problem_list)
    rows = problem_choice.listed_rows(problems["question"], listing)[: p.train_size]
    first = listing.get("first_screen", listing)
    again = f", sampled again {listing['samples_per_problem']} times each, most often solved first" if (
        "first_screen" in listing) else ""
    print(f"Training on the {len(rows)} problems of list {p.problem_list!r}: of {listing['screened']} problems "
          f"screened with {first['samples_per_problem']} samples each, the ones the warm start solved sometimes"
          f"{again} (data/{problem_choice.LIST_FOLDER}/{p.problem_list}.json says how it was made).")  # fmt: skip
    return problems.select(rows)


def _within_solution_steps(p: Profile, problems: Any) -> Any:
    """The problems whose worked solution has at most ``max_solution_steps`` steps (all when it is None), said aloud."""
    if p.max_solution_steps is None:
        return problems
    kept = [i for i, text in enumerate(problems["reasoning"]) if solution_steps(text) <= p.max_solution_steps]
    print(f"Problems of at most {p.max_solution_steps} solution steps: {len(kept):,} of {len(problems):,}.")
    if not kept:
        raise ValueError(f"No GSM8K train problem has at most {p.max_solution_steps} solution steps "
                         f"(max_solution_steps of profile {p.name!r}); raise it, or set it to None.")  # fmt: skip
    return problems.select(kept)


def _short_prompt_dataset(p: Profile, problems: Any, tokenizer: Any) -> Any:
    """The first ``train_size`` of ``problems`` whose prompt has at most ``max_prompt_tokens`` tokens, said aloud.

    Prompts are measured ``PROMPT_BLOCK_ROWS`` at a time, up to the block that completes ``train_size``: the
    ``cpu`` lab's 256 lie among the first ~2,300 problems, so the other ~5,000 prompts are never rendered.
    """
    candidates = problems
    lengths: list[int] = []
    kept: list[int] = []
    for start in range(0, len(candidates), PROMPT_BLOCK_ROWS):
        block = candidates.select(range(start, min(start + PROMPT_BLOCK_ROWS, len(candidates))))
        lengths += prompt_token_lengths(tokenizer, list(block["prompt"]))
        kept = rows_with_short_prompts(lengths, p.max_prompt_tokens, limit=p.train_size)
        if len(kept) == p.train_size:
            break
    if not kept:
        raise ValueError(
            f"No GSM8K train prompt has at most {p.max_prompt_tokens} tokens (max_prompt_tokens of profile "
            f"{p.name!r}); the shortest has {min(lengths, default=0)}. Raise max_prompt_tokens, or set it to None."
        )
    read = kept[-1] + 1
    print(
        f"Prompts of at most {p.max_prompt_tokens} tokens: training on the first {len(kept):,} problems that fit, "
        f"found among the first {read:,} of {len(candidates):,} (mean prompt {fmean(lengths[i] for i in kept):.0f} "
        f"tokens; {fmean(lengths[:read]):.0f} over those {read:,})."
    )
    if len(kept) < p.train_size:
        warnings.warn(
            f"Only {len(kept)} problems fit in max_prompt_tokens={p.max_prompt_tokens}, fewer than train_size="
            f"{p.train_size}: training cycles over them. Raise max_prompt_tokens for more variety.",
            stacklevel=3,
        )
    return candidates.select(kept)
