"""Engine workers build their engines one at a time (trtspec.triton.backend.worker.one_load_at_a_time):
a second load waits while another process holds the lock, and a process that dies holding it
(the OOM killer, a crash while loading) does not leave it held. The lock is this user's (a file in
the per-user state folder, opened O_NOFOLLOW): a lock file another user planted in the temp folder,
or a symlink, does not stop our engines from loading (issue 30)."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import time

import pytest

from trtspec.triton.backend import worker
from trtspec.triton.launch.state import state_dir

HOLD = """
import fcntl, os, sys
from trtspec.triton.launch.state import state_dir
f = open(os.path.join(state_dir(), sys.argv[1]), "a")
fcntl.flock(f, fcntl.LOCK_EX)
print("held", flush=True)
import time; time.sleep(float(sys.argv[2]))
if sys.argv[3] == "die":
    os._exit(9)  # no unlock, no close: the kernel drops the lock with the process
"""


@pytest.fixture
def private_tmp(monkeypatch, tmp_path):
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # the state folder of this test only
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.setattr("tempfile.tempdir", None)
    return tmp_path


def _holder(seconds: float, how: str) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", HOLD, worker.LOAD_LOCK, str(seconds), how], stdout=subprocess.PIPE,
                         text=True)
    assert p.stdout.readline().strip() == "held"
    return p


def test_a_second_load_waits_for_the_first(private_tmp):
    p = _holder(1.0, "exit")
    t0 = time.monotonic()
    with worker.one_load_at_a_time():
        waited = time.monotonic() - t0
    p.wait(timeout=10)
    assert waited > 0.5, waited  # it held the lock for 1 s after saying so


def test_a_holder_that_dies_releases_the_lock(private_tmp):
    p = _holder(0.3, "die")
    with worker.one_load_at_a_time():
        pass
    assert p.wait(timeout=10) == 9
    with worker.one_load_at_a_time():  # and it can be taken again at once
        pass


def test_the_lock_lives_in_the_users_private_state_folder(private_tmp):
    with worker.one_load_at_a_time():
        lock = state_dir() / worker.LOAD_LOCK
        assert lock.is_file() and not lock.is_symlink()
        assert lock.parent == private_tmp / f"trtspec-{os.getuid()}"
        assert oct(lock.stat().st_mode & 0o777) == oct(0o600)
        assert oct(lock.parent.stat().st_mode & 0o777) == oct(0o700)


def _held_elsewhere(path: pathlib.Path) -> subprocess.Popen:
    """A process holding an flock on ``path`` (the machine-wide lock of old, another user's)."""
    p = subprocess.Popen([sys.executable, "-c", "import fcntl,sys,time; f=open(sys.argv[1],'a'); "
                          "fcntl.flock(f, fcntl.LOCK_EX); print('held', flush=True); time.sleep(30)", str(path)],
                         stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "held"
    return p


def test_a_lock_file_planted_in_the_temp_folder_does_not_stop_our_load(private_tmp):
    # what the old machine-wide lock was: another user's 0600 file, held (a load that never ends)
    planted = private_tmp / "trtspec-engine-load.lock"
    p = _held_elsewhere(planted)
    try:
        planted.chmod(0o600)
        t0 = time.monotonic()
        with worker.one_load_at_a_time():
            pass
        assert time.monotonic() - t0 < 2
    finally:
        p.kill()
        p.wait()


def test_a_symlink_planted_as_the_lock_is_not_followed(private_tmp, capfd):
    target = private_tmp / "victim"
    target.write_text("precious\n")
    d = state_dir()
    (d / worker.LOAD_LOCK).symlink_to(target)
    p = _held_elsewhere(target)  # even a held target does not make us wait: we never open it
    try:
        t0 = time.monotonic()
        with worker.one_load_at_a_time():
            pass
        assert time.monotonic() - t0 < 2
    finally:
        p.kill()
        p.wait()
    assert target.read_text() == "precious\n"
    assert "without the one-load-at-a-time lock" in capfd.readouterr().err


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to act as a second user")
def test_another_users_state_folder_does_not_stop_our_load(private_tmp, capfd):
    # a second user (nobody) made our state folder name first and holds a lock in it: we refuse the
    # folder (state.py), load without the lock and say so; nothing of theirs is opened
    import pwd

    nobody = pwd.getpwnam("nobody")
    d = private_tmp / f"trtspec-{os.getuid()}"
    d.mkdir(mode=0o700)
    (d / worker.LOAD_LOCK).write_text("")
    os.chown(d / worker.LOAD_LOCK, nobody.pw_uid, nobody.pw_gid)
    os.chown(d, nobody.pw_uid, nobody.pw_gid)
    p = _held_elsewhere(d / worker.LOAD_LOCK)
    try:
        t0 = time.monotonic()
        with worker.one_load_at_a_time():
            pass
        assert time.monotonic() - t0 < 2
    finally:
        p.kill()
        p.wait()
    assert "belongs to uid" in capfd.readouterr().err
