"""The ``tensorrt_llm`` python model of the torch runtime: our engine behind the tensorrtllm
backend's tensors.

``initialize`` builds the engine from the RuntimeSpec JSON beside the model and starts a
:class:`BackgroundEngine` (continuous batching in one thread). ``execute`` only parses and
submits; responses are sent from the engine thread, one per engine step when streaming, else one
with every token. Every response carries the cumulative acceptance counters; the final one also
``perf_json`` (RequestStats.to_dict()). A client that went away cancels its request at the next
step, and so does a ``stop`` request carrying the same request id (how the ensemble's
cancellations get here: ``trtspec.triton.cancel``).
"""

from __future__ import annotations

import inspect
import json
import os
import pathlib
import threading
import time

import numpy as np

from trtspec.errors import TrtspecError
from trtspec.triton.backend_common import (
    Metrics,
    input_array,
    model_parameters,
    resident_bytes,
    scalar,
    send_error,
)
from trtspec.triton.access import secret_from_env, verify_stop_id
from trtspec.triton.cancel import STOP_INPUT
from trtspec.triton.guard import check_draft_ids, check_sizes, is_fatal_device_error
from trtspec.triton.requests import GenerationRequest, RequestInputError, parse_generation

SECONDS_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
TOKENS_PER_S_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000)


def engine_metric_specs(max_draft_len: int) -> list[tuple]:
    """(name, description, kind, buckets, extra labels) of the engine model's metrics."""
    al_buckets = tuple(float(x) for x in range(1, max(max_draft_len, 1) + 2))
    return [
        ("trtspec_draft_tokens_total", "Draft tokens proposed (drafted)", "COUNTER", None, {}),
        ("trtspec_accepted_tokens_total", "Draft tokens the target accepted", "COUNTER", None, {}),
        ("trtspec_generated_tokens_total", "Tokens generated", "COUNTER", None, {}),
        ("trtspec_requests_finished_total", "Requests finished", "COUNTER", None, {}),
        ("trtspec_requests_cancelled_total", "Requests stopped early (client gone or a stop request)",
         "COUNTER", None, {}),
        ("trtspec_acceptance_length", "Tokens per target pass, per request (acceptance length)",
         "HISTOGRAM", al_buckets, {}),
        ("trtspec_draft_seconds", "Time spent drafting, per request", "HISTOGRAM", SECONDS_BUCKETS, {}),
        ("trtspec_verify_seconds", "Time spent in target verification passes, per request",
         "HISTOGRAM", SECONDS_BUCKETS, {}),
        ("trtspec_queue_seconds", "Delay from submission to the request's prefill", "HISTOGRAM", SECONDS_BUCKETS, {}),
        ("trtspec_tokens_per_second", "Decode speed per request (generated / decode time)",
         "HISTOGRAM", TOKENS_PER_S_BUCKETS, {}),
        ("trtspec_resident_memory_bytes", "Resident memory of the model's process", "GAUGE", None, {}),
        ("trtspec_inflight_requests", "Requests queued or generating", "GAUGE", None, {}),
    ]


def finished_metric_ops(stats, cancelled: bool = False) -> list[tuple]:
    ops = [
        ("increment", "trtspec_draft_tokens_total", stats.drafted, {}),
        ("increment", "trtspec_accepted_tokens_total", stats.accepted, {}),
        ("increment", "trtspec_generated_tokens_total", stats.generated, {}),
        ("increment", "trtspec_requests_finished_total", 1, {}),
        ("observe", "trtspec_draft_seconds", stats.draft_s, {}),
        ("observe", "trtspec_verify_seconds", stats.verify_s, {}),
        ("observe", "trtspec_queue_seconds", stats.queue_s, {}),
        ("set", "trtspec_resident_memory_bytes", resident_bytes(), {}),
        ("increment", "trtspec_inflight_requests", -1, {}),
    ]
    if cancelled:
        ops.append(("increment", "trtspec_requests_cancelled_total", 1, {}))
    if stats.steps:
        ops.append(("observe", "trtspec_acceptance_length", stats.acceptance_length, {}))
    if stats.generated:
        ops.append(("observe", "trtspec_tokens_per_second", stats.tokens_per_s, {}))
    return ops


def response_tensors(pb, tokens: list[int], stats, served_by: str, perf_json: str) -> list:
    """The tensorrtllm backend's outputs for one response (batch 1, beam 1) plus trtspec's extras."""
    return [
        pb.Tensor("output_ids", np.array(tokens, dtype=np.int32).reshape(1, 1, -1)),
        pb.Tensor("sequence_length", scalar(len(tokens), np.int32)),
        pb.Tensor("acceptance_rate", scalar(stats.acceptance_rate, np.float32)),
        pb.Tensor("total_accepted_draft_tokens", scalar(stats.accepted, np.int32)),
        pb.Tensor("total_draft_tokens", scalar(stats.drafted, np.int32)),
        pb.Tensor("served_by", scalar(served_by, object)),
        pb.Tensor("perf_json", scalar(perf_json, object)),
    ]


class _Counters:
    """Acceptance counters as the client sees them (see :meth:`_Stream.counters`)."""

    def __init__(self, accepted: int, drafted: int):
        self.accepted, self.drafted = accepted, drafted
        self.acceptance_rate = accepted / drafted if drafted else 0.0


class _Stream:
    """One request's responses, sent from the engine thread."""

    def __init__(self, model: "EngineModel", sender, req: GenerationRequest, request_id: str = ""):
        self.model, self.sender, self.req, self.request_id = model, sender, req, request_id
        self.tokens: list[int] = []  # non-streaming: everything so far
        self.cancel_checked = 0.0
        self.stop_requested = False  # set by a stop request with this request's id
        # draft_input_ids are the tokens right after the prompt (the tensorrtllm backend verifies
        # them in the context phase); the engine's external drafts continue after its prefill
        # token. So the first draft token is checked against the prefill token here and the rest
        # go to the engine: ``first_draft`` = (token, accepted?) once known.
        self.first_draft = req.draft_input_ids[0] if req.draft_input_ids else None
        self.first_accepted = 0

    def counters(self, stats) -> _Counters:
        if self.first_draft is None:
            return _Counters(stats.accepted, stats.drafted)
        return _Counters(stats.accepted + self.first_accepted, stats.drafted + 1)

    def perf_json(self, stats) -> str:
        d = stats.to_dict()
        if self.first_draft is not None:
            c = self.counters(stats)
            d.update(drafted=c.drafted, accepted=c.accepted, acceptance_rate=round(c.acceptance_rate, 4))
        return json.dumps(d)

    def on_event(self, ev) -> bool | None:
        pb = self.model.pb
        if ev.finished:
            self.model.forget(self)
        if ev.finish_reason and ev.finish_reason.startswith("error"):
            send_error(pb, self.sender, f"generation failed: {ev.finish_reason[len('error: '):]}",
                       invalid_argument=False)
            self.model.metrics.apply([("increment", "trtspec_inflight_requests", -1, {})])
            if is_fatal_device_error(ev.finish_reason):
                self.model.exit_stub(ev.finish_reason)
            return None
        if self.first_draft is not None and ev.stats.generated == len(ev.new_tokens) and ev.new_tokens:
            self.first_accepted = int(ev.new_tokens[0] == self.first_draft)
        counters = self.counters(ev.stats)
        perf = self.perf_json(ev.stats) if ev.finished else ""
        if ev.finished:  # before the final response: a client that reads /metrics next sees this request
            self.model.metrics.apply(finished_metric_ops(ev.stats, ev.finish_reason == "cancelled"))
        if self.req.streaming:
            if ev.new_tokens or ev.finished:
                tensors = response_tensors(pb, ev.new_tokens, counters, self.model.served_by, perf)
                flags = pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL if ev.finished else 0
                self.sender.send(pb.InferenceResponse(output_tensors=tensors), flags=flags)
        else:
            self.tokens.extend(ev.new_tokens)
            if ev.finished:
                tensors = response_tensors(pb, self.tokens, counters, self.model.served_by, perf)
                self.sender.send(pb.InferenceResponse(output_tensors=tensors),
                                 flags=pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        if ev.finished:
            return None
        if self.stop_requested:
            return False
        # is_cancelled() is a round trip to the server: ask a few times a second, not every step
        now = time.monotonic()
        if now - self.cancel_checked > 0.2:
            self.cancel_checked = now
            if self.sender.is_cancelled():
                return False
        return None


class EngineModel:
    """Base of ``TritonPythonModel`` for the torch runtime's generation models."""

    pb = None  # triton_python_backend_utils, set by model.py

    def initialize(self, args: dict) -> None:
        from trtspec.speculative.engine import BackgroundEngine
        from trtspec.speculative.runtime import RuntimeSpec, build_engine

        p = model_parameters(args)
        self.name = args["model_name"]
        self.served_by = p.get("served_by", "speculative")
        spec_path = pathlib.Path(args["model_repository"]) / args["model_version"] / p["runtime_spec"]
        spec = RuntimeSpec.from_json(spec_path.read_text())
        self.engine = build_engine(spec)
        self.background = BackgroundEngine(self.engine, max_queue=int(p.get("max_queue_size") or 0) or 1024)
        # the lead adds external drafts to submit(); until then draft_input_ids is refused clearly
        self.external_drafts = "draft_tokens" in inspect.signature(self.background.submit).parameters
        # request id → its streams in flight, for stop requests (ids are the client's: may repeat)
        self.by_id: dict[str, list[_Stream]] = {}
        self.by_id_lock = threading.Lock()
        # what a request may send (trtspec.triton.guard): checked before anything is converted
        self.vocab_size = int(self.engine.target.args.vocab_size)
        self.max_draft_len = int(spec.max_draft_len)
        self.max_seq_len = int(self.engine.max_seq_len)
        self.secret = secret_from_env()  # stop requests must be signed with it (trtspec.triton.access)
        self.metrics = Metrics(self.pb, self.name, args["model_version"])
        self.metrics.declare(engine_metric_specs(spec.max_draft_len if spec.method != "none" else 0))
        self.pb.Logger.log_info(
            f"{self.name}: torch runtime ready (method {spec.method}, target {spec.target}, "
            f"max_batch_size {spec.max_batch_size}, device {self.engine.device}"
            + (f", engine thread: {self.background.threads['threads']} torch thread(s) of "
               f"{self.background.threads['configured']}, the faster here" if self.background.threads else "")
            + ")")
        if self.background.warm_up_error:
            self.pb.Logger.log_warn(f"{self.name}: the draft's warm-up in the engine thread failed "
                                    f"({self.background.warm_up_error}); the first requests compile it")

    def execute(self, requests):
        for request in requests:
            self._submit(request)
        return None

    def _submit(self, request) -> None:
        sender = request.get_response_sender()
        stop = input_array(self.pb, request, STOP_INPUT)
        if stop is not None and bool(stop.reshape(-1)[0]):
            rid = verify_stop_id(request.request_id(), self.secret)
            if rid is None:  # a client guessing ids, or a server started without trtspec's launcher
                send_error(self.pb, sender, f"{self.name}: stop requests are trtspec's own (they need the "
                                            "launcher's secret); cancel your own request instead")
                return
            self._stop(rid)
            sender.send(flags=self.pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            return
        try:
            get = lambda name: input_array(self.pb, request, name)  # noqa: E731
            check_sizes(get, max_input_ids=self.max_seq_len, max_draft_len=self.max_draft_len)
            req = parse_generation(get)
            check_draft_ids(req.draft_input_ids, vocab_size=self.vocab_size, max_draft_len=self.max_draft_len)
            kwargs = {}
            if req.draft_input_ids:
                if not self.external_drafts:
                    raise RequestInputError("draft_input_ids: this engine cannot verify external drafts",
                                            fix="omit draft_input_ids")
                if len(req.draft_input_ids) > 1:
                    kwargs["draft_tokens"] = req.draft_input_ids[1:]  # the first is checked by _Stream
            stream = _Stream(self, sender, req, request.request_id())
            self.metrics.apply([("increment", "trtspec_inflight_requests", 1, {})])
            self._remember(stream)
            try:
                self.background.submit(req.input_ids, req.sampling_params(), stream.on_event, **kwargs)
            except BaseException:
                self.forget(stream)
                self.metrics.apply([("increment", "trtspec_inflight_requests", -1, {})])
                raise
        except TrtspecError as e:
            send_error(self.pb, sender, f"{self.name}: {e}")
        except Exception as e:  # noqa: BLE001 - one bad request must not take the model down
            send_error(self.pb, sender, f"{self.name}: internal error: {type(e).__name__}: {e}",
                       invalid_argument=False)

    def _remember(self, stream: _Stream) -> None:
        if stream.request_id:
            with self.by_id_lock:
                self.by_id.setdefault(stream.request_id, []).append(stream)

    def forget(self, stream: _Stream) -> None:
        if stream.request_id:
            with self.by_id_lock:
                streams = self.by_id.get(stream.request_id, [])
                if stream in streams:
                    streams.remove(stream)
                if not streams:
                    self.by_id.pop(stream.request_id, None)

    def _stop(self, request_id: str) -> None:
        """A stop request: every request in flight with this id stops at its next step (none is
        fine: it may have finished meanwhile)."""
        if not request_id:
            return
        with self.by_id_lock:
            for stream in self.by_id.get(request_id, []):
                stream.stop_requested = True

    def exit_stub(self, why: str) -> None:
        """A fatal device error: every later request would fail while the stub looks alive, so end
        the stub (after the other requests of this step got their errors) and let the watchdog
        reload the model."""
        if getattr(self, "_exiting", False):
            return
        self._exiting = True
        self.pb.Logger.log_error(f"{self.name}: fatal device error, exiting the stub for a reload: {why}")
        threading.Timer(0.5, os._exit, (70,)).start()

    def finalize(self) -> None:
        # cancels what is still running; each request gets its final response
        self.background.shutdown()
