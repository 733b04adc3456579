"""Self-describing artifacts: every folder trtspec writes carries ``trtspec.json``.

Later stages read the manifest, never guess a format from a file name. Folders are written into
a temporary sibling and renamed into place only when complete, so an interrupted or failed stage
never leaves a half-written artifact where a later stage (or a re-run) would trust it.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import json
import os
import pathlib
import shutil
import tempfile
from typing import Any, Iterator

from trtspec import __version__
from trtspec.errors import ModelError

MANIFEST = "trtspec.json"


def now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def write_manifest(folder: str | os.PathLike, kind: str, **fields: Any) -> dict[str, Any]:
    """Write ``folder/trtspec.json`` with ``kind`` (e.g. ``model``, ``quantized``, ``engine``)."""
    data = {"kind": kind, "trtspec_version": __version__, "created": now(), **fields}
    path = pathlib.Path(folder) / MANIFEST
    path.write_text(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")
    return data


def read_manifest(folder: str | os.PathLike, kind: str | None = None) -> dict[str, Any]:
    path = pathlib.Path(folder) / MANIFEST
    if not path.is_file():
        raise ModelError(
            f"{folder} has no {MANIFEST}: it was not written by trtspec (or not finished)",
            fix="re-run the stage that produces it",
        )
    data = json.loads(path.read_text())
    if kind is not None and data.get("kind") != kind:
        raise ModelError(f"{folder}: expected a '{kind}' artifact, found '{data.get('kind')}'")
    return data


def maybe_manifest(folder: str | os.PathLike) -> dict[str, Any] | None:
    try:
        return read_manifest(folder)
    except (ModelError, json.JSONDecodeError):
        return None


@contextlib.contextmanager
def atomic_dir(dest: str | os.PathLike, *, overwrite: bool = True) -> Iterator[pathlib.Path]:
    """Yield a fresh temp folder beside ``dest``; on success rename it to ``dest``.

    On any exception the temp folder is removed and ``dest`` is left as it was.
    """
    dest = pathlib.Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=f".{dest.name}.tmp-", dir=dest.parent))
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if dest.exists():
        if not overwrite:
            shutil.rmtree(tmp, ignore_errors=True)
            raise FileExistsError(dest)
        old = dest.with_name(f".{dest.name}.old-{os.getpid()}")
        os.replace(dest, old)
        os.replace(tmp, dest)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, dest)


def hash_files(paths: list[pathlib.Path], *, base: pathlib.Path | None = None) -> str:
    """sha256 over (relative name, content) of the given files, in sorted order."""
    h = hashlib.sha256()
    for p in sorted(paths):
        rel = p.relative_to(base) if base else p
        h.update(str(rel).encode())
        with open(p, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


def hash_folder(folder: str | os.PathLike, *, exclude: tuple[str, ...] = (MANIFEST,)) -> str:
    folder = pathlib.Path(folder)
    files = [p for p in folder.rglob("*") if p.is_file() and p.name not in exclude]
    return hash_files(files, base=folder)


def hash_json(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()
