"""Open-loop `trtspec bench` on a real tritonserver (CPU) serving the tiny pair: request rates with
ABBA blocks, a fixed schedule, goodput, the exports; and the shipped Grafana dashboard's queries
against the live server's /metrics, then evaluated by a real Prometheus (Debian's `prometheus`,
`make prometheus-tools`) scraping it, with the shipped alerting rules loaded.

One server for the module (python stubs take seconds each to start on 2 cores).
"""

from __future__ import annotations

import contextlib
import http.server
import json
import pathlib
import re
import shutil
import socket
import subprocess
import threading
import time
import urllib.parse
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
from tests.serving.triton_stream import metric, metrics

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


# ---- the dashboard and the rules on a real Prometheus

PROMETHEUS = shutil.which("prometheus")
RULES = DASHBOARD.parents[1] / "prometheus" / "rules.yml"
SCRAPE_S = 1
# Grafana's $__rate_interval is max($__interval + scrape interval, 4 × scrape interval); with the 1 s
# scrape below, 30 s is its value for any $__interval up to 29 s, and it covers this test's traffic
RATE_INTERVAL = "30s"


def _grafana(expr: str) -> str:
    """A dashboard query as Grafana sends it: $__rate_interval, and the engine variable at its
    default "All" (the variable's allValue, .*)."""
    dash_vars = {v["name"]: v for v in json.loads(DASHBOARD.read_text())["templating"]["list"]}
    expr = expr.replace("$__rate_interval", RATE_INTERVAL).replace("$engine", dash_vars["engine"]["allValue"])
    assert "$" not in expr, f"a variable the test does not substitute: {expr}"
    return expr


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def _static_metrics(text: str):
    """A tiny HTTP server that answers /metrics with ``text`` (a recorded scrape); yields host:port."""
    body = text.encode()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - the stdlib's name
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield f"127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()


def _families(text: str, prefix: str) -> str:
    """The families of a Prometheus text scrape whose name starts with ``prefix`` (HELP/TYPE kept)."""
    keep = [ln for ln in text.splitlines()
            if re.match(rf"(# (HELP|TYPE) )?{prefix}", ln)]
    return "\n".join(keep) + "\n"


class _Prometheus:
    def __init__(self, url: str):
        self.url = url

    def get(self, path: str, **params) -> dict:
        q = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}{path}?{q}", timeout=10) as r:
            d = json.loads(r.read().decode())
        assert d["status"] == "success", d
        return d["data"]

    def query(self, expr: str) -> list[dict]:
        return self.get("/api/v1/query", query=expr)["result"]

    def wait(self, what: str, ok, timeout_s: float = 30):
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                got = ok()
            except (OSError, AssertionError):
                got = None
            if got:
                return got
            if time.monotonic() > deadline:
                raise AssertionError(f"Prometheus: {what} within {timeout_s:.0f} s")
            time.sleep(0.2)


@pytest.fixture
def prometheus(server, tmp_path_factory):
    """Debian's prometheus scraping the module's server every second, and TensorRT-LLM's recorded
    series (its nv_trt_llm_* families only, served by a static HTTP server: the CPU runtime has
    none), with the shipped rules loaded."""
    if PROMETHEUS is None:
        pytest.skip("prometheus not on PATH: make prometheus-tools (apt-get install prometheus)")
    live = urllib.parse.urlsplit(server.endpoints.metrics).netloc
    tmp_path = tmp_path_factory.mktemp("prometheus")
    with _static_metrics(_families(TRTLLM_FIXTURE.read_text(), "nv_trt_llm_")) as fixture:
        config = {
            "global": {"scrape_interval": f"{SCRAPE_S}s", "evaluation_interval": f"{SCRAPE_S}s"},
            "rule_files": [str(RULES)],
            "scrape_configs": [
                {"job_name": "trtspec", "static_configs": [{"targets": [live]}]},
                {"job_name": "trtllm-recorded", "static_configs": [{"targets": [fixture]}]},
            ],
        }
        (tmp_path / "prometheus.yml").write_text(json.dumps(config))  # JSON is YAML
        port = _free_port()
        log = (tmp_path / "prometheus.log").open("w")
        proc = subprocess.Popen([PROMETHEUS, f"--config.file={tmp_path / 'prometheus.yml'}",
                                 f"--storage.tsdb.path={tmp_path / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
                                stdout=log, stderr=subprocess.STDOUT)
        try:
            prom_api = _Prometheus(f"http://127.0.0.1:{port}")
            prom_api.wait("up on both targets", lambda: len(prom_api.query("up == 1")) == 2)
            yield prom_api
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            log.close()


def _drafted(server) -> float:
    """The speculative engine's drafted-token counter on the server's /metrics."""
    return metric(metrics(server.endpoints.metrics), "trtspec_draft_tokens_total", model="tensorrt_llm")


def test_a_real_prometheus_evaluates_every_dashboard_query_and_the_rules(server, prometheus, tiny_target, tmp_path):
    # traffic on both engines (and the router) after the first scrape, so counters move within the
    # window; until the speculative engine has drafted: its goodput policy may choose k = 0 for a
    # few short requests when the other xdist worker loads the cores (CI saw NaN acceptance once)
    before = drafted = _drafted(server)
    for attempt in range(5):
        code, output = _bench(server, tiny_target, tmp_path / f"bench{attempt}", "--concurrency", "1", "--requests", "2",
                              "--output-len", "8" if attempt == 0 else "32", "--no-export")
        assert code == 0, output
        drafted = _drafted(server)
        if drafted > before:
            break
    assert drafted > before, "the speculative engine drafted nothing in 5 rounds of traffic"
    after = time.time()
    # three scrapes after the traffic
    prometheus.wait("3 scrapes after the traffic", lambda: all(
        float(r["value"][1]) >= after + 2 * SCRAPE_S for r in prometheus.query("timestamp(up)")), timeout_s=20)
    dash = json.loads(DASHBOARD.read_text())
    empty, checked = [], 0
    for title, expr in _queries(dash):
        result = prometheus.query(_grafana(expr))
        checked += 1
        if not result:
            empty.append(f"{title}: {_grafana(expr)}")
    assert not empty, "queries Prometheus answered with no series:\n" + "\n".join(empty)
    assert checked == sum(len(p.get("targets", [])) for p in dash["panels"]) and checked >= 20
    # the panels show numbers: the speculative engine's acceptance rate and its TTFT p95 are finite
    acc = prometheus.query(_grafana(next(e for t, e in _queries(dash) if "accepted_tokens_total" in e)))
    assert any(r["metric"]["model"] == "tensorrt_llm" and 0 <= float(r["value"][1]) <= 1 for r in acc), acc
    ttft95 = prometheus.query(_grafana(next(e for t, e in _queries(dash) if "histogram_quantile(0.95" in e
                                            and "time_to_first_token" in e)))
    assert any(r["metric"]["model"] == "tensorrt_llm" and float(r["value"][1]) > 0 for r in ttft95), ttft95
    # the shipped rules: every one evaluates on the live series without an error
    groups = prometheus.get("/api/v1/rules")["groups"]
    rules = [r for g in groups for r in g["rules"]]
    assert len(rules) == 12
    bad = [(r["name"], r.get("lastError")) for r in rules if r["health"] != "ok"]
    assert not bad, bad
    for name in ("model:trtspec_acceptance_rate:rate5m", "model:trtspec_decode_tokens_per_second:mean5m",
                 "model:trtspec_time_to_first_token_seconds:p95_5m"):
        got = prometheus.wait(f"{name} recorded", lambda: prometheus.query(name), timeout_s=5)
        assert {r["metric"]["model"] for r in got} >= {"tensorrt_llm", "tensorrt_llm_baseline"}, got
