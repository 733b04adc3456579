"""TLS end to end on the tiny pair's repository, served as ``serving.tls`` + ``serving.require_header``
set it in the recipe: mutual TLS with a certificate for a DNS name only (no IP), every inference
and metadata call gated by a header, bound to 0.0.0.0.

What each internal client must do, and is checked here on a real tritonserver:
* the router relays engine responses over gRPC *with TLS* (not the BLS fallback), presenting the
  server's certificate and the header, and the ensemble answers exactly as the baseline;
* the watchdog's probe and its reload of a killed engine stub go over TLS with the header;
* the OpenAI relay (``serve --openai-port``) calls the ensembles over TLS with the header;
* strangers: no client certificate, no header, plaintext: refused; health stays open;
* Triton's plaintext HTTP is bound to 127.0.0.1 only.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
import urllib.request

import pytest
import tritonclient.grpc as grpcclient

from trtspec.client import LLMClient, Sampling
from trtspec.client.errors import AuthRejected, TLSMismatch
from trtspec.client.targets import ClientOptions, TLSOptions
from trtspec.config import parse_recipe
from trtspec.openai_api import relay_for_repository
from trtspec.triton.access import REQUIRED_HEADER_ENV, certificate_name, fill_placeholders
from trtspec.triton.launch.server import server_for_repository
from trtspec.triton.launch.watchdog import WatchdogSettings
from trtspec.triton.procs import stubs_of
from trtspec.triton.render import package

from tests.serving.certs import openssl_pki
from tests.serving.test_triton_serving import tiny_recipe

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")

NAME = "llm.internal.test"  # the only name in the server's certificate: loopback clients must override
HEADER_NAME = "x-gateway-key"
VALUE = "gw-" + "k" * 29
PROMPT = "def fibonacci(n):\n    "
MAX_TOKENS = 24


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return openssl_pki(tmp_path_factory.mktemp("pki-e2e"), server_san=f"DNS:{NAME}", client_san="DNS:client")


@pytest.fixture(scope="module")
def server(tiny_models, pki, tmp_path_factory):
    root = tmp_path_factory.mktemp("tls-e2e")
    raw = tiny_recipe(*tiny_models)
    raw["serving"] = {**raw["serving"], "require_header": HEADER_NAME,
                      "tls": {"cert": str(pki / "server.pem"), "key": str(pki / "server.key"),
                              "ca": str(pki / "ca.pem")}}
    package(parse_recipe(raw), root / "repo")
    old = os.environ.get(REQUIRED_HEADER_ENV)
    os.environ[REQUIRED_HEADER_ENV] = VALUE
    try:
        s = server_for_repository(root / "repo", host="0.0.0.0", workdir=root / "server", ready_timeout=240,
                                  watchdog=WatchdogSettings(interval_s=0.5, probe_every_s=None, load_timeout_s=180))
    finally:
        if old is None:
            os.environ.pop(REQUIRED_HEADER_ENV)
        else:
            os.environ[REQUIRED_HEADER_ENV] = old
    with s:
        yield s


def options(pki, *, cert=True, header=True, server_name=NAME) -> ClientOptions:
    tls = TLSOptions(ca=str(pki / "ca.pem"), cert=str(pki / "client.pem") if cert else None,
                     key=str(pki / "client.key") if cert else None, server_name=server_name)
    return ClientOptions(tls=tls, headers=((f"triton-grpc-protocol-{HEADER_NAME}", VALUE),) if header else ())


def url(server) -> str:
    return f"grpcs://127.0.0.1:{server.endpoints.grpc_port}"


def greedy(server, pki, model: str, **kw):
    with LLMClient(url(server), options=options(pki, **kw)) as c:
        c.wait_ready([model], timeout_s=60)
        return c.generate(PROMPT, Sampling(max_tokens=MAX_TOKENS), model=model, timeout_s=120)


def test_the_recipe_hardens_the_launch(server, pki):
    assert certificate_name(str(pki / "server.pem")) == NAME
    assert "--grpc-use-ssl-mutual=true" in server.cmd and "--http-address=127.0.0.1" in server.cmd
    # the header's value reaches tritonserver through the argv shim, not its command line (issue 30)
    argv = fill_placeholders(server.cmd, server.server_env()) if server.argv_shim else server.cmd
    gated = [a for a in argv if a.startswith("--grpc-restricted-protocol=inference")]
    assert gated and gated[0].endswith(f":{HEADER_NAME}={VALUE}")
    assert server.argv_shim is None or VALUE not in " ".join(server.cmd)
    relays = [line for line in server.log_text().splitlines() if "relays engine responses over" in line]
    assert len(relays) == 2 and all("over gRPC at" in line for line in relays), relays


def test_speculative_equals_baseline_through_the_tls_relay(server, pki):
    spec, base = greedy(server, pki, "ensemble"), greedy(server, pki, "ensemble_baseline")
    assert spec.token_ids == base.token_ids and len(spec.token_ids) > 0
    assert spec.served_by == "speculative"


def test_strangers_are_refused_and_health_stays_open(server, pki):
    with pytest.raises(AuthRejected):
        greedy(server, pki, "ensemble", header=False)
    with pytest.raises(TLSMismatch):
        greedy(server, pki, "ensemble", cert=False)
    with pytest.raises(TLSMismatch):  # the certificate names NAME, not 127.0.0.1
        greedy(server, pki, "ensemble", server_name=None)
    plain = grpcclient.InferenceServerClient(f"127.0.0.1:{server.endpoints.grpc_port}")
    with pytest.raises(Exception):
        plain.is_server_live(client_timeout=5)
    plain.close()
    tls = grpcclient.InferenceServerClient(
        f"127.0.0.1:{server.endpoints.grpc_port}", ssl=True, root_certificates=str(pki / "ca.pem"),
        private_key=str(pki / "client.key"), certificate_chain=str(pki / "client.pem"),
        channel_args=options(pki).tls.channel_args())
    assert tls.is_server_ready(client_timeout=5)  # health needs no header (load balancers probe it)
    tls.close()


def test_the_watchdog_probes_and_reloads_over_tls(server, pki):
    wd = server.watchdog
    events = len(wd.events)
    assert wd.probe() == {} and not [e for e in wd.events[events:] if e.kind == "probe_failed"]
    before = greedy(server, pki, "ensemble")
    stub = next(s.pid for s in stubs_of(server.proc.pid) if s.instance == "tensorrt_llm_0_0")
    os.kill(stub, signal.SIGKILL)
    deadline = time.monotonic() + 180
    while not any(e.kind == "reloaded" and e.model == "tensorrt_llm" for e in wd.events[events:]):
        assert time.monotonic() < deadline and wd.error is None, [str(e) for e in wd.events[events:]]
        time.sleep(0.2)
    assert not [e for e in wd.events[events:] if e.kind in ("reload_failed", "gave_up")]
    assert greedy(server, pki, "ensemble").token_ids == before.token_ids


def test_the_openai_relay_calls_the_ensemble_over_tls(server, pki):
    grpc_url, opts = server.client_target()
    assert grpc_url.startswith("grpcs://") and opts.tls.server_name == NAME and opts.headers
    ref = greedy(server, pki, "ensemble_baseline")
    with relay_for_repository(server.repository, grpc_url, host="127.0.0.1", port=0, client_options=opts) as r:
        body = json.dumps({"model": "ensemble_baseline", "prompt": PROMPT, "max_tokens": MAX_TOKENS,
                           "temperature": 0}).encode()
        req = urllib.request.Request(r.url + "/completions", data=body, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as resp:
            answer = json.loads(resp.read())
    assert answer["choices"][0]["text"] == ref.text


def test_trtspec_run_validates_through_tls_and_the_header(server, tiny_models):
    """`trtspec run`'s validation stage is a client of the server it started: it connects as the
    launch set TLS and the header (``TritonServer.client_target``), with the recipe's gates."""
    from trtspec.validate.run import run_validation

    raw = tiny_recipe(*tiny_models)
    raw["validation"] = {"max_tokens": 16, "num_prompts": 2, "concurrency": [1], "requests_per_level": 2,
                         "max_requests_per_level": 2, "block_requests": 1, "warmup_requests": 0}
    grpc_url, opts = server.client_target()
    result = run_validation(grpc_url, parse_recipe(raw), client_options=opts)
    assert result.equivalence.mismatch_rate == 0.0 and result.bench.levels


def test_cli_infer_takes_the_certificates_name(server, pki):
    """`trtspec infer` (and bench/validate, the same option group) connects by IP to a certificate
    that names only a DNS name with --tls-server-name; without it the hostname check fails (exit 5)."""
    from click.testing import CliRunner

    from trtspec.cli import main

    args = ["infer", url(server), "--model", "ensemble_baseline", "--prompt", PROMPT, "--max-tokens", "8",
            "--tls-ca", str(pki / "ca.pem"), "--tls-cert", str(pki / "client.pem"), "--tls-key",
            str(pki / "client.key"), "--header", f"triton-grpc-protocol-{HEADER_NAME}: {VALUE}"]
    ok = CliRunner().invoke(main, [*args, "--tls-server-name", NAME])
    assert ok.exit_code == 0 and ok.output.strip(), ok.output
    bad = CliRunner().invoke(main, args)
    assert bad.exit_code == 5 and "--tls-server-name" in bad.output, bad.output
