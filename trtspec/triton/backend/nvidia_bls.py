"""``tensorrt_llm_bls``: NVIDIA's text-level BLS contract (tensorrtllm_backend c2e65b8) over
trtspec's models. Our own implementation of what NVIDIA's BLS does:

* ``num_draft_tokens`` > 0: external draft-target speculation, as NVIDIA's ``_spec_generate``:
  ``preprocessing`` → rounds of ``tensorrt_llm_draft_model_name`` (up to k draft tokens after the
  context) and ``tensorrt_llm_model_name`` (the context plus ``draft_input_ids``: it keeps the
  matching prefix and adds its own next token) → ``postprocessing``; one response (``stream=true``
  is refused, as NVIDIA's BLS refuses it). The rounds are :class:`trtspec.triton.backend.bls.Rounds`.
* otherwise: the request, less the BLS-only inputs, is relayed to ``plain_model`` (the text
  ensemble over the same target: preprocessing → router → postprocessing), streaming or not, and
  its responses are sent back as they come.

Every input is implemented or answered INVALID_ARG naming it: the image inputs, ``use_draft_logits``
true (drafts are verified as tokens), and in the rounds the processors that a round cannot carry
exactly (presence / frequency penalties count generated tokens, but each round re-sends the
context as a new prompt), ``return_log_probs`` and ``num_return_sequences`` > 1.

The other models are called over a gRPC connection to this same server, as the router relays
(:class:`trtspec.triton.backend.bls.Calls`): Triton 2.51's stub builds the numpy arrays of BLS
responses without the GIL, which corrupted a threaded stub's heap under load (measured here too:
genai-perf at concurrency 2 through this model's first, BLS-only version killed its stub). BLS is
the fallback where gRPC is not available (``TRTSPEC_ROUTER_RELAY``, as for the router).
"""

from __future__ import annotations

import json
import time

import numpy as np

from trtspec.errors import TrtspecError
from trtspec.triton.backend.bls import CallError, Calls, Cancelled, Rounds, rounds_cannot_honour
from trtspec.triton.backend.common import (
    RequestThreads,
    error_response,
    input_array,
    model_parameters,
    request_limits,
    scalar,
    send_error,
)
from trtspec.triton.backend.requests import PERF_OUTPUTS, RequestInputError, parse_generation
from trtspec.triton.contract import REJECTED

# what only the BLS declares (the plain model does not take them)
BLS_ONLY = ("num_draft_tokens", "use_draft_logits")
IMAGE_INPUTS = ("image_input", "image_bytes_input", "image_url_input", "video_bytes_input")
# the generation model's input name → the BLS's (as the ensemble maps them); others are equal
ENGINE_TO_TEXT = {"runtime_top_k": "top_k", "runtime_top_p": "top_p", "len_penalty": "length_penalty",
                  "streaming": "stream"}
# preprocessing's inputs ← the BLS's (the ensemble's first step)
PREPROCESSING_INPUTS = {"QUERY": "text_input", "DECODER_QUERY": "decoder_text_input", "REQUEST_OUTPUT_LEN": "max_tokens",
                        "BAD_WORDS_DICT": "bad_words", "STOP_WORDS_DICT": "stop_words",
                        "EMBEDDING_BIAS_WORDS": "embedding_bias_words", "EMBEDDING_BIAS_WEIGHTS": "embedding_bias_weights",
                        "END_ID": "end_id", "PAD_ID": "pad_id", "PROMPT_TABLE_EXTRA_ID": "prompt_table_extra_id"}
# the generation model's inputs ← preprocessing's outputs
FROM_PREPROCESSING = {"input_ids": "INPUT_ID", "input_lengths": "REQUEST_INPUT_LEN",
                      "request_output_len": "REQUEST_OUTPUT_LEN", "end_id": "OUT_END_ID", "pad_id": "OUT_PAD_ID",
                      "stop_words_list": "STOP_WORDS_IDS", "bad_words_list": "BAD_WORDS_IDS"}


def batched(a: np.ndarray) -> np.ndarray:
    """An input as the caller sent it: dims [1] with ``reshape: []`` reach the model as [batch];
    the model they are passed on to declares [batch, 1]."""
    return a.reshape(a.shape[0], 1) if a.ndim == 1 else a


def first(a: np.ndarray | None):
    return None if a is None else np.asarray(a).reshape(-1)[0].item()


class TextBls(Rounds):
    pb = None  # triton_python_backend_utils, set by model.py

    def initialize(self, args: dict) -> None:
        p = model_parameters(args)
        cfg = json.loads(args["model_config"])
        self.name = args["model_name"]
        self.limits = request_limits(p)
        self.target = p["tensorrt_llm_model_name"]
        self.draft = p.get("tensorrt_llm_draft_model_name", "")
        self.plain_model = p["plain_model"]
        self.max_draft_len = int(p["max_draft_len"])
        self.decoupled = bool(cfg.get("model_transaction_policy", {}).get("decoupled"))
        self.input_names = [t["name"] for t in cfg.get("input", [])]
        self.output_names = [t["name"] for t in cfg.get("output", [])]
        self.calls = Calls(self.pb, self.name)
        self.threads = RequestThreads()

    def execute(self, requests):
        pb = self.pb
        for request in requests:
            sender = request.get_response_sender()
            get = lambda name, r=request: input_array(pb, r, name)  # noqa: E731
            try:
                k = self.check(get)
            except TrtspecError as e:
                send_error(pb, sender, f"{self.name}: {e}")
                continue
            self.threads.start(self._serve, request, sender, k, name="tensorrt_llm_bls")
        return None

    def check(self, get) -> int:
        """The request's draft length (0: relay to the plain model); INVALID_ARG naming an input
        this model cannot honour."""
        for name in IMAGE_INPUTS:
            if get(name) is not None:
                raise RequestInputError(f"input '{name}' is not supported: {REJECTED['cross_attention_mask']}",
                                        fix=f"omit '{name}'")
        if get("text_input") is None:
            raise RequestInputError("input 'text_input' is missing", fix="send the prompt as text_input")
        if first(get("use_draft_logits")):
            raise RequestInputError("input 'use_draft_logits'=true is not supported: drafts are verified as tokens "
                                    "(draft_input_ids), exactly; draft logits are not compared",
                                    fix="send use_draft_logits false or omit it")
        k = int(first(get("num_draft_tokens")) or 0)
        if k < 0:
            raise RequestInputError(f"input 'num_draft_tokens' must be >= 0, got {k}", fix="0 or omitted: no drafting")
        if k == 0:
            return 0
        if not self.draft:
            raise RequestInputError(f"input 'num_draft_tokens'={k}: this repository has no draft model "
                                    "(tensorrt_llm_draft)", fix="omit num_draft_tokens, or package a draft_target recipe")
        if k > self.max_draft_len:
            raise RequestInputError(f"input 'num_draft_tokens'={k} is more than the target verifies in one step "
                                    f"(max_draft_len {self.max_draft_len})", fix=f"send 1..{self.max_draft_len}")
        if first(get("stream")):
            raise RequestInputError("input 'stream'=true is not supported with num_draft_tokens > 0 (one response, "
                                    "as NVIDIA's BLS)", fix="send stream false, or omit num_draft_tokens to stream")
        return k

    def _serve(self, request, sender, k: int) -> None:
        pb = self.pb
        try:
            if k:
                self._speculate(request, sender, k)
            else:
                self._relay(request, sender)
        except Cancelled:
            pb.Logger.log_info(f"{self.name}: the client went away; its request was cancelled")
            try:
                sender.send(flags=pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            except Exception:  # noqa: BLE001 - nobody is listening any more
                pass
        except CallError as e:
            sender.send(error_response(pb, e.message, invalid_argument=e.invalid),
                        flags=pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        except TrtspecError as e:
            send_error(pb, sender, f"{self.name}: {e}")
        except Exception as e:  # noqa: BLE001 - answer this request, keep serving
            send_error(pb, sender, f"{self.name}: {type(e).__name__}: {e}", invalid_argument=False)

    # ----------------------------------------------------------------------------------------
    # without drafts: the text ensemble

    def _relay(self, request, sender) -> None:
        pb = self.pb
        inputs = {}
        for name in self.input_names:
            a = input_array(pb, request, name)
            if a is not None and name not in BLS_ONLY:
                inputs[name] = batched(a)
        if not self.decoupled:
            got = self.calls.infer(self.plain_model, inputs, self.output_names)
            sender.send(self._response(got), flags=pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            return
        # a client that goes away cancels the relayed request, and through the ensemble the engine's
        for got in self.calls.stream(self.plain_model, inputs, self.output_names, cancelled=sender.is_cancelled):
            sender.send(self._response(got))
        sender.send(flags=pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def _response(self, got: dict):
        pb = self.pb
        return pb.InferenceResponse(output_tensors=[pb.Tensor(n, a) for n, a in got.items()])

    # ----------------------------------------------------------------------------------------
    # with drafts: preprocessing → rounds → postprocessing

    def _speculate(self, request, sender, k: int) -> None:
        pb = self.pb
        arrival_ns = time.time_ns()
        get_text = lambda name: input_array(pb, request, name)  # noqa: E731
        pre_in = {up: batched(a) for up, text in PREPROCESSING_INPUTS.items() if (a := get_text(text)) is not None}
        pre = self.calls.infer("preprocessing", pre_in, list(FROM_PREPROCESSING.values()))
        pre_out = {name: pre.get(up) for name, up in FROM_PREPROCESSING.items()}

        def get(name):
            if name in FROM_PREPROCESSING:
                return pre_out[name]
            if name in BLS_ONLY:
                return None
            a = get_text(ENGINE_TO_TEXT.get(name, name))
            return None if a is None else batched(a)

        # the text is the ensemble's for the same request: the prompt leads it only with
        # exclude_input_in_output=false (the router's default, which the relayed requests get)
        req = parse_generation(get, limits=self.limits)
        unsupported = rounds_cannot_honour(req)
        if unsupported:
            raise RequestInputError(f"input '{unsupported[0]}' is not supported with num_draft_tokens > 0 (each "
                                    "round re-sends the context as a new prompt)",
                                    fix=f"omit '{unsupported[0]}' or num_draft_tokens")
        out: list[int] = []
        stats = None
        for new, stats, done in self.rounds(req, k):
            out.extend(new)
            if not done and sender.is_cancelled():  # between rounds: each round is a few target steps
                raise Cancelled
        last_ns = time.time_ns()
        ids = out if req.exclude_input_in_output else req.input_ids + out
        post = self.calls.infer("postprocessing", {
            "TOKENS_BATCH": np.array(ids, dtype=np.int32).reshape(1, 1, -1),
            "SEQUENCE_LENGTH": np.array([[len(ids)]], dtype=np.int32),
        }, ["OUTPUT"])
        perf = req.sampling.return_perf_metrics
        times = {
            "arrival_time_ns": arrival_ns, "first_scheduled_time_ns": arrival_ns,
            "first_token_time_ns": arrival_ns + int(stats.ttft_s * 1e9), "last_token_time_ns": last_ns,
            "kv_cache_alloc_new_blocks": 1, "kv_cache_reused_blocks": 0, "kv_cache_alloc_total_blocks": 1,
        }
        tensors = [
            pb.Tensor("text_output", post["OUTPUT"]),
            pb.Tensor("output_ids", np.array(out, dtype=np.int32).reshape(1, -1)),
            pb.Tensor("acceptance_rate", scalar(stats.acceptance_rate, np.float32)),
            pb.Tensor("total_accepted_draft_tokens", scalar(stats.accepted, np.int32)),
            pb.Tensor("total_draft_tokens", scalar(stats.drafted, np.int32)),
            pb.Tensor("cum_log_probs", scalar(0.0, np.float32)),
            pb.Tensor("output_log_probs", np.zeros((1, 1, 0), np.float32)),
            pb.Tensor("batch_index", scalar(0, np.int32)),
            pb.Tensor("sequence_index", scalar(0, np.int32)),
            *(pb.Tensor(n, scalar(times[n] if perf else 0, np.int32 if n.startswith("kv_") else np.int64))
              for n in PERF_OUTPUTS),
            pb.Tensor("served_by", scalar("speculative", object)),
            pb.Tensor("perf_json", scalar(json.dumps(stats.to_dict()), object)),
        ]
        sender.send(pb.InferenceResponse(output_tensors=tensors), flags=pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def finalize(self) -> None:
        self.threads.join()
        self.calls.close()
