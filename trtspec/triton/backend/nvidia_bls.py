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
(:class:`Calls`): Triton 2.51's stub builds the numpy arrays of BLS responses without the GIL,
which corrupted a threaded stub's heap under load (measured here too: genai-perf at concurrency 2
through this model's first, BLS-only version killed its stub). BLS is the fallback where gRPC is
not available (``TRTSPEC_ROUTER_RELAY``, as for the router).
"""

from __future__ import annotations

import json
import os
import queue
import time

import numpy as np

from trtspec.errors import TrtspecError
from trtspec.triton.access import InternalClient
from trtspec.triton.backend.bls import Rounds
from trtspec.triton.backend.common import (
    RequestThreads,
    error_response,
    input_array,
    model_parameters,
    output_array,
    scalar,
    send_error,
)
from trtspec.triton.backend.requests import PERF_OUTPUTS, RequestInputError, parse_generation
from trtspec.triton.backend.router import _ClientPool, _relay_mode
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


class CallError(Exception):
    """A called model answered with an error; passed on with its code (INVALID_ARG or not)."""

    def __init__(self, message: str, invalid: bool):
        super().__init__(message)
        self.message, self.invalid = message, invalid


class Calls:
    """Requests to other models of this server: ``infer`` (one response; models that are not
    decoupled) and ``stream`` (a decoupled model's responses until its final one); each response
    is a ``{output name: array}`` of the outputs it carries."""

    def __init__(self, pb, name: str):
        self.pb = pb
        internal = InternalClient.from_env()
        self.mode, why = _relay_mode(os.environ.get("TRTSPEC_ROUTER_RELAY", "auto"), tls=internal.tls is not None)
        self.clients = _ClientPool(why, internal) if self.mode == "grpc" else None
        pb.Logger.log_info(f"{name}: calls the other models over "
                           f"{'gRPC at ' + why if self.mode == 'grpc' else 'BLS (' + why + ')'}")

    def infer(self, model: str, tensors: dict, outputs: list[str]) -> dict:
        if self.mode != "grpc":
            return next(self._bls(model, tensors, outputs, decoupled=False))
        import tritonclient.grpc as grpcclient  # lazy: [client] (checked by _relay_mode)
        from tritonclient.utils import InferenceServerException  # lazy: as above

        client = self.clients.get()
        try:
            result = client.infer(model, self._inputs(tensors), outputs=[grpcclient.InferRequestedOutput(n)
                                                                         for n in outputs], headers=self.clients.headers)
        except InferenceServerException as e:
            self.clients.put(client)
            raise CallError(e.message(), "INVALID_ARG" in str(e.status())) from None
        self.clients.put(client)
        return {n: a for n in outputs if (a := result.as_numpy(n)) is not None}

    def stream(self, model: str, tensors: dict, outputs: list[str]):
        if self.mode != "grpc":
            yield from self._bls(model, tensors, outputs, decoupled=True)
            return
        import tritonclient.grpc as grpcclient  # lazy: [client] (checked by _relay_mode)

        client = self.clients.get()
        q: queue.Queue = queue.Queue()
        clean = False
        try:
            client.start_stream(callback=lambda result, error: q.put((result, error)), headers=self.clients.headers)
            client.async_stream_infer(model, self._inputs(tensors), outputs=[grpcclient.InferRequestedOutput(n)
                                                                             for n in outputs],
                                      enable_empty_final_response=True)
            while True:
                result, error = q.get()
                if error is not None:
                    message = error.message() if hasattr(error, "message") else str(error)
                    clean = True  # the request has ended
                    raise CallError(message, "INVALID_ARG" in str(getattr(error, "status", lambda: "")()))
                got = {n: a for n in outputs if (a := result.as_numpy(n)) is not None}
                if got:
                    yield got
                params = result.get_response().parameters
                if "triton_final_response" in params and params["triton_final_response"].bool_param:
                    clean = True
                    return
        finally:
            try:
                client.stop_stream(cancel_requests=not clean)
            except Exception:  # noqa: BLE001 - a broken stream: drop the client
                clean = False
            if clean:
                self.clients.put(client)
            else:
                client.close()

    @staticmethod
    def _inputs(tensors: dict) -> list:
        import tritonclient.grpc as grpcclient  # lazy: [client]
        from tritonclient.utils import np_to_triton_dtype  # lazy: [client]

        out = []
        for k, v in tensors.items():
            t = grpcclient.InferInput(k, list(v.shape), np_to_triton_dtype(v.dtype))
            t.set_data_from_numpy(v)
            out.append(t)
        return out

    def _bls(self, model: str, tensors: dict, outputs: list[str], *, decoupled: bool):
        pb = self.pb
        call = pb.InferenceRequest(model_name=model, inputs=[pb.Tensor(k, v) for k, v in tensors.items()],
                                   requested_output_names=outputs)
        for resp in (call.exec(decoupled=True) if decoupled else [call.exec()]):
            if resp.has_error():
                err = resp.error()
                raise CallError(err.message(), err.code() == pb.TritonError.INVALID_ARG)
            got = {n: a for n in outputs if (a := output_array(pb, resp, n)) is not None}
            if got or not decoupled:
                yield got

    def close(self) -> None:
        if self.clients is not None:
            self.clients.close()


class TextBls(Rounds):
    pb = None  # triton_python_backend_utils, set by model.py

    def initialize(self, args: dict) -> None:
        p = model_parameters(args)
        cfg = json.loads(args["model_config"])
        self.name = args["model_name"]
        self.target = p["tensorrt_llm_model_name"]
        self.draft = p.get("tensorrt_llm_draft_model_name", "")
        self.plain_model = p["plain_model"]
        self.max_draft_len = int(p["max_draft_len"])
        self.decoupled = bool(cfg.get("model_transaction_policy", {}).get("decoupled"))
        self.input_names = [t["name"] for t in cfg.get("input", [])]
        self.output_names = [t["name"] for t in cfg.get("output", [])]
        self.calls = Calls(self.pb, self.name)
        self.threads = RequestThreads()

    def call_generation(self, model: str, inputs: dict, outputs: list[str]):
        """The rounds' requests to the draft and target models (through :class:`Calls`)."""
        responses = self.calls.stream(model, inputs, outputs) if self.decoupled else [
            self.calls.infer(model, inputs, outputs)]
        for got in responses:
            yield got.get

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
        for got in self.calls.stream(self.plain_model, inputs, self.output_names):
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
        req = parse_generation(get, check_sampling=False)
        for name, on in (("num_return_sequences", req.num_return_sequences > 1),
                         ("presence_penalty", req.presence_penalty != 0),
                         ("frequency_penalty", req.frequency_penalty != 0),
                         ("return_log_probs", req.return_log_probs)):
            if on:
                raise RequestInputError(f"input '{name}' is not supported with num_draft_tokens > 0 (each round "
                                        "re-sends the context as a new prompt)", fix=f"omit '{name}' or num_draft_tokens")
        out: list[int] = []
        stats = None
        for new, stats, _done in self.rounds(req, k):
            out.extend(new)
        last_ns = time.time_ns()
        ids = out if req.exclude_input_in_output else req.input_ids + out
        post = self.calls.infer("postprocessing", {
            "TOKENS_BATCH": np.array(ids, dtype=np.int32).reshape(1, 1, -1),
            "SEQUENCE_LENGTH": np.array([[len(ids)]], dtype=np.int32),
        }, ["OUTPUT"])
        perf = req.return_perf_metrics
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
