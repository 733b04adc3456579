#!/usr/bin/env python
"""Does quantizing the target make the served deployment faster? The demo recipe in variants
(target format × kernels × torch threads), each packaged by the pipeline and served by its own
tritonserver, all up at once and measured in turns.

For every prompt (``builtin:code``, greedy, ``--max-tokens``, concurrency 1) each server is asked
in a rotating order through ``ensemble`` (speculative) and ``ensemble_baseline``; a server that is
not being asked is idle, so every variant sees the same machine at nearly the same moment. Per
variant and model: output tokens / wall time over all its requests (TTFT included, as `trtspec
run`'s validation counts it), and the deployed path's speed: the speculative one where it beats
the baseline by the demo's gate (1.10×), else the baseline, as the verdict would choose.

    .venv/bin/python scripts/bench_quantized_serving.py [--rounds 3] [--variants fp32-t2,int8-native-t1]

Writes bench/results/quantized_serving.{json,md}.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import os
import pathlib
import platform
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# name → (target quantization format or None, runtime.quantized_kernels, torch_threads)
VARIANTS = {
    "fp32-t2": (None, "native", 2),
    "fp32-t1": (None, "native", 1),
    "int8-emulated-t2": ("int8_wo", "emulated", 2),
    "int8-native-t2": ("int8_wo", "native", 2),
    "int8-native-t1": ("int8_wo", "native", 1),
}
GATE = 1.10  # the demo's min_speedup at concurrency 1


def variant_recipe(base: dict, name: str) -> dict:
    import copy

    fmt, kernels, threads = VARIANTS[name]
    r = copy.deepcopy(base)
    r["name"] = f"quantized-serving-{name}"
    if fmt is None:
        r["target"].pop("quantization", None)
    else:
        r["target"].setdefault("quantization", {})["format"] = fmt
    r["runtime"]["quantized_kernels"] = kernels
    r["runtime"]["torch_threads"] = threads
    return r


def package_variant(base: dict, name: str, work: pathlib.Path) -> pathlib.Path:
    """The pipeline up to `package` (quantize on the way): the repository `trtspec run` would serve."""
    from trtspec.config import parse_recipe
    from trtspec.pipeline import Pipeline

    Pipeline(parse_recipe(variant_recipe(base, name)), work / name).run(until="package")
    return work / name / "package" / "repository"


async def measure(urls: dict[str, str], prompts: list[str], max_tokens: int, rounds: int, tokenizer: str) -> dict:
    from trtspec.client.client import AsyncLLMClient
    from trtspec.client.types import Sampling

    clients = {v: AsyncLLMClient(u, tokenizer=tokenizer) for v, u in urls.items()}
    s = Sampling(max_tokens=max_tokens, temperature=0.0)
    totals = {(v, m): [0, 0.0] for v in urls for m in ("ensemble", "ensemble_baseline")}
    outputs: dict[tuple, list[int]] = {}
    try:
        for c in clients.values():
            await c.wait_ready(["ensemble", "ensemble_baseline"], timeout_s=300)
            for m in ("ensemble", "ensemble_baseline"):
                for p in prompts[:2]:
                    await c.generate(p, s, model=m)
        names = list(urls)
        for r in range(rounds):
            for i, p in enumerate(prompts):
                shift = (r * len(prompts) + i) % len(names)
                for v in names[shift:] + names[:shift]:
                    models = ("ensemble", "ensemble_baseline") if (r + i) % 2 == 0 else ("ensemble_baseline", "ensemble")
                    for m in models:
                        t = time.perf_counter()
                        res = await clients[v].generate(p, s, model=m)
                        totals[v, m][1] += time.perf_counter() - t
                        totals[v, m][0] += len(res.token_ids or [])
                        outputs.setdefault((v, m, i), list(res.token_ids or []))
    finally:
        for c in clients.values():
            await c.close()
    same = {v: all(outputs[v, "ensemble", i] == outputs[v, "ensemble_baseline", i] for i in range(len(prompts)))
            for v in urls}
    return {"tok_s": {f"{v}/{m}": n / t for (v, m), (n, t) in totals.items()}, "spec_equals_plain": same}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default=str(ROOT / "build_configs" / "tiny-cpu-draft-target.yaml"))
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--num-prompts", type=int, default=12)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--workdir", default=None, help="keep the packaged variants here (reused by later runs)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = ap.parse_args()
    names = [v for v in args.variants.split(",") if v]
    unknown = [v for v in names if v not in VARIANTS]
    if unknown:
        sys.exit(f"--variants: unknown {', '.join(unknown)}; choose from {', '.join(VARIANTS)}")

    import yaml

    from trtspec.config import load_recipe
    from trtspec.prompts import load_prompts
    from trtspec.triton.launch.server import TritonServer

    cfg = pathlib.Path(args.config).resolve()
    base = yaml.safe_load(cfg.read_text())
    for role in ("target", "draft"):  # relative model paths resolve against the recipe's folder
        holder = base["target"] if role == "target" else base["speculation"]["draft"]
        if not os.path.isabs(holder["model"]):
            holder["model"] = str((cfg.parent / holder["model"]).resolve())
    recipe = load_recipe(cfg)
    prompts = load_prompts(recipe.validation.prompts, args.num_prompts)
    tokenizer = recipe.target.tokenizer or str(base["target"]["model"])
    with contextlib.ExitStack() as stack:
        work = pathlib.Path(args.workdir) if args.workdir else pathlib.Path(
            stack.enter_context(tempfile.TemporaryDirectory(prefix="trtspec-quantized-serving-")))
        repos = {}
        for v in names:
            t = time.perf_counter()
            repos[v] = package_variant(base, v, work)
            print(f"packaged {v} in {time.perf_counter() - t:.0f} s", flush=True)
        urls = {}
        for v in names:
            s = stack.enter_context(TritonServer(repos[v], workdir=work / f"server-{v}", ready_timeout=300))
            urls[v] = s.endpoints.grpc
        load_before = os.getloadavg()[0]
        res = asyncio.run(measure(urls, prompts, args.max_tokens, args.rounds, tokenizer))
    rows = []
    for v in names:
        spec, plain = res["tok_s"][f"{v}/ensemble"], res["tok_s"][f"{v}/ensemble_baseline"]
        fmt, kernels, threads = VARIANTS[v]
        deployed = "speculative" if spec >= GATE * plain else "baseline"
        rows.append({"variant": v, "target": fmt or "fp32", "kernels": kernels if fmt else "-", "torch_threads": threads,
                     "baseline_tok_s": round(plain, 1), "speculative_tok_s": round(spec, 1),
                     "speedup": round(spec / plain, 3), "deployed": deployed,
                     "deployed_tok_s": round(spec if deployed == "speculative" else plain, 1),
                     "speculative_equals_plain": res["spec_equals_plain"][v]})
    result = {"when": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
              "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.platform()}",
              "load_before": round(load_before, 2), "load_after": round(os.getloadavg()[0], 2),
              "settings": vars(args), "rows": rows}
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "quantized_serving.json").write_text(json.dumps(result, indent=2) + "\n")
    md = [f"# Served speed by target format: {cfg.name} ({result['when']})", "",
          f"`python scripts/bench_quantized_serving.py --rounds {args.rounds}`: {args.num_prompts} prompts × "
          f"{args.max_tokens} tokens, greedy, concurrency 1, {args.rounds} rounds; every variant served by its own "
          f"tritonserver, all up at once, asked in a rotating order. tok/s = output tokens / wall time (TTFT "
          f"included). Deployed: speculative where it reaches {GATE:.2f}× the baseline (the demo's gate), else the "
          f"baseline. Machine: {result['machine']}; load average {result['load_before']} before, "
          f"{result['load_after']} after.", "",
          "| variant | target | kernels | torch threads | baseline tok/s | speculative tok/s | speedup | deployed | "
          "deployed tok/s | speculative = plain |", "|---|---|---|---:|---:|---:|---:|---|---:|:---:|"]
    for r in rows:
        md.append(f"| {r['variant']} | {r['target']} | {r['kernels']} | {r['torch_threads']} | {r['baseline_tok_s']:.1f} | "
                  f"{r['speculative_tok_s']:.1f} | {r['speedup']:.2f}× | {r['deployed']} | {r['deployed_tok_s']:.1f} | "
                  f"{'yes' if r['speculative_equals_plain'] else 'no'} |")
    (out / "quantized_serving.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
