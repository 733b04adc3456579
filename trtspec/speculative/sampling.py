"""Sampling parameters and logits → probabilities (temperature, top-k, top-p)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from trtspec.errors import TrtspecError


class SamplingError(TrtspecError):
    exit_code = 2


@dataclass(frozen=True)
class SamplingParams:
    """Per-request decoding parameters. ``temperature == 0`` means greedy (argmax)."""

    max_new_tokens: int = 64
    temperature: float = 0.0
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1.0 = off
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    # logits processors (trtspec.speculative.processors), applied to the target's logits wherever a
    # token is chosen or verified, so speculation stays lossless under them
    repetition_penalty: float = 1.0  # 1.0 = off; >1 discourages tokens of the prompt and output
    presence_penalty: float = 0.0  # subtracted once from every token already generated
    frequency_penalty: float = 0.0  # subtracted per occurrence in the generated tokens
    min_tokens: int = 0  # no EOS / end_id before this many generated tokens
    bad_words: tuple[tuple[int, ...], ...] = ()  # token sequences never generated
    stop_words: tuple[tuple[int, ...], ...] = ()  # token sequences that end generation (kept in the output)
    logprobs: bool = False  # return each generated token's log-probability under the target

    def __post_init__(self):
        problems = []
        if self.max_new_tokens < 1:
            problems.append(f"max_new_tokens must be >= 1 (got {self.max_new_tokens})")
        if not (self.temperature >= 0) or self.temperature > 100:
            problems.append(f"temperature must be in [0, 100] (got {self.temperature})")
        if self.top_k < 0:
            problems.append(f"top_k must be >= 0, 0 = off (got {self.top_k})")
        if not (0 < self.top_p <= 1):
            problems.append(f"top_p must be in (0, 1] (got {self.top_p})")
        if not (self.repetition_penalty > 0) or self.repetition_penalty == float("inf"):
            problems.append(f"repetition_penalty must be > 0, 1 = off (got {self.repetition_penalty})")
        for name in ("presence_penalty", "frequency_penalty"):
            v = getattr(self, name)
            if not (abs(v) < float("inf")):
                problems.append(f"{name} must be a finite number (got {v})")
        if self.min_tokens < 0:
            problems.append(f"min_tokens must be >= 0 (got {self.min_tokens})")
        for name in ("bad_words", "stop_words"):
            if any(len(w) == 0 for w in getattr(self, name)):
                problems.append(f"{name}: every word must have at least one token")
        if problems:
            raise SamplingError("invalid sampling parameters: " + "; ".join(problems))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def processed(self) -> bool:
        """Whether any logits processor changes the target's logits for this request."""
        return (self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0
                or self.min_tokens > 0 or bool(self.bad_words))


def logits_to_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """``logits [..., V]`` → probabilities after temperature, top-k and top-p (nucleus) filtering.

    For greedy parameters this returns the one-hot argmax distribution, which makes the
    stochastic verifier reduce exactly to greedy verification.
    """
    logits = logits.float()
    if params.greedy:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    logits = logits / params.temperature
    if params.top_k and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, idx = torch.sort(logits, dim=-1, descending=True)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        # drop a token when the mass before it already reaches top_p (always keep the first)
        drop = (cum - sorted_logits.softmax(-1)) >= params.top_p
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(-1, idx, sorted_logits)
    return logits.softmax(-1)


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One draw per row of ``probs [..., V]`` → ``[...]`` token ids."""
    flat = probs.reshape(-1, probs.shape[-1])
    out = torch.multinomial(flat, 1, generator=generator).squeeze(-1)
    return out.reshape(probs.shape[:-1])
