"""The ``router`` python model (decoupled): speculative or baseline, per request.

``execute`` validates the request, asks :class:`RoutingPolicy` for a path and hands the request to
a thread that calls the chosen generation model and re-streams its responses, adding
``served_by``, the flattened ``output_ids`` and the detokenizer window (see ``detok``). The call
is a gRPC stream to this same server. Triton 2.51's stub builds every BLS response's numpy arrays
without the GIL, which corrupted this stub's heap under load, so BLS ``exec(decoupled=True)`` is
the fallback where gRPC is not available (``TRTSPEC_ROUTER_RELAY``). When the request finishes,
its acceptance totals and timings go back to the policy (rolling acceptance, measured costs).

The generation models of trtspec (torch engine, LLM API, draft-target BLS) mark their final
response with a non-empty ``perf_json``. NVIDIA's tensorrtllm C++ backend has no such output, so
for it the router holds each response until the next arrives and marks the last one final.

Faults and cancellation (docs/reliability.md): every engine request gets its own id, sent on as
``request_key`` so postprocessing can stop it when the client goes away (``cancel``). A monitor
thread watches the engine's stub processes: Triton 2.51 never answers the requests in flight on a
stub that died, so the router ends them with an error at once instead of leaving their clients
waiting.
"""

from __future__ import annotations

import json
import os
import pathlib
import queue
import re
import threading

import numpy as np

from trtspec.triton.backend.common import (
    Metrics,
    RequestThreads,
    error_response,
    model_parameters,
    output_array,
    parsed_requests,
    request_limits,
    scalar,
    send_error,
)
from trtspec.triton.backend.cancel import STOP_INPUT, new_request_id, request_key
from trtspec.triton.backend.detok import DetokWindow
from trtspec.triton.access import InternalClient
from trtspec.triton.procs import child_alive, is_instance_of, stubs_of
from trtspec.triton.backend.requests import (
    ENGINE_OUTPUTS,
    PERF_OUTPUTS,
    TENSORRTLLM_OUTPUTS,
    GenerationRequest,
    engine_inputs,
)
from trtspec.triton.backend.routing import RoutingPolicy

PATHS = ("speculative", "baseline")
MONITOR_EVERY_S = 0.5


class _Aborted(Exception):
    """The relay was ended by the monitor (engine stub gone): stop relaying quietly."""


class _Relay:
    """One request in flight: where it goes and whether it was ended from outside."""

    def __init__(self, sender, model: str, engine_request_id: str, key: str):
        self.sender, self.model, self.engine_request_id, self.key = sender, model, engine_request_id, key
        self.lock = threading.Lock()
        self.done = False  # a final response was sent (by the relay or by the monitor)
        self.engine_pids: frozenset[int] = frozenset()  # the engine's live stubs when it started


class _Item:
    """One response of the generation model, read out of its tensors (``get(name)``: the output
    as numpy, or None when the response lacks it)."""

    __slots__ = ("ids", "acceptance_rate", "accepted", "drafted", "served_by", "perf_json", "index",
                 "cum_log_prob", "logprobs", "times")

    def __init__(self, get, default_served_by: str):
        ids = get("output_ids")
        self.ids = [] if ids is None else [int(x) for x in ids.reshape(-1)]
        idx, cum, lps = get("sequence_index"), get("cum_log_probs"), get("output_log_probs")
        self.index = 0 if idx is None else int(idx.reshape(-1)[0])
        self.cum_log_prob = 0.0 if cum is None or cum.size == 0 else float(cum.reshape(-1)[0])
        self.logprobs = [] if lps is None else [float(x) for x in lps.reshape(-1)]
        self.times = {}
        for name in PERF_OUTPUTS:
            a = get(name)
            self.times[name] = 0 if a is None or a.size == 0 else int(a.reshape(-1)[0])
        ar = get("acceptance_rate")
        acc = get("total_accepted_draft_tokens")
        dr = get("total_draft_tokens")
        sb = get("served_by")
        pj = get("perf_json")
        self.accepted = int(acc.reshape(-1)[0]) if acc is not None else 0
        self.drafted = int(dr.reshape(-1)[0]) if dr is not None else 0
        self.acceptance_rate = float(ar.reshape(-1)[0]) if ar is not None else (
            self.accepted / self.drafted if self.drafted else 0.0)
        self.served_by = sb.reshape(-1)[0].decode() if sb is not None else default_served_by
        self.perf_json = None if pj is None else pj.reshape(-1)[0].decode()


class _EngineError:
    """The generation model answered with an error; ``response()`` makes the client's."""

    def __init__(self, response):
        self.response = response


class ClientPool:
    """gRPC clients of this server, one stream each, reused across requests; over TLS and with
    the required header when the launcher said so (``access.InternalClient``)."""

    def __init__(self, url: str, settings: InternalClient | None = None):
        self.url = url
        self.settings = settings or InternalClient()
        self.headers = self.settings.grpc_headers() or None
        self._free: list = []
        self._lock = threading.Lock()

    def get(self):
        with self._lock:
            if self._free:
                return self._free.pop()
        import tritonclient.grpc as grpcclient

        return grpcclient.InferenceServerClient(self.url, **self.settings.grpc_kwargs())

    def put(self, client) -> None:
        with self._lock:
            self._free.append(client)

    def release(self, client, clean: bool) -> None:
        """End ``client``'s stream: one that ended cleanly goes back to the pool, a broken one
        (or one stopped mid-request: its requests are cancelled) is closed."""
        try:
            client.stop_stream(cancel_requests=not clean)
        except Exception:  # noqa: BLE001 - a broken stream: drop the client
            clean = False
        if clean:
            self.put(client)
        else:
            client.close()

    def close(self) -> None:
        with self._lock:
            clients, self._free = self._free, []
        for c in clients:
            try:
                c.close()
            except Exception:  # noqa: BLE001 - closing at unload
                pass


class Router:
    pb = None  # triton_python_backend_utils, set by model.py

    def initialize(self, args: dict) -> None:
        p = model_parameters(args)
        self.name = args["model_name"]
        self.limits = request_limits(p)
        self.decoupled = bool(json.loads(args["model_config"]).get("model_transaction_policy", {}).get("decoupled"))
        self.models = {"speculative": p.get("speculative_model") or None, "baseline": p["baseline_model"]}
        # which output set each model has: trtspec's (with perf_json) or the tensorrtllm C++ backend's
        self.kinds = {"speculative": p.get("speculative_model_kind", "trtspec"),
                      "baseline": p.get("baseline_model_kind", "trtspec")}
        rate = p.get("min_acceptance_rate", "auto")
        self.policy = RoutingPolicy(
            float(p.get("speculative_fraction", "1.0")),
            min_acceptance_rate=None if rate in ("", "auto") else float(rate),
            window=int(p.get("acceptance_window", "64")),
            probe_every=int(p.get("probe_every", "8")),
            max_draft_len=int(p.get("max_draft_len", "4")),
            has_speculative=self.models["speculative"] is not None,
        )
        self.threads = RequestThreads()
        # which engine models take a stop request (trtspec's torch engine declares the input)
        here = pathlib.Path(args["model_repository"]).parent
        self.stoppable = {m: _declares_input(here / m / "config.pbtxt", STOP_INPUT)
                          for m in self.models.values() if m}
        self.relays: dict[int, _Relay] = {}
        self.relays_lock = threading.Lock()
        # how responses come back from the engine: a gRPC stream to this same server, or BLS.
        # Triton 2.51's stub builds the numpy arrays of every BLS response without the GIL,
        # racing this model's threads (heap corruption under load, docs/reliability.md), so BLS is
        # only the fallback: TRTSPEC_ROUTER_RELAY=bls|grpc|auto (default auto).
        internal = InternalClient.from_env()
        self.relay_mode, why = relay_mode(os.environ.get("TRTSPEC_ROUTER_RELAY", "auto"),
                                           tls=internal.tls is not None)
        self.clients = ClientPool(why, internal) if self.relay_mode == "grpc" else None
        self.pb.Logger.log_info(f"{self.name}: relays engine responses over "
                                f"{'gRPC at ' + why if self.relay_mode == 'grpc' else 'BLS (' + why + ')'}")
        # the engines' stub pids at the last scan (None: none yet); kept while idle
        self.scan: dict[str, frozenset[int]] | None = None
        self.scan_lock = threading.Lock()
        self.closing = threading.Event()
        self.monitor = threading.Thread(target=self._monitor, daemon=True, name=f"{self.name}-monitor")
        self.monitor.start()
        self.metrics = Metrics(self.pb, self.name, args["model_version"])
        self.metrics.declare(metric_specs(self.policy.has_speculative))
        if self.policy.has_speculative:
            self._publish()  # before any request: the recipe's break-even, else unknown (NaN)

    def execute(self, requests):
        for sender, req in parsed_requests(self.pb, requests, self.name, self.limits):
            if not self.decoupled and (req.streaming or req.num_return_sequences > 1):
                what = "stream=true" if req.streaming else f"num_return_sequences={req.num_return_sequences}"
                send_error(self.pb, sender, f"{self.name}: {what} needs a decoupled model; this repository answers "
                                            "one response per request (serving.decoupled: false)",)
                continue
            decision = self.policy.route()
            path = "speculative" if decision.speculative else "baseline"
            self.metrics.apply([("increment", "trtspec_router_requests_total", 1,
                                 {"path": path, "reason": decision.reason})])
            self.threads.start(self._serve, sender, req, path, name=f"{self.name}-request")
        return None

    # ------------------------------------------------------------------ one request

    def _serve(self, sender, req: GenerationRequest, path: str) -> None:
        model = self.models[path]
        rid = new_request_id(self.name)
        relay = _Relay(sender, model, rid, request_key(model, rid) if self.stoppable.get(model) else "")
        with self.scan_lock:
            # the stubs it starts on: the last scan's while each of them still runs as the server's
            # child (a stat read per stub), else a new scan (a reload since, a stub that died). A
            # scan reads every process in /proc: 0.5-1 ms of each request's time to first token
            # when it ran for every request after an idle moment.
            pids = self.scan.get(model) if self.scan is not None else None
            if not pids or not all(child_alive(p, os.getppid()) for p in pids):
                self.scan = self._scan()
            relay.engine_pids = self.scan.get(model, frozenset())
        with self.relays_lock:
            self.relays[id(relay)] = relay
        try:
            self._relay(relay, req, path)
        except _Aborted:
            pass
        except Exception as e:  # noqa: BLE001 - answer this request, keep serving
            try:
                self._close(relay, f"{self.name}: {type(e).__name__}: {e}")
            except Exception:  # noqa: BLE001 - the request may already be closed
                pass
        finally:
            with self.relays_lock:
                self.relays.pop(id(relay), None)

    def _relay(self, relay: _Relay, req: GenerationRequest, path: str) -> None:
        model, kind = self.models[path], self.kinds[path]
        names = list(ENGINE_OUTPUTS if kind == "trtspec" else TENSORRTLLM_OUTPUTS)
        inputs = engine_inputs(req, with_drafts=False)
        if self.relay_mode == "grpc":
            client = self.clients.get()
            clean = False
            try:
                self._relay_items(relay, req, path, self._grpc_items(client, relay, model, inputs, names, path))
                clean = True
            finally:
                self.clients.release(client, clean)  # clean: the engine's stream has ended
        else:
            self._relay_items(relay, req, path, self._bls_items(relay, model, inputs, names, path))

    def _bls_items(self, relay: _Relay, model: str, inputs: dict, names: list, path: str):
        pb = self.pb
        bls = pb.InferenceRequest(model_name=model, inputs=[pb.Tensor(k, v) for k, v in inputs.items()],
                                  requested_output_names=names, request_id=relay.engine_request_id)
        for resp in bls.exec(decoupled=True):
            if resp.has_error():
                err = resp.error()
                yield _EngineError(lambda: pb.InferenceResponse(error=err))
                return
            if pb.get_output_tensor_by_name(resp, "output_ids") is None:
                continue  # an empty response carrying only the final flag
            yield _Item(lambda name, r=resp: output_array(pb, r, name), path)

    def _grpc_items(self, client, relay: _Relay, model: str, inputs: dict, names: list, path: str):
        import tritonclient.grpc as grpcclient
        from tritonclient.utils import np_to_triton_dtype

        q: queue.Queue = queue.Queue()
        client.start_stream(callback=lambda result, error: q.put((result, error)), headers=self.clients.headers)
        tensors = []
        for k, v in inputs.items():
            t = grpcclient.InferInput(k, list(v.shape), np_to_triton_dtype(v.dtype))
            t.set_data_from_numpy(v)
            tensors.append(t)
        client.async_stream_infer(model, tensors, outputs=[grpcclient.InferRequestedOutput(n) for n in names],
                                  request_id=relay.engine_request_id, enable_empty_final_response=True)
        while True:
            try:
                result, error = q.get(timeout=MONITOR_EVERY_S)
            except queue.Empty:
                if relay.done:  # ended by the monitor (the engine's stub is gone)
                    raise _Aborted from None
                continue
            if error is not None:
                message = error.message() if hasattr(error, "message") else str(error)
                invalid = "INVALID_ARG" in str(getattr(error, "status", lambda: "")())
                yield _EngineError(lambda: error_response(self.pb, message, invalid_argument=invalid))
                return
            params = result.get_response().parameters
            final = "triton_final_response" in params and params["triton_final_response"].bool_param
            if result.as_numpy("output_ids") is not None:
                yield _Item(result.as_numpy, path)
            if final:
                return

    def _relay_items(self, relay: _Relay, req: GenerationRequest, path: str, items) -> None:
        """Re-stream the engine's responses (``items``) to the client: one detokenizer window per
        returned sequence; the request ends with the last sequence's final response."""
        model = self.models[path]
        # the prompt's text leads the output when the client asked for it, except when streaming
        # (TRT-LLM never streams the prompt back)
        echo = () if req.exclude_input_in_output or req.streaming else req.input_ids
        windows: dict[int, DetokWindow] = {}
        left = req.num_return_sequences

        def window(item: _Item) -> DetokWindow:
            return windows.setdefault(item.index, DetokWindow(echo))

        pending: _Item | None = None
        last: _Item | None = None
        for item in items:
            if isinstance(item, _EngineError):
                with relay.lock:
                    if relay.done:
                        raise _Aborted
                    relay.done = True
                    relay.sender.send(item.response(), flags=self.pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                return
            if item.perf_json is not None:  # trtspec model: each sequence's final response says so
                seq_final = item.perf_json != ""
                if seq_final:  # update the policy before the client can send its next request
                    left -= 1
                    self._finished(path, item)
                self._send(relay, item, window(item), seq_final, left == 0)
                last = item
                if left == 0:
                    return
            else:  # tensorrtllm backend: hold one back to know which is last
                if pending is not None:
                    self._send(relay, pending, window(pending), False, False)
                pending = item
        if pending is not None:
            self._finished(path, pending)
            self._send(relay, pending, window(pending), True, True)
        elif last is not None:  # closed without a final-marked response: close the stream ourselves
            self._finished(path, last)
            self._send(relay, _empty_like(last), window(last), True, True)
        else:
            raise RuntimeError(f"{model} closed the request without a response")

    def _send(self, relay: _Relay, item: _Item, window: DetokWindow, seq_final: bool, final: bool) -> None:
        """One response to the client: ``seq_final`` ends this sequence's text (postprocessing
        flushes held-back bytes), ``final`` the whole request."""
        pb = self.pb
        ids, ctx = window.next(item.ids)
        tensors = [
            pb.Tensor("output_ids", np.array([item.ids], dtype=np.int32)),
            pb.Tensor("acceptance_rate", scalar(item.acceptance_rate, np.float32)),
            pb.Tensor("total_accepted_draft_tokens", scalar(item.accepted, np.int32)),
            pb.Tensor("total_draft_tokens", scalar(item.drafted, np.int32)),
            pb.Tensor("cum_log_probs", scalar(item.cum_log_prob, np.float32)),
            pb.Tensor("output_log_probs", np.array(item.logprobs, dtype=np.float32).reshape(1, 1, -1)),
            # declared for NVIDIA's contract; return_*_logits true is rejected, so always empty
            pb.Tensor("context_logits", np.zeros((1, 0, 0), dtype=np.float32)),
            pb.Tensor("generation_logits", np.zeros((1, 1, 0, 0), dtype=np.float32)),
            pb.Tensor("batch_index", scalar(0, np.int32)),
            pb.Tensor("sequence_index", scalar(item.index, np.int32)),
            *(pb.Tensor(n, scalar(item.times.get(n, 0), np.int32 if n.startswith("kv_") else np.int64))
              for n in PERF_OUTPUTS),
            pb.Tensor("served_by", scalar(item.served_by, object)),
            pb.Tensor("perf_json", scalar((item.perf_json or "") if seq_final else "", object)),
            pb.Tensor("detok_ids", np.array(ids, dtype=np.int32).reshape(1, 1, -1)),
            pb.Tensor("detok_length", scalar(len(ids), np.int32)),
            pb.Tensor("detok_context_length", scalar(ctx, np.int32)),
            pb.Tensor("is_final", scalar(seq_final, bool)),
            pb.Tensor("request_key", scalar(relay.key, object)),
        ]
        with relay.lock:
            if relay.done:
                raise _Aborted
            relay.done = final
            relay.sender.send(pb.InferenceResponse(output_tensors=tensors),
                              flags=pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL if final else 0)

    def _close(self, relay: _Relay, message: str) -> None:
        """End the client's request with an error, unless it already got its final response."""
        with relay.lock:
            if relay.done:
                return
            relay.done = True
            send_error(self.pb, relay.sender, message, invalid_argument=False)

    # ------------------------------------------------------------------ the monitor

    def _monitor(self) -> None:
        while not self.closing.wait(MONITOR_EVERY_S):
            with self.relays_lock:
                relays = [r for r in self.relays.values() if not r.done]
            if not relays:
                continue  # no scanning while idle; the next request checks the last scan's stubs
            try:
                self._check(relays)
            except Exception as e:  # noqa: BLE001 - the monitor must outlive any one failure
                self.pb.Logger.log_warn(f"{self.name}: monitor: {type(e).__name__}: {e}")

    def _scan(self) -> dict[str, frozenset[int]]:
        live = stubs_of(os.getppid())  # the stubs are tritonserver's children, as this one
        return {m: frozenset(s.pid for s in live if is_instance_of(s.instance, m))
                for m in self.models.values() if m}

    def _check(self, relays: list[_Relay]) -> None:
        """End the relays whose engine stub died since the last scan (Triton never answers them).

        The monitor makes no other call into the stub: ``is_cancelled()`` from this thread, next to
        the relays' sends, went with a heap corruption of the router's stub under load (once in a
        soak), and on a request whose final response was sent it crashes tritonserver itself
        (SIGSEGV in ResponseFactoryIsCancelled). Cancellation comes through postprocessing."""
        with self.scan_lock:
            self.scan = after = self._scan()
        for relay in relays:
            model = relay.model
            died = relay.engine_pids - after.get(model, frozenset())
            # the stubs this relay could be on are all gone: it was on a dead one. With one
            # instance per model (trtspec's configs) that is exact; with several, a relay on the
            # dead one stays until its client's deadline. A reload's new stub is not in the set of
            # relays that started before it, so they end when the watchdog removes the old one.
            if died and not relay.engine_pids & after.get(model, frozenset()):
                self.pb.Logger.log_warn(f"{self.name}: {model} stub exited; ending request "
                                        f"{relay.engine_request_id} with an error")
                self._close(relay, f"{self.name}: the '{model}' model's python stub exited while "
                                   "serving this request (crashed or killed); the watchdog of `trtspec serve` "
                                   "reloads it: retry the request")

    def _finished(self, path: str, item: _Item) -> None:
        perf = None
        if item.perf_json:
            try:
                perf = json.loads(item.perf_json)
            except json.JSONDecodeError:
                perf = None
        if not self.policy.has_speculative:
            return
        if path == "speculative":
            change = self.policy.record_speculative(item.drafted, item.accepted, perf)
        else:
            change = self.policy.record_baseline(perf)
        self._publish(change)

    def _publish(self, change: str | None = None) -> None:
        """The policy's state on /metrics (and the fallback entered or left, if it just was)."""
        snap = self.policy.snapshot()
        be = snap["break_even_acceptance_rate"]
        ops = [("set", "trtspec_router_fallback_active", float(snap["fallback_active"]), {}),
               ("set", "trtspec_router_break_even_unknown", float(be is None), {})]
        # unknown: NaN, never a stale value read as a live one (a break-even of 1 left from a bad spell)
        for name, value in (("trtspec_router_break_even_acceptance_rate", be),
                            ("trtspec_router_rolling_acceptance_rate", snap["rolling_acceptance_rate"])):
            ops.append(("set", name, float("nan") if value is None else value, {}))
        if change is not None:
            ops.append(("increment", "trtspec_router_fallback_changes_total", 1, {"change": change}))
        self.metrics.apply(ops)

    def finalize(self) -> None:
        self.closing.set()
        with self.relays_lock:
            stuck = sum(r.done for r in self.relays.values())  # ended by the monitor: never return
        if len(self.threads.running()) > stuck:
            self.threads.join()
        if self.clients is not None:
            self.clients.close()


def metric_specs(has_speculative: bool) -> list[tuple]:
    """The router's series (``Metrics.declare`` specs): routing counts, and with a speculative
    model the fallback's state (docs/serving.md, Metrics)."""
    routes = ((("speculative", "speculative"), ("speculative", "probe"), ("baseline", "fraction"),
               ("baseline", "fallback")) if has_speculative else (("baseline", "no-speculative-model"),))
    specs = [("trtspec_router_requests_total", "Requests routed, by path and reason", "COUNTER", None,
              {"path": path, "reason": reason}) for path, reason in routes]
    if not has_speculative:
        return specs
    return specs + [
        ("trtspec_router_fallback_active", "1 while the router falls back to the baseline", "GAUGE", None, {}),
        ("trtspec_router_rolling_acceptance_rate", "Acceptance rate over the router's window (NaN before any)",
         "GAUGE", None, {}),
        ("trtspec_router_break_even_acceptance_rate", "Acceptance rate below which speculation loses "
         "(NaN while unknown)", "GAUGE", None, {}),
        ("trtspec_router_break_even_unknown", "1 while the measured costs give no break-even (none yet, or "
         "degenerate): the router then does not fall back", "GAUGE", None, {}),
    ] + [("trtspec_router_fallback_changes_total", "Fallbacks entered and left", "COUNTER", None,
          {"change": change}) for change in ("enter", "exit")]


def relay_mode(wanted: str, argv: list[str] | None = None, *, tls: bool = False) -> tuple[str, str]:
    """("grpc", url of this server's gRPC endpoint) or ("bls", why not gRPC).

    The url comes from the command line of the parent tritonserver (``argv``; by default read
    from /proc): ``--grpc-address``, ``--grpc-port``, ``--allow-grpc``, with Triton's defaults
    0.0.0.0:8001. A server with gRPC over TLS is relayed to over TLS when the launcher gave the
    stubs its client settings (``tls``: ``serving.tls``); else (TLS flags passed by hand) BLS."""
    wanted = (wanted or "auto").strip().lower()
    if wanted not in ("auto", "grpc", "bls"):
        raise ValueError(f"TRTSPEC_ROUTER_RELAY={wanted!r}: use auto, grpc or bls")
    if wanted == "bls":
        return "bls", "TRTSPEC_ROUTER_RELAY=bls"
    try:
        import tritonclient.grpc  # noqa: F401
    except ImportError:
        if wanted == "grpc":
            raise
        return "bls", "tritonclient[grpc] is not installed where the stub runs"
    if argv is None:
        try:
            with open(f"/proc/{os.getppid()}/cmdline", "rb") as f:
                argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
        except OSError as e:
            if wanted == "grpc":
                raise
            return "bls", f"cannot read the server's command line: {e}"
    opts: dict[str, str] = {}
    for i, a in enumerate(argv):
        if a.startswith("--") and "=" in a:
            k, v = a[2:].split("=", 1)
            opts[k] = v
        elif a.startswith("--") and i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            opts[a[2:]] = argv[i + 1]
    if opts.get("allow-grpc", "true").lower() in ("false", "0", "no"):
        if wanted == "grpc":
            raise ValueError("TRTSPEC_ROUTER_RELAY=grpc but the server runs with --allow-grpc=false")
        return "bls", "the server runs without gRPC"
    server_tls = any(opts.get(k, "false").lower() in ("true", "1", "yes")
                     for k in ("grpc-use-ssl", "grpc-use-ssl-mutual"))
    if server_tls and not tls:
        if wanted == "grpc":
            raise ValueError("TRTSPEC_ROUTER_RELAY=grpc but the server's gRPC uses TLS and the launcher gave the "
                             "relay no TLS settings (serve it with serving.tls or serve --tls-*)")
        return "bls", "the server's gRPC uses TLS set by hand (no client settings from the launcher)"
    host = opts.get("grpc-address", "0.0.0.0")
    host = "127.0.0.1" if host in ("0.0.0.0", "") else ("[::1]" if host in ("::", "[::]") else host)
    return "grpc", f"{host}:{opts.get('grpc-port', '8001')}"


def _declares_input(config: pathlib.Path, name: str) -> bool:
    """Whether a model's config.pbtxt declares input ``name`` (False when unreadable)."""
    try:
        text = config.read_text()
    except OSError:
        return False
    return re.search(r'name:\s*"' + re.escape(name) + '"', text) is not None


def _empty_like(item: _Item) -> _Item:
    """A response with no new tokens but the request's final counters (closes the stream)."""
    e = object.__new__(_Item)
    e.ids, e.acceptance_rate, e.accepted, e.drafted = [], item.acceptance_rate, item.accepted, item.drafted
    e.served_by, e.perf_json, e.index = item.served_by, item.perf_json, item.index
    e.cum_log_prob, e.logprobs, e.times = item.cum_log_prob, [], item.times
    return e
