"""An OpenAI-compatible HTTP endpoint in front of a served repository (``trtspec serve --openai-port``).

``GET /v1/models``, ``POST /v1/completions``, ``POST /v1/chat/completions``, streamed as
server-sent events or not. Every request is relayed to the repository's entry points (``ensemble``,
``ensemble_baseline``) over Triton gRPC with trtspec's client, so the router, its fallback and
the server's metrics stay in the path: the endpoint holds no model.

OpenAI field → what the ensemble gets (NVIDIA's tensorrtllm_backend input names):

=====================================  ======================================================
``max_tokens`` (``max_completion_tokens``)  ``max_tokens``; default 16 (completions, as OpenAI),
                                       the repository's default (chat)
``temperature``, ``top_p``, ``seed``   ``temperature``, ``top_p``, ``seed``/``random_seed``
                                       (OpenAI's defaults: temperature 1, top_p 1)
``top_k`` (extension)                  ``top_k``
``presence_penalty``,                  ``presence_penalty``, ``frequency_penalty`` when not 0;
``frequency_penalty``                  a model that does not declare them answers 400
``stop``                               ``stop_words`` when the model declares it; the endpoint
                                       also cuts the text at the first stop string and cancels
                                       the request there (OpenAI leaves the stop string out)
``logprobs`` / ``top_logprobs``        ``return_log_probs`` → ``output_log_probs``: the
                                       sampled token's log-probability (alternatives: not
                                       available, top_logprobs lists the sampled token only)
``n``                                  n requests at once (seeds ``seed``, ``seed + 1``, ...)
``stream``, ``stream_options``         gRPC streaming; ``include_usage`` adds the usage chunk
``return_token_ids`` (extension)       ``choices[].token_ids``: the ensemble's ``output_ids``
=====================================  ======================================================

Each choice's last event (or the choice, unstreamed) carries ``trtspec``: the path that served it
(``served_by``), the acceptance counters and the engine's ``perf`` (extension fields; OpenAI
clients ignore them, trtspec's client reads them).

Chat: the messages are rendered with the tokenizer's chat template (``tokenizer_config.json``),
or with ``chat_template`` given to the endpoint (a Jinja file, or ``plain``: ``role: content``
lines then ``assistant:``). A tokenizer without a template and no ``chat_template`` answers 400
naming both.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import pathlib
import re
import ssl
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from trtspec.client.client import AsyncLLMClient
from trtspec.client.errors import ModelNotFound, RequestRejected, RequestTimeout, ServerBusy, ServerRequestError, ServerUnavailable
from trtspec.client.types import Sampling
from trtspec.errors import ConfigError, ServerError
from trtspec.triton.access import RequiredHeader, TlsSettings, is_loopback
from trtspec.triton.render import read_repository_manifest

if TYPE_CHECKING:  # numpy comes with it: imported where used (the core install has no numpy)
    from trtspec.triton.backend.requests import RequestLimits

log = logging.getLogger("trtspec.openai")

PLAIN_CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)
COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
BODY_READ_TIMEOUT_S = 30.0  # a client that sends its body slower holds a slot of max_concurrent_requests no longer


class APIError(Exception):
    """An OpenAI error response: ``{"error": {"message", "type", "param", "code"}}``."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    def body(self) -> dict:
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}


# file-system paths in a message from the server or a library: never shown to a client
_PATH = re.compile(r"(?<![\w/.:])(?:~|\.{1,2})?(?:/[\w.+@~-]+){2,}/?")
GENERIC_SERVER_ERROR = "the server could not complete this request; its log has the details"


_UPSTREAM = re.compile(r" at grpcs?://\S+?:\d+(?=:)")  # "model 'x' at grpc://host:port: ..." (trtspec's client)


def scrub(message: str) -> str:
    """``message`` with file-system paths replaced by ``<path>`` (tokenizer, template and model
    folders of the server must not reach a client) and without the internal gRPC address."""
    return _PATH.sub("<path>", _UPSTREAM.sub("", message))


def _from_client_error(e: ServerRequestError) -> APIError:
    detail = str(e).splitlines()[0]
    msg = scrub(detail)
    if isinstance(e, ModelNotFound):
        return APIError(404, msg, param="model", code="model_not_found")
    if isinstance(e, RequestRejected):
        return APIError(400, msg)
    log.warning("OpenAI request failed upstream: %s", detail)
    if isinstance(e, (ServerBusy, ServerUnavailable)):
        return APIError(503, msg)
    if isinstance(e, RequestTimeout):
        return APIError(504, msg)
    return APIError(500, GENERIC_SERVER_ERROR)


# ---------------------------------------------------------------------------------------------
# request validation


def _number(body: dict, name: str, default, lo: float, hi: float, *, integer: bool = False):
    v = body.get(name)
    if v is None:
        return default
    ok = isinstance(v, int) if integer else isinstance(v, (int, float))
    if isinstance(v, bool) or not ok or not lo <= v <= hi:
        kind = "an integer" if integer else "a number"
        where = f">= {lo:g}" if hi >= 1 << 60 else f"in [{lo:g}, {hi:g}]"
        shown = repr(v) if len(repr(v)) <= 40 else repr(v)[:37] + "..."
        raise APIError(400, f"'{name}' must be {kind} {where} (got {shown})", param=name)
    return v


@dataclass
class Request:
    """One OpenAI request, checked."""

    chat: bool
    model: str
    prompts: list[str]
    max_tokens: int
    temperature: float
    top_p: float
    top_k: int | None
    seed: int | None
    stop: list[str]
    n: int
    presence_penalty: float
    frequency_penalty: float
    logprobs: int | None  # None = not asked; else how many alternatives (we give the sampled token)
    stream: bool
    include_usage: bool
    return_token_ids: bool
    extra: dict = field(default_factory=dict)


def _over(param: str, value, limit: int, name: str, what: str, fix: str) -> APIError:
    """A 400 naming the field, its value, the deployment's limit (``limits.<name>``) and the fix."""
    return APIError(400, f"'{param}' is {value}, over this deployment's limit of {limit} {what} (limits.{name}); "
                         f"fix: {fix}", param=param, code="limit_exceeded")


def default_limits() -> "RequestLimits":
    from trtspec.triton.backend.requests import RequestLimits  # lazy: numpy (the core install has none)

    return RequestLimits()


def parse_request(body: Any, *, chat: bool, chat_default_max_tokens: int,
                  limits: "RequestLimits | None" = None) -> tuple[Request, Any]:
    """(checked request, the chat messages or None). Raises :class:`APIError` (400) naming the field;
    a request over one of the deployment's ``limits`` is refused here, before anything is started."""
    lim = limits or default_limits()
    if not isinstance(body, dict):
        raise APIError(400, "the request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise APIError(400, "'model' is required: ensemble (speculative) or ensemble_baseline", param="model")
    messages = None
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
            raise APIError(400, "'messages' must be a non-empty list of {role, content} objects", param="messages")
        size = sum(len(_content(m).encode("utf-8", "surrogatepass")) for m in messages)
        if size > lim.max_prompt_bytes:
            raise _over("messages", f"{size} bytes of content", lim.max_prompt_bytes, "max_prompt_bytes", "bytes",
                        "send a shorter conversation")
        prompts: list = []
    else:
        p = body.get("prompt")
        if isinstance(p, str):
            prompts = [p]
        elif isinstance(p, list) and p and all(isinstance(x, str) for x in p):
            prompts = list(p)
        elif isinstance(p, list) and p and all(isinstance(x, int) and not isinstance(x, bool) for x in p):
            if len(p) > lim.max_input_len:
                raise _over("prompt", f"{len(p)} token ids", lim.max_input_len, "max_input_len", "tokens",
                            "send a shorter prompt")
            prompts = [p]  # token ids: decoded by the tokenizer
        else:
            raise APIError(400, "'prompt' must be a string, a list of strings or a list of token ids", param="prompt")
        if len(prompts) > lim.max_prompts:
            raise _over("prompt", f"a list of {len(prompts)} prompts", lim.max_prompts, "max_prompts",
                        "prompts per request", f"send at most {lim.max_prompts} prompts per request")
        for x in prompts:
            size = len(x.encode("utf-8", "surrogatepass")) if isinstance(x, str) else 0
            if size > lim.max_prompt_bytes:
                raise _over("prompt", f"{size} bytes", lim.max_prompt_bytes, "max_prompt_bytes", "bytes per prompt",
                            "send a shorter prompt")
    if body.get("echo"):
        raise APIError(400, "'echo' is not supported: the ensembles return the continuation only", param="echo")
    n = _number(body, "n", 1, 1, 1 << 62, integer=True)
    if n > lim.max_return_sequences:
        raise _over("n", n, lim.max_return_sequences, "max_return_sequences", "choices per prompt",
                    f"ask for n <= {lim.max_return_sequences} (or send several requests)")
    best_of = body.get("best_of")
    if best_of not in (None, 1) and best_of != n:
        raise APIError(400, "'best_of' other than n is not supported", param="best_of")
    fan_out = max(lim.max_prompts, lim.max_return_sequences)
    if len(prompts) * n > fan_out:
        raise _over("n", f"{n} with {len(prompts)} prompts ({len(prompts) * n} sequences)", fan_out,
                    "max_prompts and limits.max_return_sequences: at most the larger", "sequences per request",
                    "send fewer prompts or a smaller n per request")
    mt_name = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    default_mt = chat_default_max_tokens if chat else COMPLETIONS_DEFAULT_MAX_TOKENS
    max_tokens = _number(body, mt_name, min(default_mt, lim.max_seq_len - 1), 1, 1 << 62, integer=True)
    if max_tokens >= lim.max_seq_len:
        raise _over(mt_name, max_tokens, lim.max_seq_len - 1, f"max_seq_len = {lim.max_seq_len}, prompt and output",
                    "tokens",
                    f"ask for {mt_name} < {lim.max_seq_len}")
    stop = body.get("stop")
    if stop is None:
        stop = []
    elif isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
        raise APIError(400, "'stop' must be a non-empty string or a list of them", param="stop")
    if len(stop) > lim.max_words:
        raise _over("stop", f"a list of {len(stop)} strings", lim.max_words, "max_words", "stop strings",
                    f"send at most {lim.max_words} stop strings")
    for s in stop:
        size = len(s.encode("utf-8", "surrogatepass"))
        if size > lim.max_word_bytes:
            raise _over("stop", f"a string of {size} bytes", lim.max_word_bytes, "max_word_bytes",
                        "bytes per stop string", "send shorter stop strings")
    logprobs = None
    if chat:
        if body.get("logprobs"):
            logprobs = _number(body, "top_logprobs", 0, 0, 1 << 62, integer=True)
            if logprobs > lim.max_logprobs:
                raise _over("top_logprobs", logprobs, lim.max_logprobs, "max_logprobs", "log-probabilities per token",
                            f"ask for top_logprobs <= {lim.max_logprobs}")
    elif body.get("logprobs") is not None:
        logprobs = _number(body, "logprobs", 0, 0, 1 << 62, integer=True)
        if logprobs > lim.max_logprobs:
            raise _over("logprobs", logprobs, lim.max_logprobs, "max_logprobs", "log-probabilities per token",
                        f"ask for logprobs <= {lim.max_logprobs}")
    so = body.get("stream_options") or {}
    if not isinstance(so, dict):
        raise APIError(400, "'stream_options' must be an object", param="stream_options")
    stream = bool(body.get("stream", False))
    if so and not stream:
        raise APIError(400, "'stream_options' is only allowed with stream: true", param="stream_options")
    req = Request(
        chat=chat, model=model, prompts=prompts, max_tokens=max_tokens,
        temperature=_number(body, "temperature", 1.0, 0, 2),
        top_p=_number(body, "top_p", 1.0, 0, 1),
        top_k=_number(body, "top_k", None, 0, 1 << 20, integer=True),
        seed=_number(body, "seed", None, 0, (1 << 63) - 1, integer=True),
        stop=stop, n=n,
        presence_penalty=_number(body, "presence_penalty", 0.0, -2, 2),
        frequency_penalty=_number(body, "frequency_penalty", 0.0, -2, 2),
        logprobs=logprobs, stream=stream, include_usage=bool(so.get("include_usage", False)),
        return_token_ids=bool(body.get("return_token_ids", False)),
    )
    if req.top_p == 0:
        raise APIError(400, "'top_p' must be > 0", param="top_p")
    return req, messages


# ---------------------------------------------------------------------------------------------
# text handling


def _content(m: dict) -> str:
    c = m.get("content")
    if c is None:
        return ""
    if isinstance(c, str):
        return c
    if isinstance(c, list):  # [{"type": "text", "text": ...}, ...]
        parts = []
        for part in c:
            if not isinstance(part, dict) or part.get("type") != "text":
                raise APIError(400, "only text message parts are supported", param="messages")
            parts.append(str(part.get("text", "")))
        return "".join(parts)
    raise APIError(400, "message content must be a string or a list of text parts", param="messages")


class StopCutter:
    """Cuts streamed text at the first stop string. Text that could be the start of a stop string
    is held back until the next chunk tells (OpenAI never sends any part of the stop string).

    Linear in the text: one Knuth-Morris-Pratt automaton per stop string is fed each new
    character once (the held text is never searched again), and the text held back is the longest
    partial match, at most ``max(len(stop)) - 1`` characters."""

    def __init__(self, stops: list[str]):
        self.stops = [s for s in stops if s]
        self.held = ""
        self.stopped = False
        self._fail = [self._prefix_function(s) for s in self.stops]
        self._state = [0] * len(self.stops)  # per stop: the length of its prefix the text ends with

    @staticmethod
    def _prefix_function(s: str) -> list[int]:
        pi = [0] * len(s)
        k = 0
        for i in range(1, len(s)):
            while k and s[i] != s[k]:
                k = pi[k - 1]
            if s[i] == s[k]:
                k += 1
            pi[i] = k
        return pi

    def feed(self, text: str) -> str:
        if self.stopped:
            return ""
        buf = self.held + text
        base = len(self.held)  # text starts at buf[base]
        cut = -1
        for j, (s, pi) in enumerate(zip(self.stops, self._fail)):
            q, n = self._state[j], len(s)
            for i, c in enumerate(text):
                while q and s[q] != c:
                    q = pi[q - 1]
                if s[q] == c:
                    q += 1
                if q == n:  # a whole stop string ends at buf[base + i]
                    start = base + i + 1 - n
                    cut = start if cut < 0 else min(cut, start)
                    break
            self._state[j] = q
        if cut >= 0:
            self.stopped, self.held = True, ""
            return buf[:cut]
        keep = max(self._state, default=0)
        self.held = buf[len(buf) - keep:] if keep else ""
        return buf[: len(buf) - keep]

    def flush(self) -> str:
        out, self.held = self.held, ""
        return "" if self.stopped else out


# ---------------------------------------------------------------------------------------------
# the relay


@dataclass
class _Choice:
    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    finish_reason: str | None = None
    completion_tokens: int = 0
    prompt_tokens: int = 0
    server: dict = field(default_factory=dict)  # the "trtspec" extension: path, acceptance, perf


class OpenAIRelay:
    """The endpoint: an aiohttp application relaying to Triton gRPC at ``grpc_url``.

    ``start()`` serves it on its own event-loop thread (``trtspec serve``); ``app()`` gives the
    application for an existing loop. ``models``: the names listed and accepted (the repository's
    entry points).

    The same controls as Triton's own ports (docs/security.md): ``required_header`` gates every
    route but ``/health`` (401 without it, 403 with a wrong value); ``tls`` serves HTTPS with the
    deployment's certificate, and mutual TLS when it names a CA; ``limits`` (the recipe's
    ``limits:``) bound each request before anything is started (400 naming the field; 413 for a
    body over ``max_body_bytes``, refused unread) and the requests in flight (429 beyond
    ``max_concurrent_requests``). A client that goes away cancels its gRPC requests."""

    HEALTH_PATHS = frozenset({"/health"})

    def __init__(self, grpc_url: str, *, models: list[str], tokenizer_dir: str | None, host: str = "127.0.0.1",
                 port: int = 0, chat_template: str | None = None, chat_default_max_tokens: int = 128,
                 client_options=None, limits: "RequestLimits | None" = None,
                 required_header: RequiredHeader | None = None, tls: TlsSettings | None = None):
        self.grpc_url, self.models, self.tokenizer_dir = grpc_url, list(models), tokenizer_dir
        self.host, self.port = host, port
        self.chat_default_max_tokens = chat_default_max_tokens
        self.client_options = client_options
        self.limits = limits or default_limits()
        self.required_header = required_header
        self.tls = tls
        if tls is not None:
            tls.check()
        self.chat_template = self._load_template(chat_template)
        self.created = int(time.time())
        self._client: AsyncLLMClient | None = None
        self._tok = None  # tokenizers.Tokenizer-backed, for token strings and counts
        self._hf_tok = None  # transformers tokenizer, for chat templates (loaded at first chat request)
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner = None
        self._error: BaseException | None = None
        self._in_flight = 0

    @staticmethod
    def _load_template(spec: str | None) -> str | None:
        if spec is None:
            return None
        if spec == "plain":
            return PLAIN_CHAT_TEMPLATE
        p = pathlib.Path(spec)
        if not p.is_file():
            raise ConfigError("--chat-template", spec, "file not found",
                              fix="pass a Jinja chat template file, or 'plain' for 'role: content' lines")
        return p.read_text()

    @property
    def url(self) -> str:
        return f"{'https' if self.tls is not None else 'http'}://{self.host}:{self.port}/v1"

    # ---- lifecycle

    def ssl_context(self) -> ssl.SSLContext | None:
        """HTTPS with the deployment's certificate; mutual TLS (a client certificate the CA signed)
        when the settings name a CA."""
        if self.tls is None:
            return None
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.load_cert_chain(self.tls.cert, self.tls.key)
        if self.tls.ca:
            ctx.verify_mode = ssl.CERT_REQUIRED
            ctx.load_verify_locations(cafile=self.tls.ca)
        return ctx

    def app(self):
        from aiohttp import web

        # a body over the limit is refused when its Content-Length says so (unread), or (chunked)
        # when the reading passes the limit
        app = web.Application(client_max_size=self.limits.max_body_bytes, middlewares=[self._guard])
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/v1/models/{model}", self._model)
        app.router.add_get("/health", self._health)
        app.router.add_get("/openapi.json", self._openapi)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/v1/chat/completions", self._chat_completions)
        app.on_cleanup.append(self._close_client)
        return app

    def _authorized(self, request) -> APIError | None:
        """None when the request may pass the required header's gate, else the refusal."""
        rh = self.required_header
        if rh is None:
            return None
        got = request.headers.get(rh.name)
        if got is None:
            return APIError(401, f"this endpoint requires the {rh.name} header", code="missing_header")
        if not hmac.compare_digest(got.encode("utf-8", "surrogateescape"), rh.value.encode()):
            return APIError(403, f"the {rh.name} header does not match", code="wrong_header")
        return None

    @property
    def _guard(self):
        from aiohttp import web

        @web.middleware
        async def guard(request, handler):
            if request.path in self.HEALTH_PATHS:
                return await handler(request)
            refused = self._authorized(request)
            if refused is not None:
                return self._error_response(refused)
            size = request.content_length
            if size is not None and size > self.limits.max_body_bytes:
                return self._too_large(size)
            if self._in_flight >= self.limits.max_concurrent_requests:
                cap = self.limits.max_concurrent_requests
                resp = self._error_response(APIError(
                    429, f"this endpoint has {cap} requests in flight, its limit (limits.max_concurrent_requests); "
                         "retry after a second", code="too_many_requests"))
                resp.headers["Retry-After"] = "1"
                return resp
            self._in_flight += 1
            try:
                return await handler(request)
            except web.HTTPException as e:  # aiohttp's own (404, 405, 413): OpenAI's error shape
                if e.status < 400:
                    raise
                if e.status == 413:
                    return self._too_large(None)
                return self._error_response(APIError(e.status, e.reason or "error"))
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - logged here; the client gets no server detail
                log.exception("OpenAI request %s %s failed", request.method, request.path)
                return self._error_response(APIError(500, GENERIC_SERVER_ERROR))
            finally:
                self._in_flight -= 1

        return guard

    def _too_large(self, size: int | None):
        shown = f"{size} bytes" if size is not None else "larger"
        resp = self._error_response(APIError(
            413, f"the request body is {shown}, over this deployment's limit of {self.limits.max_body_bytes} bytes "
                 "(limits.max_body_bytes); fix: send fewer or shorter prompts", code="body_too_large"))
        resp.force_close()  # the rest of the body is not read: the connection cannot be reused
        return resp

    async def _close_client(self, app) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None

    def client(self) -> AsyncLLMClient:
        if self._client is None:
            # the prompt's token count comes from the engine's perf outputs: no tokenizer before the first token
            self._client = AsyncLLMClient(self.grpc_url, tokenizer=self.tokenizer_dir, options=self.client_options,
                                          count_prompt_tokens=False)
            self._tok = self._client.tokenizer
        return self._client

    async def serve(self) -> None:
        """Bind and serve on the running loop (returns once bound)."""
        from aiohttp import web

        self.client()
        # handler_cancellation: a client that disconnects cancels its handler, and so its gRPC requests
        self._runner = web.AppRunner(self.app(), access_log=None, handler_cancellation=True)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port, reuse_address=True, ssl_context=self.ssl_context())
        await site.start()
        if not self.port:
            self.port = self._runner.addresses[0][1]

    async def shutdown(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def start(self, timeout_s: float = 30.0) -> "OpenAIRelay":
        """Serve on a private event-loop thread; returns once the port is bound."""
        ready = threading.Event()

        def run():
            self._loop = asyncio.new_event_loop()
            try:
                self._loop.run_until_complete(self.serve())
            except BaseException as e:  # noqa: BLE001 - reported by start()
                self._error = e
                ready.set()
                return
            ready.set()
            self._loop.run_forever()
            self._loop.run_until_complete(self.shutdown())
            self._loop.close()

        self._thread = threading.Thread(target=run, name="trtspec-openai", daemon=True)
        self._thread.start()
        if not ready.wait(timeout_s) or self._error is not None:
            e = self._error
            raise ServerError(f"the OpenAI endpoint could not bind {self.host}:{self.port}: {e}",
                              fix="pick a free port with --openai-port") from e
        return self

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)

    def __enter__(self) -> "OpenAIRelay":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # ---- the OpenAPI document

    def openapi(self) -> dict:
        """An OpenAPI 3 document of this endpoint, with this deployment's bounds (``GET /openapi.json``)."""
        lim = self.limits
        nullable_str = {"type": "string", "nullable": True}
        error = {"type": "object", "required": ["error"], "properties": {"error": {
            "type": "object", "required": ["message", "type"],
            "properties": {"message": {"type": "string"}, "type": {"type": "string"},
                           "param": nullable_str, "code": nullable_str}}}}

        def err(description: str) -> dict:
            return {"description": description,
                    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}

        gated = {}
        if self.required_header is not None:
            gated = {"401": err(f"the {self.required_header.name} header is missing"),
                     "403": err(f"the {self.required_header.name} header does not match")}
        common = {**gated, "429": {**err("too many requests in flight (limits.max_concurrent_requests)"),
                                   "headers": {"Retry-After": {"schema": {"type": "integer"},
                                                               "description": "seconds"}}}}
        generation = {**common,
                      "400": err("a field is malformed or over one of the deployment's limits (named in the message)"),
                      "404": err("no such model"),
                      "408": err("the body did not arrive in time"),
                      "413": err("the body is over limits.max_body_bytes"),
                      "503": err("the server is busy or a model is unavailable"),
                      "504": err("the server did not answer in time")}
        security = [{"requiredHeader": []}] if self.required_header is not None else []
        prompt_chars = min(lim.max_prompt_bytes, lim.max_body_bytes)
        sampling = {
            "max_tokens": {"type": "integer", "minimum": 1, "maximum": lim.max_seq_len - 1, "nullable": True},
            "temperature": {"type": "number", "minimum": 0, "maximum": 2, "nullable": True},
            "top_p": {"type": "number", "minimum": 0, "exclusiveMinimum": True, "maximum": 1, "nullable": True},
            "top_k": {"type": "integer", "minimum": 0, "maximum": 1 << 20, "nullable": True},
            "seed": {"type": "integer", "minimum": 0, "maximum": (1 << 63) - 1, "nullable": True},
            "n": {"type": "integer", "minimum": 1, "maximum": lim.max_return_sequences, "nullable": True},
            "stop": {"nullable": True, "oneOf": [
                {"type": "string", "minLength": 1, "maxLength": lim.max_word_bytes},
                {"type": "array", "maxItems": lim.max_words,
                 "items": {"type": "string", "minLength": 1, "maxLength": lim.max_word_bytes}}]},
            "presence_penalty": {"type": "number", "minimum": -2, "maximum": 2, "nullable": True},
            "frequency_penalty": {"type": "number", "minimum": -2, "maximum": 2, "nullable": True},
            "stream": {"type": "boolean", "nullable": True},
            "stream_options": {"type": "object", "nullable": True,
                               "properties": {"include_usage": {"type": "boolean"}}},
            "return_token_ids": {"type": "boolean", "description": "trtspec extension: choices[].token_ids"},
        }
        model = {"type": "string", "enum": list(self.models)}
        completions_req = {"type": "object", "required": ["model", "prompt"], "properties": {
            "model": model,
            "prompt": {"oneOf": [
                {"type": "string", "maxLength": prompt_chars},
                {"type": "array", "minItems": 1, "maxItems": lim.max_prompts,
                 "items": {"type": "string", "maxLength": prompt_chars}},
                {"type": "array", "minItems": 1, "maxItems": lim.max_input_len,
                 "items": {"type": "integer", "minimum": 0}}]},
            **sampling,
            "logprobs": {"type": "integer", "minimum": 0, "maximum": lim.max_logprobs, "nullable": True},
            "echo": {"type": "boolean", "enum": [False], "nullable": True},
            "best_of": {"type": "integer", "minimum": 1, "maximum": 1, "nullable": True}}}
        message = {"type": "object", "required": ["role", "content"], "properties": {
            "role": {"type": "string"},
            "content": {"nullable": True, "oneOf": [
                {"type": "string"},
                {"type": "array", "items": {"type": "object", "required": ["type", "text"], "properties": {
                    "type": {"type": "string", "enum": ["text"]}, "text": {"type": "string"}}}}]}}}
        chat_req = {"type": "object", "required": ["model", "messages"], "properties": {
            "model": model, "messages": {"type": "array", "minItems": 1, "items": message},
            **sampling,
            "max_completion_tokens": {"type": "integer", "minimum": 1, "maximum": lim.max_seq_len - 1,
                                      "nullable": True},
            "logprobs": {"type": "boolean", "nullable": True},
            "top_logprobs": {"type": "integer", "minimum": 0, "maximum": lim.max_logprobs, "nullable": True}}}
        usage = {"type": "object", "required": ["prompt_tokens", "completion_tokens", "total_tokens"],
                 "properties": {k: {"type": "integer", "minimum": 0}
                                for k in ("prompt_tokens", "completion_tokens", "total_tokens")}}
        finish = {"type": "string", "enum": ["stop", "length"], "nullable": True}
        logprobs_obj = {"type": "object", "nullable": True}

        def completion(obj: str, choice: dict) -> dict:
            return {"type": "object", "required": ["id", "object", "created", "model", "choices", "usage"],
                    "properties": {"id": {"type": "string"}, "object": {"type": "string", "enum": [obj]},
                                   "created": {"type": "integer"}, "model": {"type": "string"},
                                   "choices": {"type": "array", "items": choice}, "usage": usage}}

        text_choice = {"type": "object", "required": ["index", "text", "finish_reason"], "properties": {
            "index": {"type": "integer", "minimum": 0}, "text": {"type": "string"}, "finish_reason": finish,
            "logprobs": logprobs_obj, "token_ids": {"type": "array", "items": {"type": "integer"}}}}
        chat_choice = {"type": "object", "required": ["index", "message", "finish_reason"], "properties": {
            "index": {"type": "integer", "minimum": 0}, "finish_reason": finish, "logprobs": logprobs_obj,
            "message": {"type": "object", "required": ["role", "content"], "properties": {
                "role": {"type": "string", "enum": ["assistant"]}, "content": {"type": "string"}}},
            "token_ids": {"type": "array", "items": {"type": "integer"}}}}

        # one server-sent event: data is a chunk, an error object or [DONE] (JSON text)
        event = {"type": "object", "required": ["data"], "properties": {"data": {"type": "string"}}}

        def generate_op(summary: str, req_ref: str, resp_ref: str) -> dict:
            return {"summary": summary, "security": security,
                    "requestBody": {"required": True, "content": {"application/json": {"schema": {"$ref": req_ref}}}},
                    "responses": {"200": {"description": "the completion (JSON), or events with stream: true",
                                          "content": {"application/json": {"schema": {"$ref": resp_ref}},
                                                      "text/event-stream": {"schema": event}}},
                                  **generation}}

        card = {"type": "object", "required": ["id", "object", "created", "owned_by"], "properties": {
            "id": {"type": "string"}, "object": {"type": "string", "enum": ["model"]},
            "created": {"type": "integer"}, "owned_by": {"type": "string"}}}
        doc = {
            "openapi": "3.0.3",
            "info": {"title": "trtspec OpenAI-compatible endpoint", "version": "1",
                     "description": "Relays to the deployment's ensembles over Triton gRPC (docs/serving.md). "
                                    f"Limits: the recipe's limits: (max {lim.max_concurrent_requests} requests in "
                                    f"flight, bodies up to {lim.max_body_bytes} bytes)."},
            "paths": {
                "/health": {"get": {"summary": "liveness (no header needed)", "security": [], "responses": {
                    "200": {"description": "up", "content": {"application/json": {"schema": {
                        "type": "object", "required": ["status"], "properties": {"status": {"type": "string"}}}}}}}}},
                "/v1/models": {"get": {"summary": "the deployment's entry points", "security": security, "responses": {
                    "200": {"description": "the models", "content": {"application/json": {"schema": {
                        "type": "object", "required": ["object", "data"], "properties": {
                            "object": {"type": "string", "enum": ["list"]},
                            "data": {"type": "array", "items": {"$ref": "#/components/schemas/Model"}}}}}}},
                    **common}}},
                "/v1/models/{model}": {"get": {
                    "summary": "one model", "security": security,
                    "parameters": [{"name": "model", "in": "path", "required": True, "schema": {"type": "string"}}],
                    "responses": {"200": {"description": "the model", "content": {"application/json": {
                        "schema": {"$ref": "#/components/schemas/Model"}}}},
                        "404": err("no such model"), **common}}},
                "/v1/completions": {"post": generate_op("text completion", "#/components/schemas/CompletionRequest",
                                                        "#/components/schemas/Completion")},
                "/v1/chat/completions": {"post": generate_op("chat completion", "#/components/schemas/ChatRequest",
                                                             "#/components/schemas/ChatCompletion")},
            },
            "components": {"schemas": {
                "Error": error, "Model": card, "CompletionRequest": completions_req, "ChatRequest": chat_req,
                "Completion": completion("text_completion", text_choice),
                "ChatCompletion": completion("chat.completion", chat_choice)}},
        }
        if self.required_header is not None:
            doc["components"]["securitySchemes"] = {"requiredHeader": {
                "type": "apiKey", "in": "header", "name": self.required_header.name}}
        return doc

    async def _openapi(self, request):
        from aiohttp import web

        return web.json_response(self.openapi())

    # ---- handlers

    async def _health(self, request):
        from aiohttp import web

        return web.json_response({"status": "ok"})

    def _model_card(self, m: str) -> dict:
        return {"id": m, "object": "model", "created": self.created, "owned_by": "trtspec"}

    async def _models(self, request):
        from aiohttp import web

        return web.json_response({"object": "list", "data": [self._model_card(m) for m in self.models]})

    async def _model(self, request):
        from aiohttp import web

        m = request.match_info["model"]
        if m not in self.models:
            return self._error_response(self._unknown_model(m))
        return web.json_response(self._model_card(m))

    def _unknown_model(self, m: str) -> APIError:
        return APIError(404, f"The model '{m}' does not exist; this endpoint serves {', '.join(self.models)}",
                        param="model", code="model_not_found")

    @staticmethod
    def _error_response(e: APIError):
        from aiohttp import web

        return web.json_response(e.body(), status=e.status)

    async def _render_chat(self, messages: list[dict]) -> str:
        msgs = [{"role": str(m.get("role", "user")), "content": _content(m)} for m in messages]
        if self._hf_tok is None:
            if not self.tokenizer_dir:
                raise APIError(400, "chat needs a tokenizer: this repository names none", param="messages")
            from transformers import AutoTokenizer

            self._hf_tok = await asyncio.get_running_loop().run_in_executor(
                None, AutoTokenizer.from_pretrained, self.tokenizer_dir)
        template = self.chat_template or getattr(self._hf_tok, "chat_template", None)
        if not template:
            log.warning("chat request refused: the tokenizer at %s has no chat template", self.tokenizer_dir)
            raise APIError(400, "this deployment's tokenizer has no chat template, so /v1/chat/completions "
                                "cannot render messages; use /v1/completions, or serve with --chat-template FILE "
                                "(or --chat-template plain)", param="messages", code="no_chat_template")
        try:
            return self._hf_tok.apply_chat_template(msgs, chat_template=template, tokenize=False,
                                                    add_generation_prompt=True)
        except Exception as e:  # noqa: BLE001 - template errors (raise_exception in the template, jinja)
            log.info("the chat template rejected a request: %s", e)
            raise APIError(400, f"the chat template rejected the messages: {scrub(str(e))[:300]}",
                           param="messages") from None

    def _inputs(self, req: Request, info) -> dict:
        """NVIDIA input names for what the request asks beyond Sampling; 400 for what the model lacks."""
        extra: dict[str, Any] = {}
        wanted = [("presence_penalty", req.presence_penalty, req.presence_penalty != 0),
                  ("frequency_penalty", req.frequency_penalty, req.frequency_penalty != 0),
                  ("return_log_probs", True, req.logprobs is not None)]
        for name, value, asked in wanted:
            if not asked:
                continue
            if name not in info.inputs:
                param = "logprobs" if name == "return_log_probs" else name
                raise APIError(400, f"'{param}' needs the input '{name}', which model '{info.name}' does not "
                                    "declare in this repository", param=param)
            extra[name] = value
        if req.stop and "stop_words" in info.inputs:
            extra["stop_words"] = req.stop
        return extra

    def _sampling(self, req: Request, i: int) -> Sampling:
        greedy = req.temperature == 0
        seed = None if req.seed is None else req.seed + i
        try:
            return Sampling(max_tokens=req.max_tokens, temperature=req.temperature,
                            top_p=None if greedy or req.top_p >= 1 else req.top_p,
                            top_k=None if greedy else req.top_k, seed=None if greedy else seed)
        except ConfigError as e:
            raise APIError(400, scrub(str(e).splitlines()[0]), param=e.field if hasattr(e, "field") else None) from None

    async def _completions(self, request):
        return await self._generate(request, chat=False)

    async def _chat_completions(self, request):
        return await self._generate(request, chat=True)

    async def _generate(self, request, *, chat: bool):
        from aiohttp import web

        try:
            try:  # at most limits.max_body_bytes (client_max_size): else 413; a body that never ends: 408
                async with asyncio.timeout(BODY_READ_TIMEOUT_S):
                    raw = await request.read()
            except web.HTTPRequestEntityTooLarge:
                return self._too_large(None)
            except TimeoutError:
                resp = self._error_response(APIError(408, f"the request body did not arrive within "
                                                          f"{BODY_READ_TIMEOUT_S:g} s", code="body_timeout"))
                resp.force_close()
                return resp
            try:
                body = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError, ValueError, RecursionError):
                raise APIError(400, "the request body is not valid JSON") from None
            req, messages = parse_request(body, chat=chat, chat_default_max_tokens=self.chat_default_max_tokens,
                                          limits=self.limits)
            if req.model not in self.models:
                raise self._unknown_model(req.model)
            client = self.client()
            info = await client.model_info(req.model)
            extra = self._inputs(req, info)
            if chat:
                req.prompts = [await self._render_chat(messages)]
            elif req.prompts and isinstance(req.prompts[0], list):
                if self._tok is None:
                    raise APIError(400, "token-id prompts need the repository's tokenizer", param="prompt")
                req.prompts = [self._decode_prompt(req.prompts[0])]
        except APIError as e:
            return self._error_response(e)
        except ServerRequestError as e:
            return self._error_response(_from_client_error(e))
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"
        jobs = [(p_i * req.n + k, prompt, k) for p_i, prompt in enumerate(req.prompts) for k in range(req.n)]
        if req.stream:
            return await self._stream(request, req, rid, jobs, extra)
        tasks = [asyncio.create_task(self._run_choice(req, idx, prompt, k, extra, None)) for idx, prompt, k in jobs]
        try:  # the first error cancels the other choices; so does the client going away (handler cancelled)
            await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            failed = next((t for t in tasks if t.done() and not t.cancelled() and t.exception() is not None), None)
            if failed is not None:
                raise failed.exception()
            choices = [t.result() for t in tasks]
        except APIError as e:
            return self._error_response(e)
        except ServerRequestError as e:
            return self._error_response(_from_client_error(e))
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        return web.json_response(self._final_body(req, rid, choices))

    def _decode_prompt(self, ids: list[int]) -> str:
        vocab = None
        with contextlib.suppress(Exception):
            inner = getattr(self._tok, "_tok", None)
            vocab = inner.get_vocab_size() if inner is not None else len(self._tok)
        bad = [i for i in ids if i < 0 or (vocab is not None and i >= vocab)]
        if bad:
            raise APIError(400, f"token id {bad[0]} is outside this model's vocabulary [0, {vocab})", param="prompt")
        try:
            return self._tok.decode(ids, skip_special_tokens=False)
        except Exception:  # noqa: BLE001 - the tokenizer's own refusal
            raise APIError(400, "the token ids could not be decoded", param="prompt") from None

    async def _run_choice(self, req: Request, index: int, prompt: str, k: int, extra: dict, events) -> _Choice:
        """One sequence: relay, cut at stop strings, and (streaming) put (choice, text, ids, lps) events."""
        choice = _Choice(index=index)
        cutter = StopCutter(req.stop) if req.stop else None
        client = self.client()

        def emit(text: str, ids: list[int], lps: list[float]) -> None:
            choice.text += text
            if events is not None and (text or ids):
                events.put_nowait((choice, text, ids, lps))

        def on_chunk(ch) -> bool:
            text = ch.text if cutter is None else cutter.feed(ch.text)
            ids = list(ch.token_ids or [])
            lps = list(ch.log_probs or [])
            if cutter is not None and cutter.stopped:
                ids, lps = self._ids_within(choice.token_ids, ids, lps, choice.text + text)
            choice.token_ids += ids
            choice.log_probs += lps
            emit(text, ids, lps)
            return not (cutter is not None and cutter.stopped)  # False cancels the gRPC request

        # streamed from the ensemble even for a non-streamed answer: a stop string cancels it early
        info = await client.model_info(req.model)
        try:
            res = await client.generate(prompt, self._sampling(req, k), model=req.model,
                                        stream="stream" in info.inputs, on_chunk=on_chunk, extra_inputs=extra)
        except ConfigError as e:
            raise APIError(400, scrub(str(e).splitlines()[0])) from None
        if cutter is not None and not cutter.stopped:
            emit(cutter.flush(), [], [])
        choice.prompt_tokens = res.prompt_tokens or 0
        choice.server = {"served_by": res.served_by, "acceptance_rate": res.acceptance_rate,
                         "total_accepted_draft_tokens": res.accepted_draft_tokens,
                         "total_draft_tokens": res.draft_tokens, "perf": res.perf}
        choice.completion_tokens = len(choice.token_ids) if choice.token_ids else (
            len(self._tok(choice.text)["input_ids"]) if self._tok is not None else 0)
        stopped = (cutter is not None and cutter.stopped) or choice.completion_tokens < req.max_tokens
        choice.finish_reason = "stop" if stopped else "length"
        if events is not None:
            events.put_nowait((choice, None, None, None))  # this choice is finished
        return choice

    def _ids_within(self, before: list[int], ids: list[int], lps: list[float], kept_text: str):
        """The ids of a chunk cut at a stop string: those whose text lies within what is kept."""
        if self._tok is None:
            return ids, lps
        n = 0
        for k in range(1, len(ids) + 1):
            if len(self._tok.decode(before + ids[:k])) <= len(kept_text):
                n = k
            else:
                break
        return ids[:n], lps[:n]

    # ---- response bodies

    def _token_str(self, i: int) -> str:
        return self._tok.decode([i], skip_special_tokens=False) if self._tok is not None else f"token_id:{i}"

    def _logprobs(self, req: Request, ids: list[int], lps: list[float], offset: int = 0):
        if req.logprobs is None:
            return None
        toks = [self._token_str(i) for i in ids]
        if req.chat:
            return {"content": [{"token": t, "logprob": lp, "bytes": list(t.encode()),
                                 "top_logprobs": ([{"token": t, "logprob": lp, "bytes": list(t.encode())}]
                                                  if req.logprobs else [])}
                                for t, lp in zip(toks, lps)]}
        offsets, o = [], offset
        for t in toks:
            offsets.append(o)
            o += len(t)
        return {"tokens": toks, "token_logprobs": lps, "text_offset": offsets,
                "top_logprobs": [{t: lp} for t, lp in zip(toks, lps)] if req.logprobs else None}

    @staticmethod
    def _usage(choices: list[_Choice], n: int) -> dict:
        prompt = sum(c.prompt_tokens for c in choices[::n]) if n else 0
        completion = sum(c.completion_tokens for c in choices)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    def _final_body(self, req: Request, rid: str, choices: list[_Choice]) -> dict:
        out = []
        for c in sorted(choices, key=lambda c: c.index):
            d: dict[str, Any] = {"index": c.index, "finish_reason": c.finish_reason,
                                 "logprobs": self._logprobs(req, c.token_ids, c.log_probs)}
            if req.chat:
                d["message"] = {"role": "assistant", "content": c.text}
            else:
                d["text"] = c.text
            if req.return_token_ids:
                d["token_ids"] = c.token_ids
            d["trtspec"] = c.server
            out.append(d)
        return {"id": rid, "object": "chat.completion" if req.chat else "text_completion", "created": int(time.time()),
                "model": req.model, "choices": out, "usage": self._usage(choices, req.n)}

    async def _stream(self, request, req: Request, rid: str, jobs, extra: dict):
        from aiohttp import web

        # the gRPC requests go out first: the response's headers are written while the engine prefills
        events: asyncio.Queue = asyncio.Queue()
        tasks = [asyncio.create_task(self._run_choice(req, idx, prompt, k, extra, events)) for idx, prompt, k in jobs]

        def failed(t: asyncio.Task) -> None:  # a choice that raised puts no end event: say so on the queue
            if not t.cancelled() and t.exception() is not None:
                events.put_nowait((None, t.exception(), None, None))

        for t in tasks:
            t.add_done_callback(failed)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        created = int(time.time())
        obj = "chat.completion.chunk" if req.chat else "text_completion"

        async def send(d: dict | str) -> None:
            data = d if isinstance(d, str) else json.dumps(d)
            await resp.write(f"data: {data}\n\n".encode())

        def chunk(choices: list[dict]) -> dict:
            d = {"id": rid, "object": obj, "created": created, "model": req.model, "choices": choices}
            if req.include_usage:
                d["usage"] = None
            return d

        offsets = {idx: 0 for idx, _, _ in jobs}
        try:
            await resp.prepare(request)
            if req.chat:
                await send(chunk([{"index": idx, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                   "finish_reason": None} for idx, _, _ in jobs]))
            left = len(tasks)
            while left:
                choice, text, ids, lps = await events.get()
                if choice is None:  # a choice failed: text is its exception
                    raise text
                if text is None:  # finished
                    left -= 1
                    end = {"index": choice.index, "finish_reason": choice.finish_reason, "logprobs": None,
                           "trtspec": choice.server}
                    end.update({"delta": {}} if req.chat else {"text": ""})
                    await send(chunk([end]))
                    continue
                d: dict[str, Any] = {"index": choice.index, "finish_reason": None,
                                     "logprobs": self._logprobs(req, ids, lps, offsets[choice.index])}
                offsets[choice.index] += len(text)
                d.update({"delta": {"content": text}} if req.chat else {"text": text})
                if req.return_token_ids:
                    d["token_ids"] = ids
                await send(chunk([d]))
            choices = [t.result() for t in tasks]
            if req.include_usage:
                await send({"id": rid, "object": obj, "created": created, "model": req.model, "choices": [],
                            "usage": self._usage(choices, req.n)})
            await send("[DONE]")
        except (ConnectionResetError, asyncio.CancelledError):
            raise  # the client went away: the finally cancels the gRPC requests
        except APIError as e:
            await send(e.body())
            await send("[DONE]")
        except ServerRequestError as e:
            await send(_from_client_error(e).body())
            await send("[DONE]")
        except Exception:  # noqa: BLE001 - the headers are out: an error event, the detail in the log
            log.exception("streamed OpenAI request failed")
            await send(APIError(500, GENERIC_SERVER_ERROR).body())
            await send("[DONE]")
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        try:
            await resp.write_eof()
        except ConnectionResetError:  # the client closed after [DONE]: nothing is lost
            pass
        return resp


def limits_of_repository(repo: str) -> "RequestLimits":
    """The request limits of a repository's recipe (``limits:`` in its ``trtspec.json``); a key the
    recipe lacks takes the default."""
    from trtspec.triton.backend.requests import RequestLimits  # lazy: numpy (the core install has none)

    m = read_repository_manifest(repo) or {}
    return RequestLimits.from_recipe(dict((m.get("recipe") or {}).get("limits") or {}))


def relay_for_repository(repo: str, grpc_url: str, *, host: str, port: int, chat_template: str | None = None,
                         client_options=None, required_header: RequiredHeader | None = None,
                         tls: TlsSettings | None = None) -> OpenAIRelay:
    """An :class:`OpenAIRelay` for a repository trtspec rendered: its entry points, its tokenizer,
    its default max_tokens for chat, its recipe's limits. ``required_header`` and ``tls``: the
    deployment's (``trtspec serve`` passes the server's), so this port is under the same controls."""

    m = read_repository_manifest(repo) or {}
    entries = m.get("entry_points") or {"speculative": "ensemble", "baseline": "ensemble_baseline"}
    models = [v for v in (entries.get("speculative"), entries.get("baseline")) if v]
    default = ((m.get("defaults") or {}).get("max_tokens")) or 128
    return OpenAIRelay(grpc_url, models=models, tokenizer_dir=m.get("tokenizer_dir"), host=host, port=port,
                       chat_template=chat_template, chat_default_max_tokens=int(default),
                       client_options=client_options, limits=limits_of_repository(repo),
                       required_header=required_header, tls=tls)


def exposure_warning(host: str, port: int, *, tls: TlsSettings | None,
                     required_header: RequiredHeader | None) -> str | None:
    """None on loopback; else what anyone who reaches ``host`` can use on the OpenAI port (as
    :func:`trtspec.triton.access.exposure_warning` says for Triton's ports)."""
    if is_loopback(host):
        return None
    who = (f"callers that send the {required_header.name} header" if required_header is not None
           else "anyone who reaches this address, unauthenticated,")
    how = ("over HTTPS" + (" with a client certificate the CA signed (mutual TLS)" if tls.ca else "")
           if tls is not None else "in plaintext: there is no TLS")
    return (f"binding {host}: the OpenAI port (:{port}: /v1/models, /v1/completions, /v1/chat/completions) "
            f"takes generation requests from {who} {how}; /health is open to anyone"
            + ("" if required_header is not None else "; there is no client authentication")
            + ": put the server behind a gateway or a mesh (docs/security.md)")


__all__ = ["APIError", "OpenAIRelay", "StopCutter", "exposure_warning", "limits_of_repository", "parse_request",
           "relay_for_repository", "scrub"]
