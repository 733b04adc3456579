"""The open-loop plot: speculative vs baseline as the request rate rises.

Speculation trades compute for latency: at a low rate the server has idle capacity and the draft
is nearly free, so ITL and request latency fall; as the rate nears what the baseline can serve,
the extra draft and verify work competes with other requests and the gain shrinks (or turns
into a loss). One figure shows it: TTFT and ITL p50 of both models, goodput, and the ratios.
"""

from __future__ import annotations

import math
import pathlib

from trtspec.client.loadgen import BenchResult
from trtspec.validate.plot_style import COLORS, LABELS
from trtspec.validate.plot_style import pyplot as _plt


def _x_labels(levels: list[dict]) -> list[str]:
    out = []
    for lv in levels:
        r = lv.get("request_rate")
        out.append("fixed\nschedule" if r == "fixed schedule" else "all at\nonce" if r is None or (
            isinstance(r, float) and math.isinf(r)) else f"{r:g}/s")
    return out


def speedup_by_load(bench: BenchResult, path: pathlib.Path) -> pathlib.Path:
    plt = _plt()
    d = bench.to_dict(with_records=False)
    levels = d["levels"]
    xs = list(range(len(levels)))
    labels = _x_labels(levels)
    goodput = bool(d["settings"].get("goodput"))
    fig, axes = plt.subplots(1, 4 if goodput else 3, figsize=(16 if goodput else 13, 4.4))
    for ax, key, title in ((axes[0], "ttft_s", "TTFT p50"), (axes[1], "itl_s", "ITL p50 (vLLM's TPOT)")):
        for role in bench.roles:
            ys = [(lv["models"][role][key].get("p50") or math.nan) * 1e3 for lv in levels]
            ax.plot(xs, ys, marker="o", color=COLORS[role], label=LABELS[role], linewidth=2)
        ax.set_xticks(xs, labels)
        ax.set_xlabel("request rate (Poisson arrivals)")
        ax.set_ylabel("ms")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        ax.set_title(title)
    k = 2
    if goodput:
        ax = axes[2]
        slo = ", ".join(f"{n} <= {ms:g} ms" for n, ms in d["settings"]["goodput"])
        for role in bench.roles:
            ys = [lv["models"][role]["goodput"]["fraction"] for lv in levels]
            ax.plot(xs, [math.nan if y is None else y for y in ys], marker="o", color=COLORS[role],
                    label=LABELS[role], linewidth=2)
        ax.set_xticks(xs, labels)
        ax.set_ylim(0, 1.05)
        ax.set_xlabel("request rate")
        ax.set_ylabel("fraction of requests meeting the SLO")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        ax.set_title(f"Goodput ({slo})", fontsize=10)
        k = 3
    ax = axes[k]
    if bench.has_baseline:
        series = [("itl_p50", "ITL p50"), ("request_latency_p50", "request latency p50"), ("ttft_p50", "TTFT p50"),
                  ("output_token_throughput", "output tokens/s")]
        for key, label in series:
            ys = [lv["speedup"].get(key) for lv in levels]
            ax.plot(xs, [math.nan if y is None else y for y in ys], marker="o", label=label, linewidth=1.8)
        ax.axhline(1.0, color="black", linewidth=1)
        ax.set_xticks(xs, labels)
        ax.set_xlabel("request rate")
        ax.set_ylabel("baseline / speculative time (> 1 = speculative better)")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        ax.set_title("Speedup vs load")
    else:
        ax.text(0.5, 0.5, "no baseline model in this run", ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
