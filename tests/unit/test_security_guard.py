"""The checks internal models make before spending anything on a request (trtspec.triton.backend.guard),
and the request ids and stop signatures of trtspec.triton.backend.cancel; pure, no server."""

from __future__ import annotations

import re

import numpy as np
import pytest

from trtspec.config import parse_recipe
from trtspec.triton.access import verify_stop_id
from trtspec.triton.backend.cancel import new_request_id
from trtspec.triton.backend.guard import check_draft_ids, check_prompt_bytes, check_sizes, is_fatal_device_error
from trtspec.triton.backend.requests import RequestInputError


@pytest.mark.parametrize("drafts, match", [
    ([5, 100], r"out of the vocabulary \[0, 100\): \[100\]"),
    ([-1, 3], r"out of the vocabulary .*\[-1\]"),
    ([1, 2, 3, 4, 5], "has 5 tokens; max_draft_len is 4"),
])
def test_bad_draft_ids_are_request_errors(drafts, match):
    with pytest.raises(RequestInputError, match=match):
        check_draft_ids(drafts, vocab_size=100, max_draft_len=4)


def test_good_draft_ids_pass():
    check_draft_ids(None, vocab_size=100, max_draft_len=4)
    check_draft_ids([0, 99, 5, 7], vocab_size=100, max_draft_len=4)


def test_sizes_are_checked_from_shapes_before_conversion():
    arrays = {"input_ids": np.zeros((1, 10), np.int32), "draft_input_ids": np.zeros((1, 5), np.int32)}
    with pytest.raises(RequestInputError, match="draft_input_ids has 5 ids; this model takes at most 4"):
        check_sizes(arrays.get, max_input_ids=10, max_draft_len=4)
    with pytest.raises(RequestInputError, match="input_ids has 10 ids; this model takes at most 9"):
        check_sizes(arrays.get, max_input_ids=9, max_draft_len=8)
    check_sizes(arrays.get, max_input_ids=10, max_draft_len=5)


def test_prompt_bytes_are_counted_as_received():
    check_prompt_bytes(b"x" * 10, 10)
    with pytest.raises(RequestInputError, match="text_input is 11 bytes; .* at most 10 .*limits.max_prompt_bytes"):
        check_prompt_bytes(b"x" * 11, 10)


def test_max_prompt_bytes_is_a_checked_recipe_limit():
    base = {"name": "t", "target": {"model": "m"}, "speculation": {"method": "none"}}
    assert parse_recipe(base).limits.max_prompt_bytes == 1_048_576
    assert parse_recipe({**base, "limits": {"max_prompt_bytes": 4096}}).limits.max_prompt_bytes == 4096
    with pytest.raises(Exception, match="max_prompt_bytes"):
        parse_recipe({**base, "limits": {"max_prompt_bytes": 0}})


def test_engine_request_ids_are_unguessable():
    ids = {new_request_id("router") for _ in range(1000)}
    assert len(ids) == 1000
    assert all(re.fullmatch(r"router-[0-9a-f]{32}", i) for i in ids)
    assert all(verify_stop_id(i, "s") is None for i in ids)  # an id alone never stops anything


def test_fatal_device_errors_are_told_apart_from_request_errors():
    assert is_fatal_device_error("error: CUDA error: an illegal memory access was encountered")
    assert is_fatal_device_error("error: RuntimeError: CUDA error: device-side assert triggered")
    assert is_fatal_device_error("error: CUBLAS_STATUS_EXECUTION_FAILED when calling cublasGemmEx")
    assert not is_fatal_device_error("error: index out of range in self")
    assert not is_fatal_device_error("error: CUDA out of memory. Tried to allocate 2.00 GiB")  # recoverable
    assert not is_fatal_device_error(None)
