"""The router falls back to the baseline when speculation stops paying (real tritonserver).

The draft here is a randomly initialised model with the tiny target's tokenizer: its drafts are
almost never accepted, so the rolling acceptance falls below break-even after the first request.
"""

from __future__ import annotations

import math

import pytest
from tests.serving.triton_stream import generate, metric, metrics

from trtspec.config import parse_recipe
from trtspec.triton.render import package
from trtspec.triton.launch.server import TritonServer


@pytest.fixture(scope="module")
def random_draft(tiny_target, tmp_path_factory):
    from transformers import AutoTokenizer

    from trtspec.checkpoints.tiny import TinySettings, _init, _model_args, save_hf
    from trtspec.speculative.model import CausalLM

    tok = AutoTokenizer.from_pretrained(tiny_target)
    s = TinySettings()
    model = CausalLM(_model_args(s.draft, s, tok.eos_token_id))
    _init(model, seed=1234)
    folder = tmp_path_factory.mktemp("random-draft")
    save_hf(model, tok, folder)
    return folder


@pytest.fixture(scope="module")
def server(tiny_target, random_draft, tmp_path_factory):
    recipe = parse_recipe({
        "name": "tiny-mismatched-draft",
        "target": {"model": str(tiny_target)},
        "speculation": {"method": "draft_target", "draft": {"model": str(random_draft)}, "max_draft_len": 4},
        "runtime": {"backend": "torch", "dtype": "float32", "device": "cpu", "torch_threads": 1,
                    "adaptive": {"enabled": False, "min_acceptance_rate": 0.3, "window": 32}},
        "limits": {"max_batch_size": 4, "max_input_len": 256, "max_seq_len": 512},
        "serving": {"speculative_fraction": 1.0},
        "validation": {"max_tokens": 16},
    })
    root = tmp_path_factory.mktemp("triton-fallback")
    package(recipe, root / "repo")
    with TritonServer(root / "repo", workdir=root / "server", ready_timeout=240) as s:
        yield s


def test_fallback_engages_below_break_even_and_keeps_probing(server):
    url = server.endpoints.grpc
    # before any request: nothing measured (NaN, not 0), the recipe's break-even known
    m = metrics(server.endpoints.metrics)
    assert math.isnan(metric(m, "trtspec_router_rolling_acceptance_rate", model="router"))
    assert metric(m, "trtspec_router_break_even_acceptance_rate", model="router") == pytest.approx(0.3)
    assert metric(m, "trtspec_router_break_even_unknown", model="router") == 0
    replies = [generate(url, "ensemble", f"def f{i}(x):\n    return", max_tokens=16) for i in range(10)]
    assert all(r.error is None for r in replies), [r.error for r in replies]
    served = [r.last["served_by"] for r in replies]
    # the first request speculates and fails (acceptance ~ 0 < 0.3) ...
    assert served[0] == "speculative"
    assert replies[0].last["total_draft_tokens"] >= 32
    assert replies[0].last["acceptance_rate"] < 0.3
    # ... then the router sends speculative-bound traffic to the baseline, except every 8th (a probe,
    # which fails here too, so the fallback stays)
    assert served[1:8] == ["baseline"] * 7
    assert served[8] == "speculative"
    assert served[9] == "baseline"
    # fallback changes the path, not the text: baseline and speculative outputs are the same greedy text
    base = generate(url, "ensemble_baseline", "def f0(x):\n    return", max_tokens=16)
    assert base.text == replies[0].text

    m = metrics(server.endpoints.metrics)
    assert metric(m, "trtspec_router_fallback_active", model="router") == 1
    assert metric(m, "trtspec_router_requests_total", model="router", path="baseline", reason="fallback") == 8
    assert metric(m, "trtspec_router_requests_total", model="router", path="speculative", reason="probe") == 1
    assert metric(m, "trtspec_router_rolling_acceptance_rate", model="router") < 0.3
    assert metric(m, "trtspec_router_break_even_acceptance_rate", model="router") == pytest.approx(0.3)
    assert metric(m, "trtspec_router_fallback_changes_total", model="router", change="enter") == 1
    assert metric(m, "trtspec_router_fallback_changes_total", model="router", change="exit") == 0
