#!/usr/bin/env python
"""trtspec's CPU weight-only kernels (trtspec/speculative/kernels/wo_cpu.cpp) against torch's, on
the matmuls of the Qwen2.5-Coder pair, for 1-4 token rows (a decode step, a verify pass of K+1).

Each kernel runs over enough copies of each weight matrix (different memory, > 3x the last-level
cache) that every call reads its weights from DRAM, as a model's step does; the table gives the
best of 7 rounds in ms per matmul and the weight bytes per second that makes. The same run
measures what this machine's memory streams (a 1 GiB reduction) and the cache-pressure reading of
scripts/bench_engine.py on the tiny target when models/tiny-target exists.

    .venv/bin/python scripts/bench_cpu_kernels.py [--threads 2] [--rows 1,2,3,4]

Writes bench/results/cpu_kernels.{json,md}. Needs an AVX512 CPU for trtspec's column (the bf16 build with
AVX512-BF16, else the fma build: see trtspec/speculative/kernels).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import pathlib
import platform
import sys
import time

import torch

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

# (what, out features, in features, bits): the fused q|k|v and gate|up, o, down and the LM head of
# the 1.5B target (INT4 body, INT8 head), and the 0.5B draft's gate|up and head (INT8 weights)
SHAPES = [
    ("1.5B q|k|v", 2048, 1536, 4), ("1.5B o", 1536, 1536, 4), ("1.5B gate|up", 17920, 1536, 4),
    ("1.5B down", 1536, 8960, 4), ("1.5B LM head", 151936, 1536, 8),
    ("0.5B gate|up", 9728, 896, 8), ("0.5B LM head", 151936, 896, 8),
]
LLC_BYTES = 32 << 20


def dram_gb_s() -> float:
    a = torch.ones(256 << 20)  # 1 GiB of fp32
    a.sum()
    t = time.perf_counter()
    for _ in range(3):
        a.sum()
    return 3 * a.numel() * 4 / (time.perf_counter() - t) / 1e9


def best_ms(fn, x, ws, rounds: int = 7) -> float:
    """ms per call of ``fn(x, w)``: one warm-up pass over the copies ``ws``, then the best of
    ``rounds`` passes, each the mean over every copy (each call reads its weights from DRAM)."""
    for w in ws:
        fn(x, w)
    best = float("inf")
    for _ in range(rounds):
        t = time.perf_counter()
        for w in ws:
            fn(x, w)
        best = min(best, (time.perf_counter() - t) / len(ws))
    return best * 1e3


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rows", default="1,2,3,4")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from trtspec.speculative.kernels import wo_cpu, wo_cpu_status

    ext = wo_cpu()
    if ext is None:
        sys.exit(f"trtspec's CPU kernels do not run here: {wo_cpu_status()}")
    pressure = None
    if (ROOT / "models" / "tiny-target").is_dir():
        from bench_engine import cache_pressure
        from trtspec.speculative.runtime import load_model
        pressure = cache_pressure(load_model(str(ROOT / "models" / "tiny-target"), torch.float32,
                                             torch.device("cpu")), 3)["pressure"]
    bandwidth = dram_gb_s()
    rows_m = [int(m) for m in args.rows.split(",")]
    torch.manual_seed(0)
    table = []
    for what, n, k, bits in SHAPES:
        nbytes = n * k * bits // 8
        copies = max(2, -(-3 * LLC_BYTES // nbytes))
        q = torch.randint(-8, 8, (n, k), dtype=torch.int8) if bits == 4 else torch.randint(-127, 128, (n, k), dtype=torch.int8)
        group = 128 if bits == 4 else k
        scales = torch.rand(n, k // group) * 0.01
        ours = [ext.pack(q, bits) for _ in range(copies)]
        if bits == 4:
            tq = torch.ops.aten._convert_weight_to_int4pack_for_cpu((q.to(torch.int32) + 8).contiguous(), 1)
            sz = torch.stack([scales.to(torch.bfloat16).t(), torch.zeros(k // group, n, dtype=torch.bfloat16)], -1)
            theirs = [tq.clone() for _ in range(copies)]
            sz = sz.contiguous()
            run_theirs = lambda x, w: torch.ops.aten._weight_int4pack_mm_for_cpu(x, w, group, sz)  # noqa: E731
        else:
            s8 = scales[:, 0].to(torch.bfloat16)
            theirs = [q.clone() for _ in range(copies)]
            run_theirs = lambda x, w: torch.ops.aten._weight_int8pack_mm(x, w, s8)  # noqa: E731
        del q
        for m in rows_m:
            x = torch.randn(m, k).to(torch.bfloat16)
            res = {}
            for name, ws, fn in (("trtspec", ours, lambda x, w: ext.mm(x, w, scales, group, bits)),
                                 ("torch", theirs, run_theirs)):
                res[name] = best_ms(fn, x, ws)
            row = {"matmul": what, "shape": f"{n}x{k}", "bits": bits, "rows": m,
                   "trtspec_ms": round(res["trtspec"], 4), "torch_ms": round(res["torch"], 4),
                   "trtspec_gb_s": round(nbytes / res["trtspec"] / 1e6, 1),
                   "torch_gb_s": round(nbytes / res["torch"] / 1e6, 1),
                   "speedup": round(res["torch"] / res["trtspec"], 2)}
            table.append(row)
            print(f"{what:14} M={m}: trtspec {row['trtspec_ms']:.3f} ms ({row['trtspec_gb_s']} GB/s), "
                  f"torch {row['torch_ms']:.3f} ms ({row['torch_gb_s']} GB/s), {row['speedup']:.2f}x", flush=True)
        del ours, theirs

    when = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    summary = {"when": when, "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                                         "threads": args.threads, "torch": torch.__version__},
               "kernel": wo_cpu_status(), "dram_gb_s": round(bandwidth, 1), "cache_pressure": pressure,
               "rows": table}
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "cpu_kernels.json").write_text(json.dumps(summary, indent=2) + "\n")
    md = [f"# trtspec's CPU weight-only kernels vs torch's ({when})", "",
          f"`python scripts/bench_cpu_kernels.py` — {args.threads} threads, weights read from DRAM (each matmul "
          f"cycles through copies > 3x the last-level cache), best of 7 rounds. This machine streams "
          f"{bandwidth:.1f} GB/s (a 1 GiB reduction). Cache pressure (bench_engine.py's reading, 1.0 = "
          f"undisturbed): {pressure if pressure is not None else 'n/a (no models/tiny-target)'}.", "",
          "| matmul | shape | bits | token rows | trtspec ms | GB/s | torch ms | GB/s | speedup |",
          "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in table:
        what = r["matmul"].replace("|", "\\|")  # q|k|v: a | inside a cell ends it
        md.append(f"| {what} | {r['shape']} | {r['bits']} | {r['rows']} | {r['trtspec_ms']:.3f} | "
                  f"{r['trtspec_gb_s']} | {r['torch_ms']:.3f} | {r['torch_gb_s']} | {r['speedup']:.2f}× |")
    (out / "cpu_kernels.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
