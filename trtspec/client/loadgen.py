"""Load generator: a concurrency sweep over the speculative and the baseline model, interleaved.

At each concurrency level the requests are cut into blocks; each block runs on one model and then,
with the *same* prompts and output lengths, on the other, alternating which goes first (ABBA) so
slow drift of the machine (thermal, other load) falls on both alike. Within a block, ``c`` workers
each keep one request in flight (a closed loop, as GenAI-Perf's ``--concurrency``); the block's
first ``c − 1`` requests are not measured, so measured requests see a settled loop rather than
``c`` prefills queued at once. The two models never run at the same time, so neither steals the
other's compute.
"""

from __future__ import annotations

import asyncio
import datetime as _dt
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Sequence

from trtspec.client.client import BASELINE_MODEL, SPECULATIVE_MODEL, AsyncLLMClient
from trtspec.client.errors import ServerRequestError, ServerUnavailable
from trtspec.client.metrics import RequestRecord, Window, bucket_speedups, by_bucket, speedups, summarize
from trtspec.client.types import Sampling
from trtspec.errors import ConfigError

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

    def __post_init__(self):
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


@dataclass
class LevelResult:
    concurrency: int
    windows: list[Window]

    def records(self, role: str) -> list[RequestRecord]:
        return [r for w in self.windows if w.role == role for r in w.requests]

    def settling(self, role: str) -> list[RequestRecord]:
        return [r for w in self.windows if w.role == role for r in w.settling]

    def duration(self, role: str) -> float:
        return sum(w.duration_s for w in self.windows if w.role == role)

    def summary(self, role: str) -> dict:
        return summarize(self.records(role), self.duration(role), self.settling(role))


@dataclass
class BenchResult:
    url: str
    settings: BenchSettings
    prompt_source: str
    prompts: list[PromptItem]
    levels: list[LevelResult]
    started: str
    wall_s: float
    extra: dict = field(default_factory=dict)

    @property
    def roles(self) -> list[str]:
        return list(self.settings.roles)

    @property
    def has_baseline(self) -> bool:
        return "baseline" in self.settings.roles

    def level(self, concurrency: int) -> LevelResult | None:
        return next((lv for lv in self.levels if lv.concurrency == concurrency), None)

    def records(self, role: str | None = None) -> list[RequestRecord]:
        return [r for lv in self.levels for w in lv.windows if role in (None, w.role) for r in w.requests]

    def speedup(self, concurrency: int, metric: str = "output_token_throughput") -> float | None:
        lv = self.level(concurrency)
        if lv is None or not self.has_baseline:
            return None
        return speedups(lv.summary("speculative"), lv.summary("baseline"))[metric]

    def to_dict(self, *, with_records: bool = True) -> dict:
        levels = []
        for lv in self.levels:
            d: dict = {"concurrency": lv.concurrency, "models": {}}
            for role in self.roles:
                d["models"][role] = lv.summary(role)
            if self.has_baseline:
                d["speedup"] = speedups(d["models"]["speculative"], d["models"]["baseline"])
            for key in ("prompt_len", "output_len"):
                d[f"by_{key}"] = {role: by_bucket(lv.records(role), key) for role in self.roles}
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
            **self.extra,
        }
        if with_records:
            out["records"] = [r.to_dict() for r in self.records()]
        return out


async def _run_block(client: AsyncLLMClient, settings: BenchSettings, role: str, concurrency: int,
                     plan: list[tuple[int, PromptItem, int]], on_done: Callable[[], None] | None,
                     settle: int = 0) -> Window:
    """Run ``plan`` [(request index, prompt, max_tokens)] on one model with ``concurrency`` in flight.

    The first ``settle`` requests are sent but their latencies are not measured: a closed loop
    starts with all its workers in lockstep (every first prefill queued at once); perf_analyzer
    measures after its warm-up has desynchronised the loop. Their tokens still count towards
    the window's throughput."""
    model = settings.roles[role]
    queue = list(reversed([(True, x) for x in plan[:settle]] + [(False, x) for x in plan]))
    window = Window(role=role, concurrency=concurrency, start=time.perf_counter(), end=0.0)

    async def worker():
        while queue:
            settling, (_, item, max_tokens) = queue.pop()
            sampling = settings.sampling.with_(max_tokens=max_tokens)
            start = time.perf_counter()
            try:
                res = await client.generate(item.text, sampling, model=model, stream=settings.stream,
                                            timeout_s=settings.timeout_s)
                plen, unit = (res.prompt_tokens, "tokens") if res.prompt_tokens is not None else (item.length, item.unit)
                rec = RequestRecord.from_result(res, role=role, concurrency=concurrency, prompt_index=item.index,
                                                max_tokens=max_tokens, prompt_len=plen, prompt_len_unit=unit)
            except ServerUnavailable:
                raise  # the server is gone: measuring on would only record failures
            except ServerRequestError as e:
                rec = RequestRecord.failed(role=role, model=model, concurrency=concurrency, prompt_index=item.index,
                                           max_tokens=max_tokens, start=start, error=str(e).splitlines()[0])
            if settling:
                window.settling.append(rec)
                continue
            window.requests.append(rec)
            if on_done:
                on_done()

    tasks = [asyncio.create_task(worker()) for _ in range(min(concurrency, len(plan)))]
    try:
        await asyncio.gather(*tasks)
    except BaseException:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
    window.end = time.perf_counter()
    return window


async def bench_async(client: AsyncLLMClient, prompts: list[PromptItem], settings: BenchSettings, *,
                      prompt_source: str = "", progress: Progress | None = None) -> BenchResult:
    """Warm up, then sweep ``settings.concurrency``; see the module docstring for the interleaving."""
    started = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    t0 = time.perf_counter()
    roles = list(settings.roles)
    for model in settings.roles.values():
        await client.model_info(model)  # an unknown model fails here, before any load
    per_level = settings.requests
    total = (settings.warmup * len(roles) + per_level * len(roles) * len(settings.concurrency)) if per_level else None
    done = [0]
    label = ["warm-up"]

    def tick():
        done[0] += 1
        if progress:
            progress(done[0], total, label[0])

    def plan(start: int, n: int) -> list[tuple[int, PromptItem, int]]:
        return [(i, prompts[i % len(prompts)], settings.output_lens[i % len(settings.output_lens)])
                for i in range(start, start + n)]

    if progress:
        progress(0, total, label[0])
    for role in roles:
        if settings.warmup:
            await _run_block(client, settings, role, min(settings.concurrency), plan(0, settings.warmup), tick)

    levels, block_no = [], 0
    for c in settings.concurrency:
        block = settings.block or max(8, 4 * c)
        windows: list[Window] = []
        i = 0
        while True:
            n = min(block, per_level - i) if per_level else block
            order = roles if block_no % 2 == 0 else roles[::-1]
            for role in order:
                label[0] = f"c={c} {role}"
                # c − 1 unmeasured requests first, so measured ones see a settled loop
                windows.append(await _run_block(client, settings, role, c, plan(i, n), tick, settle=c - 1))
            i += n
            block_no += 1
            if per_level and i >= per_level:
                break
            if settings.duration_s is not None:
                spent = min(sum(w.duration_s for w in windows if w.role == r) for r in roles)
                if spent >= settings.duration_s:
                    break
        lv = LevelResult(c, windows)
        for role in roles:
            if not any(r.ok for r in lv.records(role)):
                first = next((r.error for r in lv.records(role) if r.error), "no output")
                from trtspec.client.errors import InferenceFailed

                raise InferenceFailed(f"every request failed at concurrency {c}: {first}", url=client.url,
                                      model=settings.roles[role], fix="see the tritonserver log")
        levels.append(lv)
    return BenchResult(url=client.url, settings=settings, prompt_source=prompt_source, prompts=prompts,
                       levels=levels, started=started, wall_s=time.perf_counter() - t0)


def run_bench(url: str, prompts: Sequence[str], settings: BenchSettings, *, tokenizer=None,
              prompt_source: str = "", progress: Progress | None = None, ready_timeout_s: float = 30.0) -> BenchResult:
    """Blocking entry point (CLI, ``trtspec run``): wait for the server, shape prompts, run the sweep."""
    async def main():
        async with AsyncLLMClient(url, tokenizer=tokenizer, timeout_s=settings.timeout_s) as client:
            await client.wait_ready(list(settings.roles.values()), timeout_s=ready_timeout_s)
            items = shape_prompts(prompts, settings.prompt_lens, client.tokenizer)
            return await bench_async(client, items, settings, prompt_source=prompt_source, progress=progress)

    return asyncio.run(main())
