"""The statistical check both sampled-speculation tests share: the joint law of the first three
sampled tokens (tokens 2-3 come from one speculative step with max_draft_len 2) against the exact
law built from the target's per-position distributions."""

from __future__ import annotations

from typing import Callable

import torch
from scipy.stats import chi2

from trtspec.speculative.engine import Engine
from trtspec.speculative.proposers import DraftModelProposer
from trtspec.sampling import Sampling


def assert_three_token_law(target, draft, prompt: list[int], probs: Callable[[list[int]], torch.Tensor],
                           params_kw: dict, n: int = 1200) -> None:
    """``probs(seq)``: the target's distribution of the next token after ``seq`` under ``params_kw``."""
    exact = {}
    p1 = probs(prompt)
    for x1 in p1.nonzero().flatten().tolist():
        p2 = probs(prompt + [x1])
        for x2 in p2.nonzero().flatten().tolist():
            p3 = probs(prompt + [x1, x2])
            for x3 in p3.nonzero().flatten().tolist():
                exact[(x1, x2, x3)] = float(p1[x1] * p2[x2] * p3[x3])
    eng = Engine(target, DraftModelProposer(draft, 16, 64), max_draft_len=2, max_batch_size=16, max_seq_len=48)
    outs = eng.generate([prompt] * n, [Sampling(**params_kw, seed=i) for i in range(n)])
    counts: dict = {}
    for o in outs:
        counts[tuple(o.token_ids)] = counts.get(tuple(o.token_ids), 0) + 1
    assert set(counts) <= set(exact)
    stat = sum((counts.get(c, 0) - n * p) ** 2 / (n * p) for c, p in exact.items() if n * p >= 1)
    dof = sum(1 for p in exact.values() if n * p >= 1) - 1
    assert chi2.sf(stat, dof) > 1e-3
    assert sum(o.stats.accepted for o in outs) > 0  # the speculative path was exercised
