"""The verifier on hand-built logits: edge cases, and the speculative sampler's distribution."""

from __future__ import annotations

import math

import pytest
import torch

from trtspec.sampling import Sampling, SamplingError
from trtspec.speculative.sampling import logits_to_probs
from trtspec.speculative.verify import verify_greedy, verify_sampled

V = 8
NEG = -1e4


def peaked(*tokens: int) -> torch.Tensor:
    """Logits [len(tokens), V] whose argmax at row i is tokens[i]."""
    out = torch.full((len(tokens), V), NEG)
    for i, t in enumerate(tokens):
        out[i, t] = 10.0
    return out


# ---------------------------------------------------------------------------------- greedy


def test_greedy_all_accepted_gives_bonus_token():
    draft = torch.tensor([[3, 5, 1]])
    logits = peaked(3, 5, 1, 7)[None]  # target agrees with every draft token; bonus = 7
    n, nxt = verify_greedy(draft, logits, torch.tensor([3]))
    assert n.tolist() == [3] and nxt.tolist() == [7]


def test_greedy_first_rejected_gives_correction():
    draft = torch.tensor([[3, 5, 1]])
    logits = peaked(2, 5, 1, 7)[None]  # target wants 2 at position 0
    n, nxt = verify_greedy(draft, logits, torch.tensor([3]))
    assert n.tolist() == [0] and nxt.tolist() == [2]


def test_greedy_middle_rejection_ignores_later_matches():
    draft = torch.tensor([[3, 4, 1]])
    logits = peaked(3, 5, 1, 7)[None]  # rejects at 1 even though position 2 "matches"
    n, nxt = verify_greedy(draft, logits, torch.tensor([3]))
    assert n.tolist() == [1] and nxt.tolist() == [5]


def test_greedy_empty_draft_is_plain_decoding():
    n, nxt = verify_greedy(torch.zeros(1, 0, dtype=torch.long), peaked(6)[None], torch.tensor([0]))
    assert n.tolist() == [0] and nxt.tolist() == [6]


def test_greedy_batch_rows_independent_and_lens_respected():
    draft = torch.tensor([[3, 5, 1], [3, 5, 1], [0, 0, 0]])
    logits = torch.stack([peaked(3, 5, 1, 7), peaked(3, 2, 1, 7), peaked(4, 4, 4, 4)])
    # row 0 only offers 2 draft tokens: position 2 must not count even though it matches
    n, nxt = verify_greedy(draft, logits, torch.tensor([2, 3, 0]))
    assert n.tolist() == [2, 1, 0]
    assert nxt.tolist() == [1, 2, 4]


# ---------------------------------------------------------------------------------- sampled, edge cases


def test_sampled_point_mass_all_accepted_when_target_agrees():
    params = Sampling(temperature=1.0)
    v = verify_sampled(torch.tensor([3, 5]), None, peaked(3, 5, 6), params, torch.Generator().manual_seed(0))
    assert (v.accepted, v.next_token, v.bonus) == (2, 6, True)


def test_sampled_rejection_never_resamples_rejected_point_mass_token():
    # target puts ~all mass on 2; draft proposes 3 (point mass): reject, and the residual excludes 3
    params = Sampling(temperature=1.0)
    g = torch.Generator().manual_seed(1)
    for _ in range(50):
        v = verify_sampled(torch.tensor([3]), None, peaked(2, 0), params, g)
        assert v.accepted == 0 and v.next_token == 2 and not v.bonus


def test_sampled_empty_draft_samples_from_target():
    v = verify_sampled(torch.zeros(0, dtype=torch.long), None, peaked(4), Sampling(temperature=1.0), None)
    assert (v.accepted, v.next_token) == (0, 4)


def test_greedy_params_make_sampled_rule_equal_greedy_rule():
    g = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    for _ in range(100):
        k = int(torch.randint(0, 4, ()))
        logits = torch.randn(k + 1, V)
        draft = torch.randint(0, V, (k,))
        v = verify_sampled(draft, None, logits, Sampling(), g)
        n, nxt = verify_greedy(draft[None], logits[None], torch.tensor([k]))
        assert (v.accepted, v.next_token) == (int(n), int(nxt))


def test_invalid_sampling_params_are_rejected_with_the_field():
    with pytest.raises(SamplingError, match="top_p"):
        Sampling(top_p=0.0)
    with pytest.raises(SamplingError, match="temperature"):
        Sampling(temperature=-1)
    with pytest.raises(SamplingError, match="max_tokens"):
        Sampling(max_tokens=0)


def test_top_k_and_top_p_filtering():
    logits = torch.tensor([[4.0, 3.0, 2.0, 1.0, 0.0, -1.0, -2.0, -3.0]])
    p = logits_to_probs(logits, Sampling(temperature=1.0, top_k=2))
    assert (p[0, 2:] == 0).all() and math.isclose(float(p.sum()), 1.0, rel_tol=1e-6)
    full = logits.softmax(-1)[0]
    p = logits_to_probs(logits, Sampling(temperature=1.0, top_p=float(full[0] + full[1] * 0.5)))
    assert p[0, 0] > 0 and p[0, 1] > 0 and (p[0, 2:] == 0).all()


# ---------------------------------------------------------------------------------- distribution


