"""Client targets without a model server: URL schemes, TLS/header options, error classes and
exit codes, the OpenAI client against small aiohttp servers written here (an auth gateway, a
server that returns no token ids, a TLS server), and the OpenAI endpoint's request checks."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest
from click.testing import CliRunner

from trtspec.cli import main
from trtspec.client.errors import EXIT_CODES, AuthRejected, TLSMismatch, classify
from trtspec.client.connect import open_client
from trtspec.client.targets import ClientOptions, TLSOptions, parse_headers, parse_target
from trtspec.errors import ConfigError, TrtspecError
from trtspec.openai_api import APIError, StopCutter, parse_request
from trtspec.triton.launch.server import free_port
from tests.serving.certs import self_signed_cert


@pytest.mark.parametrize("url, scheme, address, path, kind", [
    ("127.0.0.1:8001", "grpc", "127.0.0.1:8001", "", "grpc"),
    ("grpc://h:1", "grpc", "h:1", "", "grpc"),
    ("grpcs://h.example:443", "grpcs", "h.example:443", "", "grpc"),
    ("http://127.0.0.1:9000/v1", "http", "127.0.0.1:9000", "/v1", "openai"),
    ("http://127.0.0.1:9000", "http", "127.0.0.1:9000", "/v1", "openai"),
    ("https://api.example/v1/", "https", "api.example:443", "/v1", "openai"),
])
def test_parse_target(url, scheme, address, path, kind):
    t = parse_target(url)
    assert (t.scheme, t.address, t.path, t.kind) == (scheme, address, path, kind)


@pytest.mark.parametrize("url, words", [
    ("ftp://h:1", "unknown scheme 'ftp://'"), ("grpc://h", "needs a port"), ("grpc://h:1/v1", "no path"),
    ("h:0", "out of range"), ("a b:1", "not a server address"),
])
def test_parse_target_rejects(url, words):
    with pytest.raises(ConfigError, match="--url") as e:
        parse_target(url)
    assert words in str(e.value)


def test_client_options_are_checked(tmp_path):
    with pytest.raises(ConfigError, match="--tls-ca"):
        TLSOptions(ca=str(tmp_path / "missing.pem"))
    (tmp_path / "c.pem").write_text("x")
    with pytest.raises(ConfigError, match="--tls-key"):
        TLSOptions(cert=str(tmp_path / "c.pem"))
    opts = ClientOptions(tls=TLSOptions(ca=str(tmp_path / "c.pem")))
    with pytest.raises(ConfigError, match="grpcs://h:1"):
        opts.check(parse_target("grpc://h:1"))  # TLS files for a plaintext URL: say which URL to use
    with pytest.raises(ConfigError, match="--endpoint"):
        ClientOptions(endpoint="chat").check(parse_target("h:1"))
    with pytest.raises(ConfigError, match="--endpoint"):
        ClientOptions(endpoint="embeddings")
    assert parse_headers(["Authorization: Bearer a:b", "x-k:v"]) == (("Authorization", "Bearer a:b"), ("x-k", "v"))
    with pytest.raises(ConfigError, match="--header"):
        parse_headers(["no-colon"])
    assert type(open_client("grpcs://h:1")).__name__ == "AsyncLLMClient"
    assert type(open_client("http://h:1/v1")).__name__ == "AsyncOpenAIClient"


@pytest.mark.parametrize("status, message, cls", [
    ("UNAVAILABLE", "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:1: Ssl handshake "
                    "failed: SSL_ERROR_SSL: error:1000007d:SSL routines:OPENSSL_internal:CERTIFICATE_VERIFY_FAILED",
     TLSMismatch),
    ("UNAVAILABLE", "This protocol is restricted, expecting header 'x-key'", AuthRejected),
    ("UNAUTHENTICATED", "bad token", AuthRejected),
])
def test_classify_tls_and_auth(status, message, cls):
    e = classify(status, message, url="h:1", model=None)
    assert type(e) is cls and e.exit_code == {TLSMismatch: 5, AuthRejected: 6}[cls] and e.fix


def test_exit_codes_are_distinct_and_documented():
    r = CliRunner().invoke(main, ["bench", "--help"])
    for code, what in EXIT_CODES.items():
        assert f"{code}  {what}" in " ".join(r.output.split("\n  ")).replace("\n", " ") or what[:30] in r.output
    assert len(set(EXIT_CODES)) == len(EXIT_CODES) == 8
    assert "Exit codes:" in CliRunner().invoke(main, ["validate", "--help"]).output


# ------------------------------------------------------------------------------------------
# the OpenAI endpoint's request checks and stop strings


def test_stop_cutter_holds_back_a_possible_stop_string():
    c = StopCutter(["\n\n", "END"])
    assert c.feed("abc\n") == "abc"  # "\n" may begin "\n\n": held back
    assert c.feed("x E") == "\nx "
    assert c.feed("N") == ""
    assert c.feed("Dtail") == "" and c.stopped  # "END" found: cut before it, nothing after
    assert c.flush() == ""
    c = StopCutter(["zz"])
    assert c.feed("az") == "a" and c.flush() == "z"


@pytest.mark.parametrize("body, param", [
    ({"prompt": "x"}, "model"), ({"model": "m"}, "prompt"), ({"model": "m", "prompt": "x", "max_tokens": 0}, "max_tokens"),
    ({"model": "m", "prompt": "x", "temperature": 3}, "temperature"), ({"model": "m", "prompt": "x", "n": 0}, "n"),
    ({"model": "m", "prompt": "x", "stop": [""]}, "stop"), ({"model": "m", "prompt": "x", "logprobs": 9}, "logprobs"),
    ({"model": "m", "prompt": "x", "presence_penalty": 2.5}, "presence_penalty"),
    ({"model": "m", "prompt": "x", "stream_options": {"include_usage": True}}, "stream_options"),
    ({"model": "m", "prompt": "x", "echo": True}, "echo"),
])
def test_parse_request_names_the_bad_field(body, param):
    with pytest.raises(APIError) as e:
        parse_request(body, chat=False, chat_default_max_tokens=64)
    assert e.value.status == 400 and e.value.param == param and param in e.value.message


def test_parse_request_defaults_are_openais():
    r, _ = parse_request({"model": "ensemble", "prompt": "x"}, chat=False, chat_default_max_tokens=64)
    assert (r.max_tokens, r.temperature, r.top_p, r.n, r.stop) == (16, 1.0, 1.0, 1, [])
    r, msgs = parse_request({"model": "ensemble", "messages": [{"role": "user", "content": "hi"}],
                             "max_completion_tokens": 5, "stop": "\n", "logprobs": True, "stream": True,
                             "stream_options": {"include_usage": True}}, chat=True, chat_default_max_tokens=64)
    assert (r.max_tokens, r.stop, r.logprobs, r.include_usage) == (5, ["\n"], 0, True) and msgs[0]["content"] == "hi"


# ------------------------------------------------------------------------------------------
# the OpenAI client against small servers written here


class Served:
    """An aiohttp application on its own loop thread, at ``self.url``."""

    def __init__(self, app, ssl_context=None):
        self.app, self.ssl, self.port = app, ssl_context, free_port()
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()

    def __enter__(self):
        from aiohttp import web

        async def start():
            self.runner = web.AppRunner(self.app)
            await self.runner.setup()
            await web.TCPSite(self.runner, "127.0.0.1", self.port, ssl_context=self.ssl).start()

        def run():
            self.loop.run_until_complete(start())
            self.ready.set()
            self.loop.run_forever()
            self.loop.run_until_complete(self.runner.cleanup())

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        assert self.ready.wait(10)
        return self

    def __exit__(self, *exc):
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"


def text_only_server(token: str | None = None):
    """An OpenAI-compatible server that streams text without token ids; with ``token``, behind a
    gateway that answers 401 without ``Authorization: Bearer TOKEN``."""
    from aiohttp import web

    @web.middleware
    async def gateway(request, handler):
        if token is not None and request.headers.get("Authorization") != f"Bearer {token}":
            return web.json_response({"error": {"message": "invalid API key"}}, status=401)
        return await handler(request)

    async def models(request):
        return web.json_response({"object": "list", "data": [{"id": "ensemble"}, {"id": "ensemble_baseline"}]})

    async def completions(request):
        body = await request.json()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for piece in ("def", " f", "(x):"):
            await resp.write(f"data: {json.dumps({'choices': [{'index': 0, 'text': piece}]})}\n\n".encode())
        if body.get("stream_options", {}).get("include_usage"):
            await resp.write(f"data: {json.dumps({'choices': [], 'usage': {'prompt_tokens': 3, 'completion_tokens': 5}})}\n\n".encode())
        await resp.write(b"data: [DONE]\n\n")
        return resp

    app = web.Application(middlewares=[gateway])
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/completions", completions)
    return app


def _bench(url, tmp_path, *extra):
    return CliRunner().invoke(main, ["bench", "--url", url, "--concurrency", "1", "--requests", "2", "--warmup", "0",
                                     "--output-len", "8", "--ready-timeout", "2", "-o", str(tmp_path / "b"), *extra])


def test_auth_gateway_401_is_exit_6_and_the_header_gets_through(tmp_path):
    with Served(text_only_server(token="s3cret")) as s:
        r = _bench(f"http://{s.address}/v1", tmp_path)
        assert r.exit_code == 6, r.output
        assert "HTTP 401" in r.output and "invalid API key" in r.output and "--header" in r.output
        assert "Traceback" not in r.output
        r = _bench(f"http://{s.address}/v1", tmp_path, "--header", "Authorization: Bearer s3cret")
        assert r.exit_code == 0, r.output
        d = json.loads((tmp_path / "b" / "report.json").read_text())
        spec = d["levels"][0]["models"]["speculative"]
        assert spec["requests"] == 2 and spec["errors"] == 0
        # no ids and no tokenizer: the usage total counts the output (5 tokens, 3 chunks)
        assert {sum(r["chunk_tokens"]) for r in d["records"]} == {5}


def test_no_token_ids_compares_text_or_fails_with_exit_7(tmp_path):
    from trtspec.client import LLMClient, Sampling

    with Served(text_only_server()) as s:
        with LLMClient(f"http://{s.address}/v1") as c:
            r = c.generate("x", Sampling(max_tokens=8))
            assert r.text == "def f(x):" and r.token_ids is None and r.token_ids_source == "usage"
        with LLMClient(f"http://{s.address}/v1", options=ClientOptions(require_token_ids=True)) as c:
            with pytest.raises(TrtspecError) as e:
                c.generate("x", Sampling(max_tokens=8))
            assert e.value.exit_code == 7 and "no token ids" in str(e.value)


def test_unreachable_and_wrong_scheme(tmp_path):
    r = _bench(f"http://127.0.0.1:{free_port()}/v1", tmp_path)
    assert r.exit_code == 4 and "no OpenAI-compatible server is reachable" in r.output
    r = _bench("ftp://127.0.0.1:1", tmp_path)
    assert r.exit_code == 2 and "unknown scheme 'ftp://'" in r.output
    assert len([ln for ln in r.output.splitlines() if ln.startswith("error:")]) == 1


@pytest.fixture(scope="module")
def self_signed(tmp_path_factory):
    """(cert.pem, key.pem) for 127.0.0.1/localhost, made here with `cryptography`."""
    return self_signed_cert(tmp_path_factory.mktemp("tls"))


def test_https_target_tls_mismatch_is_exit_5(self_signed, tmp_path):
    import ssl

    cert, key = self_signed
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert, key)
    with Served(text_only_server(), ssl_context=ctx) as s:
        r = _bench(f"http://{s.address}/v1", tmp_path)  # plaintext against TLS
        assert r.exit_code == 5, r.output
        assert f"https://{s.address}/v1" in r.output
        r = _bench(f"https://{s.address}/v1", tmp_path)  # TLS, but the CA is unknown
        assert r.exit_code == 5 and "--tls-ca" in r.output, r.output
        r = _bench(f"https://{s.address}/v1", tmp_path, "--tls-ca", str(cert))
        assert r.exit_code == 0, r.output
