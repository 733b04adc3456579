"""Load generator: a concurrency sweep over the speculative and the baseline model, interleaved.

At each concurrency level the requests are cut into blocks; each block runs on one model and then,
with the *same* prompts and output lengths, on the other, alternating which goes first (ABBA) so
slow drift of the machine (thermal, other load) falls on both alike. Within a block, ``c`` workers
each keep one request in flight (a closed loop, as GenAI-Perf's ``--concurrency``); the block's
first ``c − 1`` requests are not measured, so measured requests see a settled loop rather than
``c`` prefills queued at once. The two models never run at the same time, so neither steals the
other's compute. With ``interval_width`` a level keeps adding blocks until the speedup's 95 %
interval over the paired blocks (trtspec.client.intervals) is that narrow, or ``max_requests`` ran
(:func:`stop_rule`).

Several servers (replicas of one deployment): every block runs on all of them at once, ``c``
requests in flight on each; each replica is summarized alone and all together (throughput over
the blocks' common wall time, latency distributions pooled).

Faults: a request that fails is recorded as an error with the output that arrived before it;
a server that turns requests away (queue full) is load, not an outage. A server that goes away
(connection lost or refused after retries) ends the run: the result keeps every request so far
and says where it stopped (``interrupted``), so a report is still written.
"""

from __future__ import annotations

import asyncio
import datetime as _dt
import math
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Sequence

from trtspec.client.client import BASELINE_MODEL, SPECULATIVE_MODEL, AsyncLLMClient
from trtspec.client.errors import ServerBusy, ServerRequestError, ServerUnavailable
from trtspec.client.connect import open_client
from trtspec.client.targets import ClientOptions
from trtspec.client.intervals import METRICS, SPEEDUP, Interval, level_intervals
from trtspec.client.metrics import RequestRecord, Window, bucket_speedups, by_bucket, span, speedups, summarize
from trtspec.client.openloop import SLO_METRICS, arrival_offsets, goodput, synthetic_length
from trtspec.client.types import Sampling
from trtspec.errors import ConfigError
from trtspec.client.errors import InferenceFailed

Progress = Callable[[int, int | None, str], None]  # (done, total or None, label)


@dataclass(frozen=True)
class PromptItem:
    index: int
    text: str
    length: int  # in ``unit``
    unit: str  # "tokens" | "chars"


def shape_prompts(prompts: Sequence[str], lengths: Sequence[int] | None = None, tokenizer=None) -> list[PromptItem]:
    """Measure prompts, or cut them to controlled lengths.

    With ``lengths``, prompt i gets length ``lengths[i % len(lengths)]``: its own text, continued by
    the following prompts (blank-line separated) until long enough, then cut. Lengths are tokens
    with a tokenizer, characters without.
    """
    if not prompts:
        raise ConfigError("prompts", [], "no prompts", fix="pass a prompt set with at least one prompt")
    unit = "tokens" if tokenizer is not None else "chars"

    def encode(t: str) -> list[int]:
        return tokenizer(t, add_special_tokens=False)["input_ids"]

    items = []
    for i, p in enumerate(prompts):
        if not lengths:
            n = len(encode(p)) if tokenizer is not None else len(p)
            items.append(PromptItem(i, p, n, unit))
            continue
        want = lengths[i % len(lengths)]
        text, j = p, i + 1
        while (len(encode(text)) if tokenizer is not None else len(text)) < want:
            text += "\n\n" + prompts[j % len(prompts)]
            j += 1
        if tokenizer is not None:
            text = tokenizer.decode(encode(text)[:want])
        else:
            text = text[:want]
        items.append(PromptItem(i, text, want, unit))
    return items


def check_settings(s: BenchSettings) -> None:
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


@dataclass(frozen=True)
class BenchSettings:
    concurrency: tuple[int, ...] = (1, 2, 4)
    requests: int | None = 16  # per model and level (None: run for duration_s)
    duration_s: float | None = None  # per model and level
    warmup: int = 2  # per model, once, not measured
    output_lens: tuple[int, ...] = (64,)  # max_tokens, cycled over requests
    prompt_lens: tuple[int, ...] | None = None  # controlled prompt lengths, cycled (None: as given)
    sampling: Sampling = Sampling()  # its max_tokens is replaced by output_lens
    speculative_model: str = SPECULATIVE_MODEL
    baseline_model: str | None = BASELINE_MODEL  # None: speculative only, no ratios
    stream: bool = True
    block: int | None = None  # requests per interleaved block; default max(8, 4 · concurrency)
    timeout_s: float = 600.0  # per request
    # open loop (trtspec.client.openloop): arrivals instead of a closed loop
    request_rates: tuple[float, ...] | None = None  # requests/s per level; inf = all at once
    burstiness: float = 1.0  # gamma shape of the inter-arrival times (1 = Poisson), as vllm bench serve
    max_concurrency: int | None = None  # open loop: at most this many in flight (later arrivals wait)
    schedule: tuple | None = None  # fixed schedule: ScheduledRequest entries (open loop, one level)
    arrival_seed: int = 0
    # request shapes
    prompt_len_stddev: float = 0.0  # synthetic lengths: normal(prompt_lens[0], stddev) per prompt
    output_len_stddev: float = 0.0  # ... and normal(output_lens[0], stddev) per request
    ignore_eos: bool = False  # ask for exactly max_tokens (min_length = max_tokens where the model takes it)
    goodput: tuple[tuple[str, float], ...] = ()  # SLOs (metric, milliseconds): fraction of requests meeting all
    # repeat until sure (closed loop with a baseline): ``requests`` becomes each level's minimum; more
    # blocks run, checked after every second block (each order as often), until the speedup's 95 %
    # interval (trtspec.client.intervals) is at most this wide relative to it, or ``max_requests``
    # per model and level have run
    interval_width: float | None = None
    max_requests: int | None = None
    # with interval_width: the tail gates' limit (1 + validation.gates.latency_tolerance). A level
    # also runs on while some latency ratio's interval holds it (neither passed nor failed yet)
    latency_limit: float | None = None

    @property
    def open_loop(self) -> bool:
        return bool(self.request_rates) or self.schedule is not None

    def __post_init__(self):
        check_settings(self)
        if not self.concurrency or any(c < 1 for c in self.concurrency):
            raise ConfigError("concurrency", self.concurrency, "needs integers >= 1", fix="e.g. --concurrency 1,2,4")
        if (self.requests is None) == (self.duration_s is None):
            raise ConfigError("requests", self.requests, "set exactly one of requests and duration_s",
                              fix="--requests N or --duration SECONDS")
        if self.requests is not None and self.requests < 1:
            raise ConfigError("requests", self.requests, "must be >= 1")
        if self.duration_s is not None and self.duration_s <= 0:
            raise ConfigError("duration_s", self.duration_s, "must be > 0")
        if self.warmup < 0:
            raise ConfigError("warmup", self.warmup, "must be >= 0")
        if not self.output_lens or any(n < 1 for n in self.output_lens):
            raise ConfigError("output_lens", self.output_lens, "needs integers >= 1", fix="e.g. --output-len 32,64")
        if self.prompt_lens is not None and (not self.prompt_lens or any(n < 1 for n in self.prompt_lens)):
            raise ConfigError("prompt_lens", self.prompt_lens, "needs integers >= 1", fix="e.g. --prompt-len 32,128")
        if self.block is not None and self.block < 1:
            raise ConfigError("block", self.block, "must be >= 1")
        if self.interval_width is not None:
            if not (self.interval_width > 0 and math.isfinite(self.interval_width)):
                raise ConfigError("interval_width", self.interval_width, "must be a finite number > 0",
                                  fix="e.g. 0.10: stop once the speedup's 95 % interval spans 10 % of it")
            if self.requests is None or self.baseline_model is None or self.open_loop:
                raise ConfigError("interval_width", self.interval_width,
                                  "needs a closed loop with --requests and a baseline model (the interval is of "
                                  "speculative / baseline over paired blocks)", fix="drop interval_width")
            if self.max_requests is None or self.max_requests < self.requests:
                raise ConfigError("max_requests", self.max_requests,
                                  f"the request budget must be >= requests ({self.requests})",
                                  fix=f"e.g. max_requests {4 * self.requests}")
        elif self.max_requests is not None:
            raise ConfigError("max_requests", self.max_requests, "is a budget for interval_width, which is not set",
                              fix="set interval_width too, or drop max_requests")
        if self.latency_limit is not None:
            if self.interval_width is None:
                raise ConfigError("latency_limit", self.latency_limit, "is read by interval_width's stop rule, "
                                  "which is not set", fix="set interval_width too, or drop latency_limit")
            if not (self.latency_limit > 0 and math.isfinite(self.latency_limit)):
                raise ConfigError("latency_limit", self.latency_limit, "must be a finite ratio > 0",
                                  fix="e.g. 1.10: speculative tail latency at most 1.10x the baseline's")
        if self.baseline_model == self.speculative_model:
            raise ConfigError("baseline_model", self.baseline_model, "is the same model as the speculative one",
                              fix="the baseline is ordinary decoding, e.g. ensemble_baseline")

    @property
    def roles(self) -> dict[str, str]:
        r = {"speculative": self.speculative_model}
        if self.baseline_model:
            r["baseline"] = self.baseline_model
        return r

    def to_dict(self) -> dict:
        d = asdict(self)
        d["sampling"] = asdict(self.sampling)
        return d


def level_label(lv: LevelResult) -> str:
    if lv.schedule:
        return "fixed schedule" + (f", max {lv.concurrency} in flight" if lv.concurrency else "")
    if lv.request_rate is not None:
        r = "all at once" if math.isinf(lv.request_rate) else f"{lv.request_rate:g} req/s"
        return r + (f", max {lv.concurrency} in flight" if lv.concurrency else "")
    return f"concurrency {lv.concurrency}"


@dataclass
class LevelResult:
    concurrency: int  # closed loop: requests in flight; open loop: the cap (0 = none)
    windows: list[Window]
    request_rate: float | None = None  # open loop: requests/s (inf: all at once); None: closed loop
    schedule: bool = False  # open loop from a fixed schedule
    stop: dict | None = None  # with interval_width: why the level stopped (see stop_rule)

    @property
    def load(self) -> str:
        """How this level loaded the server, for tables: "c=4", "2 req/s", "fixed schedule"."""
        return level_label(self)

    def _windows(self, role: str, replica: str | None) -> list[Window]:
        return [w for w in self.windows if w.role == role and replica in (None, w.replica)]

    def records(self, role: str, replica: str | None = None) -> list[RequestRecord]:
        return [r for w in self._windows(role, replica) for r in w.requests]

    def settling(self, role: str, replica: str | None = None) -> list[RequestRecord]:
        return [r for w in self._windows(role, replica) for r in w.settling]

    def duration(self, role: str, replica: str | None = None) -> float:
        """Σ over blocks of the block's span; a block's replicas ran at the same time."""
        blocks: dict[int, list[Window]] = {}
        for w in self._windows(role, replica):
            blocks.setdefault(w.block, []).append(w)
        return sum(span(ws) for ws in blocks.values())

    def summary(self, role: str, replica: str | None = None) -> dict:
        return summarize(self.records(role, replica), self.duration(role, replica), self.settling(role, replica))

    def intervals(self, replica: str | None = None) -> dict[str, Interval]:
        """speculative / baseline per metric with its 95 % interval over the paired blocks."""
        return level_intervals(self.windows, replica)


@dataclass
class BenchResult:
    url: str  # the server; several replicas: their URLs joined by commas
    settings: BenchSettings
    prompt_source: str
    prompts: list[PromptItem]
    levels: list[LevelResult]
    started: str
    wall_s: float
    extra: dict = field(default_factory=dict)
    urls: tuple[str, ...] = ()  # every replica (one for a single server)
    interrupted: dict | None = None  # where the run stopped because a server went away

    @property
    def roles(self) -> list[str]:
        return list(self.settings.roles)

    @property
    def has_baseline(self) -> bool:
        return "baseline" in self.settings.roles

    @property
    def replicas(self) -> list[str]:
        return list(self.urls) or [self.url]

    def level(self, concurrency: int) -> LevelResult | None:
        return next((lv for lv in self.levels if lv.concurrency == concurrency), None)

    def records(self, role: str | None = None, replica: str | None = None) -> list[RequestRecord]:
        return [r for lv in self.levels for w in lv.windows
                if role in (None, w.role) and replica in (None, w.replica) for r in w.requests]

    def speedup(self, concurrency: int, metric: str = "output_token_throughput",
                replica: str | None = None) -> float | None:
        lv = self.level(concurrency)
        if lv is None or not self.has_baseline:
            return None
        return speedups(lv.summary("speculative", replica), lv.summary("baseline", replica))[metric]

    def outcome(self) -> dict:
        """Every request sent (warm-up excluded): completed, failed (with output or without), turned
        away by a busy server."""
        rs = [r for lv in self.levels for w in lv.windows for r in w.requests + w.settling]
        failed = [r for r in rs if not r.ok]
        return {"sent": len(rs), "completed": len(rs) - len(failed), "failed": len(failed),
                "failed_with_partial_output": sum(1 for r in failed if r.chunk_t),
                "busy": sum(1 for r in failed if (r.error or "").startswith(BUSY_PREFIX))}

    def _level_dict(self, lv: LevelResult, replica: str | None) -> dict:
        d: dict = {"concurrency": lv.concurrency, "load": lv.load, "models": {}}
        if lv.request_rate is not None or lv.schedule:
            d["request_rate"] = "fixed schedule" if lv.schedule else lv.request_rate
        for role in self.roles:
            d["models"][role] = lv.summary(role, replica)
            if self.settings.goodput:
                d["models"][role]["goodput"] = goodput(lv.records(role, replica), self.settings.goodput,
                                                       d["models"][role]["duration_s"])
        if self.has_baseline:
            d["speedup"] = speedups(d["models"]["speculative"], d["models"]["baseline"])
            d["intervals"] = {m: i.to_dict() for m, i in lv.intervals(replica).items()}
            if self.settings.goodput:
                s, b = (d["models"][r]["goodput"]["fraction"] for r in ("speculative", "baseline"))
                d["speedup"]["goodput"] = s / b if s is not None and b else None
        if lv.stop is not None and replica is None:
            d["stop"] = lv.stop
        return d

    def to_dict(self, *, with_records: bool = True) -> dict:
        multi = len(self.replicas) > 1
        levels = []
        for lv in self.levels:
            d = self._level_dict(lv, None)
            for key in ("prompt_len", "output_len"):
                d[f"by_{key}"] = {role: by_bucket(lv.records(role), key) for role in self.roles}
            if multi:  # the totals above; each replica alone here
                d["replicas"] = {url: self._level_dict(lv, url) for url in self.replicas}
            levels.append(d)
        pooled = {f"by_{key}": {role: by_bucket(self.records(role), key) for role in self.roles}
                  for key in ("prompt_len", "output_len")}
        if self.has_baseline:
            for key in ("prompt_len", "output_len"):
                pooled[f"speedup_by_{key}"] = bucket_speedups(pooled[f"by_{key}"]["speculative"],
                                                              pooled[f"by_{key}"]["baseline"])
        units = sorted({p.unit for p in self.prompts})
        out = {
            "kind": "bench",
            "url": self.url,
            "started": self.started,
            "wall_s": round(self.wall_s, 3),
            "models": self.settings.roles,
            "settings": self.settings.to_dict(),
            "prompts": {"source": self.prompt_source, "count": len(self.prompts),
                        "length_unit": units[0] if len(units) == 1 else units},
            "levels": levels,
            "all_levels": pooled,
            "outcome": self.outcome(),
            **self.extra,
        }
        if multi:
            out["urls"] = self.replicas
        if self.interrupted is not None:
            out["interrupted"] = self.interrupted
        if with_records:
            out["records"] = [r.to_dict() for r in self.records()]
        return out


BUSY_PREFIX = "busy: "


class BenchInterrupted(Exception):
    """A server went away during a block: the windows run so far, and the error."""

    def __init__(self, windows: list[Window], error: ServerRequestError):
        self.windows, self.error = windows, error


async def send_one(client: AsyncLLMClient, settings: BenchSettings, role: str, concurrency: int,
                   item: PromptItem, max_tokens: int) -> tuple[RequestRecord, ServerRequestError | None]:
    """One measured request; a failure is a record too. The error is returned when the server
    went away (connection lost or refused after retries), so the caller stops sending."""
    model = settings.roles[role]
    sampling = settings.sampling.with_(max_tokens=max_tokens, **({"min_tokens": max_tokens} if settings.ignore_eos else {}))
    start = time.perf_counter()
    try:
        res = await client.generate(item.text, sampling, model=model, stream=settings.stream,
                                    timeout_s=settings.timeout_s)
        plen, unit = (res.prompt_tokens, "tokens") if res.prompt_tokens is not None else (item.length, item.unit)
        return RequestRecord.from_result(res, role=role, concurrency=concurrency, prompt_index=item.index,
                                         max_tokens=max_tokens, prompt_len=plen, prompt_len_unit=unit,
                                         replica=client.url), None
    except ServerRequestError as e:
        busy = isinstance(e, ServerBusy)
        rec = RequestRecord.failed(role=role, model=model, concurrency=concurrency, prompt_index=item.index,
                                   max_tokens=max_tokens, start=start, partial=e.partial,
                                   error=(BUSY_PREFIX if busy else "") + str(e).splitlines()[0],
                                   replica=client.url)
        return rec, (e if isinstance(e, ServerUnavailable) and not busy else None)


async def _run_block(client: AsyncLLMClient, settings: BenchSettings, role: str, concurrency: int,
                     plan: list[tuple[int, PromptItem, int]], on_done: Callable[[], None] | None,
                     settle: int = 0, block: int = 0) -> Window:
    """Run ``plan`` [(request index, prompt, max_tokens)] on one model with ``concurrency`` in flight.

    The first ``settle`` requests are sent but their latencies are not measured: a closed loop
    starts with all its workers in lockstep (every first prefill queued at once); perf_analyzer
    measures after its warm-up has desynchronised the loop. Their tokens still count towards
    the window's throughput. Raises :class:`BenchInterrupted` when the server went away."""
    queue = list(reversed([(True, x) for x in plan[:settle]] + [(False, x) for x in plan]))
    window = Window(role=role, concurrency=concurrency, start=time.perf_counter(), end=0.0, replica=client.url,
                    block=block)
    lost: list[ServerRequestError] = []

    async def worker():
        while queue:
            settling, (_, item, max_tokens) = queue.pop()
            rec, gone = await send_one(client, settings, role, concurrency, item, max_tokens)
            if gone is not None:
                lost.append(gone)  # the server is gone: measuring on would only record failures
                queue.clear()
            if settling:
                window.settling.append(rec)
                continue
            window.requests.append(rec)
            if on_done:
                on_done()

    await run_all(worker() for _ in range(min(concurrency, len(plan))))
    window.end = time.perf_counter()
    if lost:
        window.interrupted = str(lost[0]).splitlines()[0]
        raise BenchInterrupted([window], lost[0])
    return window


async def _run_replicas(clients: list[AsyncLLMClient], settings: BenchSettings, role: str, concurrency: int,
                        plan: list[tuple[int, PromptItem, int]], on_done, settle: int, block: int) -> list[Window]:
    """The same block on every replica at once."""
    return await gather_windows(_run_block(c, settings, role, concurrency, plan, on_done, settle, block)
                                for c in clients)


async def run_all(coros) -> None:
    """Run the coroutines as tasks; if one fails (or this is cancelled), cancel the rest and wait
    for them before raising, so no request is left running."""
    tasks = [asyncio.create_task(c) for c in coros]
    try:
        await asyncio.gather(*tasks)
    except BaseException:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


async def gather_windows(blocks) -> list[Window]:
    """Run one block per replica at once: their windows, or BenchInterrupted with every window
    measured (on the replicas that finished too) when a server went away."""
    outs = await asyncio.gather(*blocks, return_exceptions=True)
    windows, errors = [], []
    for o in outs:
        if isinstance(o, BenchInterrupted):
            windows += o.windows
            errors.append(o.error)
        elif isinstance(o, BaseException):
            raise o
        else:
            windows.append(o)
    if errors:
        raise BenchInterrupted(windows, errors[0])
    return windows


# ---- open loop: requests on a schedule (trtspec.client.openloop: arrivals, SLOs)


async def _run_open_block(client: AsyncLLMClient, settings: BenchSettings, role: str, cap: int,
                          plan: list[tuple[int, PromptItem, int]], offsets: list[float],
                          on_done: Callable[[], None] | None, block: int) -> Window:
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


async def run_open_levels(clients, settings: BenchSettings, prompts: list[PromptItem],
                          plan: Callable[[int, int], list], levels: list[LevelResult],
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


async def bench_async(client: AsyncLLMClient | Sequence[AsyncLLMClient], prompts: list[PromptItem],
                      settings: BenchSettings, *, prompt_source: str = "",
                      progress: Progress | None = None) -> BenchResult:
    """Warm up, then sweep ``settings.concurrency``; see the module docstring for the interleaving.
    ``client``: one server, or one client per replica."""
    clients = list(client) if isinstance(client, (list, tuple)) else [client]
    if not clients:
        raise ConfigError("url", [], "no server to benchmark", fix="pass --url HOST:PORT")
    urls = tuple(c.url for c in clients)
    started = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    t0 = time.perf_counter()
    roles = list(settings.roles)
    for c in clients:
        for model in settings.roles.values():
            await c.model_info(model)  # an unknown model fails here, before any load
    per_level = settings.requests
    n = len(clients)
    n_levels = (len(settings.request_rates or ()) + (settings.schedule is not None)) if settings.open_loop \
        else len(settings.concurrency)
    if settings.schedule is not None and not settings.request_rates:
        per_level = len(settings.schedule)
    budget = settings.max_requests if settings.interval_width is not None else per_level
    total = (n * (settings.warmup * len(roles) + budget * len(roles) * n_levels) if budget else None)
    done = [0]
    label = ["warm-up"]

    def tick():
        done[0] += 1
        if progress:
            progress(done[0], total, label[0])

    def plan(start: int, count: int) -> list[tuple[int, PromptItem, int]]:
        return [(i, prompts[i % len(prompts)], output_len(settings, i)) for i in range(start, start + count)]

    def result(levels: list[LevelResult], interrupted: dict | None = None) -> BenchResult:
        return BenchResult(url=",".join(urls), settings=settings, prompt_source=prompt_source, prompts=prompts,
                           levels=levels, started=started, wall_s=time.perf_counter() - t0, urls=urls,
                           interrupted=interrupted)

    if progress:
        progress(0, total, label[0])
    levels: list[LevelResult] = []
    c = min(settings.concurrency)
    try:
        for role in roles:
            if settings.warmup:
                await _run_replicas(clients, settings, role, c, plan(0, settings.warmup), tick, 0, -1)
        block_no = 0
        if settings.open_loop:
            c = settings.max_concurrency or 0
            await run_open_levels(clients, settings, prompts, plan, levels, tick, label)
        for c in (settings.concurrency if not settings.open_loop else ()):
            block = settings.block or max(8, 4 * c)
            lv = LevelResult(c, [])
            levels.append(lv)
            i = blocks = 0
            while True:
                count = min(block, budget - i) if budget else block
                order = roles if block_no % 2 == 0 else roles[::-1]
                for role in order:
                    label[0] = f"c={c} {role}"
                    # c − 1 unmeasured requests first, so measured ones see a settled loop
                    try:
                        lv.windows += await _run_replicas(clients, settings, role, c, plan(i, count), tick,
                                                          c - 1, block_no)
                    except BenchInterrupted as e:
                        lv.windows += e.windows
                        raise
                i += count
                block_no += 1
                blocks += 1
                if settings.interval_width is not None:
                    lv.stop = stop_rule(lv, settings, i, blocks)
                    if lv.stop is not None:
                        break
                    continue
                if per_level and i >= per_level:
                    break
                if settings.duration_s is not None:
                    spent = min(lv.duration(r) for r in roles)
                    if spent >= settings.duration_s:
                        break
            check_level(lv, settings, urls)
    except BenchInterrupted as e:
        where = next((w for w in e.windows if w.interrupted), None)
        return result([lv for lv in levels if lv.windows], {
            "error": str(e.error).splitlines()[0], "fix": e.error.fix, "concurrency": c,
            "phase": label[0], "replica": where.replica if where else e.error.url})
    return result(levels)


def stop_rule(lv: LevelResult, settings: BenchSettings, requests: int, blocks: int) -> dict | None:
    """Whether a level measured with ``interval_width`` is done after ``requests`` per model in
    ``blocks`` blocks: ``None`` to run another block, else why it stopped (kept in the report).

    It runs at least ``settings.requests``; the interval is judged after an even number of blocks,
    so that each model went first equally often; it stops at ``settings.max_requests`` whatever
    the interval (then saying the interval is wider than asked).

    With ``settings.latency_limit`` (validate: 1 + the tail gates' tolerance) the interval of every
    latency ratio must also have left the limit, below it (the gate passes) or above it (it fails),
    before the level stops short of the budget: two blocks give a t-interval on one degree of
    freedom, so a P95 ratio of 1.10 read [0.87, 1.39] and failed its gate on that width alone."""
    asked, budget = settings.interval_width, settings.max_requests
    if requests < settings.requests and requests < budget:
        return None
    intervals = lv.intervals()
    iv = intervals[SPEEDUP]
    w = iv.width
    shown = "unbounded" if math.isinf(w) else f"{w:.1%}"
    undecided = undecided_latency(intervals, settings.latency_limit)
    if blocks % 2 == 0 and w <= asked and not undecided:
        tail = (f", and every tail-latency ratio is decided against {settings.latency_limit:.2f}"
                if settings.latency_limit is not None else "")
        return {"reason": "interval", "requests": requests, "blocks": blocks, "width": w, "asked": asked,
                "budget": budget, "text": f"stopped after {blocks} blocks ({requests} requests per model): the "
                                          f"speedup's 95 % interval spans {shown} of it, within the {asked:.0%} "
                                          f"asked{tail}"}
    if requests >= budget:
        why = [f"the speedup's 95 % interval spans {shown} of it, "
               + ("WIDER than" if w > asked else "within") + f" the {asked:.0%} asked"]
        if undecided:
            why.append(f"{', '.join(METRICS[m][0] for m in undecided)} still straddle "
                       f"{settings.latency_limit:.2f}")
        return {"reason": "budget", "requests": requests, "blocks": blocks, "width": None if math.isinf(w) else w,
                "asked": asked, "budget": budget, "undecided": undecided,
                "text": f"request budget spent ({budget} per model, {blocks} blocks): " + "; ".join(why)}
    return None


def undecided_latency(intervals: dict, limit: float | None) -> list[str]:
    """The latency metrics whose 95 % interval still holds ``limit`` (low <= limit < high): more
    blocks could move their gate either way. [] without a limit."""
    if limit is None:
        return []
    out = []
    for m, iv in intervals.items():
        if m == SPEEDUP or iv.estimate is None:
            continue
        if iv.low is not None and iv.high is not None and iv.low <= limit < iv.high:
            out.append(m)
    return out


def output_len(settings: BenchSettings, i: int) -> int:
    """max_tokens of request ``i``: the list cycled, or a draw from normal(output_lens[0], stddev)
    seeded by the request's index (the same for both models)."""
    if settings.output_len_stddev > 0:
        return synthetic_length(settings.output_lens[0], settings.output_len_stddev, settings.arrival_seed, "osl", i)
    return settings.output_lens[i % len(settings.output_lens)]


def _shapes(prompts: Sequence[str], settings: BenchSettings) -> tuple[list[str], tuple[int, ...] | None]:
    """The prompt list and lengths to shape: synthetic lengths (mean, stddev) per prompt, or a
    fixed schedule's input lengths (one prompt per scheduled request)."""
    prompts = list(prompts)
    if settings.schedule is not None and any(r.input_length for r in settings.schedule):
        prompts = [prompts[i % len(prompts)] for i in range(len(settings.schedule))]
        mean = settings.prompt_lens[0] if settings.prompt_lens else None
        lens = tuple(r.input_length or mean or len(prompts[i]) for i, r in enumerate(settings.schedule))
        return prompts, lens
    if settings.prompt_len_stddev > 0 and settings.prompt_lens:
        return prompts, tuple(synthetic_length(settings.prompt_lens[0], settings.prompt_len_stddev,
                                               settings.arrival_seed, "isl", i) for i in range(len(prompts)))
    return prompts, settings.prompt_lens


async def _server_facts(client: AsyncLLMClient, settings: BenchSettings) -> dict:
    """The server's name and version (for the exports' stamps) and whether ``ignore_eos`` could be
    honoured (the model takes ``min_length``/``min_tokens``)."""
    out: dict = {}
    try:
        meta = await client.server_metadata()
        out["server"] = {"name": meta.get("name"), "version": meta.get("version")}
    except Exception:  # noqa: BLE001 - a stamp, not a measurement
        out["server"] = {"name": None, "version": None}
    if settings.ignore_eos:
        pinned = {}
        for role, model in settings.roles.items():
            info = await client.model_info(model)
            pinned[role] = next((n for n in ("min_tokens", "min_length") if n in info.inputs), None)
        out["ignore_eos"] = {role: (f"min_length via '{n}'" if n else
                                    "not supported: the model has no min_length/min_tokens input, so outputs "
                                    "may stop at EOS before max_tokens") for role, n in pinned.items()}
    return out


def check_level(lv: LevelResult, settings: BenchSettings, urls: Sequence[str]) -> None:
    """A level where every request of a model failed is no measurement: raise."""
    for role in settings.roles:
        if not any(r.ok for r in lv.records(role)):
            first = next((r.error for r in lv.records(role) if r.error), "no output")

            raise InferenceFailed(f"every request failed at {lv.load}: {first}", url=",".join(urls),
                                  model=settings.roles[role], fix="see the tritonserver log")


def run_bench(url: str | Sequence[str], prompts: Sequence[str], settings: BenchSettings, *, tokenizer=None,
              prompt_source: str = "", progress: Progress | None = None, ready_timeout_s: float = 30.0,
              client_options: ClientOptions | None = None) -> BenchResult:
    """Blocking entry point (CLI, ``trtspec run``): wait for the server(s), shape prompts, run the sweep.

    ``url``: one server, or several replicas (each loaded at every concurrency level); Triton gRPC
    or an OpenAI-compatible ``http(s)://HOST:PORT/v1`` (``client_options``: TLS, headers, endpoint)."""
    urls = [url] if isinstance(url, str) else list(url)

    async def main():
        kw = {"timeout_s": settings.timeout_s, "options": client_options}
        clients = [open_client(urls[0], tokenizer=tokenizer, **kw)]
        clients += [open_client(u, tokenizer=clients[0].tokenizer, **kw) for u in urls[1:]]
        try:
            for c in clients:
                await c.wait_ready(list(settings.roles.values()), timeout_s=ready_timeout_s)
            items = shape_prompts(*_shapes(prompts, settings), clients[0].tokenizer)
            res = await bench_async(clients if len(clients) > 1 else clients[0], items, settings,
                                    prompt_source=prompt_source, progress=progress)
            res.extra.update(await _server_facts(clients[0], settings))
            return res
        finally:
            for c in clients:
                await c.close()

    return asyncio.run(main())
