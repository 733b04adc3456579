"""The python-backend logic that needs the trained tiny pair's tokenizer (no server)."""

from __future__ import annotations

import json
import random
import pytest
from trtspec.triton.backend.tokenizer import Preprocessing, Tokenizer
from trtspec.triton.backend.detok import DetokWindow, text_delta
from trtspec.triton.backend.requests import RequestInputError
from tests.unit.test_triton_logic import TEXT


@pytest.fixture(scope="module")
def tok(tiny_target):
    return Tokenizer(str(tiny_target))


def _stream(decode, ids, chunks):
    window, out, pos = DetokWindow(), [], 0
    for i, n in enumerate(chunks):
        new = ids[pos:pos + n]
        pos += n
        w, ctx = window.next(new)
        out.append(text_delta(decode, w, ctx, final=pos >= len(ids)))
    return out


def test_streamed_deltas_concatenate_to_the_full_decode(tok):
    ids = tok.encode(TEXT, False)
    full = tok.decode(ids)
    assert full == TEXT
    rng = random.Random(0)
    for _ in range(50):
        chunks, left = [], len(ids)
        while left:
            n = min(left, rng.choice([1, 1, 2, 3, 5]))
            chunks.append(n)
            left -= n
        parts = _stream(tok.decode, ids, chunks)
        assert "".join(parts) == full
        assert all("\ufffd" not in p for p in parts)  # incomplete characters are held back


def test_token_by_token_decoding_would_break_characters(tok):
    ids = tok.encode("你好", False)
    assert len(ids) > 2 and "".join(tok.decode([i]) for i in ids) != "你好"  # why detok windows exist


def test_hf_tokenizer_agrees_with_the_rust_one(tiny_target, tok):
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(tiny_target)
    ids = hf(TEXT, add_special_tokens=False)["input_ids"]
    assert tok.encode(TEXT, False) == ids
    assert tok.decode(ids + [hf.eos_token_id]) == hf.decode(ids + [hf.eos_token_id], skip_special_tokens=True)


@pytest.fixture(scope="module")
def pre(tiny_target):
    p = Preprocessing()
    params = {"tokenizer_dir": str(tiny_target), "add_special_tokens": "false", "max_input_len": "16",
              "max_seq_len": "40", "default_max_tokens": "8", "end_id": "0", "pad_id": "1"}
    p.initialize({"model_config": json.dumps({"parameters": {k: {"string_value": v} for k, v in params.items()}})})
    return p


def test_preprocessing_limits(pre):
    ids, mt = pre.tokenize("import os\n", None)
    assert ids and mt == 8
    with pytest.raises(RequestInputError, match="text_input is empty"):
        pre.tokenize("", None)
    with pytest.raises(RequestInputError, match="max_input_len is 16"):
        pre.tokenize("x = 1\n" * 20, None)
    with pytest.raises(RequestInputError, match="max_tokens must be >= 1"):
        pre.tokenize("x", 0)
    with pytest.raises(RequestInputError, match=r"(?s)exceeds max_seq_len 40.*at most 37"):
        pre.tokenize("import os\n", 39)
