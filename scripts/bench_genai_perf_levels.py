#!/usr/bin/env python
"""genai-perf's reading of a validated deployment, level by level, beside trtspec's.

Serves the repository a ``trtspec run`` packaged (``trtspec serve``), then at every concurrency
level its validation measured runs genai-perf 0.0.16 (its own venv, driving perf_analyzer 2.51) on
``ensemble`` (speculative) and ``ensemble_baseline`` in ABBA order: the recipe's validation prompts
(``--input-file``), its ``max_tokens``, streaming. Per level it prints genai-perf's output tokens/s,
TTFT p50 and P95 request latency for both models and their ratios, beside trtspec's ratio and its
95 % interval from the run's ``report.json``, and says whether genai-perf's speedup lies inside
that interval. Nothing here is trtspec's client: the load, the timestamps and the token counts are
genai-perf's.

Setup (once)::

    python3 -m venv .venv-perf
    .venv-perf/bin/pip install genai-perf==0.0.16 'tritonclient[all]==2.51.0' 'pandas<2.3'

Usage::

    .venv/bin/python scripts/bench_genai_perf_levels.py --run runs/qwen-coder-cpu [--rounds 2]

Writes bench/results/genai_perf_levels_<recipe>.{json,md}.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import json
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
MODELS = {"speculative": "ensemble", "baseline": "ensemble_baseline"}


def _sibling(name: str):
    spec = importlib.util.spec_from_file_location(name, pathlib.Path(__file__).with_name(f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def serve(repo: pathlib.Path, work: pathlib.Path):
    """``trtspec serve REPO --json`` in the background; returns (process, gRPC url)."""
    out, err = work / "serve.json", work / "serve.err"
    proc = subprocess.Popen([str(ROOT / ".venv" / "bin" / "trtspec"), "serve", str(repo), "--json", "--probe-every", "0"],
                            stdout=out.open("w"), stderr=err.open("w"))
    for _ in range(1200):
        if out.stat().st_size:
            return proc, json.loads(out.read_text().splitlines()[0])["grpc"]
        if proc.poll() is not None:
            sys.exit(f"trtspec serve exited {proc.returncode}:\n{err.read_text()[-3000:]}")
        time.sleep(1)
    proc.terminate()
    sys.exit("trtspec serve did not come up in 20 minutes")


def trtspec_levels(report: dict) -> dict[int, dict[str, dict]]:
    """{concurrency: {metric: row}} from a run's validation report.json."""
    out: dict[int, dict[str, dict]] = {}
    for row in report["verdict"]["levels"]:
        out.setdefault(row["concurrency"], {})[row["metric"]] = row
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", required=True, help="a `trtspec run` workdir (runs/NAME)")
    ap.add_argument("--recipe", default=None, help="the run's recipe [default: build_configs/NAME.yaml]")
    ap.add_argument("--rounds", type=int, default=2, help="ABBA rounds per level (each: both models once)")
    ap.add_argument("--requests", type=int, default=None, help="requests per genai-perf run [default: the recipe's "
                    "validation.block_requests, at least 2 per concurrent client]")
    ap.add_argument("--report", default=None, help="the trtspec validation report.json to set genai-perf beside "
                    "(e.g. one `trtspec validate -o DIR` wrote against this run's repository) [default: the run's own]")
    ap.add_argument("--tag", default=None, help="appended to the output file names (genai_perf_levels_<recipe>_<tag>)")
    ap.add_argument("--perf-venv", default=str(ROOT / ".venv-perf"))
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = ap.parse_args()

    from trtspec.config import load_recipe
    from trtspec.prompts import load_prompts

    run = pathlib.Path(args.run)
    report_path = pathlib.Path(args.report) if args.report else run / "validate" / "report.json"
    try:
        report = json.loads(report_path.read_text())
    except (OSError, ValueError) as e:
        sys.exit(f"--report {report_path}: not a readable validation report.json ({e})")
    recipe = load_recipe(args.recipe or ROOT / "build_configs" / f"{report['recipe']}.yaml")
    repo = run / "package" / "repository"
    ours = trtspec_levels(report)
    v = recipe.validation
    prompts = load_prompts(v.prompts, v.num_prompts)
    tokenizer = recipe.target.tokenizer or recipe.target.model
    venv = pathlib.Path(args.perf_venv)
    if not (venv / "bin" / "genai-perf").is_file():
        sys.exit(f"no genai-perf in {venv}: see this script's docstring")
    gp = _sibling("bench_genai_perf_export")
    _, env = _sibling("bench_metric_agreement").perf_analyzer_env(venv)
    env["PATH"] = f"{venv / 'bin'}:{env.get('PATH', '')}"
    levels = sorted(ours)
    rows = []
    with tempfile.TemporaryDirectory(prefix="trtspec-gp-levels-") as tmp:
        work = pathlib.Path(tmp)
        proc, url = serve(repo, work)
        try:
            for c in levels:
                n = args.requests or max(v.block_requests, 2 * c)
                got: dict[str, list[dict]] = {k: [] for k in MODELS}
                t0 = time.time()
                for i in range(args.rounds):
                    order = list(MODELS) if i % 2 == 0 else list(reversed(MODELS))
                    for who in order:
                        res = gp.run_genai_perf(venv, env, url, MODELS[who], tokenizer, c, n, prompts, v.max_tokens,
                                                work, f"{who}_c{c}_r{i}")["json"]
                        got[who].append({"tok_s": res["output_token_throughput"]["avg"],
                                         "ttft_p50_ms": res["time_to_first_token"]["p50"],
                                         "latency_p95_ms": res["request_latency"]["p95"],
                                         "osl": res["output_sequence_length"]["avg"]})
                med = {who: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for who, rs in got.items()}
                speedup = med["speculative"]["tok_s"] / med["baseline"]["tok_s"]
                iv = ours[c]["output_token_throughput"]["interval"]
                inside = iv["low"] is not None and iv["low"] <= speedup <= (iv["high"] or float("inf"))
                row = {"concurrency": c, "requests": n, "genai_perf": med, "genai_perf_speedup": speedup,
                       "ttft_p50_ratio": med["speculative"]["ttft_p50_ms"] / med["baseline"]["ttft_p50_ms"],
                       "latency_p95_ratio": med["speculative"]["latency_p95_ms"] / med["baseline"]["latency_p95_ms"],
                       "trtspec_speedup": iv, "inside_trtspec_interval": inside,
                       "trtspec_latency_p95": ours[c].get("request_latency_p95", {}).get("interval"),
                       "rounds": got, "wall_s": round(time.time() - t0, 1), "load_average": os.getloadavg()}
                rows.append(row)
                print(f"c={c}: genai-perf speculative {med['speculative']['tok_s']:.1f} / baseline "
                      f"{med['baseline']['tok_s']:.1f} tok/s = {speedup:.2f}x; trtspec {iv['ratio']:.2f}x "
                      f"[{iv['low']:.2f}, {iv['high'] or float('inf'):.2f}]: {'inside' if inside else 'OUTSIDE'}", flush=True)
        finally:
            proc.terminate()
            proc.wait(timeout=120)
    result = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "recipe": recipe.name,
              "run": str(run), "report": str(report_path), "verdict": report["verdict"].get("decision"),
              "machine": f"{platform.machine()}, {os.cpu_count()} CPUs", "rounds": args.rounds,
              "prompts": v.prompts, "num_prompts": v.num_prompts, "max_tokens": v.max_tokens, "levels": rows}
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"genai_perf_levels_{recipe.name}" + (f"_{args.tag}" if args.tag else "")
    (out / f"{stem}.json").write_text(json.dumps(result, indent=2) + "\n")
    md = [f"# genai-perf 0.0.16 beside trtspec, per level: {recipe.name} ({result['date']})", "",
          f"`python scripts/bench_genai_perf_levels.py {' '.join(sys.argv[1:])}` — the deployment `{run}` packaged, "
          f"served again; {v.num_prompts} `{v.prompts}` prompts, max_tokens {v.max_tokens}, streaming, "
          f"{args.rounds} ABBA rounds per level (medians).", "",
          "| concurrency | genai-perf spec tok/s | baseline tok/s | genai-perf speedup | trtspec speedup [95 % interval] "
          "| inside | TTFT p50 spec / base (ms) | P95 latency spec / base (ms) |",
          "|---:|---:|---:|---:|---|:---:|---:|---:|"]
    for r in rows:
        s, b, iv = r["genai_perf"]["speculative"], r["genai_perf"]["baseline"], r["trtspec_speedup"]
        md.append(f"| {r['concurrency']} | {s['tok_s']:.1f} | {b['tok_s']:.1f} | {r['genai_perf_speedup']:.2f}x | "
                  f"{iv['ratio']:.2f}x [{iv['low']:.2f}, {iv['high'] or float('inf'):.2f}] | "
                  f"{'yes' if r['inside_trtspec_interval'] else '**no**'} | {s['ttft_p50_ms']:.0f} / {b['ttft_p50_ms']:.0f} "
                  f"({r['ttft_p50_ratio']:.2f}x) | {s['latency_p95_ms']:.0f} / {b['latency_p95_ms']:.0f} "
                  f"({r['latency_p95_ratio']:.2f}x) |")
    md.append("")
    (out / f"{stem}.md").write_text("\n".join(md))
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
