"""trtspec.triton.procs.child_alive: the router's cheap check of the engine stubs it last found."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from trtspec.triton.procs import child_alive


def test_a_running_child_is_alive_only_under_its_own_parent():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert child_alive(child.pid, os.getpid())
        assert not child_alive(child.pid, os.getppid())  # a pid now under another parent: not the stub found
    finally:
        child.kill()
        child.wait()


def test_a_dead_child_is_not_alive_before_or_after_it_is_reaped():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    os.kill(child.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while child_alive(child.pid, os.getpid()) and time.monotonic() < deadline:  # a zombie until reaped
        time.sleep(0.01)
    assert not child_alive(child.pid, os.getpid())
    child.wait()
    assert not child_alive(child.pid, os.getpid())  # gone
