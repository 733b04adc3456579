"""The verdict's statistics and tail gates (no server): the t-interval over paired blocks, the
repeat-until-sure stop rule of the load generator (a fake client on a virtual clock), the gates
at every level and the report that names the deciding gate."""

from __future__ import annotations

import asyncio
import json
import math
import pathlib
import random
from types import SimpleNamespace

import pytest

from trtspec.client.intervals import SPEEDUP, block_ratios, ratio_interval, t975
from trtspec.client.loadgen import BenchSettings, PromptItem, bench_async
from trtspec.client.types import Chunk, GenerationResult
from trtspec.config import Gates, Validation
from trtspec.errors import ConfigError
from trtspec.validate.gates import DEPLOY, KEEP, evaluate, level_comparisons

SPEC, BASE = "ensemble", "ensemble_baseline"


class FakeClient:
    """Serves each request at once on a virtual clock: ``latency(model, n)`` seconds for the n-th
    request (n counted over both models), 16 tokens, one per chunk, the first at 20 % of it."""

    url = "fake:1"
    tokenizer = None

    def __init__(self, latency):
        self.latency, self.t, self.n = latency, 0.0, 0

    async def model_info(self, model):
        return SimpleNamespace(inputs={})

    async def generate(self, text, sampling, *, model, stream=True, timeout_s=None):
        lat = self.latency(model, self.n)
        self.n += 1
        sent, self.t = self.t, self.t + lat
        n = sampling.max_tokens
        chunks = [Chunk(0.2 * lat, "x", 1)] + [Chunk(0.2 * lat + 0.8 * lat * (j + 1) / (n - 1), "x", 1)
                                               for j in range(n - 1)]
        return GenerationResult(model=model, request_id=str(self.n), text="x" * n, token_ids=None, chunks=chunks,
                                sent_at=sent, end_s=lat)


def run(latency, *, concurrency=(1,), requests=8, max_requests=48, width=0.10, block=4, latency_limit=None):
    settings = BenchSettings(concurrency=concurrency, requests=requests, warmup=0, output_lens=(16,), block=block,
                             interval_width=width, max_requests=max_requests, latency_limit=latency_limit)
    prompts = [PromptItem(i, f"p{i}", 4, "chars") for i in range(4)]
    return asyncio.run(bench_async(FakeClient(latency), prompts, settings))


def lognormal(sigma_spec, spec=0.5, base=0.65, seed=0, tail=None):
    """Latency: speculative ``spec`` s, baseline ``base`` s, times exp(N(0, sigma)); ``tail``: every
    8th speculative request takes this long instead (a tail regression)."""
    rng = random.Random(seed)
    count = {SPEC: 0, BASE: 0}

    def latency(model, n):
        count[model] += 1
        if model == SPEC and tail is not None and count[model] % 8 == 0:
            return tail
        return (spec if model == SPEC else base) * math.exp(rng.gauss(0, sigma_spec))
    return latency


def test_t_interval_on_log_ratios():
    iv = ratio_interval([1.2, 1.2, 1.2])
    assert iv.estimate == pytest.approx(1.2) and iv.low == pytest.approx(1.2) and iv.width == pytest.approx(0)
    d = 0.1
    iv = ratio_interval([math.exp(d), math.exp(-d)])  # mean 0, sd d·√2, t(1) = 12.706
    assert iv.estimate == pytest.approx(1.0)
    assert iv.low == pytest.approx(math.exp(-12.706 * d * math.sqrt(2) / math.sqrt(2)))
    c = ratio_interval([1.1, 1.3, 1.2], center=1.25)  # centred on the pooled figure, spread from the blocks
    assert c.estimate == pytest.approx(1.25) and c.high / c.estimate == pytest.approx(
        ratio_interval([1.1, 1.3, 1.2]).high / ratio_interval([1.1, 1.3, 1.2]).estimate)
    one = ratio_interval([1.3])
    assert one.blocks == 1 and one.low == 0 and math.isinf(one.high) and math.isinf(one.width)
    assert ratio_interval([]).estimate is None
    assert t975(4) == pytest.approx(2.776) and t975(40) == pytest.approx(2.021, abs=0.002)


def test_a_steady_level_stops_once_the_interval_is_narrow():
    bench = run(lognormal(0.01))
    lv = bench.levels[0]
    assert lv.stop["reason"] == "interval" and lv.stop["blocks"] % 2 == 0
    assert lv.stop["requests"] < 48 and "within the 10% asked" in lv.stop["text"]
    iv = lv.intervals()[SPEEDUP]
    assert iv.width <= 0.10 and iv.low == pytest.approx(1.3, rel=0.05)
    assert len(block_ratios(lv.windows, SPEEDUP)) == lv.stop["blocks"]
    d = bench.to_dict(with_records=False)["levels"][0]
    assert d["stop"]["reason"] == "interval" and d["intervals"][SPEEDUP]["blocks"] == lv.stop["blocks"]


def test_a_noisy_level_runs_to_its_budget_and_says_the_interval_is_wider():
    bench = run(lognormal(0.6), max_requests=24)
    lv = bench.levels[0]
    assert lv.stop["reason"] == "budget" and lv.stop["requests"] == 24 and lv.stop["blocks"] == 6
    assert "WIDER than the 10% asked" in lv.stop["text"] and lv.stop["width"] > 0.10
    assert len(lv.records("speculative")) == len(lv.records("baseline")) == 24


def test_a_level_runs_on_while_a_tail_gate_is_undecided():
    """Speculation at parity: the speedup's interval is narrow after the minimum. With the tail
    gates' limit inside the P95 ratio's interval at that point, the level runs more blocks (the
    same seeded traffic up to there); against 1.10, far above every interval, it stops where it
    would without tail gates."""
    traffic = lambda: lognormal(0.01, spec=0.5, base=0.5)  # noqa: E731
    plain = run(traffic()).levels[0]
    assert plain.stop["reason"] == "interval"
    p95 = plain.intervals()["request_latency_p95"]
    assert p95.low < p95.estimate < p95.high
    held = run(traffic(), latency_limit=p95.estimate).levels[0]
    assert held.stop["blocks"] > plain.stop["blocks"]
    if held.stop["reason"] == "budget":
        assert held.stop["undecided"] and "still straddle" in held.stop["text"]
    decided = run(traffic(), latency_limit=1.10).levels[0]
    assert decided.stop["reason"] == "interval" and decided.stop["blocks"] == plain.stop["blocks"]
    assert "every tail-latency ratio is decided against 1.10" in decided.stop["text"]
    with pytest.raises(ConfigError, match="latency_limit"):
        BenchSettings(requests=16, latency_limit=1.1)
    with pytest.raises(ConfigError, match="latency_limit"):
        BenchSettings(requests=16, interval_width=0.1, max_requests=32, latency_limit=float("nan"))


def test_undecided_latency_names_the_intervals_that_hold_the_limit():
    from trtspec.client.intervals import Interval
    from trtspec.client.loadgen import undecided_latency

    ivs = {SPEEDUP: Interval(1.0, 0.5, 2.0, 2), "request_latency_p95": Interval(1.1, 0.87, 1.39, 2),
           "ttft_p95": Interval(0.9, 0.8, 1.0, 2), "itl_p95": Interval(1.3, 1.2, 1.4, 2),
           "request_latency_p99": Interval(None, None, None, 0)}
    assert undecided_latency(ivs, 1.10) == ["request_latency_p95"]  # ttft passed, itl failed: both decided
    assert undecided_latency(ivs, None) == []


def test_the_minimum_runs_before_the_interval_is_judged():
    lv = run(lognormal(0.0), requests=16).levels[0]  # identical blocks: width 0 after 2 blocks
    assert lv.stop["reason"] == "interval" and lv.stop["requests"] == 16 and lv.stop["blocks"] == 4


def test_bench_settings_refuse_a_budget_below_the_minimum():
    with pytest.raises(ConfigError, match="max_requests"):
        BenchSettings(requests=16, interval_width=0.1, max_requests=8)
    with pytest.raises(ConfigError, match="interval_width"):
        BenchSettings(requests=16, interval_width=0.1, max_requests=32, baseline_model=None)
    with pytest.raises(ConfigError, match="max_requests"):
        BenchSettings(requests=16, max_requests=32)


def test_validation_config_budget():
    assert Validation(requests_per_level=8).request_budget == 32
    assert Validation(requests_per_level=8, max_requests_per_level=12).request_budget == 12
    from trtspec.config import parse_recipe
    from trtspec.errors import ConfigErrors

    with pytest.raises(ConfigErrors, match="validation.max_requests_per_level"):
        parse_recipe({"name": "x", "target": {"model": "m"}, "speculation": {"method": "ngram"},
                      "validation": {"requests_per_level": 16, "max_requests_per_level": 8}})


GATES = Gates(min_speedup=1.1, at_concurrency=1, max_mismatch_rate=0.0, min_acceptance_rate=0.3,
              latency_tolerance=0.10)


def _verdict(bench):
    levels = level_comparisons(bench)
    return evaluate(GATES, mismatch_rate=0.0, exact_match_rate=1.0, tolerance=0,
                    speedup=levels[1][SPEEDUP].interval, acceptance_rate=0.6, acceptance_source="server counters",
                    levels=levels)


def test_a_clear_win_passes_every_gate_at_every_level():
    v = _verdict(run(lognormal(0.01), concurrency=(1, 2)))
    assert v.decision == DEPLOY, v.reason
    names = [g.name for g in v.gates]
    for c in (1, 2):
        for label in ("P95 request latency", "P99 request latency", "TTFT p95", "ITL p95"):
            assert f"{label} at concurrency {c}" in names
    assert v.reason.startswith("all 11 gates passed; the closest: ") and v.decided_by.interval is not None
    rows = {(r["concurrency"], r["metric"]): r for r in v.levels}
    assert rows[(1, SPEEDUP)]["gated"] and not rows[(2, SPEEDUP)]["gated"] and rows[(2, "itl_p95")]["passed"]
    assert json.dumps(v.to_dict())


def test_a_p95_regression_fails_and_is_named_even_with_a_higher_throughput():
    # 7 of 8 speculative requests are faster, every 8th takes 2.5x the baseline's time
    bench = run(lognormal(0.01, spec=0.4, tail=1.6), block=8, requests=16)
    v = _verdict(bench)
    assert v.gates[1].passed  # throughput still wins ...
    assert v.decision == KEEP  # ... but the tail decides
    assert v.decided_by.name == "P95 request latency at concurrency 1"
    assert "P95 request latency at concurrency 1 failed" in v.reason and "needs <= 1.10" in v.reason
    assert "P99 request latency at concurrency 1" in v.to_dict()["failed"]


def test_null_latency_tolerance_turns_only_the_tail_gates_off():
    bench = run(lognormal(0.01, spec=0.4, tail=1.6), block=8, requests=16)  # the P95 regression above
    assert _verdict(bench).decision == KEEP
    levels = level_comparisons(bench)
    off = evaluate(Gates(min_speedup=1.0, latency_tolerance=None), mismatch_rate=0.0, exact_match_rate=1.0,
                   tolerance=0, speedup=levels[1][SPEEDUP].interval, acceptance_rate=0.5,
                   acceptance_source="server", levels=levels)
    assert off.decision == DEPLOY, off.reason
    assert [g.name for g in off.gates] == ["greedy equivalence", "speedup", "acceptance"]
    tail = [r for r in off.levels if r["metric"] == "request_latency_p95"]
    assert tail and all(not r["gated"] and r["passed"] is None and r["interval"]["ratio"] > 1 for r in tail)
    assert Validation.model_validate({"gates": {"latency_tolerance": None}}).gates.latency_tolerance is None


def test_one_block_cannot_pass_a_ratio_gate():
    bench = run(lognormal(0.01), requests=4, max_requests=4)  # a single block per model
    v = _verdict(bench)
    assert v.decision == KEEP and v.decided_by.name == "speedup" and "one block only" in v.decided_by.detail


def _served_metrics(draft_s, verify_s, base_s, n=10):
    m = {}
    for model, name, v in (("tensorrt_llm", "trtspec_draft_seconds", draft_s),
                           ("tensorrt_llm", "trtspec_verify_seconds", verify_s),
                           ("tensorrt_llm_baseline", "trtspec_verify_seconds", base_s)):
        m[f'{name}_sum{{model="{model}",version="1"}}'] = v * n
        m[f'{name}_count{{model="{model}",version="1"}}'] = n
    return m


TUNE_SAYS_0 = {"recommended_k": 0, "per_position_acceptance": [0.9, 0.8, 0.7, 0.6], "cost_ratio": 0.4,
               "rows": [{"k": k, "expected_tokens_per_pass": 1 + k * 0.7, "cost_per_pass": 1 + 0.4 * k + 0.3,
                         "expected_speedup": s} for k, s in enumerate([1.0, 0.95, 0.93, 0.92, 0.9])]}


def test_the_reports_name_the_deciding_gate_and_show_every_level(tmp_path):
    """The validation report and `trtspec run`'s report, written once (plots take seconds)."""
    from trtspec.config import load_recipe
    from trtspec.run_report import write_run_report
    from trtspec.validate.equivalence import EquivalenceResult
    from trtspec.validate.report import write_validation_report
    from trtspec.validate.run import ValidationResult, acceptance_from

    bench = run(lognormal(0.01, spec=0.4, tail=1.6), block=8, requests=16)
    v = _verdict(bench)
    res = ValidationResult(recipe="tiny", url="fake:1", models={"speculative": SPEC, "baseline": BASE},
                           equivalence=EquivalenceResult(tolerance=0, max_tokens=16, concurrency=1, unit="tokens"),
                           sampled=None, sampled_note=None, bench=bench, acceptance=acceptance_from([], 4),
                           speedup=bench.speedup(1), at_concurrency=1, verdict=v, started="t", wall_s=1.0,
                           speedup_interval=level_comparisons(bench)[1][SPEEDUP].interval)
    work = tmp_path / "run"
    val = work / "validate"
    write_validation_report(res, val, max_draft_len=4, min_speedup=1.1)
    md = (val / "report.md").read_text()
    assert "Decided by: P95 request latency at concurrency 1 failed" in md
    assert "### Every level: speculative vs baseline" in md
    row = next(ln for ln in md.splitlines() if ln.startswith("| 1 | P95 request latency |"))
    assert "upper <= 1.10" in row and "**FAIL**" in row
    assert "repeated until sure" in md
    d = json.loads((val / "report.json").read_text())
    assert d["verdict"]["decided_by"] == "P95 request latency at concurrency 1"
    assert d["speedup"]["interval"]["blocks"] >= 2

    (val / "server_metrics.json").write_text(json.dumps(_served_metrics(0.10, 0.30, 0.52)))
    (work / "build").mkdir()
    (work / "build" / "tune.json").write_text(json.dumps(TUNE_SAYS_0))
    pipeline = SimpleNamespace(
        recipe=load_recipe(pathlib.Path(__file__).resolve().parents[2] / "build_configs" / "tiny-cpu-draft-target.yaml"),
        source="tiny.yaml", stage_log=[], stage_dir=lambda stage: work / stage,
        outputs={"validate": {"report_json": str(val / "report.json")}, "build": {"tune": str(work / "build" / "tune.json")}})
    md = write_run_report(pipeline, work / "report").read_text()
    assert "Decided by: P95 request latency at concurrency 1 failed" in md and "### Every level" in md
    tokens = next(ln for ln in md.splitlines() if ln.startswith("| tokens/s (output, concurrency 1)"))
    assert "95 % interval [" in tokens and "within the 10% asked" in tokens
    tune_row = next(ln for ln in md.splitlines() if ln.startswith("| recommended max_draft_len |"))
    assert "Why they differ" not in tune_row  # tune says 0 and the run keeps the baseline: they agree


def test_tune_against_a_served_run_that_deploys_is_explained_in_one_line():
    """tune recommended 0 while the served run deploys speculation: one line, from the served run's
    own draft/verify costs and the measured interval."""
    from trtspec.run_report import tune_vs_served

    roles = {"speculative": "tensorrt_llm", "baseline": "tensorrt_llm_baseline"}
    deploy = {"verdict": {"deploy_speculative": True, "gates": [
        {"name": "speedup", "concurrency": 1, "interval": {"ratio": 1.13, "low": 1.11, "high": 1.15}}]}}
    line = tune_vs_served(TUNE_SAYS_0, 4, _served_metrics(0.10, 0.30, 0.52), roles, deploy)
    assert line.startswith("Why they differ: tune's offline batch-1 timing expects 0.90× at max_draft_len 4 and "
                           "recommends 0; the served run deploys")
    assert "give 1.30×" in line and "[1.11, 1.15]" in line and "the verdict follows the served run" in line
    assert "\n" not in line
    assert "exported no draft/verify histograms" in tune_vs_served(TUNE_SAYS_0, 4, {}, roles, deploy)
    keeps = {"verdict": {"deploy_speculative": False, "gates": []}}
    assert tune_vs_served(TUNE_SAYS_0, 4, {}, roles, keeps) == ""
    agrees = {**TUNE_SAYS_0, "recommended_k": 4, "rows": [{**r, "expected_speedup": 1.2} for r in TUNE_SAYS_0["rows"]]}
    assert tune_vs_served(agrees, 4, {}, roles, deploy) == ""
