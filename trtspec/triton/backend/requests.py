"""The tensorrtllm backend's request tensors → one typed :class:`GenerationRequest`.

Pure (numpy only): the python-backend models read their input tensors into a mapping and call
:func:`parse_generation`; tests call it directly. Every problem raises :class:`RequestInputError`
naming the tensor, the value and the fix; the models answer it as an INVALID_ARGUMENT error.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from trtspec.errors import TrtspecError

# What every trtspec generation model (torch engine, LLM API, draft-target BLS) returns.
ENGINE_OUTPUTS = ("output_ids", "sequence_length", "acceptance_rate", "total_accepted_draft_tokens",
                  "total_draft_tokens", "served_by", "perf_json")
# What NVIDIA's tensorrtllm C++ backend returns (with return_perf_metrics=true).
TENSORRTLLM_OUTPUTS = ENGINE_OUTPUTS[:5]


class RequestInputError(TrtspecError):
    """A request tensor is missing, malformed or out of range (answered as INVALID_ARGUMENT)."""

    exit_code = 2


@dataclass(frozen=True)
class GenerationRequest:
    input_ids: list[int]
    max_tokens: int  # request_output_len
    streaming: bool = False
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    end_id: int | None = None
    pad_id: int | None = None
    return_perf_metrics: bool = False
    exclude_input_in_output: bool = True
    draft_input_ids: list[int] | None = None

    def sampling_params(self):
        """The engine's :class:`SamplingParams` (raises SamplingError on invalid values)."""
        from trtspec.speculative.sampling import SamplingParams  # lazy: trtspec.speculative.sampling needs torch; this module stays importable without it

        stop = (self.end_id,) if self.end_id is not None else ()
        return SamplingParams(max_new_tokens=self.max_tokens, temperature=self.temperature, top_k=self.top_k,
                              top_p=self.top_p, seed=self.seed, stop_token_ids=stop)

    def validate_sampling(self) -> None:
        """Check the sampling values the way the engine will, as a request error."""
        from trtspec.speculative.sampling import SamplingError  # lazy: trtspec.speculative.sampling needs torch; this module stays importable without it

        try:
            self.sampling_params()
        except SamplingError as e:
            raise RequestInputError(e.message, fix="temperature >= 0, top_k >= 0, 0 < top_p <= 1") from None


Get = Callable[[str], "np.ndarray | None"]


def _batch_of_one(get: Get, name: str, required: bool, fix: str) -> "np.ndarray | None":
    """Input ``name`` as an array of batch size 1, or None when absent and optional."""
    a = get(name)
    if a is None:
        if required:
            raise RequestInputError(f"input '{name}' is missing", fix=f"send the '{name}' tensor")
        return None
    a = np.asarray(a)
    if a.ndim == 0 or a.shape[0] != 1:
        raise RequestInputError(
            f"input '{name}' has batch size {a.shape[0] if a.ndim else 0}; trtspec models take one sequence per request",
            fix=fix,
        )
    return a


def _one(get: Get, name: str, *, required: bool = False):
    a = _batch_of_one(get, name, required,
                      "send one prompt per request, shaped [1, ...]; concurrency comes from continuous batching")
    if a is None:
        return None
    flat = a.reshape(-1)
    if flat.size != 1:
        raise RequestInputError(f"input '{name}' must hold one value, got shape {list(a.shape)}",
                                fix=f"send '{name}' shaped [1, 1]")
    return flat[0].item()


def _ids(get: Get, name: str, *, required: bool = False) -> list[int] | None:
    a = _batch_of_one(get, name, required, "send one sequence per request, shaped [1, n]")
    return None if a is None else [int(x) for x in a.reshape(-1)]


def parse_generation(get: Get, *, check_sampling: bool = True) -> GenerationRequest:
    """Read the tensorrtllm backend's inputs (``get(name)`` → array or None when absent).

    ``check_sampling=False`` leaves the sampling values to the generation model (the router does:
    it stays free of torch, which the engine's SamplingParams imports)."""
    ids = _ids(get, "input_ids", required=True)
    n = _one(get, "input_lengths")
    if n is not None:
        if not 0 <= n <= len(ids):
            raise RequestInputError(f"input_lengths={n} but input_ids has {len(ids)} ids",
                                    fix="send input_lengths = the number of prompt ids")
        ids = ids[:n]
    if not ids:
        raise RequestInputError("the prompt is empty (no input ids)", fix="send a non-empty prompt")
    max_tokens = _one(get, "request_output_len", required=True)
    if max_tokens < 1:
        raise RequestInputError(f"request_output_len (max_tokens) must be >= 1, got {max_tokens}",
                                fix="ask for at least one token")
    temperature = _one(get, "temperature")
    top_k = _one(get, "runtime_top_k")
    top_p = _one(get, "runtime_top_p")
    for name, v in (("temperature", temperature), ("top_p", top_p)):
        if v is not None and not math.isfinite(v):
            raise RequestInputError(f"{name} must be a finite number, got {v}")
    end_id, pad_id = _one(get, "end_id"), _one(get, "pad_id")
    drafts = _ids(get, "draft_input_ids")
    req = GenerationRequest(
        input_ids=ids,
        max_tokens=int(max_tokens),
        streaming=bool(_one(get, "streaming") or False),
        temperature=0.0 if temperature is None else float(temperature),
        top_k=0 if top_k is None else int(top_k),
        top_p=1.0 if top_p is None else float(top_p),
        seed=_one(get, "seed"),
        end_id=None if end_id is None or end_id < 0 else int(end_id),
        pad_id=None if pad_id is None or pad_id < 0 else int(pad_id),
        return_perf_metrics=bool(_one(get, "return_perf_metrics") or False),
        exclude_input_in_output=bool(True if (x := _one(get, "exclude_input_in_output")) is None else x),
        draft_input_ids=drafts or None,
    )
    if check_sampling:
        req.validate_sampling()
    return req


def engine_inputs(req: GenerationRequest, *, with_drafts: bool = True) -> dict[str, np.ndarray]:
    """The normalised tensors to send a generation model for ``req`` (batch of one)."""
    t = {
        "input_ids": np.array([req.input_ids], dtype=np.int32),
        "input_lengths": np.array([[len(req.input_ids)]], dtype=np.int32),
        "request_output_len": np.array([[req.max_tokens]], dtype=np.int32),
        "streaming": np.array([[req.streaming]], dtype=bool),
        "temperature": np.array([[req.temperature]], dtype=np.float32),
        "runtime_top_k": np.array([[req.top_k]], dtype=np.int32),
        "runtime_top_p": np.array([[req.top_p]], dtype=np.float32),
        "return_perf_metrics": np.array([[True]], dtype=bool),
        "exclude_input_in_output": np.array([[True]], dtype=bool),
    }
    if req.seed is not None:
        t["seed"] = np.array([[req.seed]], dtype=np.uint64)
    if req.end_id is not None:
        t["end_id"] = np.array([[req.end_id]], dtype=np.int32)
    if req.pad_id is not None:
        t["pad_id"] = np.array([[req.pad_id]], dtype=np.int32)
    if with_drafts and req.draft_input_ids:
        t["draft_input_ids"] = np.array([req.draft_input_ids], dtype=np.int32)
    return t
