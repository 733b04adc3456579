"""The python backend's stub processes, read from ``/proc`` (Linux).

Each instance of a python model runs in its own ``triton_python_backend_stub`` process, a child
of ``tritonserver``, whose command line ends with the instance name and ``DEFAULT``::

    .../triton_python_backend_stub /repo/router/1/model.py <shm region> 1048576 1048576 \
        <server pid> .../backends/python 336 router_0_0 DEFAULT

Triton 2.51 never restarts a stub that died: the model stays READY and every request fails with
"Stub process '<instance>' is not healthy" (reference/triton-cpu.md §8). Both the launcher's
watchdog and the router (for the engine it relays) find stubs here to notice that at once.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Iterator

PROC = "/proc"
STUB_BINARY = "triton_python_backend_stub"


@dataclass(frozen=True)
class Stub:
    pid: int
    instance: str  # e.g. "tensorrt_llm_0_0"
    model_py: str  # path of the model.py it runs

    @property
    def model(self) -> str:
        return instance_model(self.instance)


def instance_model(instance: str) -> str:
    """``tensorrt_llm_baseline_0_0`` → ``tensorrt_llm_baseline`` (instance = model_group_index)."""
    m = re.match(r"^(.*?)(?:_\d+){1,2}$", instance)
    return m.group(1) if m else instance


def is_instance_of(instance: str, model: str) -> bool:
    return re.fullmatch(re.escape(model) + r"(?:_\d+){1,2}", instance) is not None


def _stat(pid: str) -> tuple[str, int] | None:
    """(state, ppid) of a process, or None if it is gone."""
    try:
        with open(f"{PROC}/{pid}/stat") as f:
            rest = f.read().rsplit(")", 1)[1].split()
        return rest[0], int(rest[1])
    except (OSError, IndexError, ValueError):
        return None


def _running(pid: str, parent: int | None = None) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not yet reaped, does not) and, unless ``parent`` is
    None, is ``parent``'s child: one ``stat`` read."""
    st = _stat(pid)
    return st is not None and st[0] not in ("Z", "X") and (parent is None or st[1] == parent)


def parse_stub_cmdline(pid: int, cmdline: bytes) -> Stub | None:
    args = [a.decode(errors="replace") for a in cmdline.split(b"\0") if a]
    if len(args) < 3 or not args[0].endswith(STUB_BINARY):
        return None
    # the instance name is second to last ("... <instance> DEFAULT"); older stubs end with it
    instance = args[-2] if args[-1] == "DEFAULT" else args[-1]
    return Stub(pid=pid, instance=instance, model_py=args[1])


def _live_children(parent: int | None) -> Iterator[tuple[int, bytes]]:
    """(pid, command line) of each live process whose parent is ``parent`` (any parent when None);
    zombies count as dead."""
    try:
        names = os.listdir(PROC)
    except OSError:
        return
    for name in names:
        if not name.isdigit():
            continue
        if not _running(name, parent):
            continue
        try:
            with open(f"{PROC}/{name}/cmdline", "rb") as f:
                yield int(name), f.read()
        except OSError:
            continue


def stubs_of(server_pid: int) -> list[Stub]:
    """Live stub processes whose parent is ``server_pid``."""
    return [stub for pid, cmdline in _live_children(server_pid)
            if (stub := parse_stub_cmdline(pid, cmdline)) is not None]


WORKER_MODULE = b"trtspec.triton.backend.worker"


def workers_of(stub_pid: int | None = None) -> list[int]:
    """Live engine worker processes (``python -m trtspec.triton.backend.worker``): of the stub
    ``stub_pid``, or every one on the machine when None."""
    return [pid for pid, cmdline in _live_children(stub_pid) if WORKER_MODULE in cmdline.split(b"\0")]


def state(pid: int) -> str | None:
    """A process's state letter from ``/proc/<pid>/stat`` (R, S, D, T, t, Z, ...), or None if it is gone."""
    st = _stat(str(pid))
    return st[0] if st is not None else None


def stopped(pid: int) -> bool:
    """Whether ``pid`` is stopped (SIGSTOP, SIGTSTP, a debugger): alive, but it never answers."""
    return state(pid) in ("T", "t")


def child_alive(pid: int, parent: int) -> bool:
    """Whether ``pid`` runs and is still ``parent``'s child: one ``stat`` read, where a full scan of
    ``/proc`` (:func:`stubs_of`) reads every process's."""
    return _running(str(pid), parent)


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not yet reaped, is not alive)."""
    return _running(str(pid))


def rss_bytes(pid: int) -> int | None:
    """Resident memory of a process, or None if it is gone."""
    try:
        with open(f"{PROC}/{pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, IndexError, ValueError):
        return None
