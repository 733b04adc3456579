"""Draft-length tuning (``trtspec tune``): which ``max_draft_len`` pays best on this machine.

Measured, not assumed:
  α_i  per-position conditional acceptance (draft token i accepted | tokens before it accepted),
       from a run with a long draft on real prompts;
  c    cost of one draft token / cost of one ordinary target step;
  v_k  cost of one target pass over k+1 tokens / cost of one ordinary target step.

Expected speedup of draft length k (Leviathan et al. 2023, with measured per-position α and a
measured verify cost instead of the constant-α, v_k = 1 idealisation):

    S(k) = (1 + Σ_{i=1..k} Π_{j≤i} α_j) / (k·c + v_k)
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

import torch

from trtspec.speculative.engine import Engine
from trtspec.speculative.model import Step
from trtspec.sampling import Sampling
from trtspec.acceptance import TuneRow, break_even_acceptance, expected_speedup, expected_tokens
from trtspec.speculative.stats import Aggregate


@dataclass
class TuneResult:
    per_position_acceptance: list[float]
    acceptance_rate: float
    acceptance_length: float  # measured at k_max
    cost_ratio: float  # c
    verify_ratio: dict[int, float]  # v_k
    target_step_ms: float
    draft_token_ms: float
    rows: list[TuneRow] = field(default_factory=list)
    recommended_k: int = 0
    break_even_acceptance: float = 0.0  # for the recommended k (0 → for k=1)
    measured_on: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["verify_ratio"] = {str(k): round(v, 4) for k, v in self.verify_ratio.items()}
        return d


def _time(fn, repeats: int = 7, inner: int = 5) -> float:
    """Minimum over ``repeats`` of the mean of ``inner`` calls (seconds): on a shared, noisy CPU
    the least-disturbed repeat is the best estimate of what a pass costs."""
    fn()
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        samples.append((time.perf_counter() - t0) / inner)
    return min(samples)


@torch.inference_mode()
def measure_verify_costs(engine: Engine, k_max: int, context: int = 128, repeats: int = 7) -> tuple[float, dict[int, float]]:
    """Seconds for one target pass over 1 token, and v_k for k = 1..k_max, at ``context`` tokens."""
    target = engine.target
    dev = engine.device
    cache = target.new_cache(1, context + k_max + 2)
    ids = torch.randint(0, target.args.vocab_size, (1, context), device=dev)
    target(ids, cache, Step([0], [0], context), logits="none")
    times = {}
    for k in range(0, k_max + 1):
        x = torch.randint(0, target.args.vocab_size, (1, k + 1), device=dev)
        times[k] = _time(lambda: target(x, cache, Step([0], [context], k + 1)), repeats=repeats, inner=3)
    base = times[0]
    return base, {k: times[k] / base for k in range(1, k_max + 1)}


def tune(
    engine: Engine,
    prompts: list[list[int]],
    *,
    max_new_tokens: int = 64,
    k_max: int | None = None,
    timing_repeats: int = 7,
) -> TuneResult:
    """Measure α_i with drafts of length ``k_max`` on ``prompts``, time c and v_k, rank k."""
    if engine.proposer is None:
        raise ValueError("tune needs a proposer (a draft model, EAGLE head or n-gram)")
    k_max = k_max or engine.max_draft_len
    engine.max_draft_len = k_max
    engine.adaptive, engine.goodput, engine.policy = False, None, "off"  # drafts of k_max: α_i at every i
    outs = engine.generate(prompts, Sampling(max_tokens=max_new_tokens))
    agg = Aggregate()
    for o in outs:
        agg.add(o.stats)
    alphas = agg.per_position_acceptance()
    step_s, v = measure_verify_costs(engine, k_max, repeats=timing_repeats)
    # draft cost per token, from the run itself (includes the proposer's catch-up feed)
    draft_token_s = agg.draft_s / max(agg.steps * k_max, 1)
    c = draft_token_s / step_s
    rows = []
    for k in range(0, k_max + 1):
        vk = 1.0 if k == 0 else v[k]
        cost = k * c + vk
        rows.append(TuneRow(k, expected_tokens(alphas, k), cost, expected_speedup(alphas, k, c, vk)))
    best = max(rows, key=lambda r: r.expected_speedup)
    return TuneResult(
        per_position_acceptance=alphas,
        acceptance_rate=agg.acceptance_rate,
        acceptance_length=agg.acceptance_length,
        cost_ratio=c,
        verify_ratio=v,
        target_step_ms=step_s * 1e3,
        draft_token_ms=draft_token_s * 1e3,
        rows=rows,
        recommended_k=best.k,
        break_even_acceptance=break_even_acceptance(c, max(best.k, 1), v.get(max(best.k, 1), 1.0)),
        measured_on={"prompts": len(prompts), "max_new_tokens": max_new_tokens, "k_max": k_max,
                     "torch_threads": torch.get_num_threads(), "device": str(engine.device)},
    )
