"""The router's policy: traffic split, rolling acceptance, break-even fallback, probing.

Pure and thread-safe; the router model (``backend_router``) asks :meth:`RoutingPolicy.route`
for each request and reports each finished request back.

* Split: a deterministic credit counter sends exactly ``speculative_fraction`` of requests to the
  speculative model (0.5 → every other request), so small runs and tests see the configured share.
* Fallback: the rolling acceptance rate (accepted / drafted over the last ``window`` draft tokens)
  is compared with break-even. Below it, speculative-bound requests go to the baseline, except
  every ``probe_every``-th (a probe), whose result refreshes the window so the router can recover.
* Break-even: ``min_acceptance_rate`` if the recipe sets it; else derived from measured costs:
  c = draft time per draft token / target step, v = verify time per pass / target step (target step
  from baseline requests; before any, the verify pass stands in for it). Both engines also pay a
  fixed cost per pass outside drafting and verifying (sampling, bookkeeping, sending the step's
  tokens): measured per request as decode time − draft − verify over its passes, it joins the
  target step (baseline) and the verify pass (speculative), since speculation pays it once per
  pass instead of once per token. A fast target (INT8 kernels) makes that share large: leaving it
  out would fall back where speculation still wins. Costs are kept per batch size (the engine's
  ``mean_batch`` per request, rounded): a verify pass over 4 rows is compared with a target step
  over 4 rows, never with one over 1 (mixing them swung the break-even from 0.29 to 0.53 and back
  to 0 within one validation run). The per-token break-even
  α* (Leviathan et al.: speedup (1-α^{k+1})/((1-α)(k·c+v)) = 1) is converted to the acceptance rate
  it implies at the mean draft length k, r* = (α + … + α^k) / k, which is what the window measures.
"""

from __future__ import annotations

import collections
import threading
from dataclasses import dataclass
from trtspec.acceptance import break_even_acceptance, ema


def acceptance_rate_at(alpha: float, k: int) -> float:
    """Expected accepted/drafted for a per-token acceptance ``alpha`` and draft length ``k``
    (draft position i is accepted with probability α^i: every earlier one must be)."""
    if k <= 0:
        return 0.0
    return sum(alpha**i for i in range(1, k + 1)) / k


@dataclass(frozen=True)
class Decision:
    speculative: bool
    reason: str  # "speculative" | "fraction" | "fallback" | "probe" | "no-speculative-model"


class _Ema:
    def __init__(self, a: float = 0.2):
        self.a, self.value = a, None

    def add(self, x: float) -> None:
        self.value = ema(self.value, x, self.a)


def _batch(perf: dict) -> int:
    """The request's batch size bucket: its passes' mean rows, rounded (1 for an engine that does not say)."""
    try:
        return max(1, round(float(perf.get("mean_batch") or 1)))
    except (TypeError, ValueError):
        return 1


def _overhead_per_pass(perf: dict, passes: int) -> float | None:
    """A request's time per pass outside drafting and verifying: decode time (total − queue −
    prefill) − draft − verify, over its passes; None where the perf dict lacks a field."""
    try:
        decode = perf["total_s"] - perf["queue_s"] - perf["prefill_s"]
        return max(0.0, decode - perf.get("draft_s", 0.0) - perf["verify_s"]) / passes
    except (KeyError, TypeError):
        return None


class RoutingPolicy:
    def __init__(
        self,
        speculative_fraction: float = 1.0,
        *,
        min_acceptance_rate: float | None = None,
        window: int = 64,
        probe_every: int = 8,
        max_draft_len: int = 4,
        min_samples: int | None = None,
        has_speculative: bool = True,
    ):
        if not 0 <= speculative_fraction <= 1:
            raise ValueError(f"speculative_fraction must be in [0, 1], got {speculative_fraction}")
        self.has_speculative = has_speculative
        self.fraction = speculative_fraction if has_speculative else 0.0
        self.min_rate = min_acceptance_rate
        self.window = max(1, window)
        self.probe_every = max(1, probe_every)
        self.max_draft_len = max(1, max_draft_len)
        self.min_samples = min_samples if min_samples is not None else max(4, self.window // 4)
        self._credit = 0.0
        self._events: collections.deque[tuple[int, int]] = collections.deque()  # (drafted, accepted)
        self._drafted = 0
        self._accepted = 0
        self._held_back = 0  # speculative-bound requests sent to the baseline since the last probe
        self._fallback = False
        self._lock = threading.Lock()
        # measured costs (seconds) per batch size: draft per token, verify per pass, target step, the
        # fixed cost per pass (outside draft and verify) of each engine, draft tokens per pass
        self._costs: dict[int, dict[str, _Ema]] = collections.defaultdict(
            lambda: {n: _Ema() for n in ("draft", "verify", "target", "spec_other", "base_other", "draft_len")})
        self._batch = 1  # the batch size of the last speculative request: the load decisions are for
        self.counts = collections.Counter()

    # -------------------------------------------------------------- decisions

    def route(self) -> Decision:
        with self._lock:
            d = self._route()
            self.counts[d.reason] += 1
            return d

    def _route(self) -> Decision:
        if not self.has_speculative:
            return Decision(False, "no-speculative-model")
        self._credit += self.fraction
        if self._credit < 1 - 1e-9:
            return Decision(False, "fraction")
        self._credit -= 1
        if not self._fallback:
            return Decision(True, "speculative")
        self._held_back += 1
        if self._held_back >= self.probe_every:
            self._held_back = 0
            return Decision(True, "probe")
        return Decision(False, "fallback")

    # -------------------------------------------------------------- feedback

    def record_speculative(self, drafted: int, accepted: int, perf: dict | None = None) -> None:
        """A speculative request finished with these totals (and its RequestStats dict)."""
        with self._lock:
            if drafted > 0:
                self._events.append((drafted, accepted))
                self._drafted += drafted
                self._accepted += accepted
                while self._drafted - self._events[0][0] >= self.window and len(self._events) > 1:
                    d, a = self._events.popleft()
                    self._drafted -= d
                    self._accepted -= a
            if perf:
                passes = perf.get("target_passes") or 0
                self._batch = _batch(perf)
                c = self._costs[self._batch]
                if drafted > 0 and perf.get("draft_s") is not None:
                    c["draft"].add(perf["draft_s"] / drafted)
                if passes and perf.get("verify_s") is not None:
                    c["verify"].add(perf["verify_s"] / passes)
                    c["draft_len"].add(drafted / passes)
                    o = _overhead_per_pass(perf, passes)
                    if o is not None:
                        c["spec_other"].add(o)
            self._update()

    def record_baseline(self, perf: dict | None = None) -> None:
        """A baseline request finished; its verify time per pass is one target step."""
        with self._lock:
            passes = (perf or {}).get("target_passes") or 0
            if passes and perf.get("verify_s") is not None:
                c = self._costs[_batch(perf)]
                c["target"].add(perf["verify_s"] / passes)
                o = _overhead_per_pass(perf, passes)
                if o is not None:
                    c["base_other"].add(o)
                self._update()

    def _update(self) -> None:
        if self._drafted < self.min_samples:
            return
        threshold = self._break_even()
        if threshold is None:
            return
        was = self._fallback
        self._fallback = self._accepted / self._drafted < threshold
        if self._fallback and not was:
            self._held_back = 0

    # -------------------------------------------------------------- state

    def _break_even(self) -> float | None:
        if self.min_rate is not None:
            return self.min_rate
        c = self._costs.get(self._batch)
        if c is None:
            return None
        d, v = c["draft"].value, c["verify"].value
        if d is None or v is None:
            return None
        t = c["target"].value or v  # no baseline request at this batch size yet: the verify pass stands in
        k = max(1, round(c["draft_len"].value or self.max_draft_len))
        o_s = c["spec_other"].value or 0.0
        o_b = c["base_other"].value if c["base_other"].value is not None else o_s
        t, v = t + o_b, v + o_s  # a plain token and a speculative pass, each with its fixed cost
        alpha = break_even_acceptance(d / t, k, v / t)
        return acceptance_rate_at(alpha, k)

    @property
    def break_even(self) -> float | None:
        with self._lock:
            return self._break_even()

    @property
    def rolling_acceptance(self) -> float | None:
        with self._lock:
            return self._accepted / self._drafted if self._drafted else None

    @property
    def fallback_active(self) -> bool:
        return self._fallback

    def snapshot(self) -> dict:
        with self._lock:
            return {
                "speculative_fraction": self.fraction,
                "fallback_active": self._fallback,
                "rolling_acceptance_rate": self._accepted / self._drafted if self._drafted else None,
                "window_draft_tokens": self._drafted,
                "break_even_acceptance_rate": self._break_even(),
                "decisions": dict(self.counts),
            }
