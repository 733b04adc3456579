#!/usr/bin/env python
"""What one pass of a deployed (ModelOpt-quantized) target costs on this CPU, on trtspec's CPU
kernels and on torch's: a decode step and a verify pass over [B rows, T tokens] (the cost curve the
goodput policy fits, per batch size), the 0.5B draft's one-token step on INT8 weights, and a prefill.

Each kernel choice runs in its own process (``TRTSPEC_CPU_KERNELS`` is read once per process), the
two alternating for ``--rounds`` rounds so that load which comes and goes hits both; the table gives
the least-disturbed reading of each cell (min over rounds of the mean of ``--inner`` passes), the
cache-pressure reading of scripts/bench_engine.py beside it.

    .venv/bin/python scripts/bench_pass_costs.py --target runs/qwen-coder-cpu/quantize/target

``--target``: a torch export of ``trtspec quantize`` (a recipe run's ``quantize/target``, or the
``models/*-torch`` folders scripts/bench_vs_llamacpp.py makes). Writes
bench/results/pass_costs_<kernels>.{json,md}, ``<kernels>`` the build trtspec's kernels ran as here
(bf16 or fma; see trtspec/speculative/kernels).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import pathlib
import platform
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

CHOICES = {"trtspec": "trtspec", "torch": "torch"}  # label -> TRTSPEC_CPU_KERNELS
BATCHES = (1, 2, 4)
CONTEXT = 160  # tokens of context per row before the timed passes (about the recipes' prompts)


def measure(args) -> dict:
    """One round in this process: every cell once per inner pass, least-disturbed kept by the caller."""
    import torch

    from bench_engine import cache_pressure
    from trtspec.speculative.kernels import wo_cpu_status
    from trtspec.speculative.model import Step, load_causal_lm
    from trtspec.speculative.runtime import load_model

    torch.set_num_threads(args.threads)
    cpu = torch.device("cpu")
    target = load_model(args.target, torch.bfloat16, cpu).batch_invariant_(True)
    draft = load_causal_lm(args.draft, dtype=torch.bfloat16).quantize_weight_only_() if args.draft else None
    out: dict = {"kernels": wo_cpu_status(), "cells": {}}
    g = torch.Generator().manual_seed(0)
    rows, T_max = max(BATCHES), args.max_tokens_per_row
    with torch.inference_mode():
        out["pressure"] = cache_pressure(target, 2)["pressure"]
        caches = {"target": target.new_cache(rows, CONTEXT + T_max + 4)}
        ids = torch.randint(0, 20000, (rows, CONTEXT), generator=g)
        target(ids, caches["target"], Step(list(range(rows)), [0] * rows, CONTEXT), logits="none")
        if draft is not None:
            caches["draft"] = draft.new_cache(rows, CONTEXT + 4)
            draft(ids, caches["draft"], Step(list(range(rows)), [0] * rows, CONTEXT), logits="none")
        cells = [("target", B, T) for B in BATCHES for T in range(1, T_max + 1)]
        cells += [("draft", B, 1) for B in BATCHES] if draft is not None else []
        for cell in cells:
            name, B, T = cell
            model = target if name == "target" else draft
            x = torch.randint(0, 20000, (B, T), generator=g)
            step = Step(list(range(B)), [CONTEXT] * B, T)
            model(x, caches[name], step)  # warm-up
            t0 = time.perf_counter()
            for _ in range(args.inner):
                model(x, caches[name], step)
            out["cells"][f"{name} {B}x{T}"] = (time.perf_counter() - t0) / args.inner
        for L in args.prefill:
            cache = target.new_cache(1, L + 4)
            x = torch.randint(0, 20000, (1, L), generator=g)
            t0 = time.perf_counter()
            target(x, cache, Step([0], [0], L), logits="last")
            out["cells"][f"prefill {L}"] = time.perf_counter() - t0
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", required=True, help="a trtspec torch export (quantize/target of a recipe run)")
    ap.add_argument("--draft", default=str(ROOT / "models" / "qwen2.5-coder-0.5b-instruct"),
                    help="a draft checkpoint, timed on INT8 weights ('' to skip)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--inner", type=int, default=3)
    ap.add_argument("--max-tokens-per-row", type=int, default=4, help="T of the verify passes: 1..this (k+1)")
    ap.add_argument("--prefill", default="32,160", help="prompt lengths for the prefill cells")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    ap.add_argument("--one-round", action="store_true", help=argparse.SUPPRESS)  # the child process
    args = ap.parse_args()
    args.prefill = [int(x) for x in str(args.prefill).split(",") if x]
    if args.one_round:
        print(json.dumps(measure(args)))
        return 0
    if not (pathlib.Path(args.target) / "trtspec.json").is_file():
        sys.exit(f"--target {args.target}: not a trtspec export (no trtspec.json); fix: point at a recipe run's "
                 "quantize/target folder")
    runs: dict[str, list[dict]] = {label: [] for label in CHOICES}
    child = [sys.executable, __file__, "--one-round", "--target", args.target, "--draft", args.draft,
             "--threads", str(args.threads), "--inner", str(args.inner),
             "--max-tokens-per-row", str(args.max_tokens_per_row), "--prefill", ",".join(map(str, args.prefill))]
    for r in range(args.rounds):
        for label, env in CHOICES.items():
            p = subprocess.run(child, env={**os.environ, "TRTSPEC_CPU_KERNELS": env}, capture_output=True, text=True)
            if p.returncode:
                sys.exit(f"the {label} round failed:\n{p.stderr[-2000:]}")
            runs[label].append(json.loads(p.stdout.strip().splitlines()[-1]))
            print(f"round {r + 1}/{args.rounds} {label}: {runs[label][-1]['kernels']}", flush=True)
    best = {label: {c: min(run["cells"][c] for run in rs) for c in rs[0]["cells"]} for label, rs in runs.items()}
    ours = runs["trtspec"][0]["kernels"]
    build = "fma" if ", fma " in ours else "bf16" if ", bf16 " in ours else "none"
    one = {label: b["target 1x1"] for label, b in best.items()}
    rows = [{"cell": c, **{f"{label}_ms": round(best[label][c] * 1e3, 2) for label in CHOICES},
             **{f"{label}_vs_step": round(best[label][c] / one[label], 3) for label in CHOICES},
             "speedup": round(best["torch"][c] / best["trtspec"][c], 3)} for c in best["trtspec"]]
    when = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    pressure = [run["pressure"] for rs in runs.values() for run in rs]
    summary = {"when": when, "target": args.target, "draft": args.draft or None, "threads": args.threads,
               "rounds": args.rounds, "inner": args.inner, "context": CONTEXT, "platform": platform.platform(),
               "cpu": _cpu_name(), "kernels": {label: rs[0]["kernels"] for label, rs in runs.items()},
               "cache_pressure": pressure, "rows": rows}
    md = [f"# One pass of the deployed target: trtspec's CPU kernels ({build}) vs torch's ({when})", "",
          f"`python scripts/bench_pass_costs.py --target {args.target}` — {summary['cpu']}, {args.threads} threads; "
          f"after {CONTEXT} tokens of context per row; least-disturbed of {args.rounds} rounds (mean of {args.inner} "
          f"passes each), the two kernel choices in alternating processes. Cache pressure (1.0 = undisturbed): "
          + ", ".join(f"{p:.2f}" for p in pressure) + ".", "",
          f"trtspec: {summary['kernels']['trtspec']}.  ",
          f"torch: {summary['kernels']['torch']}.", "",
          "| pass [B rows x T tokens] | trtspec ms | × its 1x1 step | torch ms | × its 1x1 step | speedup |",
          "|---|---:|---:|---:|---:|---:|"]
    md += [f"| {r['cell']} | {r['trtspec_ms']} | {r['trtspec_vs_step']} | {r['torch_ms']} | {r['torch_vs_step']} | "
           f"{r['speedup']:.2f}× |" for r in rows]
    md += ["", "A verify pass of k draft tokens is T = k + 1; the goodput policy (trtspec/speculative/goodput.py) "
           "fits its cost line to passes like these, live, at the batch size it sees.", ""]
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"pass_costs_{build}.json").write_text(json.dumps(summary, indent=2) + "\n")
    (out / f"pass_costs_{build}.md").write_text("\n".join(md))
    print("\n".join(md))
    return 0


def _cpu_name() -> str:
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()} ({os.cpu_count()} CPUs)"
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


if __name__ == "__main__":
    sys.exit(main())
