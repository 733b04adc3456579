"""The run report's server-side rows (draft, verify, queue, memory, KV cache), from whichever
series the deployment exports.

* NVIDIA's TensorRT-LLM backend (``inflight_batcher_llm/src/custom_metrics_reporter``):
  ``nv_trt_llm_request_metrics{request_type}``, ``nv_trt_llm_runtime_memory_metrics{memory_type}``,
  ``nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type}``, ``nv_trt_llm_general_metrics``, … —
  gauges sampled by the backend at each scrape. It has **no speculative-decoding family**, so
  draft and verify time come only from trtspec's torch runtime.
* Triton itself (any backend): ``nv_inference_queue_duration_us`` / ``nv_inference_request_success``
  per model, the scheduler queue per request.
* trtspec's torch runtime: ``trtspec_draft_seconds``, ``trtspec_verify_seconds``,
  ``trtspec_queue_seconds`` (per-request histograms) and ``trtspec_resident_memory_bytes``.

TRT-LLM's series win where both exist (they describe the engine that serves); every row says
which series it came from.
"""

from __future__ import annotations

from dataclasses import dataclass

from trtspec.client.prom import Sample, by_model, histogram_mean, samples, value


@dataclass(frozen=True)
class EngineRow:
    question: str
    baseline: str
    speculative: str
    note: str
    source: str  # "nv_trt_llm" | "nv_inference" | "trtspec" | "none"

    def as_tuple(self) -> tuple[str, str, str, str]:
        return self.question, self.baseline, self.speculative, f"{self.note} ({self.source})" if self.source != "none" \
            else self.note


def _fmt(v: float | None, fmt: str) -> str:
    return "–" if v is None else fmt.format(v)


def _ms(v: float | None) -> str:
    return _fmt(None if v is None else v * 1e3, "{:.1f} ms")


def _mib(v: float | None) -> str:
    return _fmt(None if v is None else v / 2**20, "{:.0f} MiB")


def has_trtllm(ss: list[Sample]) -> bool:
    return any(s.name.startswith("nv_trt_llm_") for s in ss)


def _queue(ss: list[Sample]) -> tuple[float | None, str]:
    if (v := histogram_mean(ss, "trtspec_queue_seconds")) is not None:
        return v, "trtspec_queue_seconds"
    n = value(ss, "nv_inference_request_success")
    q = value(ss, "nv_inference_queue_duration_us")
    if n and q is not None:
        return q / n / 1e6, "nv_inference_queue_duration_us / nv_inference_request_success"
    return None, ""


def engine_rows(metrics: dict[str, float], roles: dict[str, str]) -> list[EngineRow]:
    """Rows for the report's "numbers" table. ``metrics``: a scrape (``{series: value}``);
    ``roles``: {"speculative": engine model name, "baseline": ...}."""
    models = by_model(samples(metrics))
    spec, base = models.get(roles.get("speculative", ""), []), models.get(roles.get("baseline", ""), [])
    if not spec and not base:
        return []
    rows: list[EngineRow] = []
    trtllm = has_trtllm(spec + base)

    # draft / verify: only trtspec's runtime measures them
    for q, name, note in (("draft compute time per request", "trtspec_draft_seconds", "server-side, mean"),
                          ("target verification time per request", "trtspec_verify_seconds",
                           "baseline: ordinary decode steps; speculative: verify passes")):
        b, s = histogram_mean(base, name), histogram_mean(spec, name)
        if b is not None or s is not None:
            rows.append(EngineRow(q, _ms(b), _ms(s), note, name))
        elif trtllm:
            rows.append(EngineRow(q, "–", "–", "not exported: TensorRT-LLM's Triton backend has no "
                                  "speculative-decoding metric family", "none"))

    # queue
    (bq, bsrc), (sq, ssrc) = _queue(base), _queue(spec)
    if bq is not None or sq is not None:
        rows.append(EngineRow("queue delay per request", _ms(bq), _ms(sq), "submission → start, mean",
                              ssrc or bsrc))
    if trtllm:
        bw = value(base, "nv_trt_llm_request_metrics", request_type="waiting")
        sw = value(spec, "nv_trt_llm_request_metrics", request_type="waiting")
        ba = value(base, "nv_trt_llm_request_metrics", request_type="active")
        sa = value(spec, "nv_trt_llm_request_metrics", request_type="active")
        if bw is not None or sw is not None or ba is not None or sa is not None:
            rows.append(EngineRow("requests waiting / active (at the scrape)",
                                  f"{_fmt(bw, '{:.0f}')} / {_fmt(ba, '{:.0f}')}",
                                  f"{_fmt(sw, '{:.0f}')} / {_fmt(sa, '{:.0f}')}", "gauge",
                                  "nv_trt_llm_request_metrics"))

    # memory
    if trtllm and any(s.name == "nv_trt_llm_runtime_memory_metrics" for s in spec + base):
        for kind in ("gpu", "cpu", "pinned"):
            b = value(base, "nv_trt_llm_runtime_memory_metrics", memory_type=kind)
            s = value(spec, "nv_trt_llm_runtime_memory_metrics", memory_type=kind)
            if b is not None or s is not None:
                rows.append(EngineRow(f"memory ({kind}, TensorRT-LLM runtime)", _mib(b), _mib(s),
                                      "the draft engine's weights and KV cache count on the speculative side",
                                      "nv_trt_llm_runtime_memory_metrics"))
    else:
        b, s = value(base, "trtspec_resident_memory_bytes"), value(spec, "trtspec_resident_memory_bytes")
        if b is not None or s is not None:
            rows.append(EngineRow("memory (resident, engine process)", _mib(b), _mib(s),
                                  "the draft's weights and KV cache live in the speculative process",
                                  "trtspec_resident_memory_bytes"))

    # KV cache
    if trtllm:
        def kv(ss: list[Sample]) -> str:
            used = value(ss, "nv_trt_llm_kv_cache_block_metrics", kv_cache_block_type="used")
            mx = value(ss, "nv_trt_llm_kv_cache_block_metrics", kv_cache_block_type="max")
            frac = value(ss, "nv_trt_llm_kv_cache_block_metrics", kv_cache_block_type="fraction")
            tpb = value(ss, "nv_trt_llm_kv_cache_block_metrics", kv_cache_block_type="tokens_per")
            if used is None and mx is None:
                return "–"
            if frac is None and used is not None and mx:
                frac = used / mx
            return (f"{_fmt(used, '{:.0f}')} / {_fmt(mx, '{:.0f}')} blocks ({_fmt(frac, '{:.1%}')})"
                    + (f", {tpb:.0f} tokens/block" if tpb else ""))

        b, s = kv(base), kv(spec)
        if b != "–" or s != "–":
            rows.append(EngineRow("KV cache blocks used / max", b, s, "at the scrape",
                                  "nv_trt_llm_kv_cache_block_metrics"))
    return rows
