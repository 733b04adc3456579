"""The statistical tests of the rejection sampler: its output distribution converges to the target's (CPU-heavy, so not in the fast tier)."""

from __future__ import annotations

import pytest
import torch
from trtspec.speculative import faults
from trtspec.sampling import Sampling
from trtspec.speculative.verify import verify_sampled
from tests.unit.test_verify import NEG, V


def _chi2_pvalue(observed: torch.Tensor, expected: torch.Tensor) -> float:
    from scipy.stats import chi2

    keep = expected > 0
    stat = float((((observed - expected) ** 2) / expected)[keep].sum())
    return float(chi2.sf(stat, int(keep.sum()) - 1))


def _emitted_token_histograms(rule, n_samples: int, seed: int = 0):
    """Draft 2 tokens from q, verify against p; histogram the 1st and 2nd emitted tokens.

    p_i and q_i are fixed per position (independent of the prefix), so the emitted tokens must
    follow p_1 and p_2 exactly when the rule is lossless.
    """
    gen = torch.Generator().manual_seed(seed)
    p_logits = torch.tensor(
        [[2.0, 1.0, 0.5, 0.0, -1.0, NEG, NEG, NEG],
         [0.0, 0.3, 1.5, -0.5, 0.2, 1.0, NEG, NEG],
         [1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]]
    )
    q_logits = torch.tensor(
        [[0.0, 2.0, 0.5, 1.0, 0.0, 1.0, NEG, NEG],
         [1.0, 0.0, 0.0, 0.8, 0.0, 0.0, 1.2, NEG]]
    )
    params = Sampling(temperature=1.0)
    q = q_logits.softmax(-1)
    first = torch.zeros(V)
    second = torch.zeros(V)
    n_second = 0
    for _ in range(n_samples):
        draft = torch.multinomial(q, 1, generator=gen).squeeze(-1)  # [2]
        v = rule(draft, q, p_logits, params, gen)
        emitted = draft[: v.accepted].tolist() + [v.next_token]
        first[emitted[0]] += 1
        if len(emitted) > 1:
            second[emitted[1]] += 1
            n_second += 1
    p = p_logits.softmax(-1)
    return first, p[0] * n_samples, second, p[1] * n_second


def test_speculative_sampling_matches_target_distribution():
    first, exp1, second, exp2 = _emitted_token_histograms(verify_sampled, 12000)
    assert _chi2_pvalue(first, exp1) > 1e-3
    assert _chi2_pvalue(second, exp2) > 1e-3
    # total variation between the empirical and the target distribution is small
    assert 0.5 * float((first / first.sum() - exp1 / exp1.sum()).abs().sum()) < 0.03


@pytest.mark.parametrize("broken", [faults.accept_all_sampled, faults.resample_from_target])
def test_broken_acceptance_rule_fails_the_distribution_test(broken):
    first, exp1, second, exp2 = _emitted_token_histograms(broken, 12000)
    assert _chi2_pvalue(first, exp1) < 1e-6
