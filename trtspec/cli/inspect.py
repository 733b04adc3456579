"""Look before you build: `check` (recipe + preflight), `doctor` (the environment), `recipes`
(the recipes shipped inside the package)."""

from __future__ import annotations

import json
import pathlib
import shutil
import sys

import click
from rich.table import Table

from trtspec.config import json_schema, load_recipe
from trtspec.doctor import as_dicts, collect
from trtspec.preflight import run_checks
from trtspec.resources import shipped_recipe, shipped_recipes
from trtspec.errors import TrtspecError
from trtspec.cli.common import handle_errors, out, STATUS_STYLE


@click.command()
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


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print as JSON.")
@handle_errors
def doctor(as_json: bool) -> None:
    """Show what this environment can run: Python, torch/CUDA, transformers, ModelOpt, TRT-LLM, tritonserver, GPU."""
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


@click.group()
def recipes() -> None:
    """The recipes shipped with trtspec (no source checkout needed)."""


@recipes.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print name → runtime, method, target as JSON.")
@handle_errors
def recipes_list(as_json: bool) -> None:
    """List the shipped recipes: name, runtime, speculation method, target model."""
    rows = []
    for name, path in shipped_recipes().items():
        try:
            r = load_recipe(path)
            rows.append({"name": name, "runtime": r.runtime.backend, "method": r.speculation.method,
                         "target": r.target.model, "path": str(path)})
        except TrtspecError as e:  # a shipped recipe that does not load is a bug: show it, do not hide it
            rows.append({"name": name, "runtime": "?", "method": "?", "target": f"does not load: {e}", "path": str(path)})
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    table = Table(title="recipes shipped with trtspec (trtspec recipes show NAME / copy NAME DIR)")
    for col in ("name", "runtime", "method", "target"):
        table.add_column(col, overflow="fold")
    for row in rows:
        table.add_row(row["name"], row["runtime"], row["method"], row["target"])
    out.print(table)


@recipes.command("show")
@click.argument("name")
@handle_errors
def recipes_show(name: str) -> None:
    """Print a shipped recipe's YAML."""
    click.echo(shipped_recipe(name).read_text(), nl=False)


@recipes.command("copy")
@click.argument("name")
@click.argument("dest", type=click.Path(file_okay=False))
@click.option("--force", is_flag=True, help="Replace DEST/NAME.yaml if it exists.")
@handle_errors
def recipes_copy(name: str, dest: str, force: bool) -> None:
    """Copy a shipped recipe into DEST to edit it (relative model paths then resolve against DEST)."""
    src = shipped_recipe(name)
    dst = pathlib.Path(dest) / src.name
    if dst.exists() and not force:
        raise TrtspecError(f"{dst} exists; not overwriting it", fix="pass --force, or choose another DEST")
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dst)
    out.print(f"wrote {dst}")
