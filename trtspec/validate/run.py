"""``trtspec validate``: equivalence, latency and acceptance through a running server → verdict.

Called by the CLI and by ``trtspec run`` (with the server it started). Returns a typed
:class:`ValidationResult`; writing the report is :func:`trtspec.validate.report.write_validation_report`.

Several servers (replicas of one deployment): equivalence and the sampled check run on each
replica (every replica must serve the same outputs); the load runs on all at once. The gates
judge the worst replica's equivalence and sampled check and the speedup of all replicas
together.
"""

from __future__ import annotations

import asyncio
import datetime as _dt
import os
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

from trtspec.client.client import BASELINE_MODEL, SPECULATIVE_MODEL, AsyncLLMClient
from trtspec.client.errors import ServerUnavailable
from trtspec.client.loadgen import BenchResult, BenchSettings, bench_async, shape_prompts
from trtspec.client.metrics import acceptance_summary
from trtspec.client.connect import open_client
from trtspec.client.targets import ClientOptions
from trtspec.client.types import Sampling
from trtspec.validate.equivalence import EquivalenceResult, SampledResult, greedy_equivalence, sampled_check
from trtspec.client.intervals import SPEEDUP, Interval
from trtspec.validate.gates import Verdict, evaluate, level_comparisons
from trtspec.prompts import load_prompts

Progress = Callable[[int, "int | None", str], None]

SAMPLED_PROMPTS = 4  # prompts in the sampled check (each gets validation.sampled_check_samples per model)
SAMPLED_LENGTH = 3  # tokens per continuation: the shortest that includes a verify step
SAMPLED_ALPHA = 1e-3  # family-wise false-alarm rate of the sampled check
SAMPLED_TEMPERATURE = 1.0  # used when the recipe's sampling is greedy ...
SAMPLED_TOP_K = 10  # ... with top-k, so that a few hundred samples have the power to see a difference


@dataclass
class ValidationResult:
    recipe: str
    url: str
    models: dict[str, str]
    equivalence: EquivalenceResult
    sampled: SampledResult | None
    sampled_note: str | None
    bench: BenchResult
    acceptance: dict
    speedup: float | None  # pooled output tokens/s ratio at at_concurrency (the bench tables' figure)
    at_concurrency: int
    verdict: Verdict
    started: str
    wall_s: float
    # several replicas: {url: (equivalence, sampled)}; ``equivalence``/``sampled`` above are the
    # worst replica's (what the gates judge)
    replicas: dict[str, tuple[EquivalenceResult, SampledResult | None]] = field(default_factory=dict)
    speedup_interval: Interval | None = None  # the ratio over the paired blocks and its 95 % interval (the gate's)

    @property
    def exit_code(self) -> int:
        """0 = deploy speculative, 1 = keep the baseline."""
        return 0 if self.verdict.deploy_speculative else 1

    def to_dict(self, *, with_records: bool = True) -> dict:
        out = {
            "kind": "validate",
            "recipe": self.recipe,
            "url": self.url,
            "models": self.models,
            "started": self.started,
            "wall_s": round(self.wall_s, 3),
            "verdict": self.verdict.to_dict(),
            "speedup": {"at_concurrency": self.at_concurrency, "output_token_throughput": self.speedup,
                        "interval": self.speedup_interval.to_dict() if self.speedup_interval else None},
            "acceptance": self.acceptance,
            "equivalence": self.equivalence.to_dict(),
            "sampled": self.sampled.to_dict() if self.sampled else None,
            "sampled_note": self.sampled_note,
            "bench": self.bench.to_dict(with_records=with_records),
        }
        if len(self.replicas) > 1:
            out["urls"] = list(self.replicas)
            out["replicas"] = {url: {"equivalence": eq.to_dict(), "sampled": sa.to_dict() if sa else None,
                                     "speedup": self.bench.speedup(self.at_concurrency, replica=url)}
                               for url, (eq, sa) in self.replicas.items()}
        return out


def default_tokenizer(recipe) -> str | None:
    """The target's tokenizer folder, if it exists here (prompt lengths in tokens)."""
    path = recipe.target.tokenizer or recipe.target.model
    return path if path and os.path.isfile(os.path.join(path, "tokenizer_config.json")) else None


def acceptance_from(records, max_draft_len: int | None) -> dict:
    """The acceptance the gate judges: the server's counters, else the chunk proxy."""
    acc = acceptance_summary(records)
    if acc["acceptance_rate"] is not None and acc["draft_tokens"]:
        acc["gate_value"], acc["source"] = acc["acceptance_rate"], "server counters"
    elif acc["acceptance_length_from_chunks"] is not None and max_draft_len:
        # each decode step drafts up to max_draft_len tokens and emits accepted + 1
        acc["gate_value"] = max(0.0, (acc["acceptance_length_from_chunks"] - 1) / max_draft_len)
        acc["source"] = f"chunk proxy (AL - 1) / max_draft_len={max_draft_len} (the server reported no counters)"
    else:
        acc["gate_value"], acc["source"] = None, "not reported by the server"
    return acc


def _worst(replicas: dict[str, tuple[EquivalenceResult, SampledResult | None]]):
    """The replica the gates judge: most mismatches (then fewest exact matches), and the sampled
    check that failed or came closest to failing."""
    eq = max((e for e, _ in replicas.values()), key=lambda e: (e.mismatch_rate, -e.exact_match_rate))
    sampled = [s for _, s in replicas.values() if s is not None]
    worst = min(sampled, key=lambda s: (s.passed, s.min_p_value if s.min_p_value is not None else -1.0),
                default=None)
    return eq, worst


async def validate_async(client: AsyncLLMClient | Sequence[AsyncLLMClient], recipe, *,
                         speculative_model: str = SPECULATIVE_MODEL, baseline_model: str = BASELINE_MODEL,
                         progress: Progress | None = None) -> ValidationResult:

    clients = list(client) if isinstance(client, (list, tuple)) else [client]
    v = recipe.validation
    started = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    t0 = time.perf_counter()
    prompts = load_prompts(v.prompts, v.num_prompts)
    for c in clients:
        for m in (speculative_model, baseline_model):
            await c.model_info(m)
    levels = tuple(sorted(set(v.concurrency) | {v.gates.at_concurrency}))
    n = len(clients)

    def phase(label: str, total: int | None):
        done = [0]
        if progress:
            progress(0, total, label)

        def tick():
            done[0] += 1
            if progress:
                progress(done[0], total, label)
        return tick

    # 1. greedy equivalence, at the highest concurrency: batched verification is where
    #    numerics can shift a greedy argmax, so that is where to look; every replica on its own
    tick = phase("greedy equivalence", 2 * len(prompts) * n)
    eqs = await asyncio.gather(*[greedy_equivalence(
        c, prompts, max_tokens=v.max_tokens, tolerance=v.equivalence_tolerance,
        speculative_model=speculative_model, baseline_model=baseline_model, concurrency=max(levels),
        on_done=tick) for c in clients])

    # 2. sampled distribution check, on every replica
    sampled_each: list[SampledResult | None] = [None] * n
    note = None
    if v.sampled_check_samples > 0:
        s = v.sampling
        base = Sampling.from_recipe(s, SAMPLED_LENGTH)
        if s.temperature == 0:
            base = base.with_(temperature=SAMPLED_TEMPERATURE, top_k=s.top_k or SAMPLED_TOP_K, top_p=s.top_p,
                              seed=s.seed)
            note = (f"validation.sampling is greedy; the distribution check samples at temperature "
                    f"{SAMPLED_TEMPERATURE}, top_k {base.top_k} to exercise the sampled verifier")
        sp = prompts[:SAMPLED_PROMPTS]
        tick = phase("sampled check", 2 * len(sp) * v.sampled_check_samples * n)
        sampled_each = list(await asyncio.gather(*[sampled_check(
            c, sp, base, samples=v.sampled_check_samples, speculative_model=speculative_model,
            baseline_model=baseline_model, length=SAMPLED_LENGTH, alpha=SAMPLED_ALPHA, concurrency=max(levels),
            seed=s.seed, on_done=tick) for c in clients]))
    else:
        note = "not run (validation.sampled_check_samples is 0)"
    replicas = {c.url: (e, sa) for c, e, sa in zip(clients, eqs, sampled_each)}
    eq, sampled = _worst(replicas)

    # 3. latency and acceptance under load, both models interleaved on the same prompts, in blocks
    #    repeated until the speedup's interval is narrow enough and every tail gate is decided, or
    #    the request budget is spent
    settings = BenchSettings(
        concurrency=levels, requests=v.requests_per_level, warmup=v.warmup_requests,
        output_lens=(v.max_tokens,), sampling=Sampling.from_recipe(v.sampling, v.max_tokens),
        speculative_model=speculative_model, baseline_model=baseline_model, block=v.block_requests,
        interval_width=v.interval_width, max_requests=v.request_budget,
        # a level also runs on (within the budget) while a tail gate's interval holds its limit
        latency_limit=(1 + v.gates.latency_tolerance
                       if v.interval_width is not None and v.gates.latency_tolerance is not None else None))
    items = shape_prompts(prompts, None, clients[0].tokenizer)
    bench = await bench_async(clients if n > 1 else clients[0], items, settings, prompt_source=v.prompts,
                              progress=progress)
    if bench.interrupted is not None:
        i = bench.interrupted
        raise ServerUnavailable(f"the load phase stopped at concurrency {i['concurrency']}: {i['error']}",
                                url=i.get("replica"), fix=i.get("fix") or "check the tritonserver log")

    acceptance = acceptance_from(bench.records("speculative"), recipe.max_draft_len or None)
    speedup = bench.speedup(v.gates.at_concurrency)
    comparisons = level_comparisons(bench)
    at = comparisons.get(v.gates.at_concurrency, {}).get(SPEEDUP)
    verdict = evaluate(v.gates, mismatch_rate=eq.mismatch_rate, exact_match_rate=eq.exact_match_rate,
                       tolerance=v.equivalence_tolerance, speedup=at.interval if at else None,
                       acceptance_rate=acceptance["gate_value"], acceptance_source=acceptance["source"],
                       sampled=sampled, levels=comparisons)
    return ValidationResult(
        recipe=recipe.name, url=bench.url, models={"speculative": speculative_model, "baseline": baseline_model},
        equivalence=eq, sampled=sampled, sampled_note=note, bench=bench, acceptance=acceptance, speedup=speedup,
        at_concurrency=v.gates.at_concurrency, verdict=verdict, started=started, wall_s=time.perf_counter() - t0,
        replicas=replicas if n > 1 else {}, speedup_interval=at.interval if at else None)


def run_validation(url: str | Sequence[str], recipe, *, tokenizer: str | None | bool = True,
                   speculative_model: str = SPECULATIVE_MODEL, baseline_model: str = BASELINE_MODEL,
                   progress: Progress | None = None, ready_timeout_s: float = 30.0,
                   client_options: ClientOptions | None = None) -> ValidationResult:
    """Blocking entry point. ``url``: one server or several replicas (Triton gRPC or OpenAI-compatible
    http(s); ``client_options``: TLS, headers, endpoint). ``tokenizer=True`` uses the
    recipe target's tokenizer when present (prompt lengths in tokens); ``False``/``None`` uses
    none; a string is a folder."""
    tok = default_tokenizer(recipe) if tokenizer is True else (tokenizer or None)
    urls = [url] if isinstance(url, str) else list(url)

    async def main():
        clients = [open_client(urls[0], tokenizer=tok, options=client_options)]
        clients += [open_client(u, tokenizer=clients[0].tokenizer, options=client_options) for u in urls[1:]]
        try:
            for c in clients:
                await c.wait_ready([speculative_model, baseline_model], timeout_s=ready_timeout_s)
            return await validate_async(clients if len(clients) > 1 else clients[0], recipe,
                                        speculative_model=speculative_model, baseline_model=baseline_model,
                                        progress=progress)
        finally:
            for c in clients:
                await c.close()

    return asyncio.run(main())
