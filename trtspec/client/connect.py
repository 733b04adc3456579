"""Open a client for a URL: :func:`open_client` picks the gRPC client (:mod:`.client`) or the
OpenAI-compatible HTTP one (:mod:`.openai_http`) by the URL's scheme (:mod:`.targets`), and
:class:`LLMClient` is the blocking wrapper over either. Above both clients, so neither imports it.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Mapping, Sequence

from trtspec.client.base import SPECULATIVE_MODEL, ModelInfo, OnChunk
from trtspec.client.client import AsyncLLMClient
from trtspec.client.openai_http import AsyncOpenAIClient
from trtspec.client.targets import ClientOptions, parse_target
from trtspec.client.types import GenerationResult, Sampling


def open_client(url: str, *, options: ClientOptions | None = None, **kwargs):
    """The async client for ``url``'s scheme: :class:`AsyncLLMClient` (gRPC) or
    :class:`AsyncOpenAIClient` (OpenAI-compatible HTTP); ``kwargs`` go to its constructor
    (``tokenizer``, ``timeout_s``, ``retries``, ...)."""
    target = parse_target(url)
    options = options or ClientOptions()
    options.check(target)
    if target.kind == "grpc":
        return AsyncLLMClient(url, options=options, **kwargs)
    return AsyncOpenAIClient(url, options=options, **kwargs)


class LLMClient:
    """Blocking client over :class:`AsyncLLMClient`, which runs on a private event-loop thread.

    Thread-safe: calls from several threads run concurrently on that loop.
    """

    def __init__(self, url: str, **kwargs):
        self._async = open_client(url, **kwargs)  # gRPC, or an OpenAI-compatible http(s) URL
        self.url = self._async.url
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="trtspec-grpc", daemon=True)
        self._thread.start()

    def _run(self, coro):
        fut = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return fut.result()
        except BaseException:
            fut.cancel()
            raise

    def __enter__(self) -> "LLMClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def tokenizer(self):
        return self._async.tokenizer

    def wait_ready(self, models: Sequence[str] = (), timeout_s: float = 30.0) -> None:
        self._run(self._async.wait_ready(models, timeout_s))

    def model_info(self, model: str) -> ModelInfo:
        return self._run(self._async.model_info(model))

    def generate(self, prompt: str | Sequence[int], sampling: Sampling | None = None, *,
                 model: str = SPECULATIVE_MODEL, stream: bool = True, request_id: str | None = None,
                 timeout_s: float | None = None, on_chunk: OnChunk | None = None,
                 extra_inputs: Mapping[str, Any] | None = None) -> GenerationResult:
        """As :meth:`AsyncLLMClient.generate`; ``on_chunk`` runs on the client's event-loop thread."""
        return self._run(self._async.generate(prompt, sampling, model=model, stream=stream,
                                              request_id=request_id, timeout_s=timeout_s, on_chunk=on_chunk,
                                              extra_inputs=extra_inputs))

    def close(self) -> None:
        if self._loop.is_closed():
            return
        try:
            self._run(self._async.close())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)
            self._loop.close()
