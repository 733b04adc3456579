#!/usr/bin/env python
"""The goodput policy against plain decoding at a fixed batch size, in-process, on the Qwen pair.

Loads the target and draft a `trtspec run build_configs/qwen-coder-cpu.yaml` quantized (its
``quantize/`` stage), then decodes the recipe's code prompts twice over (16 requests, 48 tokens,
greedy) with ``max_batch_size`` B: once with ordinary decoding, once speculating under the goodput
policy (K ≤ 2, the recipe's draft vocabulary), interleaved, ``--repeats`` times. Prints tokens/s
of both, the k the policy chose per step and its measured costs.

    .venv/bin/python scripts/bench_goodput_batch.py --batch 4 [--run runs/qwen-coder-cpu]

Writes bench/results/goodput_batch_B<batch>.json.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--run", default=str(ROOT / "runs" / "qwen-coder-cpu"))
    ap.add_argument("--tokenizer", default=str(ROOT / "models" / "qwen2.5-coder-1.5b-instruct"))
    ap.add_argument("--draft-vocab-size", type=int, default=32768)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = ap.parse_args()

    import torch
    from transformers import AutoTokenizer

    from trtspec.prompts import load_prompts
    from trtspec.sampling import Sampling
    from trtspec.speculative.engine import Engine
    from trtspec.speculative.proposers import DraftModelProposer
    from trtspec.speculative.runtime import load_model
    from trtspec.speculative.vocab import frequent_vocab

    torch.set_num_threads(args.threads)
    run, B = pathlib.Path(args.run), args.batch
    cpu = torch.device("cpu")
    target = load_model(str(run / "quantize" / "target"), torch.bfloat16, cpu).batch_invariant_(True)
    draft = load_model(str(run / "quantize" / "draft"), torch.bfloat16, cpu)
    tok = AutoTokenizer.from_pretrained(args.tokenizer)
    prompts = [tok(p, add_special_tokens=False)["input_ids"] for p in load_prompts("builtin:code", 8)]
    vocab = frequent_vocab(run / "quantize" / "draft", args.draft_vocab_size, draft.args.vocab_size)
    engines = {"plain": Engine(target, None, max_batch_size=B, max_seq_len=2048),
               "goodput": Engine(target, DraftModelProposer(draft, B, 2048, vocab=vocab), max_draft_len=2,
                                 max_batch_size=B, max_seq_len=2048, adaptive=True, policy="goodput")}
    for eng in engines.values():  # warm-up: kernels, layouts, the first costs
        eng.generate(prompts[:B], Sampling(max_tokens=8))
    rates: dict[str, list[float]] = {k: [] for k in engines}
    for rep in range(args.repeats):
        for name, eng in engines.items():
            t0 = time.perf_counter()
            outs = eng.generate(prompts * 2, Sampling(max_tokens=48))
            rates[name].append(sum(len(o.token_ids) for o in outs) / (time.perf_counter() - t0))
            print(f"[{rep + 1}/{args.repeats}] {name} B={B}: {rates[name][-1]:.1f} tok/s", flush=True)
    snap = engines["goodput"].goodput.snapshot()
    result = {"batch": B, "threads": args.threads, "requests": 2 * len(prompts), "max_tokens": 48,
              "tok_s": rates, "chosen_k": snap["chosen_k"], "verify_s": snap["verify_s"],
              "draft_token_s": snap["draft_token_s"], "catch_up_token_s": snap["catch_up_token_s"]}
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"goodput_batch_B{B}.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
