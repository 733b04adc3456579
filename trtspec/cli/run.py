"""`trtspec run`: the whole pipeline, resumable, with a report and a verdict."""

from __future__ import annotations

import json
import pathlib
import sys
import traceback

import click
from rich.markup import escape

from trtspec.config import load_recipe
from trtspec.errors import TrtspecError
from trtspec.pipeline import Pipeline
from trtspec.cli.common import StepProgress, _debug, _interrupted, err, out


@click.command("run")
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


    icons = {"start": "▶", "done": "[green]✓[/]", "reused": "[cyan]↺[/]", "skipped": "[dim]–[/]", "failed": "[bold red]✗[/]"}

    bars = StepProgress()

    def on_event(stage: str, what: str, info: dict) -> None:
        if as_json:
            return
        if what == "progress":  # a step inside a stage (calibration, models loading, requests)
            bars.update(info["label"], info["done"], info["total"])
            return
        if what == "start":
            out.print(f"▶ {stage} …" + (f"  [dim]does: {escape(info['does'])}[/]" if explain and info.get("does") else "")
                      + (f"  [dim]why: {escape(info['why'])}[/]" if explain and info.get("why") else ""))
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
                       f"(configured {info['configured_max_draft_len']}; offline batch-1 estimate: the validate "
                       "stage measures the served run, and the report says why if they disagree)")
        out.print(f"{icons[what]} {stage}{detail}")

    try:
        recipe = load_recipe(config)
        wd = pathlib.Path(workdir) if workdir else pathlib.Path("runs") / recipe.name
        with bars:
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
            if res.verdict.get("reason"):
                out.print(f"  decided by: {escape(res.verdict['reason'])}")
        if res.report_dir is not None:
            out.print(f"report: {res.report_dir / 'report.md'}")
    sys.exit(res.exit_code)
