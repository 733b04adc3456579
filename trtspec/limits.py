"""What one request may ask of a deployment: the recipe's ``limits:`` as every entry point checks
them (pure; numpy only). The table of limits, their defaults and who checks each: docs/limits.md."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Callable

import numpy as np

from trtspec.errors import TrtspecError

Get = Callable[[str], "np.ndarray | None"]


class RequestInputError(TrtspecError):
    """A request tensor is missing, malformed or out of range (answered as INVALID_ARGUMENT)."""

    exit_code = 2


@dataclass(frozen=True)
class RequestLimits:
    """What one request may ask of a deployment (the recipe's ``limits:``, docs/limits.md).

    Every entry point (ensemble → preprocessing, router, engine models, BLS, postprocessing, the
    OpenAI relay) checks a request against these *before* it allocates anything for it: a
    request over a limit is refused (INVALID_ARGUMENT / HTTP 400) naming the field, its value,
    the limit and the fix, and the server is unchanged. Rendered into every python model's
    ``request_limits`` parameter (JSON) by ``trtspec package``."""

    max_input_len: int = 512
    max_seq_len: int = 1024
    vocab_size: int | None = None  # token ids must be in [0, vocab_size); None: not known here
    max_return_sequences: int = 4
    max_words: int = 32
    max_word_tokens: int = 32
    max_word_bytes: int = 256
    max_logprobs: int = 5
    max_request_key_bytes: int = 256
    max_prompt_bytes: int = 1_048_576
    max_prompts: int = 8
    max_body_bytes: int = 4 * 1_048_576
    max_concurrent_requests: int = 64

    @classmethod
    def _of(cls, d: dict, **overrides) -> "RequestLimits":
        """The fields of ``d`` this class has (a recipe's limits also hold parallel sizes...)."""
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__}, **overrides)

    @classmethod
    def from_recipe(cls, limits, vocab_size: int | None = None) -> "RequestLimits":
        """From a recipe's :class:`~trtspec.config.Limits` (or a dict of its fields)."""
        return cls._of(limits if isinstance(limits, dict) else limits.model_dump(), vocab_size=vocab_size)

    @classmethod
    def from_json(cls, text: str | None) -> "RequestLimits":
        """The ``request_limits`` model parameter (absent or empty: the defaults)."""
        return cls._of(json.loads(text)) if text else cls()

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True, separators=(",", ":"))

    @property
    def max_tensor_elements(self) -> int:
        """The most elements any one input tensor of a generation request may have: the longest
        sequence, or the largest word list."""
        return max(self.max_seq_len, 2 * self.max_words * self.max_word_tokens, 1)

    def over(self, field: str, value, limit, what: str, fix: str) -> RequestInputError:
        return RequestInputError(f"{field}={value} is over this deployment's limit of {limit} {what} "
                                 f"(limits.{_LIMIT_OF.get(field, field)})", fix=fix)

    def check_count(self, field: str, value: int, limit: int, what: str, fix: str) -> None:
        if value > limit:
            raise self.over(field, value, limit, what, fix)

    def check_token_id(self, field: str, value: int, *, allow_unset: bool = False) -> None:
        """``value`` a token id of this model (``allow_unset``: -1 means none, as NVIDIA's end_id/pad_id)."""
        if allow_unset and value == -1:
            return
        top = self.vocab_size
        if value < 0 or (top is not None and value >= top):
            rng = f"[0, {top})" if top is not None else ">= 0"
            raise RequestInputError(f"{field}={value} is not a token id of this model ({rng})",
                                    fix=f"send a token id in {rng}" + (" or -1 for none" if allow_unset else ""))

    def check_tensor_sizes(self, get: Get, names) -> None:
        """Every input in ``names`` holds at most :attr:`max_tensor_elements` elements, read from
        its shape before anything is converted."""
        top = self.max_tensor_elements
        for name in names:
            a = get(name)
            if a is not None and np.asarray(a).size > top:
                raise RequestInputError(f"input '{name}' has {np.asarray(a).size} elements; this deployment "
                                        f"takes at most {top} in one tensor",
                                        fix=f"send a smaller '{name}' (limits.max_seq_len, limits.max_words)")


# which recipe field bounds each request field (for the error's pointer)
_LIMIT_OF = {
    "num_return_sequences": "max_return_sequences", "n": "max_return_sequences",
    "stop_words_list": "max_words", "bad_words_list": "max_words", "stop": "max_words",
    "request_output_len": "max_seq_len", "max_tokens": "max_seq_len",
    "logprobs": "max_logprobs", "top_logprobs": "max_logprobs", "prompt": "max_prompts",
    "REQUEST_KEY": "max_request_key_bytes", "TOKENS_BATCH": "max_seq_len",
}

# every input of a generation request that carries more than one value
SEQUENCE_INPUTS = ("input_ids", "draft_input_ids", "stop_words_list", "bad_words_list")
