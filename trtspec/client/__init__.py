"""gRPC client SDK, load generator and latency metrics for LLM deployments on Triton.

* ``client``   :class:`AsyncLLMClient` (gRPC): ``generate(prompt, sampling, stream=True)``
* ``connect``  :func:`open_client` (gRPC or OpenAI-compatible HTTP by the URL) and the blocking :class:`LLMClient`
* ``metrics``  GenAI-Perf metric definitions over per-request timelines, percentiles, buckets
* ``loadgen``  concurrency sweeps, baseline and speculative interleaved on the same prompts
"""

from trtspec.client.base import BASELINE_MODEL, SPECULATIVE_MODEL, ModelInfo
from trtspec.client.client import AsyncLLMClient, parse_url
from trtspec.client.connect import LLMClient, open_client
from trtspec.client.errors import (
    InferenceFailed,
    ModelNotFound,
    RequestRejected,
    RequestTimeout,
    ServerBusy,
    ServerNotReady,
    ServerRequestError,
    ServerUnavailable,
)
from trtspec.client.types import Chunk, GenerationResult, Sampling

__all__ = [
    "AsyncLLMClient", "LLMClient", "ModelInfo", "open_client", "parse_url", "SPECULATIVE_MODEL", "BASELINE_MODEL",
    "Sampling", "Chunk", "GenerationResult",
    "ServerRequestError", "ServerUnavailable", "ServerNotReady", "ModelNotFound", "RequestRejected",
    "InferenceFailed", "RequestTimeout", "ServerBusy",
]
