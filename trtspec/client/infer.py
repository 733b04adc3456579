"""``trtspec infer``: one request to a running server (Triton gRPC or OpenAI-compatible)."""

from __future__ import annotations

import asyncio
from typing import Callable

from trtspec.client.connect import open_client
from trtspec.client.targets import ClientOptions
from trtspec.client.types import GenerationResult, Sampling


def request_extras(kind: str, *, stop: tuple[str, ...] = (), presence_penalty: float | None = None,
                   frequency_penalty: float | None = None) -> dict:
    """The same asks in each target's words: NVIDIA's ensemble input names over gRPC, OpenAI's
    fields over HTTP."""
    if kind == "grpc":
        names = {"stop": "stop_words", "presence_penalty": "presence_penalty", "frequency_penalty": "frequency_penalty"}
    else:
        names = {"stop": "stop", "presence_penalty": "presence_penalty", "frequency_penalty": "frequency_penalty"}
    out: dict = {}
    if stop:
        out[names["stop"]] = list(stop)
    if presence_penalty is not None:
        out[names["presence_penalty"]] = presence_penalty
    if frequency_penalty is not None:
        out[names["frequency_penalty"]] = frequency_penalty
    return out


def run_infer(url: str, prompt: str, sampling: Sampling, *, model: str = "ensemble", stream: bool = False,
              options: ClientOptions | None = None, extras: dict | None = None, tokenizer=None,
              on_text: Callable[[str], None] | None = None, timeout_s: float | None = 600.0,
              ready_timeout_s: float = 10.0) -> GenerationResult:
    """Wait for the server, send one request, return the result; ``on_text`` gets each streamed piece."""

    async def main():
        client = open_client(url, tokenizer=tokenizer, timeout_s=timeout_s, options=options)
        try:
            await client.wait_ready([model], timeout_s=ready_timeout_s)
            return await client.generate(prompt, sampling, model=model, stream=stream, extra_inputs=extras,
                                         on_chunk=(lambda ch: on_text(ch.text)) if on_text and stream else None)
        finally:
            await client.close()

    return asyncio.run(main())


def result_dict(r: GenerationResult) -> dict:
    """What ``trtspec infer --json`` prints: output, timings, the server's perf outputs."""
    return {
        "model": r.model, "text": r.text, "token_ids": r.token_ids, "token_ids_source": r.token_ids_source,
        "prompt_tokens": r.prompt_tokens, "output_tokens": r.output_tokens, "chunks": len(r.chunks),
        "ttft_s": r.ttft_s, "latency_s": r.latency_s, "served_by": r.served_by,
        "acceptance_rate": r.acceptance_rate, "accepted_draft_tokens": r.accepted_draft_tokens,
        "draft_tokens": r.draft_tokens, "perf": r.perf, "stream": r.stream, **r.extra,
    }
