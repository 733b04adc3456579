"""``trtspec validate``: equivalence, latency and acceptance through a running server → verdict.

Called by the CLI and by ``trtspec run`` (with the server it started). Returns a typed
:class:`ValidationResult`; writing the report is :func:`trtspec.validate.report.write_validation_report`.
"""

from __future__ import annotations

import asyncio
import datetime as _dt
import os
import time
from dataclasses import dataclass
from typing import Callable

from trtspec.client.client import BASELINE_MODEL, SPECULATIVE_MODEL, AsyncLLMClient
from trtspec.client.loadgen import BenchResult, BenchSettings, bench_async, shape_prompts
from trtspec.client.metrics import acceptance_summary
from trtspec.client.types import Sampling
from trtspec.validate.equivalence import EquivalenceResult, SampledResult, greedy_equivalence, sampled_check
from trtspec.validate.gates import Verdict, evaluate

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
    speedup: float | None
    at_concurrency: int
    verdict: Verdict
    started: str
    wall_s: float

    @property
    def exit_code(self) -> int:
        """0 = deploy speculative, 1 = keep the baseline."""
        return 0 if self.verdict.deploy_speculative else 1

    def to_dict(self, *, with_records: bool = True) -> dict:
        return {
            "kind": "validate",
            "recipe": self.recipe,
            "url": self.url,
            "models": self.models,
            "started": self.started,
            "wall_s": round(self.wall_s, 3),
            "verdict": self.verdict.to_dict(),
            "speedup": {"at_concurrency": self.at_concurrency, "output_token_throughput": self.speedup},
            "acceptance": self.acceptance,
            "equivalence": self.equivalence.to_dict(),
            "sampled": self.sampled.to_dict() if self.sampled else None,
            "sampled_note": self.sampled_note,
            "bench": self.bench.to_dict(with_records=with_records),
        }


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


async def validate_async(client: AsyncLLMClient, recipe, *, speculative_model: str = SPECULATIVE_MODEL,
                         baseline_model: str = BASELINE_MODEL, progress: Progress | None = None) -> ValidationResult:
    from trtspec.prompts import load_prompts

    v = recipe.validation
    started = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    t0 = time.perf_counter()
    prompts = load_prompts(v.prompts, v.num_prompts)
    for m in (speculative_model, baseline_model):
        await client.model_info(m)
    levels = tuple(sorted(set(v.concurrency) | {v.gates.at_concurrency}))

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
    #    numerics can shift a greedy argmax, so that is where to look
    eq = await greedy_equivalence(
        client, prompts, max_tokens=v.max_tokens, tolerance=v.equivalence_tolerance,
        speculative_model=speculative_model, baseline_model=baseline_model, concurrency=max(levels),
        on_done=phase("greedy equivalence", 2 * len(prompts)))

    # 2. sampled distribution check
    sampled, note = None, None
    if v.sampled_check_samples > 0:
        s = v.sampling
        base = Sampling.from_recipe(s, SAMPLED_LENGTH)
        if s.temperature == 0:
            base = base.with_(temperature=SAMPLED_TEMPERATURE, top_k=s.top_k or SAMPLED_TOP_K, top_p=s.top_p,
                              seed=s.seed)
            note = (f"validation.sampling is greedy; the distribution check samples at temperature "
                    f"{SAMPLED_TEMPERATURE}, top_k {base.top_k} to exercise the sampled verifier")
        sp = prompts[:SAMPLED_PROMPTS]
        sampled = await sampled_check(
            client, sp, base, samples=v.sampled_check_samples, speculative_model=speculative_model,
            baseline_model=baseline_model, length=SAMPLED_LENGTH, alpha=SAMPLED_ALPHA, concurrency=max(levels),
            seed=s.seed, on_done=phase("sampled check", 2 * len(sp) * v.sampled_check_samples))
    else:
        note = "not run (validation.sampled_check_samples is 0)"

    # 3. latency and acceptance under load, both models interleaved on the same prompts
    settings = BenchSettings(
        concurrency=levels, requests=v.requests_per_level, warmup=v.warmup_requests,
        output_lens=(v.max_tokens,), sampling=Sampling.from_recipe(v.sampling, v.max_tokens),
        speculative_model=speculative_model, baseline_model=baseline_model)
    items = shape_prompts(prompts, None, client.tokenizer)
    bench = await bench_async(client, items, settings, prompt_source=v.prompts, progress=progress)

    acceptance = acceptance_from(bench.records("speculative"), recipe.max_draft_len or None)
    speedup = bench.speedup(v.gates.at_concurrency)
    verdict = evaluate(v.gates, mismatch_rate=eq.mismatch_rate, exact_match_rate=eq.exact_match_rate,
                       tolerance=v.equivalence_tolerance, speedup=speedup,
                       acceptance_rate=acceptance["gate_value"], acceptance_source=acceptance["source"],
                       sampled=sampled)
    return ValidationResult(
        recipe=recipe.name, url=client.url, models={"speculative": speculative_model, "baseline": baseline_model},
        equivalence=eq, sampled=sampled, sampled_note=note, bench=bench, acceptance=acceptance, speedup=speedup,
        at_concurrency=v.gates.at_concurrency, verdict=verdict, started=started, wall_s=time.perf_counter() - t0)


def run_validation(url: str, recipe, *, tokenizer: str | None | bool = True, speculative_model: str = SPECULATIVE_MODEL,
                   baseline_model: str = BASELINE_MODEL, progress: Progress | None = None,
                   ready_timeout_s: float = 30.0) -> ValidationResult:
    """Blocking entry point. ``tokenizer=True`` uses the recipe target's tokenizer when present
    (prompt lengths in tokens); ``False``/``None`` uses none; a string is a folder."""
    tok = default_tokenizer(recipe) if tokenizer is True else (tokenizer or None)

    async def main():
        async with AsyncLLMClient(url, tokenizer=tok) as client:
            await client.wait_ready([speculative_model, baseline_model], timeout_s=ready_timeout_s)
            return await validate_async(client, recipe, speculative_model=speculative_model,
                                        baseline_model=baseline_model, progress=progress)

    return asyncio.run(main())
