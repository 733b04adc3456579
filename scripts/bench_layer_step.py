#!/usr/bin/env python
"""One decode/verify pass of the Qwen2.5-Coder pair's models, with trtspec's one-call layer step
(kernels/wo_cpu.cpp ``layer_step``, ``CausalLM.kernel_layers``) against the torch ops it replaces.

For the recipe's target (ModelOpt int4_wo + INT8 LM head, batch-invariant) a one-token step and a
3-token verify pass (K=2); for the 0.5B draft on INT8 weights and as the recipe's ModelOpt int4_wo
+ INT8-head export, a one-token step. Each pass runs after a 160-token prompt (about the bench's
contexts), the LM head on the last position, as the engine runs them; median of ``--repeats``
passes, the two paths interleaved. The table also says whether the two paths' logits agree.

    .venv/bin/python scripts/bench_layer_step.py [--threads 2] [--repeats 15]

Needs the pair (``trtspec models qwen --out models``) and the two quantized exports that
scripts/bench_vs_llamacpp.py makes (once). Writes bench/results/layer_step.{json,md}.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import pathlib
import platform
import statistics
import sys
import time

import torch

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

TARGET = "qwen2.5-coder-1.5b-instruct"
DRAFT = "qwen2.5-coder-0.5b-instruct"


def time_pass(model, T: int, repeats: int, prompt_len: int = 160) -> dict:
    """Median ms of a T-token pass after the prompt, for the layer step and the torch ops, interleaved."""
    from trtspec.speculative.model import Step

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 20000, (1, prompt_len + T), generator=g)
    cache = model.new_cache(1, prompt_len + T + 8)
    times: dict[str, list[float]] = {"layer_step": [], "torch_ops": []}
    logits = {}
    with torch.inference_mode():
        model(ids[:, :prompt_len], cache, Step([0], [0], prompt_len), logits="none")
        for r in range(repeats + 2):
            for path in times:
                model._kernel_layers = None if path == "layer_step" else False
                t0 = time.perf_counter()
                out = model(ids[:, prompt_len:], cache, Step([0], [prompt_len], T), logits="last")
                if r >= 2:  # two warm-up rounds
                    times[path].append(time.perf_counter() - t0)
                logits[path] = out.float()
    model._kernel_layers = None
    a, b = logits["layer_step"], logits["torch_ops"]
    return {"layer_step_ms": round(1e3 * statistics.median(times["layer_step"]), 2),
            "torch_ops_ms": round(1e3 * statistics.median(times["torch_ops"]), 2),
            "same_argmax": bool((a.argmax(-1) == b.argmax(-1)).all()),
            "max_abs_logit_diff": round(float((a - b).abs().max()), 4)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=str(ROOT / "models"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from bench_engine import cache_pressure, disturbed

    from trtspec.speculative.kernels import wo_cpu, wo_cpu_status
    from trtspec.speculative.model import load_causal_lm
    from trtspec.speculative.runtime import load_model

    if wo_cpu() is None:
        sys.exit(f"trtspec's CPU kernels do not run here: {wo_cpu_status()}")
    models = pathlib.Path(args.models)
    folders = {"target": models / f"{TARGET}-int4_wo-head_int8_wo-torch",
               "draft_int4": models / f"{DRAFT}-int4_wo-head_int8_wo-torch"}
    for f in (*folders.values(), models / DRAFT):
        if not f.is_dir():
            sys.exit(f"missing {f}: run `trtspec models qwen --out {models}` and scripts/bench_vs_llamacpp.py once")
    cpu = torch.device("cpu")
    target = load_model(str(folders["target"]), torch.bfloat16, cpu).batch_invariant_(True)
    pressure = [cache_pressure(target, 2)["pressure"]]
    rows = []
    for name, model, T in [
        ("target (INT4 + INT8 head), one token", target, 1),
        ("target (INT4 + INT8 head), verify of 3 tokens", target, 3),
    ]:
        rows.append({"pass": name, **time_pass(model, T, args.repeats)})
        print(rows[-1], flush=True)
    pressure.append(cache_pressure(target, 2)["pressure"])
    del target
    for name, model in [
        ("draft 0.5B, INT8 weights, one token", load_causal_lm(models / DRAFT, dtype=torch.bfloat16).quantize_weight_only_()),
        ("draft 0.5B, INT4 + INT8 head (ModelOpt), one token", load_model(str(folders["draft_int4"]), torch.bfloat16, cpu)),
    ]:
        rows.append({"pass": name, **time_pass(model, 1, args.repeats)})
        print(rows[-1], flush=True)
        del model

    when = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    summary = {"when": when, "threads": args.threads, "repeats": args.repeats, "torch": torch.__version__,
               "platform": platform.platform(), "kernels": wo_cpu_status(), "cache_pressure": pressure, "rows": rows}
    (out / "layer_step.json").write_text(json.dumps(summary, indent=2) + "\n")
    md = [f"# One pass of the Qwen pair: layer step vs torch ops ({when})", "",
          f"`python scripts/bench_layer_step.py` — {args.threads} threads, median of {args.repeats} passes after a "
          "160-token prompt, LM head on the last position, the two paths interleaved.", "",
          "| pass | layer step ms | torch ops ms | speedup | same argmax | max logit diff |",
          "|---|---:|---:|---:|:---:|---:|"]
    for r in rows:
        md.append(f"| {r['pass']} | {r['layer_step_ms']:.1f} | {r['torch_ops_ms']:.1f} | "
                  f"{r['torch_ops_ms'] / r['layer_step_ms']:.2f}× | {'yes' if r['same_argmax'] else 'no'} | "
                  f"{r['max_abs_logit_diff']:.3f} |")
    md += ["", f"Cache pressure (scripts/bench_engine.py's reading; 1.0 = undisturbed): {pressure[0]:.2f} before, "
               f"{pressure[-1]:.2f} after the target's rows{' (disturbed)' if disturbed(pressure) else ''}."]
    (out / "layer_step.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
