"""The ``trtspec`` command line: thin click commands over the library.

Each command parses its options, calls one library function, and prints the result. Library
errors (``TrtspecError``) become a one-paragraph message and a non-zero exit; anything else is
an internal error, shown with a traceback only under ``--debug`` (or ``TRTSPEC_DEBUG=1``).
"""

from __future__ import annotations

import functools
import json
import os
import sys
import traceback

import click
from rich.console import Console
from rich.table import Table

from trtspec import __version__
from trtspec.errors import TrtspecError

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)

STATUS_STYLE = {"ok": "green", "warn": "yellow", "fail": "bold red", "skip": "dim", "missing": "red", "info": "cyan"}


def _debug() -> bool:
    return os.environ.get("TRTSPEC_DEBUG", "") not in ("", "0")


def handle_errors(fn):
    """Turn library errors into messages and exit codes; keep tracebacks for --debug."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except TrtspecError as e:
            if _debug():
                traceback.print_exc()
            err.print(f"[bold red]error:[/] {e}", markup=True, highlight=False)
            sys.exit(e.exit_code)
        except KeyboardInterrupt:
            err.print("[yellow]interrupted[/]")
            sys.exit(130)
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

    Deterministic for a seed on one machine, cached, about 4 minutes on 2 cores. Prints the
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


if __name__ == "__main__":  # pragma: no cover
    main()
