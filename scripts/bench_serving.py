"""Serving overhead: client-observed tokens/s through Triton vs the in-process engine, same prompts.

    .venv/bin/python scripts/bench_serving.py [--config build_configs/tiny-cpu-draft-target.yaml]

Packages the recipe into a temporary repository, starts tritonserver, then for every prompt and
repeat runs, back to back (so a busy machine slows both alike):

  in-process   Engine.generate([prompt]) on the same RuntimeSpec, in this process
  triton       one gRPC stream request through `ensemble` (or `ensemble_baseline`), timed by the
               client from send to the final response (stream=true and stream=false)

tokens/s = generated tokens / wall time, summed over prompts; ratio = triton / in-process (goal:
>= 0.9). Writes bench/results/serving_overhead.json and .md.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import queue
import statistics
import sys
import tempfile
import time

# Before torch loads. On a machine shared with other jobs, OpenMP threads that spin while waiting
# make a 2-core box 10-20x slower (measured: 16 tokens in 4.1 s instead of 0.25 s): there, run
# with OMP_WAIT_POLICY=passive. On a quiet machine leave it unset: passive waits cost ~3 ms per
# forward of the tiny target in-process. Both sides get the same setting: the server inherits it.

import numpy as np  # noqa: E402
import torch  # noqa: E402
import tritonclient.grpc as grpcclient  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from bench_engine import cache_pressure  # noqa: E402  (scripts/bench_engine.py: the project's one reading)

from trtspec.config import load_recipe
from trtspec.prompts import load_prompts
from trtspec.speculative.runtime import RuntimeSpec, build_engine
from trtspec.sampling import Sampling
from trtspec.triton.render import package
from trtspec.triton.launch.server import TritonServer

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _inputs(text: str, max_tokens: int, stream: bool) -> list:
    out = []
    for name, value, dt, np_dt in (("text_input", text.encode(), "BYTES", np.object_),
                                   ("max_tokens", max_tokens, "INT32", np.int32), ("stream", stream, "BOOL", bool)):
        t = grpcclient.InferInput(name, [1, 1], dt)
        t.set_data_from_numpy(np.array([[value]], dtype=np_dt))
        out.append(t)
    return out


class StreamClient:
    """One gRPC stream, one request at a time; returns (seconds, token ids, responses)."""

    def __init__(self, url: str):
        self.client = grpcclient.InferenceServerClient(url)
        self.q: queue.Queue = queue.Queue()
        self.client.start_stream(callback=lambda result, error: self.q.put((time.perf_counter(), result, error)))

    def run(self, model: str, text: str, max_tokens: int, stream: bool) -> tuple[float, list[int], int, dict]:
        """(client-observed seconds, ids, responses, the engine's RequestStats dict)."""
        t0 = time.perf_counter()
        self.client.async_stream_infer(model, _inputs(text, max_tokens, stream), enable_empty_final_response=True)
        ids, n = [], 0
        while True:
            t, result, error = self.q.get(timeout=300)
            if error is not None:
                raise RuntimeError(f"{model}: {error}")
            out = result.as_numpy("output_ids")
            if out is not None:
                ids += out.reshape(-1).tolist()
                n += 1
            if result.get_response().parameters["triton_final_response"].bool_param:
                return t - t0, ids, n, json.loads(result.as_numpy("perf_json").reshape(-1)[0])

    def close(self) -> None:
        self.client.stop_stream()
        self.client.close()


def machine_load() -> str:
    """The machine's load while measuring (these boxes are shared and noisy): the 1-minute load
    average against the cores, and the memory in page cache vs available."""
    load1 = os.getloadavg()[0]
    mem = {}
    try:
        for line in open("/proc/meminfo"):
            k, v = line.split(":")
            mem[k] = int(v.split()[0]) // 1024
    except OSError:
        pass
    return (f"load {load1:.2f} on {os.cpu_count()} cores; page cache {mem.get('Cached', 0)} MiB, "
            f"available {mem.get('MemAvailable', 0)} MiB")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(ROOT / "build_configs" / "tiny-cpu-draft-target.yaml"))
    ap.add_argument("--prompts", default="builtin:code")
    ap.add_argument("--num-prompts", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--torch-threads", type=int, default=None,
                    help="Override runtime.torch_threads for both sides (default: the recipe's).")
    ap.add_argument("--engine-process", choices=["worker", "thread"], default=None,
                    help="Override serving.engine_process (default: the recipe's). thread writes "
                         "serving_overhead_thread.{json,md}, so both can be kept side by side.")
    ap.add_argument("--stream-interval", type=int, default=None,
                    help="Override serving.stream_interval (default: the recipe's); N > 1 writes "
                         "serving_overhead[_thread]_si<N>.{json,md}.")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = ap.parse_args(argv)

    recipe = load_recipe(args.config)
    if args.engine_process:
        recipe = recipe.model_copy(update={"serving": recipe.serving.model_copy(
            update={"engine_process": args.engine_process})})
    if args.stream_interval:
        recipe = recipe.model_copy(update={"serving": recipe.serving.model_copy(
            update={"stream_interval": args.stream_interval})})
    mode = recipe.serving.engine_process
    stem = "serving_overhead" if mode == "worker" else f"serving_overhead_{mode}"
    if recipe.serving.stream_interval > 1:
        stem += f"_si{recipe.serving.stream_interval}"
    if args.torch_threads:
        rt = recipe.runtime.model_copy(update={"torch_threads": args.torch_threads})
        recipe = recipe.model_copy(update={"runtime": rt})
    spec = RuntimeSpec.from_recipe(recipe)
    engines = {"ensemble": build_engine(spec),
               "ensemble_baseline": build_engine(spec.baseline())}
    k_verify = max(spec.max_draft_len, 1)
    pressure_before = cache_pressure(engines["ensemble"].target, k_verify)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(recipe.target.tokenizer or recipe.target.model)
    prompts = load_prompts(args.prompts, args.num_prompts)
    ids = [tok(p, add_special_tokens=False)["input_ids"][: recipe.limits.max_input_len] for p in prompts]
    prompts = [tok.decode(i) for i in ids]
    params = Sampling(max_tokens=args.max_tokens)

    rows = {}
    with tempfile.TemporaryDirectory(prefix="trtspec-bench-") as tmp:
        package(recipe, pathlib.Path(tmp) / "repo")
        t0 = time.perf_counter()
        with TritonServer(pathlib.Path(tmp) / "repo", ready_timeout=recipe.serving.ready_timeout_s) as server:
            startup = time.perf_counter() - t0
            client = StreamClient(server.endpoints.grpc)
            for model, engine in engines.items():
                for p, i in zip(prompts[:2], ids[:2]):  # warm-up both sides
                    engine.generate([i], params)
                    client.run(model, p, args.max_tokens, True)
                acc = {"in_process": [0.0, 0], "triton_stream": [0.0, 0], "triton_unary": [0.0, 0],
                       "server_engine": [0.0, 0]}
                ratios, responses, mismatches = [], [], 0
                for _ in range(args.repeats):
                    for p, i in zip(prompts, ids):
                        t = time.perf_counter()
                        g = engine.generate([i], params)[0]
                        t_in = time.perf_counter() - t
                        s_dt, s_ids, n, perf = client.run(model, p, args.max_tokens, True)
                        u_dt, u_ids, _, _ = client.run(model, p, args.max_tokens, False)
                        mismatches += (s_ids != g.token_ids) + (u_ids != g.token_ids)
                        for k, (dt, toks) in {"in_process": (t_in, len(g.token_ids)), "triton_stream": (s_dt, len(s_ids)),
                                              "triton_unary": (u_dt, len(u_ids)),
                                              "server_engine": (perf["total_s"], perf["generated"])}.items():
                            acc[k][0] += dt
                            acc[k][1] += toks
                        ratios.append((len(s_ids) / s_dt) / (len(g.token_ids) / t_in))
                        responses.append(n)
                tps = {k: v[1] / v[0] for k, v in acc.items()}
                rows[model] = {
                    "in_process_tok_s": round(tps["in_process"], 1),
                    "triton_stream_tok_s": round(tps["triton_stream"], 1),
                    "triton_unary_tok_s": round(tps["triton_unary"], 1),
                    "ratio_stream": round(tps["triton_stream"] / tps["in_process"], 3),
                    "ratio_unary": round(tps["triton_unary"] / tps["in_process"], 3),
                    "ratio_stream_median_per_request": round(statistics.median(ratios), 3),
                    # the same stream requests, timed inside the server's engine (prefill to last token)
                    "server_engine_tok_s": round(tps["server_engine"], 1),
                    "ratio_stream_vs_server_engine": round(tps["triton_stream"] / tps["server_engine"], 3),
                    "tokens": acc["in_process"][1],
                    "responses_per_stream_request": round(statistics.mean(responses), 1),
                    "outputs_differing_from_in_process": mismatches,
                }
            client.close()

    result = {
        "recipe": recipe.name, "method": recipe.speculation.method, "max_tokens": args.max_tokens,
        "prompts": len(prompts), "repeats": args.repeats, "torch_threads": spec.runtime.torch_threads,
        "server_startup_s": round(startup, 1), "machine": f"{platform.machine()}, {torch.get_num_threads()} torch threads",
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"), "goal": "ratio >= 0.9", "paths": rows,
        "engine_process": mode, "stream_interval": recipe.serving.stream_interval, "machine_load": machine_load(),
        "cache_pressure": {"before": pressure_before, "after": cache_pressure(engines["ensemble"].target, k_verify)},
    }
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(result, indent=2) + "\n")
    lines = [
        f"# Serving overhead: {recipe.name} ({recipe.speculation.method}), {len(prompts)} prompts × {args.repeats}, "
        f"{args.max_tokens} tokens, greedy, engine_process {mode}, stream_interval {recipe.serving.stream_interval}",
        "",
        "| path | in-process tok/s | Triton stream tok/s | ratio | Triton stream=false tok/s | ratio "
        "| server engine tok/s | stream / server engine | responses/request |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for model, r in rows.items():
        lines.append(f"| {model} | {r['in_process_tok_s']} | {r['triton_stream_tok_s']} | {r['ratio_stream']} | "
                     f"{r['triton_unary_tok_s']} | {r['ratio_unary']} | {r['server_engine_tok_s']} | "
                     f"{r['ratio_stream_vs_server_engine']} | {r['responses_per_stream_request']} |")
    lines += ["", "Client-observed through tritonserver (gRPC stream API, 127.0.0.1) vs Engine.generate in this "
              "process, interleaved prompt by prompt; goal ratio ≥ 0.9. 'server engine' times the same stream "
              "requests inside the server (perf_json total_s), so 'stream / server engine' is the cost of the "
              f"Triton path alone (tokenizer, router, detokenizer, gRPC). OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}, "
              f"torch threads {spec.runtime.torch_threads}. Cache pressure (scripts/bench_engine.py: verify after a "
              f"draft-long pause / back to back) {result['cache_pressure']['before']['pressure']} before, "
              f"{result['cache_pressure']['after']['pressure']} after; {result['machine_load']}. "
              f"Server startup {startup:.1f} s. Outputs differing from "
              f"in-process: {sum(r['outputs_differing_from_in_process'] for r in rows.values())}.", ""]
    (out / f"{stem}.md").write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
