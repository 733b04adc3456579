"""``trtspec_draft_target``: draft-target speculation over two generation models (TRT-LLM engine flow).

Each round (reference/trtllm-triton.md §2.4, our own implementation):

  1. draft   ask the draft model for k = min(num_draft_tokens, remaining - 1) tokens after the context
  2. verify  ask the target for k + 1 tokens with the draft as ``draft_input_ids``: the target keeps
             the matching prefix and continues from its own tokens, so all k + 1 are the target's
  3. commit  accepted = longest common prefix of draft and target tokens; stream the target's tokens

Every round re-sends the whole context (the tensorrtllm backend's KV-cache reuse makes that
cheap on a GPU). The models are called over gRPC to this same server, as the router relays
(:class:`Calls`; BLS where gRPC is not available). Unlike NVIDIA's BLS it streams one response per round and speaks the token
tensors of ``tensorrt_llm`` (the router calls it); NVIDIA's text-level ``tensorrt_llm_bls``
(``trtspec.triton.backend.nvidia_bls``) runs the same :class:`Rounds`. The generation models only
need the tensorrtllm backend's tensors, so the same loop runs over trtspec's torch models.
"""

from __future__ import annotations

import json
import os
import queue
import time
from dataclasses import replace

from trtspec.triton.access import InternalClient
from trtspec.triton.backend.common import (
    RequestThreads,
    error_response,
    model_parameters,
    output_array,
    parsed_requests,
    request_limits,
    resident_bytes,
    send_error,
)
from trtspec.triton.backend.requests import GenerationRequest, engine_inputs
from trtspec.triton.backend.router import ClientPool, relay_mode
from trtspec.speculative.stats import RequestStats


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def rounds_cannot_honour(req: GenerationRequest) -> list[str]:
    """The inputs of ``req`` draft-target rounds cannot honour: each round re-sends the context as
    a new prompt, so what depends on the request's own history (penalties counting only generated
    tokens, log-probs of the whole output, several sequences) would restart at every round."""
    return [n for n, on in (("num_return_sequences", req.num_return_sequences > 1),
                            ("presence_penalty", req.sampling.presence_penalty != 0),
                            ("frequency_penalty", req.sampling.frequency_penalty != 0),
                            ("return_log_probs", req.sampling.logprobs)) if on]


class Rounds:
    """Draft-target rounds over the generation models ``self.draft`` and ``self.target`` (BLS calls)."""

    pb = None
    draft = target = ""
    decoupled = True  # whether the generation models are (serving.decoupled): how to call them
    calls: "Calls"

    def _generate(self, model: str, req: GenerationRequest, context: list[int], n: int,
                  drafts: list[int] | None = None, generated: int = 0) -> list[int]:
        """``n`` tokens of ``model`` after ``context`` (fewer if it stops)."""
        # each round re-sends the whole context as the prompt: the processors that depend only on the
        # sequence so far (repetition penalty, bad words, stop words) carry over; min_tokens counts on
        sub = GenerationRequest(
            input_ids=context, streaming=False, draft_input_ids=drafts or None,
            sampling=replace(req.sampling, max_tokens=n, min_tokens=max(0, req.sampling.min_tokens - generated)),
        )
        out: list[int] = []
        for get in self.call_generation(model, engine_inputs(sub), ["output_ids", "sequence_length"]):
            ids = get("output_ids")
            if ids is None:
                continue
            n_valid = get("sequence_length")
            flat = ids.reshape(-1).tolist()
            out.extend(flat[: int(n_valid.reshape(-1)[0])] if n_valid is not None else flat)
        return out

    def call_generation(self, model: str, inputs: dict, outputs: list[str]):
        """The responses of ``model`` to one request, each as ``get(name)`` → array or None."""
        responses = self.calls.stream(model, inputs, outputs) if self.decoupled else [
            self.calls.infer(model, inputs, outputs)]
        for got in responses:
            yield got.get

    def rounds(self, req: GenerationRequest, num_draft_tokens: int):
        """Draft-target rounds for ``req``: yields ``(new target tokens, stats, done)`` per round."""
        stats = RequestStats(prompt_tokens=len(req.input_ids))
        t_start = time.perf_counter()
        context = list(req.input_ids)
        out: list[int] = []
        reason = "length"
        while len(out) < req.sampling.max_tokens:
            remaining = req.sampling.max_tokens - len(out)
            k = min(num_draft_tokens, remaining - 1)
            t0 = time.perf_counter()
            drafts = self._generate(self.draft, req, context, k, generated=len(out)) if k > 0 else []
            t1 = time.perf_counter()
            produced = self._generate(self.target, req, context, len(drafts) + 1, drafts, generated=len(out))
            t2 = time.perf_counter()
            stats.record_step(drafted=len(drafts), accepted=common_prefix(drafts, produced),
                              draft_s=t1 - t0, verify_s=t2 - t1)
            new = produced[:remaining]
            if req.sampling.end_id is not None and req.sampling.end_id in new:
                new = new[: new.index(req.sampling.end_id)]
                reason = "stop"
            elif len(produced) < len(drafts) + 1:
                reason = "stop"  # the target stopped early: end of sequence
            if not out:
                stats.ttft_s = t2 - t_start
            out.extend(new)
            context.extend(new)
            stats.generated = len(out)
            stats.output_ids = list(out)
            done = reason == "stop" or len(out) >= req.sampling.max_tokens
            if done:
                stats.finish_reason = reason
                stats.total_s = time.perf_counter() - t_start
                stats.peak_rss_bytes = resident_bytes()
            yield new, stats, done
            if done:
                return


class DraftTargetBls(Rounds):
    pb = None  # triton_python_backend_utils, set by model.py

    def initialize(self, args: dict) -> None:
        p = model_parameters(args)
        self.name = args["model_name"]
        self.target = p["tensorrt_llm_model_name"]
        self.draft = p["tensorrt_llm_draft_model_name"]
        self.num_draft_tokens = int(p["num_draft_tokens"])
        self.limits = request_limits(p)
        self.decoupled = bool(json.loads(args["model_config"]).get("model_transaction_policy", {}).get("decoupled"))
        self.calls = Calls(self.pb, self.name)
        self.threads = RequestThreads()

    def execute(self, requests):
        for sender, req in parsed_requests(self.pb, requests, self.name, self.limits):
            unsupported = rounds_cannot_honour(req)
            if unsupported or (req.streaming and not self.decoupled):
                what = (f"input '{unsupported[0]}' is not supported by the draft-target rounds (each round "
                        "re-sends the context as a new prompt)" if unsupported
                        else "streaming=true needs a decoupled model (serving.decoupled: false here)")
                send_error(self.pb, sender, f"{self.name}: {what}")
                continue
            self.threads.start(self._serve, sender, req)
        return None

    def _serve(self, sender, req: GenerationRequest) -> None:
        try:
            self._rounds(sender, req)
        except CallError as e:
            sender.send(error_response(self.pb, e.message, invalid_argument=e.invalid),
                        flags=self.pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        except Exception as e:  # noqa: BLE001 - answer this request, keep serving
            send_error(self.pb, sender, f"{self.name}: {type(e).__name__}: {e}", invalid_argument=False)

    def _rounds(self, sender, req: GenerationRequest) -> None:
        pending: list[int] = []  # non-streaming: everything
        for new, stats, done in self.rounds(req, self.num_draft_tokens):
            if req.streaming:
                self._send(sender, new, stats, done)
            else:
                pending.extend(new)
                if done:
                    self._send(sender, pending, stats, True)

    def _send(self, sender, tokens: list[int], stats, final: bool) -> None:
        from trtspec.triton.backend.engine import response_tensors  # lazy: trtspec.triton.backend.engine needs torch; this module stays importable without it

        pb = self.pb
        perf = json.dumps(stats.to_dict()) if final else ""
        sender.send(pb.InferenceResponse(output_tensors=response_tensors(pb, tokens, stats, "speculative", perf)),
                    flags=pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL if final else 0)

    def finalize(self) -> None:
        self.threads.join()
        self.calls.close()


CANCEL_CHECK_S = 0.2  # is_cancelled() is a round trip to the server: a few times a second


class Cancelled(Exception):
    """The caller of this model went away: the call was cancelled."""


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
        self.mode, why = relay_mode(os.environ.get("TRTSPEC_ROUTER_RELAY", "auto"), tls=internal.tls is not None)
        self.clients = ClientPool(why, internal) if self.mode == "grpc" else None
        pb.Logger.log_info(f"{name}: calls the other models over "
                           f"{'gRPC at ' + why if self.mode == 'grpc' else 'BLS (' + why + ')'}")

    def infer(self, model: str, tensors: dict, outputs: list[str]) -> dict:
        if self.mode != "grpc":
            return next(self._bls(model, tensors, outputs, decoupled=False))
        import tritonclient.grpc as grpcclient  # lazy: [client] (checked by relay_mode)
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

    def stream(self, model: str, tensors: dict, outputs: list[str], cancelled=None):
        """``cancelled()``: whether our own caller went away (asked every :data:`CANCEL_CHECK_S`
        while waiting); then the call is cancelled, which the ensemble passes on to the engine
        (``trtspec.triton.backend.cancel``), and :class:`Cancelled` is raised."""
        if self.mode != "grpc":
            yield from self._bls(model, tensors, outputs, decoupled=True)
            return
        import tritonclient.grpc as grpcclient  # lazy: [client] (checked by relay_mode)

        client = self.clients.get()
        q: queue.Queue = queue.Queue()
        clean = False
        try:
            client.start_stream(callback=lambda result, error: q.put((result, error)), headers=self.clients.headers)
            client.async_stream_infer(model, self._inputs(tensors), outputs=[grpcclient.InferRequestedOutput(n)
                                                                             for n in outputs],
                                      enable_empty_final_response=True)
            checked = time.monotonic()
            while True:
                try:
                    result, error = q.get(timeout=CANCEL_CHECK_S)
                except queue.Empty:
                    result = error = None
                if cancelled is not None and time.monotonic() - checked >= CANCEL_CHECK_S:
                    checked = time.monotonic()
                    if cancelled():
                        raise Cancelled
                if result is None and error is None:
                    continue
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
            self.clients.release(client, clean)

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

