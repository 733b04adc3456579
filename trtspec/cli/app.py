"""The ``trtspec`` command group.

Each command lives in the module of its group and is imported only when it runs, so
``trtspec --help`` and the torch-free commands start without torch, and a command whose optional
dependencies are not installed says which extra to install instead of failing with an ImportError.
"""

from __future__ import annotations

import faulthandler
import importlib
import os
import signal
import sys
import threading

import click
from rich.markup import escape

from trtspec import __version__
from trtspec.cli.common import _raise_terminated, err
from trtspec.errors import missing_extra

# command → (module, function, the extra it needs beyond the core install, one-line help)
COMMANDS: dict[str, tuple[str, str, str | None, str]] = {
    "doctor": ("trtspec.cli.inspect", "doctor", None, "One table of the environment: Python, torch, ModelOpt, TRT-LLM, Triton, GPU."),
    "check": ("trtspec.cli.inspect", "check", None, "Validate a recipe and run the preflight checks."),
    "recipes": ("trtspec.cli.inspect", "recipes", None, "The recipes shipped with trtspec: list, show, copy."),
    "models": ("trtspec.cli.models", "models", "torch-runtime", "Make or import model checkpoints."),
    "generate": ("trtspec.cli.runtime", "generate", "torch-runtime", "Generate text with the torch runtime."),
    "tune": ("trtspec.cli.runtime", "tune", "torch-runtime", "Recommend max_draft_len from measured acceptance and costs."),
    "quantize": ("trtspec.cli.quantize", "quantize", "quantize", "ModelOpt PTQ, exports and the quality report."),
    "build": ("trtspec.cli.build", "build", None, "TensorRT-LLM engines / LLM-API config (--dry-run: the plan)."),
    "package": ("trtspec.cli.build", "package", None, "Render the Triton model repository for a recipe."),
    "serve": ("trtspec.cli.serve", "serve", "serve", "Run tritonserver on a rendered repository."),
    "bench": ("trtspec.cli.measure", "bench", "client", "Load-test running deployments (GenAI-Perf metrics)."),
    "validate": ("trtspec.cli.measure", "validate", "client", "Equivalence and latency gates → verdict."),
    "infer": ("trtspec.cli.measure", "infer", "client", "One request to a running server; the text to stdout."),
    "deploy": ("trtspec.cli.deploy", "deploy", None, "Kubernetes manifests for a recipe."),
    "run": ("trtspec.cli.run", "run_cmd", "all", "The whole pipeline, resumable: a report and a verdict."),
}


class LazyGroup(click.Group):
    """Commands from :data:`COMMANDS`, imported on use; the listing needs none of them."""
    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in COMMANDS:
            return None
        module, attr, extra, _ = COMMANDS[name]
        try:
            return getattr(importlib.import_module(module), attr)
        except ModuleNotFoundError as e:
            problem = missing_extra(e, extra, f"trtspec {name}")
            if problem is None:
                raise
            err.print(f"[bold red]error:[/] {escape(str(problem))}")
            ctx.exit(problem.exit_code)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        with formatter.section("Commands"):
            formatter.write_dl([(name, text) for name, (_, _, _, text) in COMMANDS.items()])


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
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
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _raise_terminated)
    if not faulthandler.is_enabled():  # a crash in native code (torch, gRPC) prints the Python stacks
        try:
            faulthandler.enable(file=sys.__stderr__)
        except (AttributeError, ValueError, OSError):  # no real stderr (embedded, closed)
            pass
