"""What every command shares: the consoles, the error boundary, progress bars, list options,
option groups.

:func:`handle_errors` is the one error boundary: library errors (``TrtspecError``) become a
one-paragraph message and their exit code; Ctrl-C and SIGTERM exit 128 + signal; anything else
is an internal error (exit 3), with a traceback only under ``--debug`` (or ``TRTSPEC_DEBUG=1``).
"""

from __future__ import annotations

import functools
import os
import signal
import sys
import time
import traceback
from typing import Any, Callable

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


class StepProgress:
    """Progress of the steps of a long command: one bar per step (label, done/total, elapsed, ETA
    and a free-text ``note`` such as the training loss) on stderr.

    On a terminal the bars are rich's, live; elsewhere (CI logs, ``make demo | tee``) each step
    prints a plain line when it starts, at every quarter and when it ends, with the elapsed time
    and the ETA, so a log still shows what the command is doing and how long it has left.

    >>> with StepProgress() as p:
    ...     p.update("train target", 10, 240, note="loss 5.12")
    """

    def __init__(self, console: Console | None = None):
        self.console = console or err
        self.live = self.console.is_terminal
        self._prog = Progress(TextColumn("{task.description:<24}"), BarColumn(), MofNCompleteColumn(),
                              TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
                              TextColumn("{task.fields[note]}"), console=self.console, transient=True)
        self._tasks: dict[str, int] = {}
        self._plain: dict[str, tuple[float, int, int]] = {}  # label → (first seen, done then, last quarter printed)

    def __enter__(self) -> "StepProgress":
        if self.live:
            self._prog.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.live:
            self._prog.stop()

    def update(self, label: str, done: int, total: int | None, note: str = "") -> None:
        if self.live:
            if label not in self._tasks:
                self._tasks[label] = self._prog.add_task(label, total=total, note=note)
            self._prog.update(self._tasks[label], completed=done, total=total, note=note)
            return
        now = time.monotonic()
        start, first, last = self._plain.setdefault(label, (now, done, -1))
        quarter = 4 * done // total if total else (4 if done else 0)
        if quarter == last:
            return
        self._plain[label] = (start, first, quarter)
        elapsed = now - start
        # the rate since the step was first seen (a trainer reports its first step when it is done)
        eta = (f", eta {elapsed * (total - done) / (done - first):.0f} s"
               if total and first < done < total and elapsed > 0.5 else "")
        count = f" {done}/{total}" if total else ""
        self.console.print(f"  {label}{count} ({elapsed:.0f} s{eta}){'  ' + note if note else ''}",
                           markup=False, highlight=False)


def _progress():
    """A progress bar on stderr and the ``(done, total, label)`` callback the library drives it with."""
    prog = StepProgress()

    def update(done: int, total: int | None, label: str) -> None:
        prog.update(label, done, total)

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


class OptionGroup:
    """Click options that reach the command as one typed value instead of one parameter each.

    Declare the options with :meth:`option` (inline in the command's decorators, so ``--help``
    lists them where they always were) or :meth:`options` (a block, for groups several commands
    share); :func:`with_groups` under the decorators then calls ``build(**their values)`` and
    passes the result as ``dest``. ``build`` runs inside :func:`handle_errors`, so the error a
    typed object raises for a bad value is reported as every library error is.
    """

    def __init__(self, dest: str, build: Callable[..., Any], *, needs: tuple[str, ...] = ()):
        self.dest, self.build = dest, build
        self.needs = needs  # the ``dest`` of groups built before this one that ``build`` takes (consumed)
        self.names: list[str] = []
        self._declared: list[tuple[tuple, dict]] = []

    def option(self, *decls, **attrs):
        """One option of the group: a ``click.option`` whose value goes to ``build``."""
        name = click.Option(decls, **attrs).name
        if name not in self.names:
            self.names.append(name)
            self._declared.append((decls, attrs))
        return click.option(*decls, **attrs)

    def options(self, fn):
        """Every option declared so far, as one block (in declaration order)."""
        for decls, attrs in reversed(self._declared):
            fn = click.option(*decls, **attrs)(fn)
        return fn


def with_groups(*groups: OptionGroup):
    """Replace each group's option values by ``group.build(...)`` (passed as ``group.dest``)."""
    def decorate(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            for g in groups:
                kwargs[g.dest] = g.build(**{n: kwargs.pop(n) for n in g.names},
                                         **{d: kwargs.pop(d) for d in g.needs})
            return fn(*args, **kwargs)
        return wrapper
    return decorate
