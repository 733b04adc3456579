"""A fatal device error in the served engine ends its stub, and the watchdog reloads the model.

On a GPU, a CUDA kernel fault (illegal memory access, device-side assert) poisons the process's
CUDA context: every later step fails while Triton keeps the model READY. The engine model therefore
exits its stub once the failing step's requests got their errors (``EngineModel.exit_stub``, code
70), and the watchdog reloads it. Without a GPU the fault is injected where CUDA would raise it: the
speculative verifier raises CUDA's own message (``extra.fault_injection = "device_error"``,
trtspec.speculative.faults). Everything after the raise is the production path: the engine (in its
worker process) fails the step, the stub classifies the error, answers, exits; the watchdog reloads.
What this cannot show is that a real CUDA fault surfaces as that message (torch's wording, which
``guard.is_fatal_device_error`` matches and tests/unit/test_security_guard.py checks)."""

from __future__ import annotations

import time

import pytest

from trtspec.client import InferenceFailed, LLMClient, Sampling
from trtspec.config import parse_recipe
from trtspec.speculative.faults import DEVICE_ERROR
from trtspec.triton.launch.server import TritonServer
from trtspec.triton.launch.watchdog import WatchdogSettings
from trtspec.triton.procs import stubs_of

from tests.serving.test_triton_serving import render_with_fault, tiny_recipe

PROMPT = "def fibonacci(n):\n    "


@pytest.fixture(scope="module")
def server(tiny_models, tmp_path_factory):
    root = tmp_path_factory.mktemp("device-error")
    render_with_fault(parse_recipe(tiny_recipe(*tiny_models)), root / "repo", "device_error")
    with TritonServer(root / "repo", workdir=root / "server", ready_timeout=240,
                      watchdog=WatchdogSettings(interval_s=0.3, probe_every_s=None, load_timeout_s=180,
                                                max_reloads=10)) as s:
        yield s


def _stub(server, instance: str) -> int | None:
    return next((s.pid for s in stubs_of(server.proc.pid) if s.instance == instance), None)


def test_a_fatal_device_error_ends_the_stub_and_the_watchdog_reloads_it(server):
    events = len(server.watchdog.events)
    old = _stub(server, "tensorrt_llm_0_0")
    with LLMClient(server.endpoints.grpc) as c:
        c.wait_ready(["ensemble", "ensemble_baseline"], timeout_s=60)
        with pytest.raises(InferenceFailed, match="illegal memory access"):
            c.generate(PROMPT, Sampling(max_tokens=16), model="ensemble", timeout_s=60)
        deadline = time.monotonic() + 120
        while not any(e.kind == "reloaded" and e.model == "tensorrt_llm" for e in server.watchdog.events[events:]):
            assert time.monotonic() < deadline, [str(e) for e in server.watchdog.events[events:]]
            time.sleep(0.2)
        new = _stub(server, "tensorrt_llm_0_0")
        assert new is not None and new != old
        log = server.log_text()
        assert "fatal device error, exiting the stub for a reload" in log and DEVICE_ERROR in log
        assert server.watchdog.error is None
        # the reloaded instance is a live engine again: the same request reaches its verifier (and
        # fails there the same clean way) instead of "stub ... is not healthy"
        with pytest.raises(InferenceFailed, match="illegal memory access"):
            c.generate(PROMPT, Sampling(max_tokens=16), model="ensemble", timeout_s=60)
