"""The torch runtime from the command line: `generate` and `tune`."""

from __future__ import annotations

import json
import os

import click
from rich.table import Table

from trtspec.config import TORCH_METHODS, draft_option_problem, load_recipe
from trtspec.prompts import load_prompts
from trtspec.speculative.spec import RuntimeSpec
from trtspec.speculative.runtime import build_engine
from trtspec.sampling import Sampling
from trtspec.speculative.tune import tune as run_tune
from trtspec.trtllm.bench import bench_plan, read_reports, run_bench
from trtspec.cli.common import handle_errors, out


def _runtime_options(fn):
    """Options shared by `generate` and `tune`: which target, which proposer."""
    opts = [
        click.option("--target", type=click.Path(file_okay=False), help="Target HF checkpoint folder (required)."),
        click.option("--draft", type=click.Path(file_okay=False), help="Draft model folder (draft-target)."),
        click.option("--method", type=click.Choice(TORCH_METHODS), default=None,
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
        click.option("--draft-vocab-size", type=click.IntRange(64), default=None,
                     help="Draft over the N most frequent tokens only (draft-target; a multiple of 64; "
                          "speculation.draft_vocab_size); outputs do not change."),
    ]
    for o in reversed(opts):
        fn = o(fn)
    return fn


def _runtime_spec(target, draft, method, head, max_draft_len, ngram_size, dtype, device, threads, adaptive,
                  draft_weight_only="none", compile_draft=False, draft_vocab_size=None, max_batch_size=1,
                  max_seq_len=2048):

    if method is None:
        method = "draft_target" if draft else ("eagle3" if head else "none")
    if method == "draft_target" and not draft:
        raise click.UsageError("--method draft_target needs --draft DIR")
    if method == "eagle3" and not head:
        raise click.UsageError("--method eagle3 needs --head DIR")
    if draft and method not in ("draft_target",):
        raise click.UsageError(f"--draft is only used with --method draft_target (got --method {method})")
    problem = draft_option_problem(method, "torch", draft_weight_only, compile_draft)
    if problem is not None:
        flag = "--" + problem[0].removeprefix("runtime.").replace("_", "-")
        raise click.UsageError(f"{flag}: {problem[2]}")
    if draft_vocab_size is not None and (method != "draft_target" or draft_vocab_size % 64):
        raise click.UsageError(f"--draft-vocab-size {draft_vocab_size}: needs --draft (draft-target) and a multiple "
                               "of 64")
    return RuntimeSpec(
        target=target, method=method, draft=draft or head, max_draft_len=max_draft_len,
        draft_vocab_size=draft_vocab_size,
        max_matching_ngram_size=ngram_size,
        runtime={"dtype": dtype, "device": device, "torch_threads": threads, "adaptive": {"enabled": adaptive},
                 "draft_weight_only": draft_weight_only, "compile_draft": compile_draft},
        limits={"max_batch_size": max_batch_size, "max_seq_len": max_seq_len},
    )


@click.command()
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
             draft_weight_only, compile_draft, draft_vocab_size, prompt, max_new_tokens, temperature, top_k, top_p, seed, as_json):
    """Generate with the torch runtime: plain decoding, or speculation with a draft model, an
    EAGLE-3 head or n-gram prompt lookup. Greedy speculation is token-identical to plain decoding."""
    if not target:
        raise click.UsageError("missing option --target (the target HF checkpoint folder)")
    from transformers import AutoTokenizer


    spec = _runtime_spec(target, draft, method, head, max_draft_len, ngram_size, dtype, device, threads, adaptive,
                         draft_weight_only, compile_draft, draft_vocab_size)
    params = Sampling(max_tokens=max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)
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
        "draft_weight_only": spec.runtime.draft_weight_only, "compile_draft": spec.runtime.compile_draft,
        "draft_vocab_size": spec.draft_vocab_size,
    }
    if as_json:
        click.echo(json.dumps({"token_ids": g.token_ids, "text": text, "stats": stats}))
        return
    out.print(text, markup=False)
    out.print(f"[dim]{len(g.token_ids)} tokens, {st.tokens_per_s:.1f} tok/s, method {spec.method}, "
              f"acceptance rate {st.acceptance_rate:.2f}, acceptance length {st.acceptance_length:.2f}, "
              f"draft {st.draft_s * 1e3:.0f} ms, verify {st.verify_s * 1e3:.0f} ms[/]")


@click.command()
@_runtime_options
@click.option("--prompts", "prompt_source", default="builtin:stdlib", show_default=True,
              help="builtin:stdlib|code|chat|mixed or a .jsonl/.txt file.")
@click.option("--num-prompts", default=16, show_default=True, type=click.IntRange(1))
@click.option("--max-new-tokens", default=64, show_default=True, type=click.IntRange(1))
@click.option("--k-max", default=8, show_default=True, type=click.IntRange(1, 32), help="Longest draft measured.")
@click.option("--trtllm", "trtllm_recipe", type=click.Path(dir_okay=False), default=None,
              help="Tune on TensorRT-LLM instead: a trtllm-pytorch RECIPE; plans trtllm-bench runs over max_draft_len "
                   "(LLM-API flow) and reads their reports (docs/trtllm.md).")
@click.option("--k-values", default=None, help="--trtllm: draft lengths to run, e.g. 1,2,3,4,6,8 (0 is always run).")
@click.option("--build-dir", type=click.Path(file_okay=False), default=None,
              help="--trtllm: the recipe's build folder (default build/<recipe name>).")
@click.option("--bench-dir", type=click.Path(file_okay=False), default=None,
              help="--trtllm: where the runs' files and reports go (default <build dir>/tune).")
@click.option("--dry-run", is_flag=True, help="--trtllm: print the plan; write and run nothing.")
@click.option("--json", "as_json", is_flag=True)
@handle_errors
def tune(target, draft, method, head, max_draft_len, ngram_size, dtype, device, threads, adaptive,
         draft_weight_only, compile_draft, draft_vocab_size, prompt_source, num_prompts, max_new_tokens, k_max, trtllm_recipe,
         k_values, build_dir, bench_dir, dry_run, as_json):
    """Recommend max_draft_len from measured per-position acceptance α_i, draft cost c and verify cost v_k.

    Expected speedup S(k) = (1 + Σ_{i≤k} Π_{j≤i} α_j) / (k·c + v_k)  (Leviathan et al., generalised).
    With --trtllm RECIPE: measured on TensorRT-LLM with trtllm-bench, one run per max_draft_len.
    """
    if trtllm_recipe:
        _tune_trtllm(trtllm_recipe, k_values, build_dir, bench_dir, dry_run, as_json)
        return
    if dry_run or k_values or build_dir or bench_dir:
        raise click.UsageError("--dry-run, --k-values, --build-dir and --bench-dir go with --trtllm RECIPE")
    if not target:
        raise click.UsageError("missing option --target (or --trtllm RECIPE)")
    from transformers import AutoTokenizer


    spec = _runtime_spec(target, draft, method, head, k_max, ngram_size, dtype, device, threads, False,
                         draft_weight_only, compile_draft, draft_vocab_size)
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


def _tune_trtllm(recipe_path, k_values, build_dir, bench_dir, dry_run, as_json) -> None:
    """`trtspec tune --trtllm`: plan (and run) trtllm-bench over max_draft_len, print the table."""
    recipe = load_recipe(recipe_path)
    ks = None
    if k_values:
        try:
            ks = [int(v) for v in k_values.split(",") if v.strip()]
        except ValueError:
            raise click.UsageError(f"--k-values {k_values!r}: a comma-separated list of integers, e.g. 1,2,4") from None
    build_dir = os.path.abspath(build_dir or os.path.join("build", recipe.name))
    bench_dir = os.path.abspath(bench_dir or os.path.join(build_dir, "tune"))
    prompts = load_prompts(recipe.validation.prompts, recipe.validation.num_prompts)
    plan = bench_plan(recipe, bench_dir, build_dir=build_dir, prompts=prompts, draft_lens=ks)
    if dry_run:
        if as_json:
            click.echo(json.dumps(plan.to_dict(), indent=2))
        else:
            out.print(plan.describe(), markup=False, highlight=False, end="")
        return
    run_bench(plan, on_command=None if as_json else lambda argv: out.print(f"$ {' '.join(argv)}", markup=False))
    res = read_reports(plan)
    if as_json:
        click.echo(json.dumps(res.to_dict(), indent=2))
        return
    table = Table(title=f"trtspec tune --trtllm ({recipe.name}, trtllm-bench, baseline {res.baseline_tok_s:.1f} "
                        "output tok/s)")
    for col in ("max_draft_len", "α at k", "E[tokens/pass]", "cost/pass (target steps)", "measured speedup"):
        table.add_column(col, justify="right")
    for r in res.rows:
        mark = " ◀" if r.k == res.recommended_k else ""
        table.add_row(str(r.k), "-", f"{r.expected_tokens_per_pass:.2f}", f"{r.cost_per_pass:.2f}",
                      f"{r.expected_speedup:.2f}×{mark}")
    out.print(table)
    out.print(f"[bold]recommended max_draft_len: {res.recommended_k}[/]"
              + (" (speculation does not pay here: keep ordinary decoding)" if res.recommended_k == 0 else ""))
