#!/usr/bin/env python
"""Quantization quality table: every format, for the target and for the draft of a pair.

For each (model, format): ModelOpt PTQ on CPU (builtin calibration: stdlib train split), then the
quality report of ``trtspec quantize``: top-1 agreement, KL divergence and perplexity change
against the unquantized model on held-out stdlib text, and the draft's acceptance rate against
the target (torch engine, greedy, held-out prompts) before and after quantizing that model.

    python scripts/quant_report.py                        # tiny pair, all formats (~15 min on 2 cores)
    python scripts/quant_report.py --real --formats int8_wo,int8_sq,fp8 --roles draft   # Qwen2.5-Coder 0.5B draft

Writes bench/results/quant_<pair>.json and .md (the same numbers as each export's quality.json).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import platform
import tempfile
import time

import torch

REPO = pathlib.Path(__file__).resolve().parent.parent
PAIRS = {"tiny": ("tiny-target", "tiny-draft"), "qwen": ("qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct")}


def decode_tok_s(folder: pathlib.Path, prompts: list[list[int]], new_tokens: int, repeats: int = 3) -> tuple[float, str]:
    """Plain greedy decoding speed of a model folder as the torch runtime serves it (a quantized
    export on the kernels runtime.quantized_kernels: native gives it), batch 1; best of
    ``repeats``. Returns (tokens/s, what the linears run on)."""
    from trtspec.speculative.engine import Engine
    from trtspec.speculative.runtime import load_model
    from trtspec.sampling import Sampling

    model = load_model(str(folder), torch.float32, torch.device("cpu"))
    kind = f"{model.weight_only} kernel" if model.weight_only else ("fake-quant" if model.modelopt_quantized else "fp32")
    engine = Engine(model, None, max_batch_size=1, max_seq_len=512)
    params = Sampling(max_tokens=new_tokens, ignore_eos=True)
    engine.generate(prompts[:1], params)  # warm-up
    best = 0.0
    for _ in range(repeats):
        t0 = time.perf_counter()
        n = sum(len(g.token_ids) for p in prompts for g in engine.generate([p], params))
        best = max(best, n / (time.perf_counter() - t0))
    return best, kind


def main() -> int:
    from trtspec.quantize import FORMATS, QualitySettings, make_quantization, quantize_model

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--real", action="store_true", help="the Qwen2.5-Coder 1.5B/0.5B pair (trtspec models qwen)")
    ap.add_argument("--models", default=str(REPO / "models"))
    ap.add_argument("--formats", default=",".join(FORMATS), help="comma list (default: all)")
    ap.add_argument("--roles", default="target,draft", help="which model(s) of the pair to quantize")
    ap.add_argument("--kv-cache", default="none", help="KV-cache format for every row (none|fp8|int8)")
    ap.add_argument("--calib-size", type=int, default=16)
    ap.add_argument("--calib-seq-len", type=int, default=128)
    ap.add_argument("--eval-windows", type=int, default=16)
    ap.add_argument("--eval-seq-len", type=int, default=128)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--max-draft-len", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=str(REPO / "bench" / "results"))
    a = ap.parse_args()

    pair_name = "qwen" if a.real else "tiny"
    target, draft = (pathlib.Path(a.models) / d for d in PAIRS[pair_name])
    formats = [f for f in a.formats.split(",") if f]
    roles = [r for r in a.roles.split(",") if r]
    settings = QualitySettings(eval_windows=a.eval_windows, eval_seq_len=a.eval_seq_len, prompts=a.prompts,
                               max_new_tokens=a.max_new_tokens, max_draft_len=a.max_draft_len)
    torch.set_num_threads(a.threads)
    from transformers import AutoTokenizer

    from trtspec.prompts import stdlib_snippets

    tok = AutoTokenizer.from_pretrained(str(target))
    speed_prompts = [tok(t, add_special_tokens=False)["input_ids"][:64] for t in stdlib_snippets(4)]
    base_speed = {role: decode_tok_s(m, speed_prompts, a.max_new_tokens)[0]
                  for role, m in (("target", target), ("draft", draft)) if role in roles}
    rows = []
    with tempfile.TemporaryDirectory(prefix="quant_report") as tmp:
        for role in roles:
            model, pair = (target, draft) if role == "target" else (draft, target)
            for fmt in formats:
                # int8_sq is refused for the PyTorch flow's hf export only; the report uses the
                # torch export, so nothing needs forcing
                q = make_quantization(fmt, a.kv_cache, calib_size=a.calib_size, calib_seq_len=a.calib_seq_len)
                t0 = time.perf_counter()
                res = quantize_model(model, q, "torch", pathlib.Path(tmp) / f"{role}-{fmt}", role=role, pair=pair,
                                     quality=settings, threads=a.threads)
                r, acc = res.quality, res.quality["acceptance"]
                tok_s, kernels = decode_tok_s(res.out_dir, speed_prompts, a.max_new_tokens)
                rows.append({
                    "quantized": role, "model": model.name, "format": fmt, "kv_cache": a.kv_cache,
                    "top1_agreement": r["top1_agreement"], "kl_divergence": r["kl_divergence"],
                    "perplexity_base": r["perplexity_base"], "perplexity_quantized": r["perplexity_quantized"],
                    "perplexity_change_pct": r["perplexity_change_pct"],
                    "acceptance_before": acc["before"]["acceptance_rate"], "acceptance_after": acc["after"]["acceptance_rate"],
                    "acceptance_length_before": acc["before"]["acceptance_length"],
                    "acceptance_length_after": acc["after"]["acceptance_length"],
                    "agreement_before": acc["teacher_forced_agreement"]["before"],
                    "agreement_after": acc["teacher_forced_agreement"]["after"],
                    "speculative_greedy_identical": acc.get("speculative_greedy_identical"),
                    "runtime_vs_modelopt_max_abs_diff": r["runtime_vs_modelopt_max_abs_diff"],
                    "tok_s_unquantized": round(base_speed[role], 1), "tok_s": round(tok_s, 1), "kernels": kernels,
                    "calibrate_s": res.timings.get("calibrate_s"), "seconds": round(time.perf_counter() - t0, 1),
                    "warnings": res.warnings,
                })
                print(f"{role:6} {fmt:8} top1 {r['top1_agreement']:.4f} KL {r['kl_divergence']:.5f} "
                      f"ppl {r['perplexity_change_pct']:+.2f}% agreement {rows[-1]['agreement_before']:.4f} → "
                      f"{rows[-1]['agreement_after']:.4f} acceptance {acc['before']['acceptance_rate']:.3f} → "
                      f"{acc['after']['acceptance_rate']:.3f} tok/s {base_speed[role]:.0f} → {tok_s:.0f} ({kernels}) "
                      f"({rows[-1]['seconds']}s)", flush=True)

    command = "python scripts/quant_report.py" + (" --real" if a.real else "") + "".join(
        f" --{k.replace('_', '-')} {v}" for k, v in vars(a).items()
        if k not in ("real", "models", "out") and v != ap.get_default(k))
    def shown(p: pathlib.Path) -> str:
        try:
            return str(p.resolve().relative_to(REPO))
        except ValueError:
            return str(p)

    doc = {
        "pair": {"target": shown(target), "draft": shown(draft)},
        "command": command,
        "settings": {"calibration": f"builtin stdlib train split, {a.calib_size} x {a.calib_seq_len} tokens",
                     "quality": settings.to_dict(), "kv_cache": a.kv_cache, "threads": a.threads},
        "machine": {"platform": platform.platform(), "torch": torch.__version__, "device": "cpu",
                    "modelopt": __import__("modelopt").__version__, "threads": a.threads},
        "rows": rows,
    }
    out = pathlib.Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"quant_{pair_name}.json").write_text(json.dumps(doc, indent=2) + "\n")
    (out / f"quant_{pair_name}.md").write_text(markdown(doc))
    print(f"wrote {out / f'quant_{pair_name}.json'} and .md")
    return 0


def markdown(doc: dict) -> str:
    s = doc["settings"]
    q = s["quality"]
    lines = [
        f"Quantized vs unquantized, {doc['pair']['target']} / {doc['pair']['draft']} "
        f"(ModelOpt {doc['machine'].get('modelopt', '0.47')} on CPU; calibration: {s['calibration']}; KV cache: {s['kv_cache']}).",
        f"Top-1 / KL / perplexity: teacher-forced on {q['eval_windows']} x {q['eval_seq_len']} held-out tokens. "
        f"Draft/target agreement: teacher-forced top-1 agreement of draft and target on the same held-out tokens "
        f"(the per-token greedy acceptance probability on fixed text). "
        f"Acceptance: draft vs target, greedy, max_draft_len {q['max_draft_len']}, {q['prompts']} held-out prompts x "
        f"{q['max_new_tokens']} tokens (each configuration on the text it generates), before → after quantizing the "
        "model in the first column.",
        "",
        "tok/s: plain greedy decoding of the quantized model alone, batch 1, as the torch runtime serves it "
        "(runtime.quantized_kernels: native), unquantized fp32 → quantized, best of 3 on 4 prompts; the kernels "
        "it ran on in brackets.",
        "",
        "| quantized | format | top-1 vs unquantized | KL (nats/token) | perplexity | Δ perplexity | draft/target agreement | acceptance rate | acceptance length | spec = plain | tok/s (kernels) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|:---:|---:|",
    ]
    for r in doc["rows"]:
        same = {True: "yes", False: "**no**", None: "–"}[r["speculative_greedy_identical"]]
        lines.append(
            f"| {r['quantized']} | {r['format']} | {r['top1_agreement']:.4f} | {r['kl_divergence']:.5f} | "
            f"{r['perplexity_base']:.2f} → {r['perplexity_quantized']:.2f} | {r['perplexity_change_pct']:+.2f}% | "
            f"{r['agreement_before']:.4f} → {r['agreement_after']:.4f} | "
            f"{r['acceptance_before']:.3f} → {r['acceptance_after']:.3f} | "
            f"{r['acceptance_length_before']:.2f} → {r['acceptance_length_after']:.2f} | {same} | "
            f"{r['tok_s_unquantized']:.0f} → {r['tok_s']:.0f} ({r['kernels']}) |")
    lines += ["", f"Reproduce: `{doc['command']}`", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
