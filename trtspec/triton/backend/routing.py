"""The router's policy: traffic split, rolling acceptance, break-even fallback, probing.

Pure and thread-safe; the router model (``backend_router``) asks :meth:`RoutingPolicy.route`
for each request and reports each finished request back.

* Split: a deterministic credit counter sends exactly ``speculative_fraction`` of requests to the
  speculative model (0.5 → every other request), so small runs and tests see the configured share.
* Fallback, for acceptance collapse only: the rolling acceptance rate (accepted / drafted over the
  last ``window`` draft tokens) is compared with break-even. Below it, speculative-bound requests
  go to the baseline, except every ``probe_every``-th (a probe), whose acceptance and costs
  refresh the window and the cost estimates, so the router returns to speculation within
  ``probe_every · ⌈window / draft tokens per probe⌉ + 1`` requests once acceptance recovers.
  Whether speculation pays at the live batch size is the engine's decision (its draft length per
  step, down to plain decoding; ``speculation.max_concurrency``), not the router's.
* Evidence: a speculative request counts towards acceptance only with the tokens it drafted, and
  towards costs only when it drafted at least one token per pass (but the last). A request that
  drafted nothing (the engine chose plain decoding: its draft length, ``max_concurrency``) is no evidence
  against speculation; one that drafted in some passes only mixes plain passes into its verify
  time per pass and books the draft's catch-up over the missed tokens against few draft tokens
  (its draft time per token then looked many times dearer: the break-even of 1.0 of issue 31).
* Break-even: ``min_acceptance_rate`` if the recipe sets it; else derived from measured costs per
  batch size (the engine's ``mean_batch`` per request, rounded: a verify pass over 4 rows is
  compared with a target step over 4 rows, never with one over 1; mixing them swung the
  break-even from 0.29 to 0.53 and back to 0 within one validation run):
  c = draft time per draft token / target step, v = verify time per pass / target step (target
  step from baseline requests at that batch size; before any, the verify pass stands in for it).
  Both engines also pay a fixed cost per pass outside drafting and verifying (sampling,
  bookkeeping, sending the step's tokens): measured per request as decode time − draft − verify
  over its passes, it joins the target step (baseline) and the verify pass (speculative), since
  speculation pays it once per pass instead of once per token (a fast INT8 target makes that
  share large). Each estimate is a ratio of sums over the last ``COST_WINDOW`` requests at that
  batch size: a request weighs by its passes and draft tokens, and old samples age out.
  The per-token break-even α* (Leviathan et al.: speedup (1-α^{k+1})/((1-α)(k·c+v)) = 1) at the
  configured ``max_draft_len`` k is converted to the acceptance rate it implies,
  r* = (α + … + α^k) / k, which is what the window measures (the engine may draft fewer, which
  only raises the rate per drafted token: the lenient question, as collapse detection wants). The router falls back below the
  lowest r* over the batch sizes measured: speculation then loses at every load it has seen.
  Where k·c + v ≥ k + 1 (no acceptance < 1 pays, r* ≥ 1) the costs are degenerate, not a
  verdict: that batch size is left out, and with no usable batch size the break-even is unknown
  and the router does not fall back (``trtspec_router_break_even_unknown``).
"""

from __future__ import annotations

import collections
import threading
from dataclasses import dataclass

from trtspec.acceptance import break_even_acceptance

COST_WINDOW = 8  # requests per batch size (and path) whose costs the break-even reads


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


def _batch(perf: dict) -> int:
    """The request's batch size bucket: its passes' mean rows, rounded (1 for an engine that does not say)."""
    try:
        return max(1, round(float(perf.get("mean_batch") or 1)))
    except (TypeError, ValueError):
        return 1


def _sample(perf: dict, drafted: int) -> dict | None:
    """One request's cost sample (sums: seconds, passes, draft tokens); None where perf lacks
    the passes or the verify time. ``other_s``: decode time (total − queue − prefill) − draft −
    verify, None where perf lacks a field."""
    try:
        passes, verify = int(perf.get("target_passes") or 0), float(perf["verify_s"])
        draft = float(perf.get("draft_s") or 0.0)
    except (KeyError, TypeError, ValueError):
        return None
    if passes <= 0:
        return None
    try:
        decode = perf["total_s"] - perf["queue_s"] - perf["prefill_s"]
        other = max(0.0, decode - draft - verify)
    except (KeyError, TypeError):
        other = None
    return {"passes": passes, "verify_s": verify, "draft_s": draft, "drafted": drafted, "other_s": other}


class _Costs:
    """The last ``COST_WINDOW`` samples of one path at one batch size; estimates are ratios of sums."""

    def __init__(self):
        self.samples: collections.deque[dict] = collections.deque(maxlen=COST_WINDOW)

    def per(self, key: str, per: str) -> float | None:
        n = sum(s[per] for s in self.samples)
        return sum(s[key] for s in self.samples) / n if n else None

    def other_per_pass(self) -> float | None:
        known = [s for s in self.samples if s["other_s"] is not None]
        n = sum(s["passes"] for s in known)
        return sum(s["other_s"] for s in known) / n if n else None


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
        # measured costs per batch size: speculative requests that drafted in every pass, baseline requests
        self._spec: dict[int, _Costs] = collections.defaultdict(_Costs)
        self._base: dict[int, _Costs] = collections.defaultdict(_Costs)
        self.counts = collections.Counter()  # routing decisions by reason
        self.changes = collections.Counter()  # fallback entered ("enter") and left ("exit")

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

    def record_speculative(self, drafted: int, accepted: int, perf: dict | None = None) -> str | None:
        """A speculative request (or probe) finished with these totals (and its RequestStats
        dict). Returns "enter" / "exit" when this changed the fallback, else None."""
        with self._lock:
            if drafted <= 0:  # decoded plainly throughout: the engine's choice, no evidence either way
                return None
            self._events.append((drafted, accepted))
            self._drafted += drafted
            self._accepted += accepted
            while self._drafted - self._events[0][0] >= self.window and len(self._events) > 1:
                d, a = self._events.popleft()
                self._drafted -= d
                self._accepted -= a
            s = _sample(perf, drafted) if perf and perf.get("draft_s") is not None else None
            # fewer draft tokens than passes: passes were plain (see the module docstring); one
            # is allowed, the last pass drafts nothing when only one token is left to generate
            if s is not None and drafted >= s["passes"] - 1:
                self._spec[_batch(perf)].samples.append(s)
            return self._update()

    def record_baseline(self, perf: dict | None = None) -> str | None:
        """A baseline request finished; its verify time per pass is one target step."""
        with self._lock:
            s = _sample(perf, 0) if perf else None
            if s is None:
                return None
            self._base[_batch(perf)].samples.append(s)
            return self._update()

    def _update(self) -> str | None:
        if self._drafted < self.min_samples:
            return None
        threshold = self._break_even()
        was = self._fallback
        # an unknown break-even (no usable costs yet, or only degenerate ones) never holds speculation back
        self._fallback = threshold is not None and self._accepted / self._drafted < threshold
        if self._fallback == was:
            return None
        change = "enter" if self._fallback else "exit"
        self.changes[change] += 1
        if self._fallback:
            self._held_back = 0
        return change

    # -------------------------------------------------------------- state

    def _break_even_at(self, batch: int) -> float | None:
        """r* at one batch size from its costs; None while unmeasured, 1.0 where degenerate
        (k·c + v ≥ k + 1: not even full acceptance would pay at these costs)."""
        spec = self._spec.get(batch)
        if spec is None or not spec.samples:
            return None
        d, v = spec.per("draft_s", "drafted"), spec.per("verify_s", "passes")
        o_s = spec.other_per_pass() or 0.0
        base = self._base.get(batch)
        t = base.per("verify_s", "passes") if base is not None else None
        o_b = base.other_per_pass() if base is not None else None
        if not t:  # no baseline request at this batch size yet: the verify pass stands in
            t, o_b = v, o_s
        t, v = t + (o_s if o_b is None else o_b), v + o_s  # a plain token and a speculative pass, each with its fixed cost
        if t <= 0:
            return 1.0
        k = self.max_draft_len
        c, vr = d / t, v / t
        if k * c + vr >= k + 1:
            return 1.0
        return acceptance_rate_at(break_even_acceptance(c, k, vr), k)

    def _break_even(self) -> float | None:
        """The threshold the window is held to: the recipe's, else the lowest r* < 1 over the
        batch sizes measured; None (unknown) when none is usable."""
        if self.min_rate is not None:
            return self.min_rate
        usable = [r for r in map(self._break_even_at, list(self._spec)) if r is not None and r < 1]
        return min(usable) if usable else None

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
                # per batch size: r* (1.0: degenerate costs, left out of the threshold)
                "break_even_by_batch": {b: self._break_even_at(b) for b in sorted(self._spec)},
                "decisions": dict(self.counts),
                "fallback_changes": dict(self.changes),
            }
