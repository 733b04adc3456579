"""Speculative vs baseline under open-loop load: TTFT, ITL and goodput at several request rates.

Starts the tiny CPU deployment (build_configs/tiny-cpu-draft-target.yaml), then runs
``trtspec bench``'s load generator with Poisson arrivals at each rate, baseline and speculative
interleaved ABBA per rate on the same arrivals, prompts and output lengths, and writes the bench
report (report.md/json, the speedup-vs-load plot) to bench/results/openloop/.

Usage::

    .venv/bin/python scripts/bench_openloop.py [--rates 1,4,8] [--requests 24] [--nice -10]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import pathlib
import tempfile

from trtspec.client.loadgen import BenchSettings, run_bench
from trtspec.client.openloop import parse_goodput
from trtspec.client.types import Sampling
from trtspec.prompts import load_prompts
from trtspec.validate.report import write_bench_report

ROOT = pathlib.Path(__file__).resolve().parent.parent


@contextlib.contextmanager
def tiny_server(work: pathlib.Path, nice: int = 0):
    from trtspec.config import load_recipe
    from trtspec.triton.render import package
    from trtspec.triton.launch.server import TritonServer

    recipe = load_recipe(ROOT / "build_configs" / "tiny-cpu-draft-target.yaml")
    package(recipe, work / "repo")
    with TritonServer(work / "repo", workdir=work / "server", ready_timeout=240) as s:
        if nice:
            os.setpriority(os.PRIO_PGRP, s.proc.pid, nice)
        yield s.endpoints.grpc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", help="an already running server (default: start the tiny CPU deployment)")
    ap.add_argument("--rates", default="1,4,8", help="requests/s, comma-separated")
    ap.add_argument("--requests", type=int, default=24, help="per model and rate (two ABBA blocks)")
    ap.add_argument("--output-len", type=int, default=48)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--goodput", default="ttft:250 itl:10", help="SLOs, METRIC:MS separated by spaces")
    ap.add_argument("--tokenizer", default=str(ROOT / "models" / "tiny-target"))
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "openloop"))
    ap.add_argument("--nice", type=int, default=0)
    args = ap.parse_args()
    if args.nice:
        os.setpriority(os.PRIO_PROCESS, 0, args.nice)
    settings = BenchSettings(request_rates=tuple(float(r) for r in args.rates.split(",")), requests=args.requests,
                             warmup=4, output_lens=(args.output_len,), prompt_lens=(args.prompt_len,),
                             sampling=Sampling(max_tokens=args.output_len), goodput=parse_goodput([args.goodput]),
                             ignore_eos=True)
    prompts = load_prompts("builtin:code", 16)
    with tempfile.TemporaryDirectory(prefix="trtspec-openloop-") as tmp:
        server = contextlib.nullcontext(args.url) if args.url else tiny_server(pathlib.Path(tmp), args.nice)
        with server as url:
            res = run_bench(url, prompts, settings, tokenizer=args.tokenizer, prompt_source="builtin:code")
    write_bench_report(res, args.out)
    d = res.to_dict(with_records=False)
    print(f"{'rate':>6} {'model':<12} {'TTFT p50':>9} {'ITL p50':>8} {'goodput':>8} {'tok/s':>7}")
    for lv in d["levels"]:
        for role, m in lv["models"].items():
            print(f"{lv['load']:>6} {role:<12} {m['ttft_s']['p50'] * 1e3:8.1f}ms {m['itl_s']['p50'] * 1e3:7.2f}ms "
                  f"{m['goodput']['fraction']:8.0%} {m['output_token_throughput']:7.1f}")
        sp = lv["speedup"]
        print(f"{'':>6} speedup: ITL p50 {sp['itl_p50']:.2f}x, TTFT p50 {sp['ttft_p50']:.2f}x, "
              f"latency p50 {sp['request_latency_p50']:.2f}x, goodput {sp['goodput'] or float('nan'):.2f}x")
    print(f"report: {pathlib.Path(args.out) / 'report.md'}")


if __name__ == "__main__":
    main()
