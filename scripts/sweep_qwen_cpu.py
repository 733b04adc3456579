#!/usr/bin/env python
"""Which lossless configuration of the Qwen2.5-Coder pair decodes fastest on this CPU, and where a
target pass spends its time.

In-process (the torch runtime as a served engine runs it), greedy, batch 1, the same prompts for
every configuration: target format (the unquantized bf16 checkpoint and the ModelOpt exports
``models/<target>-<format>-torch`` that exist), draft (bf16 or INT8 weights), draft length K and
torch threads; plain decoding of each target is the baseline and the reference its speculative
output must equal. Then one torch.profiler pass over a 1-token target step, a (K+1)-token verify
pass and a draft step of the fastest configuration: the top operators by self CPU time.

    .venv/bin/python scripts/sweep_qwen_cpu.py [--ks 1,2,3,4] [--threads 1,2] [--formats none,int4_wo,int4_wo+int8_head]

Needs `trtspec models qwen --out models`; the ModelOpt exports are made once where missing
(``FMT+int8_head``: the LM head in INT8 too, run with ``runtime.batch_invariant``).
Writes bench/results/qwen_cpu_sweep.{json,md}.
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
# the pair, and one request's decode rate, as scripts/bench_vs_llamacpp.py counts them
from bench_vs_llamacpp import DRAFT, HEAD, TARGET, decode_rate, quantized  # noqa: E402


def measure(engine, prompts, max_new: int) -> tuple[float, list[list[int]], float | None]:
    """Decode tokens/s over ``prompts`` (tokens after the first over the time after the first),
    the outputs, and the acceptance rate (None without drafting)."""
    from trtspec.sampling import Sampling
    from trtspec.speculative.stats import Aggregate

    params = Sampling(max_tokens=max_new, ignore_eos=True)
    outs, toks, secs, agg = [], 0, 0.0, Aggregate()
    for p in prompts:
        g = engine.generate([p], params)[0]
        t, sec = decode_rate(g.stats)
        toks, secs = toks + t, secs + sec
        outs.append(list(g.token_ids))
        agg.add(g.stats)
    return toks / secs, outs, (agg.acceptance_rate if agg.drafted else None)


def profile_passes(engine, k: int, rows: int = 12) -> list[dict]:
    from torch.profiler import ProfilerActivity, profile

    from trtspec.speculative.model import Step

    target = engine.target
    ctx = 128
    out = []
    with torch.inference_mode():
        cache = target.new_cache(1, ctx + k + 4)
        target(torch.randint(0, 1000, (1, ctx)), cache, Step([0], [0], ctx), logits="none")
        for label, n in (("target step (1 token)", 1), (f"verify pass ({k + 1} tokens)", k + 1)):
            x = torch.randint(0, 1000, (1, n))
            for _ in range(2):
                target(x, cache, Step([0], [ctx], n))
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                for _ in range(3):
                    target(x, cache, Step([0], [ctx], n))
            total = sum(e.self_cpu_time_total for e in prof.key_averages()) / 3
            for e in sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:rows]:
                out.append({"pass": label, "op": e.key, "self_ms": round(e.self_cpu_time_total / 3 / 1e3, 3),
                            "share": round(e.self_cpu_time_total / 3 / total, 4), "calls": e.count // 3})
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=str(ROOT / "models"))
    ap.add_argument("--formats", default=f"int4_wo{HEAD},int4_wo,none")
    ap.add_argument("--ks", default="1,2,3,4")
    ap.add_argument("--threads", default="2,1")
    ap.add_argument("--drafts", default="int8", help="draft weights: int8 (INT8 kernels), bf16, or both")
    ap.add_argument("--num-prompts", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=40)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = ap.parse_args()

    from transformers import AutoTokenizer

    from trtspec.prompts import load_prompts
    from trtspec.speculative.engine import Engine
    from trtspec.speculative.proposers import DraftModelProposer
    from trtspec.speculative.runtime import load_model

    models = pathlib.Path(args.models)
    if not (models / TARGET).is_dir():
        sys.exit(f"{models / TARGET} not found: run `trtspec models qwen --out {models}` first")
    tok = AutoTokenizer.from_pretrained(models / TARGET)
    prompts = [tok(p, add_special_tokens=False)["input_ids"][:256]
               for p in load_prompts("builtin:code", args.num_prompts)]
    rows = []
    best = None
    drafts = {d: load_model(str(models / DRAFT), torch.bfloat16, torch.device("cpu"),
                            weight_only="int8" if d == "int8" else "none") for d in args.drafts.split(",")}
    for fmt in args.formats.split(","):
        folder = models / TARGET if fmt == "none" else quantized(models, fmt)  # made once where missing
        # FMT+int8_head: the LM head in INT8 too, batch-invariant (the lossless recipe)
        target = load_model(str(folder), torch.bfloat16, torch.device("cpu")).batch_invariant_(fmt.endswith(HEAD))
        for threads in (int(t) for t in args.threads.split(",")):
            torch.set_num_threads(threads)
            plain = Engine(target, None, max_batch_size=1, max_seq_len=1024)
            rate, ref, _ = measure(plain, prompts[:1], 8)  # warm-up
            rate, ref, _ = measure(plain, prompts, args.max_new_tokens)
            row = {"target": fmt if fmt != "none" else "bf16", "draft": "-", "k": 0, "threads": threads,
                   "tok_s": round(rate, 2), "acceptance": None, "equal_to_plain": True}
            rows.append(row)
            print(row, flush=True)
            for dname, draft in drafts.items():
                for k in (int(x) for x in args.ks.split(",")):
                    eng = Engine(target, DraftModelProposer(draft, 1, 1100), max_draft_len=k, max_batch_size=1,
                                 max_seq_len=1024)
                    r, outs, acc = measure(eng, prompts, args.max_new_tokens)
                    row = {"target": fmt if fmt != "none" else "bf16", "draft": dname, "k": k, "threads": threads,
                           "tok_s": round(r, 2), "acceptance": round(acc, 3) if acc is not None else None,
                           "equal_to_plain": outs == ref}
                    rows.append(row)
                    print(row, flush=True)
                    if row["equal_to_plain"] and (best is None or r > best[0]):
                        best = (r, row, eng)
    prof = profile_passes(best[2], best[1]["k"]) if best else []
    result = {"when": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
              "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.platform()}",
              "settings": vars(args), "rows": rows, "fastest": best[1] if best else None, "profile": prof}
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "qwen_cpu_sweep.json").write_text(json.dumps(result, indent=2) + "\n")
    md = [f"# Qwen2.5-Coder 1.5B + 0.5B on CPU: configurations ({result['when']})", "",
          f"`python scripts/sweep_qwen_cpu.py` — in-process torch runtime, greedy, batch 1, {args.num_prompts} code "
          f"prompts × {args.max_new_tokens} tokens (EOS ignored), decode tok/s (after the first token). "
          f"Machine: {result['machine']}.", "",
          "| target | draft | K | torch threads | decode tok/s | acceptance | = its plain decoding |",
          "|---|---|---:|---:|---:|---:|:---:|"]
    for r in rows:
        acc = "" if r["acceptance"] is None else f"{r['acceptance']:.3f}"
        md.append(f"| {r['target']} | {r['draft']} | {r['k']} | {r['threads']} | {r['tok_s']:.2f} | {acc} | "
                  f"{'yes' if r['equal_to_plain'] else 'no'} |")
    if best:
        b = best[1]
        md += ["", f"Fastest speculative configuration: {b['target']} target, {b['draft']} draft, K={b['k']}, "
                   f"{b['threads']} thread(s): {b['tok_s']:.2f} tok/s.", "",
               "Where its passes spend their time (torch.profiler, self CPU time per pass, top operators):", "",
               "| pass | operator | self ms | share | calls |", "|---|---|---:|---:|---:|"]
        for p in prof:
            md.append(f"| {p['pass']} | `{p['op']}` | {p['self_ms']:.2f} | {p['share'] * 100:.0f}% | {p['calls']} |")
    (out / "qwen_cpu_sweep.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
