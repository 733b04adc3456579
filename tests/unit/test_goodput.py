"""The goodput draft-length policy (trtspec.speculative.goodput) on synthetic costs: no model, no torch."""

from __future__ import annotations

import copy

import pytest

from trtspec.speculative.goodput import CostModel, GoodputPolicy, fit_line


def _policy(verify, draft_per_token: float, batches=(1, 2, 4, 8), max_k: int = 4, **kw) -> GoodputPolicy:
    """A policy whose every (B, k) cell was measured ``min_samples`` times at ``verify(B, k)``."""
    p = GoodputPolicy(max_k, **kw)
    for B in batches:
        for k in range(max_k + 1):
            for _ in range(p.min_samples):
                p.cost.add_verify(B, k, verify(B, k))
    p.cost.add_draft(1, 1, draft_per_token)
    return p


def test_fit_line_recovers_a_and_b_from_noisy_samples():
    import random

    rng = random.Random(0)
    pts = [(t, 0.02 + 0.003 * t + rng.gauss(0, 0.0005)) for t in range(1, 41) for _ in range(3)]
    a, b = fit_line(pts)
    assert a == pytest.approx(0.02, abs=0.001) and b == pytest.approx(0.003, rel=0.05)
    assert fit_line([(5, 0.1), (5, 0.2)]) is None  # one pass size: no slope
    assert fit_line([(1, 0.3), (10, 0.1)]) == (pytest.approx(0.2), 0.0)  # negative slope: noise, flat at the mean


def test_cost_model_uses_a_cell_median_once_measured_else_the_line():
    c = CostModel(min_samples=3)
    for B, k in ((1, 0), (1, 4), (8, 0)):  # verify = 0.01 + 0.002·B·(k+1)
        for _ in range(3):
            c.add_verify(B, k, 0.01 + 0.002 * B * (k + 1))
    assert c.verify(4, 1) == pytest.approx(0.01 + 0.002 * 8)  # never measured: from the line
    c.add_verify(1, 0, 5.0)  # one step while another tenant held the cores
    assert c.verify(1, 0) == pytest.approx(0.012)  # the median ignores it
    assert c.draft(4, 2) is None and c.draft(4, 0) == 0.0
    c.add_draft(2, 3, 0.003)
    assert c.draft(4, 2) == pytest.approx(0.002)  # per token, from the nearest measured batch size


def test_a_cell_measured_only_under_load_is_outvoted_by_its_pass_size():
    """The Qwen pair served on 2 cores, closed loop at 4: 3 rows occur only between a finished
    request and its successor, while tritonserver pre- and post-processes them on the same cores,
    so the (3, 0) cell read 130 ms (above (4, 0)'s 122) and the policy drafted at 3 rows. The same
    3-row pass measured at (1, 2) over whole requests read 90 ms: pooled by pass size, 3 rows
    stay plain."""
    p = GoodputPolicy(2, explore_every=0, probe_every=0)
    served = {(1, 0): 0.085, (1, 1): 0.075, (1, 2): 0.090, (2, 0): 0.084, (2, 1): 0.133, (2, 2): 0.179,
              (3, 0): 0.130, (3, 1): 0.177, (3, 2): 0.248, (4, 0): 0.122, (4, 1): 0.213, (4, 2): 0.324}
    for (B, k), v in served.items():
        for _ in range(9 if (B, k) != (3, 0) else 8):
            p.cost.add_verify(B, k, v)
    for B, d in ((1, 0.020), (2, 0.042), (3, 0.054), (4, 0.059)):
        p.cost.add_draft(B, 1, d)
    alphas = [[0.94, 0.98]] * 3
    assert p.cost.verify(3, 0) == pytest.approx(0.090)  # 9 samples at 90 ms, 8 at 130 ms
    assert p.cost.verify(1, 2) == pytest.approx(0.090)
    assert p.cost.samples_at(3, 0) == 17
    assert p.best(3, alphas, overhead=0.0035)[0] == 0
    # the same costs per cell, unpooled, drafted (what the served engine did)
    g0 = 3 / (0.130 + 0.0035)
    g1 = sum(1 + a[0] for a in alphas) / (0.177 + 0.054 + 0.0035)
    assert g1 > g0
    # one row still drafts its longest
    assert p.best(1, [[0.94, 0.98]], overhead=0.0035)[0] == 2


def test_a_pass_size_reads_its_least_loaded_cell():
    """After traffic at 3-4 requests the (3, 0) cell holds nine loaded samples (130 ms) beside nine
    quiet ones of (1, 2) (90 ms): a median of all eighteen read 109 ms and one request alone drafted
    1 token where 2 paid. Contention only adds time: the pass size reads its cheaper cell."""
    p = GoodputPolicy(2, explore_every=0, probe_every=0)
    served = {(1, 0): 0.085, (1, 1): 0.075, (1, 2): 0.090, (3, 0): 0.130}
    for (B, k), v in served.items():
        for _ in range(9):
            p.cost.add_verify(B, k, v)
    p.cost.add_draft(1, 1, 0.020)
    assert p.cost.verify(1, 2) == pytest.approx(0.090)
    assert p.cost.verify(3, 0) == pytest.approx(0.090)
    assert p.cost.samples_at(1, 2) == 18
    assert p.best(1, [[0.94, 0.98]], overhead=0.0035)[0] == 2
    # what the median of all samples would have read, and chosen
    g1 = (1 + 0.94) / (0.075 + 0.020 + 0.0035)
    g2 = (1 + 0.94 + 0.94 * 0.98) / (0.110 + 0.040 + 0.0035)
    assert g1 > g2
    # a cell with fewer than min_samples recent samples does not set the price alone
    c = CostModel(min_samples=3)
    c.add_verify(2, 0, 0.010)
    for _ in range(3):
        c.add_verify(1, 1, 0.050)
    assert c.verify(2, 0) == pytest.approx(0.050)


def test_a_pass_never_costs_more_than_a_larger_one():
    """Served on the Qwen pair after traffic at 2-8 requests: the 1-token pass, measured only in a
    request's few plain steps (with prompts being read beside it), read 76 ms; the 2-token pass,
    measured in every plain step at two rows, 68 ms. Fewer rows over the same weights never cost
    more: the 1-token pass is priced at most at the 2-token one, and so is a pass size priced by
    the line."""
    c = CostModel(min_samples=3)
    for (B, k), v in {(1, 0): 0.0762, (2, 0): 0.0680, (1, 1): 0.0640, (1, 2): 0.0822, (4, 0): 0.1005,
                      (4, 1): 0.2154, (8, 0): 0.160}.items():
        for _ in range(9):
            c.add_verify(B, k, v)
    assert c.verify(1, 0) == pytest.approx(0.0640)  # capped by T=2's pooled cost (the cheaper cell)
    assert c.verify(2, 0) == pytest.approx(0.0640)
    assert c.verify(1, 2) == pytest.approx(0.0822)  # already below every larger pass: unchanged
    a, b = c.line()
    assert c.verify(8, 1) == pytest.approx(a + 16 * b)  # T=16, above every measured pass: the line
    assert c.verify(5, 0) == pytest.approx(min(a + 5 * b, 0.160))  # T=5 unmeasured: the line, capped by T=8
    assert c.cap(8) == pytest.approx(0.160) and c.cap(9) == float("inf")  # T=8: (8, 0) and (4, 1)
    c.add_verify(3, 0, 0.050)  # a new sample refreshes the caps
    for _ in range(2):
        c.add_verify(3, 0, 0.050)
    assert c.verify(1, 0) == pytest.approx(0.050)


def _served_two_rows(*, explore_every: int, two_rows: tuple[float, float], draft: tuple[int, float]) -> GoodputPolicy:
    """A k ≤ 2 policy with the Qwen pair's served verify costs at one row and ``two_rows`` =
    (the 2-token pass, the 4-token pass) seconds, nine samples each, and one draft sample
    (batch, seconds per token)."""
    p = GoodputPolicy(2, explore_every=explore_every, probe_every=0)
    t2, t4 = two_rows
    for (B, k), v in {(1, 0): 0.060, (1, 1): 0.068, (1, 2): 0.082, (2, 0): t2, (2, 1): t4, (2, 2): 0.160,
                      (4, 0): t4}.items():
        for _ in range(9):
            p.cost.add_verify(B, k, v)
    p.cost.add_draft(draft[0], 1, draft[1])
    return p


def test_a_catch_up_is_spread_over_the_steps_the_batch_keeps_its_size():
    """Closed loop at 2 on the Qwen pair's served costs: the batch drops to one row for a step or
    two between a finished request and its successor. Spread over the lone row's remaining
    output (20 steps), reading the 60 tokens of the plain 2-row steps looks cheap and the step
    drafts; but the batch is back at 2 rows (plain) at once. Once stretches at one row are
    known to last ~2 steps, the lone row stays plain; a stretch that goes on drafts again."""
    def policy():
        p = _served_two_rows(explore_every=0, two_rows=(0.068, 0.101), draft=(1, 0.020))
        for _ in range(3):
            p.cost.add_catch_up(60, 0.180)  # 3 ms a token
        return p

    alphas = [[0.9, 0.9]]
    fresh = policy()
    assert fresh.stretch_left(1) is None  # no stretch at one row has ended yet
    assert fresh.best(1, alphas, catch_up=fresh.catch_up_share(60, 20))[0] > 0

    looped = policy()
    for _ in range(6):  # 30 steps at two rows, 2 at one
        for B, n in ((2, 30), (1, 2)):
            for _ in range(n):
                looped.stretch_left(B)
    stay = looped.stretch_left(2)
    assert stay == pytest.approx(29)  # two rows: long stretches
    stay = looped.stretch_left(1)
    assert stay == pytest.approx(1)  # the first step of a one-row stretch: ~2 steps typical
    assert looped.best(1, alphas, catch_up=looped.catch_up_share(60, min(20, stay)))[0] == 0
    for _ in range(9):  # the stretch went on (the other client stopped): a long one ahead
        stay = looped.stretch_left(1)
    assert stay == 10
    assert looped.best(1, alphas, catch_up=looped.catch_up_share(60, min(20, stay)))[0] > 0


def test_a_long_stretch_at_one_size_is_forgotten_after_a_few_short_ones():
    """A level at one request is one stretch at one row a thousand steps long. At c=2 the batch
    drops to one row for a step between requests; with a moving average of the stretch lengths
    the first ~20 such gaps on the Qwen pair still looked long, and each drafted with 28-49
    tokens to catch up (330-470 ms against 85 for a plain step). The median of the last 8 ended
    stretches forgets the long one after two short ones."""
    p = _served_two_rows(explore_every=0, two_rows=(0.074, 0.100), draft=(1, 0.020))
    for _ in range(3):
        p.cost.add_catch_up(30, 0.225)  # 7.5 ms a token, as served
    for _ in range(1000):  # the c=1 level
        p.stretch_left(1)
    alphas = [[0.9, 0.9]]
    seen = []
    for _ in range(3):  # c=2: 60 steps at two rows, one at one row
        for _ in range(60):
            p.stretch_left(2)
        stay = p.stretch_left(1)
        seen.append(stay)
    assert seen[0] == 1000 - 1  # the one stretch known so far is the c=1 level
    assert seen[2] == 1  # the median of [1000, 1, 1]: the gap is a step long (was 0.8^2 * 1000 - 1 = 639)
    assert p.best(1, alphas, catch_up=p.catch_up_share(30, min(60, seen[2])))[0] == 0
    assert p.best(1, alphas, catch_up=p.catch_up_share(30, min(60, seen[0])))[0] > 0


def test_a_refresh_does_not_draft_while_the_draft_has_to_catch_up():
    """At two rows on the Qwen pair k=1 and k=0 were priced within 2 %, so the exploration refresh
    (every 32 steps) drafted, and each time the draft first read every token both rows had
    skipped. A refresh now drafts only while nothing is to be caught up; one that re-measures
    k = 0 still runs, and so does a cell's first measurement."""
    def policy():
        return _served_two_rows(explore_every=8, two_rows=(0.074, 0.108), draft=(2, 0.036))

    alphas = [[0.9, 0.9]] * 2
    caught_up, behind = policy(), policy()
    assert caught_up.best(2, alphas)[0] == 0
    plain = [caught_up.choose(2, alphas) for _ in range(64)]
    assert plain.count(1) == 2  # steps 32 and 64: the refresh measures k=1
    drafted = [behind.choose(2, alphas, catch_up=0.006) for _ in range(64)]
    assert drafted.count(1) == 0 and drafted.count(2) == 0


def test_a_first_measurement_runs_while_the_draft_has_to_catch_up():
    """A new request's draft is always behind by its prompt. Served on the Qwen pair, when a
    draft length's first measurement waited for a caught-up draft, one row after batched traffic
    (its drafting cells priced through plain passes of drained batches) ran the first ~200 steps
    of the c=1 level plain, until a probe (2026-12-08-spr-stretch-median)."""
    p = _served_two_rows(explore_every=8, two_rows=(0.074, 0.100), draft=(2, 0.030))
    del p.cost.cells[(2, 2)]  # (2, 2) not measured: priced through its pass size, T = 6
    p.cost.by_tokens[6] = []
    p.cost._pooled.pop(6)
    p.cost._line_stale = p.cost._caps_stale = True
    alphas = [[0.9, 0.9]] * 2
    k, g = p.best(2, alphas, catch_up=0.004)
    assert p.cost.samples_at(2, 2) == 0 and g[2] >= p.explore_margin * g[k]
    steps = [p.choose(2, alphas, catch_up=0.004) for _ in range(8)]
    assert steps[7] == 2 and p.last["why"] == "explore"


def test_policy_picks_k0_when_verify_at_the_batch_size_makes_speculation_lose():
    """Verify cost grows with every token (compute-bound): at batch 8 one plain pass is the best buy."""
    p = _policy(lambda B, k: 0.004 + 0.004 * B * (k + 1), 0.0005)
    alphas = [[0.7] * 4] * 8
    k, g = p.best(8, alphas)
    assert k == 0, g
    assert all(g[0] > g[j] for j in range(1, 5))


def test_policy_picks_max_k_when_drafts_are_cheap_and_accepted():
    p = _policy(lambda B, k: 0.02 + 0.0002 * B * (k + 1), 0.0002)
    assert p.best(1, [[0.95] * 4])[0] == 4
    assert p.best(4, [[0.95] * 4] * 4)[0] == 4


def test_policy_drafts_less_as_the_batch_grows():
    """verify = 0.01 + 0.004·B·(k+1), 0.5 ms per draft token, α = 0.7 at every position: by hand,
    goodput peaks at k = 2 for one row, 1 for two and four, 0 for eight."""
    p = _policy(lambda B, k: 0.01 + 0.004 * B * (k + 1), 0.0005)
    assert [p.best(B, [[0.7] * 4] * B)[0] for B in (1, 2, 4, 8)] == [2, 1, 1, 0]


def test_a_rejecting_request_drafts_nothing_while_the_deployment_accepts():
    p = _policy(lambda B, k: 0.02 + 0.002 * B * (k + 1), 0.001)
    for _ in range(200):  # the deployment: two requests, most drafts accepted
        p.observe(2, 4, 0.04, 0.004, [(4, 4), (4, 2)])
    dep = p.deployment_alphas()
    assert dep[0] > 0.9
    assert p.best(1, [p.row_alphas([], [], dep)])[0] == 4  # a new request starts from the deployment's α
    rejecting = p.row_alphas([100, 0, 0, 0], [0, 0, 0, 0], dep)  # 100 verified first positions, none accepted
    assert rejecting[0] < 0.1
    assert p.best(1, [rejecting])[0] == 0


def test_policy_cold_start_measures_max_k_then_0_then_decides_and_explores():
    p = GoodputPolicy(4, explore_every=8)
    cost = {0: 0.01, 1: 0.011, 2: 0.012, 3: 0.013, 4: 0.014}
    chosen, why = [], []
    for _ in range(64):
        k = p.choose(1, [[0.9] * 4])
        chosen.append(k)
        why.append(p.last["why"])
        p.observe(1, k, cost[k], 0.0005 * k, [(k, k)])
    # k 0 right after a drafting step is not a sample (see the next test): measured at the second
    assert chosen[:3] == [4, 0, 0] and why[:3] == ["cold start"] * 3
    # one cold-start sample of plain decoding is too few to trust: the first choice to draft re-measures it
    assert why[3:6] == ["refresh"] * 3 and set(why[6:]) == {"goodput", "explore"}
    assert all(i % 8 == 7 for i, w in enumerate(why) if w == "explore")  # one step in 8 at most
    # k 3 is within 15 % of the best (k 4) and gets measured; k 1 and 2 are priced far below it and
    # never cost a step; most steps go to the best one
    assert p.cost.samples_at(1, 3) >= 3 and p.cost.samples_at(1, 1) == p.cost.samples_at(1, 2) == 0
    assert chosen.count(4) > 50


def test_a_plain_pass_right_after_drafting_is_not_a_plain_decoding_sample():
    """On a CPU the draft pushes the target's weights out of cache: the plain pass after it is
    slower than plain decoding as a regime, which is what choosing k = 0 buys."""
    p = GoodputPolicy(4)
    p.observe(2, 3, 0.02, 0.003, [(3, 3), (3, 1)])
    p.observe(2, 0, 0.05, 0.0, [(0, 0), (0, 0)])  # just after the draft: left out
    assert p.cost.samples_at(2, 0) == 0
    p.observe(2, 0, 0.01, 0.0, [(0, 0), (0, 0)])
    assert p.cost.samples_at(2, 0) == 1 and p.cost.cells[(2, 0)].value == 0.01


def test_policy_with_no_draft_length_always_decodes_plainly():
    p = GoodputPolicy(0)
    assert p.choose(3, [[]] * 3) == 0


def test_recipe_policy_is_checked_by_name_and_defaults_to_goodput():
    from trtspec.config import Adaptive
    from trtspec.errors import ConfigErrors
    from trtspec.speculative.spec import RuntimeSpec

    assert Adaptive().policy == "goodput"
    assert RuntimeSpec(target="/t", runtime={"adaptive": {"enabled": True, "policy": "off"}}).runtime.adaptive.policy == "off"
    with pytest.raises(ConfigErrors, match="policy"):
        RuntimeSpec(target="/t", runtime={"adaptive": {"policy": "fastest"}})


def test_engine_model_exports_the_mean_draft_length_per_request():
    from trtspec.speculative.stats import RequestStats
    from trtspec.triton.backend.engine import engine_metric_specs, finished_metric_ops

    s = RequestStats(generated=9)
    for k in (4, 0, 2):  # a goodput engine's choices for this request, step by step
        s.record_step(drafted=k, accepted=k // 2, draft_s=0.0, verify_s=0.0, batch=2, draft_len=k)
    assert s.mean_draft_len == 2.0 and s.to_dict()["mean_draft_len"] == 2.0
    spec = {name: buckets for name, _, _, buckets, _ in engine_metric_specs(4)}
    assert spec["trtspec_draft_len"] == (0.0, 1.0, 2.0, 3.0, 4.0)
    assert ("observe", "trtspec_draft_len", 2.0, {}) in finished_metric_ops(s, rss=1)


def test_the_policy_metrics_count_steps_per_batch_and_k_and_show_its_prices():
    """/metrics carries what the policy chose at each batch size and what it expects each step to
    cost there: the served (3, 0) cell that misled it was found only by a debugging dump."""
    from trtspec.triton.backend.engine import PolicyMetrics, policy_metric_specs

    p = _policy(lambda B, k: 0.01 + 0.004 * B * (k + 1), 0.0005, batches=(1, 2), max_k=2)
    for B in (1, 1, 2, 2, 2):
        p.choose(B, [[0.9, 0.9]] * B)
    view = p.served_view(3)
    assert sum(view["steps"].values()) == 5 and sum(n for (b, _), n in view["steps"].items() if b == 2) == 3
    assert view["verify_s"][(1, 1)] == pytest.approx(0.018)  # (2, 0): the same 2-row pass
    assert view["verify_s"][(3, 0)] == pytest.approx(0.01 + 0.004 * 3)  # never measured: the line
    assert view["draft_s"][(2, 2)] == pytest.approx(0.001) and view["draft_s"][(2, 0)] == 0.0
    names = {(n, lab["batch"], lab["draft_len"]) for n, _, _, _, lab in policy_metric_specs(3, 2)}
    assert len(names) == 3 * 3 * 3
    pm = PolicyMetrics()
    ops = pm.ops(view)
    inc = {(lab["batch"], lab["draft_len"]): v for op, n, v, lab in ops if op == "increment"}
    assert sum(inc.values()) == 5
    assert ("set", "trtspec_policy_verify_seconds", pytest.approx(0.018), {"batch": "1", "draft_len": "1"}) in ops
    p.choose(1, [[0.9, 0.9]])
    again = [o for o in pm.ops(p.served_view(3)) if o[0] == "increment"]
    assert [o[2] for o in again] == [1]  # only what changed since the last view
    assert pm.ops(None) == []


def test_policy_recovers_when_acceptance_comes_back():
    """Low-acceptance traffic drives the batch to k = 0, where nothing measures acceptance; the
    single-token probe every 64 plain steps sees it rise again, and drafting resumes."""
    p = _policy(lambda B, k: 0.01 + 0.001 * B * (k + 1), 0.0005)
    for _ in range(300):  # random prompts: the first draft token is almost never accepted
        p.observe(1, 4, 0.015, 0.002, [(4, 0)])
    new_request = ([], [])
    assert p.best(1, [p.row_alphas(*new_request)])[0] == 0
    chosen = []
    for step in range(400):  # code prompts again: a draft token is accepted 9 times in 10
        k = p.choose(1, [p.row_alphas(*new_request)])
        chosen.append(k)
        p.observe(1, k, 0.011 + 0.001 * k, 0.0005 * k, [(k, k if step % 10 else max(k - 1, 0))])
    assert 0 < chosen[:65].count(1) and max(chosen[:65]) == 1  # single-token probes/explorations only
    resumed = next(i for i, k in enumerate(chosen) if k >= 2)
    assert resumed <= 200, chosen
    assert sum(k >= 3 for k in chosen[-50:]) >= 40, chosen[-50:]


def test_a_long_plain_stretch_does_not_forget_the_acceptance_measured_before_it():
    """Served on the Qwen pair (Sapphire Rapids), after the validation's batched warm-up the
    deployment's acceptance (0.88 measured) had aged to the prior, 0.6, and at that acceptance
    one row drafting does not pay (the costs below are the served medians at one row): a lone
    request ran all 63 steps plain, its catch-up growing every step, and so did the next; 1,607
    plain one-row steps in the c=1 level. The long-run counts keep what was measured; after low
    acceptance they leave the prior where it was (the recovery test above)."""
    p = GoodputPolicy(2, explore_every=0, probe_every=0)
    for (k, v, d) in ((0, 0.0525, 0.0), (1, 0.066, 0.023), (2, 0.0855, 0.037)):
        for _ in range(3):
            p.cost.add_verify(1, k, v)
            p.cost.add_draft(1, k, d)
    for step in range(2000):  # hours at one row: 88 % of draft tokens accepted
        p.observe(1, 2, 0.0855, 0.037, [(2, 2 if step % 8 else 1)])
    new_request = p.row_alphas([], [])
    assert p.best(1, [new_request])[0] > 0
    for _ in range(600):  # then plain decoding at four rows (no draft verified)
        p.observe(4, 0, 0.117, 0.0, [(0, 0)] * 4)
    assert p.reached[0] < 10  # the recent counts aged away
    assert p.deployment_alphas()[0] > 0.85  # before: 0.6, the prior
    assert p.best(1, [p.row_alphas([], [])])[0] > 0  # before: 0, a lone request decoded plainly


def _probe_steps(verify, steps: int) -> list[tuple[int, str]]:
    """(k, why) per step of a one-row policy after 100 steps whose every draft token was rejected."""
    p = _policy(verify, 0.001)
    for _ in range(100):
        p.observe(1, 1, verify(1, 1), 0.001, [(1, 0)])
    whys = []
    for _ in range(steps):
        k = p.choose(1, [p.row_alphas([], [])])
        whys.append((k, p.last["why"]))
        p.observe(1, k, verify(1, k), 0.001 * k, [(k, 0)])
    return whys


def test_policy_probes_every_64_plain_steps_for_acceptance_and_every_512_where_the_costs_alone_say_no():
    # acceptance-bound: drafting would pay at a good acceptance, so a probe can change the choice
    # (costs by the pass's token rows T = B·(k+1), as the cost model pools them: at B = 1, 0.01 + 0.002·k)
    whys = _probe_steps(lambda B, k: 0.01 + 0.002 * (B * (k + 1) - 1), 130)
    assert [i for i, (k, _) in enumerate(whys) if k] == [64, 129]
    assert whys[64] == (1, "probe")
    # cost-bound: every draft token doubles the step, so not even α = 1 pays; probes only re-measure
    whys = _probe_steps(lambda B, k: 0.01 + 0.02 * (B * (k + 1) - 1), 1030)
    assert [i for i, (k, _) in enumerate(whys) if k] == [512, 1025]
    assert whys[512] == (1, "cost probe")  # the verify pass alone: no draft, no catch-up (the engine's test)


def test_probes_keep_to_their_budget_when_each_reads_a_long_catch_up():
    """At two rows a probe first reads every token both rows skipped: served on the Qwen pair it
    took 444 ms against 70 ms for a plain step, 8 % of the time at one probe per 64 steps. The
    probes now keep to ``probe_budget`` (2 %) of the step time: after a probe that cost P above a
    plain step the next waits until the steps since took P / 0.02 seconds. A cheap probe still
    comes every 64 steps (the test above)."""
    verify = lambda B, k: 0.035 * B + 0.02 * B * k  # noqa: E731 - 70 ms plain at two rows, 110 ms at k = 1
    # a probe: 110 ms verify + 10 ms drafting + 300 ms catch-up, 350 ms over a plain step
    p = _policy(verify, 0.01, batches=(2,), explore_every=0)
    p.cost.add_catch_up(100, 0.3)  # 3 ms per token read late
    for _ in range(100):  # acceptance fell: every draft token rejected
        p.observe(2, 1, verify(2, 1), 0.01, [(1, 0), (1, 0)])
    probes, extra, total = [], 0.0, 0.0
    for step in range(3000):
        k = p.choose(2, [p.row_alphas([], [])] * 2)
        late = 0.3 if k else 0.0  # the 100 tokens the two rows skipped since the draft last read
        step_s = verify(2, k) + 0.01 * k + late
        p.observe(2, k, verify(2, k), 0.01 * k, [(k, 0)] * 2, late_s=late)
        if k:
            assert p.last["why"] == "probe"
            probes.append(step)
            extra += step_s - verify(2, 0)
        total += step_s
    assert probes[0] == 64  # the first as before: nothing has been spent yet
    gaps = [b - a for a, b in zip(probes, probes[1:])]
    assert gaps and min(gaps) >= 0.35 / 0.02 / 0.07, gaps  # 0.35 s over a plain step, paid back at 2 %
    assert extra / total <= 0.02 + 0.35 / total  # within budget, the last probe's cost aside
    assert p.snapshot()["probes"] == len(probes) and p.snapshot()["last_probe_cost_s"] == pytest.approx(0.35)


def test_no_acceptance_probe_where_even_full_acceptance_would_gain_little():
    """Served on the Qwen pair at c=2, a lone row between two requests chose k = 0 because the
    draft's catch-up would not pay back over a few steps; every draft token accepted would have
    beaten plain decoding by a few per cent, so a probe ran anyway and read the skipped tokens
    (264-291 ms against ~70 for a plain step), and the next step was plain at two rows again,
    with the acceptance fresh. A probe
    now needs α = 1 to beat plain decoding by ``probe_upside`` (10 %); past ``cost_probe_every``
    plain steps a cost probe (no draft) re-measures the verify pass as before."""
    verify = {0: 0.060, 1: 0.066, 2: 0.083}
    p = _policy(lambda B, k: verify[k], 0.024, batches=(1,), max_k=2, explore_every=0)
    for k, sec in ((1, 0.024), (2, 0.0395)):
        for _ in range(3):
            p.cost.add_draft(1, k, sec)
    alphas = [[0.9, 0.89]]
    catch_up = 0.05  # 44 skipped tokens at ~5.5 ms, over a stretch of ~5 steps
    k_fresh, g = p.best(1, alphas, catch_up=catch_up)
    _, g_full = p.best(1, [[1.0, 1.0]], catch_up=catch_up)
    assert k_fresh == 0 and 1.0 < g_full[2] / g[0] < 1.1  # full acceptance would gain 4 %
    whys = []
    for _ in range(600):
        k = p.choose(1, alphas, catch_up=catch_up)
        whys.append(p.last["why"])
        p.observe(1, k, verify[k], 0.0 if k == 0 else p.cost.draft(1, k), [(k, k)])
    assert "probe" not in whys
    assert [i for i, w in enumerate(whys) if w == "cost probe"] == [512]
    # the same lone row with nothing to catch up: drafting pays, no probe is needed either
    assert p.best(1, alphas)[0] == 2


def test_no_acceptance_probe_where_the_catch_up_not_the_acceptance_holds_drafting_back():
    """A probe measures acceptance; it can change the choice only where acceptance is what rules
    drafting out. Served on the Qwen pair at c=2 after 800e8c5, six one-row probes a level were
    left (356 ms median against 55 for a plain step), each first reading the tokens its row had
    skipped, while the acceptance measured a few dozen steps before (0.9) would have drafted had
    there been nothing to catch up. Where the rows' measured acceptance would draft without the
    catch-up, no acceptance probe runs (a cost probe still re-measures the verify pass); where it
    would not, the probe comes every ``probe_every`` plain steps as before."""
    verify = {0: 0.060, 1: 0.066, 2: 0.083}
    p = _policy(lambda B, k: verify[k], 0.024, batches=(1,), max_k=2, explore_every=0)
    for k, sec in ((1, 0.024), (2, 0.0395)):
        for _ in range(3):
            p.cost.add_draft(1, k, sec)
    catch_up = 0.02  # the row's skipped tokens, spread over the steps it is expected to stay alone

    def whys(alphas):
        q = copy.deepcopy(p)
        out = []
        for _ in range(600):
            k = q.choose(1, alphas, catch_up=catch_up)
            out.append(q.last["why"])
            q.observe(1, k, verify[k], 0.0 if k == 0 else q.cost.draft(1, k), [(k, k)])
        return out

    held_back = [[0.7, 0.7]]  # drafts with nothing to catch up; k = 0 only for the catch-up
    assert p.best(1, held_back)[0] > 0 and p.best(1, held_back, catch_up=catch_up)[0] == 0
    _, g = p.best(1, held_back, catch_up=catch_up)
    _, g_full = p.best(1, [[1.0, 1.0]], catch_up=catch_up)
    assert g_full[2] >= 1.1 * g[0]  # α = 1 would gain more than probe_upside: the old rule probed
    w = whys(held_back)
    assert "probe" not in w and [i for i, x in enumerate(w) if x == "cost probe"] == [512]
    low = [[0.3, 0.3]]  # acceptance binds: k = 0 even with nothing to catch up
    assert p.best(1, low)[0] == 0
    w = whys(low)
    assert w[64] == "probe" and "cost probe" not in w


def test_drafting_that_needs_a_catch_up_must_beat_plain_decoding_by_the_switch_margin():
    """Served on the Qwen pair in an open loop, a two-row batch switched to drafting with 40-67
    tokens to catch up for an expected gain of 0.5-1.4 % (catch-up spread over the stretch); the
    catch-up steps cost 1.5 s and were never paid back. A catch-up is certain and the gain an
    estimate: drafting that needs one must beat plain decoding by ``switch_margin`` (5 %). A batch
    whose draft is caught up still drafts for any gain, and a large gain still pays a catch-up."""
    verify = {0: 0.050, 1: 0.068, 2: 0.094}  # the two-row passes measured there
    p = _policy(lambda B, k: verify[k], 0.02, batches=(2,), max_k=2, explore_every=0, probe_every=0)
    for k, sec in ((1, 0.023), (2, 0.034)):
        for _ in range(3):
            p.cost.add_draft(2, k, sec)
    rows = [[0.88, 0.88]] * 2
    k, g = p.best(2, rows, catch_up=0.003)
    assert k == 2 and 1.0 < g[2] / g[0] < 1.05  # the goodput argmax drafts, for a 1 % gain
    assert p.choose(2, rows, catch_up=0.003) == 0 and p.last["why"] == "goodput"
    assert p.choose(2, rows) == 2  # caught up: the same 4 % gain is taken
    sure = [[0.95, 0.95]] * 2
    assert p.best(2, sure, catch_up=0.003)[1][2] >= 1.05 * p.best(2, sure, catch_up=0.003)[1][0]
    assert p.choose(2, sure, catch_up=0.003) == 2  # a gain past the margin pays its catch-up
    assert GoodputPolicy(2, switch_margin=0.0).switch_margin == 0.0


def _drive(p: GoodputPolicy, batch: int, rows, true_verify: dict, draft: dict, steps: int) -> list[int]:
    """``steps`` steps at ``batch`` rows, each costing what ``true_verify`` and ``draft`` say, every draft token accepted."""
    ks = []
    for _ in range(steps):
        k = p.choose(batch, rows)
        p.observe(batch, k, true_verify[k], draft[k], [(k, k)] * batch)
        ks.append(k)
    return ks


def test_plain_decoding_is_re_measured_while_the_batch_drafts_on_a_transient_price():
    """Served on the Qwen pair at c=4 (AMD EPYC, 2026-12-08-zen4-plain-own-cell), five plain
    four-row steps at 96-118 ms (a transient: the level's 1,534 plain four-row steps had a median of
    72 ms) set the (4, 0) cell's median to 96, and the batch drafted k=1 on 203 steps expecting
    1.22x where the steps measured 0.87x. Exploration re-measures the least-measured arm, never
    k = 0, and nothing else sampled it while the batch drafted. A plain refresh re-measures it
    from fresh steps, its old window forgotten, and the batch goes back to plain decoding."""
    true_verify, draft = {0: 0.072, 1: 0.112}, {0: 0.0, 1: 0.037}
    p = GoodputPolicy(1, explore_every=0, probe_every=0)
    for _ in range(4):
        p.cost.add_verify(4, 0, 0.071)
    for _ in range(5):
        p.cost.add_verify(4, 0, 0.100)  # the transient: the cell's median is now 96-100 ms
    for _ in range(3):
        p.cost.add_verify(4, 1, true_verify[1])
        p.cost.add_draft(4, 1, draft[1])
    rows = [[0.9]] * 4
    k, g = p.best(4, rows)
    assert k == 1 and g[1] / g[0] > 1.05  # priced on the transient, drafting looks like a gain
    ks = _drive(p, 4, rows, true_verify, draft, 200)
    assert p.refreshes == 1 and p.last["why"] == "goodput"
    assert ks[-100:].count(1) == 0  # before: 200 drafting steps, each at 0.90x plain decoding
    assert ks.index(0) <= p.refresh_every  # drafted at most refresh_every steps on the stale price
    assert p.cost.verify(4, 0) == pytest.approx(true_verify[0])
    assert GoodputPolicy(1, refresh_every=0).refresh_every == 0


def test_plain_decoding_at_a_batch_size_is_priced_from_its_own_steps():
    """Served on the Qwen pair at c=2 (AMD EPYC, 2026-12-08-zen4-switch-margin), the (2, 0) cell
    never settled while the batch drafted: the pass size T = 2 was priced by the (1, 1) cell (one
    row verifying 2 tokens, last samples around 60 ms) against 49.6 ms for plain two-row steps, and
    the batch drafted k=1 expecting 1.31x where the steps gave 0.99x. A batch that drafts while its
    (B, 0) cell has fewer than ``min_samples`` samples of its own refreshes it first."""
    true_verify, draft = {0: 0.0496, 1: 0.0643, 2: 0.0844}, {0: 0.0, 1: 0.023, 2: 0.034}
    p = GoodputPolicy(2, explore_every=0, probe_every=0)
    for _ in range(9):
        p.cost.add_verify(1, 1, 0.060)  # measured in a loaded moment
        p.cost.add_verify(2, 1, true_verify[1])
        p.cost.add_verify(2, 2, true_verify[2])
    for k in (1, 2):
        for _ in range(3):
            p.cost.add_draft(2, k, draft[k])
    rows = [[0.88, 0.88]] * 2
    assert p.cost.verify(2, 0) == pytest.approx(0.060)  # T = 2 priced by (1, 1)
    k, g = p.best(2, rows)
    assert k == 2 and g[k] / g[0] > 1.3  # drafting looks like a large gain
    ks = _drive(p, 2, rows, true_verify, draft, 40)
    assert ks[:3] == [0, 0, 0] and p.refreshes == 1  # the first goodput choice re-measures k = 0
    assert p.cost.verify(2, 0) == pytest.approx(true_verify[0])
    k, g = p.best(2, rows)
    assert g[k] / g[0] < 1.2  # what drafting at two rows gains by these costs: 1.15x, not 1.37x


def test_a_steady_drafting_row_re_measures_plain_decoding_seldom():
    """One row drafting at a large priced gain (1.85x) refreshes plain decoding every
    4 x refresh_every steps, 4 plain steps each: 1.5 % of its steps."""
    true_verify, draft = {0: 0.039, 1: 0.041, 2: 0.045}, {0: 0.0, 1: 0.008, 2: 0.012}
    p = GoodputPolicy(2, explore_every=0, probe_every=0)
    for k in (0, 1, 2):
        for _ in range(3):
            p.cost.add_verify(1, k, true_verify[k])
            p.cost.add_draft(1, k, draft[k])
    rows = [[0.9, 0.9]]
    assert p.best(1, rows)[1][2] / p.best(1, rows)[1][0] > 1.0 + p.refresh_close
    ks = _drive(p, 1, rows, true_verify, draft, 1024)
    assert p.refreshes == 3 and ks.count(0) == 3 * (p.min_samples + 1)  # at steps 256, 516 and 776


def test_a_draft_length_is_priced_by_its_own_drafting_time_not_k_times_the_first_tokens():
    """Served on the Qwen pair at one row: a step drafting 1 token spent 24 ms drafting, one
    drafting 2 spent 39.5 ms (the first draft call reads the tokens accepted last step). Priced at
    k times a per-token median taken mostly from k = 1 steps, k = 2 looked slower than k = 1
    (20.8 against 21.2 tokens/s) while it was faster (22.8 against 21.8 by the steps' medians)."""
    verify = {0: 0.060, 1: 0.066, 2: 0.083}
    p = _policy(lambda B, k: verify[k], 0.024, batches=(1,), max_k=2, explore_every=0, probe_every=0)
    for _ in range(9):
        p.cost.add_draft(1, 1, 0.024)
    for _ in range(3):
        p.cost.add_draft(1, 2, 0.0395)
    assert p.cost.draft(1, 1) == pytest.approx(0.024) and p.cost.draft(1, 2) == pytest.approx(0.0395)
    alphas = [[0.91, 0.89]]
    k, g = p.best(1, alphas)
    assert k == 2 and g[2] == pytest.approx(2.72 / 0.1225, rel=0.01), g
    # a length not measured at this batch size: the line through the lengths that were
    p3 = _policy(lambda B, k: 0.06 + 0.01 * k, 0.02, batches=(1,), max_k=3)
    for k3, sec in ((1, 0.024), (2, 0.0395)):
        for _ in range(3):
            p3.cost.add_draft(1, k3, sec)
    assert p3.cost.draft(1, 3) == pytest.approx(0.055)


def test_catch_up_is_priced_spread_over_the_steps_left():
    """Drafting after plain steps first reads what the draft skipped: a batch near its end does
    not switch back for a long catch-up; a new request's prompt over its whole output does."""
    p = _policy(lambda B, k: 0.010 + 0.002 * k, 0.001, batches=(1,))
    alphas = [[0.9] * 4]
    assert p.catch_up_share(500, 10) == 0.0  # nothing measured yet: no price
    p.cost.add_catch_up(100, 0.05)  # 0.5 ms per token read late
    assert p.catch_up_share(500, 10) == pytest.approx(0.025)
    assert p.best(1, alphas)[0] > 0
    assert p.best(1, alphas, catch_up=p.catch_up_share(30, 32))[0] > 0  # a 30-token prompt, 64 tokens to go
    assert p.best(1, alphas, catch_up=p.catch_up_share(500, 3))[0] == 0  # 500 tokens behind, 6 tokens to go
