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
import json
import pathlib
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from trtspec.client.client import AsyncLLMClient
from trtspec.client.errors import ModelNotFound, RequestRejected, RequestTimeout, ServerBusy, ServerRequestError, ServerUnavailable
from trtspec.client.types import Sampling
from trtspec.errors import ConfigError, ServerError
from trtspec.triton.render import read_repository_manifest

PLAIN_CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)
COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions


class APIError(Exception):
    """An OpenAI error response: ``{"error": {"message", "type", "param", "code"}}``."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    def body(self) -> dict:
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}


def _from_client_error(e: ServerRequestError) -> APIError:
    msg = str(e).splitlines()[0]
    if isinstance(e, ModelNotFound):
        return APIError(404, msg, param="model", code="model_not_found")
    if isinstance(e, RequestRejected):
        return APIError(400, msg)
    if isinstance(e, (ServerBusy, ServerUnavailable)):
        return APIError(503, msg)
    if isinstance(e, RequestTimeout):
        return APIError(504, msg)
    return APIError(500, msg)


# ---------------------------------------------------------------------------------------------
# request validation


def _number(body: dict, name: str, default, lo: float, hi: float, *, integer: bool = False):
    v = body.get(name)
    if v is None:
        return default
    ok = isinstance(v, int) if integer else isinstance(v, (int, float))
    if isinstance(v, bool) or not ok or not lo <= v <= hi:
        kind = "an integer" if integer else "a number"
        raise APIError(400, f"'{name}' must be {kind} in [{lo:g}, {hi:g}] (got {v!r})", param=name)
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


def parse_request(body: Any, *, chat: bool, chat_default_max_tokens: int) -> tuple[Request, Any]:
    """(checked request, the chat messages or None). Raises :class:`APIError` (400) naming the field."""
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
        prompts: list = []
    else:
        p = body.get("prompt")
        if isinstance(p, str):
            prompts = [p]
        elif isinstance(p, list) and p and all(isinstance(x, str) for x in p):
            prompts = list(p)
        elif isinstance(p, list) and p and all(isinstance(x, int) and not isinstance(x, bool) for x in p):
            prompts = [p]  # token ids: decoded by the tokenizer
        else:
            raise APIError(400, "'prompt' must be a string, a list of strings or a list of token ids", param="prompt")
    if body.get("echo"):
        raise APIError(400, "'echo' is not supported: the ensembles return the continuation only", param="echo")
    best_of = body.get("best_of")
    if best_of not in (None, 1) and best_of != body.get("n", 1):
        raise APIError(400, "'best_of' other than n is not supported", param="best_of")
    mt_name = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    default_mt = chat_default_max_tokens if chat else COMPLETIONS_DEFAULT_MAX_TOKENS
    max_tokens = _number(body, mt_name, default_mt, 1, 1 << 30, integer=True)
    stop = body.get("stop")
    if stop is None:
        stop = []
    elif isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop) or len(stop) > 16:
        raise APIError(400, "'stop' must be a non-empty string or a list of up to 16 of them", param="stop")
    logprobs = None
    if chat:
        if body.get("logprobs"):
            logprobs = _number(body, "top_logprobs", 0, 0, 20, integer=True)
    elif body.get("logprobs") is not None:
        logprobs = _number(body, "logprobs", 0, 0, 5, integer=True)
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
        stop=stop, n=_number(body, "n", 1, 1, 16, integer=True),
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
    is held back until the next chunk tells (OpenAI never sends any part of the stop string)."""

    def __init__(self, stops: list[str]):
        self.stops = stops
        self.held = ""
        self.stopped = False

    def feed(self, text: str) -> str:
        if self.stopped:
            return ""
        buf = self.held + text
        cut = min((i for i in (buf.find(s) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            self.stopped, self.held = True, ""
            return buf[:cut]
        keep = 0
        for s in self.stops:  # the longest tail of buf that begins a stop string
            for k in range(min(len(s) - 1, len(buf)), 0, -1):
                if buf.endswith(s[:k]):
                    keep = max(keep, k)
                    break
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
    entry points)."""

    def __init__(self, grpc_url: str, *, models: list[str], tokenizer_dir: str | None, host: str = "127.0.0.1",
                 port: int = 0, chat_template: str | None = None, chat_default_max_tokens: int = 128,
                 client_options=None):
        self.grpc_url, self.models, self.tokenizer_dir = grpc_url, list(models), tokenizer_dir
        self.host, self.port = host, port
        self.chat_default_max_tokens = chat_default_max_tokens
        self.client_options = client_options
        self.chat_template = self._load_template(chat_template)
        self.created = int(time.time())
        self._client: AsyncLLMClient | None = None
        self._tok = None  # tokenizers.Tokenizer-backed, for token strings and counts
        self._hf_tok = None  # transformers tokenizer, for chat templates (loaded at first chat request)
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner = None
        self._error: BaseException | None = None

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
        return f"http://{self.host}:{self.port}/v1"

    # ---- lifecycle

    def app(self):
        from aiohttp import web

        app = web.Application(client_max_size=64 << 20)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/v1/models/{model}", self._model)
        app.router.add_get("/health", self._health)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/v1/chat/completions", self._chat_completions)
        app.on_cleanup.append(self._close_client)
        return app

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
        self._runner = web.AppRunner(self.app(), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port, reuse_address=True)
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
            raise APIError(400, f"the tokenizer at {self.tokenizer_dir} has no chat template, so /v1/chat/completions "
                                "cannot render messages; use /v1/completions, or serve with --chat-template FILE "
                                "(or --chat-template plain)", param="messages", code="no_chat_template")
        try:
            return self._hf_tok.apply_chat_template(msgs, chat_template=template, tokenize=False,
                                                    add_generation_prompt=True)
        except Exception as e:  # noqa: BLE001 - template errors (raise_exception in the template, jinja)
            raise APIError(400, f"the chat template rejected the messages: {e}", param="messages") from None

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
            raise APIError(400, str(e).splitlines()[0], param=e.field if hasattr(e, "field") else None) from None

    async def _completions(self, request):
        return await self._generate(request, chat=False)

    async def _chat_completions(self, request):
        return await self._generate(request, chat=True)

    async def _generate(self, request, *, chat: bool):
        from aiohttp import web

        try:
            try:
                body = await request.json()
            except (json.JSONDecodeError, UnicodeDecodeError, ValueError):
                raise APIError(400, "the request body is not valid JSON") from None
            req, messages = parse_request(body, chat=chat, chat_default_max_tokens=self.chat_default_max_tokens)
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
                req.prompts = [self._tok.decode(req.prompts[0], skip_special_tokens=False)]
        except APIError as e:
            return self._error_response(e)
        except ServerRequestError as e:
            return self._error_response(_from_client_error(e))
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"
        jobs = [(p_i * req.n + k, prompt, k) for p_i, prompt in enumerate(req.prompts) for k in range(req.n)]
        if req.stream:
            return await self._stream(request, req, rid, jobs, extra)
        try:
            choices = await asyncio.gather(*(self._run_choice(req, idx, prompt, k, extra, None)
                                             for idx, prompt, k in jobs))
        except APIError as e:
            return self._error_response(e)
        except ServerRequestError as e:
            return self._error_response(_from_client_error(e))
        return web.json_response(self._final_body(req, rid, choices))

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
            raise APIError(400, str(e).splitlines()[0]) from None
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
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        try:
            await resp.write_eof()
        except ConnectionResetError:  # the client closed after [DONE]: nothing is lost
            pass
        return resp


def relay_for_repository(repo: str, grpc_url: str, *, host: str, port: int, chat_template: str | None = None,
                         client_options=None) -> OpenAIRelay:
    """An :class:`OpenAIRelay` for a repository trtspec rendered: its entry points, its tokenizer,
    its default max_tokens for chat."""

    m = read_repository_manifest(repo) or {}
    entries = m.get("entry_points") or {"speculative": "ensemble", "baseline": "ensemble_baseline"}
    models = [v for v in (entries.get("speculative"), entries.get("baseline")) if v]
    default = ((m.get("defaults") or {}).get("max_tokens")) or 128
    return OpenAIRelay(grpc_url, models=models, tokenizer_dir=m.get("tokenizer_dir"), host=host, port=port,
                       chat_template=chat_template, chat_default_max_tokens=int(default),
                       client_options=client_options)


__all__ = ["APIError", "OpenAIRelay", "StopCutter", "parse_request", "relay_for_repository"]
