"""Per-request and aggregated speculation statistics, and the adaptive draft-length controller
(no torch: the Triton BLS model and the reports read these too).

Vocabulary (TRT-LLM / vLLM): *drafted* tokens the proposer offered; *accepted* of those the
target kept; acceptance rate = accepted / drafted; acceptance length = tokens produced per target
pass = (accepted + passes) / passes (each pass also emits one correction or bonus token).
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field


from trtspec.acceptance import expected_speedup


class _Acceptance:
    """acceptance rate and length from ``drafted``, ``accepted`` and ``steps`` (target passes);
    the mean batch of those passes from ``batch_rows``, the mean draft length asked of the
    proposer from ``draft_len_sum``."""

    drafted: int
    accepted: int
    steps: int
    batch_rows: int
    draft_len_sum: int

    @property
    def mean_draft_len(self) -> float:
        """The draft length k the engine chose per target pass, averaged (the proposer may draft
        fewer: an n-gram without a match, a request near its max tokens)."""
        return self.draft_len_sum / self.steps if self.steps else 0.0

    @property
    def mean_batch(self) -> float:
        """Rows per target pass, averaged over the passes (the router compares costs at equal batch)."""
        return self.batch_rows / self.steps if self.steps else 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def acceptance_length(self) -> float:
        return (self.accepted + self.steps) / self.steps if self.steps else 0.0


@dataclass
class RequestStats(_Acceptance):
    prompt_tokens: int = 0
    generated: int = 0
    output_ids: list[int] = field(default_factory=list)
    drafted: int = 0
    accepted: int = 0
    steps: int = 0  # target verification passes after prefill
    batch_rows: int = 0  # Σ over those passes of the rows in the pass (this request's included)
    draft_len_sum: int = 0  # Σ over those passes of the draft length chosen for this request
    tokens_per_step: collections.Counter = field(default_factory=collections.Counter)  # n+1 → count
    reached: list[int] = field(default_factory=list)  # draft position i (0-based) was verified
    accepted_at: list[int] = field(default_factory=list)  # draft position i was accepted
    draft_s: float = 0.0
    verify_s: float = 0.0
    prefill_s: float = 0.0
    queue_s: float = 0.0
    ttft_s: float = 0.0
    total_s: float = 0.0
    started: float | None = None
    finished_at: float | None = None
    finish_reason: str | None = None
    peak_rss_bytes: int = 0
    peak_device_bytes: int = 0

    def record_step(self, *, drafted: int, accepted: int, draft_s: float, verify_s: float, batch: int = 1,
                    draft_len: int | None = None) -> None:
        self.steps += 1
        self.batch_rows += batch
        self.draft_len_sum += drafted if draft_len is None else draft_len
        self.drafted += drafted
        self.accepted += accepted
        self.tokens_per_step[accepted + 1] += 1
        self.draft_s += draft_s
        self.verify_s += verify_s
        # position i is verified if every earlier one was accepted
        for i in range(min(accepted + 1, drafted)):
            while len(self.reached) <= i:
                self.reached.append(0)
                self.accepted_at.append(0)
            self.reached[i] += 1
            if i < accepted:
                self.accepted_at[i] += 1

    def finish(self, now: float, reason: str, peak_rss: int, peak_device: int = 0) -> None:
        self.finished_at = now
        self.finish_reason = reason
        if self.started is not None:
            self.total_s = now - self.started + self.queue_s
        self.peak_rss_bytes = peak_rss
        self.peak_device_bytes = peak_device

    @property
    def decode_s(self) -> float:
        return max(self.total_s - self.queue_s, 1e-9)

    @property
    def tokens_per_s(self) -> float:
        return self.generated / self.decode_s if self.generated else 0.0

    def to_dict(self) -> dict:
        return {
            "prompt_tokens": self.prompt_tokens,
            "generated": self.generated,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "acceptance_rate": round(self.acceptance_rate, 4),
            "acceptance_length": round(self.acceptance_length, 4),
            "target_passes": self.steps,
            "mean_batch": round(self.mean_batch, 3),
            "mean_draft_len": round(self.mean_draft_len, 3),
            "tokens_per_step": {str(k): v for k, v in sorted(self.tokens_per_step.items())},
            "draft_s": round(self.draft_s, 6),
            "verify_s": round(self.verify_s, 6),
            "prefill_s": round(self.prefill_s, 6),
            "queue_s": round(self.queue_s, 6),
            "ttft_s": round(self.ttft_s, 6),
            "total_s": round(self.total_s, 6),
            "tokens_per_s": round(self.tokens_per_s, 3),
            "finish_reason": self.finish_reason,
            "peak_rss_bytes": self.peak_rss_bytes,
        }


@dataclass
class Aggregate(_Acceptance):
    """Sums over many requests (what `bench_engine.py`, `tune` and the Triton metrics report)."""

    requests: int = 0
    generated: int = 0
    drafted: int = 0
    accepted: int = 0
    steps: int = 0
    batch_rows: int = 0
    draft_len_sum: int = 0
    draft_s: float = 0.0
    verify_s: float = 0.0
    tokens_per_step: collections.Counter = field(default_factory=collections.Counter)
    reached: list[int] = field(default_factory=list)
    accepted_at: list[int] = field(default_factory=list)
    peak_rss_bytes: int = 0

    def add(self, s: RequestStats) -> None:
        self.requests += 1
        self.generated += s.generated
        self.drafted += s.drafted
        self.accepted += s.accepted
        self.steps += s.steps
        self.batch_rows += s.batch_rows
        self.draft_len_sum += s.draft_len_sum
        self.draft_s += s.draft_s
        self.verify_s += s.verify_s
        self.tokens_per_step.update(s.tokens_per_step)
        for i, (r, a) in enumerate(zip(s.reached, s.accepted_at)):
            while len(self.reached) <= i:
                self.reached.append(0)
                self.accepted_at.append(0)
            self.reached[i] += r
            self.accepted_at[i] += a
        self.peak_rss_bytes = max(self.peak_rss_bytes, s.peak_rss_bytes)

    def per_position_acceptance(self) -> list[float]:
        """α_i = P(draft token i accepted | tokens before it accepted)."""
        return [a / r if r else 0.0 for r, a in zip(self.reached, self.accepted_at)]

    def to_dict(self) -> dict:
        return {
            "requests": self.requests,
            "generated": self.generated,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "acceptance_rate": round(self.acceptance_rate, 4),
            "acceptance_length": round(self.acceptance_length, 4),
            "target_passes": self.steps,
            "mean_batch": round(self.mean_batch, 3),
            "mean_draft_len": round(self.mean_draft_len, 3),
            "per_position_acceptance": [round(x, 4) for x in self.per_position_acceptance()],
            "tokens_per_step": {str(k): v for k, v in sorted(self.tokens_per_step.items())},
            "draft_s": round(self.draft_s, 4),
            "verify_s": round(self.verify_s, 4),
            "peak_rss_bytes": self.peak_rss_bytes,
        }


class AdaptiveDraftLength:
    """Per-request draft length from rolling acceptance (the run-time fallback).

    Acceptance is estimated per token as the MLE of a geometric model over the last ``window``
    drafted tokens: α = accepted / (accepted + rejections). Each step picks the k in 0..max_k
    with the best expected speedup given the measured cost ratio c; k = 0 is ordinary decoding.
    With ``min_acceptance_rate`` set, k = 0 whenever α falls below it instead. While at k = 0 a
    single-token probe runs every ``window`` steps so a request can recover.
    """

    def __init__(self, max_k: int, window: int = 64, min_acceptance_rate: float | None = None):
        self.max_k = max_k
        self.k = max_k
        self.window = window
        self.min_rate = min_acceptance_rate
        self.events: collections.deque[tuple[int, int]] = collections.deque()  # (accepted, rejected)
        self.drafted = 0
        self.idle = 0
        self.alpha: float | None = None

    def update(self, drafted: int, accepted: int, cost_ratio: float | None, verify_ratio: dict[int, float]) -> None:
        if drafted:
            self.events.append((accepted, 1 if accepted < drafted else 0))
            self.drafted += drafted
            while self.drafted > self.window and len(self.events) > 1:
                a, r = self.events.popleft()
                self.drafted -= a + r
        if self.drafted < max(4, self.window // 4):
            if self.k == 0:
                self._probe()
            return
        acc = sum(a for a, _ in self.events)
        rej = sum(r for _, r in self.events)
        self.alpha = acc / (acc + rej) if acc + rej else 0.0
        if self.min_rate is not None:
            self.k = self.max_k if self.alpha >= self.min_rate else 0
        elif cost_ratio is not None:
            best = max(
                range(self.max_k + 1),
                key=lambda k: expected_speedup([self.alpha], k, cost_ratio, verify_ratio.get(k, 1.0)),
            )
            self.k = best
        if self.k == 0:
            self._probe()

    def _probe(self) -> None:
        self.idle += 1
        if self.idle >= self.window:
            self.idle = 0
            self.k = 1
            self.events.clear()
            self.drafted = 0
