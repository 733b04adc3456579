"""Per-request limits (trtspec.limits.RequestLimits), in-process: every field over its limit is
refused by name before anything is built, the limits travel from the recipe into every python
model's config, and the engine's processors never index with a caller's negative id.
The same checks against the real server: tests/serving/test_attack_limits.py."""

from __future__ import annotations

import json
import pathlib
import time

import numpy as np
import pytest

from trtspec.config import Limits
from trtspec.limits import RequestInputError, RequestLimits
from trtspec.triton.backend.common import redact_paths
from trtspec.triton.backend.requests import parse_generation, words_tensor

REPO = pathlib.Path(__file__).resolve().parents[2]
LIM = RequestLimits(max_seq_len=64, max_input_len=32, vocab_size=100, max_return_sequences=4, max_words=3,
                    max_word_tokens=4)


def one(v, dtype=np.int32):
    return np.array([[v]], dtype)


def _get(**tensors):
    base = {"input_ids": np.array([[5, 6, 7]], np.int32), "request_output_len": one(4)}
    base.update(tensors)
    return lambda name: base.get(name)


@pytest.mark.parametrize("tensors, field", [
    ({"num_return_sequences": one(2_000_000_000)}, "num_return_sequences"),
    ({"num_return_sequences": one(5)}, "num_return_sequences"),
    ({"request_output_len": one(2_000_000_000)}, "request_output_len"),
    ({"min_tokens": one(1_000_000)}, "min_tokens"),
    ({"end_id": one(100)}, "end_id"),
    ({"end_id": one(-1_000_000_000)}, "end_id"),
    ({"pad_id": one(1 << 30)}, "pad_id"),
    ({"input_ids": np.array([[5, -3, 7]], np.int32)}, "input_ids"),
    ({"input_ids": np.array([[5, 100, 7]], np.int32)}, "input_ids"),
    ({"input_ids": np.ones((1, 64), np.int32)}, "input_ids"),
    ({"draft_input_ids": np.array([[1, -1]], np.int32)}, "draft_input_ids"),
    # the attack that failed every co-batched request inside Engine.step (issue 30)
    ({"bad_words_list": words_tensor([(5,), (6, -1_000_000_000)])}, "bad_words_list"),
    ({"stop_words_list": words_tensor([(5,), (1_000_000,)])}, "stop_words_list"),
    ({"stop_words_list": words_tensor([(1,), (2,), (3,), (4,)])}, "stop_words_list"),
    ({"bad_words_list": words_tensor([(1, 2, 3, 4, 5)])}, "bad_words_list"),
])
def test_each_field_over_its_limit_is_refused_by_name(tensors, field):
    with pytest.raises(RequestInputError, match=field) as e:
        parse_generation(_get(**tensors), limits=LIM)
    assert e.value.fix, "every refusal says how to fix it"


def test_the_limit_and_the_recipe_field_are_named():
    with pytest.raises(RequestInputError) as e:
        parse_generation(_get(num_return_sequences=one(2_000_000_000)), limits=LIM)
    msg = str(e.value)
    assert "2000000000" in msg and "limit of 4" in msg and "limits.max_return_sequences" in msg


def test_within_the_limits_everything_passes():
    req = parse_generation(_get(num_return_sequences=one(4), end_id=one(-1), pad_id=one(99),
                                stop_words_list=words_tensor([(1,), (2, 3)]),
                                bad_words_list=words_tensor([(4, 5, 6, 7)])), limits=LIM)
    assert req.num_return_sequences == 4 and req.sampling.end_id is None and req.sampling.pad_id == 99
    assert req.sampling.stop_words == ((1,), (2, 3)) and req.sampling.bad_words == ((4, 5, 6, 7),)


def test_a_huge_tensor_is_refused_from_its_shape_before_it_is_read():
    # a [1, 2**31] view of one element: converting it to a list would take tens of GB
    huge = np.broadcast_to(np.int32(1), (1, 2**31))
    for name in ("input_ids", "draft_input_ids", "stop_words_list", "bad_words_list"):
        t0 = time.perf_counter()
        with pytest.raises(RequestInputError, match=name):
            parse_generation(_get(**{name: huge}), limits=LIM)
        assert time.perf_counter() - t0 < 0.5, f"{name} was read before it was refused"


def test_defaults_apply_without_a_limits_parameter():
    assert RequestLimits.from_json(None) == RequestLimits() == RequestLimits.from_json("")
    with pytest.raises(RequestInputError, match="num_return_sequences"):
        parse_generation(_get(num_return_sequences=one(2_000_000_000)))


def test_limits_round_trip_from_the_recipe():
    recipe = Limits(max_return_sequences=2, max_words=7, max_seq_len=300, max_input_len=100)
    lim = RequestLimits.from_recipe(recipe, vocab_size=1234)
    assert (lim.max_return_sequences, lim.max_words, lim.max_seq_len, lim.vocab_size) == (2, 7, 300, 1234)
    assert RequestLimits.from_json(lim.to_json()) == lim
    # every per-request field of the recipe's limits reaches RequestLimits (no silent drop)
    request_fields = set(RequestLimits.__dataclass_fields__) - {"vocab_size"}
    assert request_fields <= set(Limits.model_fields)


@pytest.mark.parametrize("field, bad", [("max_return_sequences", 0), ("max_words", -1), ("max_body_bytes", 10),
                                        ("max_concurrent_requests", 0)])
def test_recipe_limits_are_validated(field, bad):
    with pytest.raises(ValueError, match=field):
        Limits(**{field: bad})


def test_every_python_model_gets_the_limits(tmp_path):
    from trtspec.config import load_recipe
    from trtspec.triton.render import PYTHON_TEMPLATES, inputs_from_recipe, plan_repository

    recipe = load_recipe(REPO / "build_configs" / "llama3.3-70b-draft-target-fp8-trtllm.yaml")
    plans = plan_repository(inputs_from_recipe(recipe, build_dir=tmp_path / "build"))
    python = [p for p in plans if p.template in PYTHON_TEMPLATES]
    assert {p.name for p in python} >= {"preprocessing", "postprocessing", "router", "trtspec_draft_target",
                                        "tensorrt_llm_bls"}
    for p in python:
        lim = RequestLimits.from_json(p.values["request_limits"])
        assert lim.max_seq_len == recipe.limits.max_seq_len
        assert lim.max_return_sequences == recipe.limits.max_return_sequences
    # NVIDIA's C++ engines and Triton's ensembles run no trtspec code: no parameter for them
    assert all("request_limits" not in p.values for p in plans if p.template not in PYTHON_TEMPLATES)


def test_negative_bad_word_never_indexes_the_logits():
    torch = pytest.importorskip("torch")
    from trtspec.sampling import Sampling
    from trtspec.speculative.processors import process_window

    params = Sampling(max_tokens=4, bad_words=((-1_000_000_000,), (3,)))
    out = process_window(torch.zeros(1, 10), params, [1, 2], 1, [], set())
    assert out[0, 3] == float("-inf") and torch.isfinite(out[0, :3]).all()


def test_client_errors_carry_no_server_paths():
    msg = "tensorrt_llm: internal error: FileNotFoundError: [Errno 2] No such file: '/srv/models/t/config.json'"
    assert "/srv" not in redact_paths(msg) and "FileNotFoundError" in redact_paths(msg)
    for keep in ("top_p must be in [0, 1] (0 = off)", "see https://example.com/a/b", "3/4 accepted"):
        assert redact_paths(keep) == keep
    assert json.loads(RequestLimits().to_json())["max_return_sequences"] == 4
