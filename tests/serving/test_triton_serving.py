"""The rendered repository on a real tritonserver (nvidia-pytriton's, CPU) with the tiny pair.

One server for the module: startup costs seconds per python stub on 2 cores. It runs in its own
process group and is always stopped.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException
from tests.serving.triton_stream import generate, generate_many, metric, metrics, raw_stream

from trtspec.config import parse_recipe
from trtspec.triton.render import TEMPLATES, inputs_from_recipe, package, render_model, render_repository, rounds_plan
from trtspec.triton.launch.server import TritonServer

MAX_TOKENS = 24


def tiny_recipe(target, draft, **runtime) -> dict:
    return {
        "name": "tiny-serving-test",
        "target": {"model": str(target)},
        "speculation": {"method": "draft_target", "draft": {"model": str(draft)}, "max_draft_len": 4},
        # adaptive drafting off: the served acceptance counters must equal an in-process run's.
        # A break-even of 0 keeps this server's router on the speculative path whatever a prompt's
        # acceptance (the tiny pair accepts 2 of 74 drafts on some stdlib snippets). One torch
        # thread per engine: two engines and the test share 2 cores (oversubscribed OpenMP threads
        # run 10x slower), and the in-process reference uses the same count (same numerics).
        "runtime": {"backend": "torch", "dtype": "float32", "device": "cpu", "torch_threads": 1,
                    "adaptive": {"enabled": False, "min_acceptance_rate": 0.0}, **runtime},
        "limits": {"max_batch_size": 8, "max_input_len": 256, "max_seq_len": 512},
        "serving": {"max_queue_size": 64},
        "validation": {"max_tokens": MAX_TOKENS},
    }


def render_with_fault(recipe, out, fault: str) -> None:
    """Render ``recipe``'s repository with the speculative engine's fault-injection switch set
    (``RuntimeSpec.extra["fault_injection"]``, trtspec.speculative.faults): never a recipe field."""
    inp = inputs_from_recipe(recipe)
    render_repository(replace(inp, runtime_spec=replace(inp.runtime_spec, extra={"fault_injection": fault})), out)


@pytest.fixture(scope="module")
def recipe(tiny_models):
    return parse_recipe(tiny_recipe(*tiny_models))


@pytest.fixture(scope="module")
def server(recipe, tmp_path_factory):
    root = tmp_path_factory.mktemp("triton-serving")
    package(recipe, root / "repo")
    add_draft_target_bls(root / "repo", recipe)
    with TritonServer(root / "repo", workdir=root / "server", ready_timeout=240) as s:
        yield s


def add_draft_target_bls(repo, recipe) -> None:
    """The TRT-LLM engine flow's token-level draft-target rounds (trtspec_draft_target), here over
    torch models with the same tensors: tensorrt_llm_draft (the draft decoding plainly, which
    `trtspec package` renders for a draft-target recipe) and tensorrt_llm_baseline (the target)."""
    render_model(rounds_plan(inputs_from_recipe(recipe), "tensorrt_llm_baseline", "tensorrt_llm_draft", 4), TEMPLATES, repo)


@pytest.fixture(scope="module")
def url(server) -> str:
    return server.endpoints.grpc


@pytest.fixture(scope="module")
def tokenizer(tiny_target):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_target)


@pytest.fixture(scope="module")
def prompts() -> list[str]:
    from trtspec.prompts import stdlib_snippets

    return stdlib_snippets(6, min_chars=30, max_chars=240)


@pytest.fixture(scope="module")
def in_process(recipe):
    """The same engines, built in this process: (plain greedy engine, speculative engine)."""
    from trtspec.speculative.runtime import RuntimeSpec, build_engine

    threads = torch.get_num_threads()
    spec = RuntimeSpec.from_recipe(recipe)  # build_engine sets torch's thread count from it
    yield build_engine(spec.baseline()), build_engine(spec)  # the baseline as served
    torch.set_num_threads(threads)


def greedy(engine, tokenizer, text: str, max_tokens: int = MAX_TOKENS):
    from trtspec.sampling import Sampling

    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    g = engine.generate([ids], Sampling(max_tokens=max_tokens))[0]
    return g, tokenizer.decode(g.token_ids, skip_special_tokens=True)


def test_streaming_matches_in_process_greedy(url, prompts, tokenizer, in_process):
    plain, _ = in_process
    for text in prompts[:4]:
        g, want = greedy(plain, tokenizer, text)
        spec = generate(url, "ensemble", text, max_tokens=MAX_TOKENS, stream=True)
        base = generate(url, "ensemble_baseline", text, max_tokens=MAX_TOKENS, stream=True)
        for reply, path in ((spec, "speculative"), (base, "baseline")):
            assert reply.error is None, reply.error
            assert reply.finals == 1
            assert reply.ids == g.token_ids
            assert reply.text == want
            assert {r["served_by"] for r in reply.responses} == {path}
        # streaming really streams: the speculative path sends one response per engine step
        assert len(spec.responses) > 1 and len(base.responses) == len(g.token_ids)
        assert all(r["perf_json"] == "" for r in spec.responses[:-1])


def test_non_streaming_sends_one_response_with_the_full_text(url, prompts, tokenizer, in_process):
    g, want = greedy(in_process[0], tokenizer, prompts[0])
    for model in ("ensemble", "ensemble_baseline"):
        reply = generate(url, model, prompts[0], max_tokens=MAX_TOKENS, stream=False)
        assert reply.error is None, reply.error
        assert len(reply.responses) == 1 and reply.finals == 1
        assert reply.text == want and reply.ids == g.token_ids


def test_max_tokens_defaults_from_the_recipe(url, prompts):
    reply = generate(url, "ensemble", prompts[1])
    assert reply.error is None, reply.error
    assert reply.perf["generated"] == MAX_TOKENS or reply.perf["finish_reason"] == "stop"


def test_acceptance_outputs_match_the_engine(url, prompts, tokenizer, in_process):
    _, spec_engine = in_process
    for text in prompts[:3]:
        g, _ = greedy(spec_engine, tokenizer, text)
        reply = generate(url, "ensemble", text, max_tokens=MAX_TOKENS, stream=True)
        assert reply.error is None, reply.error
        last, perf = reply.last, reply.perf
        assert perf["drafted"] > 0 and perf["accepted"] > 0
        assert last["total_draft_tokens"] == perf["drafted"] == g.stats.drafted
        assert last["total_accepted_draft_tokens"] == perf["accepted"] == g.stats.accepted
        assert last["acceptance_rate"] == pytest.approx(perf["accepted"] / perf["drafted"], abs=1e-6)
        assert perf["generated"] == len(reply.ids) == len(g.token_ids)
        # counters are cumulative in every response
        drafted = [r["total_draft_tokens"] for r in reply.responses]
        assert drafted == sorted(drafted)
        base = generate(url, "ensemble_baseline", text, max_tokens=8)
        assert base.last["total_draft_tokens"] == 0 and base.perf["drafted"] == 0


def test_metrics_move(server, url, prompts):
    before = metrics(server.endpoints.metrics)
    reply = generate(url, "ensemble", prompts[2], max_tokens=16)
    assert reply.error is None, reply.error
    after = metrics(server.endpoints.metrics)
    spec = {"model": "tensorrt_llm"}
    for name in ("trtspec_draft_tokens_total", "trtspec_accepted_tokens_total", "trtspec_generated_tokens_total"):
        assert metric(after, name, **spec) > metric(before, name, **spec), name
    assert metric(after, "trtspec_draft_tokens_total", **spec) - metric(before, "trtspec_draft_tokens_total", **spec) \
        == reply.perf["drafted"]
    for hist in ("trtspec_acceptance_length", "trtspec_draft_seconds", "trtspec_verify_seconds",
                 "trtspec_queue_seconds", "trtspec_tokens_per_second"):
        assert metric(after, f"{hist}_count", **spec) == metric(before, f"{hist}_count", **spec) + 1, hist
    assert metric(after, "trtspec_resident_memory_bytes", **spec) > 10e6
    assert metric(after, "trtspec_inflight_requests", **spec) == 0
    assert metric(after, "trtspec_router_requests_total", model="router", path="speculative") >= 1
    assert metric(after, "trtspec_router_fallback_active", model="router") == 0


@pytest.mark.parametrize("case, values, message", [
    ("empty text", {"text_input": ""}, "text_input is empty"),
    ("prompt too long", {"text_input": "x = 1\n" * 400}, "max_input_len is 256"),
    ("max_tokens 0", {"max_tokens": 0}, "max_tokens must be >= 1"),
    ("max_tokens < 0", {"max_tokens": -5}, "max_tokens must be >= 1"),
    ("max_tokens too many", {"max_tokens": 100_000}, "exceeds max_seq_len 512"),
    ("temperature < 0", {"temperature": -1.0}, "temperature must be in"),
    ("top_p > 1", {"top_p": 1.5}, "top_p must be in"),
    ("top_p < 0", {"top_p": -0.5}, "top_p must be in"),  # 0 is TRT-LLM's "off" (tests/unit/test_contract.py)
    ("top_k < 0", {"top_k": -2}, "top_k must be >= 0"),
    ("unknown sampling input", {"min_p": (0.1, "FP32")}, "unexpected inference input 'min_p'"),
])
def test_bad_input_is_a_clear_error_and_the_server_keeps_serving(url, case, values, message):
    values = {"text_input": "import os\n", "max_tokens": 8, **values}
    reply = generate(url, "ensemble", **values)
    assert reply.error is not None and message in reply.error, (case, reply.error)
    ok = generate(url, "ensemble", "import os\n", max_tokens=4)
    assert ok.error is None and ok.finals == 1


def test_sampling_is_seeded(url, prompts):
    kw = dict(max_tokens=12, temperature=0.8, top_k=40, top_p=0.95, seed=7)
    a, b = generate(url, "ensemble", prompts[3], **kw), generate(url, "ensemble", prompts[3], **kw)
    assert a.error is None and a.ids == b.ids and len(a.ids) > 0


def test_32_concurrent_streams_lose_nothing(url, prompts, tokenizer, in_process):
    reqs = [{"text_input": prompts[i % len(prompts)], "max_tokens": 16, "stream": True} for i in range(32)]
    replies = generate_many(url, "ensemble", reqs, timeout=240)
    want = {p: greedy(in_process[0], tokenizer, p, 16) for p in prompts}
    for req, reply in zip(reqs, replies):
        assert reply.error is None, reply.error
        assert reply.finals == 1
        assert reply.perf["generated"] == len(reply.ids)  # every streamed token arrived
        g, text = want[req["text_input"]]
        assert reply.ids == g.token_ids and reply.text == text


def test_unary_infer_is_rejected_for_decoupled_models(url):
    client = grpcclient.InferenceServerClient(url)
    with pytest.raises(InferenceServerException, match="decoupled"):
        client.infer("ensemble", [_text("x")])


def test_exclude_input_in_output_false_echoes_the_prompt(url):
    reply = generate(url, "ensemble", "import os\n", max_tokens=6, exclude_input_in_output=False)
    assert reply.error is None and reply.text.startswith("import os\n")


def test_draft_input_ids_are_verified_by_the_engine(url, tokenizer):
    """tensorrt_llm directly, with external drafts (the tensorrtllm backend's draft_input_ids)."""
    import numpy as np

    ids = tokenizer("def main(", add_special_tokens=False)["input_ids"]
    client = grpcclient.InferenceServerClient(url)
    results = []
    client.start_stream(callback=lambda result, error: results.append((result, error)))

    def t(name, arr, dt):
        x = grpcclient.InferInput(name, list(arr.shape), dt)
        x.set_data_from_numpy(arr)
        return x

    plain = [t("input_ids", np.array([ids], np.int32), "INT32"), t("input_lengths", np.array([[len(ids)]], np.int32), "INT32"),
             t("request_output_len", np.array([[6]], np.int32), "INT32"),
             # the generated ids only (the model's default, as NVIDIA's, leads with the prompt)
             t("exclude_input_in_output", np.array([[True]], bool), "BOOL")]
    client.async_stream_infer("tensorrt_llm_baseline", plain)
    _wait(results, 1)
    first = results[0][0].as_numpy("output_ids").reshape(-1).tolist()
    drafted = plain + [t("draft_input_ids", np.array([first[:3]], np.int32), "INT32")]
    client.async_stream_infer("tensorrt_llm_baseline", drafted)
    _wait(results, 2)
    client.stop_stream()
    res, err = results[1]
    assert err is None
    assert res.as_numpy("output_ids").reshape(-1).tolist() == first
    assert int(res.as_numpy("total_draft_tokens").reshape(-1)[0]) == 3
    assert int(res.as_numpy("total_accepted_draft_tokens").reshape(-1)[0]) == 3
    assert json.loads(res.as_numpy("perf_json").reshape(-1)[0])["generated"] == 6


def test_draft_target_bls_rounds_stream_the_target_greedy_text(url, tokenizer, prompts, in_process):
    import numpy as np

    g, _ = greedy(in_process[0], tokenizer, prompts[0])
    ids = tokenizer(prompts[0], add_special_tokens=False)["input_ids"]
    results = raw_stream(url, "trtspec_draft_target", {
        "input_ids": np.array([ids], np.int32), "input_lengths": np.array([[len(ids)]], np.int32),
        "request_output_len": np.array([[MAX_TOKENS]], np.int32), "streaming": np.array([[True]], bool)})
    out = [i for r in results for i in r.as_numpy("output_ids").reshape(-1).tolist()]
    assert out == g.token_ids
    assert len(results) > 1  # one response per round
    perf = json.loads(results[-1].as_numpy("perf_json").reshape(-1)[0])
    assert perf["drafted"] > 0 and 0 < perf["accepted"] <= perf["drafted"]
    assert int(results[-1].as_numpy("total_draft_tokens").reshape(-1)[0]) == perf["drafted"]
    assert perf["target_passes"] == len(results) and perf["generated"] == len(out)


def _wait(results, n, timeout=60):
    import time

    t0 = time.monotonic()
    while len(results) < n and time.monotonic() - t0 < timeout:
        time.sleep(0.02)
    assert len(results) >= n


def _text(s):
    import numpy as np

    t = grpcclient.InferInput("text_input", [1, 1], "BYTES")
    t.set_data_from_numpy(np.array([[s.encode()]], dtype=np.object_))
    return t


def test_server_owns_a_process_group_and_private_shared_memory(server):
    import os
    import pathlib

    assert server.running
    assert os.getpgid(server.proc.pid) == server.proc.pid  # stubs are killed with the group
    assert list(pathlib.Path("/dev/shm").glob(server.shm_prefix + "*"))  # removed by stop()


def test_worker_mode_engine_stubs_hold_no_torch(server, url, prompts):
    """serving.engine_process: worker (the default here): the engine models' stubs parse and answer
    while their workers hold torch and the weights, so no torch library is mapped into a stub."""
    import pathlib

    from trtspec.triton.procs import stubs_of, workers_of

    for model in ("ensemble", "ensemble_baseline"):
        generate(url, model, prompts[0], max_tokens=4)
    engines = [s for s in stubs_of(server.proc.pid) if s.model in ("tensorrt_llm", "tensorrt_llm_baseline")]
    assert {s.model for s in engines} == {"tensorrt_llm", "tensorrt_llm_baseline"}
    for stub in engines:
        workers = workers_of(stub.pid)
        assert workers, f"{stub.model}: no engine worker"
        assert "libtorch" not in pathlib.Path(f"/proc/{stub.pid}/maps").read_text(), f"{stub.model}'s stub loads torch"
        assert "libtorch" in pathlib.Path(f"/proc/{workers[0]}/maps").read_text()  # the check can see torch
