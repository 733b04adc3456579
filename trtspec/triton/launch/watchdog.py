"""The serving watchdog: a model that is READY but failing is reloaded, and said so.

Triton 2.51 never restarts a python stub that died: the model stays READY and every request
fails with "Stub process '<instance>' is not healthy" (reference/triton-cpu.md §8). The
watchdog, a thread of the launcher (:class:`trtspec.triton.launch.server.TritonServer`), notices that
two ways:

* **stub liveness** (every ``interval_s``): the stub processes of every python model, read from
  ``/proc`` (``procs``); an instance whose stub is gone makes its model unhealthy at once;
* **an end-to-end probe** (every ``probe_every_s``, off with None): a one-token request to each
  entry point (``ensemble``, ``ensemble_baseline``) over a gRPC stream; an answer naming a
  stub that "is not healthy" makes that model unhealthy, any other failure is counted.

A model that calls others over BLS (the router calls the engines) takes them along: when the
caller's stub dies in the middle of a request, the callee's next response to it blocks the
callee's sending thread for good (measured: the torch engine stops serving everyone), so the
callees are reloaded first. Callees are the models a model's config names in its parameters
(``speculative_model``, ``baseline_model``, ``tensorrt_llm_model_name``, ...). A blocked
instance never finishes unloading and never answers the requests it holds, so once the new
instance serves, an old callee stub still alive after ``drain_s`` is killed: the router then
ends the requests it had there with an error instead of leaving them to the clients' deadlines.

An unhealthy model is reloaded through explicit model control (the server runs with
``--model-control-mode=explicit --load-model=*``). A plain ``load`` of an unchanged model is a
no-op in 2.51, and an ``unload`` waits for requests stuck on the dead stub, so the watchdog loads
the model's own config with a changed ``trtspec_reload`` parameter: Triton starts new instances
while the old ones finish unloading. The load is bounded (``load_timeout_s``: a stub that cannot
start hangs loading forever), and a model that needs more than ``max_reloads`` reloads within
``reload_window_s`` is a crash loop: both are a :class:`ServerError` (``trtspec serve`` stops
and exits non-zero, so an orchestrator restarts it).

Each event is logged (logger ``trtspec.watchdog``), passed to ``on_event`` and counted on
Triton's /metrics by the ``trtspec_watchdog`` model the launcher loads from its work folder
(``backend_watchdog``): ``trtspec_watchdog_reloads_total{model}``,
``trtspec_watchdog_reload_failures_total{model}``, ``trtspec_watchdog_probe_failures_total{model}``,
``trtspec_watchdog_last_recovery_seconds{model}``.

The watchdog talks to the server over its gRPC port, as any client (``trtspec.triton.access``):
with the launch's secret as a header on its repository calls and as the ``SECRET`` input of its
reports, over TLS when the server has it (``serving.tls``), with the required header when the
server asks for one (``serving.require_header``). HTTP may be off or loopback-only.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import re
import signal
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Callable

import numpy as np

from trtspec.errors import ConfigError, ServerError
from trtspec.triton.access import SECRET_INPUT, InternalClient, grpc_headers
from trtspec.triton.procs import alive, instance_model, is_instance_of, stubs_of

# the model that counts watchdog events on /metrics (templates/trtspec_watchdog; the launcher loads it)
WATCHDOG_MODEL = "trtspec_watchdog"


def watchdog_config(template: str, models: list[str] | tuple[str, ...] = ()) -> str:
    """The watchdog model's config.pbtxt with the names it may count (its label values)."""
    listed = ",".join(sorted(set(models)))
    return template.replace("instance_group", f'parameters {{ key: "models" value: {{ string_value: "{listed}" }} }}\n'
                                              "instance_group", 1)

log = logging.getLogger("trtspec.watchdog")

RELOAD_PARAMETER = "trtspec_reload"
_NOT_HEALTHY = re.compile(r"Stub process '([^']+)' is not healthy")


@dataclass(frozen=True)
class WatchdogSettings:
    interval_s: float = 1.0  # stub liveness check
    probe_every_s: float | None = 30.0  # end-to-end probe of the entry points; None: off
    probe_timeout_s: float = 60.0
    load_timeout_s: float = 300.0  # one reload; a stub that cannot start hangs loading forever
    max_reloads: int = 3  # per model within reload_window_s; more is a crash loop
    reload_window_s: float = 600.0
    drain_s: float = 10.0  # a reloaded callee's old instance may finish its requests this long

    def __post_init__(self):
        for name in ("interval_s", "probe_timeout_s", "load_timeout_s", "reload_window_s", "drain_s"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"watchdog.{name}", getattr(self, name), "must be > 0")
        if self.probe_every_s is not None and self.probe_every_s <= 0:
            raise ConfigError("watchdog.probe_every_s", self.probe_every_s, "must be > 0, or None for no probe")
        if self.max_reloads < 1:
            raise ConfigError("watchdog.max_reloads", self.max_reloads, "must be >= 1")


@dataclass(frozen=True)
class WatchdogEvent:
    kind: str  # "unhealthy" | "reloaded" | "killed_stuck" | "reload_failed" | "probe_failed" | "gave_up"
    model: str | None
    detail: str
    seconds: float | None = None  # reloaded: detection → loaded again
    at: float = field(default_factory=time.time)

    def to_dict(self) -> dict:
        return asdict(self)

    def __str__(self) -> str:
        took = f" ({self.seconds:.1f} s)" if self.seconds is not None else ""
        return f"watchdog: {self.kind} {self.model or ''}{took}: {self.detail}"


class Watchdog:
    """Watches a started server (``grpc``: its gRPC address, host:port; ``server_pid``: the
    tritonserver process whose children are the stubs). :meth:`start` / :meth:`stop`; ``error``
    is set when it gave up (the server can no longer be trusted)."""

    def __init__(self, grpc: str, server_pid: int, settings: WatchdogSettings | None = None, *,
                 entry_points: tuple[str, ...] = (), on_event: Callable[[WatchdogEvent], None] | None = None,
                 secret: str | None = None, client: InternalClient | None = None):
        self.admin = _Admin(grpc, client or InternalClient(), secret)
        self.secret = secret  # the launch's secret: the repository API and the counters need it
        self.server_pid = server_pid
        self.settings = settings or WatchdogSettings()
        self.entry_points = tuple(entry_points)
        self.on_event = on_event
        self.events: list[WatchdogEvent] = []
        self.error: ServerError | None = None
        self.expected: dict[str, set[str]] = {}  # model → instance names with a stub
        self.callees: dict[str, set[str]] = {}  # model → models it calls (BLS)
        self._reloads: dict[str, list[float]] = {}
        self._generation = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_probe = time.monotonic()

    # ---------------------------------------------------------------- lifecycle

    def start(self) -> "Watchdog":
        self.expected = self._instances()
        self.callees = self._callees()
        self._report("declare", ",".join(sorted(set(self.expected) | set(self.entry_points))))
        self._thread = threading.Thread(target=self._loop, name="trtspec-watchdog", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=self.settings.load_timeout_s + 5)
        self.admin.close()

    def _instances(self) -> dict[str, set[str]]:
        out: dict[str, set[str]] = {}
        for stub in stubs_of(self.server_pid):
            out.setdefault(instance_model(stub.instance), set()).add(stub.instance)
        return out

    def _callees(self) -> dict[str, set[str]]:
        """Which models each python model calls: the other models its parameters name."""
        try:
            names = self.admin.ready_models()
        except Exception as e:  # noqa: BLE001 - without it, reloads are per model only
            log.warning("watchdog: cannot read the repository index: %s", _error(e))
            return {}
        out: dict[str, set[str]] = {}
        for model in self.expected:
            try:
                cfg = self.admin.config(model)
            except Exception:  # noqa: BLE001
                continue
            values = {v.get("string_value") for v in (cfg.get("parameters") or {}).values() if isinstance(v, dict)}
            called = (values & names) - {model}
            if called:
                out[model] = called
        return out

    def _loop(self) -> None:
        while not self._stop.wait(self.settings.interval_s):
            try:
                self.check()
            except ServerError as e:
                self.error = e
                self._emit(WatchdogEvent("gave_up", None, e.message))
                return
            except Exception as e:  # noqa: BLE001 - keep watching
                log.exception("watchdog check failed: %s", e)

    # ---------------------------------------------------------------- one check

    def check(self) -> list[str]:
        """One round: stub liveness, then the probe when due; reloads what is unhealthy.
        Returns the models reloaded."""
        unhealthy = self.dead_stubs()
        if self.settings.probe_every_s is not None and \
                time.monotonic() - self._last_probe >= self.settings.probe_every_s:
            self._last_probe = time.monotonic()
            for model, why in self.probe().items():
                unhealthy.setdefault(model, why)
        order: list[str] = []
        for model, why in unhealthy.items():
            self._emit(WatchdogEvent("unhealthy", model, why))
            for callee in sorted(self.callees.get(model, ())):
                if callee not in unhealthy and callee not in order:
                    self._emit(WatchdogEvent("unhealthy", callee, f"its caller {model} died: a response it sends "
                                                                  "to the dead caller blocks it"))
                    order.append(callee)
        callees = list(order)
        order += [m for m in unhealthy if m not in order]
        old = {m: {s.pid for s in stubs_of(self.server_pid) if is_instance_of(s.instance, m)} for m in callees}
        for model in order:  # callees first: the new caller must not call a blocked one
            self.reload(model)
        for model in callees:  # then the callees' old, possibly blocked, instances
            self._kill_stuck(model, old[model])
        return order

    def dead_stubs(self) -> dict[str, str]:
        live = {s.instance for s in stubs_of(self.server_pid)}
        out = {}
        for model, instances in self.expected.items():
            gone = sorted(instances - live)
            if gone:
                out[model] = f"python stub {', '.join(gone)} exited (Triton 2.51 does not restart it)"
        return out

    def probe(self) -> dict[str, str]:
        """One-token request to each entry point; {model: why} for models named unhealthy."""
        out = {}
        for entry in self.entry_points:
            err = self._generate(entry)
            if err is None:
                continue
            m = _NOT_HEALTHY.search(err)
            if m:
                out.setdefault(instance_model(m.group(1)), f"probe of {entry}: {m.group(0)}")
            else:
                self._emit(WatchdogEvent("probe_failed", entry, err))
                self._report("probe_failed", entry)
        return out

    def _generate(self, entry: str) -> str | None:
        try:
            return self.admin.probe(entry, self.settings.probe_timeout_s)
        except Exception as e:  # noqa: BLE001 - a probe that cannot even be sent is a failed probe
            return _error(e)

    # ---------------------------------------------------------------- reload

    def reload(self, model: str) -> float:
        """Reload ``model`` (bounded); returns the seconds it took. Raises ServerError when it
        fails, times out, or the model is in a crash loop."""
        now = time.monotonic()
        recent = [t for t in self._reloads.get(model, []) if now - t < self.settings.reload_window_s]
        if len(recent) >= self.settings.max_reloads:
            raise ServerError(
                f"model '{model}' failed {len(recent) + 1} times within {self.settings.reload_window_s:.0f} s "
                "(its python stub keeps dying); the watchdog gives up",
                fix="read the tritonserver log for the stub's last words (out of memory? a native crash?)")
        self._reloads[model] = recent + [now]
        t0 = time.monotonic()
        self._generation += 1
        try:
            cfg = self.admin.config(model)
            cfg.setdefault("parameters", {})[RELOAD_PARAMETER] = {"string_value": str(self._generation)}
            self.admin.load(model, cfg, timeout=self.settings.load_timeout_s)
        except TimeoutError:
            self._failed(model, f"not loaded again within {self.settings.load_timeout_s:.0f} s (a python stub "
                                "that cannot start hangs model loading forever)")
        except Exception as e:  # noqa: BLE001 - the server's answer, said in the event
            gone = not alive(self.server_pid)  # then not the reload's fault: the server's log says why
            self._failed(model, f"not reloaded: tritonserver (pid {self.server_pid}) exited ({_error(e)})" if gone
                         else f"reload failed: {_error(e)}")
        took = time.monotonic() - t0
        live = self._instances()
        self.expected[model] = live.get(model, set())
        self._emit(WatchdogEvent("reloaded", model, "loaded again through explicit model control", took))
        self._report("reload", model, took)
        return took

    def _kill_stuck(self, model: str, old: set[int]) -> None:
        """Old instances of a reloaded callee get ``drain_s`` to finish; then their stubs are killed."""
        deadline = time.monotonic() + self.settings.drain_s
        while time.monotonic() < deadline and any(alive(p) for p in old):
            if self._stop.wait(0.2):
                return
        stuck = sorted(p for p in old if alive(p))
        for pid in stuck:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if stuck:
            self._emit(WatchdogEvent("killed_stuck", model, f"old instance stub(s) {stuck} still held requests "
                                                            f"{self.settings.drain_s:g} s after the reload"))

    def _failed(self, model: str, why: str):
        self._emit(WatchdogEvent("reload_failed", model, why))
        self._report("reload_failed", model)
        raise ServerError(f"watchdog: model '{model}' {why}",
                          fix="read the tritonserver log; the server is stopped so that it can be restarted")

    # ---------------------------------------------------------------- plumbing

    def _report(self, event: str, models: str, seconds: float = 0.0) -> None:
        """Count an event on /metrics through the trtspec_watchdog model (best effort)."""
        if not models:
            return
        try:
            self.admin.report(event, models, seconds)
        except Exception as e:  # noqa: BLE001 - the counter is a report, not the watchdog's job
            log.warning("watchdog: could not count %s for %s on /metrics: %s", event, models, _error(e))

    def _emit(self, ev: WatchdogEvent) -> None:
        self.events.append(ev)
        level = logging.ERROR if ev.kind in ("reload_failed", "gave_up") else logging.WARNING
        log.log(level, "%s", ev)
        if self.on_event is not None:
            try:
                self.on_event(ev)
            except Exception:  # noqa: BLE001 - a reporting callback must not stop the watchdog
                log.exception("watchdog on_event callback failed")


def _error(e: BaseException) -> str:
    message = getattr(e, "message", None)
    return (message() if callable(message) else None) or str(e)


class _Admin:
    """The watchdog's calls to the server, over gRPC (tritonclient): model configs, the
    repository index and load (with the launch's secret), one-token probes, its own counters."""

    def __init__(self, url: str, client: InternalClient, secret: str | None):
        self.url, self.client, self.secret = url, client, secret
        self._grpc = None
        self._lock = threading.Lock()

    def _c(self):
        with self._lock:
            if self._grpc is None:
                import tritonclient.grpc as grpcclient

                self._grpc = grpcclient.InferenceServerClient(self.url, **self.client.grpc_kwargs())
            return self._grpc

    def _headers(self, admin: bool = False) -> dict[str, str]:
        return self.client.grpc_headers(grpc_headers(self.secret) if admin else None)

    def config(self, model: str) -> dict:
        return self._c().get_model_config(model, headers=self._headers(), as_json=True, client_timeout=30)["config"]

    def ready_models(self) -> set[str]:
        index = self._c().get_model_repository_index(headers=self._headers(admin=True), as_json=True,
                                                     client_timeout=30)
        return {m["name"] for m in index.get("models", ()) if m.get("state") == "READY"}

    def load(self, model: str, config: dict, *, timeout: float) -> None:
        from tritonclient.utils import InferenceServerException

        try:
            self._c().load_model(model, headers=self._headers(admin=True), config=json.dumps(config),
                                 client_timeout=timeout)
        except InferenceServerException as e:
            if "deadline" in (e.message() or "").lower() or (e.status() or "").endswith("DEADLINE_EXCEEDED"):
                raise TimeoutError(e.message()) from None
            raise

    def report(self, event: str, models: str, seconds: float) -> None:
        import tritonclient.grpc as grpcclient

        tensors = (("EVENT", np.array([event.encode()], dtype=np.object_), "BYTES"),
                   ("MODEL", np.array([models.encode()], dtype=np.object_), "BYTES"),
                   ("SECONDS", np.array([seconds], dtype=np.float32), "FP32"),
                   (SECRET_INPUT, np.array([(self.secret or "").encode()], dtype=np.object_), "BYTES"))
        inputs = []
        for name, value, dtype in tensors:
            t = grpcclient.InferInput(name, [1], dtype)
            t.set_data_from_numpy(value)
            inputs.append(t)
        self._c().infer(WATCHDOG_MODEL, inputs, headers=self._headers(), client_timeout=10)

    def probe(self, entry: str, timeout: float) -> str | None:
        """One token from ``entry`` on a stream of its own; None, or the error it answered."""
        import tritonclient.grpc as grpcclient

        shape = [1, 1] if int(self.config(entry).get("max_batch_size") or 0) > 0 else [1]
        answers: queue.Queue = queue.Queue()
        c = grpcclient.InferenceServerClient(self.url, **self.client.grpc_kwargs())
        try:
            c.start_stream(callback=lambda result, error: answers.put(error), headers=self._headers())
            text = grpcclient.InferInput("text_input", shape, "BYTES")
            text.set_data_from_numpy(np.array([b"def"], dtype=np.object_).reshape(shape))
            tokens = grpcclient.InferInput("max_tokens", shape, "INT32")
            tokens.set_data_from_numpy(np.array([1], dtype=np.int32).reshape(shape))
            c.async_stream_infer(entry, [text, tokens])
            try:
                error = answers.get(timeout=timeout)
            except queue.Empty:
                return f"no answer within {timeout:g} s"
            return None if error is None else _error(error)
        finally:
            c.stop_stream(cancel_requests=True)
            c.close()

    def close(self) -> None:
        with self._lock:
            if self._grpc is not None:
                self._grpc.close()
                self._grpc = None
