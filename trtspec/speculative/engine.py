"""The torch runtime: batched speculative decoding with per-row acceptance.

One engine step, for every active request (row) at once:

  1. propose   the proposer drafts up to k_b tokens per row            → tokens [B, K]
  2. verify    one target pass over [last token, d_1..d_K] per row       → logits [B, K+1, V]
  3. accept    the verifier keeps the matching prefix n_b and emits one
               correction/bonus token                                     (verify.py)
  4. commit    append d_1..d_n + next; stop at EOS / max tokens
  5. roll back target cache pointer = committed - 1; proposer.accept(n)   (no recompute)

Requests join between steps (continuous batching): a new request is prefilled alone in a free
slot, emits its first token, and takes part in the next batched step. Without a proposer (or
when the adaptive policy sets k = 0) a step is ordinary decoding, so the same engine is the
baseline.

Draft length (``adaptive`` + ``policy``): ``goodput`` chooses one k for the whole batch before
each step from the measured acceptance and the measured costs at the live batch size
(goodput.py, SmartSpec); ``acceptance`` keeps a per-request k from rolling acceptance and batch-1
cost ratios (stats.AdaptiveDraftLength); ``off`` always drafts ``max_draft_len``.
``max_concurrency`` caps all three: above it a step drafts nothing.
"""

from __future__ import annotations

import collections
import itertools
import resource
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from trtspec.acceptance import ema
from trtspec.errors import TrtspecError, one_line
from trtspec.speculative.goodput import COST_PROBE, GoodputPolicy
from trtspec.speculative.model import CausalLM, Step
from trtspec.speculative.processors import ends_with_stop_word, log_probs, process_window
from trtspec.speculative.proposers import Proposer
from trtspec.sampling import Sampling
from trtspec.speculative.sampling import greedy_token, logits_to_probs, sample
from trtspec.speculative.stats import AdaptiveDraftLength, RequestStats
from trtspec.speculative.verify import verify_greedy, verify_sampled


POLICIES = ("goodput", "acceptance", "off")  # runtime.adaptive.policy


class RequestError(TrtspecError):
    """A request the engine cannot serve (too long, bad ids)."""

    exit_code = 2


@dataclass
class Request:
    prompt: list[int]
    params: Sampling
    id: int = 0
    submitted: float = field(default_factory=time.perf_counter)


@dataclass
class Event:
    """What one step produced for one request."""

    request: Request
    new_tokens: list[int]
    finished: bool
    finish_reason: str | None  # "stop" | "length" | "cancelled" | None
    stats: RequestStats
    new_logprobs: list[float] | None = None  # with params.logprobs: one per new token, from the target


@dataclass
class Generation:
    request: Request
    token_ids: list[int]  # generated only
    finish_reason: str
    stats: RequestStats
    logprobs: list[float] | None = None  # with params.logprobs: one per token in token_ids


@dataclass
class _Slot:
    req: Request
    seq: list[int]  # prompt + generated (committed)
    stats: RequestStats
    generator: torch.Generator | None
    adaptive: AdaptiveDraftLength | None
    eos: set[int]
    external: list[int] | None = None  # draft tokens supplied with the request (verified in step 1)
    logprobs: list[float] = field(default_factory=list)  # with params.logprobs: per generated token


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _ema(old: float | None, x: float) -> float:
    """The step costs' moving average (weight 0.1 on the new sample)."""
    return ema(old, x, 0.1)


class Engine:
    def __init__(
        self,
        target: CausalLM,
        proposer: Proposer | None = None,
        *,
        max_draft_len: int = 4,
        max_concurrency: int | None = None,
        max_batch_size: int = 8,
        max_seq_len: int = 1024,
        eos_token_id: int | None = None,
        adaptive: bool = False,
        adaptive_window: int = 64,
        min_acceptance_rate: float | None = None,
        policy: str = "goodput",
        verify_greedy_fn=verify_greedy,
        verify_sampled_fn=verify_sampled,
    ):
        self.target = target
        # swappable only so tests and fault-injection drills can prove a broken rule is caught
        self.verify_greedy_fn, self.verify_sampled_fn = verify_greedy_fn, verify_sampled_fn
        self.proposer = proposer
        self.max_draft_len = max_draft_len if proposer is not None else 0
        # speculation.max_concurrency: a step with more requests than this drafts nothing (plain decoding)
        self.max_concurrency = max_concurrency
        self.max_batch_size = max_batch_size
        self.max_seq_len = max_seq_len
        self.device = next(target.parameters()).device  # not lm_head.weight: the LM head may be an INT8 module
        self.eos_token_id = eos_token_id if eos_token_id is not None else target.args.eos_token_id
        # head room: a verify pass writes K+1 positions past the committed length
        self.cache = target.new_cache(max_batch_size, max_seq_len + self.max_draft_len + 2)
        self.valid = [0] * max_batch_size  # target cache holds committed[:valid]; committed[-1] is pending
        self.slots: list[_Slot | None] = [None] * max_batch_size
        if policy not in POLICIES:
            raise TrtspecError(f"runtime.adaptive.policy: unknown policy {policy!r}", fix=f"use one of {POLICIES}")
        self.policy = policy if adaptive and proposer is not None else "off"
        self.adaptive = self.policy == "acceptance"  # the per-request controller (AdaptiveDraftLength)
        self.goodput = GoodputPolicy(self.max_draft_len) if self.policy == "goodput" else None
        self.adaptive_window = adaptive_window
        self.min_acceptance_rate = min_acceptance_rate
        self.chosen_k: collections.Counter = collections.Counter()  # draft length asked of the proposer → steps
        # measured step costs (seconds, EMA) for the adaptive controller and `trtspec tune`
        # overhead: a step's wall time outside drafting and verifying (sampling, bookkeeping, and in a
        # server the loop's work between steps); speculation pays it once per pass, not per token
        self.cost = {"draft_token": None, "target_step": None, "verify": {}, "overhead": None}
        self._last_step_end: float | None = None  # consecutive steps only: a prefill between resets it
        self._ids = itertools.count(1)
        # a step trace for diagnosis (TRTSPEC_STEP_TRACE in a served worker): called with one dict per
        # prefill and per step (batch, k, why, seconds); None: nothing is recorded
        self.trace: Callable[[dict], None] | None = None

    # ------------------------------------------------------------------ requests

    @property
    def free_slots(self) -> int:
        return sum(s is None for s in self.slots)

    @property
    def active(self) -> int:
        return self.max_batch_size - self.free_slots

    def validate(self, prompt: list[int], params: Sampling) -> None:
        vocab = self.target.args.vocab_size
        if not prompt:
            raise RequestError("prompt is empty", fix="send at least one token")
        if len(prompt) + 1 > self.max_seq_len:
            raise RequestError(
                f"prompt has {len(prompt)} tokens; max_seq_len is {self.max_seq_len}",
                fix="shorten the prompt or raise limits.max_seq_len",
            )
        bad = [t for t in prompt if not 0 <= t < vocab]
        if bad:
            raise RequestError(f"token ids out of range [0, {vocab}): {bad[:5]}")

    @torch.inference_mode()
    def add(
        self, prompt: list[int], params: Sampling, request: Request | None = None,
        draft_tokens: list[int] | None = None,
    ) -> Event:
        """Prefill ``prompt`` in a free slot; returns the event carrying the first token.

        ``draft_tokens`` (the tensorrtllm backend's ``draft_input_ids``) are verified in this
        request's first step instead of the proposer's draft: external/client-side speculation.
        """
        self.validate(prompt, params)
        slot = next((i for i, s in enumerate(self.slots) if s is None), None)
        if slot is None:
            raise RequestError(f"all {self.max_batch_size} slots are busy", fix="wait for a request to finish")
        req = request or Request(list(prompt), params, id=next(self._ids))
        stats = RequestStats(prompt_tokens=len(prompt))
        t0 = time.perf_counter()
        stats.queue_s = t0 - req.submitted
        gen = torch.Generator(device="cpu").manual_seed(params.seed) if params.seed is not None else None
        if gen is None and not params.greedy:
            gen = torch.Generator(device="cpu").manual_seed(int(torch.randint(0, 2**31, ()).item()))
        layers = self.proposer.target_hidden_layers if self.proposer else ()
        ids = torch.tensor([prompt], device=self.device)
        out = self.target(ids, self.cache, Step([slot], [0], len(prompt)), logits="last", hidden_layers=layers)
        logits, hidden = (out[0], out[1]) if layers else (out, None)
        eos = {params.end_id} if params.end_id is not None else set()
        if self.eos_token_id is not None and not params.ignore_eos:
            eos.add(self.eos_token_id)
        last = process_window(logits[0, -1:], params, list(prompt), len(prompt), [], eos)[0]  # [V]
        first = self._pick(last, params, gen)
        first_lp = [float(log_probs(last, params)[first])] if params.logprobs else None
        _sync(self.device)
        adaptive = (
            AdaptiveDraftLength(self.max_draft_len, self.adaptive_window, self.min_acceptance_rate)
            if self.adaptive
            else None
        )
        s = _Slot(req, list(prompt), stats, gen, adaptive, eos, list(draft_tokens) if draft_tokens else None)
        self.valid[slot] = len(prompt)
        if self.proposer is not None:
            self.proposer.prefill(slot, s.seq + [first], torch.cat(hidden, -1) if hidden else None)
        _sync(self.device)
        now = time.perf_counter()
        stats.prefill_s = now - t0
        stats.ttft_s = now - req.submitted
        self._last_step_end = None  # the next step's gap holds this prefill: not per-step overhead
        stats.started = t0
        if self.trace is not None:
            self.trace({"t": round(t0, 4), "event": "prefill", "prompt": len(prompt), "ms": round(stats.prefill_s * 1e3, 2)})
        self.slots[slot] = s
        return self._commit(slot, [first], now, first_lp)

    def cancel(self, request: Request) -> Event | None:
        for i, s in enumerate(self.slots):
            if s is not None and s.req is request:
                return self._finish(i, "cancelled", time.perf_counter())
        return None

    # ------------------------------------------------------------------ the step

    def _pick(self, logits: torch.Tensor, params: Sampling, gen) -> int:
        if params.greedy:
            return int(greedy_token(logits))
        return int(sample(logits_to_probs(logits, params), gen))

    def _draft_len(self, s: _Slot, batch_k: int | None = None) -> int:
        room = min(
            s.req.params.max_tokens - s.stats.generated,  # tokens still allowed
            self.max_seq_len - len(s.seq),
        )
        k = batch_k if batch_k is not None else s.adaptive.k if s.adaptive else self.max_draft_len
        if s.external:
            k = len(s.external)
        return max(0, min(k, room - 1))  # a step can emit k + 1 tokens

    def _propose(self, rows: list[int], slots: list[_Slot], ks: list[int]):
        """Draft tokens for every row: the proposer's, or the request's external draft.

        Returns (tokens [B, K], per-row draft distributions (None = point mass), lens [B], and
        lens as a list).
        """
        B = len(rows)
        drafts: list[list[int]] = [[] for _ in range(B)]
        probs: list[torch.Tensor | None] = [None] * B
        own = [b for b in range(B) if ks[b] > 0 and not slots[b].external]
        if self.proposer is not None and own:
            prop = self.proposer.propose(
                [rows[b] for b in own], [slots[b].seq for b in own], [ks[b] for b in own],
                [slots[b].req.params for b in own], [slots[b].generator for b in own],
            )
            toks, prop_lens = prop.tokens.tolist(), prop.lens.tolist()
            for i, b in enumerate(own):
                n = prop_lens[i]
                drafts[b] = toks[i][:n]
                if prop.probs is not None:
                    probs[b] = prop.probs[i, :n]
        for b, s in enumerate(slots):
            if s.external:
                drafts[b] = s.external[: ks[b]]
                s.external = None
        K = max((len(d) for d in drafts), default=0)
        tokens = torch.tensor([d + [0] * (K - len(d)) for d in drafts], dtype=torch.long, device=self.device)
        n_drafted = [len(d) for d in drafts]
        return tokens.view(B, K), probs, torch.tensor(n_drafted, device=self.device), n_drafted

    @torch.inference_mode()
    def step(self) -> list[Event]:
        """One speculative (or plain) decoding step for every active request."""
        rows = [i for i, s in enumerate(self.slots) if s is not None]
        if not rows:
            return []
        slots = [self.slots[i] for i in rows]
        B = len(rows)
        capped = self.max_concurrency is not None and B > self.max_concurrency  # rows share one read of
        batch_k = self._batch_draft_len(B, rows, slots) if self.goodput is not None and not capped else None  # the weights
        ks = [self._draft_len(s, batch_k) for s in slots]
        if capped:  # plain decoding pays more than speculation there
            ks = [k if s.external else 0 for k, s in zip(ks, slots)]
        # a cost probe re-measures the verify pass only: each row verifies its last token again, a
        # free guess verified like any draft (lossless), and the proposer neither drafts nor catches up
        cost_only = batch_k is not None and batch_k > 0 and self.goodput.last.get("why") == COST_PROBE
        guessed = [cost_only and k > 0 and not s.external for s, k in zip(slots, ks)]
        for s, k, g in zip(slots, ks, guessed):
            if g:
                s.external = [s.seq[-1]] * k
        ext = [bool(s.external) for s in slots]
        t0 = time.perf_counter()

        # 1. propose
        draft_tokens, draft_probs, lens, n_drafted = self._propose(rows, slots, ks)  # [B, K], per-row q, [B]
        _sync(self.device)
        t1 = time.perf_counter()

        # 2. verify: one target pass over [pending token, d_1..d_K]   # [B, K+1]
        K = draft_tokens.shape[1]
        last = torch.tensor([[s.seq[-1]] for s in slots], device=self.device)
        inp = torch.cat([last, draft_tokens], 1)
        layers = self.proposer.target_hidden_layers if self.proposer else ()
        out = self.target(inp, self.cache, Step(rows, [self.valid[r] for r in rows], K + 1), hidden_layers=layers)
        logits, hidden = (out[0], torch.cat(out[1], -1)) if layers else (out, None)  # [B, K+1, V]
        draft_rows = draft_tokens.tolist()
        # penalties, bad words, min length: position j of a row is processed as if its d_1..d_j
        # were generated, exactly what plain decoding (K = 0) would see there (processors.py)
        if any(s.req.params.processed for s in slots):
            logits = logits.float()
            for b, s in enumerate(slots):
                if s.req.params.processed:
                    k_b = n_drafted[b]
                    logits[b, : k_b + 1] = process_window(logits[b, : k_b + 1], s.req.params, s.seq,
                                                          len(s.req.prompt), draft_rows[b][:k_b], s.eos)

        # 3. accept
        greedy = [s.req.params.greedy for s in slots]
        accepted = [0] * B
        nexts = [0] * B
        if any(greedy):
            n_g, next_g = self.verify_greedy_fn(draft_tokens, logits, lens)
            n_g, next_g = n_g.tolist(), next_g.tolist()
        for b, s in enumerate(slots):
            if greedy[b]:
                accepted[b], nexts[b] = n_g[b], next_g[b]
            else:
                k_b = n_drafted[b]
                v = self.verify_sampled_fn(
                    draft_tokens[b, :k_b], draft_probs[b], logits[b, : k_b + 1], s.req.params, s.generator
                )
                accepted[b], nexts[b] = v.accepted, v.next_token
        _sync(self.device)
        t2 = time.perf_counter()

        # 4./5. commit and roll back: the target cache keeps [pending, d_1..d_n]
        new = [draft_rows[b][: accepted[b]] + [nexts[b]] for b in range(B)]
        lps: list[list[float] | None] = [None] * B
        for b, s in enumerate(slots):
            if s.req.params.logprobs:  # each new token's log-probability at its own position
                lp = log_probs(logits[b, : accepted[b] + 1], s.req.params)  # [n+1, V]
                lps[b] = lp[torch.arange(len(new[b]), device=lp.device), torch.tensor(new[b], device=lp.device)].tolist()
        for b, r in enumerate(rows):
            self.valid[r] += accepted[b] + 1
        seqs_after = [s.seq + n for s, n in zip(slots, new)]
        if self.proposer is not None:
            self.proposer.accept(rows, seqs_after, accepted, hidden)
        _sync(self.device)
        t3 = time.perf_counter()

        # draft time = proposing + the proposer's roll-back; the engine's own bookkeeping is not
        # drafting (without a proposer a step is ordinary decoding: draft time 0)
        draft_s = (t1 - t0 + (t3 - t2)) if self.proposer is not None and K > 0 and not cost_only else 0.0
        verify_s = t2 - t1
        # drafted by the proposer: a client's external draft or a cost probe's guess is no draft work
        self._measure(draft_s, verify_s, K, sum(n for n, e in zip(n_drafted, ext) if not e))
        self.chosen_k[max(ks, default=0)] += 1
        late_tokens = 0
        if self.goodput is not None:  # capped steps too: they measure (B, 0)
            # external drafts (the client's) say nothing about the proposer's acceptance
            take = getattr(self.proposer, "take_catch_up", None)  # tokens read late: priced apart
            late_s, late_tokens = take() if take else (0.0, 0)
            self.goodput.cost.add_catch_up(late_tokens, late_s)
            self.goodput.observe(B, K, verify_s, max(0.0, draft_s - late_s),
                                 [(0, 0) if ext[b] else (n_drafted[b], accepted[b]) for b in range(B)],
                                 late_s=late_s, cost_only=cost_only)
        if self.trace is not None:
            decided = self.goodput.last if self.goodput is not None and batch_k is not None else {}
            g = decided.get("goodput") or {}
            self.trace({"t": round(t0, 4), "event": "step", "B": B, "k": K, "why": decided.get("why"),
                        # what the policy expected: goodput of this k over plain decoding's, and the
                        # catch-up share it priced a drafting step at
                        "gain": round(g[str(K)] / g["0"], 3) if g.get(str(K)) and g.get("0") else None,
                        "catch_up_ms": round(decided["catch_up_s"] * 1e3, 2) if "catch_up_s" in decided else None,
                        "draft_ms": round(draft_s * 1e3, 2), "verify_ms": round(verify_s * 1e3, 2),
                        "ms": round((t3 - t0) * 1e3, 2),
                        "since_last_ms": None if self._last_step_end is None else round((t0 - self._last_step_end) * 1e3, 2),
                        "accepted": sum(accepted), "late": late_tokens})
        if self._last_step_end is not None and t0 - self._last_step_end < 0.05:
            # this step's wall time since the last one ended, less what draft and verify took
            self._measure_overhead(t3 - self._last_step_end - draft_s - verify_s)
        events = []
        for b, (r, s) in enumerate(zip(rows, slots)):
            k_b = n_drafted[b]
            if guessed[b]:  # a cost probe's guess is no draft: the request's acceptance leaves it out
                s.stats.record_step(drafted=0, accepted=0, draft_s=0.0, verify_s=verify_s, batch=B, draft_len=0)
            else:
                s.stats.record_step(drafted=k_b, accepted=accepted[b], draft_s=draft_s, verify_s=verify_s, batch=B,
                                    draft_len=ks[b])
            if s.adaptive is not None:
                s.adaptive.update(k_b, accepted[b], self._cost_ratio(), self._verify_ratio())
            events.append(self._commit(r, new[b], t3, lps[b]))
        self._last_step_end = t3  # the next step's overhead starts here: this step's commit is part of it
        return events

    def _batch_draft_len(self, batch: int, rows: list[int], slots: list[_Slot]) -> int:
        """The goodput policy's k for this step (goodput.py): rows' per-position acceptance, the
        costs at this batch size, the measured per-step overhead."""
        g = self.goodput
        dep = g.deployment_alphas()
        alphas = [g.row_alphas(s.stats.reached, s.stats.accepted_at, dep) for s in slots]
        catch_up = 0.0
        stay = g.stretch_left(batch)  # every step: it tracks how long the batch keeps a size
        behind = getattr(self.proposer, "behind", None)
        if behind is not None:  # drafting after plain steps first reads what the draft skipped
            late = behind(rows, [s.seq for s in slots])
            # the steps the batch still has at this size: the fewest tokens any row has left, two
            # per step, or the steps it is expected to stay this size if fewer
            left = min(max(1, s.req.params.max_tokens - s.stats.generated) for s in slots) / 2
            catch_up = g.catch_up_share(late, left if stay is None else min(left, stay))
        return g.choose(batch, alphas, self.cost["overhead"] or 0.0, catch_up)

    def snapshot(self) -> dict:
        """The draft-length policy's state: the k chosen per step so far, and the goodput
        policy's costs and acceptance (metrics, benchmarks)."""
        steps = sum(self.chosen_k.values())
        out = {"policy": self.policy, "steps": steps,
               "mean_draft_len": round(sum(k * n for k, n in self.chosen_k.items()) / steps, 4) if steps else 0.0,
               "chosen_k": {str(k): n for k, n in sorted(self.chosen_k.items())}}
        if self.goodput is not None:
            out["goodput"] = self.goodput.snapshot()
        return out

    def policy_view(self) -> dict | None:
        """The goodput policy's steps and prices per (batch size, k) for /metrics
        (GoodputPolicy.served_view); None under another policy."""
        return self.goodput.served_view(self.max_batch_size) if self.goodput is not None else None

    def _measure(self, draft_s: float, verify_s: float, K: int, drafted: int) -> None:
        """EMA of the costs the adaptive controller and `tune` need."""
        if K == 0:
            self.cost["target_step"] = _ema(self.cost["target_step"], verify_s)
        else:
            self.cost["verify"][K] = _ema(self.cost["verify"].get(K), verify_s)
            if drafted:
                self.cost["draft_token"] = _ema(self.cost["draft_token"], draft_s / K)

    def _measure_overhead(self, overhead_s: float) -> None:
        self.cost["overhead"] = _ema(self.cost["overhead"], max(0.0, overhead_s))

    def _cost_ratio(self) -> float | None:
        d, t = self.cost["draft_token"], self.cost["target_step"] or self._estimate_target_step()
        return d / (t + (self.cost["overhead"] or 0.0)) if d and t else None

    def _estimate_target_step(self) -> float | None:
        v = self.cost["verify"]
        return min(v.values()) if v else None

    def _verify_ratio(self) -> dict[int, float]:
        t = self.cost["target_step"]
        if not t:
            return {}
        o = self.cost["overhead"] or 0.0
        return {k: (v + o) / (t + o) for k, v in self.cost["verify"].items()}

    def _commit(self, row: int, tokens: list[int], now: float, logprobs: list[float] | None = None) -> Event:
        """Append ``tokens`` to the committed sequence; emit them up to EOS, a stop word (kept in
        the output, as TRT-LLM does) or max_tokens."""
        s = self.slots[row]
        stop_words = s.req.params.stop_words
        emit: list[int] = []
        reason = None
        for t in tokens:
            if t in s.eos:
                reason = "stop"
                break
            emit.append(t)
            if stop_words and ends_with_stop_word(s.seq + emit, stop_words):
                reason = "stop"
                break
            if s.stats.generated + len(emit) >= s.req.params.max_tokens:
                reason = "length"
                break
        s.seq.extend(tokens)
        new_lp = None
        if logprobs is not None:
            new_lp = logprobs[: len(emit)]
            s.logprobs.extend(new_lp)
        if reason is None and len(s.seq) >= self.max_seq_len:
            reason = "length"
        s.stats.generated += len(emit)
        s.stats.output_ids.extend(emit)
        if reason is not None:
            return self._finish(row, reason, now, emit, new_lp)
        return Event(s.req, emit, False, None, s.stats, new_lp)

    def _finish(self, row: int, reason: str, now: float, emit: list[int] | None = None,
                logprobs: list[float] | None = None) -> Event:
        s = self.slots[row]
        s.stats.finish(now, reason, peak_rss_bytes(), peak_device_bytes(self.device))
        self.slots[row] = None
        self.valid[row] = 0
        if self.proposer is not None:
            self.proposer.release(row)
        lp = (logprobs or []) if s.req.params.logprobs else None
        return Event(s.req, emit or [], True, reason, s.stats, lp)

    # ------------------------------------------------------------------ offline API

    def generate(
        self, prompts: list[list[int]], params: Sampling | list[Sampling]
    ) -> list[Generation]:
        """Run every prompt to completion, ``max_batch_size`` at a time (continuous batching)."""
        plist = params if isinstance(params, list) else [params] * len(prompts)
        pending = collections.deque(
            Request(list(p), pr, id=i) for i, (p, pr) in enumerate(zip(prompts, plist))
        )
        for r in pending:
            self.validate(r.prompt, r.params)
        results: dict[int, Generation] = {}
        lps: dict[int, list[float]] = collections.defaultdict(list)

        def done(ev: Event) -> None:
            lp = lps.pop(ev.request.id, []) if ev.request.params.logprobs else None
            results[ev.request.id] = Generation(ev.request, list(ev.stats.output_ids), ev.finish_reason, ev.stats, lp)

        while pending or self.active:
            while pending and self.free_slots:
                ev = self.add(pending[0].prompt, pending[0].params, pending.popleft())
                lps[ev.request.id].extend(ev.new_logprobs or [])
                if ev.finished:
                    done(ev)
            for ev in self.step():
                lps[ev.request.id].extend(ev.new_logprobs or [])
                if ev.finished:
                    done(ev)
        return [results[i] for i in range(len(prompts))]


@torch.inference_mode()
def pick_thread_count(engine: Engine, repeats: int = 5, margin: float = 0.9) -> dict | None:
    """Set the calling thread's torch thread count to whichever of 1 and the configured count
    runs a one-token target pass faster, and return both timings. One thread must win by
    ``margin`` (a pass at most 0.9x as long): the configured count is the user's, and a reading
    taken while something else loads the cores (another engine worker loading its weights) once
    put the served Qwen target on 1 thread of 2, at 0.65 of its in-process speed.

    Why: outside the process's main thread, every parallel region of torch's CPU kernels costs
    about 0.2 ms more (measured: torch 2.13 CPU, GNU OpenMP + MKL; a [1,384]×[384,384] matmul
    takes 7 µs with 2 threads on the main thread, 200 µs on another thread, 6 µs with 1). A
    served engine runs in its own thread, where a draft-sized model is then 2-3× faster on one
    thread, while a large model still gains from several. Only CPU engines with more than one
    thread are measured; the pass writes one token into slot 0's cache, which is free at start.
    ``torch.set_num_threads`` also sets MKL's count for the whole process: an application that
    computes on its main thread next to a BackgroundEngine passes ``pick_threads=False``."""
    n = torch.get_num_threads()
    dev = engine.cache.k[0].device
    if dev.type != "cpu" or n <= 1 or engine.slots[0] is not None:
        return None
    ids = torch.zeros(1, 1, dtype=torch.long, device=dev)

    def timed(threads: int) -> float:
        torch.set_num_threads(threads)
        engine.target(ids, engine.cache, Step([0], [0], 1), logits="last")  # warm-up
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            engine.target(ids, engine.cache, Step([0], [0], 1), logits="last")
            best = min(best, time.perf_counter() - t0)
        return best

    t_n, t_1 = timed(n), timed(1)
    chosen = 1 if t_1 < margin * t_n else n
    torch.set_num_threads(chosen)
    return {"threads": chosen, "configured": n, f"target_step_s_{n}_threads": t_n, "target_step_s_1_thread": t_1}


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def peak_device_bytes(device: torch.device) -> int:
    return torch.cuda.max_memory_allocated(device) if device.type == "cuda" else 0


# ---------------------------------------------------------------------------------------------
# serving: a background thread that owns the engine


Callback = Callable[[Event], bool | None]  # return False to cancel the request


class BackgroundEngine:
    """Runs :class:`Engine` in one thread; callers submit from any thread and get events by callback.

    Continuous batching: between steps, queued requests are admitted into free slots. A callback
    returning ``False`` (client gone, cancelled) stops that request at the next step.
    """

    def __init__(self, engine: Engine, *, max_queue: int = 1024, pick_threads: bool = True, start: bool = True):
        """``start=False``: no thread is started; the owner runs :meth:`run` on a thread of its own
        (the engine worker process runs it on its main thread, where torch's parallel regions are
        cheapest)."""
        self.engine = engine
        self.max_queue = max_queue
        self.pick_threads = pick_threads
        self.threads: dict | None = None  # the engine thread's torch thread count, and the timings
        self.warm_up_error: str | None = None  # the proposer's warm-up failed in the engine thread
        self._queue: collections.deque[tuple[Request, Callback, list[int] | None]] = collections.deque()
        self._callbacks: dict[int, Callback] = {}
        self._cv = threading.Condition()
        self._stop = False
        self._ids = itertools.count(1)
        self._started = threading.Event()
        self._thread: threading.Thread | None = None
        if start:
            self._thread = threading.Thread(target=self.run, name="trtspec-engine", daemon=True)
            self._thread.start()
            self._started.wait(timeout=120)  # the thread count is picked before the first request

    def submit(
        self, prompt: list[int], params: Sampling, callback: Callback, draft_tokens: list[int] | None = None
    ) -> Request:
        self.engine.validate(prompt, params)
        req = Request(list(prompt), params, id=next(self._ids))
        with self._cv:
            if len(self._queue) >= self.max_queue:
                raise RequestError(f"queue full ({self.max_queue} requests waiting)", fix="retry later")
            self._queue.append((req, callback, draft_tokens))
            self._cv.notify()
        return req

    def queued(self) -> int:
        return len(self._queue)

    def shutdown(self, timeout: float = 10) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def _deliver(self, ev: Event) -> None:
        cb = self._callbacks.get(ev.request.id)
        keep = True
        if cb is not None:
            try:
                keep = cb(ev) is not False
            except Exception:  # noqa: BLE001 - a broken callback must not kill the engine
                keep = False
        if ev.finished:
            self._callbacks.pop(ev.request.id, None)
        elif not keep:
            cancel_ev = self.engine.cancel(ev.request)
            self._callbacks.pop(ev.request.id, None)
            if cancel_ev is not None and cb is not None:
                try:
                    cb(cancel_ev)
                except Exception:  # noqa: BLE001
                    pass

    def run(self, on_started: Callable[[], None] | None = None) -> None:
        """The engine loop, on the calling thread, until :meth:`shutdown`; ``on_started`` is called
        once the thread count is picked and the draft warmed up (before any request runs)."""
        try:
            if self.pick_threads:
                self.threads = pick_thread_count(self.engine)
        except Exception:  # noqa: BLE001 - keep the configured count; the loop must run regardless
            self.threads = None
        try:  # a compiled draft step is specialised to the thread count: compile for this one now
            warm_up = getattr(self.engine.proposer, "warm_up", None)
            if warm_up is not None:
                warm_up()
        except Exception as e:  # noqa: BLE001 - it compiled when the engine was built; requests will retry
            self.warm_up_error = one_line(e)
        finally:
            self._started.set()
        if on_started is not None:
            on_started()
        while True:
            with self._cv:
                while not self._stop and not self._queue and not self.engine.active:
                    self._cv.wait()
                if self._stop:
                    break
                admit = []
                while self._queue and self.engine.free_slots - len(admit) > 0:
                    admit.append(self._queue.popleft())
            for req, cb, draft in admit:
                self._callbacks[req.id] = cb
                try:
                    ev = self.engine.add(req.prompt, req.params, req, draft_tokens=draft)
                except Exception as e:  # noqa: BLE001 - report to this request only
                    self._callbacks.pop(req.id, None)
                    try:
                        cb(Event(req, [], True, f"error: {e}", RequestStats(prompt_tokens=len(req.prompt))))
                    except Exception:  # noqa: BLE001
                        pass
                    continue
                self._deliver(ev)
            if self.engine.active:
                try:
                    events = self.engine.step()
                except Exception as e:  # noqa: BLE001 - fail every active request, keep serving
                    events = []
                    for i, s in enumerate(self.engine.slots):
                        if s is not None:
                            ev = self.engine._finish(i, f"error: {e}", time.perf_counter())
                            events.append(ev)
                for ev in events:
                    self._deliver(ev)
        # shutting down: cancel what is left
        for i, s in enumerate(self.engine.slots):
            if s is not None:
                self._deliver(self.engine._finish(i, "cancelled", time.perf_counter()))
