"""Per-user launcher state (trtspec.triton.launch.state): nobody else's records decide what we delete.

Two kinds of test: at the function seam (records planted by this user in its own folder: bad
names, symlinks, malformed JSON), and, when the tests run as root, as a real second user
(uid 65534, ``nobody``, with the system Python and only the standard library for the attacker):
a folder planted by another user is refused, and another user starts its own state beside ours.
Plus the shared-memory regions of a live server: not readable by other users."""

from __future__ import annotations

import json
import logging
import os
import pathlib
import secrets
import shutil
import stat
import subprocess
import sys
import tempfile

import pytest

from trtspec.errors import ServerError
from trtspec.triton.launch import server as server_mod
from trtspec.triton.launch.server import SHM_DIR, TritonServer, sweep_leftovers
from trtspec.triton.launch.state import read_records, start_lock, state_dir, write_record

from tests.serving.test_triton_launcher import model

OTHER_UID = 65534
REPO = pathlib.Path(__file__).resolve().parents[2]
as_root = pytest.mark.skipif(os.getuid() != 0 or not os.path.exists("/usr/bin/python3"),
                             reason="a second uid needs root (and /usr/bin/python3 for it); the seam tests cover the rest")


@pytest.fixture
def shared_tmp(tmp_path, monkeypatch):  # tmp_path first: pytest resolves its base before the patch
    """A sticky, world-writable temp folder like /tmp, used as this test's TMPDIR."""
    d = pathlib.Path(tempfile.mkdtemp(prefix="trtspec-sec-"))
    d.chmod(0o1777)
    monkeypatch.setattr(tempfile, "tempdir", str(d))
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def python_env_like() -> pathlib.Path:
    """A folder named as the python backend names its temp folder (/tmp/python_env_XXXXXX)."""
    alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
    while True:
        p = pathlib.Path("/tmp/python_env_" + "".join(secrets.choice(alphabet) for _ in range(6)))
        try:
            p.mkdir(mode=0o700)
            return p
        except FileExistsError:
            continue


def dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_the_state_folder_is_private_and_per_user(shared_tmp, monkeypatch):
    d = state_dir()
    assert d == shared_tmp / f"trtspec-{os.getuid()}"
    st = os.lstat(d)
    assert stat.S_IMODE(st.st_mode) == 0o700 and st.st_uid == os.getuid()
    runtime = shared_tmp / "run"
    runtime.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    assert state_dir() == runtime / "trtspec"
    runtime.chmod(0o777)  # not a private runtime folder: not used
    assert state_dir() == d


def test_an_unsafe_state_folder_is_refused_not_fixed(shared_tmp):
    d = shared_tmp / f"trtspec-{os.getuid()}"
    elsewhere = shared_tmp / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    d.symlink_to(elsewhere)
    with pytest.raises(ServerError, match="is a symlink"):
        state_dir()
    d.unlink()
    d.mkdir(mode=0o755)
    d.chmod(0o755)
    with pytest.raises(ServerError, match="open to other users"):
        state_dir()
    assert stat.S_IMODE(os.lstat(d).st_mode) == 0o755  # left as it was


def test_the_start_lock_does_not_follow_a_symlink(shared_tmp):
    d = state_dir()
    victim = shared_tmp / "victim.txt"
    victim.write_text("keep me")
    (d / ".start.lock").symlink_to(victim)
    with pytest.raises(ServerError, match="start lock"):
        with start_lock(d):
            pass
    assert victim.read_text() == "keep me"


def test_planted_records_delete_nothing_and_are_skipped_with_a_warning(shared_tmp, caplog):
    """At the function seam: records in our own folder naming things trtspec does not create."""
    d = state_dir()
    precious = shared_tmp / "precious"
    precious.mkdir()
    (precious / "data").write_text("x")
    target = python_env_like()  # a real python_env-like folder, reached through a symlink below
    link = pathlib.Path(f"/tmp/python_env_{secrets.token_hex(3)[:6]}")
    link.symlink_to(target)
    shm = SHM_DIR / f"victim{os.getpid()}_region"
    shm.write_bytes(b"tensor")
    ok_env = python_env_like()  # the positive control: a real leftover of a dead server
    try:
        pid = dead_pid()
        write_record(d, pid, {"server_pid": pid, "argv0": "/x/tritonserver", "shm_prefix": "",
                              "python_env_dirs": [str(precious)]})
        (d / "12.json").write_text(json.dumps({"server_pid": dead_pid(), "argv0": "x", "shm_prefix": "victim",
                                               "python_env_dirs": []}))
        (d / "13.json").write_text("{not json")
        (d / "14.json").write_text(json.dumps({"server_pid": dead_pid(), "argv0": "x", "shm_prefix": "",
                                               "python_env_dirs": [str(link)]}))
        (d / "notes.json").write_text("{}")
        pid15 = dead_pid()
        (d / "15.json").write_text(json.dumps({"server_pid": pid15, "argv0": "x", "shm_prefix": "trtspec1xab_",
                                               "python_env_dirs": [str(ok_env)]}))
        with caplog.at_level(logging.WARNING, logger="trtspec.server"):
            swept = sweep_leftovers()
        assert precious.joinpath("data").read_text() == "x"
        assert shm.read_bytes() == b"tensor"
        assert target.is_dir() and link.is_symlink()  # a symlink is never followed nor removed
        assert not ok_env.exists() and pid15 in swept  # a real leftover is still swept
        warned = caplog.text
        for name in (f"{pid}.json", "12.json", "13.json", "notes.json"):
            assert name in warned and (d / name).exists()  # skipped: neither used nor removed
        assert read_records(d) == []
    finally:
        shm.unlink(missing_ok=True)
        link.unlink(missing_ok=True)
        shutil.rmtree(target, ignore_errors=True)
        shutil.rmtree(ok_env, ignore_errors=True)


def test_a_bad_record_does_not_stop_a_server_from_starting(shared_tmp, tmp_path):
    (state_dir() / "99.json").write_text("{broken")
    model(tmp_path / "repo", "echo")
    with TritonServer(tmp_path / "repo", workdir=tmp_path / "w") as s:
        assert s.running


def _as_other(code: str, tmp: pathlib.Path) -> subprocess.CompletedProcess:
    return subprocess.run(["/usr/bin/python3", "-c", code], user=OTHER_UID, group=OTHER_UID, capture_output=True,
                          text=True, cwd="/", env={"PYTHONPATH": str(REPO), "TMPDIR": str(tmp), "PATH": "/usr/bin:/bin"},
                          timeout=60)


@as_root
def test_another_users_planted_folder_cannot_make_us_delete_anything(shared_tmp):
    victim_env = python_env_like()  # ours (root's), 0700: the attacker cannot remove it itself
    (victim_env / "work").write_text("ours")
    planted = shared_tmp / f"trtspec-{os.getuid()}"
    rec = json.dumps({"server_pid": 1999999, "argv0": "x", "shm_prefix": "", "python_env_dirs": [str(victim_env)]})
    r = _as_other(f"import os, pathlib; d = pathlib.Path({str(planted)!r}); os.mkdir(d, 0o700); "
                  f"(d / '1999999.json').write_text({rec!r})", shared_tmp)
    try:
        assert r.returncode == 0, r.stderr
        assert os.lstat(planted).st_uid == OTHER_UID
        with pytest.raises(ServerError, match=f"belongs to uid {OTHER_UID}"):
            sweep_leftovers()
        assert (victim_env / "work").read_text() == "ours"
    finally:
        shutil.rmtree(victim_env, ignore_errors=True)


@as_root
def test_another_user_starts_its_own_state_beside_ours(shared_tmp):
    ours = state_dir()
    with start_lock(ours):  # held by us: the other user's start must not wait on or fail at it
        r = _as_other("from trtspec.triton.launch.state import state_dir, start_lock\n"
                      "d = state_dir()\n"
                      "with start_lock(d):\n    print(d)\n", shared_tmp)
    assert r.returncode == 0, r.stderr
    theirs = pathlib.Path(r.stdout.strip())
    assert theirs == shared_tmp / f"trtspec-{OTHER_UID}" and os.lstat(theirs).st_uid == OTHER_UID


@as_root
def test_another_users_python_env_folder_is_never_ours_to_delete(shared_tmp):
    r = _as_other("import tempfile, os; p = '/tmp/python_env_' + os.urandom(3).hex()[:6]; os.mkdir(p, 0o700); print(p)",
                  shared_tmp)
    assert r.returncode == 0, r.stderr
    theirs = pathlib.Path(r.stdout.strip())
    try:
        assert theirs not in server_mod.glob_python_envs()
        server_mod._clean("", [theirs])
        assert theirs.is_dir()
    finally:
        shutil.rmtree(theirs, ignore_errors=True)


def test_shared_memory_regions_of_a_live_server_are_private(tmp_path):
    """The python backend makes its regions 0644 (Boost sets the mode explicitly); the launcher
    narrows them to 0600, and regions of a reloaded stub too (serve_forever's loop)."""
    model(tmp_path / "repo", "echo")
    with TritonServer(tmp_path / "repo", workdir=tmp_path / "w") as s:
        regions = list(SHM_DIR.glob(s.shm_prefix + "*"))
        assert regions
        for f in regions:
            st = os.lstat(f)
            assert stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == os.getuid(), (f, oct(st.st_mode))
        from tests.serving.test_watchdog import infer

        assert infer(s) == 7  # the stubs still use them
        regions[0].chmod(0o644)  # as a new region is made
        assert server_mod.tighten_shared_memory(s.shm_prefix) == [regions[0]]
        assert stat.S_IMODE(os.lstat(regions[0]).st_mode) == 0o600
