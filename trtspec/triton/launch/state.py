"""Per-user launcher state: where running servers are recorded, and what a sweep may delete.

A launcher that is killed before it stops its server leaves shared-memory files and the python
backend's ``/tmp/python_env_*`` folder behind; the next start removes them, reading what to remove
from the records running launchers write (``trtspec.triton.launch.server.sweep_leftovers``). Those
records decide what gets deleted, so nobody but their user may write them:

* the folder is per user: ``$XDG_RUNTIME_DIR/trtspec`` when that runtime folder is this user's and
  private, else ``<tmp>/trtspec-<uid>``; created 0700, and refused (not used, not "fixed") when it
  is a symlink, belongs to someone else or is open to others: another user who created it first
  must not be able to feed us records;
* the start lock is opened with ``O_NOFOLLOW`` in that folder;
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
import tempfile
from dataclasses import dataclass
from typing import Mapping

from trtspec.errors import ServerError

log = logging.getLogger("trtspec.server")

LOCK_NAME = ".start.lock"
SHM_PREFIX = re.compile(r"^trtspec\d+x[0-9a-f]+_$")
PYTHON_ENV = re.compile(r"^/tmp/python_env_[A-Za-z0-9_]{6}$")  # mkdtemp("/tmp/python_env_XXXXXX")
RECORD = re.compile(r"^\d+\.json$")


def state_dir(environ: Mapping[str, str] | None = None, tmp: str | None = None) -> pathlib.Path:
    """This user's private state folder (created 0700); ServerError when it is not safe to use."""
    env = os.environ if environ is None else environ
    uid = os.getuid()
    runtime = env.get("XDG_RUNTIME_DIR")
    if runtime and _private_dir(pathlib.Path(runtime), uid):
        d = pathlib.Path(runtime) / "trtspec"
    else:
        d = pathlib.Path(tmp or tempfile.gettempdir()) / f"trtspec-{uid}"
    try:
        os.mkdir(d, 0o700)
    except FileExistsError:
        pass
    except OSError as e:
        raise ServerError(f"cannot create trtspec's state folder {d}: {e}") from None
    why = _unsafe(d, uid)
    if why:
        raise ServerError(f"trtspec's state folder {d} {why}; refusing to use it (its records decide what "
                          "trtspec deletes)",
                          fix="remove it if you did not make it (another user may have), or set XDG_RUNTIME_DIR "
                              "to a private folder of yours")
    return d


def _private_dir(p: pathlib.Path, uid: int) -> bool:
    return _unsafe(p, uid) is None


def _unsafe(p: pathlib.Path, uid: int) -> str | None:
    try:
        st = os.lstat(p)
    except OSError as e:
        return f"cannot be read ({e.strerror})"
    if stat.S_ISLNK(st.st_mode):
        return "is a symlink"
    if not stat.S_ISDIR(st.st_mode):
        return "is not a folder"
    if st.st_uid != uid:
        return f"belongs to uid {st.st_uid}, not to you (uid {uid})"
    if st.st_mode & 0o077:
        return f"is open to other users (mode {stat.S_IMODE(st.st_mode):o}, want 700)"
    return None


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
