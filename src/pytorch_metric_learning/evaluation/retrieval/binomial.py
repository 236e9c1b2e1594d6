"""Exact (Clopper-Pearson) intervals for a proportion, such as Recall@K over queries.

Recall@K and precision@1 are 0 or 1 per query, so their average over independent queries
is a binomial proportion. Near 0 and 1 the percentile bootstrap cannot see outside the
sample (all 30 queries right gives the interval [1, 1]) and covers far less than promised;
the Clopper-Pearson interval inverts two one-sided binomial tests and covers at least its
nominal level for every true rate and every number of queries. Its ends are quantiles of
beta distributions, ``Beta(x, n - x + 1)`` and ``Beta(x + 1, n - x)``.

The beta quantile is found without SciPy: the regularized incomplete beta function
``I_p(a, b)`` is evaluated by its continued fraction (modified Lentz's method, as in
Numerical Recipes, section 6.4, on the side of ``p`` where it converges fast) and inverted
by bisection, which cannot fail to converge because ``I_p`` increases with ``p``; it stops
when the bracket is within a relative 1e-15 of the quantile (about 50 halvings).
"""

from __future__ import annotations

import math

from ..._validation import invalid

__all__ = ["clopper_pearson", "regularized_incomplete_beta", "beta_quantile"]

_TINY = 1e-300
_EPSILON = 1e-16
_MAX_TERMS = 100_000
_BISECTIONS = 200
_RELATIVE_TOLERANCE = 1e-15


def regularized_incomplete_beta(p: float, a: float, b: float) -> float:
    """``I_p(a, b)``: the probability that a ``Beta(a, b)`` variable is at most ``p``.

    Example:
        >>> round(regularized_incomplete_beta(0.5, 2.0, 2.0), 12)
        0.5
    """
    if p <= 0.0:
        return 0.0
    if p >= 1.0:
        return 1.0
    log_front = (
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(p) + b * math.log1p(-p)
    )
    if p < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _continued_fraction(p, a, b) / a
    return 1.0 - math.exp(log_front) * _continued_fraction(1.0 - p, b, a) / b


def _continued_fraction(p: float, a: float, b: float) -> float:
    """The continued fraction of ``I_p(a, b)`` by the modified Lentz method."""
    c, d = 1.0, 1.0 - (a + b) * p / (a + 1.0)
    d = 1.0 / (d if abs(d) > _TINY else _TINY)
    result = d
    for m in range(1, _MAX_TERMS):
        for numerator in (
            m * (b - m) * p / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * p / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > _TINY else _TINY)
            c = 1.0 + numerator / c
            c = c if abs(c) > _TINY else _TINY
            result *= d * c
        if abs(d * c - 1.0) < _EPSILON:
            return result
    raise ArithmeticError(f"The incomplete beta I_{p}({a}, {b}) did not converge.")


def beta_quantile(q: float, a: float, b: float) -> float:
    """The ``q`` quantile of ``Beta(a, b)``: the ``p`` with ``I_p(a, b) = q``, by bisection.

    Example:
        >>> round(beta_quantile(0.5, 3.0, 3.0), 12)
        0.5
    """
    if not 0.0 <= q <= 1.0 or a <= 0 or b <= 0:
        raise invalid("q, a, b", "beta_quantile", "q in [0, 1] and a, b > 0", (q, a, b))
    low, high = 0.0, 1.0
    for _ in range(_BISECTIONS):
        middle = 0.5 * (low + high)
        if high - low <= _RELATIVE_TOLERANCE * high:
            break
        if regularized_incomplete_beta(middle, a, b) < q:
            low = middle
        else:
            high = middle
    return 0.5 * (low + high)


def clopper_pearson(successes: int, trials: int, level: float = 0.95) -> tuple[float, float]:
    """The Clopper-Pearson ("exact") interval of a binomial proportion.

    Args:
        successes: Queries whose value is 1 (e.g. those with a relevant item in the top K).
        trials: Queries.
        level: Nominal coverage in (0, 1).

    Returns:
        ``(low, high)``; ``low`` is 0 when ``successes`` is 0 and ``high`` is 1 when it is
        ``trials``. NaN for no trials.

    Example:
        >>> low, high = clopper_pearson(30, 30)
        >>> round(low, 4), high
        (0.8843, 1.0)
    """
    owner = "clopper_pearson"
    for param, value in (("successes", successes), ("trials", trials)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise invalid(param, owner, "a non-negative int", value)
    if successes > trials:
        raise invalid("successes", owner, f"at most 'trials' ({trials})", successes)
    if isinstance(level, bool) or not isinstance(level, (int, float)) or not 0 < level < 1:
        raise invalid("level", owner, "a float strictly between 0 and 1 (e.g. 0.95)", level)
    if trials == 0:
        return float("nan"), float("nan")
    tail = (1.0 - level) / 2.0
    low = 0.0 if successes == 0 else beta_quantile(tail, successes, trials - successes + 1)
    high = (
        1.0 if successes == trials else beta_quantile(1 - tail, successes + 1, trials - successes)
    )
    return low, high
