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
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import pathlib
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from trtspec.errors import ConfigError
from trtspec.client.loadgen import BenchInterrupted, gather_windows, run_all, send_one
from trtspec.client.metrics import Window
from trtspec.client.loadgen import LevelResult, PromptItem, check_level

if TYPE_CHECKING:
    from trtspec.client.client import AsyncLLMClient
    from trtspec.client.loadgen import BenchSettings, LevelResult, PromptItem
    from trtspec.client.metrics import RequestRecord, Window

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


def check_settings(s: "BenchSettings") -> None:
    if s.request_rates is not None:
        if not s.request_rates or any(not (r > 0) for r in s.request_rates):
            raise ConfigError("request_rate", s.request_rates, "needs rates > 0 (requests/s; inf = all at once)",
                              fix="e.g. --request-rate 1,2,4")
    if not (s.burstiness > 0 and math.isfinite(s.burstiness)):
        raise ConfigError("burstiness", s.burstiness, "must be a finite number > 0 (1 = Poisson)",
                          fix="e.g. --burstiness 1")
    if s.max_concurrency is not None and s.max_concurrency < 1:
        raise ConfigError("max_concurrency", s.max_concurrency, "must be >= 1", fix="e.g. --max-concurrency 8")
    if s.schedule is not None and s.request_rates:
        raise ConfigError("fixed_schedule", "…", "a fixed schedule sets its own arrival times",
                          fix="pass --fixed-schedule or --request-rate, not both")
    if s.schedule is not None and len(s.schedule) < 2:
        raise ConfigError("fixed_schedule", len(s.schedule), "needs at least 2 requests (one block per order)")
    for name in ("prompt_len_stddev", "output_len_stddev"):
        v = getattr(s, name)
        if not (v >= 0 and math.isfinite(v)):
            raise ConfigError(name, v, "must be a finite number >= 0")
    if s.prompt_len_stddev > 0 and not s.prompt_lens:
        raise ConfigError("prompt_len_stddev", s.prompt_len_stddev, "needs a mean prompt length",
                          fix="add --prompt-len MEAN")
    for name, ms in s.goodput:
        if name not in SLO_METRICS:
            raise ConfigError("goodput", name, f"unknown SLO metric; known: {', '.join(sorted(SLO_METRICS))}",
                              fix="e.g. --goodput ttft:200 --goodput itl:50")
        if not (ms > 0 and math.isfinite(ms)):
            raise ConfigError("goodput", f"{name}:{ms}", "the bound must be a number of milliseconds > 0")


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


def level_label(lv: "LevelResult") -> str:
    if lv.schedule:
        return "fixed schedule" + (f", max {lv.concurrency} in flight" if lv.concurrency else "")
    if lv.request_rate is not None:
        r = "all at once" if math.isinf(lv.request_rate) else f"{lv.request_rate:g} req/s"
        return r + (f", max {lv.concurrency} in flight" if lv.concurrency else "")
    return f"concurrency {lv.concurrency}"


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


async def _run_open_block(client: "AsyncLLMClient", settings: "BenchSettings", role: str, cap: int,
                          plan: list[tuple[int, "PromptItem", int]], offsets: list[float],
                          on_done: Callable[[], None] | None, block: int) -> "Window":
    """Send ``plan[k]`` at ``offsets[k]`` seconds after the block starts, at most ``cap`` in flight
    (0: no cap). Raises BenchInterrupted when the server went away."""

    window = Window(role=role, concurrency=cap, start=time.perf_counter(), end=0.0, replica=client.url, block=block)
    slots = asyncio.Semaphore(cap) if cap else None
    stop = asyncio.Event()
    lost = []
    t0 = time.perf_counter()

    async def one(k: int):
        delay = t0 + offsets[k] - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        if stop.is_set():
            return
        _, item, max_tokens = plan[k]
        if slots is not None:
            async with slots:
                rec, gone = await send_one(client, settings, role, cap, item, max_tokens)
        else:
            rec, gone = await send_one(client, settings, role, cap, item, max_tokens)
        if gone is not None:
            lost.append(gone)
            stop.set()
        window.requests.append(rec)
        if on_done:
            on_done()

    await run_all(one(k) for k in range(len(plan)))
    window.end = time.perf_counter()
    window.requests.sort(key=lambda r: r.start)
    if lost:
        window.interrupted = str(lost[0]).splitlines()[0]
        raise BenchInterrupted([window], lost[0])
    return window


async def _on_replicas(clients, settings, role, cap, plan, offsets, on_done, block) -> list:
    return await gather_windows(_run_open_block(c, settings, role, cap, plan, offsets, on_done, block)
                                for c in clients)


async def run_open_levels(clients, settings: "BenchSettings", prompts: "list[PromptItem]",
                          plan: Callable[[int, int], list], levels: "list[LevelResult]",
                          tick: Callable[[], None], label: list[str]) -> None:
    """Every open-loop level, each as two ABBA blocks; appends to ``levels`` as it goes (so an
    interruption keeps what ran)."""

    roles = list(settings.roles)
    cap = settings.max_concurrency or 0
    urls = [c.url for c in clients]
    specs: list[tuple[float | None, list, list[float]]] = []
    for k, rate in enumerate(settings.request_rates or ()):
        n = settings.requests or max(2, int(math.ceil(rate * (settings.duration_s or 0)))) \
            if not math.isinf(rate) else settings.requests or 2
        p = plan(0, n)
        specs.append((rate, p, arrival_offsets(n, rate, settings.burstiness, settings.arrival_seed, k)))
    if settings.schedule is not None:
        p = []
        for i, row in enumerate(settings.schedule):
            _, item, max_tokens = plan(i, 1)[0]
            if row.text is not None:
                item = PromptItem(i, row.text, len(row.text), "chars")
            p.append((i, item, row.output_length or max_tokens))
        specs.append((None, p, [r.timestamp_s for r in settings.schedule]))
    block_no = 0
    for rate, p, offsets in specs:
        lv = LevelResult(cap, [], request_rate=rate, schedule=rate is None)
        levels.append(lv)
        half = (len(p) + 1) // 2
        for part in (slice(0, half), slice(half, None)):
            bp, bo = p[part], offsets[part]
            if not bp:
                continue
            bo = [t - bo[0] for t in bo]  # each block starts with its first arrival
            order = roles if block_no % 2 == 0 else roles[::-1]
            for role in order:
                label[0] = f"{lv.load} {role}"
                try:
                    lv.windows += await _on_replicas(clients, settings, role, cap, bp, bo, tick, block_no)
                except BenchInterrupted as e:
                    lv.windows += e.windows
                    raise
            block_no += 1
        check_level(lv, settings, urls)
