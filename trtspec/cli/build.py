"""`build` (TensorRT-LLM plans and builds) and `package` (the Triton model repository)."""

from __future__ import annotations

import json
import os

import click
from rich.table import Table

from trtspec.config import load_recipe
from trtspec.triton.render import package as render_package
from trtspec.trtllm.build import build as run_build
from trtspec.trtllm.build import plan_build, with_examples_dir
from trtspec.trtllm.plan import describe
from trtspec.cli.common import err, handle_errors, out


@click.command()
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


@click.command()
@click.argument("config", type=click.Path(dir_okay=False))
@click.option("-o", "--out", "out_dir", required=True, type=click.Path(file_okay=False),
              help="New folder for the model repository.")
@click.option("--build-dir", type=click.Path(file_okay=False), default=None,
              help="TRT-LLM runtimes: the folder `trtspec build` wrote (default: build/<recipe name>).")
# absolute: the server's stubs read these folders from their own working directory
@click.option("--target", type=click.Path(file_okay=False, resolve_path=True), default=None,
              help="torch runtime: serve this target folder instead of the recipe's (e.g. a quantized export).")
@click.option("--draft", type=click.Path(file_okay=False, resolve_path=True), default=None,
              help="torch runtime: serve this draft / head folder instead of the recipe's.")
@click.option("--force", is_flag=True, help="Replace OUT if it exists.")
@click.option("--json", "as_json", is_flag=True, help="Print the repository's manifest as JSON.")
@handle_errors
def package(config: str, out_dir: str, build_dir: str | None, target: str | None, draft: str | None,
            force: bool, as_json: bool) -> None:
    """Render a Triton model repository for a recipe (templates: trtspec/triton/templates/).

    \b
    ensemble           text in/out, the speculative path (router with fallback to the baseline)
    ensemble_baseline  text in/out, ordinary decoding
    Every config.pbtxt is checked against Triton's schema; the folder carries trtspec.json.
    """
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
