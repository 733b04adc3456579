"""The run report: one markdown page (+ JSON, plots) per ``trtspec run``.

It answers the questions a production team must answer before enabling speculation (the seed
article): accepted-token rate, draft compute time, target verification time, tokens/s, queue
delay, memory, P95 latency by prompt and output length — baseline vs speculative — and the
recommended ``max_draft_len``. Every number comes from this run's stage outputs.
"""

from __future__ import annotations

import json
import pathlib
import shutil
from typing import Any

from trtspec.client.prom import by_model, histogram_mean, samples
from trtspec.validate.engine_metrics import engine_rows
from trtspec.validate.gates import brackets, level_table

VALIDATE = "validate"  # the report folder's copy of the validation stage


def _f(v: Any, fmt: str = "{:.2f}", none: str = "–") -> str:
    if v is None:
        return none
    try:
        return fmt.format(v)
    except (TypeError, ValueError):
        return str(v)


def _ms(v: float | None) -> str:
    return _f(None if v is None else v * 1e3, "{:.1f} ms")


def _role_models(repo_manifest: dict | None) -> dict[str, str]:
    """Which engine model serves which role, from the repository manifest (fallback: names)."""
    roles = {"speculative": "tensorrt_llm", "baseline": "tensorrt_llm_baseline"}
    if repo_manifest:
        for key in ("engine_models", "roles"):
            if isinstance(repo_manifest.get(key), dict):
                roles.update(repo_manifest[key])
    return roles


def _copy_validation(src: pathlib.Path, dest: pathlib.Path) -> pathlib.Path:
    """Copy the validation stage's own files (report.md/json, server metrics, plots) to ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    if src.is_dir():
        for f in src.iterdir():
            if f.is_file() and not f.name.startswith("."):
                shutil.copy2(f, dest / f.name)
    return dest


def _interval_note(iv: dict | None, stop: dict | None, what: str = "") -> str:
    """``; 95 % interval [lo, hi] over n blocks (why the level stopped)`` for a question row."""
    if not iv or iv.get("ratio") is None:
        return ""
    why = f"; {stop['text']}" if stop else ""
    return f"; {what}{iv['ratio']:.2f}× 95 % interval {brackets(iv)} over {iv['blocks']} blocks{why}"


def served_engine_speedup(server_raw: dict, roles: dict[str, str]) -> dict | None:
    """tune's quantity — baseline decode time / speculative (draft + verify) time for the same
    tokens — from the served run's own per-request histograms (``trtspec_draft_seconds``,
    ``trtspec_verify_seconds``, every validated level pooled); None without them."""
    models = by_model(samples(server_raw))
    spec, base = models.get(roles.get("speculative", ""), []), models.get(roles.get("baseline", ""), [])
    d, v = histogram_mean(spec, "trtspec_draft_seconds"), histogram_mean(spec, "trtspec_verify_seconds")
    b = histogram_mean(base, "trtspec_verify_seconds")
    if d is None or v is None or not b or not (d + v):
        return None
    return {"speedup": b / (d + v), "draft_s": d, "verify_s": v, "baseline_s": b}


def tune_vs_served(tune: dict, configured: int, server_raw: dict, roles: dict[str, str],
                   val_json: dict | None) -> str:
    """One line when tune's offline recommendation disagrees with what the served run did, saying
    whose costs differ; empty when they agree. tune times single target and draft passes at batch 1
    on a few prompts (trtspec.speculative.tune); the served run pays the draft's catch-up, the
    batch the router and engine form and the box's load at the time, and the verdict follows it."""
    rows = {r["k"]: r for r in tune.get("rows", [])}
    rec = tune.get("recommended_k")
    if rec is None or configured not in rows:
        return ""
    expected = rows[configured]["expected_speedup"]
    served = served_engine_speedup(server_raw, roles)
    verdict = (val_json or {}).get("verdict", {})
    deploy = verdict.get("deploy_speculative")
    offline_pays = rec > 0 and expected >= 1
    if deploy is None or bool(deploy) == offline_pays:
        return ""
    gate = next((g for g in verdict.get("gates", []) if g.get("name") == "speedup"), None)
    measured = f"measured {brackets(gate['interval'])} tokens/s at concurrency {gate['concurrency']}" \
        if gate and gate.get("interval") else "measured as above"
    cost = (f"its own costs (draft {served['draft_s'] * 1e3:.1f} + verify {served['verify_s'] * 1e3:.1f} ms against "
            f"the baseline's {served['baseline_s'] * 1e3:.1f} ms per request) give {served['speedup']:.2f}×"
            if served else "it exported no draft/verify histograms")
    return (f"Why they differ: tune's offline batch-1 timing expects {expected:.2f}× at max_draft_len {configured} and "
            f"recommends {rec}; the served run {'deploys' if deploy else 'keeps the baseline'}: {cost}, {measured}; "
            "the verdict follows the served run")


def write_run_report(pipeline, out: pathlib.Path) -> pathlib.Path:
    """Write ``out/report.md`` + ``out/report.json`` and a copy of the validation report with its
    plots in ``out/validate/``; every link in them is relative to ``out``."""
    recipe = pipeline.recipe
    outs = pipeline.outputs
    out.mkdir(parents=True, exist_ok=True)
    val_json = json.loads(pathlib.Path(outs["validate"]["report_json"]).read_text()) if "validate" in outs else None
    metrics_path = pipeline.stage_dir("validate") / "server_metrics.json"
    server_raw = json.loads(metrics_path.read_text()) if metrics_path.is_file() else {}
    tune = None
    if outs.get("build", {}).get("tune"):
        tune = json.loads(pathlib.Path(outs["build"]["tune"]).read_text())
    repo_manifest = None
    if "package" in outs:
        p = pathlib.Path(outs["package"]["repository"]) / "trtspec.json"
        repo_manifest = json.loads(p.read_text()) if p.is_file() else None

    lines: list[str] = [f"# trtspec run: {recipe.name}", ""]
    if recipe.description:
        lines += [recipe.description, ""]
    data: dict[str, Any] = {"recipe": recipe.name, "source": pipeline.source}

    # ---- verdict
    if val_json:
        v = val_json["verdict"]
        lines += [f"## Verdict: **{v['decision']}**", ""]
        if v.get("reason"):
            lines += [f"Decided by: {v['reason']}.", ""]
        lines += ["| gate | result | detail |", "|---|---|---|"]
        for g in v["gates"]:
            lines.append(f"| {g['name']} | {'PASS' if g['passed'] else '**FAIL**'} | {g['detail']} |")
        lines.append("")
        if v.get("levels"):
            lines += ["### Every level: speculative vs baseline (ratio spec / base, 95 % interval over the paired "
                      "blocks; gates read its conservative bound)", ""]
            lines += level_table(v["levels"]) + [""]
        data["verdict"] = v

    # ---- the questions
    roles = _role_models(repo_manifest)
    q_rows = []
    if val_json:
        acc = val_json.get("acceptance", {})
        q_rows.append(("accepted-token rate (acceptance rate)", "–", _f(acc.get("acceptance_rate"), "{:.1%}"),
                       f"acceptance length {_f(acc.get('acceptance_length'))} tokens per target pass (server); "
                       f"{_f(acc.get('acceptance_length_from_chunks'))} from stream chunks"))
    # draft / verify / queue / memory / KV cache: TRT-LLM's series when present, else trtspec_*
    q_rows += [r.as_tuple() for r in engine_rows(server_raw, roles)]
    if val_json:
        for lv in val_json["bench"]["levels"]:
            b, s = lv["models"].get("baseline", {}), lv["models"].get("speculative", {})
            ivs = lv.get("intervals") or {}
            q_rows.append((f"tokens/s (output, concurrency {lv['concurrency']})", _f(b.get("output_token_throughput"), "{:.1f}"),
                           _f(s.get("output_token_throughput"), "{:.1f}"),
                           f"speedup {_f(lv.get('speedup', {}).get('output_token_throughput'), '{:.2f}×')}"
                           + _interval_note(ivs.get("output_token_throughput"), lv.get("stop"))))
            q_rows.append((f"P95 request latency (concurrency {lv['concurrency']})",
                           _ms(b.get("request_latency_s", {}).get("p95")), _ms(s.get("request_latency_s", {}).get("p95")),
                           _interval_note(ivs.get("request_latency_p95"), None, "spec / base ").lstrip("; ")))
    if tune:
        q_rows.append(("recommended max_draft_len", "–", str(tune["recommended_k"]),
                       f"configured {recipe.max_draft_len}; measured α per position "
                       f"{', '.join(f'{a:.2f}' for a in tune['per_position_acceptance'])}, draft/target cost c = {tune['cost_ratio']:.3f}"
                       + (f". {note}" if (note := tune_vs_served(tune, recipe.max_draft_len, server_raw, roles, val_json))
                          else "")))
    if q_rows:
        lines += ["## Before enabling speculation: the numbers", "",
                  "| question | baseline | speculative | note |", "|---|---:|---:|---|"]
        lines += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in q_rows]
        lines.append("")
        data["questions"] = [dict(zip(("question", "baseline", "speculative", "note"), r)) for r in q_rows]

    # ---- P95 by prompt and output length
    if val_json:
        pooled = val_json["bench"].get("all_levels", {})
        for key, title in (("prompt_len", "prompt length"), ("output_len", "output length")):
            by = pooled.get(f"by_{key}", {})
            buckets = list(dict.fromkeys(list(by.get("baseline", {})) + list(by.get("speculative", {}))))
            if not buckets:
                continue
            unit = val_json["bench"].get("prompts", {}).get("length_unit", "tokens") if key == "prompt_len" else "tokens"
            lines += [f"### P95 latency by {title} ({unit}, all concurrency levels)", "",
                      "| bucket | n base / spec | P95 request latency base | spec | P95 ITL base | spec | speedup (tok/s/user p50) |",
                      "|---|---:|---:|---:|---:|---:|---:|"]
            sp = pooled.get(f"speedup_by_{key}", {})
            for bk in buckets:
                b, s = by.get("baseline", {}).get(bk, {}), by.get("speculative", {}).get(bk, {})
                lines.append(f"| {bk} | {b.get('requests', 0)} / {s.get('requests', 0)} | "
                             f"{_ms(b.get('request_latency_s', {}).get('p95'))} | {_ms(s.get('request_latency_s', {}).get('p95'))} | "
                             f"{_ms(b.get('itl_s', {}).get('p95'))} | {_ms(s.get('itl_s', {}).get('p95'))} | "
                             f"{_f((sp.get(bk) or {}).get('output_tps_per_user_p50'), '{:.2f}×')} |")
            lines.append("")

    # ---- latency per concurrency
    if val_json:
        lines += ["## Latency under load (GenAI-Perf definitions)", "",
                  "| concurrency | model | TTFT p50 | TTFT p95 | ITL p50 | ITL p95 | request p50 | request p95 | request p99 | tok/s | tok/s/user p50 |",
                  "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for lv in val_json["bench"]["levels"]:
            for role, s in lv["models"].items():
                lines.append(
                    f"| {lv['concurrency']} | {role} | {_ms(s['ttft_s'].get('p50'))} | {_ms(s['ttft_s'].get('p95'))} | "
                    f"{_ms(s['itl_s'].get('p50'))} | {_ms(s['itl_s'].get('p95'))} | {_ms(s['request_latency_s'].get('p50'))} | "
                    f"{_ms(s['request_latency_s'].get('p95'))} | {_ms(s['request_latency_s'].get('p99'))} | "
                    f"{_f(s.get('output_token_throughput'), '{:.1f}')} | {_f(s['output_tps_per_user'].get('p50'), '{:.1f}')} |")
        lines.append("")
        eq = val_json["equivalence"]
        # the validation stage's files travel inside the report folder, so that every link below is
        # relative to it and the folder can be moved or committed as it is
        val_dir = _copy_validation(pipeline.stage_dir("validate"), out / VALIDATE)
        lines += ["## Output equivalence (greedy, through the server)", "",
                  f"{eq.get('prompts_compared')} prompts; exact match rate {_f(eq.get('exact_match_rate'), '{:.1%}')}, "
                  f"mismatch rate {_f(eq.get('mismatch_rate'), '{:.1%}')} (tolerance {eq.get('tolerance')})."
                  + (f" Per-prompt first divergences are in [{VALIDATE}/report.md]({VALIDATE}/report.md)."
                     if (val_dir / "report.md").is_file() else ""), ""]
        for name, f in (val_json.get("plots") or {}).items():
            if (val_dir / f).is_file():
                lines.append(f"![{name}]({VALIDATE}/{pathlib.PurePath(f).as_posix()})")
        lines.append("")

    # ---- quantization
    q = outs.get("quantize", {})
    qrows = [(role, v) for role, v in q.items() if isinstance(v, dict) and v.get("quality")]
    if qrows:
        lines += ["## Quantization quality (vs the unquantized model, held-out text)", "",
                  "| model | format | KV cache | top-1 agreement | KL divergence | perplexity | acceptance before → after |",
                  "|---|---|---|---:|---:|---:|---|"]
        for role, v in qrows:
            ql = v["quality"]
            acc = ql.get("acceptance") or {}
            before = (acc.get("before") or {}).get("acceptance_rate") if isinstance(acc.get("before"), dict) else acc.get("before")
            after = (acc.get("after") or {}).get("acceptance_rate") if isinstance(acc.get("after"), dict) else acc.get("after")
            lines.append(f"| {role} | {v['format']} | {v['kv_cache']} | {_f(ql.get('top1_agreement'), '{:.3f}')} | "
                         f"{_f(ql.get('kl_divergence'), '{:.4f}')} | {_f(ql.get('perplexity_base'), '{:.2f}')} → "
                         f"{_f(ql.get('perplexity_quantized'), '{:.2f}')} | "
                         f"{_f(before, '{:.3f}')} → {_f(after, '{:.3f}')} |")
        lines.append("")

    # ---- tune
    if tune:
        lines += ["## Draft length (measured: α per position, draft cost c, verify cost v_k)", "",
                  "| max_draft_len | E[tokens/pass] | cost/pass (target steps) | expected speedup |", "|---:|---:|---:|---:|"]
        for r in tune["rows"]:
            mark = " ◀ recommended" if r["k"] == tune["recommended_k"] else ""
            lines.append(f"| {r['k']} | {r['expected_tokens_per_pass']:.2f} | {r['cost_per_pass']:.2f} | "
                         f"{r['expected_speedup']:.2f}×{mark} |")
        lines.append("")

    # ---- stages
    lines += ["## Stages", "", "| stage | status | seconds |", "|---|---|---:|"]
    for s in pipeline.stage_log:
        ran = f" (ran {s['ran_seconds']:.1f} s)" if s.get("ran_seconds") else ""
        lines.append(f"| {s['stage']} | {s['status']}{ran} | {s['seconds']:.1f} |")
    lines += ["", f"Reproduce: `trtspec run {pipeline.source or recipe.name}`", ""]
    data["stages"] = pipeline.stage_log
    data["outputs"] = {k: v for k, v in outs.items() if k != "report"}
    path = out / "report.md"
    path.write_text("\n".join(lines))
    (out / "report.json").write_text(json.dumps(data, indent=2, default=str) + "\n")
    return path
