"""What every command shares: the consoles, the error boundary, progress bars, list options.

:func:`handle_errors` is the one error boundary: library errors (``TrtspecError``) become a
one-paragraph message and their exit code; Ctrl-C and SIGTERM exit 128 + signal; anything else
is an internal error (exit 3), with a traceback only under ``--debug`` (or ``TRTSPEC_DEBUG=1``).
"""

from __future__ import annotations

import functools
import os
import signal
import sys
import traceback

import click
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from trtspec.errors import TrtspecError

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)

STATUS_STYLE = {"ok": "green", "warn": "yellow", "fail": "bold red", "skip": "dim", "missing": "red", "info": "cyan"}


def _debug() -> bool:
    return os.environ.get("TRTSPEC_DEBUG", "") not in ("", "0")


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised like Ctrl-C so every path that stops what it started on Ctrl-C (servers in
    their own process group, TRT-LLM child processes, a pipeline stage) does so on SIGTERM too."""


def _raise_terminated(signum, frame) -> None:
    raise Terminated()


def _interrupted(e: KeyboardInterrupt) -> tuple[str, int]:
    """What stopped the command, and its exit code (128 + signal)."""
    if isinstance(e, Terminated):
        return "terminated", 128 + signal.SIGTERM
    return "interrupted", 128 + signal.SIGINT


def handle_errors(fn):
    """Turn library errors into messages and exit codes; keep tracebacks for --debug."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except TrtspecError as e:
            if _debug():
                traceback.print_exc()
            # messages carry tool output (stderr tails with [brackets]): never markup
            err.print(f"[bold red]error:[/] {escape(str(e))}", markup=True, highlight=False)
            sys.exit(e.exit_code)
        except KeyboardInterrupt as e:
            what, code = _interrupted(e)
            err.print(f"[yellow]{what}[/]")
            sys.exit(code)
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


def _progress():
    """A rich progress bar on stderr and the callback the library drives it with."""
    prog = Progress(TextColumn("{task.description:<24}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    TextColumn("eta"), TimeRemainingColumn(), console=err, transient=True)
    task = prog.add_task("connecting", total=None)

    def update(done: int, total: int | None, label: str) -> None:
        prog.update(task, completed=done, total=total, description=label)

    return prog, update


def _int_list(ctx, param, value):
    if value is None:
        return None
    try:
        xs = tuple(int(x) for x in str(value).split(",") if x.strip())
    except ValueError:
        raise click.BadParameter(f"expected comma-separated integers, e.g. 1,2,4 (got {value!r})") from None
    if not xs or any(x < 1 for x in xs):
        raise click.BadParameter(f"expected integers >= 1, e.g. 1,2,4 (got {value!r})")
    return xs


def _rate_list(ctx, param, value):
    if value is None:
        return None
    try:
        xs = tuple(float(x) for x in str(value).split(",") if x.strip())
    except ValueError:
        raise click.BadParameter(f"expected comma-separated rates in requests/s, e.g. 1,2,4 or inf (got {value!r})") from None
    if not xs or any(not x > 0 for x in xs):
        raise click.BadParameter(f"expected rates > 0 (requests/s; inf = all at once), e.g. 1,2,4 (got {value!r})")
    return xs


def _url_list(ctx, param, value):
    """--url a --url b, or --url a,b: the servers (replicas), in order, without repeats."""
    urls = [u.strip() for v in value for u in str(v).split(",") if u.strip()]
    if not urls:
        raise click.BadParameter("expected HOST:PORT of the server's gRPC endpoint, e.g. --url 127.0.0.1:8001")
    return tuple(dict.fromkeys(urls))
