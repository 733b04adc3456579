"""Do trtspec's latency metrics agree with NVIDIA's tools? Same server, same prompts, same load.

Runs the same closed-loop load twice against one model — once with ``trtspec bench``'s load
generator, once with ``perf_analyzer`` (tritonclient 2.51, the server's version; a separate venv,
see reference/triton-cpu.md §7) — and compares TTFT, request latency, output token throughput and
request throughput. perf_analyzer's side is computed from its ``--profile-export-file`` with
GenAI-Perf's own formulas (genai-perf is perf_analyzer plus that parser): TTFT = first response −
request, latency = last response − request, output tokens by tokenizing the returned text,
throughput = Σ tokens / (last response − first request). The timestamps are independent: C++
client vs our asyncio client.

Setup (once)::

    python3 -m venv .venv-perf && .venv-perf/bin/pip install "tritonclient[grpc,http]==2.51.0"

Usage::

    .venv/bin/python scripts/bench_metric_agreement.py            # starts the tiny CPU server itself
    .venv/bin/python scripts/bench_metric_agreement.py --url 127.0.0.1:8001 --tokenizer models/tiny-target

Writes bench/results/metric_agreement.json and .md.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import pathlib
import platform
import subprocess
import sys
import tempfile
import time

from trtspec.client.client import load_tokenizer
from trtspec.client.loadgen import BenchSettings, run_bench, shape_prompts
from trtspec.client.types import Sampling
from trtspec.prompts import load_prompts
from trtspec.acceptance import percentile

ROOT = pathlib.Path(__file__).resolve().parent.parent
TOLERANCE = 0.10


def perf_analyzer_env(venv: pathlib.Path) -> tuple[pathlib.Path, dict]:
    """The 2.51 binary needs libb64 and libcudart: take them from the pytriton wheel (symlinks)."""
    binary = venv / "bin" / "perf_analyzer"
    if not binary.is_file():
        sys.exit(f"no {binary}: python3 -m venv {venv} && {venv}/bin/pip install 'tritonclient[grpc,http]==2.51.0'")
    from trtspec.triton.launch.paths import pytriton_dist

    libs = pytriton_dist().parent.parent / "nvidia_pytriton.libs"
    palibs = venv / "palibs"
    palibs.mkdir(exist_ok=True)
    for pattern, name in (("libb64-*.so.0d", "libb64.so.0d"), ("libcudart-*.so.12*", "libcudart.so.12")):
        src = next(libs.glob(pattern))
        link = palibs / name
        if not link.exists():
            link.symlink_to(src)
    env = dict(os.environ, LD_LIBRARY_PATH=f"{palibs}:{os.environ.get('LD_LIBRARY_PATH', '')}")
    return binary, env


def run_perf_analyzer(binary, env, url: str, model: str, prompts: list[str], max_tokens: int, concurrency: int,
                      requests: int, workdir: pathlib.Path) -> dict:
    data = workdir / f"pa_input_c{concurrency}.json"
    data.write_text(json.dumps({"data": [{"text_input": [p], "max_tokens": [max_tokens], "stream": [True],
                                          "temperature": [0.0]} for p in prompts]}))
    export = workdir / f"pa_export_c{concurrency}.json"
    export.unlink(missing_ok=True)  # perf_analyzer refuses to overwrite it
    argv = [str(binary), "-m", model, "-u", url, "-i", "grpc", "--streaming", "--async",
            "--input-data", str(data), "--concurrency-range", str(concurrency),
            # perf_analyzer 2.51 hangs when fewer warm-up requests than concurrency are asked for
            "--request-count", str(requests), "--warmup-request-count", str(max(2, concurrency)),
            "--profile-export-file", str(export), "--measurement-interval", "60000", "--stability-percentage", "999"]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        sys.exit(f"perf_analyzer failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return {"argv": argv, "export": json.loads(export.read_text()), "stdout_tail": proc.stdout[-1500:]}


def _text(output: dict) -> str:
    v = output.get("text_output", "")
    if isinstance(v, list):
        v = "".join(map(str, v))
    return str(v)


def genai_perf_metrics(export: dict, tokenizer) -> dict:
    """GenAI-Perf's llm_profile_data_parser, for the triton service kind (no empty-response pruning)."""
    reqs = export["experiments"][0]["requests"]
    ttft, lat, osl = [], [], []
    first_req, last_res = float("inf"), 0
    for r in reqs:
        ts = r["response_timestamps"]
        if not ts:
            continue
        t0 = r["timestamp"]
        first_req, last_res = min(first_req, t0), max(last_res, ts[-1])
        ttft.append((ts[0] - t0) / 1e9)
        lat.append((ts[-1] - t0) / 1e9)
        text = "".join(_text(o) for o in r["response_outputs"])
        osl.append(len(tokenizer(text)["input_ids"]))
    dur = (last_res - first_req) / 1e9
    return _pack(ttft, lat, sum(osl), len(lat), dur)


def _pack(ttft, lat, tokens, n, dur) -> dict:
    return {"requests": n, "ttft_mean_s": sum(ttft) / n, "ttft_p50_s": percentile(ttft, 50),
            "request_latency_mean_s": sum(lat) / n, "request_latency_p50_s": percentile(lat, 50),
            "output_token_throughput": tokens / dur, "request_throughput": n / dur, "output_tokens": tokens,
            "duration_s": dur}


def ours(url, model, prompts, max_tokens, concurrency, requests, tokenizer_dir) -> dict:
    settings = BenchSettings(concurrency=(concurrency,), requests=requests, warmup=2, output_lens=(max_tokens,),
                             sampling=Sampling(max_tokens=max_tokens), speculative_model=model, baseline_model=None,
                             block=requests)  # one block: a steady closed loop, like perf_analyzer's
    cpu0 = time.process_time()
    res = run_bench(url, prompts, settings, tokenizer=tokenizer_dir)
    cpu = time.process_time() - cpu0
    s = res.levels[0].summary("speculative")  # the numbers `trtspec bench` reports
    return {"requests": s["requests"], "ttft_mean_s": s["ttft_s"]["mean"], "ttft_p50_s": s["ttft_s"]["p50"],
            "request_latency_mean_s": s["request_latency_s"]["mean"],
            "request_latency_p50_s": s["request_latency_s"]["p50"],
            "output_token_throughput": s["output_token_throughput"], "request_throughput": s["request_throughput"],
            "output_tokens": s["output_tokens"], "duration_s": s["duration_s"],
            # the client's own CPU on a 2-core box competes with the server it measures
            "client_cpu_s_per_request": cpu / (requests + settings.warmup + concurrency - 1)}


@contextlib.contextmanager
def tiny_server(work: pathlib.Path, nice: int = 0):
    from trtspec.config import load_recipe
    from trtspec.triton.render import package
    from trtspec.triton.launch.server import TritonServer

    recipe = load_recipe(ROOT / "build_configs" / "tiny-cpu-draft-target.yaml")
    package(recipe, work / "repo")
    with TritonServer(work / "repo", workdir=work / "server", ready_timeout=240) as s:
        if nice:  # the server runs in its own process group (python stubs included)
            os.setpriority(os.PRIO_PGRP, s.proc.pid, nice)
        yield s.endpoints.grpc


def _median_of(runs: list[dict]) -> dict:
    """Per metric, the median over rounds (robust to a round disturbed by other load)."""
    return {k: percentile([r[k] for r in runs], 50) for k in runs[0]}


COMPARED = ("ttft_mean_s", "ttft_p50_s", "request_latency_mean_s", "request_latency_p50_s",
            "output_token_throughput", "request_throughput")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", help="an already running server (default: start the tiny CPU deployment)")
    ap.add_argument("--model", default="ensemble_baseline")
    ap.add_argument("--tokenizer", default=str(ROOT / "models" / "tiny-target"))
    ap.add_argument("--concurrency", default="1,4")
    ap.add_argument("--requests", type=int, default=24)
    ap.add_argument("--rounds", type=int, default=5, help="alternating rounds per level; medians are compared")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--num-prompts", type=int, default=16)
    ap.add_argument("--prompt-len", type=int, default=64, help="tokens per prompt (cut/extended)")
    ap.add_argument("--perf-venv", default=str(ROOT / ".venv-perf"))
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    ap.add_argument("--nice", type=int, default=0,
                    help="scheduling priority for the server, both clients and this script (e.g. -10, needs root): "
                         "on a shared box other work's CPU load otherwise swamps the comparison")
    args = ap.parse_args()
    if args.nice:
        os.setpriority(os.PRIO_PROCESS, 0, args.nice)  # perf_analyzer, a child, inherits it

    binary, env = perf_analyzer_env(pathlib.Path(args.perf_venv))
    tok = load_tokenizer(args.tokenizer)
    # equal-length prompts (as GenAI-Perf's synthetic inputs): perf_analyzer walks its input list in
    # its own order per concurrent stream, so with mixed lengths the two tools would prefill
    # different prompt mixes and TTFT would differ for that reason alone
    prompts = [p.text for p in shape_prompts(load_prompts("builtin:code", args.num_prompts), [args.prompt_len], tok)]
    levels = [int(c) for c in args.concurrency.split(",")]
    rows = []
    with tempfile.TemporaryDirectory(prefix="trtspec-agreement-") as tmp:
        work = pathlib.Path(tmp)
        with (contextlib.nullcontext(args.url) if args.url else tiny_server(work, args.nice)) as url:
            for c in levels:
                t0 = time.time()
                runs: dict[str, list[dict]] = {"trtspec": [], "perf_analyzer": []}
                for i in range(args.rounds):  # alternate who goes first: the box is shared, load drifts
                    for tool in (("perf_analyzer", "trtspec") if i % 2 == 0 else ("trtspec", "perf_analyzer")):
                        if tool == "trtspec":
                            runs[tool].append(ours(url, args.model, prompts, args.max_tokens, c, args.requests,
                                                   args.tokenizer))
                        else:
                            pa = run_perf_analyzer(binary, env, url, args.model, prompts, args.max_tokens, c,
                                                   args.requests, work)
                            runs[tool].append(genai_perf_metrics(pa["export"], tok))
                a, b = (_median_of(runs[t]) for t in ("trtspec", "perf_analyzer"))
                diff = {k: (a[k] - b[k]) / b[k] for k in COMPARED}
                rows.append({"concurrency": c, "trtspec": a, "perf_analyzer": b, "relative_difference": diff,
                             "within_tolerance": all(abs(v) <= TOLERANCE for v in diff.values()),
                             "rounds": runs, "perf_analyzer_argv": pa["argv"][1:],
                             "load_average": os.getloadavg(), "wall_s": round(time.time() - t0, 1)})
                print(f"c={c}: " + ", ".join(f"{k} {v:+.1%}" for k, v in diff.items()), flush=True)
    result = {
        "what": "trtspec bench metrics vs perf_analyzer 2.51 (GenAI-Perf formulas over its profile export)",
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.platform()}",
        "server": args.url or "tiny CPU deployment (build_configs/tiny-cpu-draft-target.yaml), tritonserver 2.51",
        "model": args.model, "prompts": f"builtin:code x{args.num_prompts}, {args.prompt_len} tokens each", "max_tokens": args.max_tokens,
        "requests_per_level": args.requests, "rounds": args.rounds, "nice": args.nice, "tolerance": TOLERANCE, "levels": rows,
        "all_within_tolerance": all(r["within_tolerance"] for r in rows),
    }
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    lines = [f"# Metric agreement: trtspec bench vs perf_analyzer ({result['date']})", "",
             f"{result['what']}. Model `{args.model}`, {result['prompts']}, max_tokens {args.max_tokens}, "
             f"{args.requests} requests per level and round, {args.rounds} alternating rounds per tool (medians "
             f"compared), greedy, streaming. Machine: {result['machine']} (shared with other work; server, clients "
             f"and script at nice {args.nice}).", "",
             f"Command: `{' '.join(['.venv/bin/python', 'scripts/bench_metric_agreement.py', *sys.argv[1:]])}`", "",
             "Medians over rounds; in brackets the range over rounds of each tool (the spread the shared "
             "machine adds), and the median of the per-round paired differences (back-to-back runs).", "",
             "| concurrency | metric | trtspec | perf_analyzer | difference | paired difference |",
             "|---:|---|---:|---:|---:|---:|"]

    def rng(runs, k, scale):
        vals = [x[k] * scale for x in runs]
        return f"[{min(vals):.1f}–{max(vals):.1f}]"

    for r in rows:
        for k in COMPARED:
            scale, unit = (1e3, " ms") if k.endswith("_s") else (1, "/s")
            ours_r, pa_r = r["rounds"]["trtspec"], r["rounds"]["perf_analyzer"]
            paired = percentile([(a[k] - b[k]) / b[k] for a, b in zip(ours_r, pa_r)], 50)
            r.setdefault("paired_difference", {})[k] = paired
            lines.append(f"| {r['concurrency']} | {k.removesuffix('_s')} | {r['trtspec'][k] * scale:.2f}{unit} "
                         f"{rng(ours_r, k, scale)} | {r['perf_analyzer'][k] * scale:.2f}{unit} {rng(pa_r, k, scale)} | "
                         f"{r['relative_difference'][k]:+.1%} | {paired:+.1%} |")
    lines += ["", "Load average during the levels: "
              + ", ".join(f"c={r['concurrency']}: {r['load_average'][0]:.1f}" for r in rows) + " (2 cores)."]
    lines += ["", f"All within ±{TOLERANCE:.0%}: **{'yes' if result['all_within_tolerance'] else 'no'}**.", ""]
    (out / "metric_agreement.md").write_text("\n".join(lines))
    (out / "metric_agreement.json").write_text(json.dumps(result, indent=2) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
