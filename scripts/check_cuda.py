#!/usr/bin/env python
"""The torch runtime on a CUDA GPU: greedy equivalence and speed of speculative decoding on the
tiny pair, the device check a session with a lent GPU runs (CI has none).

For each dtype (float32, bfloat16; bfloat16 also with ``batch_invariant``) and batch size (1, 4):
plain greedy decoding and draft-target speculation (K=4) of the same prompts with the Engine,
token for token compared, and their decode rates (generated tokens over wall time, after a
warm-up). The float32 CUDA plain output is also compared with float32 plain decoding on the CPU.
Needs torch with CUDA, transformers (the tokenizer) and the trained tiny pair under --models; no
pydantic, ModelOpt or Triton (the engine's modules import none of them).

    python scripts/check_cuda.py --models models --out $OUT

Writes OUT/cuda_check.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PROMPTS = [
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "import os\n\ndef main():\n",
    "class Stack:\n    def __init__(self):\n",
    "def add(a, b):\n    return",
    "for i in range(10):\n    print(",
    "import json\n\ndef load(path):\n    with open(path) as f:\n",
    "def is_prime(n):\n    if n < 2:\n",
    "class Node:\n    def __init__(self, value, next=None):\n",
]


def run(target, draft, prompts, *, batch: int, max_tokens: int, k: int, device):
    from trtspec.sampling import Sampling
    from trtspec.speculative.engine import Engine
    from trtspec.speculative.proposers import DraftModelProposer

    import torch

    params = Sampling(max_tokens=max_tokens, ignore_eos=True)
    max_len = max(len(p) for p in prompts) + max_tokens + 8

    def engine(spec: bool):
        prop = DraftModelProposer(draft, batch, max_len + k + 4) if spec else None
        return Engine(target, prop, max_draft_len=k, max_batch_size=batch, max_seq_len=max_len)

    out = {}
    for name, spec in (("plain", False), ("speculative", True)):
        eng = engine(spec)
        eng.generate(prompts[:batch], Sampling(max_tokens=8, ignore_eos=True))  # warm-up
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        gens = []
        for i in range(0, len(prompts), batch):
            gens += eng.generate(prompts[i : i + batch], params)
        if device.type == "cuda":
            torch.cuda.synchronize()
        secs = time.perf_counter() - t0
        toks = sum(len(g.token_ids) for g in gens)
        drafted = sum(g.stats.drafted for g in gens)
        out[name] = {"tok_s": toks / secs, "outputs": [list(g.token_ids) for g in gens],
                     "acceptance": sum(g.stats.accepted for g in gens) / drafted if drafted else None}
    same = sum(a == b for a, b in zip(out["plain"]["outputs"], out["speculative"]["outputs"]))
    return out, same


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=str(ROOT / "models"))
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--k", type=int, default=4)
    args = ap.parse_args()

    import torch
    from transformers import AutoTokenizer

    from trtspec.speculative.model import load_causal_lm

    if not torch.cuda.is_available():
        sys.exit("no CUDA device: this check needs a GPU")
    dev = torch.device("cuda")
    models = pathlib.Path(args.models)
    tok = AutoTokenizer.from_pretrained(str(models / "tiny-target"))
    prompts = [tok(p, add_special_tokens=False)["input_ids"] for p in PROMPTS]
    rows, cpu_ref = [], None
    for dtype_name, invariant in (("float32", False), ("bfloat16", False), ("bfloat16", True)):
        dtype = getattr(torch, dtype_name)
        target = load_causal_lm(models / "tiny-target", dtype=dtype, device=dev).fuse_().batch_invariant_(invariant)
        draft = load_causal_lm(models / "tiny-draft", dtype=dtype, device=dev).fuse_()
        for batch in (1, 4):
            res, same = run(target, draft, prompts, batch=batch, max_tokens=args.max_tokens, k=args.k, device=dev)
            row = {"dtype": dtype_name, "batch_invariant": invariant, "batch": batch,
                   "plain_tok_s": round(res["plain"]["tok_s"], 1), "speculative_tok_s": round(res["speculative"]["tok_s"], 1),
                   "speedup": round(res["speculative"]["tok_s"] / res["plain"]["tok_s"], 3),
                   "acceptance": round(res["speculative"]["acceptance"], 3),
                   "identical": f"{same}/{len(prompts)}"}
            if dtype_name == "float32" and batch == 1:
                if cpu_ref is None:
                    cpu_t = load_causal_lm(models / "tiny-target", dtype=torch.float32, device="cpu").fuse_()
                    cpu_d = load_causal_lm(models / "tiny-draft", dtype=torch.float32, device="cpu").fuse_()
                    cpu_ref, _ = run(cpu_t, cpu_d, prompts, batch=1, max_tokens=args.max_tokens, k=args.k,
                                     device=torch.device("cpu"))
                row["cuda_plain_equals_cpu_plain"] = (
                    f"{sum(a == b for a, b in zip(res['plain']['outputs'], cpu_ref['plain']['outputs']))}/{len(prompts)}")
            rows.append(row)
            print(row, flush=True)
    info = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "cuda": torch.version.cuda,
            "prompts": len(prompts), "max_tokens": args.max_tokens, "k": args.k, "rows": rows}
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "cuda_check.json").write_text(json.dumps(info, indent=2) + "\n")
    md = [f"# The torch runtime on {info['gpu']} (torch {info['torch']}, CUDA {info['cuda']})", "",
          f"`python scripts/check_cuda.py`: the tiny pair, {len(prompts)} prompts × {args.max_tokens} tokens, "
          f"greedy, K={args.k}; tokens/s = generated tokens / wall time after a warm-up.", "",
          "| dtype | batch-invariant | batch | plain tok/s | speculative tok/s | speedup | acceptance | "
          "speculative = plain | CUDA fp32 plain = CPU fp32 plain |", "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        md.append(f"| {r['dtype']} | {'yes' if r['batch_invariant'] else 'no'} | {r['batch']} | {r['plain_tok_s']} | "
                  f"{r['speculative_tok_s']} | {r['speedup']}× | {r['acceptance']} | {r['identical']} | "
                  f"{r.get('cuda_plain_equals_cpu_plain', '')} |")
    (out / "cuda_check.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
