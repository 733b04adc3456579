"""Benchmark exports in the field's formats, per (model, load level), beside ``report.json``.

For each model and load level, a folder ``<model>-<load>/`` (e.g. ``ensemble-concurrency4``,
``ensemble_baseline-request_rate2``) with:

* ``profile_export_genai_perf.json`` / ``.csv`` — GenAI-Perf 0.0.16's statistics export: its
  metric names, ms for times, ``avg/min/max/std/p1…p99`` per request metric (numpy's mean,
  linear-interpolation percentiles and population std, as ``genai_perf/metrics/statistics.py``),
  ``unit`` + ``avg`` for the system metrics (throughput, count, goodput), ``input_config``;
* ``profile_export_aiperf.json`` / ``.csv`` — AIPerf's shape where it differs: ICL
  (``inter_chunk_latency``), ``benchmark_duration``, ``total_isl``/``total_osl``,
  ``start_time``/``end_time``, ``error_summary``, ``goodput``/``good_request_count``;
  CSV columns ``avg,min,max,p1…p99,std``;
* ``profile_export.json`` — perf_analyzer's per-request export (``experiments[].requests[]`` with
  ``timestamp`` and ``response_timestamps`` in ns since the epoch, ``request_inputs`` and
  ``response_outputs`` as the Triton service kind), which GenAI-Perf's own parser reads;
* ``profile_export.jsonl`` — AIPerf's per-request records (metadata + metrics + error).

Every file says who wrote it: trtspec's version, the server's name and version, the machine
(``input_config.trtspec`` in the JSON summaries, a last ``Provenance`` section in the CSVs,
top-level ``trtspec`` in the per-request files).
"""

from __future__ import annotations

import csv
import datetime as _dt
import json
import os
import pathlib
import platform
import re
import time
from typing import TYPE_CHECKING

import numpy as np
from trtspec.client.openloop import SLO_METRICS
from trtspec import __version__
from trtspec.client.metrics import json_safe

if TYPE_CHECKING:
    from trtspec.client.loadgen import BenchResult, LevelResult
    from trtspec.client.metrics import RequestRecord

PERCENTILES = (1, 5, 10, 25, 50, 75, 90, 95, 99)
# GenAI-Perf 0.0.16 request metrics in its order (LLMMetrics.request_metrics), with units
GENAI_PERF_REQUEST_METRICS = (
    ("request_latency", "ms"), ("time_to_first_token", "ms"), ("time_to_second_token", "ms"),
    ("inter_token_latency", "ms"), ("output_token_throughput_per_user", "tokens/sec/user"),
    ("output_sequence_length", "tokens"), ("input_sequence_length", "tokens"),
)
# system metrics: unit + avg only (the unit strings of statistics.py, not of the CSV labels)
GENAI_PERF_SYSTEM_METRICS = (("request_throughput", "requests/sec"), ("request_goodput", "requests/sec"),
                             ("request_count", "count"), ("output_token_throughput", "tokens/sec"))
# the CSV's rows, in genai-perf's hard-coded order (LLMMetrics.request_metrics / system_metrics), with
# the units of its labels
GENAI_PERF_CSV_REQUEST = ("time_to_first_token", "time_to_second_token", "request_latency", "inter_token_latency",
                          "output_token_throughput_per_user", "output_sequence_length", "input_sequence_length")
GENAI_PERF_CSV_SYSTEM = (("output_token_throughput", "tokens/sec"), ("request_throughput", "per sec"),
                         ("request_goodput", "per sec"), ("request_count", "count"))
GENAI_PERF_CSV_HEADER = ["Metric", "avg", "min", "max", "p99", "p95", "p90", "p75", "p50", "p25", "p10", "p5", "p1"]
AIPERF_CSV_HEADER = ["Metric", "avg", "min", "max", *(f"p{q}" for q in PERCENTILES), "std"]
# trtspec's SLO names → GenAI-Perf's goodput metric names
_GENAI_SLO = {"ttft": "time_to_first_token", "itl": "inter_token_latency", "latency": "request_latency"}


def stats(values: list[float]) -> dict | None:
    """GenAI-Perf's statistics block (without unit): avg, p1…p99, min, max, std; None if empty."""
    xs = np.asarray([v for v in values if v is not None], dtype=float)
    if xs.size == 0:
        return None
    out = {"avg": float(np.mean(xs))}
    out.update({f"p{q}": float(np.percentile(xs, q)) for q in PERCENTILES})
    out.update({"min": float(np.min(xs)), "max": float(np.max(xs)), "std": float(np.std(xs))})
    return out


def _per_request(r: "RequestRecord") -> dict[str, float | None]:
    """GenAI-Perf's per-request values (ms for times): ITL and tokens/s/user need > 1 response and
    > 1 output token, as its parser."""
    multi = len(r.chunk_t) > 1 and r.osl > 1
    itl = (r.chunk_t[-1] - r.chunk_t[0]) / (r.osl - 1) if multi else None
    return {
        "request_latency": r.latency * 1e3,
        "time_to_first_token": r.ttft * 1e3,
        "time_to_second_token": r.ttst * 1e3 if r.ttst is not None else None,
        "inter_token_latency": itl * 1e3 if itl is not None else None,
        "output_token_throughput_per_user": 1.0 / itl if itl else None,
        "output_sequence_length": float(r.osl),
        "input_sequence_length": float(r.prompt_len) if r.prompt_len is not None else None,
    }


def _good(r: "RequestRecord", slos: tuple[tuple[str, float], ...]) -> bool:

    for name, ms in slos:
        v = getattr(r, SLO_METRICS[name])
        if v is None or v * 1e3 > ms:
            return False
    return True


def genai_perf_stats(records: "list[RequestRecord]", duration_s: float, settling: "list[RequestRecord]" = (),
                     slos: tuple[tuple[str, float], ...] = ()) -> dict:
    """The statistics part of ``profile_export_genai_perf.json`` for one model at one load level.
    Latency distributions over measured requests; throughput over the measured duration with
    every request that ran in it (as ``trtspec bench``)."""
    ok = [r for r in records if r.ok]
    counted = ok + [r for r in settling if r.ok]
    per = [_per_request(r) for r in ok]
    out: dict = {}
    tput = len(counted) / duration_s if duration_s else None
    out["request_throughput"] = {"unit": "requests/sec", "avg": tput}
    out["request_latency"] = {"unit": "ms", **(stats([p["request_latency"] for p in per]) or {})}
    if slos:
        met = sum(_good(r, slos) for r in ok)
        out["request_goodput"] = {"unit": "requests/sec", "avg": met / duration_s if duration_s else None}
    out["request_count"] = {"unit": "count", "avg": len(ok)}
    for name, unit in GENAI_PERF_REQUEST_METRICS[1:]:
        s = stats([p[name] for p in per])
        if s is not None:
            out[name] = {"unit": unit, **s}
        if name == "inter_token_latency":  # the system metric sits here in genai-perf's dict order
            tokens = sum(r.osl for r in counted)
            out["output_token_throughput"] = {"unit": "tokens/sec", "avg": tokens / duration_s if duration_s else None}
    return out


def provenance(result: "BenchResult") -> dict:

    server = result.extra.get("server") or {}
    return {
        "tool": "trtspec", "trtspec_version": __version__,
        "server": {"url": result.url, "name": server.get("name"), "version": server.get("version")},
        "machine": {"hostname": platform.node(), "platform": platform.platform(), "machine": platform.machine(),
                    "processor": platform.processor() or None, "cpus": os.cpu_count()},
        "started": result.started,
    }


def _load_slug(lv: "LevelResult") -> tuple[str, str, float | str]:
    """(folder suffix, perf_analyzer experiment mode, value)."""
    if lv.schedule:
        return "fixed_schedule", "fixed_schedule", "fixed_schedule"
    if lv.request_rate is not None:
        v = "inf" if lv.request_rate == float("inf") else f"{lv.request_rate:g}"
        return f"request_rate{v}", "request_rate", lv.request_rate if v != "inf" else "inf"
    return f"concurrency{lv.concurrency}", "concurrency", lv.concurrency


def _input_config(result: "BenchResult", role: str, model: str, lv: "LevelResult") -> dict:
    s = result.settings
    _, mode, value = _load_slug(lv)
    return {
        "model": [model], "role": role, "service_kind": "triton", "endpoint_type": "kserve",
        "url": result.url, "streaming": s.stream, mode: value, "max_concurrency": s.max_concurrency,
        "burstiness": s.burstiness if mode == "request_rate" else None,
        "output_tokens_mean": s.output_lens[0], "output_tokens_stddev": s.output_len_stddev,
        "synthetic_input_tokens_mean": s.prompt_lens[0] if s.prompt_lens else None,
        "synthetic_input_tokens_stddev": s.prompt_len_stddev, "ignore_eos": s.ignore_eos,
        "goodput": {(_GENAI_SLO.get(_slo(n), n)): ms for n, ms in s.goodput} or None,
        "prompt_source": result.prompt_source,
        "trtspec": provenance(result),
    }


def _slo(name: str) -> str:

    return SLO_METRICS[name]


def _fmt(v) -> str:
    return f"{v:,.2f}" if isinstance(v, (int, float)) else "N/A"


def _label(name: str, unit: str | None) -> str:
    text = name.replace("_", " ").title()
    return f"{text} ({unit})" if unit else text


def _provenance_rows(p: dict) -> list[list[str]]:
    return [["Provenance", "Value"], ["Tool", p["tool"]], ["Trtspec Version", p["trtspec_version"]],
            ["Server", f"{p['server']['name'] or '?'} {p['server']['version'] or '?'} at {p['server']['url']}"],
            ["Machine", f"{p['machine']['hostname']} ({p['machine']['platform']}, {p['machine']['cpus']} CPUs)"],
            ["Started", p["started"]]]


def write_genai_perf_csv(data: dict, path: pathlib.Path, *, streaming: bool = True) -> None:
    """GenAI-Perf 0.0.16's CSV: request metrics (its column order), a blank row, system metrics."""
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(GENAI_PERF_CSV_HEADER)
        units = dict(GENAI_PERF_REQUEST_METRICS)
        for name in GENAI_PERF_CSV_REQUEST:
            unit = units[name]
            if not streaming and name in ("inter_token_latency", "time_to_first_token", "time_to_second_token",
                                          "output_token_throughput_per_user"):
                continue
            m = data.get(name, {})
            w.writerow([_label(name, unit)] + [_fmt(m.get(k)) for k in GENAI_PERF_CSV_HEADER[1:]])
        w.writerow([])
        w.writerow(["Metric", "Value"])
        for name, unit in GENAI_PERF_CSV_SYSTEM:
            if name in data:
                w.writerow([_label(name, unit), _fmt(data[name]["avg"])])
        w.writerow([])
        for row in _provenance_rows(data["input_config"]["trtspec"]):
            w.writerow(row)


def aiperf_data(records: "list[RequestRecord]", gp: dict, lv_windows, duration_s: float, slos,
                input_config: dict) -> dict:
    """AIPerf's ``profile_export_aiperf.json``: GenAI-Perf's blocks plus ICL, duration, totals,
    times and errors."""
    ok = [r for r in records if r.ok]
    data = {k: v for k, v in gp.items() if k != "request_goodput"}
    data["request_count"] = {"unit": "requests", "avg": float(len(ok))}
    icl = stats([x * 1e3 for r in ok for x in r.inter_chunk])
    if icl is not None:
        data["inter_chunk_latency"] = {"unit": "ms", **icl}
    starts = [w.start for w in lv_windows]
    ends = [w.end for w in lv_windows]
    data["benchmark_duration"] = {"unit": "sec", "avg": duration_s}
    data["total_isl"] = {"unit": "tokens", "avg": float(sum(r.prompt_len or 0 for r in ok))}
    data["total_osl"] = {"unit": "tokens", "avg": float(sum(r.osl for r in ok))}
    data["was_cancelled"] = False
    data["start_time"] = _iso(min(starts)) if starts else None
    data["end_time"] = _iso(max(ends)) if ends else None
    errors: dict[str, int] = {}
    for r in records:
        if not r.ok:
            errors[r.error or "no output"] = errors.get(r.error or "no output", 0) + 1
    data["error_summary"] = [{"error_details": {"code": None, "type": msg.split(":")[0], "message": msg}, "count": n}
                             for msg, n in errors.items()]
    good = sum(_good(r, slos) for r in ok) if slos else None
    data["goodput"] = {"unit": "requests/sec", "avg": gp["request_goodput"]["avg"]} if slos else None
    data["good_request_count"] = {"unit": "requests", "avg": float(good)} if slos else None
    data["error_request_count"] = {"unit": "requests", "avg": float(len(records) - len(ok))} if len(records) > len(ok) \
        else None
    data["input_config"] = input_config
    return data


_EPOCH_OFFSET = None


def _epoch_ns(perf_s: float) -> int:
    """A ``time.perf_counter()`` reading as ns since the epoch (one offset per process)."""
    global _EPOCH_OFFSET
    if _EPOCH_OFFSET is None:
        _EPOCH_OFFSET = time.time_ns() - time.perf_counter_ns()
    return int(round(perf_s * 1e9)) + _EPOCH_OFFSET


def _iso(perf_s: float) -> str:
    return _dt.datetime.fromtimestamp(_epoch_ns(perf_s) / 1e9, _dt.timezone.utc).isoformat()


def write_aiperf_csv(data: dict, path: pathlib.Path) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(AIPERF_CSV_HEADER)
        for name in ("request_latency", "time_to_first_token", "time_to_second_token", "inter_token_latency",
                     "inter_chunk_latency", "output_token_throughput_per_user", "output_sequence_length",
                     "input_sequence_length"):
            if name in data and "p50" in data[name]:
                m = data[name]
                w.writerow([_label(name, m["unit"])] + [_fmt(m.get(k)) for k in AIPERF_CSV_HEADER[1:]])
        w.writerow([])
        w.writerow(["Metric", "Value"])
        for name in ("benchmark_duration", "request_throughput", "request_count", "output_token_throughput",
                     "total_isl", "total_osl", "goodput", "good_request_count", "error_request_count"):
            if data.get(name):
                w.writerow([_label(name, data[name]["unit"]), _fmt(data[name]["avg"])])
        w.writerow([])
        for row in _provenance_rows(data["input_config"]["trtspec"]):
            w.writerow(row)


def profile_export(result: "BenchResult", lv: "LevelResult", role: str, model: str) -> dict:
    """perf_analyzer's ``profile_export.json`` for one model at one level (Triton service kind).
    Responses are the chunks that carried output; their text is the streamed delta."""
    _, mode, value = _load_slug(lv)
    prompts = {p.index: p.text for p in result.prompts}
    reqs = []
    for r in lv.records(role):
        if not r.ok:
            continue
        texts = r.chunk_text if r.chunk_text else [""] * len(r.chunk_t)
        reqs.append({
            "timestamp": _epoch_ns(r.start),
            "request_inputs": {"text_input": prompts.get(r.prompt_index, ""), "max_tokens": r.max_tokens,
                               "stream": result.settings.stream},
            "response_timestamps": [_epoch_ns(r.start + t) for t in r.chunk_t],
            "response_outputs": [{"text_output": t} for t in texts],
        })
    ws = [w for w in lv.windows if w.role == role]
    bounds = sorted(x for w in ws for x in (_epoch_ns(w.start), _epoch_ns(w.end)))
    return {"experiments": [{"experiment": {"mode": mode, "value": value}, "requests": reqs,
                             "window_boundaries": [bounds[0], bounds[-1]] if bounds else []}],
            "version": "", "service_kind": "triton", "endpoint": "",
            "trtspec": provenance(result)}


def aiperf_records(result: "BenchResult", lv: "LevelResult", role: str) -> list[dict]:
    """AIPerf's ``profile_export.jsonl`` records: metadata (ns since the epoch), metrics, error."""
    out = []
    for n, r in enumerate(lv.records(role)):
        meta = {"session_num": n, "x_request_id": None, "turn_index": 0, "request_start_ns": _epoch_ns(r.start),
                "request_ack_ns": None, "request_end_ns": _epoch_ns(r.end) if r.end is not None else None,
                "benchmark_phase": "profiling", "was_cancelled": False, "cancellation_time_ns": None}
        if r.ok:
            p = _per_request(r)
            metrics = {k: {"value": v, "unit": u} for k, u in GENAI_PERF_REQUEST_METRICS
                       if (v := p[k]) is not None}
            metrics["inter_chunk_latency"] = {"value": [x * 1e3 for x in r.inter_chunk], "unit": "ms"}
            out.append({"metadata": meta, "metrics": metrics, "error": None})
        else:
            out.append({"metadata": meta, "metrics": None,
                        "error": {"code": None, "type": (r.error or "").split(":")[0], "message": r.error}})
    return out


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)


def write_exports(result: "BenchResult", out: str | os.PathLike) -> dict[str, str]:
    """Every export for every (model, level); returns {name: path relative to ``out``'s parent}."""
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    files: dict[str, str] = {}
    slos = result.settings.goodput
    for lv in result.levels:
        slug, _, _ = _load_slug(lv)
        for role, model in result.settings.roles.items():
            recs = lv.records(role)
            if not recs:
                continue
            d = out / f"{_safe(model)}-{slug}"
            d.mkdir(exist_ok=True)
            gp = genai_perf_stats(recs, lv.duration(role), lv.settling(role), slos)
            cfg = _input_config(result, role, model, lv)
            gp_json = {**gp, "input_config": cfg}
            _write_json(d / "profile_export_genai_perf.json", gp_json)
            write_genai_perf_csv(gp_json, d / "profile_export_genai_perf.csv", streaming=result.settings.stream)
            ai = aiperf_data(recs, gp, [w for w in lv.windows if w.role == role], lv.duration(role), slos, cfg)
            _write_json(d / "profile_export_aiperf.json", ai)
            write_aiperf_csv(ai, d / "profile_export_aiperf.csv")
            _write_json(d / "profile_export.json", profile_export(result, lv, role, model))
            prov = provenance(result)
            with open(d / "profile_export.jsonl", "w") as f:
                for rec in aiperf_records(result, lv, role):
                    f.write(json.dumps({**rec, "trtspec": prov}) + "\n")
            for name in ("profile_export_genai_perf.json", "profile_export_genai_perf.csv", "profile_export_aiperf.json",
                         "profile_export_aiperf.csv", "profile_export.json", "profile_export.jsonl"):
                files[f"{d.name}/{name}"] = str(pathlib.Path(out.name) / d.name / name)
    return files


def _write_json(path: pathlib.Path, data: dict) -> None:

    path.write_text(json.dumps(json_safe(data), indent=2) + "\n")
