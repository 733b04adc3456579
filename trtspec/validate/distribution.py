"""Two-sample tests on categorical counts (token frequencies), without scipy.

Chi-square test of homogeneity for a 2×k table: X² = Σ (O − E)² / E with E from the pooled
margins, k − 1 degrees of freedom; its p-value is the chi-square survival function
Q(k/2, x/2), the regularized upper incomplete gamma function (Numerical Recipes §6.2: series
for x < a + 1, continued fraction otherwise).
"""

from __future__ import annotations

import math
from collections import Counter


def _gamma_p_series(a: float, x: float) -> float:
    term = total = 1.0 / a
    n = a
    for _ in range(10_000):
        n += 1
        term *= x / n
        total += term
        if abs(term) < abs(total) * 1e-15:
            break
    return total * math.exp(-x + a * math.log(x) - math.lgamma(a))


def _gamma_q_fraction(a: float, x: float) -> float:
    tiny = 1e-300
    b = x + 1.0 - a
    c = 1.0 / tiny
    d = 1.0 / b
    h = d
    for i in range(1, 10_000):
        an = -i * (i - a)
        b += 2.0
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1.0 / d
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-15:
            break
    return math.exp(-x + a * math.log(x) - math.lgamma(a)) * h


def chi2_sf(x: float, dof: int) -> float:
    """P(X ≥ x) for X ~ chi-square with ``dof`` degrees of freedom."""
    if dof <= 0:
        return 1.0
    if x <= 0:
        return 1.0
    a, y = dof / 2.0, x / 2.0
    if y < a + 1.0:
        return max(0.0, 1.0 - _gamma_p_series(a, y))
    return min(1.0, _gamma_q_fraction(a, y))


def pool_rare(a: Counter, b: Counter, min_expected: float = 5.0) -> tuple[list[int], list[int]]:
    """Columns of the 2×k table, with categories whose expected count is below ``min_expected``
    in either row merged into one "other" column (the usual validity condition of the test)."""
    na, nb = sum(a.values()), sum(b.values())
    n = na + nb
    keep, other_a, other_b = [], 0, 0
    for cat in sorted(set(a) | set(b), key=str):
        tot = a.get(cat, 0) + b.get(cat, 0)
        if min(na, nb) * tot / n >= min_expected:
            keep.append((a.get(cat, 0), b.get(cat, 0)))
        else:
            other_a += a.get(cat, 0)
            other_b += b.get(cat, 0)
    if other_a + other_b:
        keep.append((other_a, other_b))
    return [x for x, _ in keep], [y for _, y in keep]


def chi_square_homogeneity(a: Counter, b: Counter, min_expected: float = 5.0) -> tuple[float, int, float, int]:
    """(X², dof, p-value, categories after pooling) for "a and b come from one distribution"."""
    ra, rb = pool_rare(a, b, min_expected)
    na, nb = sum(ra), sum(rb)
    k = len(ra)
    if k < 2 or na == 0 or nb == 0:
        return 0.0, 0, 1.0, k
    n = na + nb
    x2 = 0.0
    for oa, ob in zip(ra, rb):
        col = oa + ob
        ea, eb = na * col / n, nb * col / n
        x2 += (oa - ea) ** 2 / ea + (ob - eb) ** 2 / eb
    return x2, k - 1, chi2_sf(x2, k - 1), k


def total_variation(a: Counter, b: Counter) -> float:
    """½ Σ |p_a − p_b| over the empirical distributions (0 = identical, 1 = disjoint)."""
    na, nb = sum(a.values()), sum(b.values())
    if not na or not nb:
        return 0.0
    return 0.5 * sum(abs(a.get(c, 0) / na - b.get(c, 0) / nb) for c in set(a) | set(b))


def pooled_total_variation(a: Counter, b: Counter, min_expected: float = 5.0) -> float:
    """Total variation over the categories :func:`chi_square_homogeneity` compares. Empirical TV
    over many rare categories is large even for identical distributions; pooled, it is not."""
    ra, rb = pool_rare(a, b, min_expected)
    na, nb = sum(ra), sum(rb)
    if not na or not nb:
        return 0.0
    return 0.5 * sum(abs(x / na - y / nb) for x, y in zip(ra, rb))
