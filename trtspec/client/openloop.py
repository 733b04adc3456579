"""Open-loop load: requests arrive on a schedule, whether or not earlier ones have finished.

Production traffic does not wait for the server, and speculation's gain shrinks as the server
fills (more requests share each target pass), so trtspec measures at request *rates* too:

* ``request_rates``: arrivals with gamma-distributed gaps of mean 1/R and shape ``burstiness``
  (1 = a Poisson process; < 1 burstier, > 1 more regular), as ``vllm bench serve``'s
  ``--request-rate`` / ``--burstiness``; ``inf`` sends every request at once.
* ``max_concurrency``: at most this many in flight; a later arrival waits for a slot, and its
  latencies count from when it is sent, not from its arrival (as ``vllm bench serve``).
* ``schedule``: a fixed schedule (JSONL: ``timestamp`` in ms, optional ``input_length``,
  ``output_length``, ``text``), as GenAI-Perf's / AIPerf's ``--fixed-schedule`` traces.

The ABBA interleaving stays: at each rate the requests are cut in two blocks; block 1 runs the
same arrivals (same gaps, prompts and output lengths) on the speculative model, then the baseline;
block 2 the other way round. The two models never run at the same time.

Goodput (``--goodput ttft:MS itl:MS``): the fraction of requests that met every SLO, and the
rate of such requests (GenAI-Perf's ``request_goodput``). ``itl`` is per-request ITL, vLLM's
``tpot``; ``e2el`` is request latency.

Here: the arrivals, synthetic lengths, schedules and SLOs, pure functions of the settings. The
runner that sends the requests (``run_open_levels``) sits in :mod:`trtspec.client.loadgen`, beside
the closed loop's, whose request sender and ABBA blocks it shares; this module imports nothing of
it, so the two never import each other.
"""

from __future__ import annotations

import hashlib
import json
import math
import pathlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

from trtspec.errors import ConfigError

if TYPE_CHECKING:
    from trtspec.client.metrics import RequestRecord

# SLO names → the per-request metric they bound (GenAI-Perf's and vLLM's spellings both accepted)
SLO_METRICS = {
    "ttft": "ttft", "time_to_first_token": "ttft",
    "itl": "itl", "tpot": "itl", "inter_token_latency": "itl",
    "e2el": "latency", "request_latency": "latency",
}


@dataclass(frozen=True)
class ScheduledRequest:
    """One line of a fixed schedule."""

    timestamp_s: float  # offset from the schedule's start
    input_length: int | None = None
    output_length: int | None = None
    text: str | None = None


def parse_goodput(specs: tuple[str, ...] | list[str]) -> tuple[tuple[str, float], ...]:
    """``["ttft:200", "itl:50"]`` (or one space/comma-separated string) → (("ttft", 200.0), ...)."""
    out = []
    for spec in specs:
        for part in str(spec).replace(",", " ").split():
            name, sep, ms = part.partition(":")
            try:
                if not sep:
                    raise ValueError
                out.append((name.strip().lower(), float(ms)))
            except ValueError:
                raise ConfigError("goodput", part, "expected METRIC:MILLISECONDS",
                                  fix="e.g. --goodput ttft:200 --goodput itl:50") from None
    return tuple(out)


def load_schedule(path: str | pathlib.Path) -> tuple[ScheduledRequest, ...]:
    """A JSONL fixed schedule: ``{"timestamp": ms, "input_length": n, "output_length": m, "text": ...}``
    per line (only ``timestamp`` required); sorted by time, offsets from the first."""
    p = pathlib.Path(path)
    if not p.is_file():
        raise ConfigError("fixed_schedule", str(p), "file not found", fix="pass a JSONL file with a 'timestamp' per line")
    rows = []
    for n, line in enumerate(p.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            d = json.loads(line)
            ts = float(d["timestamp"])
        except (json.JSONDecodeError, KeyError, TypeError, ValueError):
            raise ConfigError("fixed_schedule", f"{p}:{n}", "each line needs a JSON object with a numeric "
                              "'timestamp' (milliseconds)", fix='e.g. {"timestamp": 0, "output_length": 64}') from None
        if not math.isfinite(ts) or ts < 0:
            raise ConfigError("fixed_schedule", f"{p}:{n}", f"timestamp {ts} must be a finite number >= 0")
        for key in ("input_length", "output_length"):
            if key in d and (not isinstance(d[key], int) or d[key] < 1):
                raise ConfigError("fixed_schedule", f"{p}:{n}", f"{key} must be an integer >= 1, got {d[key]!r}")
        rows.append(ScheduledRequest(ts / 1e3, d.get("input_length"), d.get("output_length"), d.get("text")))
    if not rows:
        raise ConfigError("fixed_schedule", str(p), "has no requests")
    rows.sort(key=lambda r: r.timestamp_s)
    t0 = rows[0].timestamp_s
    return tuple(ScheduledRequest(r.timestamp_s - t0, r.input_length, r.output_length, r.text) for r in rows)


def _rng(seed: int, *key):
    import numpy as np

    h = hashlib.sha256(repr((seed, *key)).encode()).digest()
    return np.random.default_rng(int.from_bytes(h[:8], "little"))


def synthetic_length(mean: int, stddev: float, seed: int, kind: str, i: int) -> int:
    """normal(mean, stddev), rounded, at least 1; the same for the same (seed, kind, i)."""
    return max(1, int(round(_rng(seed, kind, i).normal(mean, stddev))))


def arrival_offsets(n: int, rate: float, burstiness: float, seed: int, level: int = 0) -> list[float]:
    """Send times (s from the block's start) of ``n`` requests: cumulative gamma gaps with shape
    ``burstiness`` and mean 1/``rate`` (the first request at 0). ``rate = inf``: all at 0."""
    if math.isinf(rate):
        return [0.0] * n
    gaps = _rng(seed, "arrivals", level).gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=max(0, n - 1))
    out, t = [0.0], 0.0
    for g in gaps:
        t += float(g)
        out.append(t)
    return out[:n]


def goodput(records: "list[RequestRecord]", slos: tuple[tuple[str, float], ...], duration_s: float | None) -> dict:
    """Requests meeting every SLO: their fraction of all requests sent (a failed request misses),
    and their rate over the measured duration."""
    met = 0
    for r in records:
        if not r.ok:
            continue
        ok = True
        for name, ms in slos:
            v = getattr(r, SLO_METRICS[name])
            if v is None or v * 1e3 > ms:
                ok = False
                break
        met += ok
    n = len(records)
    return {"slo_ms": dict(slos), "requests": n, "met": met, "fraction": met / n if n else None,
            "request_goodput": met / duration_s if duration_s else None}
