"""``preprocessing`` (text → ids) and ``postprocessing`` (ids → text) with the target's HF tokenizer.

Preprocessing is where a request is checked against the deployment's limits, so a bad request
fails before it reaches the router: empty text, a prompt longer than ``max_input_len`` tokens,
``max_tokens`` < 1 or more than fits in ``max_seq_len`` — each an INVALID_ARGUMENT error that
names the value and the limit.
"""

from __future__ import annotations

import pathlib
import threading
import time

import numpy as np

from trtspec.triton.backend.common import error_response, input_array, model_parameters, request_limits
from trtspec.triton.backend.cancel import CHECK_EVERY_S, parse_request_key, send_stop
from trtspec.triton.backend.detok import text_delta
from trtspec.triton.backend.requests import RequestInputError, RequestLimits, words_tensor
from trtspec.triton.contract import REJECTED_TEXT
from trtspec.triton.backend.guard import DEFAULT_MAX_PROMPT_BYTES, check_prompt_bytes


class Tokenizer:
    """The target's HF tokenizer: the Rust ``tokenizers`` object from ``tokenizer.json`` when there is
    one (what transformers' fast tokenizers wrap; it starts in milliseconds where importing
    transformers takes seconds per python stub), else ``transformers.AutoTokenizer``."""

    def __init__(self, folder: str):
        path = pathlib.Path(folder) / "tokenizer.json"
        if path.is_file():
            from tokenizers import Tokenizer as RustTokenizer

            self._rust = RustTokenizer.from_file(str(path))
            self._hf = None
        else:
            from transformers import AutoTokenizer

            self._rust = None
            self._hf = AutoTokenizer.from_pretrained(folder)

    def encode(self, text: str, add_special_tokens: bool) -> list[int]:
        if self._rust is not None:
            return self._rust.encode(text, add_special_tokens=add_special_tokens).ids
        return self._hf(text, add_special_tokens=add_special_tokens)["input_ids"]

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        if self._rust is not None:
            return self._rust.decode(ids, skip_special_tokens=skip_special_tokens)
        return self._hf.decode(ids, skip_special_tokens=skip_special_tokens, clean_up_tokenization_spaces=False)


def _first(a: np.ndarray | None, name: str):
    if a is None:
        return None
    if a.ndim == 0 or a.shape[0] != 1 or a.size != 1:
        raise RequestInputError(f"input '{name}' must be shaped [1, 1], got {list(a.shape)}",
                                fix="send one prompt per request")
    return a.reshape(-1)[0]


class Preprocessing:
    pb = None  # triton_python_backend_utils, set by model.py

    def initialize(self, args: dict) -> None:
        p = model_parameters(args)
        self.tokenizer = Tokenizer(p["tokenizer_dir"])
        self.add_special_tokens = p.get("add_special_tokens", "false").lower() == "true"
        self.max_input_len = int(p["max_input_len"])
        self.max_seq_len = int(p["max_seq_len"])
        self.max_prompt_bytes = int(p.get("max_prompt_bytes") or DEFAULT_MAX_PROMPT_BYTES)
        self.limits = request_limits(p)
        self.default_max_tokens = int(p["default_max_tokens"])
        # the engine's own EOS (generation_config), resolved at package time; -1 = none known
        self.end_id = int(p.get("end_id", "-1"))
        self.pad_id = int(p.get("pad_id", "-1"))

    def execute(self, requests):
        out = []
        for r in requests:
            try:
                out.append(self.pb.InferenceResponse(output_tensors=self._one(r)))
            except RequestInputError as e:
                out.append(error_response(self.pb, f"preprocessing: {e}"))
        return out

    def tokenize(self, text: str, max_tokens: int | None) -> tuple[list[int], int]:
        """Prompt ids and the effective max_tokens, or RequestInputError (pure; tested in-process)."""
        if text == "":
            raise RequestInputError("text_input is empty", fix="send a non-empty prompt")
        ids = self.tokenizer.encode(text, self.add_special_tokens)
        if not ids:
            raise RequestInputError("text_input tokenizes to no tokens", fix="send a non-empty prompt")
        if len(ids) > self.max_input_len:
            raise RequestInputError(
                f"the prompt is {len(ids)} tokens; this deployment's max_input_len is {self.max_input_len}",
                fix="shorten the prompt (or raise limits.max_input_len and re-package)",
            )
        mt = self.default_max_tokens if max_tokens is None else int(max_tokens)
        if mt < 1:
            raise RequestInputError(f"max_tokens must be >= 1, got {mt}", fix="ask for at least one token")
        if len(ids) + mt > self.max_seq_len:
            raise RequestInputError(
                f"prompt ({len(ids)} tokens) + max_tokens ({mt}) exceeds max_seq_len {self.max_seq_len}",
                fix=f"ask for at most {self.max_seq_len - len(ids)} tokens",
            )
        return ids, mt

    def words(self, a: np.ndarray | None, name: str) -> list[tuple[int, ...]]:
        """NVIDIA's ``STOP_WORDS_DICT`` / ``BAD_WORDS_DICT``: strings ``[1, n]`` → their token ids
        (each word tokenized on its own, without special tokens; a word of no tokens is dropped)."""
        if a is None:
            return []
        if a.ndim == 0 or a.shape[0] != 1:
            raise RequestInputError(f"input '{name}' must be shaped [1, n] (one list of words per request), "
                                    f"got {list(a.shape)}", fix="send one prompt per request")
        lim = getattr(self, "limits", None) or RequestLimits()
        # count and byte length from the array before any word is decoded or tokenized
        lim.check_count(name, a.size, lim.max_words, "words", "send fewer words")
        out = []
        for w in a.reshape(-1).tolist():
            n = len(w) if isinstance(w, (bytes, str)) else 0
            lim.check_count(f"{name} word", n, lim.max_word_bytes, "bytes per word (limits.max_word_bytes)",
                            "send shorter words")
            try:
                text = w.decode("utf-8") if isinstance(w, bytes) else str(w)
            except UnicodeDecodeError as e:
                raise RequestInputError(f"input '{name}' holds a word that is not valid UTF-8 ({e})") from None
            ids = self.tokenizer.encode(text, False)
            if ids:
                lim.check_count(f"{name} word", len(ids), lim.max_word_tokens, "tokens per word",
                                "send shorter words")
                out.append(tuple(ids))
        return out

    def _one(self, r) -> list:
        pb = self.pb
        for tensor, (name, why) in REJECTED_TEXT.items():
            if input_array(pb, r, tensor) is not None:
                raise RequestInputError(f"input '{name}' ({tensor}) is not supported: {why}", fix=f"omit '{name}'")
        q = _first(input_array(pb, r, "QUERY"), "text_input")
        if q is None:
            raise RequestInputError("text_input is missing", fix="send text_input")
        check_prompt_bytes(q, self.max_prompt_bytes)  # before decoding and tokenizing it
        try:
            text = q.decode("utf-8") if isinstance(q, bytes) else str(q)
        except UnicodeDecodeError as e:
            raise RequestInputError(f"text_input is not valid UTF-8 ({e})") from None
        mt = _first(input_array(pb, r, "REQUEST_OUTPUT_LEN"), "max_tokens")
        ids, mt = self.tokenize(text, None if mt is None else int(mt))
        end_id = _first(input_array(pb, r, "END_ID"), "end_id")
        pad_id = _first(input_array(pb, r, "PAD_ID"), "pad_id")
        for field_name, v in (("end_id", end_id), ("pad_id", pad_id)):
            if v is not None:
                self.limits.check_token_id(field_name, int(v), allow_unset=True)
        stop = self.words(input_array(pb, r, "STOP_WORDS_DICT"), "stop_words")
        bad = self.words(input_array(pb, r, "BAD_WORDS_DICT"), "bad_words")
        one = lambda v: np.array([[v]], dtype=np.int32)  # noqa: E731
        return [
            pb.Tensor("INPUT_ID", np.array([ids], dtype=np.int32)),
            pb.Tensor("REQUEST_INPUT_LEN", one(len(ids))),
            pb.Tensor("REQUEST_OUTPUT_LEN", one(mt)),
            pb.Tensor("OUT_END_ID", one(self.end_id if end_id is None else int(end_id))),
            pb.Tensor("OUT_PAD_ID", one(self.pad_id if pad_id is None else int(pad_id))),
            pb.Tensor("STOP_WORDS_IDS", words_tensor(stop)),
            pb.Tensor("BAD_WORDS_IDS", words_tensor(bad)),
        ]


# request keys postprocessing remembers at once (a key is one streaming request in flight)
MAX_TRACKED = 4096


class Postprocessing:
    """ids → text, and the place where the ensemble's cancellations become visible: each streamed
    response reaches postprocessing as a new request, which Triton marks cancelled once the
    client has gone; postprocessing then stops the engine request (``trtspec.triton.backend.cancel``)."""

    pb = None  # triton_python_backend_utils, set by model.py

    def initialize(self, args: dict) -> None:
        p = model_parameters(args)
        self.tokenizer = Tokenizer(p["tokenizer_dir"])
        self.skip_special_tokens = p.get("skip_special_tokens", "true").lower() == "true"
        self.limits = request_limits(p)
        self.checked: dict[str, float] = {}  # request key → when is_cancelled() was last asked
        self.stopped: dict[str, float] = {}  # request key → when its stop was sent

    def _cancelled(self, r, key: str, final: bool) -> bool:
        """Whether the client of this response's request went away (asked at most every
        CHECK_EVERY_S per request: each call is a round trip to the server). The first time it
        has, the engine is asked to stop the request."""
        if not key or parse_request_key(key) is None:
            return False
        if final:  # the engine is done with it
            self.checked.pop(key, None)
            self.stopped.pop(key, None)
            return False
        if key in self.stopped:
            return True
        now = time.monotonic()
        if now - self.checked.get(key, 0.0) < CHECK_EVERY_S:
            return False
        self.checked[key] = now
        if len(self.checked) > MAX_TRACKED:  # keys whose final response never came: the oldest go
            for k in sorted(self.checked, key=self.checked.get)[: len(self.checked) - MAX_TRACKED]:
                del self.checked[k]
        if not r.is_cancelled():
            return False
        del self.checked[key]
        self.stopped[key] = now
        threading.Thread(target=self._stop, args=(key,), daemon=True, name="postprocessing-stop").start()
        for table in (self.checked, self.stopped):  # keys whose final response never came
            for k in [k for k, t in table.items() if now - t > 600]:
                del table[k]
        return True

    def _stop(self, key: str) -> None:
        model, rid = parse_request_key(key)
        try:
            send_stop(self.pb, model, rid)
            self.pb.Logger.log_info(f"postprocessing: client cancelled; stopped {rid} on {model}")
        except Exception as e:  # noqa: BLE001 - best effort: the request then runs to its end
            self.pb.Logger.log_warn(f"postprocessing: could not stop {rid} on {model}: {e}")

    def _check(self, tokens, lengths, key) -> None:
        """Shapes and sizes of one request, from the arrays' shapes before anything is decoded:
        ``TOKENS_BATCH`` [1, beams, T] with T <= max_seq_len, ``REQUEST_KEY`` one short string."""
        lim = self.limits
        if tokens is None:
            raise RequestInputError("input 'TOKENS_BATCH' is missing", fix="send TOKENS_BATCH [1, beams, T]")
        if tokens.ndim != 3 or tokens.shape[0] != 1:
            raise RequestInputError(f"input 'TOKENS_BATCH' must be shaped [1, beams, T], got {list(tokens.shape)}",
                                    fix="send one sequence per request")
        lim.check_count("TOKENS_BATCH", tokens.size, lim.max_seq_len * lim.max_return_sequences, "ids",
                        f"send at most {lim.max_seq_len} ids per sequence")
        if lengths is not None and lengths.size != tokens.shape[0] * tokens.shape[1]:
            raise RequestInputError(f"input 'SEQUENCE_LENGTH' has {lengths.size} values for "
                                    f"{tokens.shape[0] * tokens.shape[1]} sequences", fix="one length per sequence")
        if key is not None:
            if key.size != 1:
                raise RequestInputError(f"input 'REQUEST_KEY' must hold one string, got shape {list(key.shape)}",
                                        fix="send one REQUEST_KEY per request")
            v = key.reshape(-1)[0]
            lim.check_count("REQUEST_KEY", len(v) if isinstance(v, (bytes, str)) else 0, lim.max_request_key_bytes,
                            "bytes", "send a shorter request key")

    def decode(self, ids) -> str:
        return self.tokenizer.decode(list(ids), self.skip_special_tokens)

    def execute(self, requests):
        pb = self.pb
        out = []
        for r in requests:
            try:
                tokens = input_array(pb, r, "TOKENS_BATCH")  # [1, beam, T]
                lengths = input_array(pb, r, "SEQUENCE_LENGTH")  # [1, beam]
                ctx = input_array(pb, r, "CONTEXT_LENGTH")
                final = input_array(pb, r, "IS_FINAL")
                key = input_array(pb, r, "REQUEST_KEY")
                self._check(tokens, lengths, key)
                ctx = 0 if ctx is None else int(ctx.reshape(-1)[0])
                final = True if final is None else bool(final.reshape(-1)[0])
                key = "" if key is None else key.reshape(-1)[0].decode(errors="replace")
                # one text per (batch item, beam), flat: the shape NVIDIA's postprocessing returns
                # and its clients read (``as_numpy("text_output")[0].decode()``)
                if self._cancelled(r, key, final):
                    # empty deltas, not an error: the client is gone either way, and an error from
                    # this step while the router's later responses still come left Triton 2.51
                    # holding the ensemble until the server's exit timeout (then exit code 1)
                    texts = [b""] * (tokens.shape[0] * tokens.shape[1])
                else:
                    texts = []
                    for b in range(tokens.shape[0]):
                        for beam in range(tokens.shape[1]):
                            n = int(lengths[b, beam]) if lengths is not None else tokens.shape[2]
                            texts.append(text_delta(self.decode, tokens[b, beam, :n].tolist(), ctx, final).encode())
                out.append(pb.InferenceResponse(output_tensors=[
                    pb.Tensor("OUTPUT", np.array(texts, dtype=np.object_))]))
            except RequestInputError as e:
                out.append(error_response(pb, f"postprocessing: {e}"))
            except Exception as e:  # noqa: BLE001 - answer this request, keep serving
                out.append(error_response(pb, f"postprocessing: {type(e).__name__}: {e}", invalid_argument=False))
        return out
