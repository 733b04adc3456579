"""Latency and throughput metrics over per-request timelines, as GenAI-Perf defines them
(reference/trtllm-triton.md §3.2; genai_perf/profile_data_parser/llm_profile_data_parser.py):

* TTFT                 first response carrying output − request sent
* time to second token second such response − first (a *response*: with speculation it may hold
                       several tokens)
* request latency      last response carrying output − request sent
* ITL                  (request latency − TTFT) / (OSL − 1), per request
* inter-chunk latency  gaps between consecutive responses (AIPerf's ICL); speculation delivers
                       several tokens per chunk, so ICL > ITL when acceptance is high
* output tokens/s per user   1 / ITL, per request
* output token throughput    Σ OSL / benchmark duration; request throughput = requests / duration,
                       where duration = last response − first request sent (per measured block)

Acceptance: the server's cumulative counters (``total_accepted_draft_tokens`` /
``total_draft_tokens``; rate = Σ accepted / Σ drafted over requests), the engine's acceptance
length when the server reports it, and a proxy that needs only the stream: tokens per decode
step = (OSL − tokens of the first chunk) / (chunks − 1). One streamed chunk is one engine step,
and the first chunk comes from the prefill, so for a request with s verify steps and a accepted
draft tokens the proxy is (a + s) / s — exactly the engine's acceptance length.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np

from trtspec.client.types import GenerationResult

PERCENTILES = (50, 90, 95, 99)
# bucket upper bounds (inclusive, so max_tokens 64 lands in "33-64"); the last bucket is open
PROMPT_LEN_EDGES = (16, 32, 64, 128, 256, 512, 1024, 2048)
OUTPUT_LEN_EDGES = (8, 16, 32, 64, 128, 256, 512, 1024)


@dataclass
class RequestRecord:
    """One measured request: the unit every metric is computed from."""

    role: str  # "speculative" | "baseline"
    model: str
    concurrency: int
    prompt_index: int
    max_tokens: int
    start: float  # perf_counter when sent
    chunk_t: list[float]  # arrival of each response carrying output, seconds since sent
    chunk_tokens: list[int]  # tokens in each of those responses
    prompt_len: int | None = None
    prompt_len_unit: str = "tokens"  # "tokens" | "chars"
    accepted: int | None = None  # server counters, cumulative for the request
    drafted: int | None = None
    server_acceptance_length: float | None = None
    served_by: str | None = None
    error: str | None = None
    replica: str | None = None  # the server's URL
    chunk_text: list[str] = field(default_factory=list)  # each chunk's text (exports only, not in report.json)

    @classmethod
    def from_result(cls, res: GenerationResult, *, role: str, concurrency: int, prompt_index: int,
                    max_tokens: int, prompt_len: int | None, prompt_len_unit: str,
                    replica: str | None = None) -> "RequestRecord":
        counts = [c.num_tokens if c.num_tokens is not None else 1 for c in res.chunks]
        return cls(
            role=role, model=res.model, concurrency=concurrency, prompt_index=prompt_index,
            max_tokens=max_tokens, start=res.sent_at, chunk_t=[c.t_s for c in res.chunks], chunk_tokens=counts,
            prompt_len=prompt_len, prompt_len_unit=prompt_len_unit, accepted=res.accepted_draft_tokens,
            drafted=res.draft_tokens, server_acceptance_length=res.acceptance_length, served_by=res.served_by,
            replica=replica, chunk_text=[c.text for c in res.chunks],
        )

    @classmethod
    def failed(cls, *, role: str, model: str, concurrency: int, prompt_index: int, max_tokens: int,
               start: float, error: str, partial: GenerationResult | None = None,
               replica: str | None = None) -> "RequestRecord":
        """A request that failed; ``partial`` keeps the output that arrived before the failure
        (its chunks are recorded; the record still counts as an error)."""
        chunks = partial.chunks if partial is not None else []
        return cls(role=role, model=model, concurrency=concurrency, prompt_index=prompt_index,
                   max_tokens=max_tokens, start=partial.sent_at if partial is not None else start,
                   chunk_t=[c.t_s for c in chunks],
                   chunk_tokens=[c.num_tokens if c.num_tokens is not None else 1 for c in chunks],
                   error=error, replica=replica)

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.chunk_t)

    @property
    def osl(self) -> int:
        return sum(self.chunk_tokens)

    @property
    def ttft(self) -> float | None:
        return self.chunk_t[0] if self.chunk_t else None

    @property
    def ttst(self) -> float | None:
        return self.chunk_t[1] - self.chunk_t[0] if len(self.chunk_t) > 1 else None

    @property
    def latency(self) -> float | None:
        return self.chunk_t[-1] if self.chunk_t else None

    @property
    def end(self) -> float | None:
        return self.start + self.chunk_t[-1] if self.chunk_t else None

    @property
    def itl(self) -> float | None:
        if self.osl < 2 or not self.chunk_t:
            return None
        return (self.chunk_t[-1] - self.chunk_t[0]) / (self.osl - 1)

    @property
    def inter_chunk(self) -> list[float]:
        return [b - a for a, b in zip(self.chunk_t, self.chunk_t[1:])]

    @property
    def tps_per_user(self) -> float | None:
        itl = self.itl
        return 1.0 / itl if itl else None

    @property
    def chunk_acceptance_length(self) -> float | None:
        """Tokens per decode step from the stream (see the module docstring)."""
        if len(self.chunk_t) < 2:
            return None
        return (self.osl - self.chunk_tokens[0]) / (len(self.chunk_t) - 1)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["chunk_t"] = [round(t, 6) for t in self.chunk_t]
        d.pop("start")
        d.pop("chunk_text")
        return d


def distribution(values: list[float]) -> dict:
    """n, mean, min, max and p50/p90/p95/p99 (``numpy.percentile``: linear interpolation, as GenAI-Perf)."""
    xs = [v for v in values if v is not None and not math.isnan(v)]
    if not xs:
        return {"n": 0}
    out = {"n": len(xs), "mean": sum(xs) / len(xs), "min": min(xs), "max": max(xs)}
    for q in PERCENTILES:
        out[f"p{q}"] = float(np.percentile(xs, q))
    return out


def acceptance_summary(records: list[RequestRecord]) -> dict:
    """Server counters (token-weighted) and the chunk proxy over successful requests."""
    ok = [r for r in records if r.ok]
    with_counts = [r for r in ok if r.drafted is not None and r.accepted is not None]
    drafted = sum(r.drafted for r in with_counts)
    accepted = sum(r.accepted for r in with_counts)
    decode_tokens = sum(r.osl - r.chunk_tokens[0] for r in ok if len(r.chunk_t) > 1)
    decode_steps = sum(len(r.chunk_t) - 1 for r in ok if len(r.chunk_t) > 1)
    al = [(r.server_acceptance_length, r.osl) for r in ok if r.server_acceptance_length is not None]
    served: dict[str, int] = {}
    for r in ok:
        served[r.served_by or "unknown"] = served.get(r.served_by or "unknown", 0) + 1
    return {
        # None when the server reports no counters (NVIDIA's zeroed-counter bug, or no speculation)
        "acceptance_rate": accepted / drafted if drafted else None,
        "accepted_draft_tokens": accepted if with_counts else None,
        "draft_tokens": drafted if with_counts else None,
        "acceptance_length": (sum(a * n for a, n in al) / sum(n for _, n in al)) if al else None,
        "acceptance_length_from_chunks": decode_tokens / decode_steps if decode_steps else None,
        "served_by": served,
    }


def summarize(records: list[RequestRecord], duration_s: float | None = None,
              settling: list[RequestRecord] = ()) -> dict:
    """GenAI-Perf's metrics for one set of requests (one model at one concurrency).

    ``duration_s`` is the measured wall time (Σ over blocks of last response − first send);
    by default the span of these records. ``settling`` requests ran in the same loop inside that
    time: they count towards throughput (their tokens were produced in it) but not towards the
    latency distributions."""
    ok = [r for r in records if r.ok]
    settled = [r for r in settling if r.ok]
    if duration_s is None and ok:
        duration_s = max(r.end for r in ok + settled) - min(r.start for r in ok + settled)
    tokens = sum(r.osl for r in ok + settled)
    out = {
        "requests": len(records),
        "errors": len(records) - len(ok),
        "settling_requests": len(settling),
        "output_tokens": tokens,
        "duration_s": duration_s,
        "request_throughput": len(ok + settled) / duration_s if duration_s else None,
        "output_token_throughput": tokens / duration_s if duration_s else None,
        "ttft_s": distribution([r.ttft for r in ok]),
        "time_to_second_token_s": distribution([r.ttst for r in ok]),
        "itl_s": distribution([r.itl for r in ok]),
        "inter_chunk_latency_s": distribution([x for r in ok for x in r.inter_chunk]),
        "request_latency_s": distribution([r.latency for r in ok]),
        "output_tps_per_user": distribution([r.tps_per_user for r in ok]),
        "output_sequence_length": distribution([r.osl for r in ok]),
        "input_sequence_length": distribution([r.prompt_len for r in ok if r.prompt_len is not None]),
        "tokens_per_chunk": distribution([n for r in ok for n in r.chunk_tokens]),
    }
    out["acceptance"] = acceptance_summary(records)
    return out


def bucket_order(edges: tuple[int, ...]) -> list[str]:
    """Labels of the buckets for upper bounds ``edges``: "<=8", "9-16", ..., ">1024"."""
    return [f"<={edges[0]}"] + [f"{lo + 1}-{hi}" for lo, hi in zip(edges, edges[1:])] + [f">{edges[-1]}"]


def bucket_label(value: int, edges: tuple[int, ...]) -> str:
    labels = bucket_order(edges)
    for label, hi in zip(labels, edges):
        if value <= hi:
            return label
    return labels[-1]


def by_bucket(records: list[RequestRecord], key: str) -> dict[str, dict]:
    """Per-bucket summaries; ``key`` is "prompt_len" or "output_len". Empty buckets are left out."""
    edges = PROMPT_LEN_EDGES if key == "prompt_len" else OUTPUT_LEN_EDGES
    groups: dict[str, list[RequestRecord]] = {}
    for r in records:
        if not r.ok:
            continue
        v = r.prompt_len if key == "prompt_len" else r.osl
        if v is None:
            continue
        groups.setdefault(bucket_label(v, edges), []).append(r)
    out = {}
    for label in bucket_order(edges):
        if label in groups:
            rs = groups[label]
            out[label] = {
                "requests": len(rs),
                "ttft_s": distribution([r.ttft for r in rs]),
                "itl_s": distribution([r.itl for r in rs]),
                "request_latency_s": distribution([r.latency for r in rs]),
                "output_tps_per_user": distribution([r.tps_per_user for r in rs]),
                "acceptance": acceptance_summary(rs),
            }
    return out


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def speedups(spec: dict, base: dict) -> dict:
    """Speculative vs baseline; every ratio is oriented so that > 1 means speculative is better."""
    def p50(d: dict, name: str):
        return d[name].get("p50")

    return {
        "output_token_throughput": _ratio(spec["output_token_throughput"], base["output_token_throughput"]),
        "request_throughput": _ratio(spec["request_throughput"], base["request_throughput"]),
        "output_tps_per_user_p50": _ratio(p50(spec, "output_tps_per_user"), p50(base, "output_tps_per_user")),
        "request_latency_p50": _ratio(p50(base, "request_latency_s"), p50(spec, "request_latency_s")),
        "request_latency_p95": _ratio(base["request_latency_s"].get("p95"), spec["request_latency_s"].get("p95")),
        "itl_p50": _ratio(p50(base, "itl_s"), p50(spec, "itl_s")),
        "ttft_p50": _ratio(p50(base, "ttft_s"), p50(spec, "ttft_s")),
    }


def bucket_speedups(spec: dict[str, dict], base: dict[str, dict]) -> dict[str, dict]:
    """Per bucket: per-user output tokens/s and request latency, speculative vs baseline (p50)."""
    out = {}
    for label in spec:
        if label in base:
            s, b = spec[label], base[label]
            out[label] = {
                "requests": {"speculative": s["requests"], "baseline": b["requests"]},
                "output_tps_per_user_p50": _ratio(s["output_tps_per_user"].get("p50"),
                                                  b["output_tps_per_user"].get("p50")),
                "request_latency_p50": _ratio(b["request_latency_s"].get("p50"), s["request_latency_s"].get("p50")),
            }
    return out


@dataclass
class Window:
    """A measured stretch of wall time in which one model ran alone (one interleaved block)."""

    role: str
    concurrency: int
    start: float
    end: float
    requests: list[RequestRecord] = field(default_factory=list)
    settling: list[RequestRecord] = field(default_factory=list)  # ran in the loop, latencies not measured
    replica: str | None = None  # the server's URL
    block: int = 0  # windows of one block ran at the same time, one per replica
    interrupted: str | None = None  # the server went away during this window: the error

    @property
    def duration_s(self) -> float:
        return span([self])


def span(windows: list[Window]) -> float:
    """GenAI-Perf's benchmark duration of windows that ran at the same time: first request sent →
    last response carrying output, over their successful requests."""
    ok = [r for w in windows for r in w.requests + w.settling if r.ok]
    if not ok:
        return 0.0
    return max(r.end for r in ok) - min(r.start for r in ok)


def json_safe(o):
    """NaN is not JSON: write null."""
    if isinstance(o, float):
        return None if math.isnan(o) or math.isinf(o) else o
    if isinstance(o, dict):
        return {k: json_safe(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [json_safe(v) for v in o]
    return o
