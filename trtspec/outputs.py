"""Output folders: never overwrite what is not ours, never leave a half-written report.

* :func:`check_replaceable` before any work: a folder that exists and is not empty is replaced
  only with ``force``, and then only when its ``trtspec.json`` says it is the same kind of thing
  (a ``trtspec package --force`` must not delete someone's home folder given by mistake);
* :func:`write_atomically`: the writer fills a temp folder beside the destination, which replaces
  the old folder only once complete; an interrupted or failing write leaves the earlier one as it
  was. Report folders get a ``trtspec.json`` of their kind, so a later ``--force`` recognises them;
* :func:`work_lock`: one ``trtspec run`` per work folder at a time.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import pathlib
from typing import Callable, Iterator, TypeVar

from trtspec.errors import TrtspecError
from trtspec.manifest import MANIFEST, atomic_dir, maybe_manifest, write_manifest

T = TypeVar("T")

BENCH_REPORT = "bench-report"
VALIDATION_REPORT = "validation-report"


class OutputError(TrtspecError):
    """An output folder that must not be written or replaced."""

    exit_code = 2


def check_replaceable(out: str | os.PathLike, kind: str, force: bool) -> None:
    """Raise unless ``out`` is absent, an empty folder, or (with ``force``) a ``kind`` folder trtspec wrote."""
    out = pathlib.Path(out)
    if not out.exists():
        return
    if not out.is_dir() or out.is_symlink():
        raise OutputError(f"output {out} exists and is not a folder", fix="choose another path")
    if not any(out.iterdir()):
        return
    if not force:
        raise OutputError(f"output folder {out} is not empty; its files would be mixed with or replaced by new ones",
                          fix="choose a new folder, or pass --force to replace it")
    try:
        found = (maybe_manifest(out) or {}).get("kind")
    except Exception:  # noqa: BLE001 - an unreadable trtspec.json is not ours either
        found = None
    if found != kind:
        what = f"its {MANIFEST} says kind {found!r}" if found else f"it has no {MANIFEST}"
        raise OutputError(f"--force replaces only a {kind} folder trtspec wrote; {out} is not one ({what})",
                          fix="choose a new folder, or remove this one yourself if you mean it")


def write_atomically(out: str | os.PathLike, kind: str, writer: Callable[[pathlib.Path], T], *,
                     force: bool = False, **manifest_fields) -> T:
    """``writer(tmp)`` then ``tmp`` replaces ``out`` (after :func:`check_replaceable`)."""
    check_replaceable(out, kind, force)
    with atomic_dir(out, overwrite=True) as tmp:
        result = writer(tmp)
        write_manifest(tmp, kind, **manifest_fields)
    return result


@contextlib.contextmanager
def work_lock(workdir: str | os.PathLike) -> Iterator[None]:
    """Hold ``workdir/.lock`` exclusively; another holder makes this an :class:`OutputError` at once."""
    d = pathlib.Path(workdir)
    d.mkdir(parents=True, exist_ok=True)
    fd = os.open(d / ".lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "?"
            raise OutputError(f"another trtspec run is using the work folder {d} (pid {holder})",
                              fix="wait for it to finish, or give this run another --workdir") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        try:
            yield
        finally:
            os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
