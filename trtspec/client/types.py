"""Typed request parameters and results of the gRPC client. What a request asks for is
:class:`trtspec.sampling.Sampling`, the one sampling type the engine and the server use too."""

from __future__ import annotations

from dataclasses import dataclass, field

from trtspec.sampling import Sampling

__all__ = ["Chunk", "GenerationResult", "Sampling"]


@dataclass
class Chunk:
    """One streamed response that carried output."""

    t_s: float  # arrival, seconds since the request was sent
    text: str
    num_tokens: int | None  # None when neither ids nor a tokenizer tell
    token_ids: list[int] | None = None  # the ids this chunk carried, when the server sends them
    log_probs: list[float] | None = None  # their log-probabilities, when asked for and sent


@dataclass
class GenerationResult:
    """A finished request: the output, when each piece arrived, and what the server reported."""

    model: str
    request_id: str
    text: str
    token_ids: list[int] | None  # None when the server sends no ids and no tokenizer is set
    chunks: list[Chunk]
    sent_at: float  # time.perf_counter() when the request was sent
    end_s: float  # last response (the final flag), seconds since sent
    token_ids_source: str | None = None  # "server" | "tokenizer" | None
    prompt_tokens: int | None = None
    # the server's acceptance outputs (cumulative for the request, last value seen); None when absent
    acceptance_rate: float | None = None
    accepted_draft_tokens: int | None = None
    draft_tokens: int | None = None
    served_by: str | None = None  # trtspec extra: "speculative" | "baseline"
    perf: dict | None = None  # trtspec extra: the engine's per-request stats (final response)
    attempts: int = 1  # 1 + connection retries before the first response
    stream: bool = True
    cancelled: bool = False  # the caller stopped it early (on_chunk returned False): output is partial
    extra: dict = field(default_factory=dict)

    @property
    def output_tokens(self) -> int | None:
        if self.token_ids is not None:
            return len(self.token_ids)
        if self.chunks and all(c.num_tokens is not None for c in self.chunks):
            return sum(c.num_tokens for c in self.chunks)  # type: ignore[misc]
        return None

    @property
    def ttft_s(self) -> float | None:
        return self.chunks[0].t_s if self.chunks else None

    @property
    def latency_s(self) -> float:
        """Request latency as GenAI-Perf: sent → last response carrying output."""
        return self.chunks[-1].t_s if self.chunks else self.end_s

    @property
    def acceptance_length(self) -> float | None:
        """Tokens per target pass as the server measured it (trtspec extra), else None."""
        if self.perf and isinstance(self.perf.get("acceptance_length"), (int, float)):
            return float(self.perf["acceptance_length"])
        return None

    @property
    def chunk_acceptance_length(self) -> float | None:
        """Proxy: output tokens / streamed chunks (one chunk per engine step when streaming)."""
        n = self.output_tokens
        return n / len(self.chunks) if n and self.chunks else None
