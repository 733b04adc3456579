"""`trtspec quantize`: ModelOpt post-training quantization, exports and the quality report."""

from __future__ import annotations

import json

import click
from rich.table import Table
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from trtspec.hub import is_hub_id, resolve_model
from trtspec.quantize import QualitySettings, make_quantization, quantize_model
from trtspec.cli.common import OptionGroup, err, handle_errors, out, with_groups


def _quantization(fmt, kv_cache, lm_head, calib, calib_split, calib_column, calib_size, calib_seq_len, force):
    return make_quantization(fmt, kv_cache, calib=calib, calib_size=calib_size, calib_seq_len=calib_seq_len,
                             calib_split=calib_split, calib_column=calib_column, force=force, lm_head=lm_head)


# --format, --kv-cache, --lm-head, --calib*, --force → the Quantization (format, KV cache, LM head, calibration set)
QUANTIZATION = OptionGroup("quantization", _quantization)


def _quality(eval_windows, eval_seq_len, num_prompts, max_new_tokens, max_draft_len, no_quality) -> QualitySettings | None:
    if no_quality:
        return None
    return QualitySettings(eval_windows=eval_windows, eval_seq_len=eval_seq_len, prompts=num_prompts,
                           max_new_tokens=max_new_tokens, max_draft_len=max_draft_len)


# --eval-*, --prompts, --max-new-tokens, --max-draft-len, --no-quality → QualitySettings (None: no report)
QUALITY = OptionGroup("quality", _quality)


@click.command()
@click.option("--model", "model_dir", required=True, type=click.Path(file_okay=False),
              help="Folder to quantize: a target or draft HF checkpoint, or an EAGLE-3 head (with --pair TARGET).")
@QUANTIZATION.option("--format", "fmt", required=True,
                     help="fp8 | int8_sq | int8_wo | int4_wo | int4_awq | w4a8_awq | nvfp4")
@QUANTIZATION.option("--kv-cache", default="none", show_default=True, help="KV-cache quantization: none | fp8 | int8.")
@QUANTIZATION.option("--lm-head", default="none", show_default=True,
                     help="LM head: none (ModelOpt's default: unquantized) | int8_wo (INT8 weight-only; --export torch).")
@QUANTIZATION.option("--calib", default="builtin", show_default=True,
                     help="Calibration source: builtin (stdlib sources, tiny models), cnn_dailymail, pileval, a Hugging Face "
                          "dataset id org/name, a local dataset folder, or a .jsonl ({\"text\": ...}) / text file "
                          "(docs/quantization.md).")
@QUANTIZATION.option("--calib-split", default=None, help="Dataset split [default: the named dataset's, else train].")
@QUANTIZATION.option("--calib-column", default=None, help="Text column [default: the named dataset's, else text].")
@QUANTIZATION.option("--calib-size", default=None, type=int,
                     help="Calibration sequences [default: 512, ModelOpt's; 64 for builtin].")
@QUANTIZATION.option("--calib-seq-len", default=None, type=int,
                     help="Tokens per calibration sequence [default: 512, ModelOpt's; 128 for builtin].")
@click.option("--export", "export", required=True, type=click.Choice(["hf", "trtllm", "torch"]),
              help="hf: unified HF checkpoint (TRT-LLM PyTorch flow, EAGLE path); trtllm: legacy TRT-LLM "
                   "checkpoint (trtllm-build); torch: ModelOpt state for the torch runtime (native INT8/INT4 weight kernels where torch has them, else fake-quant; docs/quantization.md).")
@click.option("-o", "--out", "out_dir", required=True, type=click.Path(file_okay=False),
              help="New folder for the export (+ trtspec.json, quality.json); written atomically.")
@click.option("--pair", type=click.Path(file_okay=False), default=None,
              help="The counterpart model (the draft when quantizing the target, the target when quantizing "
                   "the draft or an EAGLE-3 head): quality.json then reports acceptance before/after.")
@click.option("--role", type=click.Choice(["auto", "target", "draft"]), default="auto", show_default=True,
              help="auto: the folder's manifest, else the larger of --model and --pair is the target.")
@click.option("--gpu-arch", type=click.Choice(["any", "ampere", "ada", "hopper", "blackwell"]), default="any",
              show_default=True, help="Deployment GPU family (nvfp4 needs blackwell; fp8 needs ada or newer).")
@QUANTIZATION.option("--force", is_flag=True, help="Quantize even a combination known to fail upstream.")
@click.option("--dtype", type=click.Choice(["auto", "float32", "bfloat16", "float16"]), default="auto",
              show_default=True, help="Dtype the model is calibrated and exported in (auto: its config's).")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True,
              help="Where ModelOpt calibrates and the quality report runs (auto: cuda if available).")
@click.option("--threads", type=int, default=None, help="torch CPU threads (default: torch's).")
@QUALITY.option("--eval-windows", default=16, show_default=True, type=click.IntRange(1),
                help="Held-out windows for top-1 / KL / perplexity.")
@QUALITY.option("--eval-seq-len", default=128, show_default=True, type=click.IntRange(8))
@QUALITY.option("--prompts", "num_prompts", default=8, show_default=True, type=click.IntRange(1),
                help="Held-out prompts for the acceptance measurement (with --pair).")
@QUALITY.option("--max-new-tokens", default=32, show_default=True, type=click.IntRange(1))
@QUALITY.option("--max-draft-len", default=4, show_default=True, type=click.IntRange(1, 32))
@QUALITY.option("--no-quality", is_flag=True, help="Skip the quality report (no quality.json).")
@click.option("--json", "as_json", is_flag=True, help="Print the manifest and quality report as JSON.")
@handle_errors
@with_groups(QUANTIZATION, QUALITY)
def quantize(model_dir, quantization, export, out_dir, pair, role, gpu_arch, dtype, device, threads, quality, as_json):
    """Quantize a target, a draft or an EAGLE-3 head with NVIDIA ModelOpt and export it for one runtime.

    Writes OUT (atomically): the export, trtspec.json (format, source hash, ModelOpt version,
    calibration set) and quality.json: top-1 agreement, KL divergence and perplexity change
    against the unquantized model on held-out text, and with --pair the draft's acceptance rate
    against the target before and after quantizing (torch engine, greedy).
    """
    if is_hub_id(model_dir):  # org/name: its snapshot folder in the Hugging Face cache (downloaded if allowed)
        model_dir = str(resolve_model(model_dir, field="--model"))
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn(), console=err, transient=True, disable=as_json) as prog:
        tasks: dict[str, int] = {}

        def progress(phase: str, step: int, total: int, info: dict) -> None:
            if phase not in tasks:
                tasks[phase] = prog.add_task(phase, total=total)
            prog.update(tasks[phase], completed=step, total=total)

        res = quantize_model(model_dir, quantization, export, out_dir, role=role, pair=pair, gpu_arch=gpu_arch, dtype=dtype,
                             device=device, quality=quality, threads=threads, progress=progress)
    if as_json:
        click.echo(json.dumps({"manifest": res.manifest, "quality": res.quality}, indent=2, default=str))
        return
    for w in res.warnings:
        err.print(f"[yellow]warning:[/] {w}")
    m = res.manifest
    algo = m.get("quant_algo") or res.format
    kv = f", KV cache {m.get('kv_cache_quant_algo') or res.kv_cache}" if res.kv_cache != "none" else ""
    kv += f", LM head {m['lm_head']}" if m.get("lm_head", "none") != "none" else ""
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
