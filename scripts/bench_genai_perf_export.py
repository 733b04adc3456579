"""Does trtspec's ``profile_export_genai_perf.json`` read like genai-perf 0.0.16's? Same server,
same load: keys, units and numbers.

Per concurrency level, alternating rounds of

* ``genai-perf profile`` (0.0.16, its own venv, driving perf_analyzer 2.51) on the tiny CPU
  deployment, the same prompts (``--input-file``, 64 tokens each), 32 output tokens, streaming;
* ``trtspec bench`` (the same model, prompts of 64 tokens, max_tokens 32, the same closed loop),
  writing its exports.

Then: (1) the two JSON files have the same metric keys, the same statistics per metric and the
same units; (2) the numbers (medians over rounds) agree within 10 %; (3) genai-perf's own parser,
run on trtspec's per-request ``profile_export.json``, reproduces trtspec's
``profile_export_genai_perf.json`` (same formulas: differences are rounding only).

Setup (once)::

    python3 -m venv .venv-perf
    .venv-perf/bin/pip install genai-perf==0.0.16 'tritonclient[all]==2.51.0' 'pandas<2.3'

Usage::

    .venv/bin/python scripts/bench_genai_perf_export.py [--nice -10]

Writes bench/results/genai_perf_export.{json,md}.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import importlib.util
import json
import os
import pathlib
import platform
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

from trtspec.client.exports import write_exports
from trtspec.client.loadgen import BenchSettings, run_bench, shape_prompts
from trtspec.client.client import load_tokenizer
from trtspec.client.types import Sampling
from trtspec.prompts import load_prompts

ROOT = pathlib.Path(__file__).resolve().parent.parent
TOLERANCE = 0.10
COMPARED = [("time_to_first_token", "avg"), ("time_to_first_token", "p50"), ("time_to_first_token", "p90"),
            ("inter_token_latency", "avg"), ("inter_token_latency", "p50"),
            ("request_latency", "avg"), ("request_latency", "p50"), ("request_latency", "p90"),
            ("output_sequence_length", "avg"), ("output_token_throughput", "avg"), ("request_throughput", "avg")]


def _sibling(name: str):
    """scripts/ is not a package: load a sibling script as a module (its perf_analyzer and server helpers)."""
    spec = importlib.util.spec_from_file_location(name, pathlib.Path(__file__).with_name(f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def run_genai_perf(venv: pathlib.Path, env: dict, url: str, model: str, tokenizer: str, concurrency: int,
                   requests: int, prompts: list[str], max_tokens: int, work: pathlib.Path, tag: str) -> dict:
    art = work / f"gp_{tag}"
    inputs = work / "prompts.jsonl"  # the same prompts as trtspec's run (not genai-perf's synthetic text)
    inputs.write_text("".join(json.dumps({"text": p}) + "\n" for p in prompts))
    argv = [str(venv / "bin" / "genai-perf"), "profile", "-m", model, "--endpoint-type", "kserve",
            "--backend", "tensorrtllm", "-u", url, "--streaming", "--concurrency", str(concurrency),
            "--request-count", str(requests), "--warmup-request-count", str(max(2, concurrency)),
            "--input-file", str(inputs), "--output-tokens-mean", str(max_tokens), "--tokenizer", tokenizer, "--random-seed", "0",
            "--artifact-dir", str(art), "--profile-export-file", "profile_export.json"]
    for attempt in (1, 2):
        proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900)
        # genai-perf 0.0.16 now and then reads perf_analyzer's export before it is complete (seen
        # cut at exactly 320 KiB: "Failed to parse JSON string"); that run is repeated once, as is
        if proc.returncode == 0 or attempt == 2 or "Failed to parse JSON string" not in proc.stdout + proc.stderr:
            break
        print(f"genai-perf read a truncated export ({tag}); running it again", flush=True)
        shutil.rmtree(art, ignore_errors=True)
    if proc.returncode != 0:
        sys.exit(f"genai-perf failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    found = sorted(art.rglob("profile_export_genai_perf.json"))
    if not found:
        sys.exit(f"genai-perf wrote no profile_export_genai_perf.json under {art}")
    return {"argv": argv, "json": json.loads(found[0].read_text()), "csv": found[0].with_suffix(".csv").read_text()}


def run_ours(url: str, model: str, tokenizer: str, prompts: list[str], concurrency: int, requests: int,
             max_tokens: int, work: pathlib.Path, tag: str) -> dict:
    settings = BenchSettings(concurrency=(concurrency,), requests=requests, warmup=max(2, concurrency),
                             output_lens=(max_tokens,), sampling=Sampling(max_tokens=max_tokens),
                             speculative_model=model, baseline_model=None, block=requests)
    res = run_bench(url, prompts, settings, tokenizer=tokenizer)
    files = write_exports(res, work / f"ours_{tag}" / "exports")
    folder = work / f"ours_{tag}" / pathlib.Path(next(iter(files.values()))).parent
    return {"json": json.loads((folder / "profile_export_genai_perf.json").read_text()),
            "csv": (folder / "profile_export_genai_perf.csv").read_text(),
            "profile_export": folder / "profile_export.json"}


REPARSE = r"""
import json, sys
from genai_perf.profile_data_parser import LLMProfileDataParser
from genai_perf.tokenizer import Tokenizer
tok = Tokenizer(); tok.set_tokenizer(sys.argv[2], False, "main")
pd = LLMProfileDataParser(filename=sys.argv[1], tokenizer=tok)
st = pd.get_statistics("concurrency", sys.argv[3])
st.scale_data()
print(json.dumps(st.stats_dict))
"""


def reparse_with_genai_perf(venv: pathlib.Path, export: pathlib.Path, tokenizer: str, concurrency: int) -> dict:
    """genai-perf's own parser on trtspec's per-request export."""
    proc = subprocess.run([str(venv / "bin" / "python"), "-c", REPARSE, str(export), tokenizer, str(concurrency)],
                          capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        sys.exit(f"genai-perf's parser failed on our export:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def shape(d: dict) -> dict:
    """{metric: (sorted stat keys, unit)} without input_config."""
    return {k: (sorted(x for x in v if x != "unit"), v.get("unit")) for k, v in d.items() if k != "input_config"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", help="an already running server (default: start the tiny CPU deployment)")
    ap.add_argument("--model", default="ensemble_baseline")
    ap.add_argument("--tokenizer", default=str(ROOT / "models" / "tiny-target"))
    ap.add_argument("--concurrency", default="1,4")
    ap.add_argument("--requests", type=int, default=24)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--perf-venv", default=str(ROOT / ".venv-perf"))
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    ap.add_argument("--nice", type=int, default=0)
    args = ap.parse_args()
    if args.nice:
        os.setpriority(os.PRIO_PROCESS, 0, args.nice)
    agreement = _sibling("bench_metric_agreement")
    venv = pathlib.Path(args.perf_venv)
    if not (venv / "bin" / "genai-perf").is_file():
        sys.exit(f"no genai-perf in {venv}: see this script's docstring")
    _, env = agreement.perf_analyzer_env(venv)
    env["PATH"] = f"{venv / 'bin'}:{env.get('PATH', '')}"  # genai-perf runs `perf_analyzer` from PATH
    tok = load_tokenizer(args.tokenizer)
    prompts = [p.text for p in shape_prompts(load_prompts("builtin:code", 16), [args.prompt_len], tok)]
    rows = []
    with tempfile.TemporaryDirectory(prefix="trtspec-genai-perf-") as tmp:
        work = pathlib.Path(tmp)
        server = contextlib.nullcontext(args.url) if args.url else agreement.tiny_server(work, args.nice)
        with server as url:
            for c in [int(x) for x in args.concurrency.split(",")]:
                t0 = time.time()
                runs: dict[str, list[dict]] = {"trtspec": [], "genai-perf": []}
                for i in range(args.rounds):
                    for tool in (("genai-perf", "trtspec") if i % 2 == 0 else ("trtspec", "genai-perf")):
                        tag = f"c{c}_r{i}"
                        if tool == "trtspec":
                            runs[tool].append(run_ours(url, args.model, args.tokenizer, prompts, c, args.requests,
                                                       args.max_tokens, work, tag))
                        else:
                            runs[tool].append(run_genai_perf(venv, env, url, args.model, args.tokenizer, c,
                                                             args.requests, prompts, args.max_tokens, work, tag))
                ours_shape, theirs_shape = shape(runs["trtspec"][0]["json"]), shape(runs["genai-perf"][0]["json"])
                same_shape = ours_shape == theirs_shape
                csv_rows = [ln.split(",")[0] for ln in runs["trtspec"][0]["csv"].splitlines()]
                csv_theirs = [ln.split(",")[0] for ln in runs["genai-perf"][0]["csv"].splitlines()]
                med = {t: {f"{m}.{s}": float(np.median([r["json"][m][s] for r in rs])) for m, s in COMPARED}
                       for t, rs in runs.items()}
                diff = {k: (med["trtspec"][k] - med["genai-perf"][k]) / med["genai-perf"][k] for k in med["trtspec"]}
                re = reparse_with_genai_perf(venv, runs["trtspec"][0]["profile_export"], args.tokenizer, c)
                ours0 = runs["trtspec"][0]["json"]
                reparse = {f"{m}.{s}": (ours0[m][s] - re[m][s]) / re[m][s] for m, s in COMPARED
                           if m in re and s in re[m] and re[m][s]}
                rows.append({
                    "concurrency": c, "same_keys_and_units": same_shape,
                    "keys_only_in_trtspec": sorted(set(ours_shape) - set(theirs_shape)),
                    "keys_only_in_genai_perf": sorted(set(theirs_shape) - set(ours_shape)),
                    "shape_differences": {k: {"trtspec": ours_shape.get(k), "genai-perf": theirs_shape.get(k)}
                                          for k in set(ours_shape) | set(theirs_shape)
                                          if ours_shape.get(k) != theirs_shape.get(k)},
                    "csv_first_column_equal": [r for r in csv_rows if r] [:len([r for r in csv_theirs if r])]
                    == [r for r in csv_theirs if r],
                    "median": med, "relative_difference": diff,
                    "within_tolerance": all(abs(v) <= TOLERANCE for v in diff.values()),
                    "genai_perf_parser_on_our_export": reparse,
                    "genai_perf_argv": runs["genai-perf"][0]["argv"][1:],
                    "load_average": os.getloadavg(), "wall_s": round(time.time() - t0, 1),
                })
                print(f"c={c}: same keys/units {same_shape}; "
                      + ", ".join(f"{k} {v:+.1%}" for k, v in diff.items()), flush=True)
    result = {
        "what": "trtspec's profile_export_genai_perf.json vs genai-perf 0.0.16's, same server and load",
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.platform()}",
        "model": args.model, "requests": args.requests, "rounds": args.rounds, "max_tokens": args.max_tokens,
        "prompt_len": args.prompt_len, "nice": args.nice, "tolerance": TOLERANCE, "levels": rows,
        "all_same_keys_and_units": all(r["same_keys_and_units"] for r in rows),
        "all_within_tolerance": all(r["within_tolerance"] for r in rows),
    }
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "genai_perf_export.json").write_text(json.dumps(result, indent=2) + "\n")
    lines = [f"# trtspec's GenAI-Perf export vs genai-perf 0.0.16 ({result['date']})", "",
             f"Model `{args.model}` on the tiny CPU deployment; {args.prompt_len}-token prompts, max_tokens "
             f"{args.max_tokens}, {args.requests} requests per round, {args.rounds} alternating rounds per tool and "
             f"level (medians compared); greedy, streaming. Machine: {result['machine']} (shared; nice {args.nice}).",
             "", f"Command: `.venv/bin/python scripts/bench_genai_perf_export.py {' '.join(sys.argv[1:])}`", "",
             "| concurrency | same keys, stats and units | CSV rows match | metric | trtspec | genai-perf | difference "
             "| genai-perf's parser on our per-request export |", "|---:|:---:|:---:|---|---:|---:|---:|---:|"]
    for r in rows:
        for k in r["relative_difference"]:
            lines.append(f"| {r['concurrency']} | {'yes' if r['same_keys_and_units'] else '**no**'} | "
                         f"{'yes' if r['csv_first_column_equal'] else '**no**'} | {k} | {r['median']['trtspec'][k]:.2f} | "
                         f"{r['median']['genai-perf'][k]:.2f} | {r['relative_difference'][k]:+.1%} | "
                         f"{r['genai_perf_parser_on_our_export'].get(k, float('nan')):+.2%} |")
    lines += ["", f"Same keys and units at every level: **{'yes' if result['all_same_keys_and_units'] else 'no'}**; "
              f"all numbers within ±{TOLERANCE:.0%}: **{'yes' if result['all_within_tolerance'] else 'no'}**.", ""]
    for r in rows:
        if r["shape_differences"]:
            lines.append(f"Shape differences at c={r['concurrency']}: `{json.dumps(r['shape_differences'])}`")
    (out / "genai_perf_export.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
