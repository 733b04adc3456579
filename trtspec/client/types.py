"""Typed request parameters and results of the gRPC client."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from trtspec.errors import ConfigError


@dataclass(frozen=True)
class Sampling:
    """What one request asks for; names as the ensemble's inputs (NVIDIA's tensorrtllm backend).

    ``temperature == 0`` is greedy. ``None`` leaves an input unsent (the server's default).
    """

    max_tokens: int = 64
    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    end_id: int | None = None
    pad_id: int | None = None
    return_perf_metrics: bool = True
    min_tokens: int | None = None  # sent as min_length where the model takes it (pins the output length)

    def __post_init__(self):

        if self.max_tokens < 1:
            raise ConfigError("max_tokens", self.max_tokens, "must be >= 1")
        if self.temperature < 0:
            raise ConfigError("temperature", self.temperature, "must be >= 0 (0 = greedy)")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise ConfigError("top_p", self.top_p, "must be in (0, 1]")
        if self.top_k is not None and self.top_k < 0:
            raise ConfigError("top_k", self.top_k, "must be >= 0 (0 = off)")
        if self.seed is not None and self.seed < 0:
            raise ConfigError("seed", self.seed, "must be >= 0")
        if self.min_tokens is not None and not 1 <= self.min_tokens <= self.max_tokens:
            raise ConfigError("min_tokens", self.min_tokens, f"must be in 1..max_tokens ({self.max_tokens})")

    @classmethod
    def from_recipe(cls, sampling, max_tokens: int, *, seed: int | None = None) -> "Sampling":
        """From a recipe's ``validation.sampling`` (``trtspec.config.Sampling``)."""
        greedy = sampling.temperature == 0
        return cls(
            max_tokens=max_tokens,
            temperature=sampling.temperature,
            top_k=None if greedy else sampling.top_k,
            top_p=None if greedy else sampling.top_p,
            seed=None if greedy else (sampling.seed if seed is None else seed),
        )

    def with_(self, **changes) -> "Sampling":
        return Sampling(**{**asdict(self), **changes})


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
