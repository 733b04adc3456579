"""Logits processors: penalties, bad words and a minimum length, applied to the target's logits.

Speculation stays lossless under them only if the verifier scores every draft position with the
logits plain decoding would have seen there. A penalty depends on the tokens before the position,
so in a verify window ``[pending, d_1..d_K]`` position ``j`` is processed as if ``d_1..d_j`` had
already been generated (:func:`process_window`); plain decoding is the same call with K = 0.

Semantics (one choice where NVIDIA's and OpenAI's documents differ, written down here):

* ``repetition_penalty`` r (CTRL, Keskar et al. 2019; HF and TRT-LLM): a token that occurs in the
  prompt or the output has its logit divided by r when positive, multiplied by r when negative;
* ``presence_penalty`` a, ``frequency_penalty`` f (OpenAI): ``logit -= a * [count > 0] + f * count``
  with ``count`` the token's occurrences in the *generated* tokens;
* ``bad_words``: a word (token sequence ``w``) whose first ``len(w) - 1`` tokens end the sequence
  has its last token banned (a one-token word is always banned);
* ``min_tokens``: the end tokens (EOS, ``end_id``) are banned until that many tokens are generated.

Temperature, top-k and top-p come after (``sampling.logits_to_probs``).
"""

from __future__ import annotations

import torch

from trtspec.sampling import Sampling


def process_window(
    logits: torch.Tensor,  # [T, V] target logits at T consecutive positions
    params: Sampling,
    seq: list[int],  # committed tokens (prompt + generated) before position 0
    prompt_len: int,
    drafts: list[int],  # the tokens at positions 1..T-1 (len >= T - 1)
    end_ids: set[int],
) -> torch.Tensor:
    """The processed logits ``[T, V]`` (float32); unchanged (same tensor) when nothing applies."""
    if not params.processed:
        return logits
    out = logits.float().clone()
    T, V = out.shape
    device = out.device
    counts = torch.zeros(V, device=device)
    generated = seq[prompt_len:]
    if generated:
        counts += torch.bincount(torch.tensor(generated, device=device), minlength=V)[:V].float()
    seen = torch.zeros(V, dtype=torch.bool, device=device)
    if seq:
        seen[torch.tensor(seq, device=device)] = True
    ends = torch.tensor(sorted(e for e in end_ids if 0 <= e < V), dtype=torch.long, device=device)
    history = list(seq)
    for j in range(T):
        if j > 0:
            t = drafts[j - 1]
            counts[t] += 1
            seen[t] = True
            history.append(t)
        row = out[j]
        if params.repetition_penalty != 1.0:
            r = params.repetition_penalty
            row[seen] = torch.where(row[seen] > 0, row[seen] / r, row[seen] * r)
        if params.presence_penalty:
            row -= params.presence_penalty * (counts > 0).float()
        if params.frequency_penalty:
            row -= params.frequency_penalty * counts
        for w in params.bad_words:
            n = len(w) - 1
            if 0 <= w[-1] < V and (n == 0 or (len(history) >= n and tuple(history[-n:]) == w[:-1])):
                row[w[-1]] = float("-inf")
        if len(generated) + j < params.min_tokens and ends.numel():
            row[ends] = float("-inf")
    return out


def log_probs(logits: torch.Tensor, params: Sampling) -> torch.Tensor:
    """Log-probabilities ``[..., V]`` of the distribution a token is picked from: the processed
    logits, over the temperature when sampling (before top-k / top-p truncation)."""
    x = logits.float()
    if not params.greedy:
        x = x / params.temperature
    return torch.log_softmax(x, -1)


def ends_with_stop_word(seq: list[int], stop_words: tuple[tuple[int, ...], ...]) -> bool:
    """Whether ``seq`` ends with one of the stop words (token sequences)."""
    return any(len(seq) >= len(w) and tuple(seq[-len(w):]) == w for w in stop_words)
