"""Proposers: who drafts the next tokens. One small interface, implementations in a registry.

A proposer keeps its own per-slot state (e.g. a draft model's KV cache) and is told, after each
verification, how many of its tokens the target accepted so it can roll back to the accepted
prefix. The engine never looks inside.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from trtspec.errors import ModelError, one_line
from trtspec.speculative.model import CausalLM, Step
from trtspec.sampling import Sampling
from trtspec.speculative.sampling import greedy_token, logits_to_probs, sample
from trtspec.speculative.vocab import DraftVocab


@dataclass
class Proposal:
    tokens: torch.Tensor  # [B, K] draft tokens (rows use the first lens[b])
    probs: torch.Tensor | None  # [B, K, V] draft distributions q, or None (point masses / greedy)
    lens: torch.Tensor  # [B] valid draft tokens per row (0 = no draft for this row)


class Proposer(Protocol):
    name: str
    # target layers whose outputs the proposer needs (EAGLE features); () = none
    target_hidden_layers: tuple[int, ...]

    def prefill(self, slot: int, seq: list[int], target_hidden: torch.Tensor | None) -> None:
        """A new request in ``slot``; ``seq`` = prompt + first token (the target's prefill output)."""

    def propose(
        self, slots: list[int], seqs: list[list[int]], ks: list[int],
        params: list[Sampling], generators: list[torch.Generator | None],
    ) -> Proposal:
        """Draft up to ``ks[b]`` tokens after ``seqs[b]`` for each row."""

    def accept(self, slots: list[int], seqs: list[list[int]], accepted: list[int],
               target_hidden: torch.Tensor | None) -> None:
        """The target accepted ``accepted[b]`` draft tokens; ``seqs`` are the new committed sequences."""

    def release(self, slot: int) -> None:
        """The request in ``slot`` finished."""

    # optional: ``warm_up()``, called by the serving thread before its first request (compiled steps)


def _empty(B: int, device) -> Proposal:
    return Proposal(torch.zeros(B, 0, dtype=torch.long, device=device), None, torch.zeros(B, dtype=torch.long, device=device))


class DraftModelProposer:
    """Draft-target: a smaller LM with the same tokenizer drafts autoregressively.

    Cache convention: ``valid[slot]`` = how many tokens of the committed sequence the draft's KV
    cache holds; each round first feeds ``seq[valid:]`` (1 token, or 2 when every draft token was
    accepted and the draft never consumed its own last token), then drafts K-1 more single steps.

    The draft reads a new request's prompt at its first proposal, not at prefill: the target's
    first token goes out without waiting for the draft (TTFT as plain decoding's), and a request
    that never drafts (k = 0 throughout) never pays for it. The same catch-up reads the tokens of
    plain steps (k = 0, max_concurrency) row by row, so the batched feed stays 1-2 tokens a row.
    """

    name = "draft_target"
    target_hidden_layers: tuple[int, ...] = ()

    def __init__(self, model: CausalLM, max_slots: int, max_len: int, *, compile: bool = False,
                 vocab: DraftVocab | None = None):
        self.model = model
        # a draft vocabulary (speculation.draft_vocab_size): the head scores only vocab.ids, and a
        # drafted index maps back to its target id before it is proposed or fed to the draft again
        self.vocab = vocab
        if vocab is not None:
            model.restrict_vocab_(vocab.ids)
            self._ids = vocab.ids.to(model.model.embed_tokens.weight.device)
        self.cache = model.new_cache(max_slots, max_len)
        self.valid = [0] * max_slots
        self.written = [0] * max_slots  # draft positions written past valid in the last round
        self.device = model.model.embed_tokens.weight.device
        self.catch_up_s = 0.0  # seconds spent reading committed tokens since the engine last took it
        self.catch_up_tokens = 0  # … and how many tokens that read
        if compile:
            self._compile()

    def _compile(self) -> None:
        """Compile the draft's one-token step and warm it up now, so that no request pays for
        compilation; failures surface here, as a config error."""
        self.model.compile_decode_()
        try:
            self.warm_up()
        except Exception as e:  # noqa: BLE001 - inductor fails in many ways (no C++ compiler, …)
            self.model.decode = None
            raise ModelError(
                f"runtime.compile_draft: torch.compile of the draft's decode step failed ({one_line(e)})",
                fix="set runtime.compile_draft: false (eager steps, same outputs), or install a C++ compiler (gcc)",
            ) from None

    @torch.inference_mode()
    def warm_up(self) -> None:
        """Run the compiled step once at batch 1 and (when the engine batches) batch 2, dynamic
        from there on. Compiled code is specialised to the calling thread's torch thread count, so
        the serving thread calls this again after picking its count (BackgroundEngine). Writes
        rows 0/1 at position 1 of the cache: only call it while those slots hold no request."""
        if self.model.decode is None:
            return
        for B in (1, 2) if self.cache.batch > 1 else (1,):
            one = torch.ones(B, dtype=torch.long, device=self.device)  # not 0/1-sized: those specialize
            self.model.decode(one[:, None], self.cache, torch.arange(B, device=self.device), one, 2, self._rope(2))

    def prefill(self, slot, seq, target_hidden=None):
        self.valid[slot] = 0  # read at the first proposal (_catch_up)
        self.written[slot] = 0

    def take_catch_up(self) -> tuple[float, int]:
        """(seconds, tokens) of catching up since the last call: a cost every committed token pays
        once, when drafting resumes, whatever the draft length, so the engine's per-token draft cost
        leaves it out and the goodput policy prices it apart (GoodputPolicy.catch_up_share)."""
        out = (self.catch_up_s, self.catch_up_tokens)
        self.catch_up_s, self.catch_up_tokens = 0.0, 0
        return out

    def behind(self, slots: list[int], seqs: list[list[int]]) -> int:
        """Committed tokens the draft has not read and would read in a catch-up pass before drafting
        for these rows: the tokens of plain steps, and a prompt not read yet. The prompt counts
        too: a request that ran plain until near its end pays its whole prompt to draft a few
        steps (served on the Qwen pair, such catch-ups at the end of a closed loop's blocks cost
        about a second each, 10 % of a level at concurrency 4); over a request's whole output it
        costs a few ms a step."""
        total = 0
        for s, seq in zip(slots, seqs):
            if len(seq) - 1 - self.valid[s] >= 2:  # 1 token is the batched feed's, not a catch-up
                total += len(seq) - 1 - self.valid[s]
        return total

    def _catch_up(self, slots: list[int], seqs: list[list[int]]) -> None:
        """Each row more than 2 tokens behind reads ``seq[valid:-1]`` alone (a prompt, or the tokens of
        plain steps), in one pass; the batched feed then gives it its last token."""
        t0 = time.perf_counter()
        for s, seq in zip(slots, seqs):
            behind = seq[self.valid[s] : -1]
            if len(behind) >= 2:
                ids = torch.tensor([behind], device=self.device)
                self.model(ids, self.cache, Step([s], [self.valid[s]], len(behind)), logits="none")
                self.valid[s] += len(behind)
                self.catch_up_tokens += len(behind)
        self.catch_up_s += time.perf_counter() - t0

    @torch.inference_mode()
    def propose(self, slots, seqs, ks, params, generators):
        B, K = len(slots), max(ks)
        if K == 0:
            return _empty(B, self.device)
        self._catch_up(slots, seqs)
        logits, rows = self._feed(slots, [seq[self.valid[s] :] for s, seq in zip(slots, seqs)])  # [B, V]
        greedy = all(p.greedy for p in params)
        tokens, probs = [], []
        for i in range(K):
            if greedy:
                x = greedy_token(logits)
            else:
                q = torch.stack([logits_to_probs(logits[b], params[b]) for b in range(B)])  # [B, V or cut]
                x = torch.stack([sample(q[b], generators[b]) for b in range(B)])
                if self.vocab is not None:  # q over the whole vocabulary: zero outside the cut
                    q = q.new_zeros(B, self.model.args.vocab_size).index_copy_(1, self._ids, q)
                probs.append(q)
            if self.vocab is not None:
                x = self._ids[x]
            tokens.append(x)
            if i < K - 1:
                logits = self._step(slots, rows, x, i)
        for s in slots:
            self.written[s] = K - 1
        return Proposal(
            torch.stack(tokens, 1),
            torch.stack(probs, 1) if probs else None,
            torch.tensor(ks, device=self.device),
        )

    def _rope(self, n: int):
        w = self.model.model.embed_tokens.weight
        return self.model._rope(n, w.device, w.dtype)

    def _feed(self, slots: list[int], pending: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Feed each row's committed tokens the draft has not seen (1, or 2 after a fully accepted
        round); returns the logits after each row's last one [B, V] (and the rows as a tensor for
        the compiled steps that follow, else None)."""
        B, T = len(slots), max(len(p) for p in pending)
        rows = None
        if self.model.decode is not None:  # compiled one-token steps
            rows = torch.tensor(slots, device=self.device)
            start = torch.tensor([self.valid[s] for s in slots], device=self.device)
            kv_len = max(self.valid[s] for s in slots) + 1
            for j in range(T):
                ids = torch.tensor([[p[min(j, len(p) - 1)]] for p in pending], device=self.device)
                out = self.model.decode(ids, self.cache, rows, start + j, kv_len + j, self._rope(kv_len + j))
                if j == 0 or all(len(p) > j for p in pending):
                    logits = out
                else:  # rows whose last pending token was at j-1 keep those logits (this write is garbage)
                    more = torch.tensor([len(p) > j for p in pending], device=self.device)
                    logits = torch.where(more[:, None], out, logits)
        else:
            ids = torch.tensor([p + [p[-1]] * (T - len(p)) for p in pending], device=self.device)
            step = Step(slots, [self.valid[s] for s in slots], T)
            if all(len(p) == T for p in pending):  # the usual case: the LM head on the last position only
                logits = self.model(ids, self.cache, step, logits="last")[:, 0]  # [B, V]
            else:
                logits = self.model(ids, self.cache, step)  # [B, T, V]
                last = torch.tensor([len(p) - 1 for p in pending], device=self.device)
                logits = logits[torch.arange(B, device=self.device), last]  # [B, V]
        for s, p in zip(slots, pending):
            self.valid[s] += len(p)
        return logits, rows

    def _step(self, slots: list[int], rows: torch.Tensor | None, x: torch.Tensor, i: int) -> torch.Tensor:
        """Draft token ``i`` (``x`` [B]) goes in at ``valid + i``; returns the next logits [B, V]."""
        if self.model.decode is not None:
            pos = torch.tensor([self.valid[s] + i for s in slots], device=self.device)
            kv_len = max(self.valid[s] for s in slots) + i + 1
            return self.model.decode(x[:, None], self.cache, rows, pos, kv_len, self._rope(kv_len))
        step = Step(slots, [self.valid[s] + i for s in slots], 1)
        return self.model(x[:, None], self.cache, step)[:, 0]

    def accept(self, slots, seqs, accepted, target_hidden=None):
        for s, n in zip(slots, accepted):
            # the draft consumed d_1..d_{K-1}; those that were accepted stay valid
            self.valid[s] += min(n, self.written[s])
            self.written[s] = 0

    def release(self, slot):
        self.valid[slot] = 0
        self.written[slot] = 0


class NgramProposer:
    """Prompt lookup: find the latest earlier occurrence of the sequence's last n tokens
    (n from ``max_ngram`` down to ``min_ngram``) and propose what followed it."""

    name = "ngram"
    target_hidden_layers: tuple[int, ...] = ()

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1, device="cpu"):
        self.max_ngram, self.min_ngram, self.device = max_ngram, min_ngram, device

    def prefill(self, slot, seq, target_hidden=None):
        pass

    def lookup(self, seq: list[int], k: int) -> list[int]:
        if k <= 0 or len(seq) < 2:
            return []
        arr = np.asarray(seq, dtype=np.int64)
        for n in range(min(self.max_ngram, len(seq) - 1), self.min_ngram - 1, -1):
            suffix = arr[-n:]
            # windows over arr[:-1] so a match always has at least one following token
            windows = np.lib.stride_tricks.sliding_window_view(arr[:-1], n)
            hits = np.flatnonzero((windows == suffix).all(axis=1))
            if hits.size:
                start = int(hits[-1]) + n
                return arr[start : start + k].tolist()
        return []

    def propose(self, slots, seqs, ks, params, generators):
        drafts = [self.lookup(seq, k) for seq, k in zip(seqs, ks)]
        B, K = len(slots), max((len(d) for d in drafts), default=0)
        if K == 0:
            return _empty(B, self.device)
        tokens = torch.tensor([d + [0] * (K - len(d)) for d in drafts], device=self.device)
        return Proposal(tokens, None, torch.tensor([len(d) for d in drafts], device=self.device))

    def accept(self, slots, seqs, accepted, target_hidden=None):
        pass

    def release(self, slot):
        pass
