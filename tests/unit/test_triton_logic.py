"""The python-backend models' logic, in-process: streaming detokenization, the router's policy,
request parsing and the preprocessing limits. (The same code runs in tritonserver's stubs.)"""

from __future__ import annotations


import numpy as np
import pytest

from trtspec.triton.backend.detok import DetokWindow
from trtspec.triton.backend.requests import RequestInputError, engine_inputs, parse_generation
from trtspec.triton.backend.routing import RoutingPolicy, acceptance_rate_at

# ------------------------------------------------------------------------------ detokenization


TEXT = 'def f(x):\n    """Grüße, 你好 — naïve café ✓"""\n    return x  # 😀 done\n'


def test_detok_window_echoes_the_prompt_when_asked():
    w = DetokWindow(prefix=[5, 6, 7], context=2)
    assert w.next([8]) == ([5, 6, 7, 8], 0)
    assert w.next([9, 10]) == ([7, 8, 9, 10], 2)


# ------------------------------------------------------------------------------ routing policy


def test_fraction_split_is_exact():
    p = RoutingPolicy(0.25)
    d = [p.route() for _ in range(100)]
    assert sum(x.speculative for x in d) == 25
    assert [x.speculative for x in d[:8]] == [False, False, False, True] * 2
    assert all(RoutingPolicy(1.0).route().speculative for _ in range(10))
    assert not any(RoutingPolicy(0.0).route().speculative for _ in range(10))
    assert RoutingPolicy(1.0, has_speculative=False).route().reason == "no-speculative-model"


def test_fallback_engages_probes_and_recovers():
    p = RoutingPolicy(1.0, min_acceptance_rate=0.5, window=40, probe_every=4)
    p.record_speculative(drafted=20, accepted=15)  # 0.75: fine
    assert not p.fallback_active
    p.record_speculative(drafted=40, accepted=4)  # the window now holds only this: 0.1
    assert p.fallback_active and p.rolling_acceptance == pytest.approx(0.1)
    reasons = [p.route().reason for _ in range(8)]
    assert reasons == ["fallback"] * 3 + ["probe"] + ["fallback"] * 3 + ["probe"]
    p.record_speculative(drafted=40, accepted=36)  # a probe that went well pushes the bad data out
    assert not p.fallback_active
    assert p.route().reason == "speculative"


def test_fallback_waits_for_enough_draft_tokens():
    p = RoutingPolicy(1.0, min_acceptance_rate=0.5, window=64)
    p.record_speculative(drafted=8, accepted=0)
    assert not p.fallback_active  # 8 < window/4 draft tokens: too little evidence
    p.record_speculative(drafted=8, accepted=0)
    assert p.fallback_active


def test_break_even_from_measured_costs():
    from trtspec.acceptance import break_even_acceptance

    p = RoutingPolicy(1.0, window=16)
    assert p.break_even is None
    # drafting costs 0.2 target steps per token; verifying 4+1 tokens costs 1.2 steps
    p.record_baseline({"target_passes": 10, "verify_s": 0.10})  # 10 ms per target step
    p.record_speculative(40, 30, {"target_passes": 10, "draft_s": 0.08, "verify_s": 0.12})
    alpha = break_even_acceptance(0.2, 4, 1.2)
    assert p.break_even == pytest.approx(acceptance_rate_at(alpha, 4))
    assert not p.fallback_active  # 0.75 accepted beats break-even at these costs
    # an expensive draft: speculation cannot pay at this acceptance
    q = RoutingPolicy(1.0, window=16)
    q.record_baseline({"target_passes": 10, "verify_s": 0.10})
    q.record_speculative(40, 12, {"target_passes": 10, "draft_s": 0.32, "verify_s": 0.12})
    assert q.fallback_active and q.break_even > 0.3


def test_break_even_counts_the_fixed_cost_per_pass():
    """A fast target (INT8 kernels) next to a fixed cost per pass (sampling, bookkeeping, sending
    the step's tokens): speculation pays that cost once per pass, plain decoding once per token.
    The break-even falls, and a window that would fall back on draft+verify alone keeps
    speculating."""
    from trtspec.acceptance import break_even_acceptance

    def perf(passes, draft_s, verify_s, other_s):
        return {"target_passes": passes, "draft_s": draft_s, "verify_s": verify_s, "queue_s": 0.001,
                "prefill_s": 0.004, "total_s": 0.005 + draft_s + verify_s + other_s}

    lean, loaded = RoutingPolicy(1.0, window=16), RoutingPolicy(1.0, window=16)
    for p, other in ((lean, 0.0), (loaded, 1.0)):
        p.record_baseline(perf(100, 0.0, 0.2, 0.1 * other))  # 2 ms target step (+1 ms per step)
        p.record_speculative(40, 20, perf(10, 0.03, 0.04, 0.01 * other))  # c = 0.375, v = 2 (+1 ms per pass)
    assert lean.break_even == pytest.approx(acceptance_rate_at(break_even_acceptance(0.375, 4, 2.0), 4))
    # with 1 ms per pass on both sides: c = 0.75 / 3, v = (4 + 1) / 3
    assert loaded.break_even == pytest.approx(acceptance_rate_at(break_even_acceptance(0.25, 4, 5 / 3), 4))
    assert loaded.break_even < lean.break_even
    assert lean.fallback_active and not loaded.fallback_active  # 20/40 = 0.5 accepted


def test_break_even_compares_costs_at_the_same_batch_size():
    """A verify pass over 4 rows is compared with a target step over 4 rows: baseline requests
    measured alone do not make batched speculation look hopeless."""
    def perf(passes, draft_s, verify_s, batch):
        return {"target_passes": passes, "draft_s": draft_s, "verify_s": verify_s, "mean_batch": batch}

    p = RoutingPolicy(1.0, window=16)
    p.record_baseline(perf(100, 0.0, 0.2, 1.0))  # alone: 2 ms a step
    p.record_baseline(perf(100, 0.0, 0.6, 3.8))  # 4 rows: 6 ms a step
    p.record_speculative(40, 20, perf(10, 0.08, 0.1, 1.0))  # alone: c = 1, v = 5
    alone = p.break_even
    p.record_speculative(40, 20, perf(10, 0.08, 0.1, 4.2))  # 4 rows: c = 1/3, v = 5/3
    batched = p.break_even
    from trtspec.acceptance import break_even_acceptance

    # (k+1) / (k·1 + 5) < 1: no acceptance pays alone, a degenerate estimate, not a verdict
    assert alone is None and p.snapshot()["break_even_by_batch"][1] == 1.0
    assert batched == pytest.approx(acceptance_rate_at(break_even_acceptance(1 / 3, 4, 5 / 3), 4))
    assert batched < 0.6 and not p.fallback_active


def test_mean_batch_reaches_perf_json_per_request_and_summed():
    """The router's batch bucket comes from ``mean_batch``: rows per pass, per request and summed."""
    from trtspec.speculative.stats import Aggregate, RequestStats

    one, four = RequestStats(), RequestStats()
    for _ in range(3):
        one.record_step(drafted=4, accepted=2, draft_s=0.001, verify_s=0.002, batch=1)
    four.record_step(drafted=4, accepted=4, draft_s=0.001, verify_s=0.002, batch=4)
    assert one.to_dict()["mean_batch"] == 1.0 and four.to_dict()["mean_batch"] == 4.0
    agg = Aggregate()
    agg.add(one)
    agg.add(four)
    assert agg.to_dict()["mean_batch"] == pytest.approx(7 / 4, abs=1e-3)


def test_acceptance_rate_at():
    assert acceptance_rate_at(1.0, 4) == 1.0
    assert acceptance_rate_at(0.5, 2) == pytest.approx((0.5 + 0.25) / 2)
    assert acceptance_rate_at(0.9, 0) == 0.0


# ------------------------------------------------------------------------------ request parsing


def _get(**tensors):
    return lambda name: tensors.get(name)


def one(v, dtype):
    return np.array([[v]], dtype=dtype)


def test_parse_generation_reads_the_tensorrtllm_inputs():
    req = parse_generation(_get(
        input_ids=np.array([[5, 6, 7, 0]], np.int32), input_lengths=one(3, np.int32),
        request_output_len=one(9, np.int32), streaming=one(True, bool), temperature=one(0.7, np.float32),
        runtime_top_k=one(5, np.int32), runtime_top_p=one(0.9, np.float32), seed=one(3, np.uint64),
        end_id=one(2, np.int32), pad_id=one(-1, np.int32), draft_input_ids=np.array([[8, 9]], np.int32),
    ))
    s = req.sampling
    assert req.input_ids == [5, 6, 7] and s.max_tokens == 9 and req.streaming
    assert (s.temperature, s.top_k, s.top_p, s.seed) == (pytest.approx(0.7), 5, pytest.approx(0.9), 3)
    assert s.end_id == 2 and s.pad_id is None and req.draft_input_ids == [8, 9]
    t = engine_inputs(req, with_drafts=False)
    assert t["input_ids"].tolist() == [[5, 6, 7]] and "draft_input_ids" not in t
    assert t["return_perf_metrics"].tolist() == [[True]]


@pytest.mark.parametrize("tensors, message", [
    ({}, "input 'input_ids' is missing"),
    ({"input_ids": np.array([[1, 2]], np.int32)}, "request_output_len' is missing"),
    ({"input_ids": np.zeros((2, 3), np.int32), "request_output_len": one(4, np.int32)}, "batch size 2"),
    ({"input_ids": np.array([[1]], np.int32), "input_lengths": one(0, np.int32),
      "request_output_len": one(4, np.int32)}, "prompt is empty"),
    ({"input_ids": np.array([[1]], np.int32), "request_output_len": one(0, np.int32)}, "must be >= 1"),
    ({"input_ids": np.array([[1]], np.int32), "request_output_len": one(4, np.int32),
      "temperature": one(np.nan, np.float32)}, "temperature must be a finite number"),
    ({"input_ids": np.array([[1]], np.int32), "request_output_len": one(4, np.int32),
      "runtime_top_p": one(1.5, np.float32)}, "top_p must be in"),
])
def test_parse_generation_rejects_bad_requests(tensors, message):
    with pytest.raises(RequestInputError, match=message):
        parse_generation(_get(**tensors))


def test_every_model_checks_sampling_as_the_engine_does():
    # the router parses with the same torch-free Sampling as the engine: a bad value is refused
    # where the request arrives, worded as the engine words it
    with pytest.raises(RequestInputError, match="invalid sampling parameters: repetition_penalty must be > 0"):
        parse_generation(_get(input_ids=np.array([[1]], np.int32), request_output_len=one(4, np.int32),
                              temperature=one(0.5, np.float32), runtime_top_k=one(5, np.int32),
                              repetition_penalty=one(0.0, np.float32)))


# ------------------------------------------------------------------------------ preprocessing limits


