"""PNG plots of a bench or validation run (matplotlib, Agg backend: no display needed).

Baseline is always blue, speculative orange; speedup charts draw the 1.0 line (parity) and,
when given, the gate's minimum speedup.
"""

from __future__ import annotations

import math
import pathlib

from trtspec.client.loadgen import BenchResult
from trtspec.client.metrics import OUTPUT_LEN_EDGES, bucket_order
from trtspec.validate.load_plots import speedup_by_load
from trtspec.validate.plot_style import COLORS, LABELS
from trtspec.validate.plot_style import pyplot as _plt


def _ecdf(ax, values: list[float], role: str, scale: float = 1e3) -> None:
    xs = sorted(v * scale for v in values if v is not None)
    if not xs:
        return
    ys = [(i + 1) / len(xs) for i in range(len(xs))]
    ax.step(xs, ys, where="post", color=COLORS[role], label=f"{LABELS[role]} (n={len(xs)})", linewidth=1.8)


def latency_cdfs(bench: BenchResult, path: pathlib.Path, max_levels: int = 4) -> pathlib.Path:
    """Rows: concurrency levels; columns: TTFT, ITL, request latency; one CDF per model."""
    plt = _plt()
    levels = bench.levels
    if len(levels) > max_levels:  # first, last and evenly spaced between
        idx = sorted({round(i * (len(levels) - 1) / (max_levels - 1)) for i in range(max_levels)})
        levels = [levels[i] for i in idx]
    metrics = [("ttft", "time to first token (ms)"), ("itl", "inter-token latency (ms)"),
               ("latency", "request latency (ms)")]
    fig, axes = plt.subplots(len(levels), 3, figsize=(13, 3.2 * len(levels)), squeeze=False)
    for row, lv in enumerate(levels):
        for col, (attr, title) in enumerate(metrics):
            ax = axes[row][col]
            for role in bench.roles:
                _ecdf(ax, [getattr(r, attr) for r in lv.records(role) if r.ok], role)
            ax.set_ylim(0, 1.02)
            ax.grid(alpha=0.3)
            ax.set_xlabel(title)
            if col == 0:
                ax.set_ylabel(f"{lv.load}\nfraction of requests")
            ax.legend(loc="lower right", fontsize=8)
    fig.suptitle("Latency CDFs: baseline vs speculative (left is better)", fontsize=12)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def speedup_by_concurrency(bench: BenchResult, path: pathlib.Path, min_speedup: float | None = None,
                           at_concurrency: int | None = None) -> pathlib.Path:
    """Left: output tokens/s of each model vs concurrency. Right: speedup ratios per level."""
    plt = _plt()
    d = bench.to_dict(with_records=False)
    cs = [lv["concurrency"] for lv in d["levels"]]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 4.8))
    ymax = 1.0
    for role in bench.roles:
        ys = [lv["models"][role]["output_token_throughput"] or 0 for lv in d["levels"]]
        ymax = max(ymax, *ys)
        a1.plot(cs, ys, marker="o", color=COLORS[role], label=LABELS[role], linewidth=2)
    a1.set_xscale("log", base=2)
    a1.set_xticks(cs, [str(c) for c in cs])
    a1.set_xlabel("concurrency (requests in flight)")
    a1.set_ylabel("output tokens/s (all users)")
    a1.set_ylim(0, ymax * 1.15)
    a1.grid(alpha=0.3)
    a1.legend()
    a1.set_title("Output token throughput")
    if bench.has_baseline:
        series = [("output_token_throughput", "output tokens/s"), ("output_tps_per_user_p50", "tokens/s per user p50"),
                  ("request_latency_p50", "request latency p50")]
        width = 0.8 / len(series)
        x = list(range(len(cs)))
        top = 1.0
        for k, (key, label) in enumerate(series):
            vals = [lv["speedup"][key] or 0 for lv in d["levels"]]
            top = max(top, *vals)
            bars = a2.bar([i + (k - (len(series) - 1) / 2) * width for i in x], vals, width, label=label,
                          color=["#2ca02c", "#9467bd", "#8c564b"][k])
            for b, v in zip(bars, vals):
                a2.annotate(f"{v:.2f}", (b.get_x() + b.get_width() / 2, v), ha="center", va="bottom", fontsize=7)
        a2.axhline(1.0, color="black", linewidth=1, label="parity (1.0x)")
        if min_speedup is not None:
            a2.axhline(min_speedup, color="red", linestyle="--", linewidth=1,
                       label=f"gate: >= {min_speedup:.2f}x" + (f" at c={at_concurrency}" if at_concurrency else ""))
            top = max(top, min_speedup)
        a2.set_xticks(x, [str(c) for c in cs])
        _slots(a2, len(cs))
        a2.set_xlabel("concurrency")
        a2.set_ylabel("speculative / baseline (> 1 = speculative better)")
        a2.set_ylim(0, top * 1.15)
        a2.grid(alpha=0.3, axis="y")
        a2.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=3, frameon=False)
        a2.set_title("Speedup by concurrency")
    else:
        a2.text(0.5, 0.5, "no baseline model in this run", ha="center", va="center", transform=a2.transAxes)
        a2.set_axis_off()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def acceptance_histogram(bench: BenchResult, path: pathlib.Path, max_draft_len: int | None = None) -> pathlib.Path:
    """Left: tokens per streamed decode chunk (≈ accepted + 1 per step). Right: per-request
    acceptance length of the speculative model (server-reported, else the chunk proxy)."""
    plt = _plt()
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 4.2))
    per_chunk = {role: [n for r in bench.records(role) if r.ok for n in r.chunk_tokens[1:]] for role in bench.roles}
    hi = max((max(v) for v in per_chunk.values() if v), default=1)
    if max_draft_len:
        hi = max(hi, max_draft_len + 1)
    ks = list(range(1, hi + 1))
    width = 0.8 / len(bench.roles)
    for j, role in enumerate(bench.roles):
        xs = per_chunk[role]
        if xs:
            frac = [sum(1 for n in xs if n == k) / len(xs) for k in ks]
            a1.bar([k + (j - (len(bench.roles) - 1) / 2) * width for k in ks], frac, width, color=COLORS[role],
                   label=f"{LABELS[role]} (mean {sum(xs) / len(xs):.2f}, {len(xs)} chunks)")
    a1.set_xticks(range(1, hi + 1))
    a1.set_xlabel("tokens per decode chunk (one engine step: accepted + 1)")
    a1.set_ylabel("fraction of chunks")
    a1.set_title("Tokens per step (streamed chunks, prefill chunk excluded)")
    a1.grid(alpha=0.3, axis="y")
    a1.legend(fontsize=8, loc="upper center")
    spec = [r for r in bench.records("speculative") if r.ok]
    server = [r.server_acceptance_length for r in spec if r.server_acceptance_length is not None]
    proxy = [r.chunk_acceptance_length for r in spec if r.chunk_acceptance_length is not None]
    vals, src = (server, "server-reported") if server else (proxy, "chunk proxy")
    if vals:
        lo, top = math.floor(min(vals) * 4) / 4, math.ceil(max(vals) * 4) / 4 + 0.25
        nb = max(1, int(round((top - lo) / 0.25)))
        a2.hist(vals, bins=[lo + i * 0.25 for i in range(nb + 1)], color=COLORS["speculative"], alpha=0.8,
                edgecolor="white")
        mean = sum(vals) / len(vals)
        a2.axvline(mean, color="black", linestyle="--", linewidth=1, label=f"mean {mean:.2f}")
        a2.legend(fontsize=8)
    a2.set_xlabel(f"acceptance length: tokens per target pass ({src})")
    a2.set_ylabel("requests")
    a2.set_title(f"Acceptance length per request, speculative (n={len(vals)})")
    a2.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def speedup_by_output_length(bench: BenchResult, path: pathlib.Path) -> pathlib.Path:
    """Per output-length bucket (all levels pooled): per-user tokens/s and latency, spec / baseline."""
    plt = _plt()
    d = bench.to_dict(with_records=False)["all_levels"]
    fig, ax = plt.subplots(figsize=(9, 5))
    sp = d.get("speedup_by_output_len") or {}
    labels = [b for b in bucket_order(OUTPUT_LEN_EDGES) if b in sp]
    if labels:
        x = list(range(len(labels)))
        series = [("output_tps_per_user_p50", "tokens/s per user p50", "#9467bd"),
                  ("request_latency_p50", "request latency p50", "#8c564b")]
        top = 1.0
        for k, (key, name, color) in enumerate(series):
            vals = [sp[b][key] or 0 for b in labels]
            top = max(top, *vals)
            bars = ax.bar([i + (k - 0.5) * 0.38 for i in x], vals, 0.38, label=name, color=color)
            for b, v in zip(bars, vals):
                ax.annotate(f"{v:.2f}", (b.get_x() + b.get_width() / 2, v), ha="center", va="bottom", fontsize=7)
        ax.axhline(1.0, color="black", linewidth=1, label="parity (1.0x)")
        counts = [f"{b}\n(n={sp[b]['requests']['speculative']}/{sp[b]['requests']['baseline']})" for b in labels]
        ax.set_xticks(x, counts, fontsize=8)
        _slots(ax, len(labels))
        ax.set_ylim(0, top * 1.15)
        ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=3, frameon=False)
    else:
        ax.text(0.5, 0.5, "no baseline model in this run", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("output length, tokens (n = speculative/baseline requests)")
    ax.set_ylabel("speculative / baseline (> 1 = speculative better)")
    ax.set_title("Speedup by output length (all concurrency levels)")
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def equivalence_chart(eq, path: pathlib.Path) -> pathlib.Path:
    """Per prompt: tokens that match the baseline before the first divergence, of the total."""
    plt = _plt()
    n = len(eq.prompts)
    fig, ax = plt.subplots(figsize=(9, max(2.5, 0.28 * n + 1.2)))
    for row, p in enumerate(eq.prompts):
        total = max(len(p.baseline), len(p.speculative))
        match = total if p.first_divergence is None else p.first_divergence
        ax.barh(row, total, color="#dddddd", edgecolor="#999999")
        ax.barh(row, match, color="#2ca02c" if p.passed else "#d62728")
        if p.first_divergence is not None:
            ax.annotate(f"diverges at {p.first_divergence}", (match, row), xytext=(4, 0),
                        textcoords="offset points", va="center", fontsize=7)
    if eq.tolerance:
        ax.axvline(eq.tolerance, color="black", linestyle="--", linewidth=1, label=f"tolerance: {eq.tolerance}")
        ax.legend(fontsize=8, loc="lower right")
    ax.set_yticks(range(n), [f"prompt {p.index}" for p in eq.prompts], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel(f"{eq.unit} (green: identical prefix of a passing prompt; red: failing; grey: rest)")
    ax.set_title(f"Greedy equivalence: {sum(p.exact for p in eq.prompts)}/{n} prompts identical "
                 f"(mismatch rate {eq.mismatch_rate:.0%})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _slots(ax, n: int, min_slots: int = 3) -> None:
    """Keep bars slim when there are few groups: centre n groups in at least ``min_slots`` slots."""
    pad = max(0, min_slots - n) / 2
    ax.set_xlim(-0.6 - pad, n - 0.4 + pad)


def bench_plots(bench: BenchResult, out: pathlib.Path, *, min_speedup: float | None = None,
                at_concurrency: int | None = None, max_draft_len: int | None = None) -> dict[str, str]:
    out.mkdir(parents=True, exist_ok=True)
    if bench.settings.open_loop:
        load = {"speedup_by_load": speedup_by_load(bench, out / "speedup_by_load.png")}
    else:
        load = {"speedup_by_concurrency": speedup_by_concurrency(bench, out / "speedup_by_concurrency.png",
                                                                 min_speedup, at_concurrency)}
    files = {
        "latency_cdf": latency_cdfs(bench, out / "latency_cdf.png"),
        **load,
        "acceptance_length_hist": acceptance_histogram(bench, out / "acceptance_length_hist.png", max_draft_len),
        "speedup_by_output_len": speedup_by_output_length(bench, out / "speedup_by_output_len.png"),
    }
    return {k: v.name for k, v in files.items()}
