"""A client for OpenAI-compatible servers with the interface of the gRPC client, so ``bench`` and
``validate`` measure trtllm-serve, vLLM, Triton's OpenAI frontend or ``trtspec serve --openai-port``
the same way they measure Triton over gRPC.

``POST {base}/completions`` or ``{base}/chat/completions`` (``ClientOptions.endpoint``), streamed
as server-sent events with ``stream_options.include_usage``. Token ids: the request asks for them
with ``return_token_ids`` (vLLM's extension, which trtspec's endpoint also speaks); a server that
rejects that field is asked again without it. Without ids, output tokens are counted with the
tokenizer when one is given, else from the final ``usage`` (``token_ids_source`` says which), and
equivalence compares text.
"""

from __future__ import annotations

import asyncio
import json
import os
import ssl
import time
from typing import Any, AsyncIterator, Mapping, Sequence

from trtspec.client.base import SPECULATIVE_MODEL, ModelInfo, OnChunk, load_tokenizer, stream_chunks
from trtspec.client.errors import (
    AuthRejected,
    InferenceFailed,
    ModelNotFound,
    NoTokenIds,
    RequestRejected,
    RequestTimeout,
    ServerBusy,
    ServerRequestError,
    ServerUnavailable,
    TLSMismatch,
)
from trtspec.client.targets import ClientOptions, Target, parse_target, speaks_tls
from trtspec.client.types import Chunk, GenerationResult, Sampling
from trtspec.errors import ConfigError

_ids = iter(range(1, 1 << 62))


class _HTTPError(Exception):
    def __init__(self, status: int, body: str):
        super().__init__(f"HTTP {status}: {body[:300]}")
        self.status, self.body = status, body


def _message(body: str) -> str:
    """The ``error.message`` of an OpenAI error body, else the body's first line."""
    try:
        d = json.loads(body)
        e = d.get("error", d) if isinstance(d, dict) else d
        if isinstance(e, dict):
            return str(e.get("message") or e.get("detail") or e)
        return str(e)
    except (json.JSONDecodeError, TypeError):
        return (body.strip().splitlines() or [""])[0][:300]


def ssl_context(target: Target, options: ClientOptions) -> ssl.SSLContext | None:
    if not target.tls:
        return None
    ctx = ssl.create_default_context(cafile=options.tls.ca)
    if options.tls.cert:
        ctx.load_cert_chain(options.tls.cert, options.tls.key)
    return ctx


class AsyncOpenAIClient:
    """``async with AsyncOpenAIClient("http://127.0.0.1:9000/v1") as c: r = await c.generate(...)``:
    the :class:`~trtspec.client.client.AsyncLLMClient` API over an OpenAI-compatible server."""

    def __init__(self, url: str, *, tokenizer=None, retries: int = 3, backoff_s: float = 0.25,
                 timeout_s: float | None = 600.0, options: ClientOptions | None = None):
        self.target = parse_target(url)
        if self.target.kind != "openai":
            raise ConfigError("--url", url, "not an OpenAI-compatible URL", fix="use http(s)://HOST:PORT/v1")
        self.options = options or ClientOptions()
        self.options.check(self.target)
        self.url = self.target.url
        self.base = f"{'https' if self.target.tls else 'http'}://{self.target.address}{self.target.path}"
        self.tokenizer = load_tokenizer(tokenizer)
        self.retries, self.backoff_s, self.timeout_s = retries, backoff_s, timeout_s
        self._session = None
        self._models: list[str] | None = None
        self._info: dict[str, ModelInfo] = {}
        self._ask_ids = True  # send return_token_ids until the server says it does not know it

    async def __aenter__(self) -> "AsyncOpenAIClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    def _http(self):
        if self._session is None:  # bound to the running loop, as the gRPC client
            import aiohttp

            ctx = ssl_context(self.target, self.options)
            self._session = aiohttp.ClientSession(
                headers=self.options.header_dict,
                connector=aiohttp.TCPConnector(limit=0, ssl=ctx if ctx is not None else True),
                timeout=aiohttp.ClientTimeout(total=None))
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    # ---- errors

    async def _error(self, e: BaseException, model: str | None) -> ServerRequestError:
        import aiohttp

        kw = dict(url=self.url, model=model)
        if isinstance(e, ServerRequestError):
            return e
        if isinstance(e, _HTTPError):
            msg = _message(e.body)
            if e.status in (401, 403):
                return AuthRejected(f"HTTP {e.status}: the server refused the credentials: {msg}", **kw,
                                    status=str(e.status), server_message=e.body,
                                    fix="pass what it expects, e.g. --header 'Authorization: Bearer TOKEN'")
            if e.status == 404:
                if model and ("model" in msg.lower()):
                    return ModelNotFound(f"the server has no such model: {msg}", **kw, status="404",
                                         server_message=e.body, fix=self._models_fix())
                return RequestRejected(f"no OpenAI endpoint here (HTTP 404): {msg}", **kw, status="404",
                                       server_message=e.body,
                                       fix="the URL is the API root, e.g. http://HOST:PORT/v1")
            if e.status in (429, 503):
                return ServerBusy(f"the server is busy (HTTP {e.status}): {msg}", **kw, status=str(e.status),
                                  server_message=e.body, fix="lower the concurrency or the request rate")
            if 400 <= e.status < 500:
                return RequestRejected(f"the server rejected the request (HTTP {e.status}): {msg}", **kw,
                                       status=str(e.status), server_message=e.body,
                                       fix="fix the request as the server's message says")
            return InferenceFailed(f"the server failed the request (HTTP {e.status}): {msg}", **kw,
                                   status=str(e.status), server_message=e.body, fix="see the server's log")
        if isinstance(e, (aiohttp.ClientConnectorCertificateError, aiohttp.ClientSSLError, ssl.SSLError)):
            return TLSMismatch(f"TLS handshake failed: {e}", **kw,
                               fix="https:// for a TLS server, http:// otherwise; --tls-ca for a private CA; "
                                   "--tls-cert/--tls-key if it asks for a client certificate")
        if isinstance(e, aiohttp.ClientConnectorError):
            return ServerUnavailable(f"no OpenAI-compatible server is reachable: {e}", **kw,
                                     fix="start one (trtspec serve REPO --openai-port PORT) or pass the right "
                                         "--url http://HOST:PORT/v1")
        if isinstance(e, (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError, aiohttp.ClientPayloadError)):
            if not self.target.tls and await speaks_tls(self.target.host, self.target.port):
                return TLSMismatch("the server dropped a plaintext connection and speaks TLS", **kw,
                                   fix=f"use --url https://{self.target.address}{self.target.path}")
            return ServerUnavailable(f"the connection to the server was lost: {e}", **kw,
                                     fix="check the server: it crashed or is shutting down")
        if isinstance(e, (asyncio.TimeoutError, TimeoutError)):
            return RequestTimeout("no answer in time", **kw, fix="raise the timeout or lower max_tokens")
        return InferenceFailed(f"{type(e).__name__}: {e}", **kw, fix="see the server's log")

    def _models_fix(self) -> str:
        return f"models served here: {', '.join(self._models) if self._models else 'see GET /v1/models'}"

    # ---- server and model state

    async def _list_models(self) -> list[str]:
        async with self._http().get(f"{self.base}/models") as r:
            body = await r.text()
            if r.status != 200:
                raise _HTTPError(r.status, body)
        try:
            return [m["id"] for m in json.loads(body).get("data", [])]
        except (json.JSONDecodeError, AttributeError, KeyError, TypeError):
            raise RequestRejected(f"GET {self.base}/models did not answer an OpenAI model list", url=self.url,
                                  fix="the URL is the API root, e.g. http://HOST:PORT/v1") from None

    async def wait_ready(self, models: Sequence[str] = (), timeout_s: float = 30.0) -> None:
        """Wait until ``GET /models`` answers; a model it does not list fails at once."""
        deadline = time.monotonic() + timeout_s
        delay = 0.1
        while True:
            try:
                self._models = await self._list_models()
                break
            except Exception as e:  # noqa: BLE001 - mapped below
                err = await self._error(e, None)
                if not isinstance(err, ServerUnavailable) or time.monotonic() + delay > deadline:
                    raise err from None
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)
        for m in models:
            if self._models and m not in self._models:
                raise ModelNotFound(f"the server lists no model '{m}'", url=self.url, model=m, status="404",
                                    fix=self._models_fix())

    async def model_info(self, model: str) -> ModelInfo:
        if model not in self._info:
            if self._models is None:
                await self.wait_ready((), timeout_s=0)
            if self._models and model not in self._models:
                raise ModelNotFound(f"the server lists no model '{model}'", url=self.url, model=model,
                                    status="404", fix=self._models_fix())
            self._info[model] = ModelInfo(name=model, kind="openai", inputs={}, outputs=frozenset(),
                                          max_batch_size=0, decoupled=True)
        return self._info[model]

    # ---- generation

    def _body(self, model: str, prompt: str, sampling: Sampling, stream: bool,
              extra: Mapping[str, Any] | None) -> dict:
        body: dict[str, Any] = {"model": model, "max_tokens": sampling.max_tokens,
                                "temperature": sampling.temperature, "stream": stream}
        if self.options.endpoint == "chat":
            body["messages"] = [{"role": "user", "content": prompt}]
        else:
            body["prompt"] = prompt
        if sampling.temperature > 0:
            for k in ("top_p", "top_k", "seed"):  # top_k: vLLM's and trtspec's extension
                if getattr(sampling, k) is not None:
                    body[k] = getattr(sampling, k)
        for k in ("presence_penalty", "frequency_penalty"):
            if getattr(sampling, k) != 0.0:
                body[k] = getattr(sampling, k)
        unsent = [f for f in ("repetition_penalty", "logprobs", "ignore_eos", "bad_words", "stop_words")
                  if getattr(sampling, f) != Sampling.__dataclass_fields__[f].default]
        if unsent:
            raise ConfigError(unsent[0], getattr(sampling, unsent[0]), "is not sent by the OpenAI-compatible client",
                              fix="pass it as the server names it in extra_inputs")
        if stream:
            body["stream_options"] = {"include_usage": True}
        if self._ask_ids:
            body["return_token_ids"] = True
        body.update(extra or {})  # OpenAI fields passed through as given (stop, n, penalties, ...)
        return body

    async def generate(self, prompt: str | Sequence[int], sampling: Sampling | None = None, *,
                       model: str = SPECULATIVE_MODEL, stream: bool = True, request_id: str | None = None,
                       timeout_s: float | None = None, on_chunk: OnChunk | None = None,
                       extra_inputs: Mapping[str, Any] | None = None) -> GenerationResult:
        """As :meth:`AsyncLLMClient.generate`; ``extra_inputs`` are extra JSON fields of the request."""
        sampling = sampling or Sampling()
        await self.model_info(model)
        if not isinstance(prompt, str):
            if self.tokenizer is None:
                raise ConfigError("prompt", prompt, "OpenAI-compatible servers take text here",
                                  fix="pass a string, or a tokenizer to decode ids")
            prompt = self.tokenizer.decode(list(prompt))
        rid = request_id or f"trtspec-openai-{next(_ids)}-{os.getpid()}"
        timeout = self.timeout_s if timeout_s is None else timeout_s
        deadline = None if timeout is None else time.monotonic() + timeout
        attempt = 0
        while True:
            state = _State(self.tokenizer, stream)
            try:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                async with asyncio.timeout(left):
                    res = await self._once(model, prompt, sampling, stream, rid, state, on_chunk, extra_inputs)
                break
            except TimeoutError:
                err = RequestTimeout(f"no final response within {timeout:g}s", url=self.url, model=model,
                                     fix="raise the timeout or lower max_tokens")
                err.partial = state.partial(model, rid)
                raise err from None
            except _HTTPError as e:
                if e.status == 400 and self._ask_ids and "return_token_ids" in e.body:
                    self._ask_ids = False  # a strict server: ask again without the extension
                    continue
                raise await self._error(e, model) from None
            except ServerRequestError:
                raise
            except Exception as e:  # noqa: BLE001 - aiohttp errors
                err = await self._error(e, model)
                if state.chunks or not isinstance(err, ServerUnavailable) or attempt == self.retries:
                    err.partial = state.partial(model, rid)
                    raise err from None
                attempt += 1
                await asyncio.sleep(self.backoff_s * 2 ** (attempt - 1))
        res.attempts = attempt + 1
        if self.options.require_token_ids and res.token_ids_source != "server":
            raise NoTokenIds("the server returned no token ids (neither choices[].token_ids nor "
                             "'token_id:N' logprobs)", url=self.url, model=model,
                             fix="use a server that returns them (vLLM, trtspec serve --openai-port), or drop "
                                 "--require-token-ids to compare text")
        return res

    async def stream(self, prompt: str | Sequence[int], sampling: Sampling | None = None, *,
                     model: str = SPECULATIVE_MODEL, request_id: str | None = None, timeout_s: float | None = None,
                     extra_inputs: Mapping[str, Any] | None = None) -> AsyncIterator[Chunk]:
        """``async for chunk in client.stream(...)``, as :meth:`AsyncLLMClient.stream`."""
        async for chunk in stream_chunks(self, prompt, sampling, model=model, request_id=request_id,
                                         timeout_s=timeout_s, extra_inputs=extra_inputs):
            yield chunk

    async def _once(self, model, prompt, sampling, stream, rid, state: "_State", on_chunk, extra) -> GenerationResult:
        path = "chat/completions" if self.options.endpoint == "chat" else "completions"
        body = self._body(model, prompt, sampling, stream, extra)
        state.sent_at = time.perf_counter()
        async with self._http().post(f"{self.base}/{path}", json=body, headers={"X-Request-Id": rid}) as r:
            if r.status != 200:
                raise _HTTPError(r.status, await r.text())
            if not stream:
                state.add(json.loads(await r.text()), time.perf_counter() - state.sent_at)
            else:
                done = False
                async for raw in r.content:  # read to the end: the connection goes back to the pool
                    line = raw.decode("utf-8", errors="replace").strip()
                    if done or not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        done = True
                        continue
                    n = len(state.chunks)
                    state.add(json.loads(data), time.perf_counter() - state.sent_at)
                    if on_chunk is not None and len(state.chunks) > n and on_chunk(state.chunks[-1]) is False:
                        res = state.result(model, rid)  # leaving the block closes the connection:
                        res.cancelled = True  # the server sees the client go away
                        return res
        if not state.chunks and not state.usage:
            raise InferenceFailed("the server answered without any output", url=self.url, model=model,
                                  fix="see the server's log")
        return state.result(model, rid)


class _State:
    """Accumulates an OpenAI response (one JSON body, or SSE chunks) into a GenerationResult."""

    def __init__(self, tokenizer, stream: bool):
        self.tokenizer, self.stream = tokenizer, stream
        self.sent_at = time.perf_counter()
        self.chunks: list[Chunk] = []
        self.texts: list[str] = []
        self.ids: list[int] = []
        self.server_ids = True
        self.usage: dict | None = None
        self.end_s = 0.0
        self.server: dict = {}  # trtspec's extension: served_by, acceptance counters, perf

    def add(self, d: dict, t_s: float) -> None:
        if "error" in d and not d.get("choices"):
            raise InferenceFailed(f"the server failed mid-stream: {_message(json.dumps(d))}",
                                  fix="see the server's log")
        self.end_s = t_s
        if d.get("usage"):
            self.usage = d["usage"]
        for ch in (d.get("choices") or [])[:1]:  # one sequence per request
            if isinstance(ch.get("trtspec"), dict):
                self.server = ch["trtspec"]
            text = ch.get("text")
            if text is None:
                text = ((ch.get("delta") or ch.get("message") or {}).get("content")) or ""
            ids = ch.get("token_ids")
            if ids is None:
                ids = _ids_from_logprobs(ch.get("logprobs"))
            if not text and not ids:
                continue
            if ids is None:
                self.server_ids = False
            else:
                self.ids.extend(int(i) for i in ids)
            self.texts.append(text)
            n = len(ids) if ids is not None else (
                len(self.tokenizer(text, add_special_tokens=False)["input_ids"]) if self.tokenizer else None)
            self.chunks.append(Chunk(t_s=t_s, text=text, num_tokens=n, token_ids=list(ids) if ids else None))

    def partial(self, model: str, rid: str) -> GenerationResult | None:
        return self.result(model, rid) if self.chunks else None

    def result(self, model: str, rid: str) -> GenerationResult:
        text = "".join(self.texts)
        if self.chunks and self.server_ids:
            token_ids, source = self.ids, "server"
        elif self.tokenizer is not None:
            token_ids, source = self.tokenizer(text, add_special_tokens=False)["input_ids"], "tokenizer"
        else:
            token_ids, source = None, None
            total = (self.usage or {}).get("completion_tokens")
            if isinstance(total, int) and self.chunks:
                # counts per chunk are unknown: one each, the rest on the last, so the total is right
                for c in self.chunks:
                    c.num_tokens = 1
                self.chunks[-1].num_tokens = max(1, total - len(self.chunks) + 1)
                source = "usage"
        prompt_tokens = (self.usage or {}).get("prompt_tokens")
        srv = self.server
        return GenerationResult(model=model, request_id=rid, text=text, token_ids=token_ids, chunks=self.chunks,
                                sent_at=self.sent_at, end_s=self.end_s, token_ids_source=source,
                                prompt_tokens=prompt_tokens, stream=self.stream,
                                served_by=srv.get("served_by"), acceptance_rate=srv.get("acceptance_rate"),
                                accepted_draft_tokens=srv.get("total_accepted_draft_tokens"),
                                draft_tokens=srv.get("total_draft_tokens"), perf=srv.get("perf"),
                                extra={"usage": self.usage} if self.usage else {})


def _ids_from_logprobs(lp) -> list[int] | None:
    """vLLM's ``return_tokens_as_token_ids``: logprobs tokens spelled ``token_id:N``."""
    if not isinstance(lp, dict):
        return None
    toks = lp.get("tokens")
    if toks is None and isinstance(lp.get("content"), list):  # chat
        toks = [c.get("token") for c in lp["content"]]
    if not toks or not all(isinstance(t, str) and t.startswith("token_id:") for t in toks):
        return None
    return [int(t.split(":", 1)[1]) for t in toks]
