"""`trtspec bench` and `trtspec validate` over two replicas: two real tritonservers serving the same
repository of the tiny pair on different ports. Per-replica and total results; equivalence on each."""

from __future__ import annotations

import json
import threading

import pytest
import yaml
from click.testing import CliRunner

from trtspec.cli import main
from trtspec.config import parse_recipe
from trtspec.triton.render import package
from trtspec.triton.launch.server import TritonServer

from tests.serving.test_validate_server import tiny_recipe


@pytest.fixture(scope="module")
def urls(tiny_models, tmp_path_factory):
    root = tmp_path_factory.mktemp("replicas")
    package(parse_recipe(tiny_recipe(*tiny_models)), root / "repo")
    servers = [TritonServer(root / "repo", workdir=root / f"server{i}", ready_timeout=300) for i in range(2)]
    errors = []

    def start(s):
        try:
            s.start()
        except Exception as e:  # noqa: BLE001 - re-raised below
            errors.append(e)

    threads = [threading.Thread(target=start, args=(s,)) for s in servers]  # both load at once
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        if errors:
            raise errors[0]
        yield [s.endpoints.grpc for s in servers]
    finally:
        for s in servers:
            s.stop()


def test_bench_reports_each_replica_and_the_total(urls, tmp_path):
    out = tmp_path / "bench"
    r = CliRunner().invoke(main, ["bench", "--url", urls[0], "--url", urls[1], "--concurrency", "1,2",
                                  "--requests", "4", "--output-len", "8", "--warmup", "1", "-o", str(out)])
    assert r.exit_code == 0, r.output
    d = json.loads((out / "report.json").read_text())
    assert d["urls"] == urls and d["url"] == ",".join(urls)
    assert d["outcome"] == {"sent": d["outcome"]["sent"], "completed": d["outcome"]["sent"], "failed": 0,
                            "failed_with_partial_output": 0, "busy": 0}
    for lv in d["levels"]:
        assert set(lv["replicas"]) == set(urls)
        for role in ("speculative", "baseline"):
            total = lv["models"][role]
            each = [lv["replicas"][u]["models"][role] for u in urls]
            # both replicas carried the level's load: 4 measured requests each (+ c - 1 settling)
            assert [m["requests"] for m in each] == [4, 4] and total["requests"] == 8
            assert total["output_tokens"] == sum(m["output_tokens"] for m in each)
            # latency distributions are pooled
            assert total["request_latency_s"]["n"] == sum(m["request_latency_s"]["n"] for m in each)
            assert min(m["request_latency_s"]["min"] for m in each) == total["request_latency_s"]["min"]
            # the replicas ran at the same time: the total throughput is over their common wall time
            # (per block, first request sent on any replica → last response on any)
            spans = [m["duration_s"] for m in each]
            assert max(spans) <= total["duration_s"] <= sum(spans)
            assert total["output_token_throughput"] == pytest.approx(total["output_tokens"] / total["duration_s"])
            assert total["output_token_throughput"] <= sum(m["output_token_throughput"] for m in each) * 1.0001
        assert lv["replicas"][urls[0]]["speedup"]["output_token_throughput"] is not None
    recs = d["records"]
    assert {r["replica"] for r in recs} == set(urls)
    md = (out / "report.md").read_text()
    assert "2 replicas" in md and "## Each replica" in md and f"`{urls[1]}`" in md
    assert "each replica" in r.output


def test_validate_checks_equivalence_on_every_replica(urls, tiny_models, tmp_path):
    recipe = tiny_recipe(*tiny_models, num_prompts=3, max_tokens=12, concurrency=[1], requests_per_level=4,
                         sampled_check_samples=0,
                         gates={"min_speedup": 0.05, "at_concurrency": 1, "max_mismatch_rate": 0.0,
                                "min_acceptance_rate": 0.0, "latency_tolerance": None})
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    out = tmp_path / "validate"
    r = CliRunner().invoke(main, ["validate", "--url", ",".join(urls), str(path), "-o", str(out)])
    d = json.loads((out / "report.json").read_text())
    assert d["urls"] == urls
    for u in urls:
        eq = d["replicas"][u]["equivalence"]
        assert eq["prompts_compared"] == 3 and eq["exact_matches"] == 3
        assert d["replicas"][u]["speedup"] is not None
    assert d["bench"]["urls"] == urls
    assert d["verdict"]["decision"] == "deploy speculative" and r.exit_code == 0, d["verdict"]["reason"]
    assert "### Each replica" in (out / "report.md").read_text()
