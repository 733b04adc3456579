"""gRPC client SDK, load generator and latency metrics for LLM deployments on Triton.

* ``client``   :class:`AsyncLLMClient` / :class:`LLMClient`: ``generate(prompt, sampling, stream=True)``
* ``metrics``  GenAI-Perf metric definitions over per-request timelines, percentiles, buckets
* ``loadgen``  concurrency sweeps, baseline and speculative interleaved on the same prompts
"""

from trtspec.client.client import BASELINE_MODEL, SPECULATIVE_MODEL, AsyncLLMClient, LLMClient, ModelInfo, parse_url
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
    "AsyncLLMClient", "LLMClient", "ModelInfo", "parse_url", "SPECULATIVE_MODEL", "BASELINE_MODEL",
    "Sampling", "Chunk", "GenerationResult",
    "ServerRequestError", "ServerUnavailable", "ServerNotReady", "ModelNotFound", "RequestRejected",
    "InferenceFailed", "RequestTimeout", "ServerBusy",
]
