"""How the router calls its engine: a gRPC stream to its own server (default), or BLS as the
fallback. Both served for real; the same greedy outputs on both."""

from __future__ import annotations

import pytest
from tests.serving.triton_stream import generate

from trtspec.config import parse_recipe
from trtspec.triton.backend.router import relay_mode
from trtspec.triton.render import package
from trtspec.triton.launch.server import TritonServer

from tests.serving.test_triton_serving import MAX_TOKENS, tiny_recipe

SERVER = ["tritonserver", "--model-repository=/r"]


def test_grpc_endpoint_comes_from_the_server_command_line():
    assert relay_mode("auto", SERVER) == ("grpc", "127.0.0.1:8001")  # Triton's defaults
    assert relay_mode("auto", SERVER + ["--grpc-address=10.0.0.5", "--grpc-port=9001"]) == ("grpc", "10.0.0.5:9001")
    assert relay_mode("grpc", SERVER + ["--grpc-port", "9002", "--grpc-address", "0.0.0.0"]) == ("grpc", "127.0.0.1:9002")
    assert relay_mode("auto", SERVER + ["--allow-grpc=false"]) == ("bls", "the server runs without gRPC")
    assert relay_mode("BLS", SERVER) == ("bls", "TRTSPEC_ROUTER_RELAY=bls")
    with pytest.raises(ValueError, match="--allow-grpc=false"):
        relay_mode("grpc", SERVER + ["--allow-grpc=false"])
    with pytest.raises(ValueError, match="use auto, grpc or bls"):
        relay_mode("http", SERVER)


@pytest.mark.parametrize("relay, logged", [("bls", "BLS (TRTSPEC_ROUTER_RELAY=bls)"), ("auto", "gRPC at 127.0.0.1:")])
def test_both_relays_serve_the_same_greedy_text(relay, logged, tiny_models, tmp_path, monkeypatch):
    monkeypatch.setenv("TRTSPEC_ROUTER_RELAY", relay)  # the stubs inherit the launcher's environment
    package(parse_recipe(tiny_recipe(*tiny_models)), tmp_path / "repo")
    prompt = "def add(a, b):\n    return"
    with TritonServer(tmp_path / "repo", workdir=tmp_path / "server", ready_timeout=240) as s:
        replies = [generate(s.endpoints.grpc, m, prompt, max_tokens=MAX_TOKENS, stream=True)
                   for m in ("ensemble", "ensemble_baseline")]
        log = s.log_text()
    assert f"router: relays engine responses over {logged}" in log
    assert f"router_baseline: relays engine responses over {logged}" in log
    for r in replies:
        assert r.error is None and r.finals == 1 and len(r.responses) > 1
    assert replies[0].ids == replies[1].ids  # lossless: speculative and baseline agree
