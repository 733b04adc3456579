"""The watchdog and the cleanup on a real tritonserver with tiny hand-written python models (fast
stubs): a killed stub is reloaded and counted on /metrics, a reload that hangs and a crash loop
become errors, and what abnormal exits leave behind is removed."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import time
import urllib.request

import pytest

from trtspec.errors import ConfigError, ServerError
from trtspec.triton.procs import instance_model, is_instance_of, parse_stub_cmdline, stubs_of
from trtspec.triton.launch.server import SHM_DIR, TritonServer, sweep_leftovers
from trtspec.triton.launch.watchdog import WatchdogSettings

from tests.serving.test_triton_launcher import group_alive, model

FAST = WatchdogSettings(interval_s=0.2, probe_every_s=None, load_timeout_s=60)


def infer(server, name="echo", value=7, timeout=10):
    body = json.dumps({"inputs": [{"name": "IN", "shape": [1], "datatype": "INT32", "data": [value]}]}).encode()
    req = urllib.request.Request(f"{server.endpoints.http}/v2/models/{name}/infer", data=body)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.loads(r.read())["outputs"][0]["data"][0]
    except urllib.error.HTTPError as e:
        return json.loads(e.read())["error"]


def stub_pid(server, instance="echo_0_0") -> int:
    return next(s.pid for s in stubs_of(server.proc.pid) if s.instance == instance)


def wait_for(predicate, timeout=60.0, every=0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"not within {timeout} s")


def metric_value(server, line_start: str) -> float | None:
    text = urllib.request.urlopen(server.endpoints.metrics, timeout=5).read().decode()
    for line in text.splitlines():
        if line.startswith(line_start):
            return float(line.rsplit(" ", 1)[1])
    return None


def test_stub_command_lines_and_instance_names():
    cmd = b"/w/backends/python/triton_python_backend_stub\0/r/router/1/model.py\0trtspec1_abc\0" \
          b"1048576\0001048576\0004242\0/w/backends/python\000336\0router_baseline_0_0\0DEFAULT\0"
    stub = parse_stub_cmdline(12, cmd)
    assert stub.instance == "router_baseline_0_0" and stub.model == "router_baseline"
    assert parse_stub_cmdline(13, b"/usr/bin/python3\0x.py\0") is None
    assert instance_model("tensorrt_llm_0_1") == "tensorrt_llm"
    assert is_instance_of("tensorrt_llm_0_0", "tensorrt_llm")
    assert not is_instance_of("tensorrt_llm_baseline_0_0", "tensorrt_llm")


def test_settings_are_checked():
    with pytest.raises(ConfigError, match="watchdog.load_timeout_s"):
        WatchdogSettings(load_timeout_s=0)
    with pytest.raises(ConfigError, match="watchdog.max_reloads"):
        WatchdogSettings(max_reloads=0)
    with pytest.raises(ConfigError, match="watchdog.probe_failures"):
        WatchdogSettings(probe_failures=0)
    with pytest.raises(ConfigError, match="watchdog.health_every_s"):
        WatchdogSettings(health_every_s=0)
    with pytest.raises(ConfigError, match="watchdog.health_timeout_s"):
        WatchdogSettings(health_timeout_s=0)


def test_a_killed_stub_is_reloaded_logged_and_counted(tmp_path):
    model(tmp_path / "repo", "echo")
    events = []
    with TritonServer(tmp_path / "repo", workdir=tmp_path / "w", ready_timeout=60, watchdog=FAST,
                      on_watchdog_event=events.append) as s:
        assert infer(s) == 7
        # the server runs under explicit model control, every model loaded (the watchdog's too)
        assert "--model-control-mode=explicit" in s.cmd and "--load-model=*" in s.cmd
        assert metric_value(s, 'trtspec_watchdog_reloads_total{model="echo"}') == 0
        old = stub_pid(s)
        os.kill(old, signal.SIGKILL)
        t0 = time.monotonic()
        wait_for(lambda: any(e.kind == "reloaded" for e in events))
        recovered = time.monotonic() - t0
        assert [e.kind for e in events] == ["unhealthy", "reloaded"]
        assert events[0].model == "echo" and "echo_0_0 exited" in events[0].detail
        assert stub_pid(s) != old and infer(s) == 7  # a new stub serves again
        assert metric_value(s, 'trtspec_watchdog_reloads_total{model="echo"}') == 1
        assert metric_value(s, 'trtspec_watchdog_last_recovery_seconds{model="echo"}') == pytest.approx(
            events[1].seconds)
        assert recovered < 30
    assert s.returncode == 0


def test_without_the_watchdog_a_dead_stub_stays_ready_and_failing(tmp_path):
    """What the watchdog is for: Triton 2.51 itself never recovers (reference/triton-cpu.md §8)."""
    model(tmp_path / "repo", "echo")
    # exit_timeout 1: a dead stub holds shutdown for the whole exit timeout
    with TritonServer(tmp_path / "repo", workdir=tmp_path / "w", ready_timeout=60, exit_timeout=1) as s:
        os.kill(stub_pid(s), signal.SIGKILL)
        time.sleep(1.0)
        assert "Stub process 'echo_0_0' is not healthy" in infer(s)
        with urllib.request.urlopen(f"{s.endpoints.http}/v2/models/echo/ready", timeout=5) as r:
            assert r.status == 200  # still READY


def test_a_reload_that_hangs_is_a_bounded_error(tmp_path):
    d = model(tmp_path / "repo", "echo")
    settings = WatchdogSettings(interval_s=0.2, probe_every_s=None, load_timeout_s=4)
    with TritonServer(tmp_path / "repo", workdir=tmp_path / "w", ready_timeout=60, watchdog=settings,
                      exit_timeout=1) as s:
        # from now on the model's stub cannot start: a per-model stub that never connects back
        stub = d / "triton_python_backend_stub"
        stub.write_text("#!/bin/sh\nexec sleep 600\n")
        stub.chmod(0o755)
        os.kill(stub_pid(s), signal.SIGKILL)
        t0 = time.monotonic()
        with pytest.raises(ServerError, match=r"'echo' not loaded again within 4 s(?s:.*)cannot start"):
            wait_for(lambda: s.watchdog.error, timeout=60) and s.serve_forever()
        assert time.monotonic() - t0 < 30
        assert [e.kind for e in s.watchdog.events][-2:] == ["reload_failed", "gave_up"]
        pgid = s.proc.pid
    assert not group_alive(pgid)


def test_a_crash_loop_makes_the_watchdog_give_up(tmp_path):
    model(tmp_path / "repo", "echo")
    settings = WatchdogSettings(interval_s=0.2, probe_every_s=None, load_timeout_s=60, max_reloads=1)
    with TritonServer(tmp_path / "repo", workdir=tmp_path / "w", ready_timeout=60, watchdog=settings) as s:
        os.kill(stub_pid(s), signal.SIGKILL)
        wait_for(lambda: any(e.kind == "reloaded" for e in s.watchdog.events))
        os.kill(stub_pid(s), signal.SIGKILL)
        err = wait_for(lambda: s.watchdog.error)
        assert "failed 2 times within 600 s" in err.message and "tritonserver log" in err.fix


def test_a_server_that_aborts_is_said_to_have_aborted_not_a_failed_reload(tmp_path):
    """tritonserver itself aborting (as Triton 2.51 does when a stub dies holding a shared-memory
    lock; here SIGABRT from outside): the watchdog's reload says the server is gone, and the
    launcher's error names the abort and says to restart."""
    model(tmp_path / "repo", "echo")
    settings = WatchdogSettings(interval_s=3600, probe_every_s=None, load_timeout_s=60)  # reloads by hand
    with TritonServer(tmp_path / "repo", workdir=tmp_path / "w", ready_timeout=60, watchdog=settings) as s:
        os.kill(s.proc.pid, signal.SIGABRT)
        s.proc.wait(30)
        with pytest.raises(ServerError, match=rf"'echo' not reloaded: tritonserver \(pid {s.proc.pid}\) exited"):
            s.watchdog.reload("echo")
        with pytest.raises(ServerError, match=r"exited by itself(?s:.*)tritonserver aborted: a fatal signal, signal 6") as e:
            s.serve_forever()
        assert e.value.fix.startswith("restart the server")


def test_a_killed_server_leaves_nothing_behind(tmp_path):
    model(tmp_path / "repo", "echo")
    s = TritonServer(tmp_path / "repo", workdir=tmp_path / "w", ready_timeout=60).start()
    try:
        envs = list(s.python_env_dirs)
        assert len(envs) == 1 and envs[0].is_dir()  # the python backend's /tmp/python_env_*
        assert list(SHM_DIR.glob(s.shm_prefix + "*"))
        os.kill(s.proc.pid, signal.SIGKILL)  # no clean exit: the server removes nothing itself
        s.proc.wait(10)
        assert envs[0].is_dir() and list(SHM_DIR.glob(s.shm_prefix + "*"))
    finally:
        s.stop()
    assert not envs[0].exists() and not list(SHM_DIR.glob(s.shm_prefix + "*"))
    assert not group_alive(s.proc.pid)  # the stubs went with the group


def test_leftovers_of_a_launcher_that_was_killed_are_swept(tmp_path):
    """A launcher killed with SIGKILL never runs stop(): the next start cleans up after it."""
    model(tmp_path / "repo", "echo")
    s = TritonServer(tmp_path / "repo", workdir=tmp_path / "w", ready_timeout=60).start()
    envs, prefix, pid = list(s.python_env_dirs), s.shm_prefix, s.proc.pid
    os.killpg(pid, signal.SIGKILL)  # as if the launcher and its server were killed together
    s.proc.wait(10)
    assert envs[0].is_dir() and list(SHM_DIR.glob(prefix + "*"))
    assert pid in sweep_leftovers()
    assert not envs[0].exists() and not list(SHM_DIR.glob(prefix + "*"))
    s.stop()  # the launcher's own stop is then a no-op


def test_cli_serve_reports_watchdog_events(tmp_path):
    import subprocess
    import sys

    model(tmp_path / "repo", "echo")
    trtspec = pathlib.Path(sys.executable).parent / "trtspec"
    proc = subprocess.Popen([str(trtspec), "serve", str(tmp_path / "repo"), "--json", "--ready-timeout", "60",
                             "--probe-every", "0", "--probe-timeout", "5", "--probe-failures", "2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        endpoints = json.loads(proc.stdout.readline())
        assert endpoints["watchdog"] is True
        server_pid = next(int(p) for p in os.listdir("/proc") if p.isdigit() and _child_of(int(p), proc.pid))
        os.kill(next(s.pid for s in stubs_of(server_pid) if s.instance == "echo_0_0"), signal.SIGKILL)
        metrics = endpoints["metrics"]
        wait_for(lambda: 'trtspec_watchdog_reloads_total{model="echo"} 1' in
                 urllib.request.urlopen(metrics, timeout=5).read().decode(), timeout=60, every=0.3)
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(60)
        err = proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rc == 0, err
    assert "watchdog: unhealthy echo" in err and "watchdog: reloaded echo" in err


def _child_of(pid: int, parent: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1]) == parent
    except OSError:
        return False
