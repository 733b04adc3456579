"""The verifier: which draft tokens the target accepts, and the token that follows them.

Speculative sampling (Leviathan et al. 2023, Alg. 1; Chen et al. 2023). For draft tokens
``x_1..x_k`` drawn from the draft distributions ``q_i`` and the target distributions ``p_i``
(``p_{k+1}`` comes free from the same target pass):

    accept x_i with probability min(1, p_i(x_i) / q_i(x_i)), left to right;
    at the first rejection i, emit a token from norm(max(0, p_i - q_i))   (the residual);
    if all k are accepted, emit the bonus token from p_{k+1}.

The emitted sequence is distributed exactly as sampling from the target alone. A proposer
without a distribution (n-gram lookup) is a point mass q_i = onehot(x_i): accept with p_i(x_i),
resample from p_i with x_i removed. With greedy parameters p_i is the one-hot argmax, and the
rule reduces to "accept while the draft token equals the target's argmax", which
:func:`verify_greedy` computes for a whole batch at once.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from trtspec.sampling import Sampling
from trtspec.speculative.sampling import logits_to_probs, sample


@dataclass
class Verdict:
    accepted: int  # n: draft tokens accepted (0..k)
    next_token: int  # the correction (n < k) or bonus (n == k) token from the target
    bonus: bool  # True when every draft token was accepted


def verify_greedy(
    draft_tokens: torch.Tensor,  # [B, K] (rows may use fewer than K: see draft_lens)
    target_logits: torch.Tensor,  # [B, K+1, V]
    draft_lens: torch.Tensor,  # [B] valid draft tokens per row
) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy verification for a batch: returns (accepted [B], next_token [B])."""
    B, K = draft_tokens.shape
    best = target_logits.argmax(-1)  # [B, K+1]
    if K == 0:
        return torch.zeros(B, dtype=torch.long, device=best.device), best[:, 0]
    valid = torch.arange(K, device=best.device)[None, :] < draft_lens[:, None]
    match = (draft_tokens == best[:, :K]) & valid
    accepted = match.long().cumprod(-1).sum(-1)  # length of the matching prefix
    next_token = best.gather(1, accepted[:, None]).squeeze(1)
    return accepted, next_token


def verify_sampled(
    draft_tokens: torch.Tensor,  # [k]
    draft_probs: torch.Tensor | None,  # [k, V], None = point-mass proposal (n-gram)
    target_logits: torch.Tensor,  # [k+1, V]
    params: Sampling,
    generator: torch.Generator | None,
) -> Verdict:
    """Speculative sampling for one row (see the module docstring for the rule)."""
    k = draft_tokens.shape[0]
    p = logits_to_probs(target_logits, params)  # [k+1, V]
    if k == 0:
        return Verdict(0, int(sample(p[0], generator)), True)
    idx = torch.arange(k, device=p.device)
    p_x = p[idx, draft_tokens]  # p_i(x_i)
    q_x = draft_probs[idx, draft_tokens] if draft_probs is not None else torch.ones_like(p_x)
    r = torch.rand(k, generator=generator, device=p.device)
    # accept x_i when r_i < p_i(x_i)/q_i(x_i)  (⇔ r_i * q_i(x_i) < p_i(x_i); no division by 0)
    accept = r * q_x < p_x
    n = int(accept.long().cumprod(0).sum())
    if n == k:
        return Verdict(k, int(sample(p[k], generator)), True)
    q_n = draft_probs[n] if draft_probs is not None else torch.nn.functional.one_hot(draft_tokens[n], p.shape[-1]).float()
    residual = (p[n] - q_n).clamp_min(0)
    total = residual.sum()
    # p(x) < q(x) at a rejection implies the residual has mass; guard rounding anyway
    residual = residual / total if total > 0 else p[n]
    return Verdict(n, int(sample(residual, generator)), False)
