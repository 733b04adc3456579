"""Against a running server: `bench` (load, GenAI-Perf metrics) and `validate` (gates → verdict)."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import replace

import click
from rich.table import Table
from rich.markup import escape

from trtspec.client.errors import EXIT_CODES
from trtspec.client.infer import request_extras, result_dict, run_infer
from trtspec.client.targets import ClientOptions, TLSOptions, parse_headers, parse_target
from trtspec.client.exports import write_exports
from trtspec.client.openloop import load_schedule, parse_goodput
from trtspec.client.loadgen import BenchSettings, run_bench
from trtspec.sampling import Sampling
from trtspec.config import load_recipe
from trtspec.outputs import BENCH_REPORT, VALIDATION_REPORT, check_replaceable, write_atomically
from trtspec.prompts import load_prompts
from trtspec.validate.report import write_bench_report
from trtspec.validate.report import write_validation_report
from trtspec.validate.run import run_validation
from trtspec.cli.common import (
    OptionGroup,
    _int_list,
    _progress,
    _rate_list,
    _url_list,
    err,
    handle_errors,
    out,
    with_groups,
)


URL_HELP = ("The server: HOST:PORT or grpc://HOST:PORT (Triton gRPC), grpcs://HOST:PORT (TLS), or "
            "http(s)://HOST:PORT/v1 (any OpenAI-compatible server, e.g. trtspec serve --openai-port)")


def _exit_codes_epilog() -> str:
    return "\b\nExit codes:\n" + "\n".join(f"  {k}  {v}" for k, v in EXIT_CODES.items())


def _client_options(endpoint, tls_ca, tls_cert, tls_key, tls_server_name, headers) -> ClientOptions:
    return ClientOptions(tls=TLSOptions(ca=tls_ca, cert=tls_cert, key=tls_key, server_name=tls_server_name),
                         headers=parse_headers(headers), endpoint=endpoint)


# --endpoint, --tls-*, --header: how to talk to the --url target (trtspec.client.targets) → ClientOptions
TARGET = OptionGroup("client", _client_options)
TARGET.option("--endpoint", type=click.Choice(["completions", "chat"]), default="completions",
              show_default=True, help="OpenAI-compatible targets: /v1/completions or /v1/chat/completions.")
TARGET.option("--tls-ca", type=click.Path(dir_okay=False), default=None,
              help="PEM CA bundle that signed the server's certificate (grpcs://, https://).")
TARGET.option("--tls-cert", type=click.Path(dir_okay=False), default=None,
              help="PEM client certificate (mutual TLS), with --tls-key.")
TARGET.option("--tls-key", type=click.Path(dir_okay=False), default=None, help="PEM key of --tls-cert.")
TARGET.option("--tls-server-name", default=None,
              help="grpcs://: the name to check in the server's certificate instead of the URL's host "
                   "(e.g. connecting by IP to a certificate for a DNS name).")
TARGET.option("--header", "headers", multiple=True,
              help="'NAME: VALUE' sent with every call (gRPC metadata / HTTP header); repeat for more.")

# --temperature, --top-k, --top-p, --seed → Sampling (max_tokens is the command's: --output-len, --max-tokens)
SAMPLING = OptionGroup("sampling", lambda temperature, top_k, top_p, seed: Sampling(
    temperature=temperature, top_k=top_k, top_p=top_p, seed=seed))
SAMPLING.option("--temperature", default=0.0, show_default=True, type=click.FloatRange(0, 100), help="0 = greedy.")
SAMPLING.option("--top-k", default=None, type=click.IntRange(0))
SAMPLING.option("--top-p", default=None, type=click.FloatRange(0, 1, min_open=True))
SAMPLING.option("--seed", default=None, type=click.IntRange(0))


def _bench_settings(sampling, concurrency, requests, duration, warmup, output_len, prompt_len, spec_model,
                    baseline_model, no_baseline, no_stream, timeout, request_rate, burstiness, max_concurrency,
                    fixed_schedule, arrival_seed, prompt_len_stddev, output_len_stddev, ignore_eos,
                    goodput_specs) -> BenchSettings:
    if requests is not None and duration is not None:
        raise click.UsageError("pass --requests or --duration, not both")
    return BenchSettings(
        concurrency=concurrency, requests=None if duration else (requests or 16), duration_s=duration,
        warmup=warmup, output_lens=output_len, prompt_lens=prompt_len,
        sampling=sampling.with_(max_tokens=output_len[0]),
        speculative_model=spec_model, baseline_model=None if no_baseline else baseline_model,
        stream=not no_stream, timeout_s=timeout, request_rates=request_rate, burstiness=burstiness,
        max_concurrency=max_concurrency, schedule=load_schedule(fixed_schedule) if fixed_schedule else None,
        arrival_seed=arrival_seed, prompt_len_stddev=prompt_len_stddev, output_len_stddev=output_len_stddev,
        ignore_eos=ignore_eos, goodput=parse_goodput(goodput_specs))


# what `bench` measures and how (the load), with SAMPLING's Sampling → BenchSettings
LOAD = OptionGroup("settings", _bench_settings, needs=("sampling",))


def _bench_table(d: dict, title: str) -> Table:
    table = Table(title=title, caption="times in ms; tok/s/u = per user p50; AL = acceptance length; × = output tok/s speculative/baseline"
                  + ("; good = goodput (fraction meeting the SLOs)" if d["settings"].get("goodput") else ""))
    for col in ("load" if d["settings"].get("request_rates") or d["settings"].get("schedule") else "c", "model", "req/s", "tok/s", "TTFT p50", "ITL p50", "lat p50", "lat p95", "tok/s/u", "AL", "×") \
            + (("good",) if d["settings"].get("goodput") else ()):
        table.add_column(col, justify="left" if col == "model" else "right")
    for lv in d["levels"]:
        for role, m in lv["models"].items():
            a = m["acceptance"]
            al = a["acceptance_length"] or a["acceptance_length_from_chunks"]
            sp = lv.get("speedup", {}).get("output_token_throughput") if role == "speculative" else None
            table.add_row(
                lv.get("load", str(lv["concurrency"])).removeprefix("concurrency "), role[:4], f"{m['request_throughput']:.2f}", f"{m['output_token_throughput']:.1f}",
                f"{m['ttft_s']['p50'] * 1e3:.1f}", f"{(m['itl_s'].get('p50') or 0) * 1e3:.2f}",
                f"{m['request_latency_s']['p50'] * 1e3:.0f}", f"{m['request_latency_s']['p95'] * 1e3:.0f}",
                f"{m['output_tps_per_user'].get('p50') or 0:.1f}", "-" if al is None else f"{al:.2f}",
                "" if sp is None else f"{sp:.2f}",
                *([f"{m['goodput']['fraction']:.0%}" if m["goodput"]["fraction"] is not None else "-"]
                  if "goodput" in m else []))
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


@click.command(epilog=_exit_codes_epilog())
@click.option("--url", "urls", required=True, multiple=True, callback=_url_list,
              help=URL_HELP + "; several replicas: repeat it or give a comma list "
                   "(each is loaded at every concurrency level; per-replica and total results).")
@TARGET.options
@LOAD.option("--concurrency", default="1,2,4", show_default=True, callback=_int_list,
             help="Comma-separated concurrency levels (requests in flight).")
@click.option("--prompts", "prompt_source", default="builtin:code", show_default=True,
              help="builtin:code|chat|mixed|stdlib or a .jsonl file (objects with 'text' or 'prompt').")
@click.option("--num-prompts", type=click.IntRange(1), default=None, help="Use this many prompts (cycled).")
@LOAD.option("--requests", type=click.IntRange(1), default=None,
             help="Requests per model and level (default 16 unless --duration).")
@LOAD.option("--duration", type=click.FloatRange(min=0, min_open=True), default=None,
             help="Seconds per model and level instead of a request count.")
@LOAD.option("--warmup", default=2, show_default=True, type=click.IntRange(0), help="Unmeasured requests per model.")
@LOAD.option("--output-len", default="64", show_default=True, callback=_int_list,
             help="max_tokens per request; a list is cycled over requests (e.g. 16,64,256).")
@LOAD.option("--prompt-len", default=None, callback=_int_list,
             help="Cut/extend prompts to these lengths (tokens with --tokenizer, else characters), cycled.")
@SAMPLING.options
@LOAD.option("--model", "spec_model", default="ensemble", show_default=True, help="Speculative model.")
@LOAD.option("--baseline-model", default="ensemble_baseline", show_default=True, help="Ordinary-decoding model.")
@LOAD.option("--no-baseline", is_flag=True, help="Measure only --model (no side-by-side ratios).")
@click.option("--tokenizer", type=click.Path(file_okay=False), default=None,
              help="HF tokenizer folder: prompt lengths in tokens, and token counts when the server sends no ids.")
@LOAD.option("--no-stream", is_flag=True, help="Ask for one response per request (TTFT = request latency).")
@LOAD.option("--timeout", default=600.0, show_default=True, type=click.FloatRange(min=0, min_open=True),
             help="Seconds per request.")
@click.option("--ready-timeout", default=10.0, show_default=True, type=click.FloatRange(min=0),
              help="Seconds to wait for the server and models to be ready.")
@LOAD.option("--request-rate", default=None, callback=_rate_list,
             help="Open loop: comma-separated request rates (requests/s, 'inf' = all at once), one level each; "
                  "replaces --concurrency.")
@LOAD.option("--burstiness", default=1.0, show_default=True, type=click.FloatRange(min=0, min_open=True),
             help="Gamma shape of the gaps between arrivals (1 = Poisson, < 1 burstier), as vllm bench serve.")
@LOAD.option("--max-concurrency", type=click.IntRange(1), default=None,
             help="Open loop: at most this many requests in flight; later arrivals wait.")
@LOAD.option("--fixed-schedule", type=click.Path(dir_okay=False), default=None,
             help="Open loop from a JSONL trace: 'timestamp' (ms), optional 'input_length', 'output_length', 'text'.")
@LOAD.option("--arrival-seed", default=0, show_default=True, type=click.IntRange(0),
             help="Seed of the arrival times and synthetic lengths (the same for both models).")
@LOAD.option("--prompt-len-stddev", default=0.0, show_default=True, type=click.FloatRange(min=0),
             help="Synthetic prompt lengths: normal(--prompt-len, this) per prompt.")
@LOAD.option("--output-len-stddev", default=0.0, show_default=True, type=click.FloatRange(min=0),
             help="Synthetic output lengths: normal(--output-len, this) per request.")
@LOAD.option("--ignore-eos", is_flag=True,
             help="Pin output lengths: send min_length = max_tokens (models without that input: noted in the report).")
@LOAD.option("--goodput", "goodput_specs", multiple=True,
             help="SLO as METRIC:MS (ttft, itl/tpot, e2el), repeatable: reports the fraction of requests meeting all.")
@click.option("--no-export", is_flag=True,
              help="Skip the GenAI-Perf / AIPerf / perf_analyzer-format exports under OUT/exports/.")
@click.option("-o", "--out", "out_dir", required=True, type=click.Path(file_okay=False),
              help="Writes OUT/report.json, OUT/report.md, PNG plots and OUT/exports/ (a new or empty folder, or --force).")
@click.option("--force", is_flag=True, help="Replace OUT if it holds an earlier bench report (nothing else).")
@click.option("--json", "as_json", is_flag=True, help="Print the summary (no per-request records) as JSON.")
@handle_errors
@with_groups(TARGET, SAMPLING, LOAD)
def bench(urls, client, prompt_source, num_prompts, tokenizer, ready_timeout, no_export, out_dir, force, as_json,
          settings):
    """Load-test a deployment: baseline and speculative side by side, GenAI-Perf metrics.

    TTFT, time to second token, ITL, inter-chunk latency, request latency, output tokens/s (per
    user and total), requests/s at p50/p90/p95/p99, acceptance rate and length, by prompt and
    output length; speculative/baseline ratios per concurrency level.

    Open loop: --request-rate 1,4,8 (Poisson or gamma arrivals) or --fixed-schedule, each level
    run ABBA on both models; --goodput ttft:MS itl:MS reports the fraction meeting the SLOs.
    OUT/exports/ holds GenAI-Perf, AIPerf and perf_analyzer-format files per model and level.

    If a server goes away mid-run, the report of everything measured so far is still written,
    and the command exits 4.
    """
    check_replaceable(out_dir, BENCH_REPORT, force)  # before the load test, not after it
    prompts = load_prompts(prompt_source, num_prompts)
    prog, update = _progress()
    with prog:
        result = run_bench(urls[0] if len(urls) == 1 else urls, prompts, settings, tokenizer=tokenizer,
                           prompt_source=prompt_source, progress=update, ready_timeout_s=ready_timeout,
                           client_options=client)

    def write_all(tmp: str) -> dict:
        files = write_bench_report(result, tmp)
        if not no_export:
            files.update(write_exports(result, os.path.join(tmp, "exports")))
        return files

    files = write_atomically(out_dir, BENCH_REPORT, write_all, force=force)
    n_plots = sum(1 for f in files.values() if str(f).endswith(".png"))
    d = result.to_dict(with_records=False)
    if as_json:
        click.echo(json.dumps(d, indent=2, default=str))
    else:
        out.print(_bench_table(d, f"trtspec bench {result.url} ({result.wall_s:.0f}s)"))
        if len(result.replicas) > 1:
            out.print(_replica_table(d))
        out.print(f"report: {os.path.join(out_dir, 'report.md')} (+ report.json, {n_plots} plots"
                  + ("" if no_export else f", {len(files) - n_plots - 2} exports in {os.path.join(out_dir, 'exports')}") + ")")
    if result.interrupted is not None:
        i, o = result.interrupted, d["outcome"]
        err.print(f"[bold red]error:[/] a server went away at concurrency {i['concurrency']} ({escape(i['phase'])}): "
                  f"{escape(i['error'])}\n  {o['completed']} requests completed, {o['failed']} failed "
                  f"({o['failed_with_partial_output']} with partial output); the report has everything measured")
        sys.exit(4)


@click.command(epilog=_exit_codes_epilog())
@click.option("--url", "urls", required=True, multiple=True, callback=_url_list,
              help=URL_HELP + "; several replicas: repeat it or give a comma list "
                   "(equivalence checked on each, load on all at once).")
@TARGET.options
@click.option("--require-token-ids", is_flag=True,
              help="OpenAI-compatible targets: fail (exit 7) when the server returns no token ids, instead of "
                   "comparing text.")
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
@with_groups(TARGET)
def validate(urls, client, require_token_ids, config, out_dir, force, spec_model, baseline_model, tokenizer,
             ready_timeout, as_json):
    """Validate a served deployment against its recipe's gates; exit 0 = deploy speculative, 1 = keep baseline.

    Greedy output equivalence per prompt (first divergence, edit distance; tolerance from
    validation.equivalence_tolerance), a sampled distribution check (validation.sampled_check_samples),
    latency and acceptance under load (validation.concurrency), then the gates in validation.gates.
    Exit 2: bad recipe or input; 4: server unreachable or failing; 5-7: see below.
    """
    recipe = load_recipe(config)
    check_replaceable(out_dir, VALIDATION_REPORT, force)  # before the validation, not after it
    options = replace(client, require_token_ids=require_token_ids)
    prog, update = _progress()
    with prog:
        result = run_validation(urls[0] if len(urls) == 1 else urls, recipe, tokenizer=tokenizer or True,
                                speculative_model=spec_model, client_options=options,
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
        out.print(f"  decided by: {escape(v.reason)}")
    sys.exit(result.exit_code)


@click.command(epilog=_exit_codes_epilog())
@click.argument("url")
@TARGET.options
@click.option("--prompt", required=True, help="Prompt text.")
@click.option("--model", default="ensemble", show_default=True, help="ensemble (speculative) or ensemble_baseline.")
@click.option("--stream", is_flag=True, help="Print the output as it streams in.")
@click.option("--max-tokens", default=64, show_default=True, type=click.IntRange(1))
@SAMPLING.options
@click.option("--stop", multiple=True, help="Stop string (repeat for more): ensemble input stop_words / OpenAI stop.")
@click.option("--presence-penalty", default=None, type=float)
@click.option("--frequency-penalty", default=None, type=float)
@click.option("--tokenizer", type=click.Path(file_okay=False), default=None,
              help="HF tokenizer folder: token counts when the server sends no ids.")
@click.option("--timeout", default=600.0, show_default=True, type=click.FloatRange(min=0, min_open=True))
@click.option("--ready-timeout", default=10.0, show_default=True, type=click.FloatRange(min=0))
@click.option("--json", "as_json", is_flag=True, help="Print the full response as JSON (timings, perf outputs).")
@handle_errors
@with_groups(TARGET, SAMPLING)
def infer(url, client, prompt, model, stream, max_tokens, sampling, stop, presence_penalty, frequency_penalty,
          tokenizer, timeout, ready_timeout, as_json):
    """Send one request to a running server and print the output text.

    URL as for bench/validate: HOST:PORT, grpc(s)://HOST:PORT or http(s)://HOST:PORT/v1.
    """
    extras = request_extras(parse_target(url).kind, stop=stop, presence_penalty=presence_penalty,
                            frequency_penalty=frequency_penalty)
    sampling = sampling.with_(max_tokens=max_tokens)

    def on_text(text: str) -> None:
        click.echo(text, nl=False)
        sys.stdout.flush()

    res = run_infer(url, prompt, sampling, model=model, stream=stream, options=client, extras=extras or None,
                    tokenizer=tokenizer, on_text=None if as_json else on_text, timeout_s=timeout,
                    ready_timeout_s=ready_timeout)
    if as_json:
        click.echo(json.dumps(result_dict(res), indent=2, default=str))
    elif stream:
        click.echo()
    else:
        click.echo(res.text)
