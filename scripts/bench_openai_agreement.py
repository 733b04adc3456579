#!/usr/bin/env python
"""Do `trtspec bench` through the OpenAI port and through the gRPC port of the same server agree?

One `trtspec serve REPO --openai-port 0` (the tiny pair, as a user runs it), then `trtspec bench`
(the CLI, its own process) against ``grpc://`` and against ``http://.../v1`` in turn, ABBA over
``--rounds`` pairs, the same prompts, lengths and concurrency. Per model (speculative, baseline)
and metric, the medians over rounds are compared; the goal is ±10 %. The OpenAI relay is one more
Python process between client and ensemble (HTTP in, gRPC out, SSE back), so what differs is its
per-chunk cost on the shared cores.

    .venv/bin/python scripts/bench_openai_agreement.py [--nice -10] [--rounds 3] [--concurrency 1]

Writes bench/results/openai_agreement.{json,md}.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

METRICS = (("ttft_s", "p50", "TTFT p50"), ("itl_s", "p50", "ITL p50"), ("request_latency_s", "p50", "latency p50"),
           ("request_latency_s", "p95", "latency p95"), ("output_token_throughput", None, "output tok/s"),
           ("request_throughput", None, "req/s"))


def recipe(models: pathlib.Path) -> dict:
    return {
        "name": "openai-agreement",
        "target": {"model": str(models / "tiny-target")},
        "speculation": {"method": "draft_target", "draft": {"model": str(models / "tiny-draft")}, "max_draft_len": 4},
        "runtime": {"backend": "torch", "dtype": "float32", "device": "cpu", "torch_threads": 1,
                    "adaptive": {"enabled": False, "min_acceptance_rate": 0.0}},
        "limits": {"max_batch_size": 8, "max_input_len": 256, "max_seq_len": 512},
        "serving": {"max_queue_size": 64},
    }


def bench(url: str, out: pathlib.Path, args, tokenizer: str) -> dict:
    cmd = [sys.executable, "-m", "trtspec.cli", "bench", "--url", url, "--concurrency", str(args.concurrency),
           "--requests", str(args.requests), "--warmup", "2", "--output-len", str(args.output_len),
           "--tokenizer", tokenizer, "-o", str(out)]
    r = subprocess.run(["nice", "-n", str(args.nice), *cmd], capture_output=True, text=True, timeout=1800)
    if r.returncode != 0:
        sys.exit(f"trtspec bench failed ({r.returncode}): {r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    return json.loads((out / "report.json").read_text())


def value(model: dict, key: str, stat: str | None) -> float:
    v = model[key]
    return float(v[stat] if stat else v)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=str(ROOT / "models"))
    ap.add_argument("--rounds", type=int, default=3, help="ABBA pairs")
    ap.add_argument("--concurrency", type=int, default=1)
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--output-len", type=int, default=32)
    ap.add_argument("--nice", type=int, default=0, help="niceness of the server and the benches (e.g. -10)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = ap.parse_args()

    from tests.serve_process import serve_process
    from trtspec.config import parse_recipe
    from trtspec.triton.render import package

    models = pathlib.Path(args.models)
    tokenizer = str(models / "tiny-target")
    with tempfile.TemporaryDirectory(prefix="trtspec-openai-agreement-") as tmp:
        tmp = pathlib.Path(tmp)
        package(parse_recipe(recipe(models)), tmp / "repo")
        cmd = ["nice", "-n", str(args.nice), sys.executable, "-m", "trtspec.cli", "serve", str(tmp / "repo"),
               "--openai-port", "0", "--json", "--no-watchdog", "--ready-timeout", "300"]
        with serve_process(cmd, tmp / "serve.log") as (info, _):
            urls = {"grpc": f"grpc://{info['grpc']}", "openai": info["openai"]}
            runs: dict[str, list[dict]] = {"grpc": [], "openai": []}
            order = [k for i in range(args.rounds) for k in (("grpc", "openai") if i % 2 == 0 else ("openai", "grpc"))]
            for i, kind in enumerate(order):
                d = bench(urls[kind], tmp / f"b{i}-{kind}", args, tokenizer)
                runs[kind].append(d)
                lv = d["levels"][0]["models"]
                print(f"[{i + 1}/{len(order)}] {kind}: speculative {lv['speculative']['output_token_throughput']:.1f} "
                      f"tok/s, baseline {lv['baseline']['output_token_throughput']:.1f} tok/s", flush=True)
    rows = []
    worst = 0.0
    for role in ("speculative", "baseline"):
        for key, stat, label in METRICS:
            med = {k: statistics.median(value(d["levels"][0]["models"][role], key, stat) for d in ds)
                   for k, ds in runs.items()}
            diff = med["openai"] / med["grpc"] - 1 if med["grpc"] else float("nan")
            worst = max(worst, abs(diff))
            rows.append({"model": role, "metric": label, "grpc": med["grpc"], "openai": med["openai"],
                         "difference": round(diff, 4)})
    result = {"when": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
              "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.platform()}",
              "settings": vars(args), "rows": rows, "worst_abs_difference": round(worst, 4),
              "within_10_percent": worst <= 0.10}
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "openai_agreement.json").write_text(json.dumps(result, indent=2) + "\n")

    def fmt(label: str, v: float) -> str:
        return f"{v * 1e3:.2f} ms" if label.split()[0] in ("TTFT", "ITL", "latency") else f"{v:.2f}"

    md = [f"# trtspec bench: the OpenAI port vs the gRPC port of one server ({result['when']})", "",
          f"`python scripts/bench_openai_agreement.py --nice {args.nice} --rounds {args.rounds}` — tiny pair, "
          f"`trtspec serve --openai-port`, `trtspec bench` at concurrency {args.concurrency}, {args.requests} requests "
          f"× {args.output_len} tokens per model and run, {2 * args.rounds} runs alternating (ABBA), medians compared. "
          f"Machine: {result['machine']}.", "",
          "| model | metric | gRPC | OpenAI | difference |", "|---|---|---:|---:|---:|"]
    for r in rows:
        md.append(f"| {r['model']} | {r['metric']} | {fmt(r['metric'], r['grpc'])} | {fmt(r['metric'], r['openai'])} | "
                  f"{r['difference'] * 100:+.1f}% |")
    md += ["", f"Largest difference {worst * 100:.1f}%: within ±10 %: **{'yes' if worst <= 0.10 else 'no'}**.", ""]
    (out / "openai_agreement.md").write_text("\n".join(md))
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
