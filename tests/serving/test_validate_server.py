"""End to end on a real tritonserver (CPU) serving the tiny pair: the client SDK, `trtspec bench`
and `trtspec validate` through the rendered repository (ensemble / ensemble_baseline).

One server for the module (python stubs take seconds each to start on 2 cores).
"""

from __future__ import annotations

import asyncio
import json

import pytest
import yaml
from click.testing import CliRunner

from trtspec.cli import main
from trtspec.client import AsyncLLMClient, LLMClient, ModelNotFound, Sampling
from trtspec.config import parse_recipe
from trtspec.triton.render import package
from trtspec.triton.launch.server import TritonServer
from tests.conftest import worker_threads
from tests.serving.triton_stream import metric, metrics

PROMPT = 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n'


def tiny_recipe(target, draft, **validation) -> dict:
    """The shipped CPU default (build_configs/tiny-cpu-draft-target.yaml) at test scale."""
    return {
        "name": "tiny-validate-test",
        "target": {"model": str(target)},
        "speculation": {"method": "draft_target", "draft": {"model": str(draft)}, "max_draft_len": 4},
        "runtime": {"backend": "torch", "dtype": "float32", "device": "cpu", "torch_threads": worker_threads(),
                    # a low fixed break-even keeps the router on the speculative path on every prompt mix
                    "adaptive": {"enabled": True, "window": 64, "min_acceptance_rate": 0.05}},
        "limits": {"max_batch_size": 8, "max_input_len": 512, "max_seq_len": 1024},
        # one-request blocks: the few requests still make paired blocks, so the gates see an interval;
        # the budget is the minimum, so no level repeats (test time)
        "validation": {"prompts": "builtin:code", "num_prompts": 6, "max_tokens": 24, "concurrency": [1, 2],
                       "requests_per_level": 4, "warmup_requests": 1, "block_requests": 1,
                       "max_requests_per_level": validation.get("requests_per_level", 4), **validation},
    }


@pytest.fixture(scope="module")
def server(tiny_models, tmp_path_factory):
    root = tmp_path_factory.mktemp("validate-server")
    package(parse_recipe(tiny_recipe(*tiny_models)), root / "repo")
    with TritonServer(root / "repo", workdir=root / "server", ready_timeout=240) as s:
        yield s


@pytest.fixture(scope="module")
def url(server) -> str:
    return server.endpoints.grpc


def test_client_streams_tokens_and_acceptance(url, tiny_target):
    with LLMClient(url, tokenizer=str(tiny_target)) as c:
        c.wait_ready(["ensemble", "ensemble_baseline"])
        r = c.generate(PROMPT, Sampling(max_tokens=24))
        assert r.model == "ensemble" and r.served_by == "speculative" and r.token_ids_source == "server"
        assert 0 < len(r.token_ids) <= 24 and len(r.chunks) > 1
        assert r.text == "".join(ch.text for ch in r.chunks)
        assert sum(ch.num_tokens for ch in r.chunks) == len(r.token_ids)
        assert [ch.t_s for ch in r.chunks] == sorted(ch.t_s for ch in r.chunks) and r.ttft_s > 0
        assert r.draft_tokens is not None and r.accepted_draft_tokens <= r.draft_tokens
        assert r.perf["generated"] == len(r.token_ids) and r.prompt_tokens == r.perf["prompt_tokens"]
        base = c.generate(PROMPT, Sampling(max_tokens=24), model="ensemble_baseline")
        assert base.served_by == "baseline" and base.draft_tokens == 0
        assert base.token_ids == r.token_ids  # greedy speculation is lossless
        whole = c.generate(PROMPT, Sampling(max_tokens=24), stream=False)
        assert len(whole.chunks) == 1 and whole.token_ids == r.token_ids and whole.text == r.text
        # the id-level model, as NVIDIA's tensorrt_llm: ids in, ids out, text via the tokenizer
        ids = c.generate(PROMPT, Sampling(max_tokens=24), model="tensorrt_llm")
        assert ids.token_ids == r.token_ids and ids.text == r.text
        with pytest.raises(ModelNotFound, match="ensemble_baseline") as ei:
            c.generate(PROMPT, model="ensemble_speculative")
        assert ei.value.status == "NOT_FOUND"


def test_the_goodput_policy_shows_on_metrics(server, url):
    """Per (batch size, draft length): the steps the policy chose and the costs it priced them at;
    the baseline engine, which has no policy, shows none."""
    m = server.endpoints.metrics
    before = metrics(m)
    with LLMClient(url) as c:
        r = c.generate(PROMPT, Sampling(max_tokens=24))
    after = metrics(m)

    def moved(**labels):
        return metric(after, "trtspec_policy_steps_total", **labels) - metric(before, "trtspec_policy_steps_total", **labels)

    passes = r.perf["target_passes"]
    assert passes > 0 and moved(model="tensorrt_llm") >= passes  # (a watchdog probe may add its own)
    assert moved(model="tensorrt_llm", batch="1") >= passes
    assert metric(after, "trtspec_policy_verify_seconds", model="tensorrt_llm", batch="1", draft_len="0") > 0
    assert metric(after, "trtspec_policy_steps_total", model="tensorrt_llm_baseline") == 0
    assert not any(k.startswith("trtspec_policy_") and 'model="tensorrt_llm_baseline"' in k for k in after)


def test_async_client_runs_requests_concurrently(url):
    async def main_():
        async with AsyncLLMClient(url) as c:
            rs = await asyncio.gather(*(c.generate(PROMPT, Sampling(max_tokens=16)) for _ in range(4)))
            return rs

    rs = asyncio.run(main_())
    assert len({tuple(r.token_ids) for r in rs}) == 1
    starts = sorted(r.sent_at for r in rs)
    ends = sorted(r.sent_at + r.latency_s for r in rs)
    assert starts[-1] < ends[0]  # all four were in flight at once


def test_bench_cli_end_to_end(url, tiny_target, tmp_path):
    out = tmp_path / "bench"
    r = CliRunner().invoke(main, ["bench", "--url", url, "--concurrency", "1,2", "--requests", "4",
                                  "--output-len", "8,24", "--warmup", "1", "--tokenizer", str(tiny_target),
                                  "-o", str(out)])
    assert r.exit_code == 0, r.output
    d = json.loads((out / "report.json").read_text())
    assert [lv["concurrency"] for lv in d["levels"]] == [1, 2]
    for lv in d["levels"]:
        spec, base = lv["models"]["speculative"], lv["models"]["baseline"]
        assert spec["requests"] == base["requests"] == 4 and spec["errors"] == base["errors"] == 0
        assert spec["ttft_s"]["p50"] > 0 and spec["output_token_throughput"] > 0
        assert spec["acceptance"]["acceptance_rate"] is not None  # the server's counters arrived
        assert spec["acceptance"]["served_by"] == {"speculative": 4}
        assert base["acceptance"]["acceptance_rate"] is None  # the baseline drafts nothing
        assert lv["speedup"]["output_token_throughput"] > 0
    assert set(d["all_levels"]["by_output_len"]["speculative"]) <= {"<=8", "17-32", "9-16"}
    recs = d["records"]
    assert {(x["role"], x["prompt_index"]) for x in recs if x["role"] == "speculative"} == \
        {("speculative", x["prompt_index"]) for x in recs if x["role"] == "baseline"}  # same prompts
    for f in ("report.md", "latency_cdf.png", "speedup_by_concurrency.png", "acceptance_length_hist.png",
              "speedup_by_output_len.png"):
        assert (out / f).stat().st_size > 1000, f


def test_validate_cli_end_to_end_deploys(url, tiny_models, tmp_path):
    """Greedy equivalence passes; with gates the tiny pair can meet on 2 shared cores, the verdict
    is 'deploy speculative' and the exit code 0."""
    recipe = tiny_recipe(*tiny_models, sampled_check_samples=48,
                         gates={"min_speedup": 0.05, "at_concurrency": 1, "max_mismatch_rate": 0.0,
                                "min_acceptance_rate": 0.0, "latency_tolerance": None})
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    out = tmp_path / "validate"
    r = CliRunner().invoke(main, ["validate", "--url", url, str(path), "-o", str(out)])
    d = json.loads((out / "report.json").read_text())
    assert d["equivalence"]["exact_match_rate"] == 1.0 and d["equivalence"]["prompts_compared"] == 6
    assert d["sampled"]["conclusive"] and d["sampled"]["passed"], d["sampled"]
    assert d["verdict"]["decision"] == "deploy speculative", d["verdict"]
    assert r.exit_code == 0, r.output
    assert "deploy speculative" in r.output
    md = (out / "report.md").read_text()
    assert "## Verdict: **deploy speculative** (exit 0)" in md and "| 0 | identical |" in md
    assert (out / "equivalence.png").stat().st_size > 1000
