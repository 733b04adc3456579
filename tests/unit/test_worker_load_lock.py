"""Engine workers build their engines one at a time (trtspec.triton.backend.worker.one_load_at_a_time):
a second load waits while another process holds the lock, and a process that dies holding it
(the OOM killer, a crash while loading) does not leave it held."""

from __future__ import annotations

import subprocess
import sys
import time

from trtspec.triton.backend import worker

HOLD = """
import fcntl, os, sys, tempfile, time
f = open(os.path.join(tempfile.gettempdir(), sys.argv[1]), "a")
fcntl.flock(f, fcntl.LOCK_EX)
print("held", flush=True)
time.sleep(float(sys.argv[2]))
if sys.argv[3] == "die":
    os._exit(9)  # no unlock, no close: the kernel drops the lock with the process
"""


def _holder(monkeypatch, tmp_path, seconds: float, how: str) -> subprocess.Popen:
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # the lock of this test only
    monkeypatch.setattr(worker.tempfile, "tempdir", None)
    p = subprocess.Popen([sys.executable, "-c", HOLD, worker.LOAD_LOCK, str(seconds), how],
                         stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "held"
    return p


def test_a_second_load_waits_for_the_first(monkeypatch, tmp_path):
    p = _holder(monkeypatch, tmp_path, 1.0, "exit")
    t0 = time.monotonic()
    with worker.one_load_at_a_time():
        waited = time.monotonic() - t0
    p.wait(timeout=10)
    assert waited > 0.5, waited  # it held the lock for 1 s after saying so


def test_a_holder_that_dies_releases_the_lock(monkeypatch, tmp_path):
    p = _holder(monkeypatch, tmp_path, 0.3, "die")
    with worker.one_load_at_a_time():
        pass
    assert p.wait(timeout=10) == 9
    with worker.one_load_at_a_time():  # and it can be taken again at once
        pass
