"""Deliberately broken verifiers — fault injection for tests and validation drills only.

A deployment built with one of these must be *caught* by `trtspec validate` (greedy mismatch or
a distribution check) and by the sampling-losslessness test. They are selected explicitly via
``RuntimeSpec.extra["fault_injection"]``; nothing enables them by default.
"""

from __future__ import annotations

import torch

from trtspec.speculative.sampling import logits_to_probs, sample
from trtspec.speculative.verify import Verdict


def accept_all_greedy(draft_tokens, target_logits, draft_lens):
    """Bug: trusts the draft — every draft token is accepted, the bonus comes from the last row."""
    B, K = draft_tokens.shape
    best = target_logits.argmax(-1)
    return draft_lens.clone(), best.gather(1, draft_lens[:, None].long()).squeeze(1)


def accept_all_sampled(draft_tokens, draft_probs, target_logits, params, generator):
    """Bug: accepts every draft token regardless of p/q."""
    k = draft_tokens.shape[0]
    p = logits_to_probs(target_logits, params)
    return Verdict(k, int(sample(p[k], generator)), True)


def resample_from_target(draft_tokens, draft_probs, target_logits, params, generator):
    """Bug: on rejection, resamples from p instead of the residual norm(max(0, p − q))."""
    k = draft_tokens.shape[0]
    p = logits_to_probs(target_logits, params)
    if k == 0:
        return Verdict(0, int(sample(p[0], generator)), True)
    idx = torch.arange(k)
    p_x = p[idx, draft_tokens]
    q_x = draft_probs[idx, draft_tokens] if draft_probs is not None else torch.ones_like(p_x)
    r = torch.rand(k, generator=generator)
    n = int((r * q_x < p_x).long().cumprod(0).sum())
    if n == k:
        return Verdict(k, int(sample(p[k], generator)), True)
    return Verdict(n, int(sample(p[n], generator)), False)


DEVICE_ERROR = "CUDA error: an illegal memory access was encountered (injected: extra.fault_injection=device_error)"


def device_error_greedy(draft_tokens, target_logits, draft_lens):
    """Not a bug but a dead device: the step fails as a CUDA kernel fault does. The served engine
    must exit its stub so that the watchdog reloads it (triton/backend/guard.is_fatal_device_error):
    the only way to exercise that path without a GPU."""
    raise RuntimeError(DEVICE_ERROR)


def device_error_sampled(draft_tokens, draft_probs, target_logits, params, generator):
    raise RuntimeError(DEVICE_ERROR)


FAULTS = {
    "accept_all": (accept_all_greedy, accept_all_sampled),
    "resample_from_target": (None, resample_from_target),
    "device_error": (device_error_greedy, device_error_sampled),
}
