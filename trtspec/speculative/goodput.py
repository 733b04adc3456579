"""Goodput-driven draft length: one k (0 … max_draft_len) for the whole batch, before each step.

SmartSpec (Liu et al. 2024, arXiv 2406.14066): pick the speculation length that maximises the
expected *goodput* of the next step, accepted tokens per second,

    G(k) = Σ_rows E[tokens](α_row, k) / (draft(B, k) + verify(B, k) + overhead),

with E[tokens](α, k) = 1 + Σ_{i≤k} Π_{j≤i} α_j (trtspec.acceptance.expected_tokens) and the costs
measured on this machine *at the live batch size B*. k = 0 is ordinary decoding: no draft work.
One k per batch, as SmartSpec: the verify pass is [B, k+1] whatever each row would prefer, so a
row drafting less than the others saves draft time only.

Why the batch size matters: where a pass reads every weight once (CPU, a memory-bound GPU), B
plain rows share that read, while a verify pass over B·(k+1) tokens costs more than the engine's
batch-1 ratios say; at some B every extra token costs more than it brings (the Qwen pair lost at
concurrency 2 with a fixed k). The costs:

  verify(B, k)  the lowest median (of its last 9 samples) among the cells with the same pass size
                T = B·(k+1), once they number ``min_samples`` samples, else a least-squares
                line a + b·T over the measured pass sizes (SmartSpec models a batch's time by its
                batched tokens; [3, 1] and [1, 3] run the same weights over the same 3 token rows).
                Pooled, not per cell: a cell measured only at particular moments carries their load.
                In a closed loop at 4 requests, B = 3 occurs only in the steps between a finished
                request and its successor, while tritonserver's pre- and post-processing of those two
                share the cores: served on the Qwen pair (2 cores), the (3, 0) cell read 130 ms
                against 122 ms for (4, 0) and 84-99 ms in process, and the policy drafted at 3 rows
                where plain steps were cheaper (steps of 240 ms for 2 tokens a row against 101 ms
                for 1). Pooled with (1, 2), measured over whole requests, the same pass read 90 ms.
                Capped, too, by every larger settled pass (:meth:`CostModel.cap`): fewer token rows
                over the same weights never cost more, and a pass size seen only in odd moments
                (the 1-token pass once a server decodes several requests at a time) reads high.
  draft(B, k)   the (B, k) cell's median seconds of drafting once it has ``min_samples``
                recent samples; else a line a_B + b_B·k through B's settled cells; else k · d_B,
                d_B the median seconds per draft token at B rows (the nearest measured B while
                B has none). Per cell: the first draft token of a step costs more than the next
                (:meth:`CostModel.draft`);
  overhead      the step's time outside drafting and verifying (Engine.cost["overhead"]).

Acceptance per position α_i: a row's own counts, shrunk toward the deployment's with a prior of
``prior_strength`` pseudo-observations, so a request with a long history decides by itself and a
new one starts from what the deployment measured. The deployment's counts decay (``decay`` per
step, drafting or not: a half-life of about 70 steps) so a change of traffic shows within a few
hundred steps.

Exploration: a cell nobody measured would otherwise never be chosen, nor corrected. Every
``explore_every``-th step at batch B the least-measured other k of B runs if it has fewer than
``min_samples`` samples, and every ``4·explore_every``-th step regardless (a cell measured while
another tenant loaded the machine is measured again); only a k whose estimated goodput is within
``explore_margin`` of the best is worth a step (at batch 8 a k the line prices at half the
goodput is not measured again and again). And after ``probe_every`` steps in a row at k = 0 one
step drafts a single token (a probe): k = 0 measures no acceptance, so without it a deployment
whose acceptance fell (other traffic) would never see it rise again. Where k = 0 is the costs'
verdict instead (even every draft token accepted would not beat ordinary decoding at this batch
size by ``probe_upside``, 10 %, as for the Qwen pair at 4 rows on 2 cores, or at a lone row whose
catch-up cannot pay back) a probe teaches nothing worth its price about acceptance: it then
comes 8x as seldom, only to re-measure the verify pass, and it is a *cost probe*: each row verifies
one free guess (its last token again), so the proposer does not run and the draft reads nothing
it skipped. Served on the Qwen pair, a real probe at 4 rows took 837-983 ms against 106 for a
plain step (the draft first read the ~45 tokens each row had skipped) and stalled all four
requests: P95 request latency at c=4 read 1.14x the baseline's, though the steps were plain on
99.5 % of the 4-row steps. A cost probe costs the verify pass alone (202-212 ms there). A probe
also reads every token the draft skipped (the catch-up below), which at two rows or more can cost
more than the plain steps it follows are worth: so probes keep to a budget, ``probe_budget`` of
the step time (2 %): after a probe that cost P seconds more than a plain step, the next waits until
the steps since have taken P / ``probe_budget`` seconds (in process on the Qwen pair at two rows,
a probe took 444 ms against 70 for a plain step: every 64 steps that was 8 % of the time).

Catch-up: a draft model skips the tokens of plain steps and reads them in one pass when drafting
resumes, and reads a request's prompt at its first proposal (proposers.DraftModelProposer). A
step that drafts pays that pass for every committed token the draft has not read, prompt
included, spread over the steps the batch's requests have left (:meth:`GoodputPolicy.catch_up_share`),
or over the steps the batch is expected to keep its size if fewer (:meth:`GoodputPolicy.stretch_left`:
in a closed loop at 2 the batch is at one row only between a request and its successor), so a
batch that has run plain for a while switches back only when speculation will pay the reading
back, and a request near its end does not read its whole prompt to draft a few steps.
A catch-up is certain and the gain it buys is an estimate, so drafting that first needs one must
beat plain decoding by ``switch_margin`` (5 %), catch-up included; a step whose draft is caught up
chooses by goodput alone (one row drafting steadily is not held back). Served on the Qwen pair in an
open loop (AMD EPYC, 2026-12-07, ``bench/results/qwen-openloop-zen4/``), a two-row batch switched to
drafting four times with 40-67 tokens to catch up, at an expected gain of 0.5-1.4 %: those four
steps took 1.5 s for 209 tokens read late, the drafting steps after them gained 2-3 % where 6-17 %
was expected, and no catch-up was paid back (two-row drafting measured 0.84-0.94x plain).
Plain refresh: exploration re-measures the least-measured arm, which is never k = 0 (the most
measured), and a batch that drafts takes no sample of plain decoding. So while the batch drafts at
B, once the (B, 0) cell's own last sample is ``refresh_every`` (64) steps at B old (4x as many
where drafting is priced ``refresh_close``, 50 %, or more above plain decoding), or while it has
fewer than ``min_samples`` samples of its own (its pass size priced through another cell), the
batch runs plain steps until the cell holds ``min_samples`` fresh ones, its old window forgotten
(:meth:`GoodputPolicy._plain_stale`): the two arms are compared as measured a few seconds apart.
While the costs cannot be fitted yet (fewer than two pass sizes seen), the first step drafts
``max_k`` and the next ones measure k = 0 and then the other lengths.

No torch: unit tests drive it with synthetic costs.
"""

from __future__ import annotations

import collections
import statistics
from dataclasses import dataclass, field

from trtspec.acceptance import expected_tokens


@dataclass
class _Cell:
    """The median of the last ``keep`` samples, and how many were taken in all. A median: on a
    shared machine one step in a few dozen takes 10x as long (another tenant), and a mean would
    carry that for many steps."""

    keep: int = 9
    n: int = 0
    recent: collections.deque = field(default_factory=collections.deque)

    def add(self, x: float) -> None:
        self.n += 1
        self.recent.append(x)
        if len(self.recent) > self.keep:
            self.recent.popleft()

    @property
    def value(self) -> float:
        return statistics.median(self.recent)


class CostModel:
    """Seconds of a step's draft and verify parts at batch size B, from the steps the engine ran."""

    def __init__(self, min_samples: int = 3):
        self.min_samples = min_samples
        self.cells: dict[tuple[int, int], _Cell] = {}  # (B, k) → verify seconds
        self.by_tokens: dict[int, list[_Cell]] = {}  # T = B·(k+1) → the cells of that pass size
        self.draft_token: dict[int, _Cell] = {}  # B → seconds per draft token (all k pooled: the fallback)
        self.draft_cells: dict[tuple[int, int], _Cell] = {}  # (B, k) → seconds of the step's drafting
        self.catch_up_token = _Cell()  # seconds per committed token the draft reads late (catch-up)
        self._line: tuple[float, float] | None = None
        self._pooled: dict[int, tuple[int, float | None]] = {}  # T → pooled(T), kept current by add_verify
        self._caps: list[tuple[int, float]] = []  # (T, the cheapest settled pass of T or more tokens), T ascending
        self._line_stale = self._caps_stale = False

    def add_verify(self, batch: int, k: int, seconds: float) -> None:
        tokens = batch * (k + 1)
        c = self.cells.get((batch, k))
        if c is None:
            c = self.cells[(batch, k)] = _Cell()
            self.by_tokens.setdefault(tokens, []).append(c)
        c.add(seconds)
        self._pooled[tokens] = self.pooled(tokens)
        self._line_stale = self._caps_stale = True

    def add_catch_up(self, tokens: int, seconds: float) -> None:
        """The draft read ``tokens`` skipped committed tokens in ``seconds``."""
        if tokens > 0:
            self.catch_up_token.add(seconds / tokens)

    def add_draft(self, batch: int, k: int, seconds: float) -> None:
        """``seconds`` for drafting ``k`` tokens for each of ``batch`` rows (catch-up included)."""
        if k > 0:
            self.draft_token.setdefault(batch, _Cell()).add(seconds / k)
            self.draft_cells.setdefault((batch, k), _Cell()).add(seconds)

    def own_samples(self, batch: int, k: int) -> int:
        """Recent samples in the (batch, k) cell itself (not its pass size's other cells)."""
        c = self.cells.get((batch, k))
        return 0 if c is None else len(c.recent)

    def restart(self, batch: int, k: int) -> None:
        """Forget the (batch, k) cell's recent samples (not its count): the next ones price it alone."""
        c = self.cells.get((batch, k))
        if c is not None:
            c.recent.clear()
            tokens = batch * (k + 1)
            self._pooled[tokens] = self.pooled(tokens)
            self._line_stale = self._caps_stale = True

    def samples_at(self, batch: int, k: int) -> int:
        """Samples behind verify(batch, k): every cell's of the same pass size."""
        return self._pooled.get(batch * (k + 1), (0, None))[0]

    def pooled(self, tokens: int) -> tuple[int, float | None]:
        """(samples taken in all, seconds) over every cell whose pass holds ``tokens`` = B·(k+1)
        token rows: the lowest median among those cells with ``min_samples`` recent samples, else
        the median of all their recent samples; (0, None) if none was measured.

        The lowest, not the median of everything: contention only adds time, so of two cells that
        run the same pass the cheaper one read it with less of another's load. A median of all
        samples lets a loaded cell drag the quiet one with it: served on the Qwen pair after traffic
        at 3-4 requests, nine (3, 0) samples at 130 ms and nine (1, 2) at 90 ms pooled to 109 ms,
        and one request alone then drafted 1 token where 2 paid (86-96 ms in process)."""
        cells = self.by_tokens.get(tokens, ())
        n = sum(c.n for c in cells)
        settled = [c.value for c in cells if len(c.recent) >= self.min_samples]
        if settled:
            return n, min(settled)
        recent = [x for c in cells for x in c.recent]
        return n, (statistics.median(recent) if recent else None)

    def cap(self, tokens: int) -> float:
        """The cheapest settled pass of ``tokens`` or more token rows (inf if none): a pass over
        fewer rows reads the same weights and computes less, so it never costs more than that."""
        if self._caps_stale:
            self._caps_stale = False
            caps, low = [], float("inf")
            for t in sorted(self._pooled, reverse=True):
                n, v = self._pooled[t]
                if n >= self.min_samples and v is not None:
                    low = min(low, v)
                caps.append((t, low))
            self._caps = caps[::-1]
        for t, low in self._caps:  # a few dozen pass sizes at most
            if t >= tokens:
                return low
        return float("inf")

    def line(self) -> tuple[float, float] | None:
        """(a, b) of verify ≈ a + b·T, T = B·(k+1), least squares over the measured pass sizes
        (each T's pooled median, one point per T: a cell measured every step would otherwise
        outweigh the rest); None while fewer than two pass sizes were seen. b is kept ≥ 0 (a pass
        is never cheaper for holding more tokens; a negative slope is noise)."""
        if self._line_stale:
            self._line_stale = False
            self._line = fit_line([(t, v) for t, (_, v) in self._pooled.items()])
        return self._line

    def verify(self, batch: int, k: int) -> float | None:
        """The pass size's pooled cost once settled, else the line's; never above a larger pass's
        (:meth:`cap`). Served on the Qwen pair after traffic at 2-8 requests, the 1-token pass,
        measured only in the few plain steps of one request (a block's last steps, prompts being
        read beside it), read 76 ms while the 2-token pass read 68 ms (60 ms on a quiet server)."""
        tokens = batch * (k + 1)
        n, value = self._pooled.get(tokens, (0, None))
        if n < self.min_samples:
            ab = self.line()
            if ab is not None:
                value = ab[0] + ab[1] * tokens
        if value is None:
            return None
        return min(value, self.cap(tokens))

    def draft(self, batch: int, k: int) -> float | None:
        """Seconds of drafting k tokens for each of ``batch`` rows: the (B, k) cell's median once
        settled; else a line a + b·k through the settled cells at B (two k or more); else k times
        the seconds per draft token at the nearest measured B.

        Per cell, not k times one per-token figure: a drafting step has a fixed part (the first
        draft call reads the tokens accepted last step, the roll-back after the verify), so the
        first token costs more than the next. Served on the Qwen pair at one row, k = 1 drafted
        24 ms a token and k = 2 20: priced at 2 x 24 ms, k = 2 lost to k = 1 in the policy's
        eyes (20.8 against 21.2 tokens/s) and ran on 188 of 1,151 drafting steps, while by the
        steps' medians it delivered 22.8 tokens/s against 21.8 (the per-token figure pooled
        mostly k = 1 steps, so it stayed so: bench/results/qwen-coder-cpu-run/2026-12-07-spr-trace/)."""
        if k == 0:
            return 0.0
        cell = self.draft_cells.get((batch, k))
        if cell is not None and len(cell.recent) >= self.min_samples:
            return cell.value
        settled = [(j, c.value) for (b, j), c in self.draft_cells.items()
                   if b == batch and len(c.recent) >= self.min_samples]
        if len({j for j, _ in settled}) >= 2:
            a, b = fit_line(settled)
            return max(a + b * k, 0.0)
        if not self.draft_token:
            return None
        nearest = min(self.draft_token, key=lambda b: (abs(b - batch), b))
        return k * self.draft_token[nearest].value

    def table(self) -> dict:
        """The fitted line and each measured cell (for snapshots and the benchmark)."""
        ab = self.line()
        return {"verify_line_s": None if ab is None else {"a": ab[0], "b_per_token": ab[1]},
                "verify_s": {f"{b},{k}": round(m.value, 6) for (b, k), m in sorted(self.cells.items())},
                "verify_by_tokens_s": {str(t): round(self._pooled[t][1], 6) for t in sorted(self._pooled)},
                "draft_token_s": {str(b): round(m.value, 6) for b, m in sorted(self.draft_token.items())},
                "draft_s": {f"{b},{k}": round(m.value, 6) for (b, k), m in sorted(self.draft_cells.items())},
                "catch_up_token_s": round(self.catch_up_token.value, 6) if self.catch_up_token.n else None}


def fit_line(points: list[tuple[float, float]]) -> tuple[float, float] | None:
    """Least-squares (a, b) of y ≈ a + b·x with b ≥ 0; None with fewer than two distinct x."""
    n = len(points)
    if n < 2:
        return None
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    if sxx <= 0:
        return None
    b = max(0.0, sum((x - mx) * (y - my) for x, y in points) / sxx)
    return my - b * mx, b


COST_PROBE = "cost probe"  # GoodputPolicy.last["why"]: verify one free draft token a row, no proposer


class GoodputPolicy:
    """Chooses the batch's draft length each step; the engine reports what each step cost and
    how many draft tokens each row had accepted (:meth:`observe`)."""

    def __init__(self, max_k: int, *, min_samples: int = 3, explore_every: int = 8, explore_margin: float = 0.85,
                 probe_every: int = 64, probe_budget: float = 0.02, probe_upside: float = 0.10,
                 switch_margin: float = 0.05, refresh_every: int = 64, refresh_close: float = 0.5,
                 prior_strength: float = 8.0, prior_alpha: float = 0.6, decay: float = 0.99,
                 long_decay: float = 0.999):
        self.max_k = max_k
        self.cost = CostModel(min_samples=min_samples)
        self.min_samples = min_samples
        self.explore_every = explore_every
        self.explore_margin = explore_margin
        self.probe_every = probe_every
        # where the costs alone rule drafting out (no acceptance would pay), a probe only re-measures
        # them, in case they were taken while another tenant loaded the machine: 8x as seldom
        self.cost_probe_every = 8 * probe_every
        self.plain_run = 0  # steps in a row at k = 0
        self.probe_budget = probe_budget
        self.probe_upside = probe_upside  # a probe only where α = 1 would beat plain decoding by this much
        # drafting that first needs a catch-up only where it beats plain decoding by this much (catch-up included)
        self.switch_margin = switch_margin
        self.probe_cost_s = 0.0  # what the last probe cost above a plain step, its catch-up included
        self.since_probe_s = 0.0  # seconds of steps since it
        self._probing = False  # the step chosen last is a probe
        self.probes = 0  # probes so far
        self._drafted_last = False  # the last observed step drafted
        self.prior_strength = prior_strength
        self.prior_alpha = prior_alpha
        self.decay = decay
        self.reached = [0.0] * max_k  # deployment: draft position i was verified (decayed counts)
        self.accepted_at = [0.0] * max_k  # … and accepted
        # the same counts over the long run: aged only by steps that draft (half-life ~700 of them)
        self.long_decay = long_decay
        self.long_reached = [0.0] * max_k
        self.long_accepted = [0.0] * max_k
        self.steps_at: collections.Counter = collections.Counter()  # B → steps chosen at B
        self.chosen: collections.Counter = collections.Counter()  # k → steps
        self.chosen_at: collections.Counter = collections.Counter()  # (B, k) → steps
        self.last: dict = {}  # the last decision: batch, k, why, expected goodput per k
        # stretches: how many steps in a row the batch keeps one size (stretch_left)
        self.stretch_batch: int | None = None
        self.stretch_steps = 0  # steps of the current stretch so far
        self.stretch_len: dict[int, collections.deque] = {}  # B → the last 8 stretches at B that ended (steps)
        # plain refresh (choose): while the batch drafts at B, plain decoding at B is re-measured
        # from its own fresh steps once its last own sample is ``refresh_every`` steps at B old
        # (4x as seldom where drafting is priced ``refresh_close`` or more above plain decoding)
        self.refresh_every = refresh_every
        self.refresh_close = refresh_close
        self.plain_at: dict[int, int] = {}  # B → steps_at[B] when the (B, 0) cell last took a sample
        self._refresh_left: dict[int, int] = {}  # B → plain steps still to run in the refresh under way
        self._fresh: set[int] = set()  # B whose (B, 0) cell restarts its window at its next sample
        self.refreshes = 0

    # ---------------------------------------------------------------- acceptance

    def deployment_alphas(self) -> list[float]:
        """α_i of the deployment: its recent counts with 2 pseudo-counts of a prior, which is the one
        before it (the prior ``prior_alpha`` first) or the long-run α_i, whichever is higher.

        The recent counts age every step, plain ones too, so that after low acceptance a probe's
        few accepted tokens can move them (the prior, 0.6, is what recovery starts from). But a
        deployment that measured 0.88 for hours and then decoded plainly at 4-8 rows for a few
        hundred steps came back to one row believing 0.6: served on the Qwen pair (Sapphire Rapids,
        2026-12-08-spr-refresh-restored), a lone request then ran all 63 steps plain, its catch-up
        growing each step, and so did the next, until a probe: 1,607 plain one-row steps in the c=1
        level. The long-run counts (aged only by drafting steps) keep what was measured; they never
        lower the prior, so recovery after low acceptance is what it was."""
        out, prev, long_prev = [], self.prior_alpha, self.prior_alpha
        for i, (r, a) in enumerate(zip(self.reached, self.accepted_at)):
            long_prev = (self.long_accepted[i] + 2.0 * long_prev) / (self.long_reached[i] + 2.0)
            prev = (a + 2.0 * max(prev, long_prev)) / (r + 2.0)
            out.append(prev)
        return out

    def row_alphas(self, reached: list[int], accepted_at: list[int], deployment: list[float] | None = None) -> list[float]:
        """α_i of one request: its own counts with ``prior_strength`` pseudo-counts of the deployment's α_i."""
        dep = deployment if deployment is not None else self.deployment_alphas()
        m = self.prior_strength
        return [((accepted_at[i] if i < len(accepted_at) else 0) + m * dep[i])
                / ((reached[i] if i < len(reached) else 0) + m) for i in range(self.max_k)]

    # ---------------------------------------------------------------- the decision

    def goodput(self, batch: int, rows_alphas: list[list[float]], k: int, overhead: float = 0.0,
                catch_up: float = 0.0) -> float | None:
        """Expected accepted tokens per second of one step at draft length k (None: a cost unknown).
        ``catch_up``: seconds a drafting step pays on top (the draft reading tokens it skipped while
        steps were plain, amortized: :meth:`catch_up_share`); k = 0 does not pay it."""
        v, d = self.cost.verify(batch, k), self.cost.draft(batch, k)
        if v is None or d is None:
            return None
        tokens = sum(expected_tokens(a, k) for a in rows_alphas)
        return tokens / max(v + d + overhead + (catch_up if k else 0.0), 1e-9)

    def best(self, batch: int, rows_alphas: list[list[float]], overhead: float = 0.0,
             catch_up: float = 0.0) -> tuple[int, dict[int, float]]:
        """The k with the highest expected goodput (ties: the shorter draft), and every k's figure;
        (-1, …) while some k has no cost estimate."""
        g = {k: self.goodput(batch, rows_alphas, k, overhead, catch_up) for k in range(self.max_k + 1)}
        if any(v is None for v in g.values()):
            return -1, {k: v for k, v in g.items() if v is not None}
        return max(g, key=lambda k: (g[k], -k)), g

    def catch_up_share(self, behind_tokens: int, steps_left: float) -> float:
        """Seconds per step that switching to drafting costs: the draft reads the ``behind_tokens``
        committed tokens it has not seen (a prompt read late, the tokens of plain steps) at the
        measured seconds per caught-up token, spread over the ``steps_left`` steps the batch's
        requests still have to go. A request near its end does not pay back a long catch-up; a new
        request's prompt, spread over its whole output, costs little."""
        c = self.cost.catch_up_token.value if self.cost.catch_up_token.n else None
        if not behind_tokens or c is None:
            return 0.0
        return behind_tokens * c / max(steps_left, 1.0)

    def stretch_left(self, batch: int) -> float | None:
        """Call once per step with the step's batch size: the steps the batch is expected to keep
        this size from now on, or None while no stretch at this size has ended yet: what a stretch
        of the typical length at this size (the median of the last 8 that ended) would still have,
        or as many steps again as this one has lasted, whichever is more (a stretch that has
        lasted long tends to go on).

        Why: a catch-up pays back only while the batch drafts. In a closed loop at 2 requests the
        batch drops to one row for a step or two between a finished request and its successor;
        spread over the lone row's remaining output, the draft's catch-up (every token of the
        plain 2-row steps) looked cheap, the step drafted, and the next step was back at 2 rows
        and plain: the catch-up bought one drafting step, and then again at the next gap.

        A median, not a moving average: a level at one request is one stretch at one row a
        thousand steps long, and a moving average (0.8 old, 0.2 new) took some 20 one-step gaps at
        c=2 to forget it. Served on the Qwen pair (Sapphire Rapids, 2026-12-08-spr-fresh-refresh),
        the first ~20 gaps of the c=2 level drafted with 28-49 tokens to catch up, priced at a
        7-19 ms share, in steps of 330-470 ms against 85 for a plain one, each followed by the next
        request's prefill and plain two-row steps: P95 request latency at c=2 read 1.05x
        [1.01, 1.10] while the level's steps cost what the baseline's did."""
        if batch != self.stretch_batch:
            if self.stretch_batch is not None:
                self.stretch_len.setdefault(self.stretch_batch, collections.deque(maxlen=8)).append(self.stretch_steps)
            self.stretch_batch, self.stretch_steps = batch, 0
        self.stretch_steps += 1
        ended = self.stretch_len.get(batch)
        if not ended:
            return None
        return max(statistics.median(ended) - self.stretch_steps, float(self.stretch_steps))

    def choose(self, batch: int, rows_alphas: list[list[float]], overhead: float = 0.0,
               catch_up: float = 0.0) -> int:
        """The draft length of the next step at ``batch`` rows, exploration included; ``catch_up``
        as :meth:`goodput` takes it."""
        if self.max_k == 0:
            return 0
        n = self.steps_at[batch]
        self.steps_at[batch] += 1
        k, g = self.best(batch, rows_alphas, overhead, catch_up)
        why = "goodput"
        if k > 0 and catch_up > 0 and g[k] < (1.0 + self.switch_margin) * g[0]:
            k = 0  # a sure catch-up for a gain within the cost model's error: stay plain (module doc)
        if k < 0:  # cold start: something has no estimate; measure max_k, then 0, then the rest
            k, why = self._least_measured(batch, prefer=(self.max_k, 0)), "cold start"
        elif self.explore_every and n % self.explore_every == self.explore_every - 1:
            near = [j for j in range(self.max_k + 1) if j != k and g[j] >= self.explore_margin * g[k]]
            if near:
                e = min(near, key=lambda j: (self.cost.samples_at(batch, j), -j))
                # a refresh that drafts only while the draft has nothing to catch up: served at two
                # rows, where k=1 and k=0 were priced within 2 %, each refresh first read the ~60
                # tokens both rows had skipped (pooled by pass size, the cell is priced anyway).
                # A first measurement still runs: a new request's draft is always behind by its
                # prompt, and at one row after batched traffic (the drafting cells priced through
                # plain passes of drained batches) waiting for a caught-up draft left the first
                # 200 steps of the c=1 level plain until a probe (2026-12-08-spr-stretch-median)
                refresh = n % (4 * self.explore_every) == 4 * self.explore_every - 1 and (e == 0 or not catch_up)
                if refresh or self.cost.samples_at(batch, e) < self.min_samples:
                    k, why = e, "explore"
        if self._refresh_left.get(batch):  # a plain refresh under way: its next plain step
            k, why = 0, "refresh"
            self._refresh_left[batch] -= 1
        elif why == "goodput" and k > 0 and self._plain_stale(batch, g[k] / g[0]):
            k, why = 0, "refresh"
            # the first plain step right after drafting is no sample (observe): then min_samples more
            self._refresh_left = {batch: self.min_samples - (0 if self._drafted_last else 1)}
            self._fresh.add(batch)
            self.refreshes += 1
        if (k == 0 and why != "refresh" and self.probe_every and self.plain_run >= self.probe_every
                and self._probe_affordable()):
            if self._acceptance_bound(batch, rows_alphas, overhead, catch_up):
                k, why = 1, "probe"
            elif self.plain_run >= self.cost_probe_every:
                k, why = 1, COST_PROBE
        self._probing = why in ("probe", COST_PROBE)
        self.probes += self._probing
        self.plain_run = self.plain_run + 1 if k == 0 else 0
        self.chosen[k] += 1
        self.chosen_at[(batch, k)] += 1
        self.last = {"batch": batch, "k": k, "why": why, "goodput": {str(j): round(v, 3) for j, v in g.items()},
                     "catch_up_s": round(catch_up, 5)}
        return k

    def _plain_stale(self, batch: int, gain: float) -> bool:
        """Is plain decoding at ``batch`` priced from samples too old (or too few of its own) to
        trust against drafting that gains ``gain``x by the cost model?

        While the batch drafts, the (B, 0) cell takes no samples: its price is whatever its last
        nine plain steps read, however long ago, or another cell's of the same pass size. Both
        made the policy draft where plain decoding was faster. Served on the Qwen pair at c=4
        (AMD EPYC, 2026-12-08-zen4-plain-own-cell), five plain four-row steps at 96-118 ms (a
        transient; 1,534 plain four-row steps had a median of 72 ms) set the cell's median to 96,
        and the batch drafted k=1 on 203 steps expecting 1.22x where they measured 0.87x; at c=2
        (2026-12-08-zen4-switch-margin) the (2, 0) cell never settled, the pass size T = 2 was
        priced by the (1, 1) cell at 60 ms against 49.6 measured, and two-row drafting expected
        1.31x and measured 0.99x. Exploration never re-measured k = 0: it picks the arm with the
        fewest samples, and k = 0 had the most. A refresh runs plain steps until the cell holds
        ``min_samples`` fresh samples (its old window forgotten), then the goodput choice goes on
        from the two arms measured minutes, not levels, apart."""
        if not self.refresh_every:
            return False
        if self.cost.own_samples(batch, 0) < self.min_samples:
            return True
        every = self.refresh_every * (1 if gain < 1.0 + self.refresh_close else 4)
        return self.steps_at[batch] - self.plain_at.setdefault(batch, self.steps_at[batch]) >= every

    def _probe_affordable(self) -> bool:
        """Has the time since the last probe paid for it within ``probe_budget``?"""
        return self.probe_cost_s <= self.probe_budget * self.since_probe_s

    def _acceptance_bound(self, batch: int, rows_alphas: list[list[float]], overhead: float, catch_up: float) -> bool:
        """Is k = 0 chosen for want of acceptance, with something worth a probe at stake? Only then
        can a probe's measurement change the choice for the better.

        Not when the rows' acceptance as measured would draft if the draft had nothing to catch
        up: then the catch-up holds drafting back, not acceptance, and a probe would pay that
        catch-up to measure what is known (the goodput choice drafts by itself once the stretch
        has lasted long enough to pay the catch-up back, :meth:`stretch_left`). Served on the Qwen
        pair at c=2, after 800e8c5 six one-row probes a level remained (356 ms median against 55 ms
        for a plain step, each reading the ~45 tokens its row skipped), with the deployment's
        acceptance at 0.9 and measured a few dozen steps before. Where even every draft token
        accepted (α = 1) would not beat ordinary decoding at this batch size by ``probe_upside``
        (10 %), k = 0 is the costs' verdict, or near enough that finding a higher acceptance would
        gain little: a probe would cost more than it could buy. Served on the Qwen pair at c=2, a
        lone row between two requests chose k = 0 because the draft's catch-up would not pay back
        over a stretch of a few steps; α = 1 beat that by a few per cent, so a probe ran anyway,
        read the skipped tokens (264-291 ms against ~70 for a plain step) and the next step was
        back at two rows, plain (2 of the level's 5 probes; after the other 3 the row kept
        drafting). The deployment's acceptance (0.9) was fresh from the steps before."""
        if self.best(batch, rows_alphas, overhead)[0] != 0:
            return False
        k, g = self.best(batch, [[1.0] * self.max_k] * batch, overhead, catch_up)
        return k != 0 and g[k] >= (1.0 + self.probe_upside) * g[0]

    def _least_measured(self, batch: int, prefer: tuple[int, ...] = ()) -> int:
        for k in prefer:
            if self.cost.samples_at(batch, k) == 0 and (k > 0 or self.cost.draft_token):
                return k
        return min(range(self.max_k + 1), key=lambda k: (self.cost.samples_at(batch, k), -k))

    def observe(self, batch: int, k: int, verify_s: float, draft_s: float,
                rows: list[tuple[int, int]], late_s: float = 0.0, cost_only: bool = False) -> None:
        """One step ran: a [batch, k+1] verify pass, ``draft_s`` of drafting, ``late_s`` of the
        draft reading tokens it skipped (catch-up), and per row (drafted, accepted) of the
        proposer's tokens. ``cost_only``: a cost probe, whose draft tokens were free guesses, not
        the proposer's: only its verify time is a sample."""
        step_s = verify_s + draft_s + late_s
        if self._probing:  # what the probe cost above the plain step it replaced
            plain = self.cost.verify(batch, 0)
            self.probe_cost_s = max(0.0, step_s - (plain if plain is not None else verify_s))
            self.since_probe_s = 0.0
            self._probing = False
        else:
            self.since_probe_s += step_s
        # a plain pass right after a drafting step reads target weights the draft pushed out of the
        # CPU's caches; plain decoding as a regime (what k = 0 is chosen for) does not pay that
        if k > 0 or not self._drafted_last:
            if k == 0:
                if batch in self._fresh:  # a plain refresh's first sample: the old window goes
                    self._fresh.discard(batch)
                    self.cost.restart(batch, 0)
                self.plain_at[batch] = self.steps_at[batch]
            self.cost.add_verify(batch, k, verify_s)
        self._drafted_last = k > 0 and not cost_only
        if not cost_only:
            self.cost.add_draft(batch, k, draft_s)
        # every step ages the evidence, plain ones too: while nothing drafts, the deployment's α
        # drifts back toward the prior, so a probe's few accepted tokens can move it
        self.reached = [r * self.decay for r in self.reached]
        self.accepted_at = [a * self.decay for a in self.accepted_at]
        # the long-run counts: only the proposer's drafts count, and only they age them
        long_run = not cost_only and any(drafted for drafted, _ in rows)
        if long_run:
            self.long_reached = [r * self.long_decay for r in self.long_reached]
            self.long_accepted = [a * self.long_decay for a in self.long_accepted]
        for drafted, accepted in rows:
            for i in range(min(accepted + 1, drafted, self.max_k)):
                self.reached[i] += 1
                self.long_reached[i] += long_run
                if i < accepted:
                    self.accepted_at[i] += 1
                    self.long_accepted[i] += long_run

    def served_view(self, max_batch: int) -> dict:
        """What a served engine reports on /metrics: the steps chosen per (B, k) so far, and the
        verify and draft seconds the policy now prices each (B, k) at, B = 1 … ``max_batch``
        (None where it has no estimate yet)."""
        cells = [(b, k) for b in range(1, max_batch + 1) for k in range(self.max_k + 1)]
        return {"steps": dict(self.chosen_at),
                "verify_s": {c: self.cost.verify(*c) for c in cells},
                "draft_s": {c: self.cost.draft(*c) for c in cells}}

    def snapshot(self) -> dict:
        return {"policy": "goodput", "chosen_k": {str(k): n for k, n in sorted(self.chosen.items())},
                "chosen_at": {f"{b},{k}": n for (b, k), n in sorted(self.chosen_at.items())},
                "deployment_acceptance": [round(a, 4) for a in self.deployment_alphas()],
                "probes": self.probes, "plain_refreshes": self.refreshes, "last_probe_cost_s": round(self.probe_cost_s, 4),
                "last": self.last, **self.cost.table()}
