"""`trtspec serve ... --json` as a user runs it, in its own process (tests of the CLI and of the
installed wheel)."""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import signal
import subprocess
import threading
from typing import Iterator


@contextlib.contextmanager
def serve_process(cmd: list[str], log: pathlib.Path, *, cwd=None, env=None,
                  ready_s: float = 300) -> Iterator[tuple[dict, subprocess.Popen]]:
    """Start ``cmd`` (a `trtspec serve ... --json` command line) in a process group of its own and
    yield (the endpoints it printed once ready, the process); SIGTERM at the end, SIGKILL to the
    group after 60 s. The process's exit code is on ``proc.returncode`` afterwards."""
    with open(log, "w") as err:
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=err, text=True,
                                start_new_session=True)
        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.append(proc.stdout.readline()), daemon=True)
        reader.start()
        reader.join(ready_s)
        try:
            assert lines and lines[0].strip(), f"serve did not become ready: {log.read_text()[-3000:]}"
            yield json.loads(lines[0]), proc
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
