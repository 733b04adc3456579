"""NVIDIA's tensorrtllm-backend contract on a real tritonserver (CPU) with the tiny pair.

Requests have the shapes NVIDIA's clients send (tensors [1, 1], word lists [1, n], the defaults
beam_width 1 / return_* false): every declared ensemble input set and unset through ``ensemble``
and ``ensemble_baseline``; greedy speculation equals the baseline with stop words, bad words,
min_tokens and each penalty, streaming and not; rejected inputs give INVALID_ARG naming the input
and the server keeps serving; ``serving.decoupled: false`` answers unary ModelInfer.
"""

from __future__ import annotations

import queue

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from trtspec.config import parse_recipe
from trtspec.triton.render import package
from trtspec.triton.launch.server import TritonServer

MAX_TOKENS = 16
PROMPT = "    def __init__(self"


def recipe_dict(target, draft, decoupled: bool = True) -> dict:
    return {
        "name": "tiny-contract-test",
        "target": {"model": str(target)},
        "speculation": {"method": "draft_target", "draft": {"model": str(draft)}, "max_draft_len": 4},
        "runtime": {"backend": "torch", "dtype": "float32", "device": "cpu", "torch_threads": 1,
                    "adaptive": {"enabled": False, "min_acceptance_rate": 0.0}},  # always speculate
        "limits": {"max_batch_size": 8, "max_input_len": 256, "max_seq_len": 512},
        "serving": {"max_queue_size": 64, "decoupled": decoupled},
        "validation": {"max_tokens": MAX_TOKENS},
    }


@pytest.fixture(scope="module")
def server(tiny_models, tmp_path_factory):
    root = tmp_path_factory.mktemp("contract-serving")
    package(parse_recipe(recipe_dict(*tiny_models)), root / "repo")
    with TritonServer(root / "repo", workdir=root / "server", ready_timeout=300) as s:
        yield s


@pytest.fixture(scope="module")
def tokenizer(tiny_target):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_target)


@pytest.fixture(scope="module")
def url(server) -> str:
    return server.endpoints.grpc


def arr(v, dtype) -> np.ndarray:
    if dtype is object:
        v = [x.encode() if isinstance(x, str) else x for x in (v if isinstance(v, list) else [v])]
        return np.array([v], dtype=object)
    return np.array([[v]], dtype=dtype)


def tensors(values: dict) -> list:
    out = []
    for name, a in values.items():
        t = grpcclient.InferInput(name, list(a.shape), np_to_triton_dtype(a.dtype))
        t.set_data_from_numpy(a)
        out.append(t)
    return out


class Result:
    def __init__(self):
        self.responses: list = []
        self.error: InferenceServerException | None = None

    def get(self, name, i=None):
        return [r.as_numpy(name) for r in self.responses] if i is None else self.responses[i].as_numpy(name)

    def text(self, seq: int = 0) -> str:
        return "".join(r.as_numpy("text_output").reshape(-1)[0].decode() for r in self.responses
                       if int(r.as_numpy("sequence_index").reshape(-1)[0]) == seq)

    def ids(self, seq: int = 0) -> list[int]:
        return [int(x) for r in self.responses if int(r.as_numpy("sequence_index").reshape(-1)[0]) == seq
                for x in r.as_numpy("output_ids").reshape(-1)]


def stream(url: str, model: str, values: dict, timeout: float = 180) -> Result:
    """One request on a gRPC stream (as NVIDIA's end_to_end_grpc_client sends it, streaming or not)."""
    client = grpcclient.InferenceServerClient(url)
    q: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: q.put((result, error)))
    res = Result()
    try:
        client.async_stream_infer(model, tensors(values), enable_empty_final_response=True)
        while True:
            result, error = q.get(timeout=timeout)
            if error is not None:
                res.error = error
                return res
            if result.as_numpy("text_output") is not None or result.as_numpy("output_ids") is not None:
                res.responses.append(result)
            if result.get_response().parameters["triton_final_response"].bool_param:
                return res
    finally:
        client.stop_stream()
        client.close()


def text_request(prompt: str = PROMPT, **values) -> dict:
    base = {"text_input": arr(prompt, object), "max_tokens": arr(MAX_TOKENS, np.int32)}
    return {**base, **values}


# every ensemble input: a value to send, and whether the server must refuse it (INVALID_ARG)
SET = {
    "num_return_sequences": (arr(1, np.int32), False),
    "bad_words": (arr([" return", "self"], object), False),
    "stop_words": (arr(["\n"], object), False),
    "exclude_input_in_output": (arr(True, bool), False),
    "end_id": (arr(0, np.int32), False),
    "pad_id": (arr(0, np.int32), False),
    "top_k": (arr(1, np.int32), False),
    "top_p": (arr(0.0, np.float32), False),
    "temperature": (arr(1.0, np.float32), False),
    "length_penalty": (arr(1.0, np.float32), False),
    "repetition_penalty": (arr(1.2, np.float32), False),
    "min_tokens": (arr(4, np.int32), False),
    "presence_penalty": (arr(0.5, np.float32), False),
    "frequency_penalty": (arr(0.5, np.float32), False),
    "seed": (arr(3, np.uint64), False),
    "random_seed": (arr(3, np.uint64), False),
    "min_length": (arr(4, np.int32), False),
    "return_log_probs": (arr(True, bool), False),
    "return_context_logits": (arr(False, bool), False),
    "return_generation_logits": (arr(False, bool), False),
    "return_perf_metrics": (arr(True, bool), False),
    "beam_width": (arr(1, np.int32), False),
    "stream": (arr(True, bool), False),
    "decoder_text_input": (arr("x", object), True),
    "prompt_embedding_table": (np.zeros((1, 2, 4), np.float16), True),
    "prompt_table_extra_id": (arr(1, np.uint64), True),
    "prompt_vocab_size": (arr(2, np.int32), True),
    "embedding_bias_words": (arr(["x"], object), True),
    "embedding_bias_weights": (np.array([[1.0]], np.float32), True),
    "lora_task_id": (arr(1, np.uint64), True),
    "lora_weights": (np.zeros((1, 2, 4), np.float16), True),
    "lora_config": (np.zeros((1, 2, 3), np.int32), True),
    "guided_decoding_guide_type": (arr("json", object), True),
    "guided_decoding_guide": (arr("{}", object), True),
}
REFUSED_VALUES = {"beam_width": arr(2, np.int32), "return_context_logits": arr(True, bool),
                  "return_generation_logits": arr(True, bool)}


def test_the_table_covers_every_declared_ensemble_input():
    from trtspec.triton.contract import EXTRA_INPUTS, nvidia_contract

    names = {t["name"] for t in nvidia_contract()["ensemble"]["inputs"]} | {n for m, n in EXTRA_INPUTS if m == "ensemble"}
    assert names - {"text_input", "max_tokens"} == set(SET)


@pytest.mark.parametrize("model", ["ensemble", "ensemble_baseline"])
def test_every_declared_input_set_and_unset(url, model):
    plain = stream(url, model, text_request())
    assert plain.error is None and plain.text() and plain.ids()
    for name, (value, refused) in SET.items():
        res = stream(url, model, text_request(**{name: value}))
        if refused:  # a stream error carries no status code; unary ModelInfer's does (test below)
            assert res.error is not None, name
            assert f"input '{name}'" in res.error.message() and "is not supported" in res.error.message(), (
                name, res.error.message())
        else:
            assert res.error is None, (name, res.error)
            assert res.text() or name in ("stop_words",), name
    for name, value in REFUSED_VALUES.items():
        res = stream(url, model, text_request(**{name: value}))
        assert res.error is not None and f"input '{name}'=" in res.error.message(), (name, res.error)
    again = stream(url, model, text_request())  # still serving, same answer
    assert again.error is None and again.ids() == plain.ids()


PROCESSORS = {
    # words taken from each prompt's own greedy output (see the test), so they always occur
    "stop_words": {"stop_words": "token 4 of the output"},
    "bad_words": {"bad_words": "tokens 1 and 3 of the output"},
    # end_id = token 6 of the output, so that without min_tokens the output ends by then
    "min_tokens": {"min_tokens": arr(12, np.int32), "max_tokens": arr(24, np.int32), "end_id": "token 6"},
    # its name before c2e65b8, which genai-perf 0.0.16 sends for --output-tokens-mean-deterministic
    "min_length": {"min_length": arr(12, np.int32), "max_tokens": arr(24, np.int32), "end_id": "token 6"},
    "repetition_penalty": {"repetition_penalty": arr(1.5, np.float32)},
    "presence_penalty": {"presence_penalty": arr(1.5, np.float32)},
    "frequency_penalty": {"frequency_penalty": arr(1.0, np.float32)},
}


@pytest.mark.parametrize("name", sorted(PROCESSORS))
@pytest.mark.parametrize("streaming", [False, True])
def test_greedy_speculation_equals_the_baseline_under_each_processor(url, name, streaming, tokenizer):
    extra = {**PROCESSORS[name], "stream": arr(streaming, bool), "exclude_input_in_output": arr(True, bool)}
    prompts = [PROMPT, "import os\nimport sys\n\ndef main(", "class Error(Exception):\n    "]
    changed = False
    for p in prompts:
        # the same request without the processor (max_tokens kept)
        free = stream(url, "ensemble_baseline", text_request(p, **{k: v for k, v in extra.items()
                                                                   if k not in PROCESSORS[name] or k == "max_tokens"}))
        assert free.error is None and len(free.ids()) > 6, free.error
        if name.startswith("min_"):  # with end_id alone the output stops at token 6 at the latest
            extra["end_id"] = arr(free.ids()[5], np.int32)
            stopped = stream(url, "ensemble_baseline", text_request(p, **{k: v for k, v in extra.items() if k != name}))
            assert stopped.error is None and len(stopped.ids()) <= 6, (p, stopped.ids())
            free = stopped
        if name == "stop_words":
            extra["stop_words"] = arr([tokenizer.decode(free.ids()[4:5])], object)
        if name == "bad_words":
            extra["bad_words"] = arr([tokenizer.decode(free.ids()[i:i + 1]) for i in (1, 3)], object)
        spec = stream(url, "ensemble", text_request(p, **extra))
        base = stream(url, "ensemble_baseline", text_request(p, **extra))
        for r in (spec, base):
            assert r.error is None, r.error
        assert spec.ids() == base.ids() and spec.text() == base.text(), p
        if name.startswith("min_"):
            assert len(base.ids()) >= 12, (p, len(base.ids()))
        assert spec.responses[-1].as_numpy("served_by").reshape(-1)[0] == b"speculative"
        changed |= base.ids() != free.ids()[: len(base.ids())] or len(base.ids()) != len(free.ids())
    assert changed, f"{name} changed no output: the test would prove nothing"


def test_log_probs_perf_metrics_and_exclude_input(url):
    res = stream(url, "ensemble", text_request(return_log_probs=arr(True, bool), return_perf_metrics=arr(True, bool),
                                               exclude_input_in_output=arr(False, bool)))
    assert res.error is None
    final = res.responses[-1]
    lps = final.as_numpy("output_log_probs").reshape(-1)
    assert len(lps) == len(res.ids()) and (lps <= 0).all()
    assert final.as_numpy("cum_log_probs").reshape(-1)[0] == pytest.approx(float(lps.sum()), rel=1e-4)
    base = stream(url, "ensemble_baseline", text_request(return_log_probs=arr(True, bool)))
    np.testing.assert_allclose(base.responses[-1].as_numpy("output_log_probs").reshape(-1), lps, atol=1e-3)
    t = {n: int(final.as_numpy(n).reshape(-1)[0]) for n in
         ("arrival_time_ns", "first_scheduled_time_ns", "first_token_time_ns", "last_token_time_ns")}
    assert 0 < t["arrival_time_ns"] <= t["first_scheduled_time_ns"] <= t["first_token_time_ns"] <= t["last_token_time_ns"]
    drafted = int(final.as_numpy("total_draft_tokens").reshape(-1)[0])
    accepted = int(final.as_numpy("total_accepted_draft_tokens").reshape(-1)[0])
    assert drafted > 0 and final.as_numpy("acceptance_rate").reshape(-1)[0] == pytest.approx(accepted / drafted)
    assert int(final.as_numpy("kv_cache_alloc_total_blocks").reshape(-1)[0]) == 1
    # not streaming and exclude_input_in_output false: the prompt leads the text (as NVIDIA's)
    assert res.text().startswith(PROMPT) and len(res.text()) > len(PROMPT)
    streamed = stream(url, "ensemble", text_request(stream=arr(True, bool), exclude_input_in_output=arr(False, bool)))
    assert not streamed.text().startswith(PROMPT) and PROMPT + streamed.text() == res.text()


def test_num_return_sequences_samples_n_sequences(url):
    """Three seeded samples per request. The baseline repeats them exactly. The speculative path
    repeats them only when the goodput policy picks the same draft length at every step (the draft
    length decides how many random draws a step takes, and the policy follows measured step times):
    in `make test` on 2026-12-08, with both workers loading the 2 cores, one sequence came back
    different (docs/serving.md, known limits). So there the repeat is checked for three sequences only."""
    values = text_request(num_return_sequences=arr(3, np.int32), temperature=arr(1.0, np.float32),
                          top_k=arr(50, np.int32), seed=arr(11, np.uint64), stream=arr(True, bool))
    for model in ("ensemble", "ensemble_baseline"):
        res = stream(url, model, values)
        assert res.error is None, res.error
        seqs = {int(r.as_numpy("sequence_index").reshape(-1)[0]) for r in res.responses}
        assert seqs == {0, 1, 2}
        texts = [res.text(i) for i in range(3)]
        assert all(texts) and len(set(texts)) > 1, texts
        again = stream(url, model, values)
        assert again.error is None and all(again.text(i) for i in range(3))
        if model == "ensemble_baseline":  # seeded: the same three
            assert [again.text(i) for i in range(3)] == texts


def test_tensorrt_llm_takes_nvidias_inflight_client_request(url, tokenizer):
    """input_ids … as inflight_batcher_llm_client.py sends them (top_k 1, top_p 0, beam 1, end/pad
    ids, no exclude_input_in_output: the model parameter says false, so the prompt leads)."""
    ids = tokenizer(PROMPT, add_special_tokens=False)["input_ids"]
    values = {"input_ids": np.array([ids], np.int32), "input_lengths": arr(len(ids), np.int32),
              "request_output_len": arr(MAX_TOKENS, np.int32), "beam_width": arr(1, np.int32),
              "temperature": arr(1.0, np.float32), "streaming": arr(False, bool), "end_id": arr(0, np.int32),
              "pad_id": arr(0, np.int32), "runtime_top_k": arr(1, np.int32), "runtime_top_p": arr(0.0, np.float32)}
    res = stream(url, "tensorrt_llm", values)
    assert res.error is None, res.error
    out = res.responses[-1].as_numpy("output_ids").reshape(-1).tolist()
    assert out[: len(ids)] == ids and len(out) > len(ids)
    assert int(res.responses[-1].as_numpy("sequence_length").reshape(-1)[0]) == len(out)
    ens = stream(url, "ensemble_baseline", text_request(exclude_input_in_output=arr(True, bool)))
    assert out[len(ids):] == ens.ids()


@pytest.fixture(scope="module")
def unary_url(tiny_models, tmp_path_factory):
    root = tmp_path_factory.mktemp("contract-unary")
    package(parse_recipe(recipe_dict(*tiny_models, decoupled=False)), root / "repo")
    with TritonServer(root / "repo", workdir=root / "server", ready_timeout=300) as s:
        yield s.endpoints.grpc


def test_not_decoupled_answers_unary_model_infer(unary_url):
    client = grpcclient.InferenceServerClient(unary_url)
    try:
        req = text_request(exclude_input_in_output=arr(True, bool), stop_words=arr([":"], object),
                           return_perf_metrics=arr(True, bool))
        spec = client.infer("ensemble", tensors(req))
        base = client.infer("ensemble_baseline", tensors(req))
        assert spec.as_numpy("text_output").reshape(-1)[0] == base.as_numpy("text_output").reshape(-1)[0] != b""
        assert spec.as_numpy("output_ids").tolist() == base.as_numpy("output_ids").tolist()
        pre = client.infer("preprocessing", tensors({"QUERY": arr(PROMPT, object),
                                                     "REQUEST_OUTPUT_LEN": arr(8, np.int32),
                                                     "STOP_WORDS_DICT": arr([":"], object)}))
        assert pre.as_numpy("STOP_WORDS_IDS").shape[:2] == (1, 2) and pre.as_numpy("BAD_WORDS_IDS").shape == (1, 2, 0)
        ids = pre.as_numpy("INPUT_ID")
        gen = client.infer("tensorrt_llm", tensors({"input_ids": ids, "input_lengths": pre.as_numpy("REQUEST_INPUT_LEN"),
                                                    "request_output_len": arr(8, np.int32)}))
        assert gen.as_numpy("output_ids").reshape(-1)[: ids.shape[1]].tolist() == ids.reshape(-1).tolist()
        with pytest.raises(InferenceServerException, match="stream=true needs a decoupled model"):
            client.infer("ensemble", tensors(text_request(stream=arr(True, bool))))
        for name, value in [*((n, v) for n, (v, refused) in SET.items() if refused), *REFUSED_VALUES.items()]:
            with pytest.raises(InferenceServerException) as e:
                client.infer("ensemble_baseline", tensors(text_request(**{name: value})))
            assert e.value.status() == "StatusCode.INVALID_ARGUMENT" and f"input '{name}'" in e.value.message()
        assert client.infer("ensemble", tensors(req)).as_numpy("output_ids").tolist() == spec.as_numpy("output_ids").tolist()
    finally:
        client.close()
