"""A small typed gRPC client for LLM deployments on Triton (asyncio core, sync wrapper).

Talks to the models NVIDIA's tensorrtllm backend defines, by their tensor names
(reference/trtllm-triton.md §2.3), so the same client works against a trtspec repository and an
NVIDIA one:

* text models: ``ensemble``, ``ensemble_baseline``, ``tensorrt_llm_bls`` — ``text_input`` in,
  ``text_output`` out (delta text per streamed response);
* id models: ``tensorrt_llm`` — ``input_ids``/``input_lengths``/``request_output_len`` in,
  ``output_ids`` out; text needs a tokenizer.

Every request goes over the gRPC *streaming* API: unary infer is rejected for decoupled models,
and the stream API also serves non-decoupled ones (one response). Inputs are built from the
model's own config (datatype and shape), and only inputs the model declares are sent; the trtspec
extras (``output_ids`` on text models, ``served_by``, ``perf_json``) are read when present.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import time
from typing import Any, AsyncIterator, Mapping, Sequence


from trtspec.client.errors import (
    InferenceFailed,
    ModelNotFound,
    RequestRejected,
    RequestTimeout,
    ServerNotReady,
    ServerRequestError,
    ServerUnavailable,
    AuthRejected,
    TLSMismatch,
    classify,
    from_exception,
)
from trtspec.client.targets import ClientOptions, parse_target, speaks_tls
from trtspec.client.base import BASELINE_MODEL as BASELINE_MODEL  # re-exported: importable from here as before
from trtspec.client.base import SPECULATIVE_MODEL, ModelInfo, OnChunk, load_tokenizer, stream_chunks
from trtspec.client.types import Chunk, GenerationResult, Sampling
from trtspec.errors import ConfigError

# logical request field → input names that carry it, per model kind (first declared name wins)
_TEXT_INPUTS = {
    "max_tokens": ("max_tokens",),
    "stream": ("stream",),
    "temperature": ("temperature",),
    "top_k": ("top_k",),
    "top_p": ("top_p",),
    "seed": ("seed", "random_seed"),
    "end_id": ("end_id",),
    "pad_id": ("pad_id",),
    "return_perf_metrics": ("return_perf_metrics",),
    "exclude_input_in_output": ("exclude_input_in_output",),
    "min_tokens": ("min_tokens", "min_length"),
    "repetition_penalty": ("repetition_penalty",),
    "presence_penalty": ("presence_penalty",),
    "frequency_penalty": ("frequency_penalty",),
    "logprobs": ("return_log_probs",),
}
_ID_INPUTS = {
    "max_tokens": ("request_output_len",),
    "stream": ("streaming",),
    "temperature": ("temperature",),
    "top_k": ("runtime_top_k",),
    "top_p": ("runtime_top_p",),
    "seed": ("seed", "random_seed"),
    "end_id": ("end_id",),
    "pad_id": ("pad_id",),
    "return_perf_metrics": ("return_perf_metrics",),
    "exclude_input_in_output": ("exclude_input_in_output",),
    "min_tokens": ("min_tokens", "min_length"),
    "repetition_penalty": ("repetition_penalty",),
    "presence_penalty": ("presence_penalty",),
    "frequency_penalty": ("frequency_penalty",),
    "logprobs": ("return_log_probs",),
}
_ids = itertools.count()


def parse_url(url: str) -> str:
    """``HOST:PORT`` of a gRPC URL (``HOST:PORT``, ``grpc://`` or ``grpcs://``) or a :class:`ConfigError`."""
    try:
        target = parse_target(url)
    except ConfigError:
        target = None
    if target is None or target.kind != "grpc":
        raise ConfigError("--url", url, "expected HOST:PORT of the server's gRPC endpoint",
                          fix="e.g. --url 127.0.0.1:8001 (grpcs://HOST:PORT for TLS; OpenAI-compatible "
                              "http(s)://HOST:PORT/v1 URLs are for trtspec.client.targets.open_client)")
    return target.address


class AsyncLLMClient:
    """asyncio client. ``async with AsyncLLMClient("127.0.0.1:8001") as c: r = await c.generate(...)``.

    ``tokenizer`` (an HF tokenizer or folder) is optional: it encodes prompts for id models,
    decodes their output, and counts tokens when a text model returns no ``output_ids``.
    Connection errors before the first response are retried ``retries`` times with exponential
    backoff from ``backoff_s``; errors after output began are raised (a retry would re-time it).
    """

    def __init__(self, url: str, *, tokenizer=None, retries: int = 3, backoff_s: float = 0.25,
                 timeout_s: float | None = 600.0, options: ClientOptions | None = None,
                 count_prompt_tokens: bool = True):
        self.address = parse_url(url)
        self.target = parse_target(url)
        self.options = options or ClientOptions()
        self.options.check(self.target)
        self.url = self.target.url  # HOST:PORT for plaintext, grpcs://HOST:PORT for TLS
        # gRPC metadata sent with every call (an auth gateway's token, Triton's restricted protocols)
        self._headers = {k.lower(): v for k, v in self.options.headers} or None
        self.tokenizer = load_tokenizer(tokenizer)
        # text models: count the prompt with the tokenizer before sending (False: take the server's
        # count from the final perf outputs, keeping the tokenizer off the time to first token)
        self.count_prompt_tokens = count_prompt_tokens
        self.retries, self.backoff_s, self.timeout_s = retries, backoff_s, timeout_s
        self._client = None
        self._info: dict[str, ModelInfo] = {}

    async def __aenter__(self) -> "AsyncLLMClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    def _grpc(self):
        if self._client is None:  # created lazily: grpc.aio binds to the running loop
            import tritonclient.grpc.aio as aio

            tls = self.options.tls
            self._client = aio.InferenceServerClient(
                self.address, ssl=self.target.tls, root_certificates=tls.ca, private_key=tls.key,
                certificate_chain=tls.cert, channel_args=tls.channel_args())
        return self._client

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None

    # ---- server and model state

    async def wait_ready(self, models: Sequence[str] = (), timeout_s: float = 30.0) -> None:
        """Wait until the server and ``models`` are ready. An unknown model fails at once."""
        deadline = time.monotonic() + timeout_s
        delay, last = 0.1, None
        while True:
            try:
                c = self._grpc()
                if await c.is_server_ready(headers=self._headers):
                    pending = [m for m in models if not await c.is_model_ready(m, headers=self._headers)]
                    if not pending:
                        return
                    await self._check_known(pending)
                    last = ServerNotReady(f"model(s) {', '.join(pending)} not ready yet", url=self.url)
                else:
                    last = ServerNotReady("server is up but not ready (still loading models)", url=self.url)
            except ModelNotFound:
                raise
            except Exception as e:  # noqa: BLE001 - tritonclient and grpc errors, mapped below
                last = from_exception(e, url=self.url, model=None)
                if isinstance(last, ServerUnavailable) and not self.target.tls \
                        and "socket closed" in str(last).lower() and await speaks_tls(self.target.host, self.target.port):
                    raise TLSMismatch("the server dropped a plaintext connection and speaks TLS", url=self.url,
                                      fix=f"use --url grpcs://{self.address} (--tls-ca CA.pem for a private CA)")
                if isinstance(last, ServerUnavailable) and self.target.tls and "socket closed" in str(last).lower():
                    raise TLSMismatch("the server closed the TLS handshake"
                                      + ("" if self.options.tls.cert else ": it may require a client certificate"),
                                      url=self.url,
                                      fix="mutual TLS: pass --tls-cert CERT.pem --tls-key KEY.pem signed by the "
                                          "server's client CA; else check --tls-ca and the server's log")
                if not isinstance(last, ServerUnavailable) or isinstance(last, (TLSMismatch, AuthRejected)):
                    raise last from None
            if time.monotonic() + delay > deadline:
                if isinstance(last, ServerNotReady):
                    last.fix = f"waited {timeout_s:.0f}s; check the server log, or wait longer"
                raise last
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)

    async def _check_known(self, models: Sequence[str]) -> None:
        try:
            index = await self._grpc().get_model_repository_index(headers=self._headers, as_json=True)
        except Exception:  # noqa: BLE001 - the index API may be restricted; then just keep waiting
            return
        names = sorted({m["name"] for m in index.get("models", [])})
        for m in models:
            if m not in names:
                raise ModelNotFound(f"the repository has no model '{m}'", url=self.url, model=m,
                                    status="NOT_FOUND", fix=f"models served here: {', '.join(names) or 'none'}")

    async def server_metadata(self) -> dict:
        """The server's ``name``, ``version`` and ``extensions`` (KServe v2 metadata)."""
        return await self._grpc().get_server_metadata(as_json=True)

    async def model_info(self, model: str) -> ModelInfo:
        if model not in self._info:
            for attempt in range(self.retries + 1):
                try:
                    cfg = (await self._grpc().get_model_config(model, headers=self._headers, as_json=True))["config"]
                    break
                except Exception as e:  # noqa: BLE001
                    err = from_exception(e, url=self.url, model=model)
                    if isinstance(err, ModelNotFound):
                        await self._check_known([model])
                    if not isinstance(err, ServerUnavailable) or isinstance(err, (TLSMismatch, AuthRejected)) \
                            or attempt == self.retries:
                        raise err from None
                    await asyncio.sleep(self.backoff_s * 2**attempt)
            info = ModelInfo.from_config(cfg)
            if info.kind == "unknown":
                raise RequestRejected(
                    "is not an LLM model: it has neither a 'text_input' nor an 'input_ids' input",
                    url=self.url, model=model, fix="use ensemble, ensemble_baseline, tensorrt_llm_bls or tensorrt_llm")
            self._info[model] = info
        return self._info[model]

    # ---- generation

    async def generate(self, prompt: str | Sequence[int], sampling: Sampling | None = None, *,
                       model: str = SPECULATIVE_MODEL, stream: bool = True, request_id: str | None = None,
                       timeout_s: float | None = None, on_chunk: OnChunk | None = None,
                       extra_inputs: Mapping[str, Any] | None = None) -> GenerationResult:
        """Send one request and collect every streamed response until the final one.

        ``timeout_s`` (default: the client's) is a deadline for the whole call, retries included.
        When it passes, or ``on_chunk`` (called with each output chunk) returns False, or the
        calling task is cancelled, the gRPC call is cancelled: Triton sees the client go away and
        the engine stops generating (docs/reliability.md). The deadline raises
        :class:`RequestTimeout`; ``on_chunk`` returning False returns the output so far with
        ``cancelled=True``. An error after output began carries that output as ``error.partial``.

        ``extra_inputs`` ({input name: value or list of values}) are sent as the model declares
        them, e.g. NVIDIA's ``stop_words``, ``presence_penalty``, ``return_log_probs``; a name the
        model does not declare raises :class:`RequestRejected` naming it.
        """
        sampling = sampling or Sampling()
        info = await self.model_info(model)
        inputs, prompt_tokens = self._inputs(info, prompt, sampling, stream)
        inputs += self._extra_inputs(info, extra_inputs)
        rid = request_id or f"trtspec-{next(_ids)}-{os.getpid()}"
        timeout = self.timeout_s if timeout_s is None else timeout_s
        deadline = None if timeout is None else time.monotonic() + timeout
        attempt = 0
        while True:
            parser = _ResponseParser(info, self.tokenizer, stream)
            try:
                if deadline is None:
                    res = await self._stream_once(info, inputs, rid, parser, on_chunk)
                else:
                    async with asyncio.timeout_at(asyncio.get_running_loop().time()
                                                  + max(0.0, deadline - time.monotonic())):
                        res = await self._stream_once(info, inputs, rid, parser, on_chunk)
                break
            except TimeoutError:
                err = RequestTimeout(f"no final response within {timeout:g}s", url=self.url, model=model,
                                     fix="raise the timeout or lower max_tokens")
                err.partial = parser.partial(model, rid)
                raise err from None
            except _NoResponseYet as e:
                delay = self.backoff_s * 2**attempt
                if attempt == self.retries or (deadline is not None and time.monotonic() + delay >= deadline):
                    raise e.error from None
                attempt += 1
                await asyncio.sleep(delay)
        res.attempts = attempt + 1
        res.prompt_tokens = prompt_tokens if prompt_tokens is not None else (res.perf or {}).get("prompt_tokens")
        return res

    async def stream(self, prompt: str | Sequence[int], sampling: Sampling | None = None, *,
                     model: str = SPECULATIVE_MODEL, request_id: str | None = None, timeout_s: float | None = None,
                     extra_inputs: Mapping[str, Any] | None = None) -> AsyncIterator[Chunk]:
        """``async for chunk in client.stream(...)``: each output chunk as it arrives. Leaving the
        loop early cancels the request on the server; errors are raised from the loop."""
        async for chunk in stream_chunks(self, prompt, sampling, model=model, request_id=request_id,
                                         timeout_s=timeout_s, extra_inputs=extra_inputs):
            yield chunk

    def _extra_inputs(self, info: ModelInfo, extra: Mapping[str, Any] | None) -> list:
        tensors = []
        for name, value in (extra or {}).items():
            if value is None:
                continue
            if name not in info.inputs:
                raise RequestRejected(
                    f"does not declare the input '{name}'", url=self.url, model=info.name,
                    fix=f"inputs it takes: {', '.join(sorted(info.inputs))}")
            values = list(value) if isinstance(value, (list, tuple)) else [value]
            tensors.append(info.tensor(name, values))
        return tensors

    def _inputs(self, info: ModelInfo, prompt, sampling: Sampling, stream: bool):
        names = _TEXT_INPUTS if info.kind == "text" else _ID_INPUTS
        prompt_tokens = None
        if info.kind == "text":
            if not isinstance(prompt, str):
                if self.tokenizer is None:
                    raise ConfigError("prompt", prompt, f"model '{info.name}' takes text",
                                      fix="pass a string, or a tokenizer to decode ids")
                prompt = self.tokenizer.decode(list(prompt))
            if self.tokenizer is not None and self.count_prompt_tokens:
                prompt_tokens = len(self.tokenizer(prompt, add_special_tokens=False)["input_ids"])
            tensors = [info.tensor("text_input", [prompt])]
        else:
            if isinstance(prompt, str):
                if self.tokenizer is None:
                    raise ConfigError("prompt", prompt[:40], f"model '{info.name}' takes token ids",
                                      fix="pass token ids, or a tokenizer (--tokenizer DIR)")
                prompt = self.tokenizer(prompt, add_special_tokens=False)["input_ids"]
            ids = [int(i) for i in prompt]
            prompt_tokens = len(ids)
            tensors = [info.tensor("input_ids", ids), info.tensor("input_lengths", [len(ids)])]
        unsent = [f for f in ("ignore_eos", "bad_words", "stop_words") if getattr(sampling, f)]
        if unsent:
            raise ConfigError(unsent[0], getattr(sampling, unsent[0]), "is not sent by the gRPC client",
                              fix="pass it as the model names it in extra_inputs (e.g. stop_words)")
        # None / off is left unsent (the server's default); these only when asked for
        asked = {"min_tokens": sampling.min_tokens > 0, "repetition_penalty": sampling.repetition_penalty != 1.0,
                 "presence_penalty": sampling.presence_penalty != 0.0,
                 "frequency_penalty": sampling.frequency_penalty != 0.0, "logprobs": sampling.logprobs}
        wanted = {
            "max_tokens": sampling.max_tokens, "stream": stream, "temperature": sampling.temperature,
            "top_k": sampling.top_k, "top_p": sampling.top_p, "seed": sampling.seed,
            "end_id": sampling.end_id, "pad_id": sampling.pad_id,
            "return_perf_metrics": sampling.return_perf_metrics, "exclude_input_in_output": True,
            **{f: getattr(sampling, f) if on else None for f, on in asked.items()},
        }
        for field, value in wanted.items():
            if value is None:
                continue
            name = next((n for n in names[field] if n in info.inputs), None)
            if name is None:
                # the model does not take it: fine for defaults, an error for a real request (min_tokens
                # only pins benchmark lengths: a model without it still answers)
                essential = field == "max_tokens" or (field == "stream" and stream) or (
                    field in asked and field != "min_tokens") or (
                    field in ("temperature", "top_k", "top_p", "seed") and sampling.temperature > 0)
                if essential:
                    raise RequestRejected(
                        f"has no input for '{field}' ({' or '.join(names[field])})", url=self.url, model=info.name,
                        fix="use a model with NVIDIA's ensemble inputs (docs/serving.md)")
                continue
            tensors.append(info.tensor(name, [value]))
        return tensors, prompt_tokens

    async def _stream_once(self, info: ModelInfo, inputs, rid: str, parser: "_ResponseParser",
                           on_chunk: OnChunk | None) -> GenerationResult:
        c = self._grpc()

        async def requests():
            yield {"model_name": info.name, "inputs": inputs, "request_id": rid}

        it = None
        try:
            # the clock starts as the call is handed to gRPC, as perf_analyzer's does (and as the OpenAI
            # client's starts before its HTTP POST): the call's set-up is the client's cost, not hidden
            parser.sent_at = time.perf_counter()
            it = c.stream_infer(inputs_iterator=requests(), headers=self._headers)
            while True:
                try:
                    result, error = await it.__anext__()
                except StopAsyncIteration:
                    break
                now = time.perf_counter()
                if error is not None:
                    raise classify(None, error.message() if callable(getattr(error, "message", None)) else str(error),
                                   url=self.url, model=info.name)
                chunks = len(parser.chunks)
                final = parser.add(result, now - parser.sent_at)
                if final:  # a final response may carry output too (non-decoupled models): hand it on
                    if on_chunk is not None and len(parser.chunks) > chunks:
                        on_chunk(parser.chunks[-1])
                    await _finish(it)
                    break
                if on_chunk is not None and len(parser.chunks) > chunks and on_chunk(parser.chunks[-1]) is False:
                    it.cancel()  # the server sees the client go away and stops the request
                    res = parser.result(info.name, rid)
                    res.cancelled = True
                    return res
        except asyncio.CancelledError:  # the caller's task, or the deadline
            if it is not None:
                it.cancel()
            raise
        except Exception as e:  # noqa: BLE001 - grpc.aio.AioRpcError, tritonclient errors, ours
            if it is not None:
                it.cancel()
            err = from_exception(e, url=self.url, model=info.name)
            if parser.responses == 0 and isinstance(err, ServerUnavailable):
                raise _NoResponseYet(err) from None  # nothing was generated for us: safe to retry
            err.partial = parser.partial(info.name, rid)
            raise err from None
        if parser.responses == 0:
            raise InferenceFailed("the stream closed without a single response", url=self.url, model=info.name,
                                  fix="see the tritonserver log; the model may have dropped the request")
        return parser.result(info.name, rid)


async def _finish(it, timeout_s: float = 2.0) -> None:
    """After the final response the server closes the stream (our side already half-closed):
    wait for that, so no half-open call outlives its event loop; cancel if it lingers."""
    try:
        async with asyncio.timeout(timeout_s):
            while True:
                await it.__anext__()
    except (StopAsyncIteration, TimeoutError):
        pass
    except Exception:  # noqa: BLE001 - the output is complete; a late stream error changes nothing
        pass
    it.cancel()


class _NoResponseYet(Exception):
    """A connection error before any response: safe to retry."""

    def __init__(self, error: ServerRequestError):
        self.error = error


def _log_probs(result) -> list[float] | None:
    """NVIDIA's ``output_log_probs`` when the model sends it (flattened: one sequence)."""
    try:
        arr = result.as_numpy("output_log_probs")
    except Exception:  # noqa: BLE001 - a model without that output
        return None
    if arr is None or arr.size == 0:
        return None
    return [float(x) for x in arr.reshape(-1)]


def _first(arr) -> Any:
    return None if arr is None or arr.size == 0 else arr.reshape(-1)[0]


class _ResponseParser:
    """Accumulates streamed responses into a :class:`GenerationResult`."""

    def __init__(self, info: ModelInfo, tokenizer, stream: bool):
        self.info, self.tokenizer, self.stream = info, tokenizer, stream
        self.sent_at: float | None = None
        self.responses = 0
        self.chunks: list[Chunk] = []
        self.texts: list[str] = []
        self.ids: list[int] = []
        self.server_ids = False
        self.end_s = 0.0
        self.acc: dict[str, Any] = {}
        self.served_by: str | None = None
        self.perf: dict | None = None

    def add(self, result, t_s: float) -> bool:
        """Record one response; True when it is the final one."""
        self.responses += 1
        self.end_s = t_s
        text, ids = "", None
        raw = result.as_numpy("text_output")
        if raw is not None and raw.size:
            v = raw.reshape(-1)[0]
            text = v.decode("utf-8", errors="replace") if isinstance(v, bytes) else str(v)
        out = result.as_numpy("output_ids")
        if out is not None:
            arr = out if out.ndim < 3 else out[0, 0]  # tensorrt_llm: [batch, beam, tokens]
            ids = [int(x) for x in arr.reshape(-1)]
            seq_len = _first(result.as_numpy("sequence_length"))
            if seq_len is not None and out.ndim >= 3:
                ids = ids[: int(seq_len)]
            self.server_ids = True
        if self.info.kind == "ids" and ids is not None and self.tokenizer is not None:
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
        for name, key, cast in (("acceptance_rate", "acceptance_rate", float),
                                ("total_accepted_draft_tokens", "accepted", int),
                                ("total_draft_tokens", "drafted", int)):
            v = _first(result.as_numpy(name))
            if v is not None:
                self.acc[key] = cast(v)
        sb = _first(result.as_numpy("served_by"))
        if sb:
            self.served_by = sb.decode() if isinstance(sb, bytes) else str(sb)
        pj = _first(result.as_numpy("perf_json"))
        if pj:
            s = pj.decode() if isinstance(pj, bytes) else str(pj)
            try:
                self.perf = json.loads(s)
            except json.JSONDecodeError:
                self.perf = {"raw": s}
        if text or ids:
            if self.stream:
                self.texts.append(text)
                self.ids.extend(ids or [])
            else:  # a non-streamed response carries the whole output
                self.texts, self.ids = [text], list(ids or [])
            n = len(ids) if ids is not None else (
                len(self.tokenizer(text, add_special_tokens=False)["input_ids"]) if self.tokenizer else None)
            self.chunks.append(Chunk(t_s=t_s, text=text, num_tokens=n, token_ids=ids,
                                     log_probs=_log_probs(result)))
        params = result.get_response().parameters
        return "triton_final_response" in params and params["triton_final_response"].bool_param

    def partial(self, model: str, rid: str) -> GenerationResult | None:
        """What arrived before a failure (None when nothing did)."""
        return self.result(model, rid) if self.responses and self.sent_at is not None else None

    def result(self, model: str, rid: str) -> GenerationResult:
        text = "".join(self.texts)
        if self.server_ids:
            token_ids, source = self.ids, "server"
        elif self.tokenizer is not None:
            token_ids, source = self.tokenizer(text, add_special_tokens=False)["input_ids"], "tokenizer"
        else:
            token_ids, source = None, None
        return GenerationResult(
            model=model, request_id=rid, text=text, token_ids=token_ids, chunks=self.chunks, sent_at=self.sent_at,
            end_s=self.end_s, token_ids_source=source, acceptance_rate=self.acc.get("acceptance_rate"),
            accepted_draft_tokens=self.acc.get("accepted"), draft_tokens=self.acc.get("drafted"),
            served_by=self.served_by, perf=self.perf, stream=self.stream,
        )
