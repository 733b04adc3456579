"""What one request asks of the decoder: the sampling parameters, one torch-free type.

:class:`Sampling` is used everywhere a request's sampling is described: the engine
(``trtspec.speculative`` applies it to logits: ``logits_to_probs``, the logits processors), the
client SDK (``trtspec.client`` sends it as NVIDIA's ensemble / tensorrtllm inputs), the Triton
request parsing (``trtspec.triton.backend.requests`` builds it from the request tensors) and the
recipe (``validation.sampling`` → :meth:`Sampling.from_recipe`). It imports neither torch nor
numpy, so the python stub of a worker-mode engine and the client stay free of torch.

Names are the ensemble's (NVIDIA's tensorrtllm backend): ``max_tokens``, ``top_k``, ``end_id``…
``None`` means unset: the engine reads its default (top_k 0 = off, top_p 1.0 = off, no seed) and
the client leaves the input unsent (the server's default; TRT-LLM's greedy rule reads absent
top_k/top_p as greedy, so "unset" and "off" differ on the wire).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from trtspec.errors import ConfigError

WORDS = tuple[tuple[int, ...], ...]


class SamplingError(ConfigError):
    """Invalid sampling parameters; every problem is listed in one message, worded
    ``invalid sampling parameters: <field> must … (got <value>); …`` (clients recognise the
    wording in stream errors, which carry no status). ``field``/``value`` are the first problem's."""

    exit_code = 2

    def __init__(self, problems: list[tuple[str, object, str]]):
        self.problems = problems
        self.field, self.value, self.problem = problems[0]
        self.fix = None
        self.message = "invalid sampling parameters: " + "; ".join(
            f"{field} {problem} (got {value!r})" for field, value, problem in problems)
        Exception.__init__(self, self.message)


@dataclass(frozen=True)
class Sampling:
    """Per-request decoding parameters. ``temperature == 0`` means greedy (argmax)."""

    max_tokens: int = 64
    temperature: float = 0.0
    top_k: int | None = None  # None: unset (engine: 0 = off)
    top_p: float | None = None  # None: unset (engine: 1.0 = off)
    seed: int | None = None
    end_id: int | None = None  # a token that ends generation, besides the model's EOS unless ignore_eos
    pad_id: int | None = None  # sent to the server when set; the torch engine pads nothing
    ignore_eos: bool = False  # the engine does not stop at the model's EOS (benchmarks)
    # logits processors (trtspec.speculative.processors), applied to the target's logits wherever a
    # token is chosen or verified, so speculation stays lossless under them
    repetition_penalty: float = 1.0  # 1.0 = off; >1 discourages tokens of the prompt and output
    presence_penalty: float = 0.0  # subtracted once from every token already generated
    frequency_penalty: float = 0.0  # subtracted per occurrence in the generated tokens
    min_tokens: int = 0  # no EOS / end_id before this many generated tokens (0 = off; sent as min_length)
    bad_words: WORDS = ()  # token sequences never generated
    stop_words: WORDS = ()  # token sequences that end generation (kept in the output)
    logprobs: bool = False  # return each generated token's log-probability under the target (return_log_probs)
    return_perf_metrics: bool = True  # ask the server for NVIDIA's per-request perf outputs

    def __post_init__(self):
        problems = self.problems()
        if problems:
            raise SamplingError(problems)

    def problems(self) -> list[tuple[str, object, str]]:
        """(field, value, what is wrong) for every invalid value."""
        p = []
        if self.max_tokens < 1:
            p.append(("max_tokens", self.max_tokens, "must be >= 1"))
        if not (0 <= self.temperature <= 100):  # also catches NaN
            p.append(("temperature", self.temperature, "must be in [0, 100], 0 = greedy"))
        if self.top_k is not None and self.top_k < 0:
            p.append(("top_k", self.top_k, "must be >= 0, 0 = off"))
        if self.top_p is not None and not (0 < self.top_p <= 1):
            p.append(("top_p", self.top_p, "must be in (0, 1]"))
        if self.seed is not None and self.seed < 0:
            p.append(("seed", self.seed, "must be >= 0"))
        if not (self.repetition_penalty > 0) or self.repetition_penalty == math.inf:
            p.append(("repetition_penalty", self.repetition_penalty, "must be > 0, 1 = off"))
        for name in ("presence_penalty", "frequency_penalty"):
            v = getattr(self, name)
            if not math.isfinite(v):
                p.append((name, v, "must be a finite number"))
        if self.min_tokens < 0:
            p.append(("min_tokens", self.min_tokens, "must be >= 0, 0 = off"))
        for name in ("bad_words", "stop_words"):
            if any(len(w) == 0 for w in getattr(self, name)):
                p.append((name, getattr(self, name), "every word must have at least one token"))
        return p

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def processed(self) -> bool:
        """Whether any logits processor changes the target's logits for this request."""
        return (self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0
                or self.min_tokens > 0 or bool(self.bad_words))

    @classmethod
    def from_recipe(cls, sampling, max_tokens: int, *, seed: int | None = None) -> "Sampling":
        """From a recipe's ``validation.sampling`` (``trtspec.config.Sampling``): greedy sends no
        top_k / top_p / seed; ``seed`` overrides the recipe's."""
        greedy = sampling.temperature == 0
        return cls(
            max_tokens=max_tokens,
            temperature=sampling.temperature,
            top_k=None if greedy else sampling.top_k,
            top_p=None if greedy else sampling.top_p,
            seed=None if greedy else (sampling.seed if seed is None else seed),
        )

    def with_(self, **changes) -> "Sampling":
        return replace(self, **changes)
