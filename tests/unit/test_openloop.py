"""Open-loop arrivals, fixed schedules, synthetic lengths, goodput and the field-format exports,
on synthetic timelines (no server; the served runs are in tests/serving/test_openloop_serving.py)."""

from __future__ import annotations

import csv
import json
import math

import numpy as np
import pytest

from trtspec.client.exports import (
    GENAI_PERF_CSV_HEADER,
    PERCENTILES,
    genai_perf_stats,
    write_exports,
)
from trtspec.client.loadgen import BenchResult, BenchSettings, LevelResult, PromptItem, output_len
from trtspec.client.metrics import RequestRecord, Window
from trtspec.client.openloop import (
    arrival_offsets,
    goodput,
    load_schedule,
    parse_goodput,
    synthetic_length,
)
from trtspec.errors import ConfigError

# what genai-perf 0.0.16 writes for a streamed LLM run (genai_perf/metrics/{metrics,llm_metrics,statistics}.py)
GENAI_PERF_DIST = {"unit", "avg", "min", "max", "std", *(f"p{q}" for q in (1, 5, 10, 25, 50, 75, 90, 95, 99))}
GENAI_PERF_KEYS = {"request_throughput", "request_latency", "request_count", "time_to_first_token",
                   "time_to_second_token", "inter_token_latency", "output_token_throughput",
                   "output_token_throughput_per_user", "output_sequence_length", "input_sequence_length",
                   "input_config"}


def rec(chunk_t, chunk_tokens, *, start=100.0, role="speculative", prompt_len=10, ok=True, index=0):
    return RequestRecord(role=role, model="m", concurrency=0, prompt_index=index, max_tokens=sum(chunk_tokens),
                         start=start, chunk_t=list(chunk_t), chunk_tokens=list(chunk_tokens), prompt_len=prompt_len,
                         error=None if ok else "boom: it failed", chunk_text=["x"] * len(chunk_t))


@pytest.mark.parametrize("burstiness", [1.0, 0.5, 4.0])
def test_arrivals_have_the_asked_rate_and_burstiness(burstiness):
    rate, n = 5.0, 20001
    t = arrival_offsets(n, rate, burstiness, seed=3)
    gaps = np.diff(t)
    assert t[0] == 0 and np.all(gaps >= 0)
    # gamma(shape k, scale 1/(R k)): mean 1/R, coefficient of variation 1/sqrt(k) (k = 1: Poisson)
    assert gaps.mean() == pytest.approx(1 / rate, rel=0.04)
    assert gaps.std() / gaps.mean() == pytest.approx(1 / math.sqrt(burstiness), rel=0.06)
    assert arrival_offsets(50, rate, burstiness, seed=3) == t[:50]  # deterministic per seed
    assert arrival_offsets(50, rate, burstiness, seed=4) != t[:50]
    assert arrival_offsets(3, math.inf, burstiness, seed=0) == [0.0, 0.0, 0.0]


def test_synthetic_lengths_have_the_asked_mean_and_stddev():
    xs = np.array([synthetic_length(64, 16, 0, "osl", i) for i in range(5000)])
    assert xs.mean() == pytest.approx(64, rel=0.03) and xs.std() == pytest.approx(16, rel=0.06)
    assert xs.min() >= 1
    assert synthetic_length(64, 16, 0, "osl", 7) == synthetic_length(64, 16, 0, "osl", 7)
    s = BenchSettings(output_lens=(32,), output_len_stddev=8.0)
    assert len({output_len(s, i) for i in range(40)}) > 5
    assert {output_len(BenchSettings(output_lens=(16, 64)), i) for i in range(4)} == {16, 64}


def test_settings_errors_name_the_field():
    for kwargs, field in [({"request_rates": (0.0,)}, "request_rate"), ({"burstiness": 0.0}, "burstiness"),
                          ({"max_concurrency": 0}, "max_concurrency"), ({"goodput": (("speed", 1.0),)}, "goodput"),
                          ({"goodput": (("ttft", -1.0),)}, "goodput"), ({"prompt_len_stddev": 4.0}, "prompt_len_stddev")]:
        with pytest.raises(ConfigError, match=field):
            BenchSettings(**kwargs)
    assert parse_goodput(["ttft:200", "itl:50,e2el:900"]) == (("ttft", 200.0), ("itl", 50.0), ("e2el", 900.0))
    with pytest.raises(ConfigError, match="goodput.*METRIC:MILLISECONDS"):
        parse_goodput(["ttft=200"])


def test_fixed_schedule(tmp_path):
    p = tmp_path / "trace.jsonl"
    p.write_text('{"timestamp": 1500, "output_length": 8}\n\n{"timestamp": 1000, "input_length": 32}\n'
                 '{"timestamp": 3000, "text": "hello"}\n')
    rows = load_schedule(p)
    assert [r.timestamp_s for r in rows] == [0.0, 0.5, 2.0]  # sorted, from the first
    assert rows[0].input_length == 32 and rows[1].output_length == 8 and rows[2].text == "hello"
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"time": 1}\n')
    with pytest.raises(ConfigError, match=r"fixed_schedule.*timestamp.*bad.jsonl:1"):
        load_schedule(bad)
    bad.write_text('{"timestamp": 1, "output_length": 0}\n')
    with pytest.raises(ConfigError, match="output_length must be an integer >= 1"):
        load_schedule(bad)
    with pytest.raises(ConfigError, match="not found"):
        load_schedule(tmp_path / "missing.jsonl")
    with pytest.raises(ConfigError, match="not both"):
        BenchSettings(request_rates=(1.0,), schedule=rows)


def test_goodput_counts_requests_meeting_every_slo():
    fast = rec([0.05, 0.06, 0.07], [1, 1, 1])  # TTFT 50 ms, ITL 10 ms
    slow_first = rec([0.30, 0.31, 0.32], [1, 1, 1])  # TTFT 300 ms
    slow_tokens = rec([0.05, 0.25, 0.45], [1, 1, 1])  # ITL 200 ms
    failed = rec([], [], ok=False)
    g = goodput([fast, slow_first, slow_tokens, failed], (("ttft", 200.0), ("itl", 50.0)), duration_s=2.0)
    assert (g["met"], g["requests"], g["fraction"], g["request_goodput"]) == (1, 4, 0.25, 0.5)
    assert goodput([fast, slow_first], (("e2el", 100.0),), 1.0)["met"] == 1


def test_genai_perf_statistics_have_its_keys_units_and_numpy_values():
    rng = np.random.default_rng(0)
    recs = []
    for i in range(40):
        n = int(rng.integers(2, 8))
        t = np.cumsum(rng.uniform(0.005, 0.05, size=n)).tolist()
        recs.append(rec(t, [1] + [int(x) for x in rng.integers(1, 4, size=n - 1)], start=100 + i, index=i,
                        prompt_len=int(rng.integers(5, 50))))
    d = genai_perf_stats(recs, duration_s=10.0, slos=())
    assert set(d) | {"input_config"} == GENAI_PERF_KEYS
    for name in ("request_latency", "time_to_first_token", "time_to_second_token", "inter_token_latency",
                 "output_token_throughput_per_user", "output_sequence_length", "input_sequence_length"):
        assert set(d[name]) == GENAI_PERF_DIST, name
    units = {k: v["unit"] for k, v in d.items()}
    assert units["time_to_first_token"] == units["inter_token_latency"] == units["request_latency"] == "ms"
    assert units["output_token_throughput"] == "tokens/sec" and units["request_throughput"] == "requests/sec"
    assert set(d["output_token_throughput"]) == {"unit", "avg"}
    ttft_ms = np.array([r.ttft * 1e3 for r in recs])
    assert d["time_to_first_token"]["avg"] == pytest.approx(ttft_ms.mean())
    assert d["time_to_first_token"]["std"] == pytest.approx(ttft_ms.std())  # population std, as numpy's default
    for q in PERCENTILES:
        assert d["time_to_first_token"][f"p{q}"] == pytest.approx(np.percentile(ttft_ms, q))
    itl_ms = np.array([(r.chunk_t[-1] - r.chunk_t[0]) / (r.osl - 1) * 1e3 for r in recs])
    assert d["inter_token_latency"]["p50"] == pytest.approx(np.percentile(itl_ms, 50))
    assert d["output_token_throughput"]["avg"] == pytest.approx(sum(r.osl for r in recs) / 10.0)
    assert d["request_count"]["avg"] == 40
    assert "request_goodput" in genai_perf_stats(recs, 10.0, slos=(("ttft", 100.0),))


def _result(tmp_path, roles=("speculative", "baseline")) -> BenchResult:
    settings = BenchSettings(request_rates=(2.0, 4.0), requests=4, goodput=(("ttft", 100.0),))
    prompts = [PromptItem(i, f"prompt {i}", 8, "tokens") for i in range(4)]
    levels = []
    for k, rate in enumerate((2.0, 4.0)):
        lv = LevelResult(0, [], request_rate=rate)
        for b, role in enumerate(roles):
            w = Window(role=role, concurrency=0, start=100.0 + 10 * k + b, end=101.0 + 10 * k + b, block=b)
            w.requests = [rec([0.05 * (j + 1), 0.1 * (j + 1)], [1, 2], start=w.start + 0.1 * j, role=role, index=j)
                          for j in range(4)]
            lv.windows.append(w)
        levels.append(lv)
    return BenchResult(url="127.0.0.1:1", settings=settings, prompt_source="test", prompts=prompts, levels=levels,
                       started="2026-12-04T00:00:00+00:00", wall_s=1.0,
                       extra={"server": {"name": "triton", "version": "2.51.0"}})


def test_exports_per_model_and_level_are_stamped(tmp_path):
    res = _result(tmp_path)
    files = write_exports(res, tmp_path / "exports")
    dirs = sorted(p.name for p in (tmp_path / "exports").iterdir())
    assert dirs == ["ensemble-request_rate2", "ensemble-request_rate4", "ensemble_baseline-request_rate2",
                    "ensemble_baseline-request_rate4"]
    assert len(files) == 4 * 6
    d = tmp_path / "exports" / "ensemble-request_rate2"
    gp = json.loads((d / "profile_export_genai_perf.json").read_text())
    assert set(gp) == GENAI_PERF_KEYS | {"request_goodput"}
    stamp = gp["input_config"]["trtspec"]
    assert stamp["tool"] == "trtspec" and stamp["trtspec_version"] and stamp["server"]["version"] == "2.51.0"
    assert stamp["machine"]["cpus"] >= 1 and gp["input_config"]["request_rate"] == 2.0
    rows = list(csv.reader((d / "profile_export_genai_perf.csv").open()))
    assert rows[0] == GENAI_PERF_CSV_HEADER
    # genai-perf's row order (LLMMetrics.request_metrics / system_metrics)
    assert [r[0] for r in rows[1:8]] == ["Time To First Token (ms)", "Time To Second Token (ms)", "Request Latency (ms)",
                                         "Inter Token Latency (ms)", "Output Token Throughput Per User (tokens/sec/user)",
                                         "Output Sequence Length (tokens)", "Input Sequence Length (tokens)"]
    assert rows[9:14] == [["Metric", "Value"], ["Output Token Throughput (tokens/sec)", rows[10][1]],
                          ["Request Throughput (per sec)", rows[11][1]], ["Request Goodput (per sec)", rows[12][1]],
                          ["Request Count (count)", "4.00"]]
    assert ["Metric", "Value"] in rows and ["Tool", "trtspec"] in rows
    ai = json.loads((d / "profile_export_aiperf.json").read_text())
    assert ai["inter_chunk_latency"]["unit"] == "ms" and ai["benchmark_duration"]["unit"] == "sec"
    assert ai["total_osl"]["avg"] == 12 and ai["good_request_count"]["avg"] == 2  # TTFT 50 and 100 ms meet 100 ms
    assert list(csv.reader((d / "profile_export_aiperf.csv").open()))[0][-1] == "std"
    pa = json.loads((d / "profile_export.json").read_text())
    assert pa["service_kind"] == "triton" and pa["trtspec"]["server"]["name"] == "triton"
    exp = pa["experiments"][0]
    assert exp["experiment"] == {"mode": "request_rate", "value": 2.0}
    r0 = exp["requests"][0]
    assert r0["request_inputs"]["text_input"] == "prompt 0"
    # ns since the epoch; differences are the measured times
    assert r0["timestamp"] > 1.7e18
    assert (r0["response_timestamps"][0] - r0["timestamp"]) / 1e6 == pytest.approx(50.0, abs=1e-3)
    assert [o["text_output"] for o in r0["response_outputs"]] == ["x", "x"]
    lines = (d / "profile_export.jsonl").read_text().splitlines()
    first = json.loads(lines[0])
    assert len(lines) == 4 and first["metrics"]["time_to_first_token"] == {"value": pytest.approx(50.0), "unit": "ms"}


def test_open_loop_report_has_the_load_plot_and_goodput_table(tmp_path):
    from trtspec.validate.report import write_bench_report

    files = write_bench_report(_result(tmp_path), tmp_path / "report")
    assert "speedup_by_load" in files and "speedup_by_concurrency" not in files
    assert (tmp_path / "report" / "speedup_by_load.png").stat().st_size > 10_000
    md = (tmp_path / "report" / "report.md").read_text()
    assert "open loop: request rates 2, 4 /s" in md
    assert "## Goodput (SLO: ttft <= 100 ms" in md
    assert "| 2 req/s | speculative | 4 | 2 | 50.0% |" in md
    d = json.loads((tmp_path / "report" / "report.json").read_text())
    assert [lv["load"] for lv in d["levels"]] == ["2 req/s", "4 req/s"]
