"""Prometheus text through prometheus_client's parser, and the report's server-side rows from
TensorRT-LLM's series (a scrape written after NVIDIA's documented metric names) or trtspec's."""

from __future__ import annotations

import pathlib

import pytest

from trtspec.client import prom
from trtspec.validate.engine_metrics import engine_rows

FIXTURE = pathlib.Path(__file__).resolve().parents[1] / "golden" / "metrics" / "trtllm_triton.prom"
ROLES = {"speculative": "tensorrt_llm", "baseline": "tensorrt_llm_baseline"}


def test_parser_keeps_our_families_reads_timestamps_and_escapes():
    text = FIXTURE.read_text()
    ss = prom.parse(text)
    names = {s.name for s in ss}
    assert "process_cpu_seconds_total" not in names  # not a kept family
    assert {"nv_trt_llm_request_metrics", "nv_trt_llm_kv_cache_block_metrics", "nv_inference_queue_duration_us",
            "nv_llm_output_token_len_bucket"} <= names
    # a line with a timestamp: the value is the value, not the timestamp
    assert prom.value(ss, "nv_inference_queue_duration_us", model="tensorrt_llm") == 3_000_000
    assert prom.value(ss, "nv_trt_llm_general_metrics", general_type="iteration_counter") == 1711
    # an escaped label value survives the trip to JSON keys and back
    everything = prom.parse(text, keep=None)
    d = prom.to_dict(everything)
    back = prom.samples(d)
    cpu = [s for s in back if s.name == "process_cpu_seconds_total"]
    assert cpu and cpu[0].labels["note"] == 'a "quoted" value' and cpu[0].value == 12.5
    assert len(back) == len(everything)


def test_malformed_text_is_an_error():
    with pytest.raises(ValueError):
        prom.parse('nv_inference_request_success{model="x" 1\n')


def test_histogram_quantile_interpolates_like_prometheus():
    ss = prom.parse(FIXTURE.read_text())
    b = prom.buckets(ss, "nv_inference_first_response_histogram_ms", model="ensemble")
    assert [c for _, c in b] == [0, 40, 200, 200, 200]
    # rank 100 of 200 falls in (500, 2000] holding ranks 40..200: 500 + 1500 · 60/160
    assert prom.histogram_quantile(0.5, b) == pytest.approx(500 + 1500 * 60 / 160)
    assert prom.histogram_quantile(0.1, b) == pytest.approx(100 + 400 * 20 / 40)
    assert prom.histogram_quantile(0.5, []) is None


def test_report_rows_come_from_trtllm_series_when_present():
    rows = {r.question: r for r in engine_rows(prom.scrape_text(FIXTURE.read_text()), ROLES)}
    kv = rows["KV cache blocks used / max"]
    assert kv.source == "nv_trt_llm_kv_cache_block_metrics"
    assert kv.speculative == "300 / 1200 blocks (25.0%), 64 tokens/block"
    assert kv.baseline.startswith("150 / 1600 blocks (9.4%)")  # no "fraction" series: used / max
    gpu = rows["memory (gpu, TensorRT-LLM runtime)"]
    assert (gpu.baseline, gpu.speculative) == ("1024 MiB", "2048 MiB")
    q = rows["queue delay per request"]
    assert (q.baseline, q.speculative) == ("5.0 ms", "15.0 ms")  # queue µs / successful requests
    assert q.source.startswith("nv_inference_queue_duration_us")
    assert rows["requests waiting / active (at the scrape)"].speculative == "2 / 6"
    # TRT-LLM's backend has no speculative-decoding family: said, not left blank
    assert rows["draft compute time per request"].source == "none"
    assert "no speculative-decoding metric family" in rows["draft compute time per request"].note


def test_report_rows_fall_back_to_trtspec_series():
    text = "\n".join([
        '# TYPE trtspec_draft_seconds histogram',
        'trtspec_draft_seconds_bucket{model="tensorrt_llm",version="1",le="+Inf"} 4',
        'trtspec_draft_seconds_sum{model="tensorrt_llm",version="1"} 0.2',
        'trtspec_draft_seconds_count{model="tensorrt_llm",version="1"} 4',
        '# TYPE trtspec_resident_memory_bytes gauge',
        'trtspec_resident_memory_bytes{model="tensorrt_llm",version="1"} 104857600',
        'trtspec_resident_memory_bytes{model="tensorrt_llm_baseline",version="1"} 52428800',
    ]) + "\n"
    rows = {r.question: r for r in engine_rows(prom.scrape_text(text), ROLES)}
    assert rows["draft compute time per request"].speculative == "50.0 ms"
    assert rows["draft compute time per request"].source == "trtspec_draft_seconds"
    mem = rows["memory (resident, engine process)"]
    assert (mem.baseline, mem.speculative, mem.source) == ("50 MiB", "100 MiB", "trtspec_resident_memory_bytes")
    assert "KV cache blocks used / max" not in rows
    assert engine_rows({}, ROLES) == []
