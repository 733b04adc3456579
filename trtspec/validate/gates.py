"""Rollout gates → verdict. Every gate must pass to deploy speculative; otherwise keep the baseline.

A gate whose value could not be measured fails: the verdict must be earned, not assumed.

Speed and latency are ratios speculative / baseline with a 95 % interval over the interleaved
blocks (trtspec.client.intervals), and a gate reads the interval's conservative side: the speedup
passes when its *lower* bound reaches ``min_speedup``; a tail-latency ratio passes when its
*upper* bound is at most ``1 + latency_tolerance``, at every validated concurrency. So a noisy
measurement keeps the baseline rather than deploying on luck.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from trtspec.client.intervals import METRICS, SPEEDUP, Interval

DEPLOY = "deploy speculative"
KEEP = "keep baseline"


LATENCY_METRICS = ("request_latency_p95", "request_latency_p99", "ttft_p95", "itl_p95")


@dataclass
class GateResult:
    name: str
    passed: bool
    value: float | None  # what the gate compared: for ratios, the interval's conservative bound
    threshold: float
    comparison: str  # ">=" | "<="
    detail: str
    concurrency: int | None = None
    interval: dict | None = None  # Interval.to_dict() of the ratio this gate judged

    @property
    def margin(self) -> float:
        """How far inside its threshold the value is, relative to it (< 0: failed; -inf: not measured)."""
        if self.value is None or not math.isfinite(self.value):
            return -math.inf
        d = self.value - self.threshold if self.comparison == ">=" else self.threshold - self.value
        return d / self.threshold if self.threshold else d

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Comparison:
    """One metric at one level: both models' figures over all blocks, and the ratio's interval."""

    metric: str  # a key of trtspec.client.intervals.METRICS
    speculative: float | None
    baseline: float | None
    interval: Interval

    @property
    def label(self) -> str:
        return METRICS[self.metric][0]


@dataclass
class Verdict:
    gates: list[GateResult] = field(default_factory=list)
    # the per-level table: {concurrency, metric, label, speculative, baseline, interval, bound, limit, passed, gated}
    levels: list[dict] = field(default_factory=list)

    @property
    def deploy_speculative(self) -> bool:
        return bool(self.gates) and all(g.passed for g in self.gates)

    @property
    def decision(self) -> str:
        return DEPLOY if self.deploy_speculative else KEEP

    @property
    def failed(self) -> list[GateResult]:
        return [g for g in self.gates if not g.passed]

    @property
    def decided_by(self) -> GateResult | None:
        """The gate that decided: the first that failed; when all passed, the measured ratio closest
        to its threshold (equivalence at a 0 % allowance sits on its threshold by design)."""
        if self.failed:
            return self.failed[0]
        ratios = [g for g in self.gates if g.interval is not None] or self.gates
        return min(ratios, key=lambda g: g.margin, default=None)

    @property
    def reason(self) -> str:
        g = self.decided_by
        if g is None:
            return "no gate was evaluated"
        if self.failed:
            more = len(self.failed) - 1
            return f"{g.name} failed: {g.detail}" + (f" ({more} more gate{'s' if more > 1 else ''} failed)" if more else "")
        return f"all {len(self.gates)} gates passed; the closest: {g.name}: {g.detail}"

    def to_dict(self) -> dict:
        g = self.decided_by
        return {"decision": self.decision, "deploy_speculative": self.deploy_speculative,
                "decided_by": g.name if g else None, "reason": self.reason,
                "gates": [g.to_dict() for g in self.gates], "failed": [g.name for g in self.failed],
                "levels": self.levels}


def _fmt(v: float | None, pct: bool = False) -> str:
    if v is None:
        return "not measured"
    return f"{v:.1%}" if pct else f"{v:.3f}"


def _figure(metric: str, v: float | None) -> str:
    if v is None:
        return "–"
    return f"{v:.1f} tok/s" if metric == SPEEDUP else f"{v * 1e3:.1f} ms"


def _bound_text(iv: Interval, side: str) -> str:
    if iv.blocks == 0:
        return "not measured"
    if iv.blocks == 1:
        return "one block only: no spread to measure (raise validation.max_requests_per_level)"
    return f"{side} bound {iv.low if side == 'lower' else iv.high:.2f}"


def level_comparisons(bench) -> dict[int, dict[str, Comparison]]:
    """{concurrency: {metric: Comparison}} for a closed-loop ``BenchResult`` with a baseline."""
    out: dict[int, dict[str, Comparison]] = {}
    for lv in bench.levels:
        s, b, ivs = lv.summary("speculative"), lv.summary("baseline"), lv.intervals()
        out[lv.concurrency] = {m: Comparison(m, get(s), get(b), ivs[m]) for m, (_, get) in METRICS.items()}
    return out


def _level_gate(c: int, cmp: Comparison, tolerance: float) -> GateResult:
    iv, limit = cmp.interval, 1 + tolerance
    high = iv.high if iv.blocks >= 2 else None
    return GateResult(
        f"{cmp.label} at concurrency {c}", high is not None and high <= limit, high, limit, "<=",
        f"speculative {_figure(cmp.metric, cmp.speculative)} vs baseline {_figure(cmp.metric, cmp.baseline)}: "
        f"ratio {iv.text()} ({iv.blocks} blocks); {_bound_text(iv, 'upper')}, needs <= {limit:.2f}",
        concurrency=c, interval=iv.to_dict())


def evaluate(gates, *, mismatch_rate: float | None, exact_match_rate: float | None, tolerance: int,
             speedup: Interval | None, acceptance_rate: float | None, acceptance_source: str,
             sampled=None, levels: dict[int, dict[str, Comparison]] | None = None) -> Verdict:
    """``gates`` is the recipe's ``validation.gates`` (``trtspec.config.Gates``); ``speedup`` the output
    tokens/s ratio's interval at ``gates.at_concurrency``; ``levels`` every validated level's
    comparisons (:func:`level_comparisons`), for the tail gates and the per-level table."""
    v = Verdict()
    tol = "exact" if tolerance == 0 else f"first {tolerance} tokens"
    v.gates.append(GateResult(
        "greedy equivalence", mismatch_rate is not None and mismatch_rate <= gates.max_mismatch_rate,
        mismatch_rate, gates.max_mismatch_rate, "<=",
        f"mismatch rate {_fmt(mismatch_rate, True)} ({tol}; exact matches {_fmt(exact_match_rate, True)}), "
        f"allowed {gates.max_mismatch_rate:.1%}"))
    low = speedup.low if speedup is not None and speedup.blocks >= 2 else None
    speed = GateResult(
        "speedup", low is not None and low >= gates.min_speedup, low, gates.min_speedup, ">=",
        f"output tokens/s speculative / baseline at concurrency {gates.at_concurrency}: "
        f"{'not measured' if speedup is None else f'{speedup.text()} ({speedup.blocks} blocks)'}; "
        f"{'not measured' if speedup is None else _bound_text(speedup, 'lower')}, needs >= {gates.min_speedup:.2f}",
        concurrency=gates.at_concurrency, interval=None if speedup is None else speedup.to_dict())
    v.gates.append(speed)
    v.gates.append(GateResult(
        "acceptance", acceptance_rate is not None and acceptance_rate >= gates.min_acceptance_rate,
        acceptance_rate, gates.min_acceptance_rate, ">=",
        f"acceptance rate {_fmt(acceptance_rate)} ({acceptance_source}), needs >= {gates.min_acceptance_rate:.2f}"))
    if sampled is not None:  # an equivalence.SampledResult
        v.gates.append(GateResult(
            "sampled distribution", sampled.passed, sampled.min_p_value, sampled.threshold, ">=",
            f"{len(sampled.tests)} chi-square tests (speculative vs baseline token frequencies, "
            f"{sampled.samples} samples each): min p = {_fmt(sampled.min_p_value)}, needs >= "
            f"{sampled.threshold:.2g} (alpha {sampled.alpha:g}, Bonferroni); max total variation "
            f"{_fmt(sampled.max_total_variation)}"
            + ("" if sampled.conclusive else "; INCONCLUSIVE: no speculated position had two categories with "
               "enough samples to compare; raise validation.sampled_check_samples")))
    for c in sorted(levels or {}):
        for metric, cmp in levels[c].items():
            iv = cmp.interval
            row = {"concurrency": c, "metric": metric, "label": cmp.label, "speculative": cmp.speculative,
                   "baseline": cmp.baseline, "interval": iv.to_dict()}
            if metric in LATENCY_METRICS:
                if gates.latency_tolerance is None:  # tail gates off: shown, not gated
                    row.update(bound="upper", limit=None, passed=None, gated=False)
                else:
                    g = _level_gate(c, cmp, gates.latency_tolerance)
                    v.gates.append(g)
                    row.update(bound="upper", limit=g.threshold, passed=g.passed, gated=True)
            else:  # throughput: gated at at_concurrency (the speedup gate), shown at every level
                gated = c == gates.at_concurrency
                row.update(bound="lower", limit=gates.min_speedup if gated else None,
                           passed=speed.passed if gated else None, gated=gated)
            v.levels.append(row)
    return v


def _ratio(v: float | None) -> str:
    return "–" if v is None else f"{v:.2f}x"


def brackets(iv: dict | None) -> str:
    """An interval dict (``Interval.to_dict()``) as ``[low, high]``."""
    if not iv or iv.get("ratio") is None:
        return "–"
    hi = iv.get("high")
    return f"[{iv['low']:.2f}, {'∞' if hi is None or math.isinf(hi) else f'{hi:.2f}'}]"


def level_table(levels: list[dict]) -> list[str]:
    """The verdict's per-level table (``Verdict.to_dict()["levels"]``): both models, the ratio
    speculative / baseline, its 95 % interval, the bound a gate reads and pass/fail."""
    lines = ["| concurrency | metric | speculative | baseline | ratio spec / base | 95 % interval | blocks | "
             "gate (bound) | result |", "|---:|---|---:|---:|---:|---:|---:|---|---|"]
    for r in levels:
        tput = r["metric"] == "output_token_throughput"

        def fig(v):
            return "–" if v is None else (f"{v:.1f} tok/s" if tput else f"{v * 1e3:.1f} ms")
        iv = r["interval"]
        gate = (f"{r['bound']} >= {r['limit']:.2f}" if tput else f"{r['bound']} <= {r['limit']:.2f}") \
            if r.get("gated") else "not gated here"
        result = "–" if r.get("passed") is None else ("PASS" if r["passed"] else "**FAIL**")
        lines.append(f"| {r['concurrency']} | {r['label']} | {fig(r['speculative'])} | {fig(r['baseline'])} | "
                     f"{_ratio(iv.get('ratio'))} | {brackets(iv)} | {iv.get('blocks', 0)} | {gate} | {result} |")
    return lines
