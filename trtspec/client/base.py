"""What the gRPC client (:mod:`.client`) and the OpenAI-compatible HTTP client (:mod:`.openai_http`)
share: the served model names, a model's config as the client reads it, the tokenizer loader and
the streaming iterator. Both import it; it imports neither.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable, Sequence

import numpy as np

from trtspec.client.types import Chunk
from trtspec.errors import ConfigError

SPECULATIVE_MODEL = "ensemble"
BASELINE_MODEL = "ensemble_baseline"
OnChunk = Callable[[Chunk], "bool | None"]  # return False to cancel the request


@dataclass(frozen=True)
class ModelInfo:
    """What the client needs to know about a model, read once from its config."""

    name: str
    kind: str  # "text" | "ids"
    inputs: dict[str, tuple[str, tuple[int, ...]]]  # name → (datatype, dims without batch)
    outputs: frozenset[str]
    max_batch_size: int
    decoupled: bool

    @classmethod
    def from_config(cls, cfg: dict) -> "ModelInfo":
        inputs = {i["name"]: (i["data_type"].removeprefix("TYPE_").replace("STRING", "BYTES"),
                              tuple(int(d) for d in i.get("dims", [])))
                  for i in cfg.get("input", [])}
        kind = "text" if "text_input" in inputs else "ids" if "input_ids" in inputs else "unknown"
        return cls(
            name=cfg["name"], kind=kind, inputs=inputs,
            outputs=frozenset(o["name"] for o in cfg.get("output", [])),
            max_batch_size=int(cfg.get("max_batch_size", 0)),
            decoupled=bool(cfg.get("model_transaction_policy", {}).get("decoupled", False)),
        )

    def tensor(self, name: str, values: Sequence[Any]):
        """An ``InferInput`` shaped as the model declares it ([1, ...] when it batches)."""
        import tritonclient.grpc as grpcclient
        from tritonclient.utils import triton_to_np_dtype

        dtype, dims = self.inputs[name]
        n = len(values)
        shape = [n if d == -1 else d for d in dims] or [1]
        if self.max_batch_size > 0:
            shape = [1, *shape]
        if dtype == "BYTES":
            arr = np.array([v if isinstance(v, bytes) else str(v).encode() for v in values], dtype=np.object_)
        else:
            arr = np.array(values, dtype=triton_to_np_dtype(dtype))
        t = grpcclient.InferInput(name, shape, dtype)
        t.set_data_from_numpy(arr.reshape(shape))
        return t


class FastTokenizer:
    """The two calls the client makes, on ``tokenizers`` directly (a folder's ``tokenizer.json``):
    no transformers/torch import, which costs seconds per process."""

    def __init__(self, path: str):
        from tokenizers import Tokenizer

        self._tok = Tokenizer.from_file(path)

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict:
        return {"input_ids": self._tok.encode(text, add_special_tokens=add_special_tokens).ids}

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)


def load_tokenizer(tokenizer):
    """An HF tokenizer object (used as is), a folder (its ``tokenizer.json``, else
    ``AutoTokenizer``), or None."""
    if tokenizer is None or not isinstance(tokenizer, (str, os.PathLike)):
        return tokenizer
    path = str(tokenizer)
    if not os.path.isdir(path):
        raise ConfigError("tokenizer", path, "tokenizer folder not found",
                          fix="pass an HF model or tokenizer folder (the target's)")
    if os.path.isfile(os.path.join(path, "tokenizer.json")):
        return FastTokenizer(os.path.join(path, "tokenizer.json"))
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


async def stream_chunks(client, prompt, sampling, **kwargs) -> AsyncIterator[Chunk]:
    """``client.generate(..., on_chunk=...)`` as an async iterator (any client with that API).
    Leaving the loop early cancels the request: the server sees the client go away."""
    queue: asyncio.Queue = asyncio.Queue()
    done = object()

    async def run():
        try:
            await client.generate(prompt, sampling, stream=True, on_chunk=queue.put_nowait, **kwargs)
            queue.put_nowait(done)
        except BaseException as e:  # noqa: BLE001 - handed to the consumer
            queue.put_nowait(e)

    task = asyncio.create_task(run())
    try:
        while True:
            item = await queue.get()
            if item is done:
                break
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        if not task.done():
            task.cancel()
        await asyncio.gather(task, return_exceptions=True)
