"""Error bars and paired tests: how far a rate measured on a few dozen problems can be trusted.

With 8 or 50 problems, "accuracy 25%" means little without its 95% Wilson interval; and two models scored on the
same problems differ only where they disagree, which the exact McNemar test weighs. ``reward_swing``: how far a
logged mean reward moves from step to step by chance alone.
"""

from __future__ import annotations

import math
import random
from numbers import Integral, Real
from statistics import NormalDist
from typing import Any

import numpy as np


def wilson_interval(successes: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """The Wilson score interval for a rate of ``successes`` out of ``n``, as ``(low, high)``.

    Why Wilson and not the textbook ``p ± z·sqrt(p(1-p)/n)``: on small evaluation sets and rates near 0 or 1
    (format compliance before and after GRPO is exactly that), the textbook interval collapses to zero width at
    0/n and n/n and can leave [0, 1]; Wilson's stays inside [0, 1] and keeps a sensible width.

    ``n == 0`` returns ``(0.0, 1.0)``: with no observations every rate is plausible, and the widest possible
    interval says so instead of raising or inventing a number.
    """
    for name, value in (("successes", successes), ("n", n)):
        if isinstance(value, bool) or not isinstance(value, Integral):
            raise TypeError(f"{name} must be a whole number (int), got {type(value).__name__} {value!r}")
    if n < 0:
        raise ValueError(f"n must be >= 0 (the number of trials), got {n}")
    if not 0 <= successes <= n:
        raise ValueError(f"successes must be between 0 and n={n}, got {successes}")
    if isinstance(confidence, bool) or not isinstance(confidence, Real) or not 0 < confidence < 1:
        raise ValueError(f"confidence must be a number strictly between 0 and 1 (e.g. 0.95), got {confidence!r}")
    if n == 0:
        return (0.0, 1.0)
    z = NormalDist().inv_cdf(1 - (1 - confidence) / 2)
    p = successes / n
    denominator = 1 + z * z / n
    center = (p + z * z / (2 * n)) / denominator
    half_width = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denominator
    # At 0/n and n/n the bound is exactly 0 or 1 in exact arithmetic; floating point leaves ~1e-17 otherwise.
    low = 0.0 if successes == 0 else max(0.0, center - half_width)
    high = 1.0 if successes == n else min(1.0, center + half_width)
    return (low, high)


def _check_count(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise TypeError(
            f"{name} must be a whole number of problems (int), got {type(value).__name__} {value!r}; "
            "count the problems only one of the two models solved"
        )
    if value < 0:
        raise ValueError(f"{name} must be >= 0 (a count of problems), got {value}")
    return int(value)


def mcnemar_exact(only_first_right: int, only_second_right: int) -> float:
    """Two-sided exact McNemar p-value for two models scored on the same problems.

    Only the problems where the models disagree carry information: ``only_first_right`` (first solved, second
    did not) and ``only_second_right``. Under "the models are equally good", each disagreement goes either way
    with probability 1/2, so the p-value is the two-sided exact binomial test of ``min(b, c)`` in ``b + c``
    trials at p = 1/2. No disagreement (0, 0) gives 1.0: nothing suggests a difference.
    """
    b = _check_count("only_first_right", only_first_right)
    c = _check_count("only_second_right", only_second_right)
    n, k = b + c, min(b, c)
    if n == 0 or b == c:
        return 1.0
    # P(X <= k) for X ~ Binomial(n, 1/2), summed in log space so that thousands of disagreements do not overflow
    logs = [math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) - n * math.log(2) for i in range(k + 1)]
    top = max(logs)
    tail = math.exp(top) * sum(math.exp(x - top) for x in logs)
    return min(1.0, 2 * tail)


def _check_sample_counts(n: Any, c: Any, k: Any) -> None:
    for name, value in (("n", n), ("c", c), ("k", k)):
        if isinstance(value, bool) or not isinstance(value, Integral):
            raise TypeError(f"{name} must be a whole number (int), got {type(value).__name__} {value!r}")
    if n < 1:
        raise ValueError(f"n must be >= 1 (samples drawn for the problem), got {n}")
    if not 0 <= c <= n:
        raise ValueError(f"c must be between 0 and n={n} (the correct samples among them), got {c}")
    if not 1 <= k <= n:
        raise ValueError(f"k must be between 1 and n={n}: pass@k needs at least k samples per problem, got {k}")


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased estimate of pass@k from ``n`` samples of one problem, ``c`` of them correct (Chen et al., 2021).

    pass@k is the chance that at least one of ``k`` samples is right: ``1 - C(n-c, k) / C(n, k)``. The binomial
    coefficients overflow for large ``n``, so it is computed as the product ``prod_{i=n-c+1}^{n} (1 - k/i)``,
    which is the same ratio term by term. Drawing exactly ``k`` samples and checking "any right" is unbiased
    too but noisier; with ``n > k`` every subset of ``k`` is averaged.
    """
    _check_sample_counts(n, c, k)
    if n - c < k:  # every subset of k samples holds a correct one
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def bootstrap_interval(
    values: Any, confidence: float = 0.95, resamples: int = 2000, seed: int = 0
) -> tuple[float, float]:
    """A percentile bootstrap interval for the mean of per-problem ``values`` (problems resampled, seeded).

    For sampled pass@1 and pass@k, each problem contributes a fraction, not a 0/1, so Wilson does not apply;
    resampling the problems keeps the interval about the problems evaluated, the source of most of the noise.
    """
    data = [float(v) for v in values]
    if not data:
        raise ValueError("values is empty: pass one value per evaluated problem")
    if isinstance(confidence, bool) or not isinstance(confidence, Real) or not 0 < confidence < 1:
        raise ValueError(f"confidence must be a number strictly between 0 and 1 (e.g. 0.95), got {confidence!r}")
    if isinstance(resamples, bool) or not isinstance(resamples, Integral) or resamples < 100:
        raise ValueError(f"resamples must be a whole number >= 100, got {resamples!r}")
    generator = random.Random(seed)
    n = len(data)
    means = sorted(sum(generator.choices(data, k=n)) / n for _ in range(resamples))
    tail = (1 - confidence) / 2
    low, high = means[int(tail * (resamples - 1))], means[math.ceil((1 - tail) * (resamples - 1))]
    return (low, high)


def reward_swing(rewards: Any, completions_per_step: int, steps: int = 500, seed: int = 0) -> float:
    """How far the logged mean reward moves from step to step by chance alone (its standard deviation).

    Each simulated step draws ``completions_per_step`` rewards (with replacement) from ``rewards`` (real
    reward values, e.g. a reward function applied to real completions) and averages them, as TRL's
    ``reward`` metric does. Why: a curve that swings by +-0.3 with 4 completions per step can be pure
    sampling noise; the swing shrinks like 1 / sqrt(completions per step).
    """
    pool = np.asarray(list(rewards), dtype=float)
    if pool.size == 0:
        raise ValueError("rewards is empty: pass the reward values of some real completions")
    if completions_per_step < 1 or steps < 2:
        raise ValueError("completions_per_step must be >= 1 and steps >= 2")
    rng = np.random.default_rng(seed)
    means = rng.choice(pool, size=(steps, completions_per_step)).mean(axis=1)
    return float(means.std())
