"""Prometheus text, read with ``prometheus_client``'s parser (timestamps, escaped labels, exemplars).

A scrape is kept as ``{series: value}`` where a series is written the way Prometheus itself
writes one, ``name{label="value",...}`` with labels sorted and values escaped; that dict goes to
JSON (``server_metrics.json``) and :func:`samples` reads it back with the same parser, so the
report never splits a series string by hand.

Kept families: trtspec's own (``trtspec_``), Triton's (``nv_inference_``, ``nv_gpu_``/``nv_cpu_``
and the LLM token histograms ``nv_llm_``) and NVIDIA's TensorRT-LLM backend (``nv_trt_llm_``).
"""

from __future__ import annotations

import math
import urllib.request
from dataclasses import dataclass

KEEP = ("trtspec_", "nv_inference_", "nv_trt_llm_", "nv_llm_", "nv_gpu_", "nv_cpu_")


@dataclass(frozen=True)
class Sample:
    name: str  # with its _bucket/_sum/_count suffix for histograms
    labels: dict[str, str]
    value: float

    def label(self, key: str, default: str | None = None) -> str | None:
        return self.labels.get(key, default)


def _escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def series(name: str, labels: dict[str, str]) -> str:
    """``name{a="1",b="x"}`` (labels sorted, values escaped as in the exposition format)."""
    if not labels:
        return name
    return name + "{" + ",".join(f'{k}="{_escape(str(v))}"' for k, v in sorted(labels.items())) + "}"


def parse(text: str, keep: tuple[str, ...] | None = KEEP) -> list[Sample]:
    """Every sample of ``text`` (Prometheus exposition format) whose name starts with ``keep``
    (None: all). Malformed text raises ``ValueError`` from the parser."""
    from prometheus_client.parser import text_string_to_metric_families

    out = []
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            name = s.name
            # the parser names counter samples NAME_total (OpenMetrics) even where the server wrote
            # NAME (Triton's nv_inference_* counters): keep the name as exposed, which is what
            # PromQL queries use
            if fam.type == "counter" and name == fam.name + "_total" and not _exposed(text, name):
                name = fam.name
            if keep is None or name.startswith(keep):
                out.append(Sample(name, dict(s.labels), float(s.value)))
    return out


def _exposed(text: str, name: str) -> bool:
    return any(text.startswith(name + c) or f"\n{name}{c}" in text for c in ("{", " "))


def to_dict(samples: list[Sample]) -> dict[str, float]:
    """{series: value}; NaN/inf kept out (JSON has no such numbers)."""
    return {series(s.name, s.labels): s.value for s in samples if math.isfinite(s.value)}


def samples(d: dict[str, float], keep: tuple[str, ...] | None = None) -> list[Sample]:
    """Read a :func:`to_dict` mapping back (series strings parsed by ``prometheus_client``)."""
    return parse("\n".join(f"{k} {float(v)!r}" for k, v in d.items()) + "\n", keep)


def scrape_text(text: str, keep: tuple[str, ...] | None = KEEP) -> dict[str, float]:
    """Prometheus text as {series: value}, filtered to ``keep``."""
    return to_dict(parse(text, keep))


def scrape(url: str, keep: tuple[str, ...] | None = KEEP, timeout_s: float = 5.0) -> dict[str, float]:
    """The server's ``/metrics`` as {series: value}, filtered to ``keep``; {} when unreachable."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as r:
            text = r.read().decode()
    except OSError:
        return {}
    return scrape_text(text, keep)


def by_model(samples_: list[Sample]) -> dict[str, list[Sample]]:
    """Samples grouped by their ``model`` label ("?" when absent)."""
    out: dict[str, list[Sample]] = {}
    for s in samples_:
        out.setdefault(s.labels.get("model", "?"), []).append(s)
    return out


def value(samples_: list[Sample], name: str, **labels: str) -> float | None:
    """The sum of ``name``'s samples whose labels include ``labels`` (None when there is none)."""
    vs = [s.value for s in samples_ if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]
    return sum(vs) if vs else None


def histogram_mean(samples_: list[Sample], name: str) -> float | None:
    """``name``'s mean from its ``_sum`` and ``_count`` samples (None without observations)."""
    n = value(samples_, name + "_count")
    return value(samples_, name + "_sum") / n if n else None


def histogram_quantile(q: float, buckets: list[tuple[float, float]]) -> float | None:
    """Prometheus's ``histogram_quantile``: linear interpolation inside the bucket holding rank
    q·count, over cumulative (upper bound, count) pairs; None when the histogram is empty."""
    bs = sorted(buckets)
    if not bs or bs[-1][1] <= 0:
        return None
    total = bs[-1][1]
    rank = q * total
    lo_bound, lo_count = 0.0, 0.0
    for ub, c in bs:
        if c >= rank:
            if math.isinf(ub):
                return lo_bound  # as Prometheus: the highest finite bound
            if c == lo_count:
                return ub
            return lo_bound + (ub - lo_bound) * (rank - lo_count) / (c - lo_count)
        lo_bound, lo_count = ub, c
    return bs[-1][0]


def buckets(samples_: list[Sample], name: str, **labels: str) -> list[tuple[float, float]]:
    """Cumulative (le, count) of histogram ``name`` (without ``_bucket``), summed over series
    matching ``labels``."""
    acc: dict[float, float] = {}
    for s in samples_:
        if s.name == name + "_bucket" and all(s.labels.get(k) == v for k, v in labels.items()):
            le = float(s.labels["le"])
            acc[le] = acc.get(le, 0.0) + s.value
    return sorted(acc.items())
