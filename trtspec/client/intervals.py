"""How sure is a speculative/baseline ratio? 95 % intervals from the interleaved blocks.

The load generator runs each level as blocks: one block on one model, then the same prompts and
output lengths on the other, the order alternating (ABBA). Block ``b`` gives one *paired* ratio
``r_b = m_speculative(b) / m_baseline(b)`` for any metric ``m`` measured inside the block (output
tokens/s over the block's span, the P95 request latency of the block's requests, …). Drift of a
shared machine moves both halves of a pair alike, so it cancels in ``r_b``.

The interval is Student's t on ``log r_b`` (a log makes 1.25× and 0.8× equally far from parity, and
per-block throughput ratios are close to log-normal): bounds ``ratio · exp(± t_{0.975, n−1} · sd / √n)``
with ``sd`` the spread of the ``log r_b``. It is centred on the level's *pooled* ratio (all blocks'
requests together, the figure every table shows), not on the blocks' geometric mean: a tail
quantile of 8 requests is not the quantile of 48, and the interval must hold the figure printed
beside it; the blocks give its spread. Why not a bootstrap: a level has 2-12 blocks, and a
percentile bootstrap over so few values has a handful of distinct resamples and comes out too
narrow (it would stop the measurement early on false confidence); the t-interval widens
correctly at small n and is deterministic, so the same records give the same report. With one
block there is no spread to measure: the interval is unbounded.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

from trtspec.client.metrics import Window, span, summarize

CONFIDENCE = 0.95

# two-sided 95 % quantiles of Student's t, t_{0.975, df}, df = 1 … 30
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
         2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
         2.045, 2.042)


def t975(df: int) -> float:
    """t_{0.975, df}; beyond the table, the normal quantile with the first Cornish-Fisher term
    (within 0.001 of the exact value for df > 30)."""
    if df < 1:
        raise ValueError("df must be >= 1")
    if df <= len(_T975):
        return _T975[df - 1]
    z = 1.959964
    return z + (z**3 + z) / (4 * df)


# the ratios the verdict reads, speculative / baseline, from one summary (trtspec.client.metrics.summarize)
METRICS: dict[str, tuple[str, Callable[[dict], float | None]]] = {
    "output_token_throughput": ("output tokens/s", lambda s: s["output_token_throughput"]),
    "request_latency_p95": ("P95 request latency", lambda s: s["request_latency_s"].get("p95")),
    "request_latency_p99": ("P99 request latency", lambda s: s["request_latency_s"].get("p99")),
    "ttft_p95": ("TTFT p95", lambda s: s["ttft_s"].get("p95")),
    "itl_p95": ("ITL p95", lambda s: s["itl_s"].get("p95")),
}
SPEEDUP = "output_token_throughput"  # higher is better; every other metric is a latency (lower is better)


@dataclass(frozen=True)
class Interval:
    """A ratio speculative / baseline and its 95 % interval over ``blocks`` paired blocks."""

    estimate: float | None  # the pooled ratio (all blocks' requests together)
    low: float | None  # None with no blocks; 0.0 / inf when one block leaves no spread to measure
    high: float | None
    blocks: int
    confidence: float = CONFIDENCE

    @property
    def width(self) -> float:
        """(high − low) / estimate: 0.10 means the interval spans 10 % of the ratio; inf with < 2 blocks."""
        if self.estimate is None or self.low is None or self.high is None or math.isinf(self.high):
            return math.inf
        return (self.high - self.low) / self.estimate

    def to_dict(self) -> dict:
        w = self.width
        high = None if self.high is not None and math.isinf(self.high) else self.high  # JSON has no inf
        return {"ratio": self.estimate, "low": self.low, "high": high, "blocks": self.blocks,
                "confidence": self.confidence, "width": None if math.isinf(w) else w}

    def text(self, unit: str = "x") -> str:
        """``1.13x [1.02, 1.25]``."""
        if self.estimate is None:
            return "not measured"
        hi = "∞" if self.high is None or math.isinf(self.high) else f"{self.high:.2f}"
        return f"{self.estimate:.2f}{unit} [{self.low:.2f}, {hi}]"


def ratio_interval(ratios: Sequence[float], center: float | None = None, confidence: float = CONFIDENCE) -> Interval:
    """Student-t interval on the logs of paired ratios (module docstring), around ``center`` (the
    pooled ratio; default the ratios' geometric mean)."""
    if confidence != CONFIDENCE:
        raise ValueError(f"only the {CONFIDENCE:.0%} interval is tabulated")
    logs = [math.log(r) for r in ratios if r is not None and r > 0 and math.isfinite(r)]
    n = len(logs)
    if n == 0 or (center is not None and not center > 0):
        return Interval(None, None, None, 0)
    mean = sum(logs) / n
    mid = math.log(center) if center is not None else mean
    if n == 1:
        return Interval(math.exp(mid), 0.0, math.inf, 1)
    sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / (n - 1))
    half = t975(n - 1) * sd / math.sqrt(n)
    return Interval(math.exp(mid), math.exp(mid - half), math.exp(mid + half), n)


def _blocks(windows: Sequence[Window], role: str, replica: str | None) -> dict[int, list[Window]]:
    blocks: dict[int, list[Window]] = {}
    for w in windows:
        if w.role == role and replica in (None, w.replica):
            blocks.setdefault(w.block, []).append(w)
    return blocks


def block_summaries(windows: Sequence[Window], role: str, replica: str | None = None) -> dict[int, dict]:
    """Per block: the summary of ``role``'s requests in it (a block's replicas together)."""
    return {b: summarize([r for w in ws for r in w.requests], span(ws), [r for w in ws for r in w.settling])
            for b, ws in _blocks(windows, role, replica).items()}


def pooled_summary(windows: Sequence[Window], role: str, replica: str | None = None) -> dict:
    """Every block of ``role`` together (the measured duration: Σ of the blocks' spans), as the
    load generator's level summary."""
    blocks = _blocks(windows, role, replica)
    ws = [w for b in blocks.values() for w in b]
    return summarize([r for w in ws for r in w.requests], sum(span(b) for b in blocks.values()),
                     [r for w in ws for r in w.settling])


def block_ratios(windows: Sequence[Window], metric: str, replica: str | None = None) -> list[float]:
    """``metric``'s speculative / baseline ratio in each block where both models measured it."""
    get = METRICS[metric][1]
    spec, base = block_summaries(windows, "speculative", replica), block_summaries(windows, "baseline", replica)
    out = []
    for b in sorted(set(spec) & set(base)):
        s, bb = get(spec[b]), get(base[b])
        if s is not None and bb and s > 0:
            out.append(s / bb)
    return out


def level_intervals(windows: Sequence[Window], replica: str | None = None) -> dict[str, Interval]:
    """Every metric of :data:`METRICS`: the pooled ratio and its interval over this level's blocks."""
    spec, base = pooled_summary(windows, "speculative", replica), pooled_summary(windows, "baseline", replica)
    out = {}
    for m, (_, get) in METRICS.items():
        s, b = get(spec), get(base)
        out[m] = ratio_interval(block_ratios(windows, m, replica), center=s / b if s is not None and b else None)
    return out
