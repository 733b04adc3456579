"""Write a run's ``report.json``, ``report.md`` and PNG plots into a folder."""

from __future__ import annotations

import json
import math
import os
import pathlib

from trtspec.client.loadgen import BenchResult
from trtspec.client.metrics import OUTPUT_LEN_EDGES, PROMPT_LEN_EDGES, bucket_order
from trtspec.validate import plots
from trtspec.validate.gates import brackets, level_table
from trtspec.client.metrics import json_safe

DEFINITIONS = """\
## Definitions (GenAI-Perf)

- **TTFT**: request sent → first response carrying output. **Time to second token**: first → second such response.
- **Request latency**: request sent → last response carrying output.
- **ITL**: (request latency − TTFT) / (output tokens − 1), per request. **Tokens/s per user**: 1 / ITL.
- **Inter-chunk latency (ICL)**: gap between consecutive streamed responses; with speculation one
  response carries several tokens, so ICL > ITL when acceptance is high.
- **Output tokens/s** (all users): Σ output tokens / measured duration; **requests/s** likewise.
  Duration = Σ over interleaved blocks of (last response − first request sent).
- **Acceptance rate**: Σ accepted draft tokens / Σ draft tokens (server counters).
  **Acceptance length (AL)**: tokens per target pass (server-reported); **AL from chunks**:
  (output tokens − first chunk) / (chunks − 1), from the stream alone.
- Every speedup is oriented so that **> 1 means speculative is better**.
"""


def _ms(d: dict, key: str = "p50") -> str:
    v = d.get(key)
    return "–" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v * 1e3:.1f}"


def _num(v, fmt: str = "{:.2f}") -> str:
    return "–" if v is None else fmt.format(v)


def _load(lv: dict) -> str:
    """A level's load for tables: the concurrency, or the request rate (open loop)."""
    return lv.get("load", str(lv["concurrency"])).removeprefix("concurrency ")


def _x(v) -> str:
    return "–" if v is None else f"{v:.2f}x"


def _json_default(o):
    if isinstance(o, float) and math.isnan(o):
        return None
    if isinstance(o, (set, tuple)):
        return list(o)
    return str(o)


def write_json(data: dict, path: pathlib.Path) -> None:
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(json_safe(data), indent=2, default=_json_default) + "\n")
    os.replace(tmp, path)


def bench_markdown(d: dict, plot_files: dict[str, str], *, title: str) -> list[str]:
    """Markdown lines for a bench dict (``BenchResult.to_dict()``)."""
    roles = list(d["models"])
    s = d["settings"]
    load = f"{s['requests']} requests per model and level" if s["requests"] else f"{s['duration_s']} s per model and level"
    if s.get("request_rates") or s.get("schedule"):
        load_kind = ("open loop: " + (f"request rates {', '.join(f'{r:g}' for r in s['request_rates'])} /s, gamma "
                                      f"arrivals (burstiness {s['burstiness']:g})" if s.get("request_rates")
                                      else "fixed schedule")
                     + (f", at most {s['max_concurrency']} in flight" if s.get("max_concurrency") else ""))
    else:
        load_kind = f"concurrency {', '.join(map(str, s['concurrency']))}"
    load_col = "load" if s.get("request_rates") or s.get("schedule") else "concurrency"
    lines = [
        f"# {title}",
        "",
        f"- server: `{d['url']}`; models: " + ", ".join(f"{r} `{m}`" for r, m in d["models"].items()),
        f"- prompts: `{d['prompts']['source']}` ({d['prompts']['count']}, lengths in {d['prompts']['length_unit']}); "
        f"output lengths (max_tokens): {', '.join(map(str, s['output_lens']))}; temperature {s['sampling']['temperature']}",
        f"- load: {load_kind}; {load}; {s['warmup']} warm-up requests per model; "
        "baseline and speculative interleaved in alternating blocks on the same prompts",
        f"- started {d['started']}, wall time {d['wall_s']:.1f} s",
    ]
    if s.get("interval_width"):
        lines.append(f"- repeated until sure: at least {s['requests']} and at most {s['max_requests']} requests per "
                     f"model and level, in blocks, until the speedup's 95 % interval spans at most "
                     f"{s['interval_width']:.0%} of it; " + "; ".join(
                         f"c={lv['concurrency']}: {lv['stop']['text']}" for lv in d["levels"] if lv.get("stop")))
    if d.get("urls"):
        lines.append(f"- {len(d['urls'])} replicas ({', '.join(f'`{u}`' for u in d['urls'])}), loaded at the same "
                     "time with the concurrency below on each; tables show all replicas together (throughput: all "
                     "replicas' tokens over their common wall time; latencies pooled), then each replica")
    o = d.get("outcome")
    if o:
        lines.append(f"- requests: {o['sent']} sent, {o['completed']} completed, {o['failed']} failed "
                     f"({o['failed_with_partial_output']} after partial output, {o['busy']} turned away busy)")
    if d.get("interrupted"):
        i = d["interrupted"]
        lines += ["", f"**Interrupted**: a server went away at concurrency {i['concurrency']} ({i['phase']}, "
                      f"`{i['replica']}`): {i['error']}. Everything measured before is below; the levels after it "
                      "did not run."]
    lines += [
        "",
        f"## Summary by {load_col}",
        "",
        f"| {load_col} | model | req/s | output tok/s | TTFT p50 / p95 ms | ITL p50 ms | ICL p50 ms | "
        "latency p50 / p95 / p99 ms | tok/s per user p50 | AL (server) | AL (chunks) | acceptance rate | errors |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for lv in d["levels"]:
        for role in roles:
            m = lv["models"][role]
            a = m["acceptance"]
            lines.append(
                f"| {_load(lv)} | {role} | {_num(m['request_throughput'])} | {_num(m['output_token_throughput'], '{:.1f}')} | "
                f"{_ms(m['ttft_s'])} / {_ms(m['ttft_s'], 'p95')} | {_ms(m['itl_s'])} | {_ms(m['inter_chunk_latency_s'])} | "
                f"{_ms(m['request_latency_s'])} / {_ms(m['request_latency_s'], 'p95')} / {_ms(m['request_latency_s'], 'p99')} | "
                f"{_num(m['output_tps_per_user'].get('p50'), '{:.1f}')} | {_num(a['acceptance_length'])} | "
                f"{_num(a['acceptance_length_from_chunks'])} | {_num(a['acceptance_rate'], '{:.3f}')} | {m['errors']} |")
    if d.get("urls"):
        lines += ["", "## Each replica", "",
                  "| concurrency | replica | model | req/s | output tok/s | TTFT p50 ms | latency p50 / p95 ms | "
                  "errors | speedup tok/s |",
                  "|---:|---|---|---:|---:|---:|---:|---:|---:|"]
        for lv in d["levels"]:
            for url, rep in lv.get("replicas", {}).items():
                for role in roles:
                    m = rep["models"][role]
                    sp = rep.get("speedup", {}).get("output_token_throughput") if role == "speculative" else None
                    lines.append(
                        f"| {lv['concurrency']} | `{url}` | {role} | {_num(m['request_throughput'])} | "
                        f"{_num(m['output_token_throughput'], '{:.1f}')} | {_ms(m['ttft_s'])} | "
                        f"{_ms(m['request_latency_s'])} / {_ms(m['request_latency_s'], 'p95')} | {m['errors']} | "
                        f"{_x(sp) if role == 'speculative' and 'baseline' in roles else ''} |")
    if "baseline" in roles:
        lines += ["", "## Speedup: speculative vs baseline (> 1 = speculative better)", "",
                  "All levels' figures pooled; in brackets the 95 % interval over the paired blocks (Student t on "
                  "the blocks' log ratios; '∞' with one block).", "",
                  f"| {load_col} | output tok/s | req/s | tok/s per user p50 | latency p50 | latency p95 | ITL p50 | TTFT p50 |",
                  "|---:|---:|---:|---:|---:|---:|---:|---:|"]

        def inv(iv: dict | None) -> str:  # a latency ratio spec / base → oriented as speedup base / spec
            if not iv or iv.get("ratio") is None:
                return ""
            hi, lo = iv.get("high"), iv.get("low")
            return f" [{0 if hi is None or math.isinf(hi) else 1 / hi:.2f}, {'∞' if not lo else f'{1 / lo:.2f}'}]"
        for lv in d["levels"]:
            x, ivs = lv["speedup"], lv.get("intervals") or {}
            lines.append(f"| {_load(lv)} | {_x(x['output_token_throughput'])} {brackets(ivs.get('output_token_throughput'))}"
                         f" | {_x(x['request_throughput'])} | "
                         f"{_x(x['output_tps_per_user_p50'])} | {_x(x['request_latency_p50'])} | "
                         f"{_x(x['request_latency_p95'])}{inv(ivs.get('request_latency_p95'))} | {_x(x['itl_p50'])} | "
                         f"{_x(x['ttft_p50'])} |")
    if s.get("goodput"):
        slo = ", ".join(f"{n} <= {ms:g} ms" for n, ms in s["goodput"])
        lines += ["", f"## Goodput (SLO: {slo}; every SLO met, failed requests miss)", "",
                  "| load | model | requests | met | goodput (fraction) | request goodput (req/s) |",
                  "|---:|---|---:|---:|---:|---:|"]
        for lv in d["levels"]:
            for role in roles:
                g = lv["models"][role].get("goodput") or {}
                lines.append(f"| {_load(lv)} | {role} | {g.get('requests', 0)} | {g.get('met', 0)} | "
                             f"{_num(g.get('fraction'), '{:.1%}')} | {_num(g.get('request_goodput'))} |")
    if d.get("ignore_eos"):
        lines += ["", "- `--ignore-eos`: " + "; ".join(f"{r}: {v}" for r, v in d["ignore_eos"].items())]
    lines += ["", "## Percentiles", ""]
    metrics = [("ttft_s", "TTFT ms"), ("time_to_second_token_s", "time to 2nd token ms"), ("itl_s", "ITL ms"),
               ("inter_chunk_latency_s", "inter-chunk ms"), ("request_latency_s", "request latency ms")]
    lines += [f"| {load_col} | model | metric | p50 | p90 | p95 | p99 | mean | n |",
              "|---:|---|---|---:|---:|---:|---:|---:|---:|"]
    for lv in d["levels"]:
        for role in roles:
            m = lv["models"][role]
            for key, name in metrics:
                q = m[key]
                lines.append(f"| {_load(lv)} | {role} | {name} | {_ms(q)} | {_ms(q, 'p90')} | {_ms(q, 'p95')} | "
                             f"{_ms(q, 'p99')} | {_ms(q, 'mean')} | {q.get('n', 0)} |")
            q = m["output_tps_per_user"]
            lines.append(f"| {_load(lv)} | {role} | tok/s per user | {_num(q.get('p50'), '{:.1f}')} | "
                         f"{_num(q.get('p90'), '{:.1f}')} | {_num(q.get('p95'), '{:.1f}')} | {_num(q.get('p99'), '{:.1f}')} | "
                         f"{_num(q.get('mean'), '{:.1f}')} | {q.get('n', 0)} |")
    pooled = d["all_levels"]
    for key, edges, name in (("prompt_len", PROMPT_LEN_EDGES, f"prompt length ({d['prompts']['length_unit']})"),
                             ("output_len", OUTPUT_LEN_EDGES, "output length (tokens)")):
        lines += ["", f"## By {name}, all concurrency levels", "",
                  "| bucket | model | requests | TTFT p50 / p95 ms | ITL p50 ms | latency p50 / p95 ms | tok/s per user p50 | AL (chunks) |"
                  + (" speedup tok/s per user | speedup latency p50 |" if "baseline" in roles else ""),
                  "|---|---|---:|---:|---:|---:|---:|---:|" + ("---:|---:|" if "baseline" in roles else "")]
        sp = pooled.get(f"speedup_by_{key}", {})
        for label in bucket_order(edges):
            for role in roles:
                b = pooled[f"by_{key}"][role].get(label)
                if not b:
                    continue
                extra = ""
                if "baseline" in roles:
                    extra = (f" {_x(sp[label]['output_tps_per_user_p50'])} | {_x(sp[label]['request_latency_p50'])} |"
                             if role == "speculative" and label in sp else " | |")
                lines.append(f"| {label} | {role} | {b['requests']} | {_ms(b['ttft_s'])} / {_ms(b['ttft_s'], 'p95')} | "
                             f"{_ms(b['itl_s'])} | {_ms(b['request_latency_s'])} / {_ms(b['request_latency_s'], 'p95')} | "
                             f"{_num(b['output_tps_per_user'].get('p50'), '{:.1f}')} | "
                             f"{_num(b['acceptance']['acceptance_length_from_chunks'])} |{extra}")
    lines += ["", "## Plots", ""]
    captions = {"latency_cdf": "Latency CDFs, baseline vs speculative",
                "speedup_by_concurrency": "Throughput and speedup by concurrency",
                "speedup_by_load": "Speculative vs baseline as the request rate rises",
                "acceptance_length_hist": "Tokens per step and acceptance length",
                "speedup_by_output_len": "Speedup by output length"}
    for key, fname in plot_files.items():
        lines.append(f"![{captions.get(key, key)}]({fname})")
    lines += ["", DEFINITIONS]
    return lines


def write_bench_report(result: BenchResult, out: str | os.PathLike) -> dict[str, str]:
    """``out/report.json``, ``out/report.md`` and the plots; returns {name: file}."""
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    files = plots.bench_plots(result, out)
    d = result.to_dict()
    d["plots"] = files
    write_json(d, out / "report.json")
    (out / "report.md").write_text("\n".join(bench_markdown(d, files, title="trtspec bench")) + "\n")
    return {"report.json": "report.json", "report.md": "report.md", **files}


def write_validation_report(result, out: str | os.PathLike, *, max_draft_len: int | None = None,
                            min_speedup: float | None = None) -> dict[str, str]:
    """``result`` is a :class:`trtspec.validate.run.ValidationResult`."""
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    files = plots.bench_plots(result.bench, out, min_speedup=min_speedup, at_concurrency=result.at_concurrency,
                              max_draft_len=max_draft_len)
    files["equivalence"] = plots.equivalence_chart(result.equivalence, out / "equivalence.png").name
    d = result.to_dict()
    d["plots"] = files
    write_json(d, out / "report.json")
    v = result.verdict
    eq = result.equivalence
    lines = [
        f"# trtspec validate: {result.recipe}",
        "",
        f"## Verdict: **{v.decision}** (exit {result.exit_code})",
        "",
        f"Decided by: {v.reason}.",
        "",
        "| gate | result | detail |",
        "|---|---|---|",
    ]
    for g in v.gates:
        lines.append(f"| {g.name} | {'PASS' if g.passed else '**FAIL**'} | {g.detail} |")
    if v.levels:
        lines += ["", "### Every level: speculative vs baseline", "",
                  f"Ratios are speculative / baseline (throughput: > 1 is better; latencies: < 1 is better), all "
                  f"blocks pooled, with the 95 % interval from the spread of the paired blocks' ratios (Student t on "
                  f"their logs). Gates read the conservative "
                  f"bound: the speedup's lower bound at concurrency {result.at_concurrency}; every latency ratio's "
                  f"upper bound at every level.", ""]
        lines += level_table(v.levels)
    acc = result.acceptance
    lines += [
        "",
        f"- acceptance (speculative, all levels): rate {_num(acc['acceptance_rate'], '{:.3f}')} (server counters), "
        f"AL {_num(acc['acceptance_length'])} (server), AL {_num(acc['acceptance_length_from_chunks'])} (chunks); "
        f"served by: {', '.join(f'{k} {n}' for k, n in acc['served_by'].items()) or '–'}",
        "",
        "## Greedy equivalence",
        "",
        f"{len(eq.prompts)} prompts × {eq.max_tokens} tokens at concurrency {eq.concurrency}, compared in {eq.unit} ({eq.compared or eq.unit}); "
        f"tolerance {eq.tolerance} ({'exact' if eq.tolerance == 0 else f'the first {eq.tolerance} must match'}). "
        f"Exact: {sum(p.exact for p in eq.prompts)}/{len(eq.prompts)}; mismatch rate {eq.mismatch_rate:.1%}.",
        "",
        "| prompt | result | first divergence | edit distance | length base / spec | around the divergence (baseline ⟂ speculative) |",
        "|---:|---|---:|---:|---:|---|",
    ]
    for p in eq.prompts:
        ctx = p.context()
        around = "–" if ctx is None else (f"`…{_md(ctx['common_tail'])}` ⟂ base `{_md(ctx['baseline'])}` / "
                                          f"spec `{_md(ctx['speculative'])}`")
        status = "identical" if p.exact else ("pass (within tolerance)" if p.passed else "**differs**")
        lines.append(f"| {p.index} | {status} | {'–' if p.first_divergence is None else p.first_divergence} | "
                     f"{p.edit_distance} | {len(p.baseline)} / {len(p.speculative)} | {around} |")
    if len(result.replicas) > 1:
        lines += ["", "### Each replica", "",
                  "The gates judge the worst replica (the per-prompt table above is its own).", "",
                  "| replica | exact matches | mismatch rate | earliest divergence | sampled check | speedup |",
                  "|---|---:|---:|---:|---|---:|"]
        for url, rep in d["replicas"].items():
            e, sa = rep["equivalence"], rep["sampled"]
            lines.append(f"| `{url}` | {e['exact_matches']}/{e['prompts_compared']} | {e['mismatch_rate']:.1%} | "
                         f"{'–' if e['earliest_divergence'] is None else e['earliest_divergence']} | "
                         f"{'–' if sa is None else ('pass' if sa['passed'] else '**FAIL**')} | {_x(rep['speedup'])} |")
    lines += ["", "![Greedy equivalence per prompt](equivalence.png)", "", "## Sampled distribution check", ""]
    if result.sampled_note:
        lines.append(f"_{result.sampled_note}_")
        lines.append("")
    if result.sampled:
        s = result.sampled
        lines += [f"{s.samples} samples of {s.length} tokens per prompt and model; sampling {s.sampling}; "
                  f"chi-square homogeneity per position, alpha {s.alpha:g} family-wise (per test {s.threshold:.2g}). "
                  f"Result: **{'pass' if s.passed else 'FAIL'}**.", "",
                  "| prompt | position | n base / spec | categories | chi² | dof | p | total variation |",
                  "|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for t in s.tests:
            lines.append(f"| {t.prompt_index} | {t.position} | {t.n_baseline} / {t.n_speculative} | {t.categories} | "
                         f"{t.chi2:.2f} | {t.dof} | {t.p_value:.3g} | {t.total_variation:.3f} |")
    bench_lines = bench_markdown(d["bench"], {k: f for k, f in files.items() if k != "equivalence"},
                                 title="Latency and acceptance under load")
    lines += [""] + ["#" + ln if ln.startswith("#") else ln for ln in bench_lines]
    (out / "report.md").write_text("\n".join(lines) + "\n")
    return {"report.json": "report.json", "report.md": "report.md", **files}


def _md(s: str) -> str:
    return s.replace("`", "'").replace("\n", "⏎").replace("|", "¦")
