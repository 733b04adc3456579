#!/usr/bin/env python
"""A verify pass that costs about one read of the weights: a PROTOTYPE AMX-BF16 kernel
(scripts/prototypes/amx_int4_verify.cpp, not used by trtspec) against trtspec's AVX512-BF16 kernel,
on the INT4 matmuls of the Qwen2.5-Coder 1.5B target, for 1-16 token rows (a decode step is 1, a
verify pass at max_draft_len k is k+1 per request in the batch).

Each kernel cycles through copies of each weight matrix (> 3x the last-level cache, as
scripts/bench_cpu_kernels.py), so every call reads its weights from DRAM as a model's step does;
best of 7 rounds, the two kernels interleaved row count by row count. Also checked: each token
row's output is the same bits for every M (batch invariance: what keeps speculation lossless), and
the largest difference from trtspec's kernel, relative to its largest output.

    .venv/bin/python scripts/bench_amx_verify.py [--threads 2] [--rows 1,2,3,4,5,8,16]

Writes bench/results/amx_verify.{json,md}. Needs a CPU with AMX-BF16 (Sapphire Rapids and later) and
trtspec's bf16 kernel build; exits 2 with the reason elsewhere.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import pathlib
import platform
import sys

import torch

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from bench_cpu_kernels import LLC_BYTES, best_ms, dram_gb_s  # noqa: E402

SHAPES = [("1.5B q|k|v", 2048, 1536), ("1.5B o", 1536, 1536), ("1.5B gate|up", 17920, 1536), ("1.5B down", 1536, 8960)]
# how many of each matmul one decoder layer runs (all four once): 28 layers make the body's step
LAYERS = 28


def build():
    from torch.utils.cpp_extension import load

    from trtspec.speculative.kernels import cache_dir

    out = cache_dir() / "amx_prototype"
    out.mkdir(parents=True, exist_ok=True)
    return load("trtspec_amx_int4_prototype", [str(ROOT / "scripts" / "prototypes" / "amx_int4_verify.cpp")],
                extra_cflags=["-O3", "-mavx512f", "-mavx512bw", "-mavx512bf16", "-mamx-tile", "-mamx-bf16"],
                build_directory=str(out), verbose=False)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rows", default="1,2,3,4,5,8,16")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = ap.parse_args()
    rows_m = [int(m) for m in args.rows.split(",")]
    if not rows_m or min(rows_m) < 1 or max(rows_m) > 16:
        ap.error(f"--rows {args.rows}: token rows 1..16 (one AMX tile holds 16), e.g. --rows 1,2,4,5,8,16")
    torch.set_num_threads(args.threads)

    from trtspec.speculative.kernels import cpu_flags, wo_cpu, wo_cpu_status

    if "amx_bf16" not in cpu_flags():
        print("this CPU has no AMX-BF16 (amx_bf16 in /proc/cpuinfo): nothing to measure", file=sys.stderr)
        return 2
    ext = wo_cpu()
    if ext is None or "bf16" not in (wo_cpu_status() or ""):
        print(f"trtspec's bf16 kernel build does not run here: {wo_cpu_status()}", file=sys.stderr)
        return 2
    amx = build()
    bandwidth = dram_gb_s()
    torch.manual_seed(0)
    table, body = [], {m: {"avx512bf16": 0.0, "amx": 0.0} for m in rows_m}
    for what, n, k in SHAPES:
        nbytes = n * k // 2
        copies = max(2, -(-3 * LLC_BYTES // nbytes))
        q = torch.randint(-8, 8, (n, k), dtype=torch.int8)
        scales = torch.rand(n, k // 128) * 0.02
        ours = [ext.pack(q, 4) for _ in range(copies)]
        proto = [amx.pack_amx(q) for _ in range(copies)]
        x16 = torch.randn(16, k).to(torch.bfloat16)
        full = amx.mm_amx(x16, proto[0], scales)
        ref = ext.mm(x16, ours[0], scales, 128, 4).float()
        invariant = all(torch.equal(amx.mm_amx(x16[:m].contiguous(), proto[0], scales), full[:m]) for m in range(1, 17))
        rel = ((full.float() - ref).abs().max() / ref.abs().max()).item()
        base = None
        for m in rows_m:
            x = x16[:m].contiguous()
            t_ours = best_ms(lambda x, w: ext.mm(x, w, scales, 128, 4), x, ours)
            t_amx = best_ms(lambda x, w: amx.mm_amx(x, w, scales), x, proto)
            base = base or t_ours
            row = {"matmul": what, "shape": f"{n}x{k}", "rows": m, "avx512bf16_ms": round(t_ours, 4),
                   "amx_ms": round(t_amx, 4), "avx512bf16_vs_1_row": round(t_ours / base, 2),
                   "amx_vs_avx512bf16_1_row": round(t_amx / base, 2), "batch_invariant": invariant,
                   "max_rel_diff": float(f"{rel:.1e}")}
            table.append(row)
            body[m]["avx512bf16"] += LAYERS * t_ours
            body[m]["amx"] += LAYERS * t_amx
            print(f"{what:14} M={m:2}: avx512bf16 {t_ours:.3f} ms ({row['avx512bf16_vs_1_row']}x), "
                  f"amx {t_amx:.3f} ms ({row['amx_vs_avx512bf16_1_row']}x)", flush=True)
        del ours, proto

    when = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    b1 = body[rows_m[0]]["avx512bf16"]
    summary = {"when": when, "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                                         "threads": args.threads, "torch": torch.__version__},
               "kernel": wo_cpu_status(), "dram_gb_s": round(bandwidth, 1), "load_average": os.getloadavg(),
               "rows": table, "body_ms": {str(m): {k: round(v, 2) for k, v in c.items()} for m, c in body.items()}}
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "amx_verify.json").write_text(json.dumps(summary, indent=2) + "\n")
    md = [f"# A verify pass at about one read of the weights: AMX-BF16 prototype vs trtspec's AVX512-BF16 kernel ({when})", "",
          f"`python scripts/bench_amx_verify.py` — {args.threads} threads, INT4 weights (blocks of 128) read from DRAM "
          f"(copies > 3x the last-level cache), best of 7 rounds. This machine streams {bandwidth:.1f} GB/s; load "
          f"average {os.getloadavg()[0]:.1f} at the end. The prototype (scripts/prototypes/amx_int4_verify.cpp) is not "
          "used by trtspec: its numerics differ from the AVX512-BF16 kernel's (last column), so plain and "
          "speculative decoding must both use it to stay bit-identical.", "",
          "## The Qwen 1.5B target's decoder body (28 layers x q|k|v, o, gate|up, down), ms per pass", "",
          "| token rows | AVX512-BF16 | vs 1 row | AMX prototype | vs AVX512-BF16 at 1 row |", "|---:|---:|---:|---:|---:|"]
    for m in rows_m:
        c = body[m]
        md.append(f"| {m} | {c['avx512bf16']:.2f} | {c['avx512bf16'] / b1:.2f}× | {c['amx']:.2f} | {c['amx'] / b1:.2f}× |")
    md += ["", "## Per matmul", "",
           "| matmul | shape | token rows | AVX512-BF16 ms | vs its 1 row | AMX ms | vs AVX512-BF16 at 1 row | AMX batch-invariant | max rel. diff |",
           "|---|---|---:|---:|---:|---:|---:|---|---:|"]
    for r in table:
        what = r["matmul"].replace("|", "\\|")
        md.append(f"| {what} | {r['shape']} | {r['rows']} | {r['avx512bf16_ms']:.3f} | {r['avx512bf16_vs_1_row']:.2f}× | "
                  f"{r['amx_ms']:.3f} | {r['amx_vs_avx512bf16_1_row']:.2f}× | {r['batch_invariant']} | {r['max_rel_diff']:.1e} |")
    (out / "amx_verify.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
