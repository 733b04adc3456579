"""Plain and speculative greedy decoding of the same prompts with the torch Engine: the pair of
runs every "speculation is lossless" test compares."""

from __future__ import annotations

from trtspec.sampling import Sampling
from trtspec.speculative.engine import Engine
from trtspec.speculative.proposers import DraftModelProposer


def plain_and_speculative(target, draft, prompts: list[list[int]], *, max_tokens: int, max_seq_len: int,
                          max_draft_len: int = 4):
    """(plain, speculative) generations of ``prompts`` (one batch each), EOS ignored."""
    params = Sampling(max_tokens=max_tokens, ignore_eos=True)
    rows = len(prompts)
    plain = Engine(target, None, max_batch_size=rows, max_seq_len=max_seq_len).generate(prompts, params)
    proposer = DraftModelProposer(draft, rows, max_seq_len + max_draft_len + 4)
    spec = Engine(target, proposer, max_draft_len=max_draft_len, max_batch_size=rows,
                  max_seq_len=max_seq_len).generate(prompts, params)
    return plain, spec
