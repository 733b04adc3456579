"""The watchdog acts on a deployment that stops answering (issue 30, item 3), against the real
tritonserver serving the tiny pair.

Faults: a python stub stopped (SIGSTOP) in the middle of requests; the engine's worker process
stopped (its stub stays healthy and answers nothing); a stub that cannot allocate any more memory
(RLIMIT_AS lowered to what it has, as the OOM killer's victim sees it before it dies: the router
then hangs, alive and never answering); the whole server hung. Each must end without anyone
waiting for good: the model serves again within ``BOUND_S`` of the fault, every request in flight
on the broken path ends with an error or an answer within ``BOUND_S`` (their own deadline is far
longer), requests on the other entry point keep their exact greedy output, and a hung server
ends ``serve_forever`` with an error (``trtspec serve`` exits 1, so an orchestrator restarts it).

The old watchdog (before this file) fails each: a stopped stub was reloaded ("not healthy") but
left stopped with its requests hanging to their deadline, and a path that answered nothing, or a
hung server, was only logged (``probe_failed``), for good.
"""

from __future__ import annotations

import os
import resource
import signal
import threading
import time

import pytest

from trtspec.client import InferenceFailed, LLMClient, RequestTimeout, Sampling, ServerBusy
from trtspec.config import parse_recipe
from trtspec.errors import ServerError
from trtspec.triton.launch.server import TritonServer
from trtspec.triton.launch.watchdog import WatchdogSettings
from trtspec.triton.procs import alive, stubs_of, workers_of
from trtspec.triton.render import package

from tests.serving.test_faults import (LONG, MAX_TOKENS, PROMPTS, Bystanders, Deployment, recipe, report,
                                       unless_triton_aborts, wait_until)
from tests.serving.test_triton_launcher import group_alive, model

# probes every second, 4 s to answer, 3 failures in a row: a path that answers nothing is acted on
# within DETECT_S; RELOAD_S covers killing, reloading up to three models (4-6 s each on 2 loaded
# cores) and drain_s before the old instances of a path reloaded without a known cause are killed
SETTINGS = WatchdogSettings(interval_s=0.5, probe_every_s=1.0, probe_timeout_s=4.0, probe_failures=3,
                            health_every_s=1.0, load_timeout_s=180, drain_s=5.0)
DETECT_S = SETTINGS.probe_failures * (SETTINGS.probe_every_s + SETTINGS.probe_timeout_s) + SETTINGS.interval_s
RELOAD_S = 30.0
BOUND_S = DETECT_S + RELOAD_S  # 45.5 s: the model serves again, and no request waits longer
DEADLINE_S = 150.0  # the clients' own deadline: a request ended by it was left hanging by the server


class WatchedDeployment(Deployment):
    """test_faults' deployment, with probes (the module's server is started under SETTINGS)."""

    def start(self, ports=(0, 0, 0)) -> float:
        self.starts += 1
        g, h, m = ports
        old = os.environ.get("OMP_WAIT_POLICY")
        os.environ["OMP_WAIT_POLICY"] = "passive"  # spinning OpenMP threads starve 2 shared cores
        t0 = time.monotonic()
        try:
            self.server = TritonServer(
                self.repo, workdir=self.root / f"server{self.starts}", ready_timeout=300, exit_timeout=2,
                grpc_port=g, http_port=h, metrics_port=m, entry_points=("ensemble", "ensemble_baseline"),
                watchdog=SETTINGS).start()
        finally:
            if old is None:
                os.environ.pop("OMP_WAIT_POLICY", None)
            else:
                os.environ["OMP_WAIT_POLICY"] = old
        return time.monotonic() - t0


@pytest.fixture(scope="module")
def deployment(tiny_models, tmp_path_factory):
    root = tmp_path_factory.mktemp("attack_watchdog")
    package(parse_recipe(recipe(*tiny_models)), root / "repo")
    d = WatchedDeployment(root / "repo", root)
    d.start()
    yield d
    d.server.stop()


@pytest.fixture(scope="module")
def reference(deployment) -> dict[str, list[int]]:
    with LLMClient(deployment.url) as c:
        c.wait_ready(["ensemble", "ensemble_baseline"])
        return {p: c.generate(p, Sampling(max_tokens=MAX_TOKENS), model="ensemble_baseline").token_ids
                for p in PROMPTS}


class Affected:
    """Requests in a loop on the entry point the fault breaks, each with a long deadline: each must
    end, with its exact output or an error the server gave (not the client's deadline), within
    BOUND_S. Records (seconds it took, outcome)."""

    def __init__(self, url: str, reference: dict, model: str = "ensemble"):
        self.url, self.reference, self.model = url, reference, model
        self.results: list[tuple[float, object]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        with LLMClient(self.url, retries=0) as c:
            i = 0
            while not self._stop.is_set():
                p = PROMPTS[i % len(PROMPTS)]
                i += 1
                t0 = time.monotonic()
                try:
                    out = c.generate(p, Sampling(max_tokens=MAX_TOKENS), model=self.model, timeout_s=DEADLINE_S).token_ids
                except Exception as e:  # noqa: BLE001 - judged in check()
                    out = e
                self.results.append((time.monotonic() - t0, p, out))
                if isinstance(out, Exception):
                    time.sleep(0.2)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(DEADLINE_S + 10)
        assert not self._thread.is_alive(), "a request on the broken path never ended"

    def check(self) -> dict:
        assert self.results
        for took, p, out in self.results:
            assert took < BOUND_S, f"a request on the broken path waited {took:.1f} s ({out})"
            if isinstance(out, Exception):
                assert isinstance(out, (InferenceFailed, ServerBusy)), f"not an error the server gave: {out!r}"
            else:
                assert out == self.reference[p], "an output changed"
        errors = [o for _, _, o in self.results if isinstance(o, Exception)]
        return {"affected_requests": len(self.results), "affected_errors": len(errors),
                "longest_affected_s": round(max(t for t, _, _ in self.results), 1)}


def _long_request(url: str, on_third_chunk=None) -> tuple[threading.Thread, dict]:
    """A long streaming request through ``ensemble`` on a thread, which calls ``on_third_chunk()``
    at its third chunk (so the fault hits it in flight); {"fault_at", "ended_at", "result"}."""
    out: dict = {}
    chunks: list = []

    def on_chunk(ch):
        chunks.append(ch)
        if len(chunks) == 3 and on_third_chunk is not None:
            on_third_chunk()
            out["fault_at"] = time.monotonic()

    def run():
        with LLMClient(url, retries=0) as c:
            try:
                out["result"] = c.generate(PROMPTS[0], Sampling(max_tokens=LONG), on_chunk=on_chunk,
                                           timeout_s=DEADLINE_S)
            except Exception as e:  # noqa: BLE001 - judged by the test
                out["result"] = e
        out["ended_at"] = time.monotonic()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


def _serves_again(deployment, reference, since: float) -> float:
    """Seconds from ``since`` to the first exact answer of ``ensemble``."""
    with LLMClient(deployment.url, retries=0) as c:
        def ok():
            try:
                return c.generate(PROMPTS[2], Sampling(max_tokens=MAX_TOKENS),
                                  timeout_s=10).token_ids == reference[PROMPTS[2]]
            except (InferenceFailed, RequestTimeout, ServerBusy):
                time.sleep(0.2)
                return False
        wait_until(ok, timeout=BOUND_S + 30, every=0.0)
    return time.monotonic() - since


def _stopped_mid_stream(deployment, reference, which: str) -> dict:
    """SIGSTOP the ``tensorrt_llm`` stub (or its engine worker) while a long request streams and
    requests loop on both entry points; the watchdog must kill what is stopped and reload."""
    events = len(deployment.server.watchdog.events)
    stub = deployment.stub("tensorrt_llm_0_0")
    (worker,) = workers_of(stub)
    victim = stub if which == "stub" else worker
    try:
        with Bystanders(deployment.url, reference, model="ensemble_baseline"), \
                Affected(deployment.url, reference) as affected:
            thread, out = _long_request(deployment.url, lambda: os.kill(victim, signal.SIGSTOP))
            thread.join(DEADLINE_S + 10)
            assert not thread.is_alive()
            stopped_at, result = out["fault_at"], out["result"]
            ended_s = out["ended_at"] - stopped_at
            serving_s = _serves_again(deployment, reference, stopped_at)
        figures = affected.check()
    finally:
        if alive(victim):  # the old watchdog leaves it stopped: let the module's server stop
            os.kill(victim, signal.SIGKILL)
    assert isinstance(result, InferenceFailed), result  # ended by the server, with a clear error
    assert "exited" in str(result), result
    assert ended_s < BOUND_S and serving_s < BOUND_S, (ended_s, serving_s)
    assert not alive(victim)
    kinds = [(e.kind, e.model) for e in deployment.server.watchdog.events[events:]]
    assert ("killed_stuck", "tensorrt_llm") in kinds and ("reloaded", "tensorrt_llm") in kinds, kinds
    assert deployment.stub("tensorrt_llm_0_0") != stub
    return {"in_flight_error_s": round(ended_s, 1), "serving_again_s": round(serving_s, 1), **figures}


def test_a_stub_stopped_mid_stream_is_killed_and_reloaded(deployment, reference):
    """Triton 2.51 calls a stopped stub "not healthy" (the old watchdog reloaded it), but the
    requests it holds never end and it never unloads: the watchdog kills it first, and the router
    ends those requests with an error at once."""
    figures = unless_triton_aborts(deployment, _stopped_mid_stream, reference, "stub")
    report(fault="engine stub SIGSTOPped", bound_s=BOUND_S, **figures)


def test_an_engine_worker_stopped_mid_stream_is_killed_and_reloaded(deployment, reference):
    """The engine's worker process stopped: its stub stays healthy and answers nothing (what the
    old watchdog logged as probe_failed for good). After 3 probes without an answer the watchdog
    finds the stopped worker on the ensemble's path and kills it; the stub fails its requests and
    exits, and the model is reloaded."""
    figures = unless_triton_aborts(deployment, _stopped_mid_stream, reference, "worker")
    report(fault="engine worker SIGSTOPped", bound_s=BOUND_S, **figures)


def test_a_stub_out_of_memory_serves_again(deployment, reference):
    unless_triton_aborts(deployment, _out_of_memory, reference)


def _out_of_memory(deployment, reference):
    """The router's stub may map no more memory (RLIMIT_AS down to its VmSize, set from outside):
    from its next request on it hangs, alive, not stopped, answering nothing. Which model of the
    path hangs cannot be told from outside, so after 3 failed probes the watchdog reloads those of
    ensemble's path that ensemble_baseline does not use (router, tensorrt_llm, and the router's
    callee tensorrt_llm_baseline) and kills the old router stub drain_s later: its requests end
    with an error. The new stub has no limit: the model serves again."""
    events = len(deployment.server.watchdog.events)
    stub = deployment.stub("router_0_0")
    with open(f"/proc/{stub}/status") as f:
        vm = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
    with Affected(deployment.url, reference) as affected:
        time.sleep(1.0)  # it serves before the limit
        resource.prlimit(stub, resource.RLIMIT_AS, (vm, vm))
        t0 = time.monotonic()
        thread, out = _long_request(deployment.url)
        wait_until(lambda: any(e.kind == "reloaded" and e.model == "router"
                               for e in deployment.server.watchdog.events[events:]), timeout=BOUND_S, every=0.2)
        serving_s = _serves_again(deployment, reference, t0)
        thread.join(BOUND_S)
    figures = affected.check()
    assert not thread.is_alive(), "the request in flight never ended"
    ended_s = out["ended_at"] - t0
    assert isinstance(out["result"], InferenceFailed) or not isinstance(out["result"], Exception), out
    assert serving_s < BOUND_S and ended_s < BOUND_S, (serving_s, ended_s)
    wait_until(lambda: not alive(stub), timeout=SETTINGS.drain_s + 10, every=0.2)  # killed after drain_s
    kinds = [(e.kind, e.model) for e in deployment.server.watchdog.events[events:]]
    assert ("probe_failed", "ensemble") in kinds and ("killed_stuck", "router") in kinds, kinds
    assert [m for k, m in kinds if k == "reloaded"][-1] == "router", kinds  # callees first
    assert not any(k in ("reload_failed", "gave_up") for k, _ in kinds), kinds
    report(fault="router stub out of memory (RLIMIT_AS)", bound_s=BOUND_S, serving_again_s=round(serving_s, 1),
           in_flight_ended_s=round(ended_s, 1), in_flight=str(out["result"])[:200], **figures)


def test_a_hung_server_ends_serving_with_an_error(tmp_path):
    """tritonserver stopped (SIGSTOP): it answers no health check; after probe_failures checks in a
    row the watchdog gives up and serve_forever raises (trtspec serve exits 1 for a restart)."""
    model(tmp_path / "repo", "echo")
    settings = WatchdogSettings(interval_s=0.2, probe_every_s=None, health_every_s=0.5, health_timeout_s=1.0,
                                probe_failures=2, load_timeout_s=60)
    with TritonServer(tmp_path / "repo", workdir=tmp_path / "w", ready_timeout=60, watchdog=settings,
                      exit_timeout=1) as s:
        pgid = s.proc.pid
        os.kill(s.proc.pid, signal.SIGSTOP)
        t0 = time.monotonic()
        wait_until(lambda: s.watchdog.error is not None, timeout=30, every=0.1)
        took = time.monotonic() - t0
        with pytest.raises(ServerError, match=r"answered no health check 2 times in a row(?s:.*)hung"):
            s.serve_forever()
        kinds = [e.kind for e in s.watchdog.events]
    assert kinds == ["health_failed", "health_failed", "gave_up"], kinds
    assert took < 2 * (settings.health_every_s + settings.health_timeout_s) + 2
    assert not group_alive(pgid)
    report(fault="tritonserver hung (SIGSTOP)", gave_up_s=round(took, 1))


def test_the_stubs_of_the_ensembles_path_are_known(deployment):
    """What the watchdog reloads for an entry point that answers nothing: its python models."""
    paths = deployment.server.watchdog.paths
    assert paths["ensemble"] == {"preprocessing", "router", "postprocessing", "tensorrt_llm", "tensorrt_llm_baseline"}
    assert paths["ensemble_baseline"] == {"preprocessing", "router_baseline", "postprocessing",
                                          "tensorrt_llm_baseline"}
    assert {s.model for s in stubs_of(deployment.server.proc.pid)} >= paths["ensemble"]
