"""Client SDK without a server: URL parsing, error mapping, tensor shapes, an unreachable port."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from trtspec.client import (
    AsyncLLMClient,
    InferenceFailed,
    LLMClient,
    ModelInfo,
    ModelNotFound,
    RequestRejected,
    RequestTimeout,
    Sampling,
    ServerBusy,
    ServerUnavailable,
    parse_url,
)
from trtspec.client.errors import classify, from_exception, short_message
from trtspec.errors import ClientError, ConfigError


@pytest.mark.parametrize("url, want", [
    ("127.0.0.1:8001", "127.0.0.1:8001"), ("grpc://localhost:9000", "localhost:9000"),
    (" my-host.example:1 ", "my-host.example:1"), ("[::1]:8001", "[::1]:8001"),
])
def test_parse_url(url, want):
    assert parse_url(url) == want


@pytest.mark.parametrize("url", ["localhost", "http://x:1", "x:0", "x:70000", "", "a b:1"])
def test_parse_url_rejects(url):
    with pytest.raises(ConfigError, match="--url"):
        parse_url(url)


# the client-visible failures of tritonserver 2.51 (reference/triton-cpu.md §8)
@pytest.mark.parametrize("status, message, cls", [
    ("NOT_FOUND", "Request for unknown model: 'nope' is not found", ModelNotFound),
    (None, "Request for unknown model: 'nope' is not found", ModelNotFound),  # inside a stream: no status
    ("NOT_FOUND", "Request for unknown model: 'slow' has no available versions", ModelNotFound),
    ("INVALID_ARGUMENT", "unexpected inference input 'BAD' for model 'failing'", RequestRejected),
    (None, "unexpected shape for input 'MODE' for model 'failing'. Expected [1], got [2].", RequestRejected),
    ("UNIMPLEMENTED", "ModelInfer RPC doesn't support models with decoupled transaction policy", RequestRejected),
    ("INTERNAL", "Failed to process the request(s) for model 'failing_0', message: ValueError: boom\n\nAt:\n"
                 "  /x/model.py(11): execute", InferenceFailed),
    ("DEADLINE_EXCEEDED", "Deadline Exceeded", RequestTimeout),
    ("UNAVAILABLE", "Request timeout expired", ServerBusy),
    (None, "tensorrt_llm: queue full (64 requests waiting)", ServerBusy),
    ("UNAVAILABLE", "[request id: <id_unknown>] Exceeds maximum queue size", ServerBusy),
    ("UNAVAILABLE", "failed to connect to all addresses; last error: UNKNOWN: Connection refused", ServerUnavailable),
    (None, "Stream removed (Socket closed)", ServerUnavailable),
    ("INTERNAL", "Stub process 'crasher_0' is not healthy.", InferenceFailed),
])
def test_classify_server_errors(status, message, cls):
    e = classify(status, message, url="h:1", model="ensemble")
    assert type(e) is cls
    assert isinstance(e, ClientError) and e.exit_code == 4
    assert e.model == "ensemble" and e.status == status and e.server_message == message
    assert "model 'ensemble' at h:1" in str(e) and e.fix
    assert "At:" not in str(e)  # the python backend's traceback stays in server_message


def test_short_message_and_grpc_error_mapping():
    assert short_message("boom\n\nAt:\n  model.py(1)") == "boom"

    class FakeRpc(Exception):
        def code(self):
            import grpc

            return grpc.StatusCode.UNAVAILABLE

        def details(self):
            return "failed to connect to all addresses"

    e = from_exception(FakeRpc(), url="h:1", model="m")
    assert isinstance(e, ServerUnavailable) and e.status == "UNAVAILABLE"


def test_model_info_builds_nvidia_shaped_tensors():
    cfg = {"name": "ensemble", "max_batch_size": 8, "model_transaction_policy": {"decoupled": True},
           "input": [{"name": "text_input", "data_type": "TYPE_STRING", "dims": ["1"]},
                     {"name": "max_tokens", "data_type": "TYPE_INT32", "dims": ["1"], "optional": True},
                     {"name": "seed", "data_type": "TYPE_UINT64", "dims": ["1"], "optional": True},
                     {"name": "stream", "data_type": "TYPE_BOOL", "dims": ["1"], "optional": True}],
           "output": [{"name": "text_output", "data_type": "TYPE_STRING", "dims": ["-1"]}]}
    info = ModelInfo.from_config(cfg)
    assert info.kind == "text" and info.decoupled and info.outputs == {"text_output"}
    t = info.tensor("text_input", ["hi"])
    assert t.shape() == [1, 1] and t.datatype() == "BYTES"  # [batch, 1] like NVIDIA's clients
    assert info.tensor("seed", [7]).datatype() == "UINT64"
    ids = ModelInfo.from_config({"name": "tensorrt_llm", "max_batch_size": 0, "input": [
        {"name": "input_ids", "data_type": "TYPE_INT32", "dims": ["-1"]},
        {"name": "input_lengths", "data_type": "TYPE_INT32", "dims": ["1"]}]})
    assert ids.kind == "ids" and ids.tensor("input_ids", [1, 2, 3]).shape() == [3]


@pytest.mark.parametrize("kwargs, field", [
    ({"max_tokens": 0}, "max_tokens"), ({"temperature": -1}, "temperature"), ({"top_p": 0}, "top_p"),
    ({"top_k": -1}, "top_k"), ({"seed": -2}, "seed"),
])
def test_sampling_errors(kwargs, field):
    with pytest.raises(ConfigError, match=field):
        Sampling(**kwargs)


def test_the_client_sends_what_a_sampling_sets_and_leaves_the_rest_unsent():
    names = ("max_tokens", "stream", "temperature", "top_k", "top_p", "seed", "end_id", "pad_id", "min_length",
             "return_perf_metrics", "exclude_input_in_output", "repetition_penalty", "presence_penalty",
             "frequency_penalty", "return_log_probs")
    types = {"temperature": "FP32", "top_p": "FP32", "repetition_penalty": "FP32", "presence_penalty": "FP32",
             "frequency_penalty": "FP32", "seed": "UINT64", "stream": "BOOL", "return_perf_metrics": "BOOL",
             "exclude_input_in_output": "BOOL", "return_log_probs": "BOOL"}
    info = ModelInfo.from_config({"name": "ensemble", "max_batch_size": 8, "input": [
        {"name": "text_input", "data_type": "TYPE_STRING", "dims": ["1"]},
        *({"name": n, "data_type": f"TYPE_{types.get(n, 'INT32')}", "dims": ["1"], "optional": True} for n in names)]})
    client = AsyncLLMClient("127.0.0.1:1")

    def sent(sampling):
        tensors, _ = client._inputs(info, "hi", sampling, True)
        return {t.name() for t in tensors}

    # the defaults send what they always sent: nothing unset, no processor that is off
    assert sent(Sampling(max_tokens=4)) == {"text_input", "max_tokens", "stream", "temperature",
                                            "return_perf_metrics", "exclude_input_in_output"}
    asked = sent(Sampling(max_tokens=4, temperature=0.5, top_p=0.9, min_tokens=2, repetition_penalty=1.2,
                          logprobs=True))
    assert {"top_p", "min_length", "repetition_penalty", "return_log_probs"} <= asked
    assert not {"top_k", "seed", "presence_penalty", "frequency_penalty"} & asked
    with pytest.raises(ConfigError, match="stop_words: is not sent by the gRPC client"):
        sent(Sampling(stop_words=((3, 4),)))


def test_sampling_from_recipe_drops_sampling_knobs_when_greedy():
    from trtspec.config import Sampling as RecipeSampling

    g = Sampling.from_recipe(RecipeSampling(temperature=0.0, top_k=5, seed=3), 16)
    assert (g.temperature, g.top_k, g.seed, g.max_tokens) == (0.0, None, None, 16)
    s = Sampling.from_recipe(RecipeSampling(temperature=0.7, top_k=5, top_p=0.9, seed=3), 8)
    assert (s.temperature, s.top_k, s.top_p, s.seed) == (0.7, 5, 0.9, 3)


def _free_port() -> int:
    from trtspec.triton.launch.server import free_port

    return free_port()


def test_unreachable_server_fails_fast_with_a_clear_error():
    url = f"127.0.0.1:{_free_port()}"
    t0 = time.monotonic()
    with LLMClient(url, retries=2, backoff_s=0.05) as c:
        with pytest.raises(ServerUnavailable, match="no Triton server is reachable") as ei:
            c.generate("hello", Sampling(max_tokens=4))
        assert ei.value.status == "UNAVAILABLE" and "--url" in ei.value.fix
        with pytest.raises(ServerUnavailable):
            c.wait_ready(timeout_s=0.3)
    assert time.monotonic() - t0 < 10


def test_async_client_unreachable():
    async def main():
        async with AsyncLLMClient(f"127.0.0.1:{_free_port()}", retries=0) as c:
            await c.generate("x")

    with pytest.raises(ServerUnavailable):
        asyncio.run(main())


def test_tokenizer_folder_errors(tmp_path):
    with pytest.raises(ConfigError, match="tokenizer"):
        LLMClient("127.0.0.1:1", tokenizer=str(tmp_path / "missing")).close()


def test_fast_tokenizer_matches_transformers(tiny_target):
    from transformers import AutoTokenizer

    from trtspec.client.client import load_tokenizer
    from trtspec.prompts import load_prompts

    fast, hf = load_tokenizer(str(tiny_target)), AutoTokenizer.from_pretrained(str(tiny_target))
    for p in load_prompts("builtin:mixed")[:40]:
        ids = fast(p)["input_ids"]
        assert ids == hf(p, add_special_tokens=False)["input_ids"]
        assert fast.decode(ids) == hf.decode(ids, skip_special_tokens=True)
    assert np.asarray(ids).dtype.kind == "i"
