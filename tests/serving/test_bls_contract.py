"""NVIDIA's text-level ``tensorrt_llm_bls`` and external draft-target speculation on a real
tritonserver (CPU) with the tiny pair, as ``trtspec package`` renders a draft-target recipe.

* every declared BLS input, set and unset, without drafts (relayed to ``ensemble_baseline``) and
  with ``num_draft_tokens`` (rounds over ``tensorrt_llm_draft`` and the plain target); refused
  inputs name themselves and the model keeps serving;
* greedy output of the BLS, with and without drafts, equals the ensemble's for the same prompt;
* the flow of NVIDIA's ``e2e_grpc_speculative_decoding_client.py`` (our own code, same request
  shapes: unary ``infer`` of preprocessing → tensorrt_llm_draft → tensorrt_llm with
  ``draft_input_ids`` → postprocessing) against a ``serving.decoupled: false`` repository gives
  plain greedy decoding's output; rejected inputs answer INVALID_ARGUMENT there.
"""

from __future__ import annotations

import queue
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.serving.test_contract_serving import SET, arr, recipe_dict, stream, tensors, text_request
from tests.serving.triton_stream import metric, metrics
from trtspec.config import parse_recipe
from trtspec.triton.contract import EXTRA_INPUTS, nvidia_contract
from trtspec.triton.launch.server import TritonServer
from trtspec.triton.render import package

PROMPTS = ["    def __init__(self", "import os\nimport sys\n\ndef main(", "class Error(Exception):\n    "]
K = 4  # the recipe's max_draft_len

# the BLS's own inputs beyond the ensemble's: (value, refused without drafts, refused with drafts)
BLS_SET = {
    **{n: (v, refused, refused) for n, (v, refused) in SET.items() if n != "stream"},
    "stream": (arr(True, bool), False, True),  # NVIDIA's BLS: no streaming with speculative decoding
    "num_draft_tokens": (arr(2, np.int32), False, False),
    "use_draft_logits": (arr(False, bool), False, False),
    "image_input": (np.zeros((1, 1, 3, 2, 2), np.float16), True, True),
    "image_bytes_input": (np.zeros((1, 1, 2, 2, 3), np.uint8), True, True),
    "image_url_input": (arr("http://x/y.png", object), True, True),
    "video_bytes_input": (np.zeros((1, 1, 2, 2, 3), np.uint8), True, True),
}
# what a round cannot carry exactly (each round re-sends the context as a new prompt)
NOT_IN_ROUNDS = {"presence_penalty", "frequency_penalty", "return_log_probs"}


def repository(tiny_models, root, decoupled: bool):
    recipe = recipe_dict(*tiny_models, decoupled=decoupled)
    # room for a request that runs for seconds (LONG), so a cancel that arrives late still shows
    recipe["limits"]["max_seq_len"] = 2048
    package(parse_recipe(recipe), root / "repo")
    return root / "repo"


@pytest.fixture(scope="module")
def server(tiny_models, tmp_path_factory):
    root = tmp_path_factory.mktemp("bls-contract")
    with TritonServer(repository(tiny_models, root, True), workdir=root / "server", ready_timeout=300) as s:
        yield s


@pytest.fixture(scope="module")
def url(server):
    return server.endpoints.grpc


@pytest.fixture(scope="module")
def unary_url(tiny_models, tmp_path_factory):
    root = tmp_path_factory.mktemp("bls-contract-unary")
    with TritonServer(repository(tiny_models, root, False), workdir=root / "server", ready_timeout=300) as s:
        yield s.endpoints.grpc


def test_the_table_covers_every_declared_bls_input():
    names = {t["name"] for t in nvidia_contract()["tensorrt_llm_bls"]["inputs"]} | \
        {n for m, n in EXTRA_INPUTS if m == "tensorrt_llm_bls"}
    assert names - {"text_input", "max_tokens"} == set(BLS_SET)


def drafts(**values) -> dict:
    return text_request(**{"num_draft_tokens": arr(K, np.int32), **values})


@pytest.mark.parametrize("with_drafts", [False, True])
def test_every_declared_bls_input_set_and_unset(url, with_drafts):
    request = drafts if with_drafts else text_request
    plain = stream(url, "tensorrt_llm_bls", request())
    assert plain.error is None and plain.text() and plain.ids()
    for name, (value, refused_plain, refused_rounds) in BLS_SET.items():
        refused = refused_rounds or name in NOT_IN_ROUNDS if with_drafts else refused_plain
        values = {name: value} if name != "num_draft_tokens" or not with_drafts else {}
        res = stream(url, "tensorrt_llm_bls", request(**values))
        if refused:  # a stream error carries no status code; unary ModelInfer's does (test below)
            assert res.error is not None, name
            assert f"input '{name}'" in res.error.message(), (name, res.error.message())
        else:
            assert res.error is None, (name, res.error)
            assert res.text() or name == "stop_words", name
    again = stream(url, "tensorrt_llm_bls", request())  # still serving, same answer
    assert again.error is None and again.ids() == plain.ids()


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_bls_equals_the_ensemble(url, prompt):
    want = stream(url, "ensemble", text_request(prompt))
    assert want.error is None and len(want.ids()) > 4
    for label, values in (("relayed", {}), ("relayed, streaming", {"stream": arr(True, bool)}),
                          ("draft-target rounds", {"num_draft_tokens": arr(K, np.int32)}),
                          ("one draft token per round", {"num_draft_tokens": arr(1, np.int32)})):
        got = stream(url, "tensorrt_llm_bls", text_request(prompt, **values))
        assert got.error is None, (label, got.error)
        assert got.ids() == want.ids() and got.text() == want.text(), label
        if "num_draft_tokens" in values:
            final = got.responses[-1]
            assert len(got.responses) == 1
            drafted = int(final.as_numpy("total_draft_tokens").reshape(-1)[0])
            accepted = int(final.as_numpy("total_accepted_draft_tokens").reshape(-1)[0])
            assert 0 < drafted <= int(values["num_draft_tokens"][0, 0]) * len(want.ids()) and 0 <= accepted <= drafted


def test_rounds_carry_stop_words_and_repetition_penalty(url, tokenizer):
    free = stream(url, "ensemble_baseline", text_request(PROMPTS[1]))
    stop = tokenizer.decode(free.ids()[5:6])
    extra = {"stop_words": arr([stop], object), "repetition_penalty": arr(1.5, np.float32),
             "exclude_input_in_output": arr(False, bool)}
    base = stream(url, "ensemble_baseline", text_request(PROMPTS[1], **extra))
    got = stream(url, "tensorrt_llm_bls", drafts(**extra, text_input=arr(PROMPTS[1], object)))
    assert base.error is None and got.error is None, (base.error, got.error)
    assert base.ids() != free.ids()  # the processors changed the output
    assert got.ids() == base.ids() and got.text() == base.text() and got.text().startswith(PROMPTS[1])


@pytest.fixture(scope="module")
def tokenizer(tiny_target):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_target)


def speculative_client(client, prompt: str, output_len: int, k: int, target: str) -> tuple[list[int], str]:
    """NVIDIA's e2e_grpc_speculative_decoding_client.py flow, our own code: unary calls only."""
    pre = client.infer("preprocessing", tensors({"QUERY": arr(prompt, object),
                                                 "REQUEST_OUTPUT_LEN": arr(output_len, np.int32)}))
    prompt_ids = pre.as_numpy("INPUT_ID").astype(np.int32)[0]
    end_id, pad_id = int(pre.as_numpy("OUT_END_ID")[0][0]), int(pre.as_numpy("OUT_PAD_ID")[0][0])

    def call(model, ids, n, draft=None):
        values = {"input_ids": np.array([ids], np.int32), "input_lengths": arr(len(ids), np.int32),
                  "request_output_len": arr(n, np.int32), "bad_words_list": pre.as_numpy("BAD_WORDS_IDS"),
                  "stop_words_list": pre.as_numpy("STOP_WORDS_IDS"), "beam_width": arr(1, np.int32),
                  "temperature": arr(1.0, np.float32), "end_id": arr(end_id, np.int32), "pad_id": arr(pad_id, np.int32)}
        if draft is not None:
            values["draft_input_ids"] = np.array([draft], np.int32)
        res = client.infer(model, tensors(values))
        out = res.as_numpy("output_ids")[0][0]
        return out[: int(res.as_numpy("sequence_length")[0][0])]

    ids = prompt_ids
    while True:
        n = min(k, len(prompt_ids) + output_len - len(ids) - 1)
        draft = call("tensorrt_llm_draft", ids, n)[len(ids):] if n > 0 else None
        last, ids = ids, call(target, ids, len(draft) + 1 if draft is not None else 1, draft)
        if len(ids) >= len(prompt_ids) + output_len or np.array_equal(last, ids):
            break
    post = client.infer("postprocessing", tensors({"TOKENS_BATCH": np.array([[ids]], np.int32),
                                                   "SEQUENCE_LENGTH": arr(len(ids), np.int32)}))
    return ids[len(prompt_ids):].tolist(), post.as_numpy("OUTPUT")[0].decode()


@pytest.mark.parametrize("target", ["tensorrt_llm", "tensorrt_llm_baseline"])
def test_nvidias_speculative_client_flow_gives_plain_greedy(unary_url, target):
    client = grpcclient.InferenceServerClient(unary_url)
    try:
        for prompt in PROMPTS:
            plain = client.infer("ensemble_baseline", tensors(text_request(prompt, exclude_input_in_output=arr(False, bool))))
            ids, text = speculative_client(client, prompt, 16, K, target)
            assert ids == plain.as_numpy("output_ids").reshape(-1).tolist()
            assert text == plain.as_numpy("text_output").reshape(-1)[0].decode()
    finally:
        client.close()


REFUSED_UNARY = {
    "use_draft_logits": drafts(use_draft_logits=arr(True, bool)),
    "num_draft_tokens": drafts(num_draft_tokens=arr(K + 1, np.int32)),
    "stream": drafts(stream=arr(True, bool)),
    "presence_penalty": drafts(presence_penalty=arr(0.5, np.float32)),
    "return_log_probs": drafts(return_log_probs=arr(True, bool)),
    "image_url_input": text_request(image_url_input=arr("http://x/y.png", object)),
    "decoder_text_input": drafts(decoder_text_input=arr("x", object)),
    "lora_task_id": text_request(lora_task_id=arr(1, np.uint64)),
    "beam_width": drafts(beam_width=arr(2, np.int32)),
    "text_input": {"max_tokens": arr(8, np.int32)},
}


def test_bls_unary_and_rejected_inputs_give_invalid_argument(unary_url):
    client = grpcclient.InferenceServerClient(unary_url)
    try:
        want = client.infer("ensemble", tensors(text_request(PROMPTS[0])))
        for values in (text_request(PROMPTS[0]), drafts(text_input=arr(PROMPTS[0], object))):
            got = client.infer("tensorrt_llm_bls", tensors(values))
            assert got.as_numpy("output_ids").reshape(-1).tolist() == want.as_numpy("output_ids").reshape(-1).tolist()
            assert got.as_numpy("text_output").reshape(-1)[0] == want.as_numpy("text_output").reshape(-1)[0]
        for name, values in REFUSED_UNARY.items():
            with pytest.raises(InferenceServerException) as e:
                client.infer("tensorrt_llm_bls", tensors(values))
            assert e.value.status() == "StatusCode.INVALID_ARGUMENT", (name, e.value)
            assert f"input '{name}'" in e.value.message(), (name, e.value.message())
        # still serving
        again = client.infer("tensorrt_llm_bls", tensors(drafts(text_input=arr(PROMPTS[0], object))))
        assert again.as_numpy("output_ids").reshape(-1).tolist() == want.as_numpy("output_ids").reshape(-1).tolist()
    finally:
        client.close()


def test_a_client_that_goes_away_stops_the_relayed_request(server, url):
    """A streamed BLS request relayed to ensemble_baseline: the client cancels after 3 responses;
    the BLS cancels its call, the ensemble's postprocessing stops the engine (not max_tokens).
    The cancel crosses four hops (BLS, ensemble, postprocessing, engine stub), each polled: 350
    tokens were seen on a loaded 2-core CI box (about 1.5 s at the tiny pair's rate), hence a
    request that would run for several seconds."""
    long = 1800

    def engine(name):
        return metric(metrics(server.endpoints.metrics), name, model="tensorrt_llm_baseline")

    before = engine("trtspec_generated_tokens_total")
    cancelled = engine("trtspec_requests_cancelled_total")
    client = grpcclient.InferenceServerClient(url)
    q: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: q.put(error))
    try:
        client.async_stream_infer("tensorrt_llm_bls", tensors(text_request(
            PROMPTS[1], max_tokens=arr(long, np.int32), stream=arr(True, bool))))
        for _ in range(3):
            assert q.get(timeout=60) is None
    finally:
        client.stop_stream(cancel_requests=True)
        client.close()
    deadline = time.monotonic() + 30
    while engine("trtspec_inflight_requests") != 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert engine("trtspec_inflight_requests") == 0
    generated = engine("trtspec_generated_tokens_total") - before
    assert 0 < generated < long / 2, generated
    assert engine("trtspec_requests_cancelled_total") == cancelled + 1  # stopped by the cancel
    assert stream(url, "tensorrt_llm_bls", text_request()).error is None  # still serving
