"""Per-user launcher state: where running servers are recorded, and what a sweep may delete.

A launcher that is killed before it stops its server leaves shared-memory files and the python
backend's ``/tmp/python_env_*`` folder behind; the next start removes them, reading what to remove
from the records running launchers write (``trtspec.triton.launch.server.sweep_leftovers``). Those
records decide what gets deleted, so nobody but their user may write them:

* the folder is per user: ``$XDG_RUNTIME_DIR/trtspec`` when that runtime folder is this user's and
  private, else ``<tmp>/trtspec-<uid>``; created 0700, and refused (not used, not "fixed") when it
  is a symlink, belongs to someone else or is open to others: another user who created it first
  must not be able to feed us records;
* the start lock is opened with ``O_NOFOLLOW`` in that folder, and so is the engine workers' load
  lock (``trtspec.triton.backend.worker.one_load_at_a_time``: one engine loads at a time per user);
* a record is a ``<pid>.json`` regular file of this user; one that cannot be read, or names
  anything trtspec does not create (a shared-memory prefix not of the form ``trtspec<pid>x<hex>_``,
  a folder that is not ``/tmp/python_env_XXXXXX``, or is a symlink, or is not this user's), is
  skipped with a warning and deletes nothing.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import pathlib
import re
import stat
from dataclasses import dataclass

from trtspec.errors import ServerError
# the folder itself is made and checked in trtspec.triton.access, where the engine workers (the
# stub side, which must not import the launcher) find it too: their load lock lives there
from trtspec.triton.access import _private_dir, _unsafe, state_dir  # noqa: F401 - re-exported

log = logging.getLogger("trtspec.server")

LOCK_NAME = ".start.lock"
SHM_PREFIX = re.compile(r"^trtspec\d+x[0-9a-f]+_$")
PYTHON_ENV = re.compile(r"^/tmp/python_env_[A-Za-z0-9_]{6}$")  # mkdtemp("/tmp/python_env_XXXXXX")
RECORD = re.compile(r"^\d+\.json$")


@contextlib.contextmanager
def start_lock(d: pathlib.Path):
    """An exclusive lock in ``d`` (opened without following a symlink, checked to be ours)."""
    try:
        fd = os.open(d / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as e:
        raise ServerError(f"cannot open the start lock {d / LOCK_NAME}: {e}",
                          fix="remove it if it is a symlink or not yours") from None
    try:
        st = os.fstat(fd)
        if st.st_uid != os.getuid() or not stat.S_ISREG(st.st_mode):
            raise ServerError(f"the start lock {d / LOCK_NAME} is not a regular file of yours", fix="remove it")
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def write_record(d: pathlib.Path, pid: int, info: dict) -> pathlib.Path:
    """``d/<pid>.json``, written to a fresh file and renamed into place (never through a link)."""
    path = d / f"{pid}.json"
    tmp = d / f".{pid}.json.tmp"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(info, f)
    os.replace(tmp, path)
    return path


@dataclass(frozen=True)
class Record:
    path: pathlib.Path
    server_pid: int
    argv0: str
    shm_prefix: str
    python_env_dirs: tuple[pathlib.Path, ...]


def owned_python_env(p: str | os.PathLike, uid: int | None = None) -> bool:
    """Whether ``p`` is a python backend temp folder (the name it makes, a real folder) of this user."""
    if not PYTHON_ENV.match(str(p)):
        return False
    try:
        st = os.lstat(p)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == (os.getuid() if uid is None else uid)


def read_records(d: pathlib.Path) -> list[Record]:
    """The valid records in ``d``; every other ``*.json`` is skipped with a warning."""
    out = []
    uid = os.getuid()
    for path in sorted(d.glob("*.json")) if d.is_dir() else []:
        try:
            out.append(_parse(path, uid))
        except ValueError as e:
            log.warning("skipping server record %s: %s", path, e)
    return out


def _parse(path: pathlib.Path, uid: int) -> Record:
    if not RECORD.match(path.name):
        raise ValueError("not a name trtspec writes (<pid>.json)")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        raise ValueError(f"cannot open it ({e.strerror})") from None
    with os.fdopen(fd) as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_uid != uid:
            raise ValueError("not a regular file of yours")
        try:
            info = json.loads(f.read(65536))
            pid = int(info["server_pid"])
            argv0 = str(info.get("argv0", ""))
            prefix = str(info.get("shm_prefix", ""))
            envs = [str(p) for p in info.get("python_env_dirs", [])]
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"malformed ({type(e).__name__}: {e})") from None
    if prefix and not SHM_PREFIX.match(prefix):
        raise ValueError(f"shm_prefix {prefix!r} is not one trtspec makes (trtspec<pid>x<hex>_)")
    for p in envs:
        if not PYTHON_ENV.match(p):
            raise ValueError(f"python_env_dirs names {p!r}, not a /tmp/python_env_XXXXXX folder")
    return Record(path, pid, argv0, prefix, tuple(pathlib.Path(p) for p in envs))
