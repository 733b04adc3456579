"""The server launcher on a real tritonserver with tiny hand-written python models (fast stubs):
readiness, clean stop, model-load failures named with their reason, a hanging stub bounded by
the readiness timeout, a busy port, and `trtspec serve` stopped by SIGTERM."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from trtspec.errors import ServerError
from trtspec.triton.launch.server import (StopRequested, StopSignals, TritonServer, find_tritonserver, model_failures,
                                          models_still_loading, native_abort, prepare_backends, pytriton_dist)

ECHO_CONFIG = """name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "IN" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
"""
ECHO_MODEL = """import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        {init}

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy())])
                for r in requests]
"""


def model(repo: pathlib.Path, name: str, init: str = "pass") -> pathlib.Path:
    d = repo / name
    (d / "1").mkdir(parents=True)
    (d / "config.pbtxt").write_text(ECHO_CONFIG.format(name=name))
    (d / "1" / "model.py").write_text(ECHO_MODEL.format(init=init))
    return d


def group_alive(pgid: int, wait: float = 10.0) -> bool:
    """Whether any process of the group is left (killed processes need a moment to be reaped)."""
    deadline = time.monotonic() + wait
    while True:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        if time.monotonic() > deadline:
            return True
        time.sleep(0.1)


def sigterm_launcher(proc: subprocess.Popen, records: pathlib.Path, timeout: float = 60) -> tuple[int, int, str, str]:
    """SIGTERM a running `trtspec` launcher whose server recorded itself in ``records``
    ($TMPDIR/trtspec-<uid>); -> (server pid, exit code, stdout, stderr). Kills the
    launcher if it does not exit."""
    try:
        server_pid = json.loads(next(records.glob("*.json")).read_text())["server_pid"]
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout)
        out, err = proc.communicate()
        return server_pid, rc, out, err
    finally:
        if proc.poll() is None:
            proc.kill()


def test_start_ready_stop_cleans_up(tmp_path):
    model(tmp_path / "repo", "echo")
    with TritonServer(tmp_path / "repo", workdir=tmp_path / "w", ready_timeout=60) as s:
        with urllib.request.urlopen(f"{s.endpoints.http}/v2/models/echo/ready", timeout=5) as r:
            assert r.status == 200
        assert s.endpoints.host == "127.0.0.1"
        assert list(pathlib.Path("/dev/shm").glob(s.shm_prefix + "*"))
        pgid = s.proc.pid
    assert s.returncode == 0  # SIGTERM: graceful
    assert not list(pathlib.Path("/dev/shm").glob(s.shm_prefix + "*"))
    assert not group_alive(pgid)


def test_model_that_fails_to_load_is_named_with_its_reason(tmp_path):
    model(tmp_path / "repo", "echo")
    model(tmp_path / "repo", "broken", init='raise ValueError("tokenizer folder /nope is missing")')
    with pytest.raises(ServerError) as e:
        TritonServer(tmp_path / "repo", workdir=tmp_path / "w", ready_timeout=60).start()
    msg = str(e.value)
    assert "broken:" in msg and "tokenizer folder /nope is missing" in msg
    assert "echo:" not in msg
    assert "tritonserver.log" in msg  # where to read more


def test_stub_that_cannot_start_times_out_instead_of_hanging(tmp_path):
    d = model(tmp_path / "repo", "hang")
    stub = d / "triton_python_backend_stub"  # a per-model stub that never connects back
    stub.write_text("#!/bin/sh\nexec sleep 600\n")
    stub.chmod(0o755)
    server = TritonServer(tmp_path / "repo", workdir=tmp_path / "w", ready_timeout=6)
    t0 = time.monotonic()
    with pytest.raises(ServerError, match=r"not ready within 6 s(?s:.*)still loading: hang"):
        server.start()
    assert time.monotonic() - t0 < 40
    assert not server.running and not group_alive(server.proc.pid)  # the whole group was killed


def test_busy_port_is_a_clear_error(tmp_path):
    model(tmp_path / "repo", "echo")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(ServerError, match="already in use"):
            TritonServer(tmp_path / "repo", workdir=tmp_path / "w", grpc_port=port, ready_timeout=60).start()


def test_missing_repository(tmp_path):
    with pytest.raises(ServerError, match="does not exist"):
        TritonServer(tmp_path / "nope")


def test_log_parsing():
    log = "\n".join([
        'I1202 model_lifecycle.cc:472] "loading: preprocessing:1"',
        'I1202 model_lifecycle.cc:472] "loading: tensorrt_llm:1"',
        'I1202 model_lifecycle.cc:839] "successfully loaded \'preprocessing\'"',
        "E1202 model_lifecycle.cc:642] \"failed to load 'tensorrt_llm' version 1: Internal: ModelError: no such file\"",
        "| router | 1 | UNAVAILABLE: Internal: boom |",
    ])
    assert model_failures(log) == {"tensorrt_llm": "Internal: ModelError: no such file", "router": "Internal: boom"}
    stub_error = ("E1202 model_lifecycle.cc:642] \"failed to load 'm' version 1: Internal: ModelError: target "
                  "model folder not found: /x\\n  fix: check the path\\n\\nAt:\\n  /t/runtime.py(112): build\\n\"")
    assert model_failures(stub_error) == {"m": "Internal: ModelError: target model folder not found: /x; fix: check the path"}
    assert models_still_loading(log) == []
    assert models_still_loading('"loading: a:1"\n"loading: b:1"\n"successfully loaded \'a\'"') == ["b"]


# the lines tritonserver 2.51 printed when a SIGKILLed router stub took it down (tests/serving/test_faults.py)
ABORT_LOG = """I1205 00:44:25.336031 6823 model_lifecycle.cc:624] "successfully unloaded 'tensorrt_llm_baseline' version 1"
terminate called after throwing an instance of 'boost::interprocess::lock_exception'
  what():  boost::interprocess::lock_exception
Signal (6) received.
I1205 00:44:36.935621 6823 model_lifecycle.cc:472] "loading: ensemble_baseline:1"
 0# 0x00005610BFD8952D in /x/tritonserver
"""


def test_a_native_abort_is_named_with_its_known_cause(tmp_path):
    said = native_abort(ABORT_LOG)
    assert said.startswith("tritonserver aborted: uncaught boost::interprocess::lock_exception, signal 6: ")
    assert "python stub died while holding one of its shared-memory locks" in said
    assert native_abort("terminate called after throwing an instance of 'std::bad_alloc'\n") == \
        "tritonserver aborted: uncaught std::bad_alloc"
    assert native_abort("Signal (11) received.\n") == "tritonserver aborted: a fatal signal, signal 11"
    assert native_abort("Signal (15) received.\n") is None  # a stop request, not an abort
    assert native_abort('I1205 "successfully loaded \'a\'"\nE1205 x] "Signal (6) received." in a message') is None
    # the launcher's error when the server is gone says it, and how to get serving again
    repo = tmp_path / "repo"
    repo.mkdir()
    server = TritonServer(repo, workdir=tmp_path / "w")
    server.log_path = tmp_path / "tritonserver.log"
    server.log_path.write_text(ABORT_LOG)
    err = server._failure("tritonserver exited by itself (code -6)")
    assert "lock_exception" in err.message and err.fix.startswith("restart the server")


def _aborting_once(tmp_path: pathlib.Path, abort: str) -> tuple[pathlib.Path, tuple[str, ...]]:
    """A stand-in for tritonserver whose first start dies as Triton 2.51 does when a python stub
    crashes while the models load (the lines it prints, then SIGABRT), and whose next start runs
    the real server; and the flags that give the real one the bundled python backend."""
    real, bundled = find_tritonserver()
    extra: tuple[str, ...] = ()
    if bundled:
        extra = (f"--backend-directory={prepare_backends(tmp_path / 'b')}",)
        if (pytriton_dist() / "caches").is_dir():
            extra += (f"--cache-directory={pytriton_dist() / 'caches'}",)
    wrapper = tmp_path / "tritonserver"
    wrapper.write_text(f"""#!/bin/bash
if [ ! -e {tmp_path}/aborted ]; then
  : > {tmp_path}/aborted
  echo "terminate called after throwing an instance of '{abort}'"
  echo "  what():  {abort}"
  echo "Signal (6) received."
  kill -ABRT $$
fi
exec {real} "$@"
""")
    wrapper.chmod(0o755)
    return wrapper, extra


def test_a_known_abort_while_loading_is_started_once_more(tmp_path, capfd):
    """Triton 2.51's python stub can crash while the models load and take the server down with
    boost::interprocess::lock_exception (once in a fresh CI clone): the launcher starts it once
    more, says so, keeps the failed start's log, and the second start serves."""
    model(tmp_path / "repo", "echo")
    wrapper, extra = _aborting_once(tmp_path, "boost::interprocess::lock_exception")
    with TritonServer(tmp_path / "repo", workdir=tmp_path / "w", ready_timeout=60, binary=wrapper,
                      extra_args=extra) as s:
        with urllib.request.urlopen(f"{s.endpoints.http}/v2/models/echo/ready", timeout=5) as r:
            assert r.status == 200
        assert len(s.restarts) == 1 and s.restarts[0].startswith("boost::interprocess::lock_exception while loading")
    assert "lock_exception" in (tmp_path / "w" / "tritonserver.log.1").read_text()
    assert "starting it again (attempt 2 of 2)" in capfd.readouterr().err


def test_an_unknown_abort_while_loading_is_not_started_again(tmp_path):
    """Only an abort whose cause is known is tried again: any other stays the error it was."""
    model(tmp_path / "repo", "echo")
    wrapper, extra = _aborting_once(tmp_path, "std::bad_alloc")
    s = TritonServer(tmp_path / "repo", workdir=tmp_path / "w", ready_timeout=60, binary=wrapper, extra_args=extra)
    with pytest.raises(ServerError, match="uncaught std::bad_alloc"):
        s.start()
    assert s.restarts == [] and not s.running


def test_cli_serve_prints_endpoints_and_stops_on_sigterm(tmp_path):
    model(tmp_path / "repo", "echo")
    trtspec = pathlib.Path(sys.executable).parent / "trtspec"
    proc = subprocess.Popen([str(trtspec), "serve", str(tmp_path / "repo"), "--json", "--ready-timeout", "60"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        endpoints = json.loads(proc.stdout.readline())
        assert endpoints["grpc"].startswith("127.0.0.1:")
        with urllib.request.urlopen(endpoints["http"] + "/v2/health/ready", timeout=5) as r:
            assert r.status == 200
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(60)
        err = proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rc == 0, err
    assert "stopped (tritonserver exit code 0)" in err
    with pytest.raises(OSError):
        urllib.request.urlopen(endpoints["http"] + "/v2/health/live", timeout=2)


def test_cli_serve_stopped_while_loading_leaves_nothing_running(tmp_path):
    """SIGTERM while a model is still loading: the launcher stops the server it started (no
    tritonserver orphaned in its own process group) and exits 128+SIGTERM."""
    model(tmp_path / "repo", "slow", init="import time; time.sleep(60)")
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    records = tmp / f"trtspec-{os.getuid()}"  # the per-user state folder
    trtspec = pathlib.Path(sys.executable).parent / "trtspec"
    proc = subprocess.Popen([str(trtspec), "serve", str(tmp_path / "repo"), "--json", "--ready-timeout", "120"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "TMPDIR": str(tmp), "XDG_RUNTIME_DIR": ""})
    try:
        deadline = time.monotonic() + 60
        while not list(records.glob("*.json")):  # written once tritonserver runs, before it is ready
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
            time.sleep(0.05)
    except BaseException:
        proc.kill()
        raise
    server_pid, rc, out, err = sigterm_launcher(proc, records)
    assert rc == 128 + signal.SIGTERM, err
    assert out == ""  # never announced as ready
    assert "stopped by SIGTERM before the server was ready" in err
    assert not group_alive(server_pid)
    assert not list(records.glob("*.json"))


def test_stop_signals_raise_until_serving_then_only_set_the_event():
    """The contract `trtspec serve` relies on: before the server is ready a signal aborts the
    start (StopRequested); once ready it only asks serve_forever to return; handlers are restored."""
    before, before_hup = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGHUP)
    with pytest.raises(StopRequested) as e:
        with StopSignals():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1)  # the handler runs at the next bytecode boundary; never reached
    assert e.value.signum == signal.SIGTERM and str(e.value) == "SIGTERM"
    assert signal.getsignal(signal.SIGTERM) is before
    with StopSignals() as signals:
        signals.serving = True
        os.kill(os.getpid(), signal.SIGHUP)
        assert signals.stop.wait(5)
    assert signal.getsignal(signal.SIGHUP) is before_hup
