"""Secrets off the command line (issue 30; docs/security.md, trtspec.triton.access, argv_secrets.c).

Triton 2.51 reads restricted-API keys only from its arguments, and every local user can read a
process's arguments in /proc/<pid>/cmdline. The launcher writes placeholders there and preloads
the argv shim, which fills them from the environment in the argv array main() parses. On the real
tritonserver: the admin APIs and the required header still refuse callers without the key and
accept it; no process of the server shows the secret or the header's value in its cmdline; a
tritonserver started with placeholders but without the shim refuses to start (fail-closed); the
shim stops a start whose variable is missing; without a compiler the launcher falls back to the
values, with a warning."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import urllib.error
import urllib.request

import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from trtspec.errors import ServerError
from trtspec.triton.access import (GRPC_HEADER, HEADER, REQUIRED_HEADER_ENV, SECRET_ENV, RequiredHeader, argv_shim,
                                   fill_placeholders, hidden_restricted_args)
from trtspec.triton.launch.server import TritonServer, find_tritonserver, server_env
from trtspec.triton.launch.watchdog import WatchdogSettings

from tests.serving.test_triton_launcher import model
from tests.serving.test_watchdog import infer

VALUE = "gateway-value-0123456789abcdef"
NAME = "x-gateway-key"
needs_gcc = pytest.mark.skipif(shutil.which("gcc") is None and not os.environ.get("TRTSPEC_ARGV_SHIM"),
                               reason="no C compiler to build the argv shim (the fallback is tested below)")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("launch")
    model(root / "repo", "echo")
    with TritonServer(root / "repo", workdir=root / "w", required_header=RequiredHeader(NAME, VALUE),
                      watchdog=WatchdogSettings(interval_s=0.5, probe_every_s=None)) as s:
        yield s


def _group_cmdlines(pgid: int) -> dict[int, bytes]:
    out = {}
    for stat in pathlib.Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[2]) == pgid:
                out[int(stat.parent.name)] = (stat.parent / "cmdline").read_bytes()
        except (OSError, IndexError, ValueError):
            pass
    return out


def http(server, path, headers=None, body=b"{}") -> int:
    req = urllib.request.Request(server.endpoints.http + path, data=body, method="POST", headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


@needs_gcc
def test_no_process_of_the_server_shows_the_secret_or_the_header_value(server):
    assert server.argv_shim is not None and server.argv_shim_warning is None
    cmdlines = _group_cmdlines(server.proc.pid)
    assert server.proc.pid in cmdlines and len(cmdlines) >= 2  # tritonserver and the echo model's stub
    for pid, cmd in cmdlines.items():
        assert server.secret.encode() not in cmd and VALUE.encode() not in cmd, pid
    args = cmdlines[server.proc.pid].decode().split("\0")
    assert set(hidden_restricted_args()) <= set(args)  # what a local user sees: the placeholders
    assert f"--grpc-restricted-protocol=@trtspec@inference,metadata,model-config,statistics:{NAME}=" \
           f"{{{REQUIRED_HEADER_ENV}}}" in args


@needs_gcc
def test_the_restricted_apis_refuse_without_the_key_and_accept_it(server):
    # admin API (the launch's secret), over HTTP
    assert http(server, "/v2/repository/index") in (401, 403)
    assert http(server, "/v2/repository/index", {HEADER: "@trtspec@"}) in (401, 403)
    assert http(server, "/v2/repository/index", {HEADER: "{" + SECRET_ENV + "}"}) in (401, 403)  # the placeholder
    assert http(server, "/v2/repository/index", {HEADER: server.secret}) == 200
    # and over gRPC
    with grpcclient.InferenceServerClient(server.endpoints.grpc) as c:
        with pytest.raises(InferenceServerException, match="(?i)restricted|expecting header"):
            c.get_model_repository_index()
        assert c.get_model_repository_index(headers={GRPC_HEADER: server.secret,
                                                     "triton-grpc-protocol-" + NAME: VALUE}) is not None
    # the required header gates inference: refused without it, answered with it
    body = json.dumps({"inputs": [{"name": "IN", "shape": [1], "datatype": "INT32", "data": [7]}]}).encode()
    assert http(server, "/v2/models/echo/infer", body=body) in (401, 403)
    assert http(server, "/v2/models/echo/infer", {NAME: "{" + REQUIRED_HEADER_ENV + "}"}, body=body) in (401, 403)
    assert http(server, "/v2/models/echo/infer", {NAME: VALUE}, body=body) == 200
    assert "expecting header" in str(infer(server))
    # the watchdog talks to the admin API with the secret: it is running without an error
    assert server.watchdog is not None and server.watchdog.error is None


@needs_gcc
def test_a_tritonserver_without_the_shim_refuses_the_placeholders(tmp_path):
    """Fail-closed: were LD_PRELOAD lost on the way, the placeholder is not a valid rule (no API is
    called '@trtspec@model-repository'), so the server does not start with a well-known key."""

    class NoShim(TritonServer):
        def server_env(self):
            env = super().server_env()
            env.pop("LD_PRELOAD", None)
            return env

    (tmp_path / "repo").mkdir()
    s = NoShim(tmp_path / "repo", workdir=tmp_path / "w", ready_timeout=60)
    with pytest.raises(ServerError, match="exited"):
        s.start()
    assert not s.running


@needs_gcc
def test_the_shim_stops_a_start_whose_variable_is_missing(tmp_path):
    shim, _ = argv_shim()
    binary, bundled = find_tritonserver()
    env = {k: v for k, v in server_env().items() if k != SECRET_ENV}
    r = subprocess.run([str(binary), f"--model-repository={tmp_path}", *hidden_restricted_args()],
                       env={**env, "LD_PRELOAD": str(shim)}, capture_output=True, text=True, timeout=60)
    assert r.returncode == 78, r.stderr[-500:]
    assert f"the environment has no value for {SECRET_ENV}" in r.stderr


ARGV_PRINTER = r"""
#include <stdio.h>
int main(int argc, char **argv) { for (int i = 1; i < argc; i++) printf("%s\n", argv[i]); return 0; }
"""


@needs_gcc
@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc for the argv printer")
def test_the_shim_fills_exactly_what_fill_placeholders_says_and_only_in_tritonserver(tmp_path):
    shim, _ = argv_shim()
    src = tmp_path / "p.c"
    src.write_text(ARGV_PRINTER)
    for name in ("tritonserver", "mpirun"):
        subprocess.run(["gcc", "-o", str(tmp_path / name), str(src)], check=True)
    argv = ["--http-restricted-api=@trtspec@a,b:k={SECRET_A}", "--x=@trtspec@{SECRET_A}-{SECRET_B}",
            "--plain={SECRET_A}", "--y=no@trtspec@mark", "--z=@trtspec@{nolower}"]
    env = {"SECRET_A": "s3cr3t", "SECRET_B": "t0k3n", "LD_PRELOAD": str(shim), "PATH": os.environ["PATH"]}
    out = subprocess.run([str(tmp_path / "tritonserver"), *argv], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.splitlines() == ["--http-restricted-api=a,b:k=s3cr3t", "--x=s3cr3t-t0k3n", "--plain={SECRET_A}",
                                      "--y=no@trtspec@mark", "--z={nolower}"]
    assert out.stdout.splitlines()[:3] == fill_placeholders(argv, env)[:3]
    other = subprocess.run([str(tmp_path / "mpirun"), *argv], env=env, capture_output=True, text=True, check=True)
    assert other.stdout.splitlines() == argv  # mpirun passes the placeholders on untouched


def test_without_a_compiler_the_launch_falls_back_to_the_values_with_a_warning(tmp_path, monkeypatch, capfd):
    monkeypatch.delenv("TRTSPEC_ARGV_SHIM", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # nothing built yet
    monkeypatch.setenv("CC", "no-such-compiler")
    monkeypatch.setattr("trtspec.triton.access.shutil.which", lambda name: None)
    assert argv_shim() == (None, "no C compiler (gcc) to build the argv shim")
    (tmp_path / "repo").mkdir()
    with TritonServer(tmp_path / "repo", workdir=tmp_path / "w", ready_timeout=60) as s:
        assert s.argv_shim is None
        assert "install gcc" in capfd.readouterr().err
        assert s.secret.encode() in pathlib.Path(f"/proc/{s.proc.pid}/cmdline").read_bytes()
        assert http(s, "/v2/repository/index") in (401, 403)
        assert http(s, "/v2/repository/index", {HEADER: s.secret}) == 200
