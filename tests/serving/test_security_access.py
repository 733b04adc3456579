"""The server's admin APIs are closed to strangers (docs/security.md, trtspec.triton.access).

A real tritonserver under explicit model control (the watchdog on, as ``trtspec serve`` runs it)
with a tiny python model: every model-repository call (index, load with a config override, load
with a *files* override carrying a model.py, unload), shared-memory registration, trace and
logging settings is refused over HTTP and gRPC without the launch's secret or with a wrong one;
the model keeps serving; with the secret the same API answers (so the refusal is the secret's
doing, not an API that is simply off). The bind address never comes from the repository."""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request

import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from trtspec.triton.access import (GRPC_HEADER, HEADER, exposure_warning, is_loopback, resolve_host,
                                   restricted_args, signed_stop_id, verify_stop_id)
from trtspec.triton.launch.server import TritonServer, server_for_repository
from trtspec.triton.launch.watchdog import WatchdogSettings

from tests.serving.test_triton_launcher import model
from tests.serving.test_watchdog import infer

EVIL_PY = b"""
import pathlib
class TritonPythonModel:
    def initialize(self, args):
        pathlib.Path(args["model_repository"]).joinpath("PWNED").write_text("code ran")
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("access")
    model(root / "repo", "echo")
    with TritonServer(root / "repo", workdir=root / "w",
                      watchdog=WatchdogSettings(interval_s=0.5, probe_every_s=None)) as s:
        assert "--model-control-mode=explicit" in s.cmd  # the API the watchdog needs is there
        yield s


def http(server, method, path, body=None, headers=None) -> tuple[int, str]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(server.endpoints.http + path, data=data, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


EVIL_CONFIG = json.dumps({"name": "evil", "backend": "python", "max_batch_size": 0,
                          "input": [{"name": "IN", "data_type": "TYPE_INT32", "dims": [1]}],
                          "output": [{"name": "OUT", "data_type": "TYPE_INT32", "dims": [1]}]})
ATTACKS = [
    ("POST", "/v2/repository/index", {}),
    ("POST", "/v2/repository/models/echo/unload", {}),
    ("POST", "/v2/repository/models/echo/load",
     {"parameters": {"config": json.dumps({"name": "echo", "backend": "python", "max_batch_size": 0,
                                           "parameters": {"x": {"string_value": "overridden"}}})}}),
    ("POST", "/v2/repository/models/evil/load",
     {"parameters": {"config": EVIL_CONFIG, "file:1/model.py": base64.b64encode(EVIL_PY).decode()}}),
    ("POST", "/v2/systemsharedmemory/region/stolen/register", {"key": "/trtspec_x", "offset": 0, "byte_size": 64}),
    ("GET", "/v2/systemsharedmemory/status", None),
    ("POST", "/v2/trace/setting", {"trace_level": ["TIMESTAMPS"]}),
    ("POST", "/v2/logging", {"log_verbose_level": 1}),
]


@pytest.mark.parametrize("headers", [{}, {HEADER: "guessed"}], ids=["no-secret", "wrong-secret"])
def test_http_admin_apis_are_refused_without_the_secret(server, headers):
    for method, path, body in ATTACKS:
        status, text = http(server, method, path, body, headers)
        assert status in (401, 403), (path, status, text)
        assert "restricted" in text.lower() or "expecting header" in text.lower(), (path, text)
    assert not (server.repository / "evil").exists()
    assert not list(server.repository.rglob("PWNED"))
    assert infer(server) == 7  # still loaded, still serving
    ready = {m["name"] for m in json.loads(http(server, "POST", "/v2/repository/index", {},
                                                {HEADER: server.secret})[1]) if m.get("state") == "READY"}
    assert "echo" in ready and "evil" not in ready


@pytest.mark.parametrize("headers", [{}, {GRPC_HEADER: "guessed"}], ids=["no-secret", "wrong-secret"])
def test_grpc_admin_protocols_are_refused_without_the_secret(server, headers):
    c = grpcclient.InferenceServerClient(server.endpoints.grpc)
    try:
        calls = [
            lambda: c.get_model_repository_index(headers=headers),
            lambda: c.unload_model("echo", headers=headers),
            lambda: c.load_model("echo", headers=headers, config=json.dumps({"name": "echo", "backend": "python"})),
            lambda: c.load_model("evil", headers=headers, config=EVIL_CONFIG, files={"file:1/model.py": EVIL_PY}),
            lambda: c.register_system_shared_memory("stolen", "/trtspec_x", 64, headers=headers),
            lambda: c.get_system_shared_memory_status(headers=headers),
            lambda: c.update_trace_settings(settings={"trace_level": ["TIMESTAMPS"]}, headers=headers),
            lambda: c.update_log_settings(settings={"log_verbose_level": 1}, headers=headers),
        ]
        for i, call in enumerate(calls):
            with pytest.raises(InferenceServerException, match="(?i)restricted|expecting header"):
                call()
        assert c.is_model_ready("echo")
        names = {m.name for m in c.get_model_repository_index(headers={GRPC_HEADER: server.secret}).models}
        assert "echo" in names and "evil" not in names
    finally:
        c.close()
    assert infer(server) == 7
    assert not list(server.repository.rglob("PWNED"))


def test_the_watchdog_still_reloads_with_the_secret(server):
    """The watchdog's own repository calls carry the secret: a killed stub is still reloaded."""
    import os
    import signal

    from tests.serving.test_watchdog import stub_pid, wait_for

    os.kill(stub_pid(server), signal.SIGKILL)
    wait_for(lambda: any(e.kind == "reloaded" and e.model == "echo" for e in server.watchdog.events), timeout=90)
    assert infer(server) == 7


def test_each_launch_has_its_own_secret_and_it_is_not_in_the_repository(tmp_path):
    model(tmp_path / "repo", "echo")
    a, b = TritonServer(tmp_path / "repo"), TritonServer(tmp_path / "repo")
    assert a.secret != b.secret and len(a.secret) >= 40
    assert restricted_args(a.secret) == [
        f"--http-restricted-api=model-repository,shared-memory,trace,logging:{HEADER}={a.secret}",
        f"--grpc-restricted-protocol=model-repository,shared-memory,trace,logging:{HEADER}={a.secret}"]


def test_the_bind_address_never_comes_from_the_repository(tmp_path, monkeypatch):
    model(tmp_path / "repo", "echo")
    (tmp_path / "repo" / "trtspec.json").write_text(json.dumps({"kind": "triton-repository",
                                                                "recipe": {"serving": {"host": "0.0.0.0"}}}))
    monkeypatch.delenv("TRTSPEC_HOST", raising=False)
    assert server_for_repository(tmp_path / "repo").host == "127.0.0.1"
    monkeypatch.setenv("TRTSPEC_HOST", "0.0.0.0")
    assert server_for_repository(tmp_path / "repo").host == "0.0.0.0"
    assert server_for_repository(tmp_path / "repo", host="127.0.0.2").host == "127.0.0.2"
    assert resolve_host(None, {}) == ("127.0.0.1", "default")


def test_a_non_loopback_bind_names_what_it_exposes():
    for host in ("127.0.0.1", "::1", "[::1]", "localhost", "127.0.0.5"):
        assert is_loopback(host) and exposure_warning(host, 1, 2, 3) is None
    w = exposure_warning("0.0.0.0", 8001, 8000, 8002)
    assert w and "0.0.0.0" in w and ":8001" in w and ":8000" in w and ":8002" in w
    assert "generation requests" in w and "model-repository" in w


def test_stop_ids_are_signed_by_the_secret():
    sid = signed_stop_id("router-abc", "s3cret")
    assert verify_stop_id(sid, "s3cret") == "router-abc"
    assert verify_stop_id(sid, "other") is None
    assert verify_stop_id(sid, None) is None  # no secret here: no stop is honoured
    assert verify_stop_id("router-abc", "s3cret") is None
    assert verify_stop_id("router-abc|" + "0" * 32, "s3cret") is None


def _report(server, secret, models="echo", event="reload"):
    body = {"inputs": [
        {"name": "EVENT", "shape": [1], "datatype": "BYTES", "data": [event]},
        {"name": "MODEL", "shape": [1], "datatype": "BYTES", "data": [models]},
        {"name": "SECONDS", "shape": [1], "datatype": "FP32", "data": [1.0]},
        *([{"name": "SECRET", "shape": [1], "datatype": "BYTES", "data": [secret]}] if secret is not None else []),
    ]}
    return http(server, "POST", "/v2/models/trtspec_watchdog/infer", body)


def test_the_watchdog_counters_take_only_the_launchers_reports(server):
    from tests.serving.test_watchdog import metric_value

    series = 'trtspec_watchdog_reloads_total{model="echo"}'
    before = metric_value(server, series)
    for secret, models in ((None, "echo"), ("guessed", "echo"), ("", "echo"),
                           (server.secret, "not_a_model"), (server.secret, "x" * 5000)):
        status, text = _report(server, secret, models)
        assert status == 400, (secret, models, status, text)
    assert metric_value(server, series) == before
    assert metric_value(server, 'trtspec_watchdog_reloads_total{model="not_a_model"}') is None
    status, _ = _report(server, server.secret)  # the launcher's own report still counts
    assert status == 200 and metric_value(server, series) == before + 1


def _local_address() -> str | None:
    """This machine's own non-loopback IPv4 address (no packet is sent), or None."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("10.255.255.255", 9))
            addr = s.getsockname()[0]
        except OSError:
            return None
    return None if addr.startswith("127.") or addr == "0.0.0.0" else addr


def test_cli_serve_warns_when_it_binds_a_non_loopback_address(tmp_path):
    """`trtspec serve --host <this machine's address>`: the warning names the ports and what they
    expose, and the watchdog (which talks to that address) still works with the secret."""
    import os
    import pathlib
    import signal
    import subprocess
    import sys

    addr = _local_address()
    if addr is None:
        pytest.skip("no non-loopback IPv4 address on this machine")
    model(tmp_path / "repo", "echo")
    trtspec = pathlib.Path(sys.executable).parent / "trtspec"
    proc = subprocess.Popen([str(trtspec), "serve", str(tmp_path / "repo"), "--host", addr, "--json",
                             "--ready-timeout", "60", "--probe-every", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "XDG_RUNTIME_DIR": ""})
    try:
        endpoints = json.loads(proc.stdout.readline())
        assert endpoints["grpc"].startswith(addr)
        with pytest.raises(urllib.error.HTTPError) as refused:  # the admin API stays closed
            urllib.request.urlopen(urllib.request.Request(endpoints["http"] + "/v2/repository/index", data=b"{}"),
                                   timeout=10)
        assert refused.value.code in (401, 403)
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(60)
        err = proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rc == 0, err
    grpc_port = endpoints["grpc"].rsplit(":", 1)[1]
    flat = " ".join(err.split())
    assert f"warning: binding {addr}" in flat and f"gRPC :{grpc_port}" in flat and "unauthenticated" in flat
    assert "need this launch's secret" in flat
