#!/usr/bin/env python
"""An EAGLE-3 head on its target, in-process: acceptance per draft position, what a draft step
costs against a target pass, and decode speed against plain decoding, per draft length.

Two prompt sets: held-out Python source (the stdlib files the head never trained on, the same
prompts ``trtspec models eagle3`` evaluates) and the recipes' ``builtin:code`` requests (raw code
prefixes, no chat template: the traffic the Qwen recipe validates on). The target runs as deployed (``--target-format``,
default the Qwen recipe's INT4 + INT8 LM head, batch-invariant); the head in bf16 and on INT8
weights (``runtime.draft_weight_only: int8``). Greedy, batch 1; every speculative output must equal
the same target's plain decoding. Configurations interleave prompt by prompt over ``--repeats``
rounds (median reported); the cache-pressure reading of scripts/bench_engine.py brackets the run.

    .venv/bin/trtspec models eagle3 --target models/qwen2.5-coder-1.5b-instruct   # once: ~1.5 h on 2 cores
    .venv/bin/python scripts/bench_eagle3.py                                        # ~10 min

Writes bench/results/eagle3_qwen.{json,md}.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import pathlib
import statistics
import sys
import time

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=str(REPO / "models"))
    ap.add_argument("--head", default=None, help="[default: MODELS/qwen2.5-coder-1.5b-instruct-eagle3]")
    ap.add_argument("--target-format", default="int4_wo+int8_head")
    ap.add_argument("--draft-lens", default="1,2,3")
    ap.add_argument("--heads", default="int8-ops,int8",
                    help="comma list of bf16 (torch ops), int8-ops (INT8 weights, torch ops), int8 (INT8 weights, "
                         "the one-call layer step where the CPU kernels run)")
    ap.add_argument("--num-prompts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=str(REPO / "bench" / "results"))
    args = ap.parse_args()

    import torch
    from transformers import AutoTokenizer

    from bench_engine import cache_pressure, disturbed
    from bench_vs_llamacpp import HEAD, TARGET, decode_rate, quantized
    from trtspec.checkpoints.eagle3 import corpus_ids, eval_prompts
    from trtspec.prompts import load_prompts
    from trtspec.sampling import Sampling
    from trtspec.speculative.eagle3 import Eagle3Proposer, load_eagle3_head
    from trtspec.speculative.engine import Engine
    from trtspec.speculative.model import count_params
    from trtspec.speculative.runtime import load_model
    from trtspec.speculative.stats import Aggregate

    torch.set_num_threads(args.threads)
    models = pathlib.Path(args.models)
    head_dir = pathlib.Path(args.head or models / f"{TARGET}-eagle3")
    if not (head_dir / "config.json").is_file():
        sys.exit(f"no EAGLE-3 head at {head_dir}: trtspec models eagle3 --target {models / TARGET}")
    fmt = args.target_format
    tfolder = models / TARGET if fmt == "none" else quantized(models, fmt)
    target = load_model(str(tfolder), torch.bfloat16, torch.device("cpu")).batch_invariant_(fmt.endswith(HEAD))
    def make_head(kind: str):
        head = load_eagle3_head(head_dir, target, dtype=torch.bfloat16)
        if kind == "bf16":
            return head
        head.quantize_weight_only_()
        if kind == "int8-ops":
            head._kernel = False  # the layer's torch ops, not the one-call layer step
        elif head.kernel_layer() is None:
            sys.exit("--heads int8: trtspec's CPU layer step does not run here (use int8-ops)")
        return head

    names = {"bf16": "bf16 head", "int8-ops": "INT8 head, torch ops", "int8": "INT8 head, layer step"}
    kinds = args.heads.split(",")
    if not kinds or any(k not in names for k in kinds):
        sys.exit(f"--heads {args.heads!r}: a comma list of {', '.join(names)}")
    heads = {names[k]: make_head(k) for k in kinds}
    first = next(iter(heads.values()))
    tok = AutoTokenizer.from_pretrained(models / TARGET)
    _, held = corpus_ids(models / TARGET, 16)
    sets = {"held-out stdlib source": eval_prompts(held, args.num_prompts),
            "builtin:code requests": [tok(p, add_special_tokens=False)["input_ids"]
                                      for p in load_prompts("builtin:code", args.num_prompts)]}
    ks = [int(k) for k in args.draft_lens.split(",")]
    n = args.max_new_tokens
    greedy = Sampling(max_tokens=n, ignore_eos=True)
    max_len = max(len(p) for ps in sets.values() for p in ps) + n + max(ks) + 8

    def engine(head: str | None, k: int) -> Engine:
        prop = None if head is None else Eagle3Proposer(heads[head], 1, max_len + k + 2)
        return Engine(target, prop, max_draft_len=k if head else 0, max_batch_size=1, max_seq_len=max_len)

    configs = [("plain", None, 0)] + [(f"{h}, K={k}", h, k) for h in heads for k in ks]
    pressure = [cache_pressure(target, max(ks))["pressure"]]
    results: dict[tuple[str, str], list[dict]] = {}
    for rep in range(args.repeats):
        for set_name, prompts in sets.items():
            for name, h, k in configs:
                eng = engine(h, k)
                agg, toks, secs, outs = Aggregate(), 0, 0.0, []
                t0 = time.perf_counter()
                for p in prompts:
                    g = eng.generate([p], greedy)[0]
                    t, s = decode_rate(g.stats)
                    toks, secs = toks + t, secs + s
                    agg.add(g.stats)
                    outs.append(g.token_ids)
                results.setdefault((set_name, name), []).append({"tok_s": toks / secs, "agg": agg.to_dict(),
                                                                 "outputs": outs})
                print(f"[{rep + 1}/{args.repeats}] {set_name} | {name}: {toks / secs:.2f} tok/s "
                      f"({time.perf_counter() - t0:.0f} s)", flush=True)
    pressure.append(cache_pressure(target, max(ks))["pressure"])

    rows = []
    for (set_name, name), rs in results.items():
        plain = results[(set_name, "plain")]
        r0 = rs[0]["agg"]
        med = statistics.median(r["tok_s"] for r in rs)
        row = {"prompts": set_name, "config": name, "tok_s_median": round(med, 2),
               "speedup": round(med / statistics.median(r["tok_s"] for r in plain), 3)}
        if name != "plain":
            steps = max(r0["target_passes"], 1)
            row.update({"acceptance_rate": r0["acceptance_rate"], "acceptance_length": r0["acceptance_length"],
                        "per_position_acceptance": r0["per_position_acceptance"],
                        "draft_ms_per_token": round(1000 * r0["draft_s"] / max(r0["drafted"], 1), 2),
                        "verify_ms_per_pass": round(1000 * r0["verify_s"] / steps, 2),
                        "identical_to_plain": f"{sum(a == b for a, b in zip(rs[0]['outputs'], plain[0]['outputs']))}"
                                              f"/{len(plain[0]['outputs'])}"})
        else:
            row["ms_per_token"] = round(1000 / med, 2)
        rows.append(row)
    manifest = json.loads((head_dir / "trtspec.json").read_text()) if (head_dir / "trtspec.json").is_file() else {}
    info = {"head": str(head_dir), "params": count_params(load_eagle3_head(head_dir, target)),
            "draft_vocab_size": first.cfg.draft_vocab_size, "train_s": manifest.get("train_s"),
            "data": manifest.get("data"), "step_accuracy": manifest.get("step_accuracy")}
    summary = {"when": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "target": str(tfolder),
               "target_format": fmt, "threads": args.threads, "max_new_tokens": n, "repeats": args.repeats,
               "cache_pressure": pressure, "head": info, "rows": rows}
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "eagle3_qwen.json").write_text(json.dumps(summary, indent=2) + "\n")
    md = [f"# EAGLE-3 head on {TARGET} ({summary['when']})", "",
          f"`python scripts/bench_eagle3.py` — target {fmt}, head `{head_dir.name}` ({info['params'] / 1e6:.0f}M "
          f"parameters, draft vocabulary {info['draft_vocab_size']}), greedy, batch 1, {n} new tokens, {args.threads} "
          f"threads, median of {args.repeats} interleaved rounds.", "",
          "| prompts | config | decode tok/s | vs plain | acceptance | tokens/pass | per position | draft ms/token "
          "| verify ms/pass | identical |", "|---|---|---:|---:|---:|---:|---|---:|---:|---:|"]
    for r in rows:
        pp = ", ".join(f"{x:.2f}" for x in r.get("per_position_acceptance", []))
        md.append(f"| {r['prompts']} | {r['config']} | {r['tok_s_median']:.2f} | {r['speedup']:.2f}x | "
                  f"{r.get('acceptance_rate', '')} | {r.get('acceptance_length', '')} | {pp} | "
                  f"{r.get('draft_ms_per_token', '')} | {r.get('verify_ms_per_pass', r.get('ms_per_token', ''))} | "
                  f"{r.get('identical_to_plain', '')} |")
    md += ["", f"Cache pressure (1.0 = undisturbed): {pressure[0]:.2f} before, {pressure[1]:.2f} after"
               f"{' (disturbed)' if disturbed(pressure) else ''}. Plain rows: ms per token in the verify column.", ""]
    (out / "eagle3_qwen.md").write_text("\n".join(md))
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
