"""Glue shared by the python-backend models: parameters, tensors, errors, Prometheus metrics.

Each model class keeps ``pb`` (the ``triton_python_backend_utils`` module) as a class attribute,
set by its thin ``model.py``; nothing here imports it, so the logic imports anywhere.

Metrics (reference/triton-cpu.md §4): the ``MetricFamily`` objects must stay referenced, and
concurrent ``Metric`` calls from several threads crash tritonserver, so every call goes through
one process-wide lock.
"""

from __future__ import annotations

import json
import os
import re
import threading
from typing import Any

import numpy as np

from trtspec.errors import TrtspecError
from trtspec.triton.backend.requests import RequestLimits, parse_generation

# One lock per stub process: metric calls from the execute thread, the engine thread and router
# threads must never overlap.
METRICS_LOCK = threading.Lock()


def model_parameters(args: dict) -> dict[str, str]:
    cfg = json.loads(args["model_config"])
    return {k: v.get("string_value", "") for k, v in cfg.get("parameters", {}).items()}


def input_array(pb, request, name: str) -> np.ndarray | None:
    t = pb.get_input_tensor_by_name(request, name)
    return None if t is None else t.as_numpy()


def output_array(pb, response, name: str) -> np.ndarray | None:
    t = pb.get_output_tensor_by_name(response, name)
    return None if t is None else t.as_numpy()


def scalar(value, dtype) -> np.ndarray:
    """A [1, 1] tensor (batch of one) holding ``value``."""
    if dtype is object:
        v = value if isinstance(value, bytes) else str(value).encode()
        return np.array([[v]], dtype=np.object_)
    return np.array([[value]], dtype=dtype)


# an absolute path of two or more segments (a model folder, a tokenizer, a python file of the stub)
_PATH = re.compile(r"(?<![\w:/])/(?:[\w.+-]+/)+[\w.+-]*")


def redact_paths(message: str) -> str:
    """``message`` without the server's file system paths (``<path>`` instead): an error a client
    reads must not tell it where the server keeps its models or code."""
    return _PATH.sub("<path>", message)


def error_response(pb, message: str, *, invalid_argument: bool = True):
    """An error response; server paths are redacted (a model logs the full error itself)."""
    code = pb.TritonError.INVALID_ARG if invalid_argument else pb.TritonError.INTERNAL
    return pb.InferenceResponse(error=pb.TritonError(redact_paths(message), code))


def send_error(pb, sender, message: str, *, invalid_argument: bool = True) -> None:
    """Answer a decoupled request with an error and close it."""
    sender.send(error_response(pb, message, invalid_argument=invalid_argument),
                flags=pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)


def request_limits(params: dict[str, str]) -> RequestLimits:
    """The deployment's :class:`RequestLimits` from a model's ``request_limits`` parameter."""
    return RequestLimits.from_json(params.get("request_limits"))


def parse_or_reject(pb, request, sender, model_name: str, limits: RequestLimits | None = None):
    """The request's generation inputs, or ``None`` after answering it with an INVALID_ARG error
    that names the input (the model keeps serving)."""
    try:
        return parse_generation(lambda name: input_array(pb, request, name), limits=limits)
    except TrtspecError as e:
        send_error(pb, sender, f"{model_name}: {e}")
        return None


def parsed_requests(pb, requests, model_name: str, limits: RequestLimits | None = None):
    """(response sender, generation inputs) of each request of an ``execute`` batch; a request with
    bad inputs or over ``limits`` is answered INVALID_ARG (naming the input) and skipped."""
    for request in requests:
        sender = request.get_response_sender()
        req = parse_or_reject(pb, request, sender, model_name, limits)
        if req is not None:
            yield sender, req


class RequestThreads:
    """One daemon thread per request, for decoupled models that answer from their own threads;
    ``finalize`` joins the ones still running."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._threads: set[threading.Thread] = set()

    def start(self, target, *args, name: str | None = None) -> None:
        def run() -> None:
            try:
                target(*args)
            finally:
                with self._lock:
                    self._threads.discard(threading.current_thread())

        t = threading.Thread(target=run, daemon=True, name=name)
        with self._lock:
            self._threads.add(t)
        t.start()

    def running(self) -> list[threading.Thread]:
        with self._lock:
            return list(self._threads)

    def join(self, timeout: float = 10) -> None:
        for t in self.running():
            t.join(timeout=timeout)


def resident_bytes() -> int:
    """Current resident set size of this process (not the peak)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class Metrics:
    """Prometheus families for one model, labelled ``model``/``version``; calls serialized."""

    def __init__(self, pb, model: str, version: str):
        self.pb = pb
        self.labels = {"model": model, "version": str(version)}
        self.families: dict[str, Any] = {}  # referenced for the model's lifetime (see module doc)
        self.metrics: dict[tuple, Any] = {}
        self.enabled = hasattr(pb, "MetricFamily")

    def _family(self, name: str, description: str, kind: str):
        if name not in self.families:
            self.families[name] = self.pb.MetricFamily(
                name=name, description=description, kind=getattr(self.pb.MetricFamily, kind))
        return self.families[name]

    def _metric(self, name: str, description: str, kind: str, buckets=None, **labels):
        key = (name, tuple(sorted(labels.items())))
        if key not in self.metrics:
            fam = self._family(name, description, kind)
            kw = {"labels": {**self.labels, **labels}}
            if buckets is not None:
                kw["buckets"] = list(buckets)
            self.metrics[key] = fam.Metric(**kw)
        return self.metrics[key]

    def declare(self, specs: list[tuple]) -> None:
        """Create metrics up front (so /metrics lists them before the first request)."""
        if not self.enabled:
            return
        with METRICS_LOCK:
            for name, description, kind, buckets, labels in specs:
                self._metric(name, description, kind, buckets, **labels)

    def apply(self, ops: list[tuple]) -> None:
        """Run ``(op, name, value, labels)`` operations (op: increment | set | observe) under the lock."""
        if not self.enabled:
            return
        with METRICS_LOCK:
            for op, name, value, labels in ops:
                m = self.metrics.get((name, tuple(sorted(labels.items()))))
                if m is not None:
                    getattr(m, op)(value)
