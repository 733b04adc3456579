"""The tensorrtllm backend's request tensors → one typed :class:`GenerationRequest`.

Pure (numpy only): the python-backend models read their input tensors into a mapping and call
:func:`parse_generation`; tests call it directly. Every problem raises :class:`RequestInputError`
naming the tensor, the value and the fix; the models answer it as an INVALID_ARGUMENT error.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from trtspec.limits import SEQUENCE_INPUTS, Get, RequestInputError, RequestLimits  # noqa: F401 - re-exported
from trtspec.sampling import Sampling, SamplingError
from trtspec.triton.contract import DEFAULT_ONLY, REJECTED

# NVIDIA's per-request outputs beside output_ids/sequence_length (tensorrtllm backend, return_* inputs).
PERF_OUTPUTS = ("kv_cache_alloc_new_blocks", "kv_cache_reused_blocks", "kv_cache_alloc_total_blocks",
                "arrival_time_ns", "first_scheduled_time_ns", "first_token_time_ns", "last_token_time_ns")
# What NVIDIA's tensorrtllm C++ backend returns (with return_perf_metrics=true, return_log_probs=true).
TENSORRTLLM_OUTPUTS = ("output_ids", "sequence_length", "acceptance_rate", "total_accepted_draft_tokens",
                       "total_draft_tokens", "cum_log_probs", "output_log_probs", "batch_index", "sequence_index",
                       *PERF_OUTPUTS)
# What every trtspec generation model (torch engine, LLM API, draft-target BLS) returns.
ENGINE_OUTPUTS = (*TENSORRTLLM_OUTPUTS, "served_by", "perf_json")


@dataclass(frozen=True)
class GenerationRequest:
    """One request of the tensorrtllm backend's contract: the prompt, what to sample
    (:class:`~trtspec.sampling.Sampling`, validated) and how to answer."""

    input_ids: list[int]
    sampling: Sampling
    streaming: bool = False
    exclude_input_in_output: bool = True
    draft_input_ids: list[int] | None = None
    num_return_sequences: int = 1

    def sequence_sampling(self, i: int) -> Sampling:
        """The sampling of returned sequence ``i``: a seeded request gets seeds seed, seed+1, …"""
        s = self.sampling
        return s if i == 0 or s.seed is None else replace(s, seed=s.seed + i)


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


def _either(get: Get, name: str, older: str):
    """One value sent under NVIDIA's name or the name it had before c2e65b8 (``random_seed`` for
    ``seed``, ``min_length`` for ``min_tokens``: genai-perf 0.0.16 still sends ``min_length``);
    both sent must agree."""
    new, old = _one(get, name), _one(get, older)
    if new is not None and old is not None and new != old:
        raise RequestInputError(f"{name}={new} and {older}={old} disagree",
                                fix=f"send one of them ({older} is the older name of {name})")
    return new if new is not None else old


def _ids(get: Get, name: str, *, required: bool = False) -> list[int] | None:
    a = _batch_of_one(get, name, required, "send one sequence per request, shaped [1, n]")
    return None if a is None else [int(x) for x in a.reshape(-1)]


def words_list(get: Get, name: str, limits: RequestLimits | None = None) -> tuple[tuple[int, ...], ...]:
    """NVIDIA's word-list tensor ``[1, 2, n]``: row 0 the words' ids back to back (padded), row 1
    each word's end offset (padded with -1) → the words as id tuples, each checked against
    ``limits`` (count, length, ids in the vocabulary)."""
    a = get(name)
    if a is None:
        return ()
    a = np.asarray(a)
    lim = limits or RequestLimits()
    if a.size > 2 * lim.max_words * lim.max_word_tokens:
        raise RequestInputError(f"input '{name}' has {a.size} elements; this deployment takes at most "
                                f"{lim.max_words} words of {lim.max_word_tokens} tokens",
                                fix="send fewer or shorter words (limits.max_words, limits.max_word_tokens)")
    if a.ndim == 2:  # [2, n]: a client that left out the batch dimension of one
        a = a[None]
    if a.ndim != 3 or a.shape[0] != 1 or a.shape[1] != 2:
        raise RequestInputError(f"input '{name}' must be shaped [1, 2, n] (ids, offsets), got {list(a.shape)}",
                                fix="send the STOP_WORDS_IDS / BAD_WORDS_IDS preprocessing returns")
    ids, offsets = a[0, 0].tolist(), a[0, 1].tolist()
    words, start = [], 0
    for end in offsets:
        if end < 0:
            break
        if not start < end <= len(ids):
            raise RequestInputError(f"input '{name}': word offsets must increase within the ids, got {offsets}",
                                    fix="offsets are cumulative end positions, padded with -1")
        words.append(tuple(int(x) for x in ids[start:end]))
        start = end
    lim.check_count(name, len(words), lim.max_words, "words", "send fewer words")
    for w in words:
        lim.check_count(f"{name} word", len(w), lim.max_word_tokens, "tokens per word", "send shorter words")
        for t in w:
            lim.check_token_id(f"{name} id", t)
    return tuple(words)


def check_unsupported(get: Get) -> None:
    """INVALID_ARG for an input of NVIDIA's contract that trtspec refuses (trtspec.triton.contract)."""

    for name, why in REJECTED.items():
        if get(name) is not None:
            raise RequestInputError(f"input '{name}' is not supported: {why}", fix=f"omit '{name}'")
    for name, (default, why) in DEFAULT_ONLY.items():
        a = get(name)
        if a is not None and any(x != default for x in np.asarray(a).reshape(-1).tolist()):
            raise RequestInputError(f"input '{name}'={np.asarray(a).reshape(-1).tolist()} is not supported: {why}",
                                    fix=f"send {name}={json_value(default)} or omit it")


def json_value(v) -> str:
    return "true" if v is True else "false" if v is False else str(v)


def parse_generation(get: Get, *, exclude_input_default: bool = True,
                     limits: RequestLimits | None = None) -> GenerationRequest:
    """Read the tensorrtllm backend's inputs (``get(name)`` → array or None when absent).

    The wire's meanings are resolved here (TRT-LLM's greedy rule, top_p 0 = off, an absent
    temperature = 1) before the values become a :class:`Sampling`, which checks their bounds.
    ``exclude_input_default``: whether output_ids leave out the prompt when the request does not
    say (NVIDIA's model parameter ``exclude_input_in_output``). ``limits``: the deployment's
    :class:`RequestLimits` (default: the recipe defaults), checked before anything is built."""
    lim = limits or RequestLimits()
    lim.check_tensor_sizes(get, SEQUENCE_INPUTS)
    check_unsupported(get)
    ids = _ids(get, "input_ids", required=True)
    n = _one(get, "input_lengths")
    if n is not None:
        if not 0 <= n <= len(ids):
            raise RequestInputError(f"input_lengths={n} but input_ids has {len(ids)} ids",
                                    fix="send input_lengths = the number of prompt ids")
        ids = ids[:n]
    if not ids:
        raise RequestInputError("the prompt is empty (no input ids)", fix="send a non-empty prompt")
    lim.check_count("input_ids", len(ids), lim.max_seq_len - 1, "prompt tokens",
                    f"send at most {lim.max_seq_len - 1} prompt ids")
    bad = [t for t in ids if t < 0 or (lim.vocab_size is not None and t >= lim.vocab_size)]
    if bad:
        lim.check_token_id("input_ids", bad[0])
    max_tokens = _one(get, "request_output_len", required=True)
    if max_tokens < 1:
        raise RequestInputError(f"request_output_len (max_tokens) must be >= 1, got {max_tokens}",
                                fix="ask for at least one token")
    lim.check_count("request_output_len", max_tokens, lim.max_seq_len, "tokens (max_seq_len)",
                    f"ask for at most {lim.max_seq_len - len(ids)} tokens")
    temperature = _one(get, "temperature")
    top_k = _one(get, "runtime_top_k")
    top_p = _one(get, "runtime_top_p")
    floats = {n: _one(get, n) for n in ("repetition_penalty", "presence_penalty", "frequency_penalty")}
    for name, v in (("temperature", temperature), ("top_p", top_p), *floats.items()):
        if v is not None and not math.isfinite(v):
            raise RequestInputError(f"invalid sampling parameters: {name} must be a finite number, got {v}")
    # worded as the engine's SamplingError, which clients read from stream errors (no status there)
    if temperature is not None and not 0 <= temperature <= 100:
        raise RequestInputError(f"invalid sampling parameters: temperature must be in [0, 100], got {temperature}", fix="0 = greedy")
    if top_p is not None and not 0 <= top_p <= 1:
        raise RequestInputError(f"invalid sampling parameters: top_p must be in [0, 1] (0 = off), got {top_p}", fix="send runtime_top_p / top_p in [0, 1]")
    if top_k is not None and top_k < 0:
        raise RequestInputError(f"invalid sampling parameters: top_k must be >= 0 (0 = off), got {top_k}", fix="send runtime_top_k / top_k >= 0")
    # TRT-LLM's rule: sampling needs top_k > 1 or top_p > 0 (top_k 1, or neither set, is greedy at
    # any temperature; an absent temperature is 1); temperature 0 is greedy too
    greedy = temperature == 0 or top_k == 1 or ((top_k or 0) == 0 and (top_p or 0) == 0)
    if temperature is None:
        temperature = 1.0
    seed = _either(get, "seed", "random_seed")
    n_seq = _one(get, "num_return_sequences")
    if n_seq is not None and n_seq < 1:
        raise RequestInputError(f"num_return_sequences must be >= 1, got {n_seq}", fix="send 1 or more")
    if n_seq is not None:
        lim.check_count("num_return_sequences", n_seq, lim.max_return_sequences, "sequences per request",
                        f"send at most {lim.max_return_sequences} (or one request per sequence)")
    min_tokens = _either(get, "min_tokens", "min_length")
    if min_tokens is not None and min_tokens < 0:
        raise RequestInputError(f"min_tokens must be >= 0, got {min_tokens}")
    exclude = _one(get, "exclude_input_in_output")
    end_id, pad_id = _one(get, "end_id"), _one(get, "pad_id")
    for name, v in (("end_id", end_id), ("pad_id", pad_id)):
        if v is not None:
            lim.check_token_id(name, int(v), allow_unset=True)
    if min_tokens is not None:
        lim.check_count("min_tokens", min_tokens, lim.max_seq_len, "tokens (max_seq_len)",
                        "ask for fewer minimum tokens than max_tokens")
    drafts = _ids(get, "draft_input_ids")
    for t in drafts or ():
        lim.check_token_id("draft_input_ids", t)
    try:
        sampling = Sampling(
            max_tokens=int(max_tokens),
            temperature=0.0 if greedy else float(temperature),
            top_k=0 if greedy or top_k is None else int(top_k),
            top_p=1.0 if greedy or not top_p else float(top_p),
            seed=None if seed is None else int(seed),
            end_id=None if end_id is None or end_id < 0 else int(end_id),
            pad_id=None if pad_id is None or pad_id < 0 else int(pad_id),
            return_perf_metrics=bool(_one(get, "return_perf_metrics") or False),
            repetition_penalty=1.0 if floats["repetition_penalty"] is None else float(floats["repetition_penalty"]),
            presence_penalty=float(floats["presence_penalty"] or 0.0),
            frequency_penalty=float(floats["frequency_penalty"] or 0.0),
            min_tokens=int(min_tokens or 0),
            stop_words=words_list(get, "stop_words_list", lim),
            bad_words=words_list(get, "bad_words_list", lim),
            logprobs=bool(_one(get, "return_log_probs") or False),
        )
    except SamplingError as e:
        raise RequestInputError(e.message, fix="temperature >= 0, top_k >= 0, 0 <= top_p <= 1, "
                                "repetition_penalty > 0, min_tokens >= 0") from None
    return GenerationRequest(
        input_ids=ids,
        sampling=sampling,
        streaming=bool(_one(get, "streaming") or False),
        exclude_input_in_output=exclude_input_default if exclude is None else bool(exclude),
        draft_input_ids=drafts or None,
        num_return_sequences=int(n_seq or 1),
    )


def engine_inputs(req: GenerationRequest, *, with_drafts: bool = True) -> dict[str, np.ndarray]:
    """The normalised tensors to send a generation model for ``req`` (batch of one)."""
    s = req.sampling
    t = {
        "input_ids": np.array([req.input_ids], dtype=np.int32),
        "input_lengths": np.array([[len(req.input_ids)]], dtype=np.int32),
        "request_output_len": np.array([[s.max_tokens]], dtype=np.int32),
        "streaming": np.array([[req.streaming]], dtype=bool),
        "temperature": np.array([[s.temperature]], dtype=np.float32),
        "runtime_top_k": np.array([[s.top_k]], dtype=np.int32),
        "runtime_top_p": np.array([[s.top_p]], dtype=np.float32),
        "return_perf_metrics": np.array([[True]], dtype=bool),
        "exclude_input_in_output": np.array([[True]], dtype=bool),
        "repetition_penalty": np.array([[s.repetition_penalty]], dtype=np.float32),
        "presence_penalty": np.array([[s.presence_penalty]], dtype=np.float32),
        "frequency_penalty": np.array([[s.frequency_penalty]], dtype=np.float32),
        "min_tokens": np.array([[s.min_tokens]], dtype=np.int32),
        "return_log_probs": np.array([[s.logprobs]], dtype=bool),
        "num_return_sequences": np.array([[req.num_return_sequences]], dtype=np.int32),
    }
    for name, words in (("stop_words_list", s.stop_words), ("bad_words_list", s.bad_words)):
        if words:
            t[name] = words_tensor(words)
    if s.seed is not None:
        t["seed"] = np.array([[s.seed]], dtype=np.uint64)
    if s.end_id is not None:
        t["end_id"] = np.array([[s.end_id]], dtype=np.int32)
    if s.pad_id is not None:
        t["pad_id"] = np.array([[s.pad_id]], dtype=np.int32)
    if with_drafts and req.draft_input_ids:
        t["draft_input_ids"] = np.array([req.draft_input_ids], dtype=np.int32)
    return t


def words_tensor(words) -> np.ndarray:
    """Words (id sequences) → NVIDIA's ``[1, 2, n]`` int32 list: ids back to back, end offsets
    (ids padded with 0, offsets with -1); no words → ``[1, 2, 0]``."""
    flat = [i for w in words for i in w]
    offsets = list(np.cumsum([len(w) for w in words])) if words else []
    n = max(len(flat), len(offsets))
    out = np.zeros((1, 2, n), dtype=np.int32)
    out[0, 0, : len(flat)] = flat
    out[0, 1, :] = -1
    out[0, 1, : len(offsets)] = offsets
    return out
