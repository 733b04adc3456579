"""What quantization costs, measured on held-out text and in speculation.

* logits: the quantized model against its unquantized self, teacher-forced on held-out windows:
  top-1 agreement, KL(p_base || p_quant) per token (nats), perplexity before/after;
* acceptance: the draft's acceptance rate against the target (accepted / drafted, greedy) before
  and after quantizing either of them, measured with the torch engine (Engine +
  DraftModelProposer); when the target is the quantized one, also whether speculative greedy
  output equals the quantized target's own plain greedy output (it must: greedy verification
  only ever emits the target's argmax).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from trtspec.speculative.engine import Engine
from trtspec.speculative.model import CausalLM
from trtspec.speculative.proposers import DraftModelProposer
from trtspec.sampling import Sampling

Progress = Callable[[str, int, int, dict], None]


@dataclass(frozen=True)
class QualitySettings:
    """Sizes of the quality measurement (defaults: a few seconds on CPU for the tiny pair)."""

    eval_windows: int = 16  # held-out windows for the logit metrics
    eval_seq_len: int = 128
    prompts: int = 8  # held-out stdlib prompts for the acceptance measurement
    prompt_tokens: int = 64  # prompts are cut to this many tokens
    max_new_tokens: int = 32
    max_draft_len: int = 4
    batch_size: int = 4

    def to_dict(self) -> dict:
        return asdict(self)


@torch.inference_mode()
def compare_logits(base: CausalLM, quant: CausalLM, windows: torch.Tensor, *, batch_size: int = 4,
                   progress: Progress | None = None) -> dict:
    """Teacher-forced metrics of ``quant`` against ``base`` on ``windows [N, L]``."""
    n_tok = agree = 0
    kl_sum = nll_base = nll_quant = 0.0
    N = windows.shape[0]
    for i in range(0, N, batch_size):
        x = windows[i : i + batch_size].to(base.lm_head.weight.device)
        inp, tgt = x[:, :-1], x[:, 1:]
        lp_b = F.log_softmax(base(inp, None).float(), -1)  # [B, L-1, V]
        lp_q = F.log_softmax(quant(inp, None).float(), -1)
        agree += int((lp_b.argmax(-1) == lp_q.argmax(-1)).sum())
        kl_sum += float((lp_b.exp() * (lp_b - lp_q)).sum())
        nll_base -= float(lp_b.gather(-1, tgt[..., None]).sum())
        nll_quant -= float(lp_q.gather(-1, tgt[..., None]).sum())
        n_tok += tgt.numel()
        if progress:
            progress("quality", min(i + batch_size, N), N, {})
    ppl_b, ppl_q = math.exp(nll_base / n_tok), math.exp(nll_quant / n_tok)
    return {
        "tokens": n_tok,
        "top1_agreement": agree / n_tok,
        "kl_divergence": kl_sum / n_tok,
        "perplexity_base": ppl_b,
        "perplexity_quantized": ppl_q,
        "perplexity_change_pct": 100.0 * (ppl_q / ppl_b - 1.0),
    }


@torch.inference_mode()
def teacher_forced_agreement(target: CausalLM, draft: CausalLM, windows: torch.Tensor, *, batch_size: int = 4) -> float:
    """Share of held-out positions where the draft's argmax equals the target's: the per-token
    greedy acceptance probability on *fixed* text (no trajectory noise, unlike generation)."""
    agree = n = 0
    for i in range(0, windows.shape[0], batch_size):
        x = windows[i : i + batch_size, :-1].to(target.lm_head.weight.device)
        agree += int((target(x, None).argmax(-1) == draft(x, None).argmax(-1)).sum())
        n += x.numel()
    return agree / n


def _engine(target: CausalLM, draft: CausalLM | None, s: QualitySettings, max_prompt: int) -> Engine:
    max_seq_len = max_prompt + s.max_new_tokens + 1
    proposer = None
    if draft is not None:
        proposer = DraftModelProposer(draft, s.batch_size, max_seq_len + s.max_draft_len + 2)
    return Engine(target, proposer, max_draft_len=s.max_draft_len, max_batch_size=s.batch_size,
                  max_seq_len=max_seq_len)


def greedy(target: CausalLM, draft: CausalLM | None, prompts: list[list[int]], s: QualitySettings) -> dict:
    """Greedy generation of every prompt (``ignore_eos``: fixed work); speculative if ``draft``."""
    eng = _engine(target, draft, s, max(len(p) for p in prompts))
    gens = eng.generate(prompts, Sampling(max_tokens=s.max_new_tokens, ignore_eos=True))
    drafted = sum(g.stats.drafted for g in gens)
    accepted = sum(g.stats.accepted for g in gens)
    steps = sum(g.stats.steps for g in gens)
    return {
        "outputs": [g.token_ids for g in gens],
        "drafted": drafted,
        "accepted": accepted,
        "acceptance_rate": accepted / drafted if drafted else None,
        # tokens per target pass after prefill: (accepted + one correction/bonus per pass) / passes
        "acceptance_length": (accepted + steps) / steps if steps else None,
    }


def acceptance(
    *, quantized_role: str, base: CausalLM, quant: CausalLM, pair: CausalLM,
    prompts: list[list[int]], settings: QualitySettings, windows: torch.Tensor | None = None,
    progress: Progress | None = None,
) -> dict:
    """Acceptance of the draft against the target before and after quantizing ``quantized_role``
    (and, with held-out ``windows``, their teacher-forced top-1 agreement before and after)."""
    if quantized_role == "target":
        runs = {"before": (base, pair), "after": (quant, pair)}
    else:
        runs = {"before": (pair, base), "after": (pair, quant)}
    total = len(runs) + (quantized_role == "target")
    out: dict = {"quantized": quantized_role}
    if windows is not None:
        out["teacher_forced_agreement"] = {
            name: teacher_forced_agreement(t, d, windows, batch_size=settings.batch_size) for name, (t, d) in runs.items()
        }
    for i, (name, (t, d)) in enumerate(runs.items()):
        r = greedy(t, d, prompts, settings)
        out[name] = {k: v for k, v in r.items() if k != "outputs"}
        out[f"_{name}_outputs"] = r["outputs"]
        if progress:
            progress("acceptance", i + 1, total, {})
    if quantized_role == "target":
        plain = greedy(quant, None, prompts, settings)["outputs"]
        out["speculative_greedy_identical"] = plain == out["_after_outputs"]
        if progress:
            progress("acceptance", total, total, {})
    b, a = out["before"]["acceptance_rate"], out["after"]["acceptance_rate"]
    out["acceptance_rate_change"] = (a - b) if a is not None and b is not None else None
    out.pop("_before_outputs")
    out.pop("_after_outputs")
    return out
