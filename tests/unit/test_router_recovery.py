"""The router's fallback recovers (issue 31 item 8): replays of what the engine reports per
request (``RequestStats.to_dict()``, the ``perf_json`` the router reads) through RoutingPolicy.

Costs are the Qwen2.5-Coder pair's on the 2-core box (bench/results/qwen-coder-cpu-run: target
step 34 ms, draft/target cost c = 0.36, max_draft_len 2), so the break-even sits where it did
when the router locked speculation out."""

from __future__ import annotations

import math

import pytest

from trtspec.acceptance import break_even_acceptance
from trtspec.speculative.stats import RequestStats
from trtspec.triton.backend.routing import COST_WINDOW, RoutingPolicy, acceptance_rate_at

T = 0.034  # target step (s), one row
T2 = 0.045  # target step, two rows
D = 0.012  # draft step per token
V = 0.044  # verify pass over 1 + 2 tokens
O = 0.002  # fixed cost per pass (sampling, bookkeeping)
K = 2
WINDOW, PROBE_EVERY = 64, 8  # the router's defaults (render: acceptance_window, probe_every)


def request(passes: list[tuple[int, int, float, float]], batch: float = 1) -> tuple[int, int, dict]:
    """(drafted, accepted, perf) of one request from its passes: (drafted, accepted, draft_s,
    verify_s) each, booked as engine.step books them."""
    s = RequestStats(prompt_tokens=48)
    for drafted, accepted, draft_s, verify_s in passes:
        s.record_step(drafted=drafted, accepted=accepted, draft_s=draft_s, verify_s=verify_s, batch=round(batch))
    s.batch_rows = round(batch * s.steps)  # mean_batch between whole numbers: rows changed mid-request
    s.queue_s, s.prefill_s = 0.001, 0.2
    s.total_s = s.queue_s + s.prefill_s + s.draft_s + s.verify_s + O * s.steps
    return s.drafted, s.accepted, s.to_dict()


def code(n_passes: int = 22) -> tuple[int, int, dict]:
    """A code prompt: 2 drafted every pass, 15 of 16 accepted (0.94), ~64 tokens."""
    return request([(K, K if i % 8 else 1, K * D, V) for i in range(n_passes)])


def low(n_passes: int = 40) -> tuple[int, int, dict]:
    """A prompt the draft cannot follow, drafted every pass: 1 in 8 accepted."""
    return request([(K, 0 if i % 4 else 1, K * D, V) for i in range(n_passes)])


def random_tokens() -> tuple[int, int, dict]:
    """A random-token prompt as the engine serves it: it drafts twice, nothing is accepted, it
    decodes plainly (its draft-length choice, k = 0), and when it drafts again the draft first
    reads the 40 tokens it missed, in one pass booked as draft time (0.15 s)."""
    passes = [(K, 0, K * D, V)] * 2 + [(0, 0, 0.0, T)] * 40 + [(K, 0, K * D + 0.15, V)] + [(0, 0, 0.0, T)] * 20
    return request(passes)


def baseline(batch: int = 1) -> dict:
    s = RequestStats(prompt_tokens=48)
    step = T if batch == 1 else T2
    for _ in range(64):
        s.record_step(drafted=0, accepted=0, draft_s=0.0, verify_s=step, batch=batch)
    s.queue_s, s.prefill_s = 0.001, 0.2
    s.total_s = s.queue_s + s.prefill_s + s.verify_s + O * 64
    return s.to_dict()


def code_break_even(target_step: float = T) -> float:
    """r* the code requests' costs imply (k = 2, fixed cost per pass on both sides); before any
    baseline request the verify pass stands in for the target step."""
    c, v = D / (target_step + O), (V + O) / (target_step + O)
    return acceptance_rate_at(break_even_acceptance(c, K, v), K)


def serve(p: RoutingPolicy, n: int, make) -> list[str]:
    """Route ``n`` requests one after another; the speculative ones are served by ``make``."""
    reasons = []
    for _ in range(n):
        d = p.route()
        reasons.append(d.reason)
        if d.speculative:
            p.record_speculative(*make())
        else:
            p.record_baseline(baseline())
    return reasons


def policy() -> RoutingPolicy:
    return RoutingPolicy(1.0, window=WINDOW, probe_every=PROBE_EVERY, max_draft_len=K)


def test_random_token_prompts_no_longer_lock_speculation_out():
    """Issue 31: after random-token prompts the derived break-even was 1.0 and every request went
    to the baseline while the probes' acceptance was back at 0.93 on code prompts."""
    drafted, accepted, perf = random_tokens()
    # what the old estimate made of one such request: draft time per draft token (the catch-up
    # over 6 tokens), verify time per pass (mostly plain passes), k = round(drafted / passes) → 1
    c = perf["draft_s"] / drafted / T
    v = perf["verify_s"] / perf["target_passes"] / T
    k = max(1, round(drafted / perf["target_passes"]))
    assert (k, round(c, 2), round(v, 2)) == (1, 1.09, 1.01)  # c + v > k + 1
    assert break_even_acceptance(c, k, v) == 1.0  # "speculation never pays": no acceptance < 1 passes

    p = policy()
    serve(p, 12, code)  # every request speculative: no target step measured yet
    assert not p.fallback_active and p.break_even == pytest.approx(code_break_even(target_step=V))
    reasons = serve(p, 24, random_tokens)
    # acceptance collapsed (0 of 6 per request): a fallback, with probes ...
    assert p.fallback_active and p.rolling_acceptance == 0 and reasons.count("probe") >= 1
    # ... judged by the costs of requests that drafted every pass: the random-token requests
    # (6 draft tokens over 63 passes) are left out of them, so the break-even has not moved
    assert p.break_even == pytest.approx(code_break_even()) and p.break_even < 0.9
    reasons = serve(p, 3 * PROBE_EVERY, code)
    resumed = reasons.index("speculative")
    assert resumed <= PROBE_EVERY + 1, reasons  # one probe (44 draft tokens) outweighs the window's 0 of 42
    assert set(reasons[resumed:]) == {"speculative"} and p.rolling_acceptance > 0.93
    assert p.snapshot()["fallback_changes"] == {"enter": 1, "exit": 1}


@pytest.mark.parametrize("low_traffic", [low, random_tokens])
def test_speculation_resumes_within_the_bound_after_low_acceptance(low_traffic):
    """Low-acceptance traffic, then high: speculation resumes within probe_every · ⌈window / D⌉
    + 1 requests, D = draft tokens per probe (44 here: 2 probes, 17 requests). A probe is at most
    probe_every requests away; each pushes D draft tokens into the window, whose oldest events
    leave once the newer ones hold ``window`` tokens, so after ⌈window / D⌉ probes it holds only
    high-acceptance requests."""
    p = policy()
    serve(p, 4, code)
    serve(p, 40, low_traffic)
    assert p.fallback_active
    probe_drafted = code()[0]
    bound = PROBE_EVERY * math.ceil(WINDOW / probe_drafted) + 1
    assert (probe_drafted, bound) == (44, 17)
    reasons = serve(p, bound, code)
    assert reasons[-1] == "speculative", reasons
    assert reasons.count("probe") <= math.ceil(WINDOW / probe_drafted)


def test_probes_refresh_costs_and_old_samples_age_out():
    """In fallback the probes' costs replace the old ones (a ratio of sums over the last
    COST_WINDOW requests per batch size, not an average that remembers every request)."""
    p = policy()
    p.record_baseline(baseline())
    dear = request([(K, 0, K * 0.016, V)] * 40)  # draft 16 ms a token, nothing accepted
    for _ in range(COST_WINDOW):
        p.record_speculative(*dear)
    assert p.fallback_active
    before = p.break_even
    cheap = 0
    while p.fallback_active:
        if p.route().speculative:  # a probe: its acceptance and costs both count
            p.record_speculative(*code())
            cheap += 1
    assert 1 <= cheap <= 2 and p.break_even < before
    for _ in range(COST_WINDOW):
        p.record_speculative(*code())
    assert p.break_even == pytest.approx(code_break_even())  # the dear samples are gone


def test_degenerate_costs_never_hold_speculation_back():
    """Costs by which no acceptance below 1 pays (k·c + v ≥ k + 1) say the costs are
    degenerate, not that speculation loses: the break-even is unknown and the router speculates."""
    p = policy()
    for _ in range(4):
        p.record_speculative(*request([(K, 1, K * 0.05, V)] * 30))  # a draft token dearer than a target step
    snap = p.snapshot()
    assert snap["break_even_by_batch"] == {1: 1.0}
    assert snap["break_even_acceptance_rate"] is None and not snap["fallback_active"]
    assert all(p.route().speculative for _ in range(20))
    # a fallback entered on real costs ends when they turn degenerate
    q = policy()
    for _ in range(COST_WINDOW):
        q.record_speculative(*low())
    assert q.fallback_active
    for _ in range(COST_WINDOW):
        q.record_speculative(*request([(K, 0, K * 0.05, V)] * 30))
    assert q.break_even is None and not q.fallback_active


def test_requests_that_drafted_nothing_are_no_evidence():
    p = policy()
    serve(p, 4, code)
    before = p.snapshot()
    for _ in range(50):
        p.record_speculative(0, 0, baseline())  # plain decoding chosen by the engine
    after = p.snapshot()
    for key in ("rolling_acceptance_rate", "window_draft_tokens", "break_even_acceptance_rate"):
        assert after[key] == before[key], key


def test_costs_come_from_requests_that_drafted_every_pass():
    p = policy()
    p.record_speculative(*request([(K, K, K * D, V)] * 5 + [(0, 0, 0.0, T)] * 20))  # 10 draft tokens, 25 passes
    assert p.snapshot()["break_even_by_batch"] == {}
    no_draft_time = {k: v for k, v in code()[2].items() if k != "draft_s"}  # an engine that does not time drafting
    p.record_speculative(44, 41, no_draft_time)
    assert p.snapshot()["break_even_by_batch"] == {}
    one_a_pass = request([(1, 1, D, V)] * 20 + [(0, 0, 0.0, T)])  # k = 1, the last pass with one token left
    p.record_speculative(*one_a_pass)
    assert list(p.snapshot()["break_even_by_batch"]) == [1]


def test_max_concurrency_does_not_make_the_router_fall_back():
    """Issue 31: behind the router ``speculation.max_concurrency: 1`` sent 12-13 of 16 requests to
    the baseline. At concurrency 2 the engine reports requests that drafted nothing (both rows
    decoded plainly throughout) and requests that drafted only in the passes they ran alone,
    after the draft caught up on the tokens it missed (booked as draft time: the old estimate
    made that 45 ms a draft token, break-even 1.0, and fell back on 28 of 32). They are the
    engine's batch-size decision: the router keeps routing to speculative."""
    both_plain = request([(0, 0, 0.0, T2)] * 63, batch=2)
    # alone, then paired, three times: each time it runs alone again the draft first reads the
    # ~10 tokens it missed (0.2 s on the busy 2-core box) before drafting
    resumes = ([(0, 0, 0.0, T2)] * 8 + [(K, K, K * D + 0.2, V), (K, K, K * D, V), (K, 1, K * D, V)]) * 3
    alone_at_times = request(resumes, batch=1.7)
    assert alone_at_times[:2] == (18, 15) and alone_at_times[2]["target_passes"] == 33

    for warm in (0, 4):  # with and without code requests served alone before the load rises
        p = policy()
        serve(p, warm, code)
        reasons = []
        for i in range(32):
            reasons.append(p.route().reason)
            p.record_speculative(*(both_plain if i % 2 else alone_at_times))
            p.record_baseline(baseline(2))  # the baseline model's own traffic at 2 rows
        assert set(reasons) == {"speculative"}, (warm, reasons)
        assert p.snapshot()["fallback_changes"] == {}


# ------------------------------------------------------------------------------ the router's /metrics


class _Metric:
    def __init__(self, labels):
        self.labels, self.value = labels, 0.0

    def set(self, v):
        self.value = v

    def increment(self, v):
        self.value += v


class _Family:
    COUNTER, GAUGE, HISTOGRAM = "counter", "gauge", "histogram"

    def __init__(self, name, description, kind):
        self.name = name

    def Metric(self, labels):  # noqa: N802 - Triton's spelling
        return _Metric(labels)


class _Pb:
    MetricFamily = _Family


def _router(policy: RoutingPolicy):
    """The router model's metric publishing, without a server (initialize needs Triton's stub)."""
    from trtspec.triton.backend.common import Metrics
    from trtspec.triton.backend.router import Router, metric_specs

    r = object.__new__(Router)
    r.policy = policy
    r.metrics = Metrics(_Pb, "router", "1")
    r.metrics.declare(metric_specs(True))
    return r


def _finish(r, path: str, drafted: int, accepted: int, perf: dict) -> None:
    import json

    from trtspec.triton.backend.router import _Item

    item = object.__new__(_Item)
    item.drafted, item.accepted, item.perf_json = drafted, accepted, json.dumps(perf)
    r._finished(path, item)


def _gauges(r) -> dict:
    return {name + "".join(f"{{{v}}}" for _, v in labels): m.value for (name, labels), m in r.metrics.metrics.items()}


def test_router_metrics_say_what_the_policy_knows():
    """The gauges follow the policy: the break-even is NaN with ``..._unknown`` 1 while costs are
    unknown or degenerate (never a stale 1.0), and each fallback entered / left is counted."""
    r = _router(policy())
    r._publish()
    g = _gauges(r)
    assert math.isnan(g["trtspec_router_break_even_acceptance_rate"]) and g["trtspec_router_break_even_unknown"] == 1
    assert math.isnan(g["trtspec_router_rolling_acceptance_rate"]) and g["trtspec_router_fallback_active"] == 0
    for _ in range(4):
        _finish(r, "speculative", *code())
    _finish(r, "baseline", 0, 0, baseline())
    g = _gauges(r)
    assert g["trtspec_router_break_even_acceptance_rate"] == pytest.approx(code_break_even())
    assert g["trtspec_router_break_even_unknown"] == 0
    for _ in range(4):
        _finish(r, "speculative", *low())
    assert _gauges(r)["trtspec_router_fallback_active"] == 1
    for _ in range(2):
        _finish(r, "speculative", *code())
    g = _gauges(r)
    assert g["trtspec_router_fallback_active"] == 0 and g["trtspec_router_rolling_acceptance_rate"] > 0.9
    assert (g["trtspec_router_fallback_changes_total{enter}"], g["trtspec_router_fallback_changes_total{exit}"]) == (1, 1)
    for _ in range(COST_WINDOW):  # costs turn degenerate: a draft token dearer than two target steps
        _finish(r, "speculative", *request([(K, 1, K * 0.08, V)] * 30))
    g = _gauges(r)
    assert math.isnan(g["trtspec_router_break_even_acceptance_rate"]) and g["trtspec_router_break_even_unknown"] == 1
