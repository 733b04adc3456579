"""Open-loop `trtspec bench` on a real tritonserver (CPU) serving the tiny pair: request rates with
ABBA blocks, a fixed schedule, goodput, the exports; and the shipped Grafana dashboard's queries
against the live server's /metrics.

One server for the module (python stubs take seconds each to start on 2 cores).
"""

from __future__ import annotations

import json
import pathlib
import re
import urllib.request

import pytest
from click.testing import CliRunner

from trtspec.cli import main
from trtspec.client import prom
from trtspec.config import parse_recipe
from trtspec.triton.render import package
from trtspec.triton.launch.server import TritonServer
from trtspec.triton.launch.watchdog import WatchdogSettings

from tests.serving.test_validate_server import tiny_recipe

DASHBOARD = pathlib.Path(__file__).resolve().parents[2] / "trtspec" / "data" / "grafana" / "speculative.json"
TRTLLM_FIXTURE = pathlib.Path(__file__).resolve().parents[1] / "golden" / "metrics" / "trtllm_triton.prom"


@pytest.fixture(scope="module")
def server(tiny_models, tmp_path_factory):
    root = tmp_path_factory.mktemp("openloop-server")
    package(parse_recipe(tiny_recipe(*tiny_models)), root / "repo")
    # with the watchdog, as `trtspec serve` runs a deployment (its counters are on the dashboard)
    with TritonServer(root / "repo", workdir=root / "server", ready_timeout=240,
                      watchdog=WatchdogSettings(probe_every_s=None)) as s:
        yield s


def _bench(server, tiny_target, out, *args) -> tuple[int, str]:
    r = CliRunner().invoke(main, ["bench", "--url", server.endpoints.grpc, "--tokenizer", str(tiny_target),
                                  "--prompts", "builtin:code", "--num-prompts", "4", "--warmup", "1",
                                  "-o", str(out), "--json", *args])
    return r.exit_code, r.output


def test_request_rates_run_abba_per_level_with_goodput_and_exports(server, tiny_target, tmp_path):
    code, output = _bench(server, tiny_target, tmp_path, "--request-rate", "2,inf", "--requests", "4",
                          "--output-len", "12", "--output-len-stddev", "3", "--max-concurrency", "3",
                          "--goodput", "ttft:60000", "--goodput", "itl:0.001", "--ignore-eos")
    assert code == 0, output
    d = json.loads((tmp_path / "report.json").read_text())
    assert [lv["request_rate"] for lv in d["levels"]] == [2.0, None]  # inf is written as null in JSON
    assert [lv["load"] for lv in d["levels"]] == ["2 req/s, max 3 in flight", "all at once, max 3 in flight"]
    for lv in d["levels"]:
        for role in ("speculative", "baseline"):
            m = lv["models"][role]
            assert m["requests"] == 4 and m["errors"] == 0
            g = m["goodput"]
            assert g["slo_ms"] == {"ttft": 60000.0, "itl": 0.001}
            assert g["met"] == 0 and g["fraction"] == 0.0  # nobody decodes a token in 1 µs
        assert "goodput" in lv["speedup"]
    # ABBA: per level two blocks, the second in the other order, same prompts and lengths on both models
    recs = d["records"]  # in window order: level, block, model
    assert len(recs) == 16
    for level_recs in (recs[:8], recs[8:]):
        assert [r["role"][0] for r in level_recs] == list("ssbbbbss")  # A B | B A
        by_role = {role: [(r["prompt_index"], r["max_tokens"]) for r in level_recs if r["role"] == role]
                   for role in ("speculative", "baseline")}
        assert sorted(by_role["speculative"]) == sorted(by_role["baseline"])
    assert len({r["max_tokens"] for r in recs}) > 1  # synthetic output lengths, stddev 3
    # ignore-eos: the ensembles take min_length, so every output is exactly its requested length
    # (EOS suppressed until then), on both models; the report says how it was honoured
    assert set(d["ignore_eos"]) == {"speculative", "baseline"}
    assert all(v.startswith("min_length via") for v in d["ignore_eos"].values()), d["ignore_eos"]
    assert [sum(r["chunk_tokens"]) for r in recs] == [r["max_tokens"] for r in recs]
    # exports: per model and level, the stamped genai-perf files
    ex = tmp_path / "exports"
    names = sorted(p.name for p in ex.iterdir())
    assert names == ["ensemble-request_rate2", "ensemble-request_rateinf", "ensemble_baseline-request_rate2",
                     "ensemble_baseline-request_rateinf"]
    gp = json.loads((ex / "ensemble-request_rate2" / "profile_export_genai_perf.json").read_text())
    assert gp["time_to_first_token"]["unit"] == "ms" and gp["request_count"]["avg"] == 4
    assert gp["input_config"]["trtspec"]["server"]["version"]  # the server said which version it is
    ours = d["levels"][0]["models"]["speculative"]["ttft_s"]["p50"] * 1e3
    assert gp["time_to_first_token"]["p50"] == pytest.approx(ours, rel=1e-9)  # one measurement, two formats


def test_fixed_schedule_sends_on_time(server, tiny_target, tmp_path):
    trace = tmp_path / "trace.jsonl"
    stamps = [0, 300, 600, 900]
    trace.write_text("".join(json.dumps({"timestamp": t, "output_length": 8}) + "\n" for t in stamps))
    code, output = _bench(server, tiny_target, tmp_path / "out", "--fixed-schedule", str(trace))
    assert code == 0, output
    d = json.loads((tmp_path / "out" / "report.json").read_text())
    (lv,) = d["levels"]
    assert lv["request_rate"] == "fixed schedule"
    assert lv["models"]["speculative"]["requests"] == 4 and lv["models"]["baseline"]["requests"] == 4
    assert {r["max_tokens"] for r in d["records"]} == {8}


def test_bad_open_loop_input_is_one_line_and_exit_2(server, tmp_path):
    for args, needle in ((["--request-rate", "0"], "--request-rate"), (["--goodput", "speed:3"], "goodput"),
                         (["--fixed-schedule", str(tmp_path / "none.jsonl")], "fixed_schedule")):
        r = CliRunner().invoke(main, ["bench", "--url", server.endpoints.grpc, "-o", str(tmp_path / "x"), *args])
        assert r.exit_code == 2, r.output
        assert needle in r.output


# ---- the Grafana dashboard

METRIC = re.compile(r"\b((?:trtspec|nv)_[a-zA-Z0-9_:]+)(\{[^}]*\})?")
MATCHER = re.compile(r'(\w+)\s*(=~|!=|=)\s*"([^"]*)"')


def _queries(dash: dict) -> list[tuple[str, str]]:
    out = []
    for p in dash["panels"]:
        for t in p.get("targets", []):
            out.append((p["title"], t["expr"]))
    return out


def test_dashboard_has_grafanas_shape():
    dash = json.loads(DASHBOARD.read_text())
    assert dash["uid"] and dash["title"] and isinstance(dash["schemaVersion"], int)
    assert {v["name"] for v in dash["templating"]["list"]} >= {"DS_PROMETHEUS", "engine"}
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    titles = " ".join(p["title"] for p in dash["panels"]).lower()
    for needed in ("acceptance rate", "acceptance length", "draft vs verify", "fallback", "ttft", "itl"):
        assert needed in titles
    for p in dash["panels"]:
        g = p["gridPos"]
        assert all(isinstance(g[k], int) for k in ("x", "y", "w", "h")) and g["x"] + g["w"] <= 24
        if p["type"] == "row":
            continue
        assert p["type"] in {"timeseries", "stat", "gauge"} and p["datasource"]["uid"] == "${DS_PROMETHEUS}"
        refs = [t["refId"] for t in p["targets"]]
        assert refs and len(refs) == len(set(refs))
        for t in p["targets"]:
            assert t["expr"].count("(") == t["expr"].count(")"), t["expr"]


def test_dashboard_queries_match_the_live_servers_metrics(server, tiny_target, tmp_path):
    # some traffic on both engines, so histograms and counters exist
    code, output = _bench(server, tiny_target, tmp_path, "--concurrency", "1", "--requests", "2",
                          "--output-len", "8", "--no-export")
    assert code == 0, output
    with urllib.request.urlopen(server.endpoints.metrics) as r:
        live = prom.parse(r.read().decode(), keep=None)
    trtllm = prom.parse(TRTLLM_FIXTURE.read_text(), keep=None)  # panels for TensorRT-LLM deployments
    dash = json.loads(DASHBOARD.read_text())
    checked = 0
    for title, expr in _queries(dash):
        for name, sel in METRIC.findall(expr.replace("$engine", ".*")):
            pool = trtllm if name.startswith("nv_trt_llm_") else live
            series = [s for s in pool if s.name == name]
            assert series, f"{title}: {name} is not on the server's /metrics"
            wanted = MATCHER.findall(sel or "")
            ok = [s for s in series if all(
                (re.fullmatch(v, s.labels.get(k, "")) if op == "=~" else
                 (s.labels.get(k) == v) if op == "=" else s.labels.get(k) != v) for k, op, v in wanted)]
            assert ok, f"{title}: no series of {name} matches {sel}"
            checked += 1
    assert checked >= 20
    # the TTFT and ITL panels compute: histogram_quantile over the live buckets gives a number
    for name in ("trtspec_time_to_first_token_seconds", "trtspec_inter_token_latency_seconds"):
        b = prom.buckets(live, name, model="tensorrt_llm")
        p95 = prom.histogram_quantile(0.95, b)
        assert p95 is not None and p95 > 0
    # the run report's server rows read the same live scrape: trtspec's runtime exports no nv_trt_llm_*
    from trtspec.validate.engine_metrics import engine_rows

    rows = {r.question: r for r in engine_rows(prom.to_dict([s for s in live if s.name.startswith(prom.KEEP)]),
                                                {"speculative": "tensorrt_llm", "baseline": "tensorrt_llm_baseline"})}
    assert rows["draft compute time per request"].source == "trtspec_draft_seconds"
    assert rows["draft compute time per request"].speculative.endswith(" ms")
    assert rows["memory (resident, engine process)"].source == "trtspec_resident_memory_bytes"
    assert "KV cache blocks used / max" not in rows
