"""serving.stream_interval on the real server: one streaming response per N engine steps through the
whole ensemble (engine worker → stub → router → postprocessing → client), the same tokens and text.

The repository serves the tiny pair with ``stream_interval: 3``; the reference is the engine's own
step count for the same request (``perf_json``: steps after the prefill)."""

from __future__ import annotations

import math

import pytest

from trtspec.client import LLMClient, Sampling
from trtspec.config import parse_recipe
from trtspec.triton.launch.server import TritonServer
from trtspec.triton.render import package

from tests.serving.test_triton_serving import tiny_recipe

INTERVAL = 3
PROMPTS = ["def fibonacci(n):\n    ", "import os\n\n\ndef main():\n", "class Stack:\n    def __init__(self):\n"]
MAX_TOKENS = 40


@pytest.fixture(scope="module")
def servers(tiny_models, tmp_path_factory):
    """(interval 1, interval 3) servers of the same pair."""
    root = tmp_path_factory.mktemp("stream-interval")
    out = []
    for n in (1, INTERVAL):
        raw = tiny_recipe(*tiny_models)
        raw["serving"] = {**raw["serving"], "stream_interval": n}
        package(parse_recipe(raw), root / f"repo{n}")
        out.append(TritonServer(root / f"repo{n}", workdir=root / f"server{n}", ready_timeout=240).start())
    yield out
    for s in out:
        s.stop()


@pytest.mark.parametrize("model", ["ensemble", "ensemble_baseline"])
def test_responses_carry_several_steps_and_the_output_is_unchanged(servers, model):
    every, grouped = servers
    with LLMClient(every.endpoints.grpc) as a, LLMClient(grouped.endpoints.grpc) as b:
        for p in PROMPTS:
            ref = a.generate(p, Sampling(max_tokens=MAX_TOKENS), model=model, timeout_s=120)
            got = b.generate(p, Sampling(max_tokens=MAX_TOKENS), model=model, timeout_s=120)
            assert got.token_ids == ref.token_ids and got.text == ref.text  # lossless, the text too
            steps = got.perf["target_passes"]  # engine passes after the prefill
            assert len(ref.chunks) == steps + 1  # interval 1: one response per step, + the prefill's
            # interval 3: the prefill's token at once, then one response per 3 steps (the last may hold fewer)
            assert len(got.chunks) == 1 + math.ceil(steps / INTERVAL), (len(got.chunks), steps)
            assert got.chunks[0].num_tokens == 1  # the first token is never held
            # the speculative path's chunk counters stay exact: the last response's counters are the request's
            assert got.draft_tokens == ref.draft_tokens and got.accepted_draft_tokens == ref.accepted_draft_tokens


def test_a_non_streaming_request_gets_one_response_with_everything(servers):
    _, grouped = servers
    with LLMClient(grouped.endpoints.grpc) as c:
        streamed = c.generate(PROMPTS[0], Sampling(max_tokens=MAX_TOKENS), model="ensemble", timeout_s=120)
        unary = c.generate(PROMPTS[0], Sampling(max_tokens=MAX_TOKENS), model="ensemble", stream=False,
                           timeout_s=120)
    assert unary.token_ids == streamed.token_ids and len(unary.chunks) == 1
