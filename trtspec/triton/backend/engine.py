"""The ``tensorrt_llm`` python model of the torch runtime: our engine behind the tensorrtllm
backend's tensors.

``initialize`` starts the engine from the RuntimeSpec JSON beside the model: by default in a
worker process of its own (:class:`~trtspec.triton.backend.worker.WorkerEngine`, serving.engine_process
worker), else as a :class:`BackgroundEngine` thread of this stub (thread); both batch continuously.
Only thread mode imports torch here (lazily): a worker-mode stub parses requests with the
torch-free :class:`~trtspec.sampling.Sampling` and loads neither torch nor weights
(tests/unit/test_layers.py checks it).
``execute`` only parses and submits; responses are sent as the engine's events arrive, one per
engine step when streaming, else one with every token. Every response carries the cumulative acceptance counters; the final one also
``perf_json`` (RequestStats.to_dict()). A client that went away cancels its request at the next
step, and so does a ``stop`` request carrying the same request id (how the ensemble's
cancellations get here: ``trtspec.triton.backend.cancel``).
"""

from __future__ import annotations

import inspect
import json
import os
import pathlib
import threading
import time
from dataclasses import replace

import numpy as np

from trtspec.errors import TrtspecError
from trtspec.triton.backend.common import (
    Metrics,
    input_array,
    model_parameters,
    request_limits,
    resident_bytes,
    scalar,
    send_error,
)
from trtspec.triton.backend.cancel import STOP_INPUT
from trtspec.triton.backend.requests import PERF_OUTPUTS, GenerationRequest, RequestInputError, parse_generation
from trtspec.speculative.kernels import wo_cpu_status
from trtspec.speculative.spec import RuntimeSpec
from trtspec.triton.access import secret_from_env, verify_stop_id
from trtspec.triton.backend.guard import check_draft_ids, check_sizes, is_fatal_device_error
from trtspec.triton.backend.coalesce import coalesced
from trtspec.triton.backend.worker import WorkerEngine

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
        ("trtspec_draft_len", "Draft length the engine chose per target pass, averaged per request "
         "(runtime.adaptive.policy; 0 = ordinary decoding)", "HISTOGRAM", tuple(x - 1 for x in al_buckets), {}),
        ("trtspec_draft_seconds", "Time spent drafting, per request", "HISTOGRAM", SECONDS_BUCKETS, {}),
        ("trtspec_verify_seconds", "Time spent in target verification passes, per request",
         "HISTOGRAM", SECONDS_BUCKETS, {}),
        ("trtspec_queue_seconds", "Delay from submission to the request's prefill", "HISTOGRAM", SECONDS_BUCKETS, {}),
        ("trtspec_tokens_per_second", "Decode speed per request (generated / decode time)",
         "HISTOGRAM", TOKENS_PER_S_BUCKETS, {}),
        ("trtspec_time_to_first_token_seconds", "Submission to the first token, per request (engine side)",
         "HISTOGRAM", SECONDS_BUCKETS, {}),
        ("trtspec_inter_token_latency_seconds", "(last token - first token) / (tokens - 1), per request (engine side)",
         "HISTOGRAM", SECONDS_BUCKETS, {}),
        ("trtspec_resident_memory_bytes", "Resident memory of the model's process", "GAUGE", None, {}),
        ("trtspec_inflight_requests", "Requests queued or generating", "GAUGE", None, {}),
    ]


def policy_metric_specs(max_batch_size: int, max_draft_len: int) -> list[tuple]:
    """The goodput policy's series, one per (batch size, draft length): what it chose and what it
    expects each step to cost (runtime.adaptive.policy goodput; docs/serving.md)."""
    out = []
    for b in range(1, max_batch_size + 1):
        for k in range(max_draft_len + 1):
            labels = {"batch": str(b), "draft_len": str(k)}
            out += [
                ("trtspec_policy_steps_total", "Engine steps the goodput policy ran at this batch size and "
                 "draft length (0 = ordinary decoding)", "COUNTER", None, labels),
                ("trtspec_policy_verify_seconds", "Seconds the goodput policy expects a verify pass of this "
                 "batch size and draft length to take (measured; 0 before it has an estimate)", "GAUGE", None, labels),
                ("trtspec_policy_draft_seconds", "Seconds the goodput policy expects drafting this many tokens "
                 "for this batch size to take (measured; 0 before it has an estimate)", "GAUGE", None, labels),
            ]
    return out


class PolicyMetrics:
    """Turns the cumulative view a finished request carries (Engine.policy_view) into metric ops:
    counters move by what changed since the last view; the prices are set."""

    def __init__(self):
        self.seen: dict[tuple[int, int], int] = {}
        self.lock = threading.Lock()

    def ops(self, view: dict | None) -> list[tuple]:
        if not view:
            return []
        out = []
        with self.lock:
            for (b, k), n in view["steps"].items():
                delta = n - self.seen.get((b, k), 0)
                if delta > 0:
                    self.seen[(b, k)] = n
                    out.append(("increment", "trtspec_policy_steps_total", delta, {"batch": str(b), "draft_len": str(k)}))
        for name, key in (("trtspec_policy_verify_seconds", "verify_s"), ("trtspec_policy_draft_seconds", "draft_s")):
            for (b, k), v in view[key].items():
                if v is not None:
                    out.append(("set", name, float(v), {"batch": str(b), "draft_len": str(k)}))
        return out


def finished_metric_ops(stats, cancelled: bool = False, rss: int | None = None) -> list[tuple]:
    ops = [
        ("increment", "trtspec_draft_tokens_total", stats.drafted, {}),
        ("increment", "trtspec_accepted_tokens_total", stats.accepted, {}),
        ("increment", "trtspec_generated_tokens_total", stats.generated, {}),
        ("increment", "trtspec_requests_finished_total", 1, {}),
        ("observe", "trtspec_draft_seconds", stats.draft_s, {}),
        ("observe", "trtspec_verify_seconds", stats.verify_s, {}),
        ("observe", "trtspec_queue_seconds", stats.queue_s, {}),
        ("set", "trtspec_resident_memory_bytes", rss or resident_bytes(), {}),
        ("increment", "trtspec_inflight_requests", -1, {}),
    ]
    if cancelled:
        ops.append(("increment", "trtspec_requests_cancelled_total", 1, {}))
    if stats.steps:
        ops.append(("observe", "trtspec_acceptance_length", stats.acceptance_length, {}))
        ops.append(("observe", "trtspec_draft_len", stats.mean_draft_len, {}))
    if stats.generated:
        ops.append(("observe", "trtspec_tokens_per_second", stats.tokens_per_s, {}))
        ops.append(("observe", "trtspec_time_to_first_token_seconds", stats.ttft_s, {}))
    if stats.generated > 1:
        # (last token − first token) / (tokens − 1), as GenAI-Perf's ITL
        ops.append(("observe", "trtspec_inter_token_latency_seconds",
                    max(stats.total_s - stats.ttft_s, 0.0) / (stats.generated - 1), {}))
    return ops


def response_tensors(pb, tokens: list[int], stats, served_by: str, perf_json: str, *, logprobs=None,
                     cum_log_prob: float = 0.0, sequence_index: int = 0, times: dict | None = None) -> list:
    """The tensorrtllm backend's outputs for one response (batch 1, beam 1) plus trtspec's extras.

    ``logprobs``: this response's tokens' log-probs (output_log_probs) and ``cum_log_prob`` their
    running sum; ``times``: the perf outputs (arrival_time_ns …, kv_cache_*), all sent every time."""
    lp = np.array(logprobs or [], dtype=np.float32).reshape(1, 1, -1)
    times = times or {}
    return [
        pb.Tensor("output_ids", np.array(tokens, dtype=np.int32).reshape(1, 1, -1)),
        pb.Tensor("sequence_length", scalar(len(tokens), np.int32)),
        pb.Tensor("acceptance_rate", scalar(stats.acceptance_rate, np.float32)),
        pb.Tensor("total_accepted_draft_tokens", scalar(stats.accepted, np.int32)),
        pb.Tensor("total_draft_tokens", scalar(stats.drafted, np.int32)),
        pb.Tensor("cum_log_probs", scalar(cum_log_prob, np.float32)),
        pb.Tensor("output_log_probs", lp),
        pb.Tensor("batch_index", scalar(0, np.int32)),
        pb.Tensor("sequence_index", scalar(sequence_index, np.int32)),
        *(pb.Tensor(name, scalar(times.get(name, 0), np.int32 if name.startswith("kv_") else np.int64))
          for name in PERF_OUTPUTS),
        pb.Tensor("served_by", scalar(served_by, object)),
        pb.Tensor("perf_json", scalar(perf_json, object)),
    ]


class _Group:
    """The n sequences of one request (num_return_sequences): one response sender, closed by the
    last sequence to finish."""

    def __init__(self, n: int):
        self.remaining = n
        self.lock = threading.Lock()
        self.failed = False

    def finish_one(self) -> bool:
        """Count one finished sequence; True for the last one."""
        with self.lock:
            self.remaining -= 1
            return self.remaining == 0


class _Counters:
    """Acceptance counters as the client sees them (see :meth:`_Stream.counters`)."""

    def __init__(self, accepted: int, drafted: int):
        self.accepted, self.drafted = accepted, drafted
        self.acceptance_rate = accepted / drafted if drafted else 0.0


class _Stream:
    """One request's responses, sent from the engine thread."""

    def __init__(self, model: "EngineModel", sender, req: GenerationRequest, request_id: str = "",
                 index: int = 0, group: _Group | None = None):
        self.model, self.sender, self.req, self.request_id = model, sender, req, request_id
        self.index, self.group = index, group or _Group(1)
        self.tokens: list[int] = []  # non-streaming: everything so far
        self.logprobs: list[float] = []  # non-streaming: everything so far
        self.cum_log_prob = 0.0
        # perf outputs (NVIDIA's return_perf_metrics), wall clock in ns
        self.arrival_ns = time.time_ns()
        self.first_token_ns = 0
        self.last_token_ns = 0
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

    def times(self, stats) -> dict:
        return {
            "arrival_time_ns": self.arrival_ns,
            "first_scheduled_time_ns": self.arrival_ns + int(stats.queue_s * 1e9),
            "first_token_time_ns": self.first_token_ns,
            "last_token_time_ns": self.last_token_ns,
            "kv_cache_alloc_new_blocks": 1,  # one contiguous KV slot per request
            "kv_cache_reused_blocks": 0,
            "kv_cache_alloc_total_blocks": 1,
        }

    def _tensors(self, tokens: list[int], logprobs: list[float], counters, perf: str, stats) -> list:
        return response_tensors(self.model.pb, tokens, counters, self.model.served_by, perf, logprobs=logprobs,
                                cum_log_prob=self.cum_log_prob, sequence_index=self.index, times=self.times(stats))

    def on_event(self, ev) -> bool | None:
        pb = self.model.pb
        if ev.finished:
            self.model.forget(self)
        if ev.finish_reason and ev.finish_reason.startswith("error"):
            self.group.finish_one()
            if not self.group.failed:  # the first failing sequence answers (and closes) the request
                self.group.failed = True
                send_error(pb, self.sender, f"generation failed: {ev.finish_reason[len('error: '):]}",
                           invalid_argument=False)
            self.model.metrics.apply([("increment", "trtspec_inflight_requests", -1, {})])
            if is_fatal_device_error(ev.finish_reason):
                self.model.exit_stub(ev.finish_reason)
            return None
        if self.group.failed:
            if ev.finished:
                self.group.finish_one()
                self.model.metrics.apply(finished_metric_ops(ev.stats, True, getattr(ev, "rss", None)))
            return False
        if ev.new_tokens:
            self.last_token_ns = time.time_ns()
            self.first_token_ns = self.first_token_ns or self.last_token_ns
        new_lp = list(ev.new_logprobs or [])
        self.cum_log_prob += float(sum(new_lp))
        if self.first_draft is not None and ev.stats.generated == len(ev.new_tokens) and ev.new_tokens:
            self.first_accepted = int(ev.new_tokens[0] == self.first_draft)
        counters = self.counters(ev.stats)
        perf = self.perf_json(ev.stats) if ev.finished else ""
        if ev.finished:  # before the final response: a client that reads /metrics next sees this request
            self.model.metrics.apply(finished_metric_ops(ev.stats, ev.finish_reason == "cancelled",
                                                         getattr(ev, "rss", None))
                                     + self.model.policy_metrics.ops(self.model.policy_view(ev)))
        final = ev.finished and self.group.finish_one()
        flags = pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL if final else 0
        if self.req.streaming:  # new tokens only, never the prompt (as TRT-LLM streams)
            if ev.new_tokens or ev.finished:
                tensors = self._tensors(ev.new_tokens, new_lp, counters, perf, ev.stats)
                self.sender.send(pb.InferenceResponse(output_tensors=tensors), flags=flags)
        else:
            self.tokens.extend(ev.new_tokens)
            self.logprobs.extend(new_lp)
            if ev.finished:
                ids = self.tokens if self.req.exclude_input_in_output else self.req.input_ids + self.tokens
                tensors = self._tensors(ids, self.logprobs, counters, perf, ev.stats)
                self.sender.send(pb.InferenceResponse(output_tensors=tensors), flags=flags)
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

        p = model_parameters(args)
        self.name = args["model_name"]
        self.served_by = p.get("served_by", "speculative")
        cfg = json.loads(args["model_config"])
        self.decoupled = bool(cfg.get("model_transaction_policy", {}).get("decoupled", False))
        # NVIDIA's model parameter: whether output_ids leave out the prompt when a request does not say
        self.exclude_input_default = p.get("exclude_input_in_output", "true").lower() == "true"
        spec_path = pathlib.Path(args["model_repository"]) / args["model_version"] / p["runtime_spec"]
        spec = RuntimeSpec.from_json(spec_path.read_text())
        max_queue = int(p.get("max_queue_size") or 0) or 1024
        self.engine_process = p.get("engine_process", "thread")
        # serving.stream_interval: one streaming response per N engine steps (backend.coalesce)
        self.stream_interval = max(1, int(p.get("stream_interval") or 1))
        if self.engine_process == "worker":
            # the engine in its own process (trtspec.triton.backend.worker): weights load there only
            self.engine = None
            self.background = WorkerEngine(spec_path.read_text(), max_queue=max_queue, on_death=self.worker_died)
            vocab_size, max_seq_len = self.background.info["vocab_size"], self.background.info["max_seq_len"]
            device = f"{self.background.info['device']}, worker process {self.background.pid}"
        else:
            from trtspec.speculative.engine import BackgroundEngine  # lazy: torch, in thread mode only (a worker-mode stub loads none)
            from trtspec.speculative.runtime import build_engine  # lazy: as above

            self.engine = build_engine(spec)
            self.background = BackgroundEngine(self.engine, max_queue=max_queue)
            vocab_size, max_seq_len, device = self.engine.target.args.vocab_size, self.engine.max_seq_len, self.engine.device
        # the lead adds external drafts to submit(); until then draft_input_ids is refused clearly
        self.external_drafts = "draft_tokens" in inspect.signature(self.background.submit).parameters
        # request id → its streams in flight, for stop requests (ids are the client's: may repeat)
        self.by_id: dict[str, list[_Stream]] = {}
        self.by_id_lock = threading.Lock()
        # what a request may send (trtspec.triton.backend.guard): checked before anything is converted
        self.vocab_size = int(vocab_size)
        self.max_draft_len = int(spec.max_draft_len)
        self.max_seq_len = int(max_seq_len)
        # the deployment's per-request limits, bounded by what this engine itself can take
        lim = request_limits(p)
        self.limits = replace(lim, vocab_size=self.vocab_size, max_seq_len=min(lim.max_seq_len, self.max_seq_len))
        self.secret = secret_from_env()  # stop requests must be signed with it (trtspec.triton.access)
        self.metrics = Metrics(self.pb, self.name, args["model_version"])
        self.metrics.declare(engine_metric_specs(spec.max_draft_len if spec.method != "none" else 0))
        self.policy_metrics = PolicyMetrics()
        adaptive = spec.runtime.adaptive
        if spec.method != "none" and adaptive.enabled and adaptive.policy == "goodput":
            self.metrics.declare(policy_metric_specs(spec.limits.max_batch_size, spec.max_draft_len))
        self.pb.Logger.log_info(
            f"{self.name}: torch runtime ready (method {spec.method}, target {spec.target}, "
            f"max_batch_size {spec.limits.max_batch_size}, device {device}"
            + (f", engine loop: {self.background.threads['threads']} torch thread(s) of "
               f"{self.background.threads['configured']}, the faster here" if self.background.threads else "")
            + (f", INT4/INT8 layers on {kernels}" if (kernels := self._cpu_kernels()) else "")
            + ")")
        if self.background.warm_up_error:
            self.pb.Logger.log_warn(f"{self.name}: the draft's warm-up in the engine thread failed "
                                    f"({self.background.warm_up_error}); the first requests compile it")

    def policy_view(self, ev) -> dict | None:
        """The goodput policy's view a finished event carries (worker mode), or the engine's own
        (thread mode: this runs on the engine's thread)."""
        view = getattr(ev, "policy", None)
        if view is None and self.engine is not None:
            view = self.engine.policy_view()
        return view

    def _cpu_kernels(self) -> str | None:
        """Which weight-only kernels the engine's quantized CPU layers run on (None: none asked)."""
        if self.engine_process == "worker":
            return self.background.info.get("cpu_kernels")
        return wo_cpu_status(if_used=True)

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
            if self.decoupled:
                sender.send(flags=self.pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            else:  # a unary request needs a response
                sender.send(self.pb.InferenceResponse(output_tensors=[]), flags=self.pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            return
        try:
            get = lambda name: input_array(self.pb, request, name)  # noqa: E731
            check_sizes(get, max_input_ids=self.max_seq_len, max_draft_len=self.max_draft_len)
            req = parse_generation(get, exclude_input_default=self.exclude_input_default, limits=self.limits)
            check_draft_ids(req.draft_input_ids, vocab_size=self.vocab_size, max_draft_len=self.max_draft_len)
            if not self.decoupled and req.streaming:
                raise RequestInputError("streaming=true needs a decoupled model; this one answers one response "
                                        "per request (serving.decoupled: false)", fix="send streaming=false")
            if not self.decoupled and req.num_return_sequences > 1:
                raise RequestInputError(f"num_return_sequences={req.num_return_sequences} needs a decoupled model "
                                        "(one response per sequence)", fix="send 1, or serve with serving.decoupled: true")
            kwargs = {}
            if req.draft_input_ids:
                if not self.external_drafts:
                    raise RequestInputError("draft_input_ids: this engine cannot verify external drafts",
                                            fix="omit draft_input_ids")
                if req.num_return_sequences > 1:
                    raise RequestInputError("draft_input_ids with num_return_sequences > 1",
                                            fix="send one sequence per request with external drafts")
                if len(req.draft_input_ids) > 1:
                    kwargs["draft_tokens"] = req.draft_input_ids[1:]  # the first is checked by _Stream
            n = req.num_return_sequences
            # n sequences: one engine request each; a seeded request gets seeds seed, seed+1, …
            params = [req.sequence_sampling(i) for i in range(n)]
            group = _Group(n)
            streams = [_Stream(self, sender, req, request.request_id(), i, group) for i in range(n)]
            if self.engine_process == "worker":  # the worker coalesces before its frames cross
                kwargs["coalesce"] = (self.stream_interval, req.streaming)
            for stream, sp in zip(streams, params):
                self.metrics.apply([("increment", "trtspec_inflight_requests", 1, {})])
                self._remember(stream)
                on_event = stream.on_event if self.engine_process == "worker" else \
                    coalesced(stream.on_event, self.stream_interval, req.streaming)
                try:
                    self.background.submit(req.input_ids, sp, on_event, **kwargs)
                except BaseException:
                    self.forget(stream)
                    self.metrics.apply([("increment", "trtspec_inflight_requests", -1, {})])
                    group.failed = True  # those already submitted stop at their next step, silently
                    raise
        except TrtspecError as e:
            send_error(self.pb, sender, f"{self.name}: {e}")
        except Exception as e:  # noqa: BLE001 - one bad request must not take the model down
            self.pb.Logger.log_error(f"{self.name}: internal error: {type(e).__name__}: {e}")  # the full text
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
        self._end_for_reload(f"fatal device error, exiting the stub for a reload: {why}", 70)

    def worker_died(self, why: str) -> None:
        """The engine worker process died (every request in flight already got an error): end the
        stub too, so the watchdog reloads the model as it does for a dead stub."""
        if not getattr(self, "_finalizing", False):
            self._end_for_reload(f"{why}; exiting the stub for a reload", 71)

    def _end_for_reload(self, message: str, code: int) -> None:
        """Log ``message`` and exit the stub with ``code`` half a second later (once)."""
        if getattr(self, "_exiting", False):
            return
        self._exiting = True
        self.pb.Logger.log_error(f"{self.name}: {message}")
        threading.Timer(0.5, os._exit, (code,)).start()

    def finalize(self) -> None:
        # cancels what is still running; each request gets its final response
        self._finalizing = True
        self.background.shutdown()
