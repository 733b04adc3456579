"""The serving watchdog: a model that is READY but failing is reloaded, and said so.

Triton 2.51 never restarts a python stub that died: the model stays READY and every request
fails with "Stub process '<instance>' is not healthy" (reference/triton-cpu.md §8). The
watchdog, a thread of the launcher (:class:`trtspec.triton.launch.server.TritonServer`), notices that
two ways:

* **stub liveness** (every ``interval_s``): the stub processes of every python model, read from
  ``/proc`` (``procs``); an instance whose stub is gone makes its model unhealthy at once;
* **an end-to-end probe** (every ``probe_every_s``, off with None): a one-token request to each
  entry point (``ensemble``, ``ensemble_baseline``) over a gRPC stream, all at once; an answer
  naming a stub that "is not healthy" makes that model unhealthy. Any other failure (no answer
  within ``probe_timeout_s``, an error) is counted, and an entry point that fails
  ``probe_failures`` probes in a row is acted on: the python models on its path (an ensemble's
  steps and what they call, transitively) whose stub is stopped (``/proc`` state T: alive, but it
  never answers; a dead one is already seen by the liveness check) are SIGKILLed, so that the
  requests they hold end, and reloaded. When no stub there is stopped or gone, which model hangs
  cannot be told: every python model on the path that no answering entry point uses is reloaded,
  and its old stubs still alive ``drain_s`` after the reload are killed. A streak of "queue full"
  answers only (an overloaded server) kills stopped stubs but reloads nothing else;
* **server health** (every ``health_every_s``): gRPC ``ServerLive``; ``probe_failures`` checks in
  a row without an answer within ``health_timeout_s`` is a hung server: a :class:`ServerError`.

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

import contextlib
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
from trtspec.triton.procs import alive, instance_model, is_instance_of, stopped, stubs_of, workers_of

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
# the server turned a request away unserved (trtspec.client.errors.classify: ServerBusy)
_BUSY = re.compile(r"queue full|exceeds maximum queue size|request timeout expired", re.I)


@dataclass(frozen=True)
class WatchdogSettings:
    interval_s: float = 1.0  # stub liveness check
    probe_every_s: float | None = 30.0  # end-to-end probe of the entry points; None: off
    probe_timeout_s: float = 30.0  # a probe that gets no answer within this is a failed probe
    probe_failures: int = 3  # failed probes (or health checks) in a row before the watchdog acts
    health_every_s: float | None = 5.0  # server liveness (gRPC ServerLive); None: off
    health_timeout_s: float = 10.0
    load_timeout_s: float = 300.0  # one reload; a stub that cannot start hangs loading forever
    max_reloads: int = 3  # per model within reload_window_s; more is a crash loop
    reload_window_s: float = 600.0
    drain_s: float = 10.0  # a reloaded callee's old instance may finish its requests this long

    def __post_init__(self):
        for name in ("interval_s", "probe_timeout_s", "load_timeout_s", "reload_window_s", "drain_s",
                     "health_timeout_s"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"watchdog.{name}", getattr(self, name), "must be > 0")
        if self.probe_every_s is not None and self.probe_every_s <= 0:
            raise ConfigError("watchdog.probe_every_s", self.probe_every_s, "must be > 0, or None for no probe")
        if self.health_every_s is not None and self.health_every_s <= 0:
            raise ConfigError("watchdog.health_every_s", self.health_every_s, "must be > 0, or None for no check")
        if self.probe_failures < 1:
            raise ConfigError("watchdog.probe_failures", self.probe_failures, "must be >= 1")
        if self.max_reloads < 1:
            raise ConfigError("watchdog.max_reloads", self.max_reloads, "must be >= 1")


@dataclass(frozen=True)
class WatchdogEvent:
    # "unhealthy" | "reloaded" | "killed_stuck" | "reload_failed" | "probe_failed" | "health_failed" | "gave_up"
    kind: str
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
        self.paths: dict[str, set[str]] = {}  # entry point → the python models a request to it passes
        self._failures: dict[str, list[str]] = {}  # entry point → its failed probes in a row (the errors)
        self._health_failures = 0
        self._server_answers = True
        self._drain: set[str] = set()  # reloaded without a known cause: old stubs killed after drain_s
        self._reloads: dict[str, list[float]] = {}
        self._generation = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_probe = time.monotonic()
        self._last_health = time.monotonic()

    # ---------------------------------------------------------------- lifecycle

    def start(self) -> "Watchdog":
        self.expected = self._instances()
        self.callees = self._callees()
        self.paths = self._paths()
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

    def _paths(self) -> dict[str, set[str]]:
        """Each entry point's python models: an ensemble's steps, what they call, transitively."""
        out: dict[str, set[str]] = {}
        for entry in self.entry_points:
            seen: set[str] = set()
            todo = [entry]
            while todo:
                model = todo.pop()
                if model in seen:
                    continue
                seen.add(model)
                todo += sorted(self.callees.get(model, ()))
                if model not in self.expected:  # no stub: an ensemble, whose steps are the path
                    try:
                        cfg = self.admin.config(model)
                    except Exception:  # noqa: BLE001 - then its path is unknown (nothing to reload)
                        continue
                    todo += [step["model_name"] for step in (cfg.get("ensemble_scheduling") or {}).get("step", ())
                             if step.get("model_name")]
            out[entry] = seen & set(self.expected)
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
        Returns the models reloaded. Raises ServerError when the server no longer answers."""
        if not self.server_answers():
            return []  # a reload would hang too: the health check decides
        unhealthy = self.dead_stubs()
        if self.settings.probe_every_s is not None and \
                time.monotonic() - self._last_probe >= self.settings.probe_every_s:
            self._last_probe = time.monotonic()
            for model, why in self.probe().items():
                unhealthy.setdefault(model, why)
        order: list[str] = []
        for model, why in unhealthy.items():
            self._emit(WatchdogEvent("unhealthy", model, why))
            self._kill_stopped(model, "(Triton calls a stopped stub not healthy, and waits on it for good)")
            for callee in sorted(self.callees.get(model, ())):
                if callee not in unhealthy and callee not in order:
                    self._emit(WatchdogEvent("unhealthy", callee, f"its caller {model} died: a response it sends "
                                                                  "to the dead caller blocks it"))
                    order.append(callee)
        # callees, and the models reloaded without a known cause, may have old instances that hold
        # requests for good: killed after drain_s
        drain = order + sorted(m for m in self._drain if m in unhealthy and m not in order)
        self._drain.clear()
        # an unhealthy model that an unhealthy caller calls goes before that caller too
        called = {c for m in unhealthy for c in self.callees.get(m, ())}
        order += sorted(m for m in unhealthy if m in called and m not in order)
        order += [m for m in unhealthy if m not in order]
        old = {m: {s.pid for s in stubs_of(self.server_pid) if is_instance_of(s.instance, m)} for m in drain}
        for model in order:  # callees first: the new caller must not call a blocked one
            self.reload(model)
        for model in drain:  # then the old, possibly blocked, instances
            self._kill_stuck(model, old[model])
        return order

    def server_answers(self) -> bool:
        """The server health check, when due (else its last outcome). Raises ServerError after
        ``probe_failures`` checks in a row without an answer: a hung server, to be restarted."""
        every = self.settings.health_every_s
        if every is None or time.monotonic() - self._last_health < every:
            return self._server_answers
        self._last_health = time.monotonic()
        timeout = self.settings.health_timeout_s
        try:
            why = None if self.admin.live(timeout) else "it answered: not live"
        except Exception as e:  # noqa: BLE001 - no answer, whatever the reason
            why = _error(e)
        if why is None:
            self._health_failures, self._server_answers = 0, True
            return True
        self._server_answers = False
        if not alive(self.server_pid):
            return False  # it exited: the launcher (serve_forever) says why, from its log
        self._health_failures += 1
        n, limit = self._health_failures, self.settings.probe_failures
        self._emit(WatchdogEvent("health_failed", None, f"tritonserver (pid {self.server_pid}) did not answer its "
                                                        f"health check within {timeout:g} s ({n} of {limit} in a "
                                                        f"row): {why}"))
        if n >= limit:
            raise ServerError(
                f"watchdog: tritonserver (pid {self.server_pid}) answered no health check {n} times in a row "
                f"({timeout:g} s each, {every:g} s apart): it is hung; the watchdog gives up",
                fix="read the tritonserver log; the server is stopped so that it can be restarted")
        return False

    def dead_stubs(self) -> dict[str, str]:
        live = {s.instance for s in stubs_of(self.server_pid)}
        out = {}
        for model, instances in self.expected.items():
            gone = sorted(instances - live)
            if gone:
                out[model] = f"python stub {', '.join(gone)} exited (Triton 2.51 does not restart it)"
        return out

    def probe(self) -> dict[str, str]:
        """One-token request to each entry point, all at once; {model: why} for the models to
        reload: one an answer names unhealthy, and those on the path of an entry point that failed
        ``probe_failures`` probes in a row (:meth:`_unanswering`)."""
        answers = self._probe_all()
        answered = [entry for entry, err in answers.items() if err is None]
        out: dict[str, str] = {}
        for entry, err in answers.items():
            if err is None:
                self._failures.pop(entry, None)
                continue
            m = _NOT_HEALTHY.search(err)
            if m:
                self._failures.pop(entry, None)
                out.setdefault(instance_model(m.group(1)), f"probe of {entry}: {m.group(0)}")
                continue
            streak = self._failures.setdefault(entry, [])
            streak.append(err)
            limit = self.settings.probe_failures
            self._emit(WatchdogEvent("probe_failed", entry, f"{err} ({len(streak)} of {limit} in a row)"))
            self._report("probe_failed", entry)
            if len(streak) >= limit:
                del self._failures[entry]
                for model, why in self._unanswering(entry, streak, answered).items():
                    out.setdefault(model, why)
        return out

    def _probe_all(self) -> dict[str, str | None]:
        """{entry point: None, or why its probe failed}; the probes run at once, each on a thread."""
        answers: dict[str, str | None] = {}

        def one(entry: str) -> None:
            answers[entry] = self._generate(entry)

        threads = [threading.Thread(target=one, args=(entry,), name=f"trtspec-probe-{entry}", daemon=True)
                   for entry in self.entry_points]
        for t in threads:
            t.start()
        deadline = time.monotonic() + self.settings.probe_timeout_s + 30  # a config call of its own, a close
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        return {entry: answers.get(entry, f"no answer within {self.settings.probe_timeout_s:g} s")
                for entry in self.entry_points}

    def _unanswering(self, entry: str, streak: list[str], answered: list[str]) -> dict[str, str]:
        """What to reload for an entry point that failed ``probe_failures`` probes in a row:
        {model: why}. Its python models whose stub is stopped are killed first (a stopped stub is
        alive, so Triton waits on it for good: the requests it holds would never end, nor would its
        old instance unload). With none stopped or gone, every model of its path that no answering
        entry point uses (all of them if that leaves none), their old stubs killed after drain_s."""
        head = f"{entry} failed {len(streak)} probes in a row (last: {streak[-1]})"
        path = self.paths.get(entry, set())
        killed = {model: self._kill_stopped(model, f"while {entry} answered nothing") for model in sorted(path)}
        if any(killed.values()):
            return {model: f"{head}; its stopped process(es) {pids} are killed" for model, pids in killed.items() if pids}
        if not path:
            log.warning("watchdog: %s; its models are unknown, nothing to reload", head)
            return {}
        if path & set(self.dead_stubs()):
            return {}  # a stub died meanwhile: the liveness check reloads it at once
        if all(_BUSY.search(err) for err in streak):
            log.warning("watchdog: %s; the server turns requests away (queue full): overloaded, not stuck", head)
            return {}
        healthy = set().union(*(self.paths.get(a, set()) for a in answered))
        models = (path - healthy) or path
        self._drain |= models
        return {m: f"{head}; no stub of its path is stopped or gone, so which one hangs cannot be told: every "
                   f"python model on it{' that no answering entry point uses' if models != path else ''} is "
                   "reloaded" for m in sorted(models)}

    def _kill_stopped(self, model: str, when: str) -> list[int]:
        """SIGKILL ``model``'s stopped stubs (and stopped engine workers of its stubs); the pids
        killed. A stopped stub is alive, so Triton waits on it for good (2.51 calls it "not
        healthy", but the requests it holds never end and its old instance never unloads); a
        stopped worker leaves its stub healthy and answering nothing. Killed, the router ends the
        requests relayed to the dead engine with an error, and a stub whose worker died fails its
        requests and exits."""
        stubs = [s for s in stubs_of(self.server_pid) if s.model == model]
        workers = {s.pid: [w for w in workers_of(s.pid) if stopped(w)] for s in stubs}
        pids = sorted({s.pid for s in stubs if stopped(s.pid)} | {w for ws in workers.values() for w in ws})
        if not pids:
            return []
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self._emit(WatchdogEvent("killed_stuck", model, f"process(es) {pids} of its stub(s) were stopped (state T) "
                                                        f"{when}: killed, so that the requests they held end"))
        exiting = [stub for stub, ws in workers.items() if ws]  # a stub whose worker died exits by itself
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline and any(alive(p) for p in pids + exiting):
            time.sleep(0.05)
        return pids

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

    def live(self, timeout: float) -> bool:
        return bool(self._c().is_server_live(headers=self._headers(), client_timeout=timeout))

    def close(self) -> None:
        with self._lock:
            if self._grpc is not None:
                self._grpc.close()
                self._grpc = None
