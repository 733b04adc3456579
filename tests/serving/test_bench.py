"""Load-generator metrics on synthetic timelines, buckets, reports and plots; CLI bad input (no server)."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
from click.testing import CliRunner

from trtspec.cli import main
from trtspec.client.loadgen import BenchResult, BenchSettings, LevelResult, PromptItem, shape_prompts
from trtspec.client.metrics import (
    OUTPUT_LEN_EDGES,
    PROMPT_LEN_EDGES,
    RequestRecord,
    Window,
    acceptance_summary,
    bucket_label,
    distribution,
    speedups,
    summarize,
)
from trtspec.errors import ConfigError


def rec(chunk_t, chunk_tokens, *, role="speculative", start=100.0, accepted=None, drafted=None, prompt_len=10,
        concurrency=1, al=None):
    return RequestRecord(role=role, model="m", concurrency=concurrency, prompt_index=0, max_tokens=sum(chunk_tokens),
                         start=start, chunk_t=list(chunk_t), chunk_tokens=list(chunk_tokens), prompt_len=prompt_len,
                         accepted=accepted, drafted=drafted, server_acceptance_length=al)


def test_request_metrics_follow_genai_perf_definitions():
    # prefill chunk of 1 token at 100 ms, then three decode chunks of 3, 3 and 2 tokens
    r = rec([0.100, 0.150, 0.200, 0.300], [1, 3, 3, 2])
    assert r.ttft == pytest.approx(0.100)
    assert r.ttst == pytest.approx(0.050)  # a response, not a token
    assert r.latency == pytest.approx(0.300)
    assert r.osl == 9
    assert r.itl == pytest.approx((0.300 - 0.100) / (9 - 1))  # (latency − TTFT) / (OSL − 1)
    assert r.inter_chunk == pytest.approx([0.05, 0.05, 0.10])
    assert r.tps_per_user == pytest.approx(1 / r.itl)
    assert r.chunk_acceptance_length == pytest.approx((9 - 1) / 3)  # decode tokens / decode steps
    assert r.end == pytest.approx(100.3)


def test_single_token_and_failed_requests():
    one = rec([0.1], [1])
    assert one.itl is None and one.ttst is None and one.chunk_acceptance_length is None
    bad = RequestRecord.failed(role="baseline", model="m", concurrency=1, prompt_index=0, max_tokens=8, start=0.0,
                               error="boom")
    s = summarize([one, bad], duration_s=2.0)
    assert s["requests"] == 2 and s["errors"] == 1
    assert s["request_throughput"] == pytest.approx(0.5)
    assert s["output_token_throughput"] == pytest.approx(0.5)
    assert s["itl_s"] == {"n": 0}


def test_summary_throughput_and_percentiles_match_numpy():
    rng = random.Random(0)
    records = []
    for i in range(40):
        n = rng.randint(2, 20)
        t = sorted(rng.uniform(0.01, 2.0) for _ in range(n))
        records.append(rec(t, [rng.randint(1, 4) for _ in range(n)], start=10.0 + i * 0.1))
    s = summarize(records)
    span = max(r.end for r in records) - min(r.start for r in records)  # GenAI-Perf's benchmark duration
    assert s["duration_s"] == pytest.approx(span)
    assert s["output_token_throughput"] == pytest.approx(sum(r.osl for r in records) / span)
    assert s["request_throughput"] == pytest.approx(40 / span)
    lat = [r.latency for r in records]
    for q in (50, 90, 95, 99):
        assert s["request_latency_s"][f"p{q}"] == pytest.approx(np.percentile(lat, q))
    icl = [x for r in records for x in r.inter_chunk]
    assert s["inter_chunk_latency_s"]["n"] == len(icl)
    assert s["inter_chunk_latency_s"]["p95"] == pytest.approx(np.percentile(icl, 95))


def test_acceptance_is_token_weighted_and_proxy_excludes_prefill():
    a = rec([0.1, 0.2, 0.3], [1, 5, 5], accepted=8, drafted=8, al=5.0)  # 2 steps, everything accepted
    b = rec([0.1, 0.2, 0.3, 0.4, 0.5], [1, 1, 1, 1, 1], accepted=0, drafted=16, al=1.0)  # nothing accepted
    s = acceptance_summary([a, b])
    assert s["acceptance_rate"] == pytest.approx(8 / 24)  # Σ accepted / Σ drafted, not a mean of rates
    assert s["acceptance_length_from_chunks"] == pytest.approx((10 + 4) / (2 + 4))
    assert s["acceptance_length"] == pytest.approx((5.0 * 11 + 1.0 * 5) / 16)
    # a server without counters (NVIDIA's zeroed-counter bug, or the baseline) reports None, not 0
    assert acceptance_summary([rec([0.1, 0.2], [1, 2])])["acceptance_rate"] is None


def test_buckets_are_upper_inclusive():
    assert bucket_label(8, OUTPUT_LEN_EDGES) == "<=8"
    assert bucket_label(9, OUTPUT_LEN_EDGES) == "9-16"
    assert bucket_label(64, OUTPUT_LEN_EDGES) == "33-64"  # max_tokens 64 lands with its peers
    assert bucket_label(5000, OUTPUT_LEN_EDGES) == ">1024"
    assert bucket_label(16, PROMPT_LEN_EDGES) == "<=16"
    assert bucket_label(2048, PROMPT_LEN_EDGES) == "1025-2048"


def test_speedups_are_oriented_so_bigger_is_better():
    fast = summarize([rec([0.05, 0.1, 0.15], [1, 4, 4], start=0.0)], duration_s=1.0)
    slow = summarize([rec([0.05, 0.2, 0.4, 0.6, 0.8], [1, 2, 2, 2, 2], role="baseline", start=0.0)], duration_s=2.0)
    x = speedups(fast, slow)
    assert x["output_token_throughput"] == pytest.approx(9 / (9 / 2))
    assert x["request_latency_p50"] == pytest.approx(0.8 / 0.15)
    assert x["itl_p50"] > 1 and x["output_tps_per_user_p50"] > 1
    assert x["ttft_p50"] == pytest.approx(1.0)
    assert distribution([]) == {"n": 0}


def synthetic_bench(levels=(1, 2, 4), seed=0) -> BenchResult:
    """Two models × levels, interleaved windows; speculative emits ~2.5 tokens per chunk."""
    rng = random.Random(seed)
    settings = BenchSettings(concurrency=tuple(levels), requests=12, warmup=0, output_lens=(16, 64))
    out_levels, t = [], 1000.0
    for c in levels:
        windows = []
        for role in ("speculative", "baseline"):
            w = Window(role=role, concurrency=c, start=t, end=0)
            for i in range(12):
                osl = (16, 64)[i % 2]
                step = 0.010 * (1 + 0.15 * (c - 1)) * rng.uniform(0.9, 1.1)
                ts, toks, n, now = [], [], 0, 0.02 * c
                while n < osl:
                    k = 1 if not toks else (min(osl - n, rng.choice([1, 2, 3, 4])) if role == "speculative" else 1)
                    now += step * (1.3 if role == "speculative" and toks else 1)
                    ts.append(now), toks.append(k)
                    n += k
                acc = osl - len(toks) if role == "speculative" else None
                w.requests.append(rec(ts, toks, role=role, start=t + (i // c) * 0.5, concurrency=c,
                                      accepted=acc, drafted=4 * (len(toks) - 1) if role == "speculative" else None,
                                      prompt_len=rng.choice([12, 40, 150]),
                                      al=(osl - 1) / max(1, len(toks) - 1) if role == "speculative" else None))
            w.end = t + 7
            t += 8
            windows.append(w)
        out_levels.append(LevelResult(c, windows))
    prompts = [PromptItem(i, f"p{i}", 10, "tokens") for i in range(4)]
    return BenchResult(url="127.0.0.1:1", settings=settings, prompt_source="builtin:code", prompts=prompts,
                       levels=out_levels, started="2026-01-01T00:00:00+00:00", wall_s=42.0)


def test_bench_result_dict_has_levels_ratios_and_buckets():
    b = synthetic_bench()
    d = b.to_dict()
    assert [lv["concurrency"] for lv in d["levels"]] == [1, 2, 4]
    lv = d["levels"][0]
    assert set(lv["models"]) == {"speculative", "baseline"}
    assert lv["speedup"]["output_token_throughput"] > 1  # fewer, fatter chunks win here
    assert set(lv["by_output_len"]["speculative"]) == {"9-16", "33-64"}
    assert set(lv["by_prompt_len"]["baseline"]) <= {"<=16", "33-64", "129-256"}
    assert d["all_levels"]["speedup_by_output_len"]["33-64"]["output_tps_per_user_p50"] > 1
    assert len(d["records"]) == 3 * 2 * 12
    assert b.speedup(2) == pytest.approx(d["levels"][1]["speedup"]["output_token_throughput"])
    json.dumps(d)  # serialisable as is


def _png(path):
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000, path
    return data


def test_bench_report_writes_json_markdown_and_plots(tmp_path):
    from trtspec.validate.report import write_bench_report

    files = write_bench_report(synthetic_bench(), tmp_path)
    for name in ("latency_cdf.png", "speedup_by_concurrency.png", "acceptance_length_hist.png",
                 "speedup_by_output_len.png"):
        assert name in files.values()
        _png(tmp_path / name)
    d = json.loads((tmp_path / "report.json").read_text())
    assert d["kind"] == "bench" and d["plots"]["latency_cdf"] == "latency_cdf.png"
    md = (tmp_path / "report.md").read_text()
    for heading in ("## Summary by concurrency", "## Speedup: speculative vs baseline", "## Percentiles",
                    "## By prompt length", "## By output length", "![Latency CDFs"):
        assert heading in md


def test_bench_report_without_baseline(tmp_path):
    from trtspec.validate.report import write_bench_report

    b = synthetic_bench(levels=(1,))
    b.settings = BenchSettings(concurrency=(1,), requests=12, baseline_model=None)
    for lv in b.levels:
        lv.windows = [w for w in lv.windows if w.role == "speculative"]
    write_bench_report(b, tmp_path)
    md = (tmp_path / "report.md").read_text()
    assert "Speedup" not in md.split("## Percentiles")[0]
    _png(tmp_path / "speedup_by_output_len.png")


@pytest.mark.parametrize("kwargs, field", [
    ({"concurrency": ()}, "concurrency"),
    ({"concurrency": (0,)}, "concurrency"),
    ({"requests": None}, "requests"),
    ({"requests": 4, "duration_s": 3.0}, "requests"),
    ({"output_lens": (0,)}, "output_lens"),
    ({"prompt_lens": ()}, "prompt_lens"),
    ({"baseline_model": "ensemble"}, "baseline_model"),
])
def test_bench_settings_errors_name_the_field(kwargs, field):
    with pytest.raises(ConfigError, match=field):
        BenchSettings(**kwargs)


def test_shape_prompts_controls_length(tiny_target):
    from trtspec.client.client import load_tokenizer

    prompts = ["def f(x):\n    return x\n", "class A:\n    pass\n", "import os\n"]
    chars = shape_prompts(prompts, [8, 100])
    assert [len(p.text) for p in chars] == [8, 100, 8] and chars[0].unit == "chars"
    assert chars[1].text.startswith(prompts[1]) and prompts[2] in chars[1].text  # continued by the next prompts
    tok = load_tokenizer(str(tiny_target))
    items = shape_prompts(prompts, [5, 40], tok)
    assert items[0].unit == "tokens" and [p.length for p in items] == [5, 40, 5]
    for p in items:  # decode → encode may merge a token at the cut, never more
        assert abs(len(tok(p.text)["input_ids"]) - p.length) <= 1
    measured = shape_prompts(prompts, None, tok)
    assert measured[2].length == len(tok("import os\n")["input_ids"])


# ---- CLI: bad input gives a clear message and a non-zero exit, no traceback


def test_bench_cli_malformed_jsonl(tmp_path):
    bad = tmp_path / "prompts.jsonl"
    bad.write_text('{"text": "def f():"}\n{"text": 1}\nnot json\n')
    r = CliRunner().invoke(main, ["bench", "--url", "127.0.0.1:1", "--prompts", str(bad), "-o", str(tmp_path / "o")])
    assert r.exit_code == 2
    assert "prompts.jsonl:2" in r.output and "'text'" in r.output and "Traceback" not in r.output
    bad.write_text('{"text": "ok"}\n{"text": "unterminated\n')
    r = CliRunner().invoke(main, ["bench", "--url", "127.0.0.1:1", "--prompts", str(bad), "-o", str(tmp_path / "o")])
    assert r.exit_code == 2 and "prompts.jsonl:2" in r.output and "not valid JSON" in r.output


def test_bench_cli_bad_url_and_lists(tmp_path):
    r = CliRunner().invoke(main, ["bench", "--url", "localhost", "-o", str(tmp_path)])
    assert r.exit_code == 2 and "HOST:PORT" in r.output and "Traceback" not in r.output
    r = CliRunner().invoke(main, ["bench", "--url", "127.0.0.1:1", "--concurrency", "1,x", "-o", str(tmp_path)])
    assert r.exit_code == 2 and "comma-separated integers" in r.output


def test_bench_cli_unreachable_server(tmp_path):
    from trtspec.triton.launch.server import free_port

    port = free_port()
    r = CliRunner().invoke(main, ["bench", "--url", f"127.0.0.1:{port}", "--ready-timeout", "0.5",
                                  "-o", str(tmp_path)])
    assert r.exit_code == 4
    assert "no Triton server is reachable" in r.output and "fix:" in r.output and "Traceback" not in r.output
    assert not (tmp_path / "report.json").exists()
