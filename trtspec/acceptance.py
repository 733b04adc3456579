"""The acceptance maths: expected tokens per target pass, expected speedup, break-even
acceptance, and the latency percentile. Pure Python (no torch, no numpy): the client, the
router stub, ``tune`` and the reports share it.

Notation (Leviathan et al. 2023, generalised to per-position acceptance): ``alphas[i]`` is the
probability that draft position i is accepted given every earlier one was; ``k`` the draft
length; ``cost_ratio`` c = one draft step / one target step; ``verify_ratio`` v_k = one target
pass over k+1 tokens / one target step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


def ema(old: float | None, x: float, a: float) -> float:
    """Exponential moving average with weight ``a`` on the new sample ``x`` (the first sample
    starts it): how the engine and the router keep the costs the formulas below take."""
    return x if old is None else (1 - a) * old + a * x


@dataclass
class TuneRow:
    """One row of the max_draft_len recommendation (torch runtime or trtllm-bench)."""

    k: int
    expected_tokens_per_pass: float
    cost_per_pass: float  # in units of one ordinary target step
    expected_speedup: float


def expected_tokens(alphas: list[float], k: int) -> float:
    """Tokens per target pass when drafting k: 1 + Σ_{i≤k} Π_{j≤i} α_j (Leviathan et al.,
    generalised from a constant α to measured per-position acceptance)."""
    total, run = 1.0, 1.0
    for i in range(k):
        a = alphas[i] if i < len(alphas) else (alphas[-1] if alphas else 0.0)
        run *= a
        total += run
    return total


def expected_speedup(alphas: list[float], k: int, cost_ratio: float, verify_ratio: float = 1.0) -> float:
    """Speedup over ordinary decoding for draft length k: E[tokens] / (k·c + v_k), where
    c = draft step / target step and v_k = target pass over k+1 tokens / target step."""
    if k == 0:
        return 1.0
    return expected_tokens(alphas, k) / (k * cost_ratio + verify_ratio)


def break_even_acceptance(cost_ratio: float, k: int = 1, verify_ratio: float = 1.0) -> float:
    """Smallest constant per-token acceptance α for which drafting k tokens beats ordinary decoding."""
    lo, hi = 0.0, 1.0
    if expected_speedup([1.0], k, cost_ratio, verify_ratio) < 1:
        return 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if expected_speedup([mid], k, cost_ratio, verify_ratio) < 1:
            lo = mid
        else:
            hi = mid
    return hi


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default), q in [0, 100]."""
    if not values:
        return math.nan
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)
