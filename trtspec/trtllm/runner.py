"""Execute a build plan: one checked runner for argv lists, stages cached by content hash.

- :func:`run_command` logs the exact command, runs it without a shell, sends stdout and stderr
  to the stage log, and raises :class:`~trtspec.errors.CommandError` with the exit status and the
  stderr tail when it fails (or cannot start).
- :func:`run_stages` runs each stage's commands into a fresh temporary folder beside the stage's
  output and renames it into place only when every command succeeded and the expected files are
  there (:func:`trtspec.manifest.atomic_dir`); a failure leaves no half-written folder.
- A stage whose output already carries a ``trtspec.json`` with the same key is skipped. The key
  hashes the stage's commands, the keys of the stages it reads, and a fingerprint (names, sizes,
  modification times) of the folders it reads from outside the build, so re-running an unchanged
  recipe does nothing and touching an input rebuilds what depends on it.
"""

from __future__ import annotations

import collections
import logging
import os
import pathlib
import shlex
import subprocess
import threading
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping

from trtspec.errors import CommandError, StageError
from trtspec.manifest import MANIFEST, atomic_dir, hash_json, maybe_manifest, write_manifest
from trtspec.trtllm.plan import Stage

log = logging.getLogger("trtspec.trtllm")

STAGE_KIND = "trtllm-stage"
STDERR_TAIL_LINES = 40


@dataclass(frozen=True)
class Event:
    """Progress for a caller that wants to show it: ``stage`` (starting), ``cached``, ``command``
    (about to run ``argv``, exactly as run: the stage writes into a temporary folder), ``done``
    (the temporary folder renamed into place)."""

    kind: str
    stage: Stage
    argv: tuple[str, ...] | None = None


OnEvent = Callable[[Event], None]


def run_command(
    argv: Iterable[str],
    *,
    log_path: str | os.PathLike | None = None,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike | None = None,
) -> None:
    """Run ``argv`` (no shell); raise ``CommandError`` (argv, exit status, stderr tail) on failure."""
    argv = [str(a) for a in argv]
    log.info("$ %s", shlex.join(argv))
    logf = open(log_path, "a", encoding="utf-8") if log_path else None
    tail: collections.deque[str] = collections.deque(maxlen=STDERR_TAIL_LINES)
    try:
        if logf:
            logf.write(f"$ {shlex.join(argv)}\n")
            logf.flush()
        try:
            proc = subprocess.Popen(
                argv, stdout=logf or subprocess.DEVNULL, stderr=subprocess.PIPE, env=dict(env) if env else None,
                cwd=cwd, text=True, errors="replace",
            )
        except (FileNotFoundError, PermissionError) as e:
            raise CommandError(
                argv, 127, f"{type(e).__name__}: {e}",
                fix=f"'{argv[0]}' is not installed or not on PATH: run inside the TensorRT-LLM container "
                    "(see docs/trtllm.md), or print the plan with --dry-run",
            ) from None

        def pump() -> None:
            assert proc.stderr is not None
            for line in proc.stderr:
                tail.append(line.rstrip("\n"))
                if logf:
                    logf.write(line)

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        try:
            rc = proc.wait()
        except BaseException:  # Ctrl-C: do not leave the child running
            proc.kill()
            proc.wait()
            raise
        reader.join()
        if logf:
            logf.write(f"[exit {rc}]\n")
        if rc != 0:
            raise CommandError(argv, rc, "\n".join(tail),
                               fix=f"full output in {log_path}" if log_path else None)
    finally:
        if logf:
            logf.close()


# --------------------------------------------------------------------------------------------
# stage keys


def fingerprint(path: str | os.PathLike) -> object:
    """Cheap identity of an input outside the build: (name, size, mtime) of every file under it.
    Reading a 140 GB checkpoint to hash it would cost more than the stage it guards."""
    p = pathlib.Path(path)
    if p.is_file():
        st = p.stat()
        return [p.name, st.st_size, st.st_mtime_ns]
    if p.is_dir():
        rows = []
        for f in sorted(p.rglob("*")):
            if f.is_file() and f.name != MANIFEST:
                st = f.stat()
                rows.append([str(f.relative_to(p)), st.st_size, st.st_mtime_ns])
        return rows
    return None


def stage_key(stage: Stage, upstream: Mapping[str, str], *, extra: object = None) -> str:
    """Content hash of everything that determines a stage's output."""
    return hash_json({
        "stage": stage.id,
        "commands": [list(c) for c in stage.commands],
        "expect": list(stage.expect),
        "after": {sid: upstream[sid] for sid in stage.after},
        "inputs": {i: fingerprint(i) for i in stage.inputs},
        "extra": extra,
    })


def is_cached(stage: Stage, key: str) -> bool:
    m = maybe_manifest(stage.output)
    if not m or m.get("kind") != STAGE_KIND or m.get("key") != key:
        return False
    return all((pathlib.Path(stage.output) / f).exists() for f in stage.expect)


def _retarget(argv: tuple[str, ...], final: str, tmp: str) -> list[str]:
    """Point the stage's own output folder at the temporary one (whole arguments or path prefixes)."""
    out = []
    for a in argv:
        if a == final:
            out.append(tmp)
        elif a.startswith(final + "/"):
            out.append(tmp + a[len(final):])
        else:
            out.append(a)
    return out


def stage_keys(stages: Iterable[Stage], *, extra_key: object = None) -> dict[str, str]:
    """Every stage's key, in order (a key depends on its upstream keys, never on running them)."""
    keys: dict[str, str] = {}
    for stage in stages:
        keys[stage.id] = stage_key(stage, keys, extra=extra_key)
    return keys


def run_stages(
    stages: Iterable[Stage],
    *,
    log_dir: str | os.PathLike,
    env: Mapping[str, str] | None = None,
    on_event: OnEvent | None = None,
    extra_key: object = None,
) -> tuple[dict[str, str], list[str], list[str]]:
    """Run the stages in order. Returns (stage id → key, ids that ran, ids that were cached)."""
    emit = on_event or (lambda e: None)
    stages = list(stages)
    keys = stage_keys(stages, extra_key=extra_key)
    ran: list[str] = []
    cached: list[str] = []
    log_dir = pathlib.Path(log_dir)
    for stage in stages:
        key = keys[stage.id]
        if is_cached(stage, key):
            cached.append(stage.id)
            emit(Event("cached", stage))
            continue
        emit(Event("stage", stage))
        log_dir.mkdir(parents=True, exist_ok=True)
        log_path = log_dir / f"{stage.id}.log"
        log_path.write_text("")
        with atomic_dir(stage.output) as tmp:
            for argv in stage.commands:
                real = _retarget(argv, stage.output, str(tmp))
                emit(Event("command", stage, tuple(real)))  # exactly what runs (the temporary folder)
                run_command(real, log_path=log_path, env=env)
            missing = [f for f in stage.expect if not (tmp / f).exists()]
            if missing:
                raise StageError(
                    f"{stage.title}: the commands exited 0 but did not write {', '.join(missing)}",
                    fix=f"see {log_path}",
                )
            write_manifest(tmp, STAGE_KIND, key=key, stage=stage.id, title=stage.title,
                           commands=[list(c) for c in stage.commands])
        ran.append(stage.id)
        emit(Event("done", stage))
    return keys, ran, cached
