"""Attacks on the OpenAI-compatible port (``trtspec serve --openai-port``): it is under the same
controls as Triton's own ports (docs/security.md, "The OpenAI port").

One deployment for the module, served as a user serves it: ``trtspec serve REPO --openai-port 0
--host 0.0.0.0`` on the tiny pair, whose recipe sets ``serving.tls`` (mutual: a CA), a required
header and small ``limits:``. Against it, from outside the process, with real clients:

* the required header: missing → 401, wrong → 403, right → 200, on every route but /health;
* HTTPS: plaintext refused, TLS with the CA and a client certificate served, no client
  certificate refused (and, on an in-process relay with TLS but no CA, TLS with the CA served);
* at most ``limits.max_concurrent_requests`` in flight: 429 with Retry-After beyond;
* each per-request limit refused in well under a second, a 400 naming the field, the value, the
  limit and the fix; a body over ``max_body_bytes`` gets 413 before it is sent whole;
* a client that disconnects cancels its gRPC requests (the engine's
  ``trtspec_requests_cancelled_total``), and the first failed choice cancels the others;
* no server path in an error;
* a Schemathesis run against ``/openapi.json``: no 5xx, every response as documented, and the
  server keeps serving. ``TRTSPEC_FUZZ_EXAMPLES=N`` runs up to N examples per operation (default 8).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import ssl
import sys
import time
import urllib.request

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (content_type_conformance, response_headers_conformance,
                                               response_schema_conformance, status_code_conformance)

from trtspec.client.targets import ClientOptions, TLSOptions
from trtspec.config import parse_recipe
from trtspec.openai_api import StopCutter, exposure_warning, relay_for_repository
from trtspec.triton.access import REQUIRED_HEADER_ENV, RequiredHeader, TlsSettings
from trtspec.triton.render import package
from tests.serve_process import serve_process
from tests.serving.certs import openssl_pki

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")

HEADER = "x-gw"
VALUE = "gw-secret-" + "v" * 22
FUZZ_EXAMPLES = int(os.environ.get("TRTSPEC_FUZZ_EXAMPLES", "8"))
LIMITS = {"max_batch_size": 8, "max_input_len": 96, "max_seq_len": 512, "max_prompts": 2,
          "max_return_sequences": 2, "max_words": 3, "max_word_bytes": 16, "max_logprobs": 2,
          "max_body_bytes": 16384, "max_concurrent_requests": 2}
PROMPT = "def fibonacci(n):\n    "
LONG = 400  # tokens: a request that runs for a while (about 0.6 s on the 2-core box, warm)


def recipe(target, draft, pki) -> dict:
    return {
        "name": "tiny-openai-attack",
        "target": {"model": str(target)},
        "speculation": {"method": "draft_target", "draft": {"model": str(draft)}, "max_draft_len": 4},
        "runtime": {"backend": "torch", "dtype": "float32", "device": "cpu", "torch_threads": 1,
                    "adaptive": {"enabled": False, "min_acceptance_rate": 0.0}},
        "limits": LIMITS,
        "serving": {"require_header": HEADER,
                    "tls": {"cert": str(pki / "server.pem"), "key": str(pki / "server.key"),
                            "ca": str(pki / "ca.pem")}},
    }


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return openssl_pki(tmp_path_factory.mktemp("pki-openai"))


@pytest.fixture(scope="module")
def served(tiny_models, pki, tmp_path_factory):
    root = tmp_path_factory.mktemp("openai-attack")
    package(parse_recipe(recipe(*tiny_models, pki)), root / "repo")
    cmd = [sys.executable, "-m", "trtspec.cli", "serve", str(root / "repo"), "--openai-port", "0", "--host", "0.0.0.0",
           "--chat-template", "plain", "--json", "--no-watchdog", "--ready-timeout", "240"]
    env = {**os.environ, REQUIRED_HEADER_ENV: VALUE}
    with serve_process(cmd, root / "serve.log", env=env) as (info, proc):
        port = int(info["openai"].rsplit(":", 1)[1].split("/")[0])
        yield {**info, "port": port, "base": f"https://127.0.0.1:{port}", "repo": root / "repo",
               "log": root / "serve.log", "proc": proc}


def tls_context(pki, *, cert: bool = True) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(pki / "ca.pem"))
    if cert:
        ctx.load_cert_chain(str(pki / "client.pem"), str(pki / "client.key"))
    return ctx


@pytest.fixture(scope="module")
def http(served, pki):
    """An HTTPS client of the OpenAI port with the CA and a client certificate, no header."""
    with httpx.Client(base_url=served["base"], verify=tls_context(pki), timeout=60) as c:
        yield c


OK = {HEADER: VALUE}


def completion(**kw) -> dict:
    return {"model": "ensemble", "prompt": PROMPT, "max_tokens": 4, "temperature": 0, **kw}


def assert_serving(http) -> None:
    r = http.post("/v1/completions", json=completion(), headers=OK)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"]


def cancelled_total(served) -> float:
    port = served["metrics"].rsplit(":", 1)[1].split("/")[0]
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return sum(float(m.group(1)) for m in re.finditer(r"^trtspec_requests_cancelled_total\{[^}]*\} (\S+)$", text, re.M))


def wait_for(predicate, timeout_s: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return predicate()


# ------------------------------------------------------------------------------------------
# the required header


@pytest.mark.parametrize("method, path, body", [
    ("GET", "/v1/models", None), ("GET", "/v1/models/ensemble", None), ("GET", "/openapi.json", None),
    ("POST", "/v1/completions", completion()),
    ("POST", "/v1/chat/completions", {"model": "ensemble", "messages": [{"role": "user", "content": "hi"}],
                                      "max_tokens": 2}),
])
def test_the_header_gates_every_route_but_health(http, method, path, body):
    for headers, status in (({}, 401), ({HEADER: "wrong"}, 403), ({HEADER: VALUE[:-1] + "x"}, 403),
                            ({HEADER: VALUE + "x"}, 403), ({"x-other": VALUE}, 401)):
        r = http.request(method, path, json=body, headers=headers)
        assert r.status_code == status, (headers, r.status_code, r.text)
        err = r.json()["error"]
        assert HEADER in err["message"] and err["type"] == "invalid_request_error" and VALUE not in r.text
    r = http.request(method, path, json=body, headers=OK)
    assert r.status_code == 200, r.text
    assert http.get("/health").status_code == 200  # load balancers probe it without the header


# ------------------------------------------------------------------------------------------
# TLS


def test_https_refuses_plaintext_and_a_client_without_a_certificate(served, pki):
    with pytest.raises(httpx.HTTPError):  # plaintext to the TLS port: the server hangs up
        httpx.get(f"http://127.0.0.1:{served['port']}/v1/models", headers=OK, timeout=10)
    with pytest.raises((httpx.ConnectError, httpx.ReadError, httpx.RemoteProtocolError, ssl.SSLError)):
        r = httpx.get(f"{served['base']}/v1/models", headers=OK, verify=tls_context(pki, cert=False), timeout=10)
        r.raise_for_status()
    with pytest.raises(httpx.ConnectError):  # a client that does not trust the CA refuses the server
        httpx.get(f"{served['base']}/v1/models", headers=OK, verify=ssl.create_default_context(), timeout=10)
    r = httpx.get(f"{served['base']}/v1/models", headers=OK, verify=tls_context(pki), timeout=10)
    assert r.status_code == 200 and {m["id"] for m in r.json()["data"]} == {"ensemble", "ensemble_baseline"}


def test_tls_without_a_ca_serves_any_client_that_trusts_the_certificate(served, pki):
    """The relay with the deployment's certificate and no CA (``--tls-cert/--tls-key`` only): HTTPS
    with the CA is served without a client certificate, plaintext is refused."""
    opts = ClientOptions(tls=TLSOptions(ca=str(pki / "ca.pem"), cert=str(pki / "client.pem"),
                                        key=str(pki / "client.key"), server_name="localhost"),
                         headers=((f"triton-grpc-protocol-{HEADER}", VALUE),))
    grpc_url = "grpcs://127.0.0.1:" + served["grpc"].rsplit(":", 1)[1]
    with relay_for_repository(served["repo"], grpc_url, host="127.0.0.1", port=0, client_options=opts,
                              tls=TlsSettings(str(pki / "server.pem"), str(pki / "server.key"))) as relay:
        assert relay.url.startswith("https://")
        r = httpx.post(relay.url + "/completions", json=completion(), verify=tls_context(pki, cert=False), timeout=60)
        assert r.status_code == 200 and r.json()["choices"][0]["text"], r.text
        with pytest.raises(httpx.HTTPError):
            httpx.post(relay.url.replace("https", "http") + "/completions", json=completion(), timeout=10)


def test_a_non_loopback_bind_names_the_openai_port(served):
    log = served["log"].read_text()
    line = next((x for x in log.splitlines() if "OpenAI port" in x), None)
    assert line is not None and f":{served['port']}" in line and "mutual TLS" in line and HEADER in line, log[-2000:]
    plain = exposure_warning("0.0.0.0", 9000, tls=None, required_header=None)
    assert ":9000" in plain and "no TLS" in plain and "unauthenticated" in plain
    assert exposure_warning("127.0.0.1", 9000, tls=None, required_header=None) is None
    gated = exposure_warning("10.0.0.5", 9000, tls=None, required_header=RequiredHeader(HEADER, VALUE))
    assert HEADER in gated and VALUE not in gated


# ------------------------------------------------------------------------------------------
# the concurrency cap


def open_request(served, pki, body: bytes, *, send: int | None = None) -> ssl.SSLSocket:
    """A TLS connection to the OpenAI port that sent a POST /v1/completions with the header and
    ``send`` bytes of ``body`` (all of it by default)."""
    raw = socket.create_connection(("127.0.0.1", served["port"]), timeout=10)
    s = tls_context(pki).wrap_socket(raw, server_hostname="localhost")
    s.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\n{HEADER}: {VALUE}\r\nContent-Type: "
              f"application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body[:send])
    return s


def test_requests_beyond_the_cap_get_429_with_retry_after(served, http, pki):
    """``max_concurrent_requests`` requests held in flight (their bodies half sent, as a slow
    client holds them); the next one is answered 429 at once; once they go, requests are served."""
    cap = LIMITS["max_concurrent_requests"]
    body = json.dumps(completion()).encode()
    held = [open_request(served, pki, body, send=10) for _ in range(cap)]
    try:
        time.sleep(0.3)
        t0 = time.monotonic()
        r = http.post("/v1/completions", json=completion(), headers=OK)
        took = time.monotonic() - t0
        assert r.status_code == 429, r.text
        assert r.headers["Retry-After"] == "1" and "max_concurrent_requests" in r.json()["error"]["message"]
        assert took < 1.0
        print(f"429 in {took * 1e3:.0f} ms")
    finally:
        for s in held:
            s.close()
    assert wait_for(lambda: http.post("/v1/completions", json=completion(), headers=OK).status_code == 200)


# ------------------------------------------------------------------------------------------
# per-request limits


CHAT = {"model": "ensemble", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
OVER = [  # (case, path, body, field, words in the message)
    ("prompts", "/v1/completions", completion(prompt=["a", "b", "c"]), "prompt", ["max_prompts", "3", "2"]),
    ("n", "/v1/completions", completion(n=3), "n", ["max_return_sequences", "3", "2"]),
    ("fan-out", "/v1/completions", completion(prompt=["a", "b"], n=2), "n", ["4 sequences", "2"]),
    ("stop count", "/v1/completions", completion(stop=["a", "b", "c", "d"]), "stop", ["max_words", "4", "3"]),
    ("stop length", "/v1/completions", completion(stop=["x" * 17]), "stop", ["max_word_bytes", "17", "16"]),
    ("logprobs", "/v1/completions", completion(logprobs=3), "logprobs", ["max_logprobs", "3", "2"]),
    ("top_logprobs", "/v1/chat/completions", {**CHAT, "logprobs": True, "top_logprobs": 3}, "top_logprobs",
     ["max_logprobs", "3", "2"]),
    ("max_tokens", "/v1/completions", completion(max_tokens=10**6), "max_tokens", ["max_seq_len", "1000000", "511"]),
    ("token ids", "/v1/completions", completion(prompt=[1] * 97), "prompt", ["max_input_len", "97", "96"]),
]


@pytest.mark.parametrize("case, path, body, field, words", OVER, ids=[c[0] for c in OVER])
def test_each_limit_is_refused_within_a_second_naming_the_field(http, case, path, body, field, words):
    t0 = time.monotonic()
    r = http.post(path, json=body, headers=OK)
    took = time.monotonic() - t0
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == field and f"'{field}'" in err["message"] and "fix:" in err["message"], err
    assert "limits." in err["message"] and all(w in err["message"] for w in words), err
    assert took < 1.0, took
    print(f"{case}: 400 in {took * 1e3:.0f} ms: {err['message']}")
    assert_serving(http)


def test_a_body_over_the_limit_is_refused_before_it_is_sent(served, pki, http):
    """413 for a body over max_body_bytes: from its Content-Length, before the body is read (the
    client has sent 1 KiB of a declared 100 MB), and for a chunked body once it passes the limit."""
    raw = socket.create_connection(("127.0.0.1", served["port"]), timeout=10)
    s = tls_context(pki).wrap_socket(raw, server_hostname="localhost")
    t0 = time.monotonic()
    s.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\n{HEADER}: {VALUE}\r\n"
              f"Content-Type: application/json\r\nContent-Length: 100000000\r\n\r\n".encode() + b"{" + b" " * 1024)
    head = s.recv(65536).decode(errors="replace")
    took = time.monotonic() - t0
    s.close()
    assert head.startswith("HTTP/1.1 413"), head
    assert "max_body_bytes" in head and "100000000 bytes" in head and took < 1.0, (took, head)
    print(f"413 (Content-Length) in {took * 1e3:.0f} ms")

    def chunks():
        yield b'{"model": "ensemble", "prompt": "'
        for _ in range(40):
            yield b"x" * 1024
        yield b'"}'

    t0 = time.monotonic()
    r = http.post("/v1/completions", content=chunks(), headers={**OK, "Content-Type": "application/json"})
    assert r.status_code == 413 and "max_body_bytes" in r.json()["error"]["message"], r.text
    assert time.monotonic() - t0 < 1.0
    assert_serving(http)


# ------------------------------------------------------------------------------------------
# cancellation


@pytest.mark.parametrize("stream", [False, True], ids=["unstreamed", "streamed"])
def test_a_client_that_disconnects_cancels_its_upstream_requests(served, pki, http, stream):
    """n=2: the client hangs up while the engine generates; both gRPC requests are cancelled (the
    engine counts them) instead of running to max_tokens."""
    before = cancelled_total(served)
    body = completion(max_tokens=LONG, n=2, temperature=1.0, seed=1, stream=stream)
    s = open_request(served, pki, json.dumps(body).encode())
    time.sleep(0.15)  # the choices are generating
    s.close()
    t0 = time.monotonic()
    assert wait_for(lambda: cancelled_total(served) >= before + 2, 10), (before, cancelled_total(served))
    print(f"2 upstream requests cancelled {time.monotonic() - t0:.2f} s after the client hung up")
    assert_serving(http)


def test_the_first_failed_choice_cancels_the_others(served, http):
    """Two prompts: one over max_input_len (the ensemble refuses it at once), one long; the answer
    is the refusal, and the long one is cancelled, not left running."""
    before = cancelled_total(served)
    t0 = time.monotonic()
    r = http.post("/v1/completions", headers=OK, json=completion(prompt=["x " * 200, PROMPT], max_tokens=LONG))
    took = time.monotonic() - t0
    assert r.status_code == 400, r.text
    assert wait_for(lambda: cancelled_total(served) >= before + 1, 20)
    print(f"refused in {took:.2f} s; the other choice cancelled")
    assert_serving(http)


def test_errors_do_not_show_server_paths(served, pki, http):
    """No error names a file of the server (tokenizer, template, model folders) or its internal
    gRPC address: a chat request to a relay without a chat template (the tiny tokenizer has
    none), a prompt the ensemble refuses, token ids outside the vocabulary."""
    grpc_port = served["grpc"].rsplit(":", 1)[1]
    opts = ClientOptions(tls=TLSOptions(ca=str(pki / "ca.pem"), cert=str(pki / "client.pem"),
                                        key=str(pki / "client.key"), server_name="localhost"),
                         headers=((f"triton-grpc-protocol-{HEADER}", VALUE),))
    with relay_for_repository(served["repo"], f"grpcs://127.0.0.1:{grpc_port}", host="127.0.0.1", port=0,
                              client_options=opts) as bare:
        tokenizer_dir = bare.tokenizer_dir
        assert tokenizer_dir
        r = httpx.post(bare.url + "/chat/completions", timeout=60,
                       json={"model": "ensemble", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
        assert r.status_code == 400 and "no chat template" in r.text, r.text
        answers = [r]
        for b in (completion(prompt="x " * 200), completion(prompt=[10**9]), completion(model="/etc/passwd"),
                  {"model": "ensemble", "messages": [{"role": "user", "content": [{"type": "image"}]}]}):
            path = "/v1/chat/completions" if "messages" in b else "/v1/completions"
            answers.append(http.post(path, json=b, headers=OK))
    for r in answers:
        assert 400 <= r.status_code < 500, r.text
        for secret in (tokenizer_dir, str(served["repo"]), "/tmp/", "models/", f":{grpc_port}", "grpc"):
            assert secret not in r.text, (secret, r.text)


class NaiveCutter:
    """The cutter's specification (the old, quadratic one): search the pending text and the new
    chunk for every stop string; hold back the longest tail that begins one."""

    def __init__(self, stops):
        self.stops, self.held = stops, ""

    def feed(self, text):
        buf = self.held + text
        cut = min((i for i in (buf.find(s) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            self.held = None
            return buf[:cut]
        keep = max((k for s in self.stops for k in range(1, len(s)) if buf.endswith(s[:k])), default=0)
        self.held = buf[len(buf) - keep:]
        return buf[:len(buf) - keep]


def test_the_stop_cutter_is_linear_and_cuts_as_its_specification():
    """Streamed text against stop strings: chunk by chunk what the naive search sends (nothing of
    a stop string ever), and linear time (32 stop strings of 256 characters, 2000 chunks that keep
    a long partial match pending: 1.8 s with the old quadratic cutter, ~16 ms now)."""
    import random

    rng = random.Random(0)
    for _ in range(3000):
        stops = ["".join(rng.choice("ab") for _ in range(rng.randint(1, 5))) for _ in range(rng.randint(1, 3))]
        text = "".join(rng.choice("abc") for _ in range(rng.randint(0, 24)))
        cutter, naive, i = StopCutter(stops), NaiveCutter(stops), 0
        while i < len(text) and naive.held is not None:
            chunk = text[i:i + rng.randint(1, 4)]
            assert cutter.feed(chunk) == naive.feed(chunk), (stops, text, i)
            i += len(chunk)
        assert cutter.stopped == (naive.held is None)
        assert cutter.flush() == ("" if naive.held is None else naive.held)
    stops = ["a" * 255 + "b"] + [f"{i:02d}" * 128 for i in range(31)]
    cutter = StopCutter(stops)
    t0 = time.perf_counter()
    sent = "".join(cutter.feed("a") for _ in range(2000))
    took = time.perf_counter() - t0
    assert len(sent) == 2000 - 255 and took < 0.3, took


# ------------------------------------------------------------------------------------------
# Schemathesis against /openapi.json


@pytest.fixture(scope="module")
def api_schema(served, pki):
    return schemathesis.openapi.from_url(f"{served['base']}/openapi.json", headers=OK, verify=str(pki / "ca.pem"),
                                         cert=(str(pki / "client.pem"), str(pki / "client.key")), timeout=30)


def test_the_openapi_document_has_the_real_bounds(http):
    doc = http.get("/openapi.json", headers=OK).json()
    req = doc["components"]["schemas"]["CompletionRequest"]
    assert req["required"] == ["model", "prompt"]
    assert req["properties"]["n"]["maximum"] == LIMITS["max_return_sequences"]
    assert req["properties"]["logprobs"]["maximum"] == LIMITS["max_logprobs"]
    assert req["properties"]["stop"]["oneOf"][1]["maxItems"] == LIMITS["max_words"]
    assert req["properties"]["prompt"]["oneOf"][1]["maxItems"] == LIMITS["max_prompts"]
    post = doc["paths"]["/v1/completions"]["post"]
    assert {"400", "401", "403", "404", "413", "429", "503"} <= set(post["responses"])
    assert doc["components"]["securitySchemes"]["requiredHeader"]["name"] == HEADER


OPERATIONS = [("GET", "/health"), ("GET", "/v1/models"), ("GET", "/v1/models/{model}"),
              ("POST", "/v1/completions"), ("POST", "/v1/chat/completions")]
FUZZ_CALLS: list[tuple[str, int]] = []
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance,
          response_headers_conformance]


@pytest.mark.parametrize("method, path", OPERATIONS, ids=[f"{m} {p}" for m, p in OPERATIONS])
def test_schemathesis_finds_no_server_error_and_no_undocumented_response(api_schema, served, pki, method, path):
    """Schemathesis's cases for each operation of /openapi.json, valid and (where the operation
    takes input) invalid: no 5xx, and every status, content type, header and body as documented."""
    op = api_schema[path][method]
    strategy = op.as_strategy(GenerationMode.POSITIVE)
    if path != "/health" and path != "/v1/models":
        strategy = st.one_of(strategy, op.as_strategy(GenerationMode.NEGATIVE))

    @given(case=strategy)
    @settings(max_examples=FUZZ_EXAMPLES, deadline=None, derandomize="TRTSPEC_FUZZ_EXAMPLES" not in os.environ,
              database=None,
              phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
    def run(case):
        response = case.call(base_url=served["base"], headers=OK, verify=str(pki / "ca.pem"),
                             cert=(str(pki / "client.pem"), str(pki / "client.key")), timeout=120)
        FUZZ_CALLS.append((op.label, response.status_code))
        case.validate_response(response, checks=CHECKS)

    run()


def test_the_server_keeps_serving_after_the_fuzzing(served, http):
    counts: dict[int, int] = {}
    for _, status in FUZZ_CALLS:
        counts[status] = counts.get(status, 0) + 1
    print(f"schemathesis: {len(FUZZ_CALLS)} calls, statuses {dict(sorted(counts.items()))}")
    assert served["proc"].poll() is None
    assert_serving(http)
    assert http.get("/health").json() == {"status": "ok"}
