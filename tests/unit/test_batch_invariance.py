"""runtime.batch_invariant: a token's logits do not depend on the pass that computed them.

A small random Qwen2-shaped model in bf16 on INT8 weight kernels (every linear, the LM head
included: row-invariant), no training needed; once on trtspec's own CPU kernel (where this CPU
runs it: decode and verify passes then go through its one-call layer step) and once on
torch's (the torch ops). With ``batch_invariant_`` a verify pass of K+1
tokens, and a batch of rows at different lengths, give bit for bit the logits of the one-token
steps they stand for; the Engine's speculative greedy output then equals its plain output.
"""

from __future__ import annotations

import pytest
import torch

from trtspec.speculative import kernels
from trtspec.speculative.model import CausalLM, Int8Linear, ModelArgs, Step, attention_per_row

# Qwen2.5-1.5B's attention shape (12 query heads, 2 KV heads of 128): at smaller shapes torch's fused
# kernel happens to add the terms in the per-query order, and the difference this guards would not show
ARGS = ModelArgs(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=3,
                 num_attention_heads=12, num_key_value_heads=2, head_dim=128, rms_norm_eps=1e-6,
                 rope_theta=10000.0, max_position_embeddings=512, tie_word_embeddings=False,
                 attention_bias=True)


@pytest.fixture(scope="module", params=["trtspec", "torch"])
def model(request):
    """The model on trtspec's CPU kernels (kernels/wo_cpu.cpp) or torch's (TRTSPEC_CPU_KERNELS)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(kernels.ENV, request.param)
        kernels._load.cache_clear()
        if request.param == "trtspec" and kernels.wo_cpu() is None:
            pytest.skip(f"trtspec's CPU kernels do not run here: {kernels.wo_cpu_status()}")
        m = _model()
        # trtspec's kernels: decode and verify passes run the one-call layer step (test_layer_step.py)
        assert (m.kernel_layers() is not None) == (request.param == "trtspec")
        yield m
    kernels._load.cache_clear()


def _model() -> CausalLM:
    torch.manual_seed(0)
    m = CausalLM(ARGS)
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0, 0.5)  # large activations, as in real checkpoints' first layers: ties are close
        for layer in m.model.layers:
            layer.input_layernorm.weight.fill_(1.0)
            layer.post_attention_layernorm.weight.fill_(1.0)
        m.model.norm.weight.fill_(1.0)
    m = m.to(torch.bfloat16).quantize_weight_only_().eval()
    assert isinstance(m.lm_head, Int8Linear)
    return m


def _prefill(m: CausalLM, prompt: torch.Tensor, rows: int = 1):
    cache = m.new_cache(rows, 128)
    with torch.no_grad():
        for r in range(rows):
            m(prompt[r : r + 1], cache, Step([r], [0], prompt.shape[1]))
    return cache


def _verify_vs_steps(m: CausalLM, seed: int) -> list[bool]:
    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(0, ARGS.vocab_size, (1, 40), generator=g)
    new = torch.randint(0, ARGS.vocab_size, (1, 5), generator=g)
    with torch.no_grad():
        c = _prefill(m, prompt)
        verify = m(new, c, Step([0], [40], 5))[0]  # [5, V]
        c = _prefill(m, prompt)
        steps = [m(new[:, i : i + 1], c, Step([0], [40 + i], 1))[0, 0] for i in range(5)]
    return [torch.equal(verify[i], steps[i]) for i in range(5)]


def test_verify_pass_equals_one_token_steps_bitwise(model):
    model.batch_invariant_(True)
    try:
        for seed in range(4):
            assert all(_verify_vs_steps(model, seed)), seed
    finally:
        model.batch_invariant_(False)


def test_rows_at_different_lengths_equal_each_row_alone(model):
    """Continuous batching: rows of one decode pass at different positions (a masked fused call
    without batch_invariant) get what each gets decoded alone."""
    model.batch_invariant_(True)
    try:
        g = torch.Generator().manual_seed(7)
        lens = [21, 34, 9]
        prompts = [torch.randint(0, ARGS.vocab_size, (1, n), generator=g) for n in lens]
        nxt = torch.randint(0, ARGS.vocab_size, (3, 1), generator=g)
        cache = model.new_cache(3, 128)
        with torch.no_grad():
            for r, p in enumerate(prompts):
                model(p, cache, Step([r], [0], p.shape[1]))
            batched = model(nxt, cache, Step([0, 1, 2], lens, 1))[:, 0]
            for r, p in enumerate(prompts):
                c = model.new_cache(1, 128)
                model(p, c, Step([0], [0], p.shape[1]))
                alone = model(nxt[r : r + 1], c, Step([0], [lens[r]], 1))[0, 0]
                assert torch.equal(batched[r], alone), r
    finally:
        model.batch_invariant_(False)


def test_per_row_attention_is_the_masked_attention():
    """The same function as the fused masked call, to rounding (it only changes the order of terms)."""
    g = torch.Generator().manual_seed(1)
    q = torch.randn(2, 4, 3, 16, generator=g)
    k, v = torch.randn(2, 2, 12, 16, generator=g), torch.randn(2, 2, 12, 16, generator=g)
    starts = [6, 9]
    pos = torch.tensor(starts)[:, None] + torch.arange(3)[None, :]
    mask = (torch.arange(12)[None, None, :] <= pos[:, :, None])[:, None]
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    assert torch.allclose(attention_per_row(q, k, v, starts, True), ref, atol=1e-6)


def test_speculative_greedy_equals_plain_with_a_self_draft(model):
    """The engine end to end: the model drafting for itself (acceptance 1 in exact arithmetic,
    the longest verify passes) emits exactly its plain greedy tokens."""
    from tests.greedy import plain_and_speculative

    model.batch_invariant_(True)
    try:
        g = torch.Generator().manual_seed(3)
        prompts = [torch.randint(0, ARGS.vocab_size, (n,), generator=g).tolist() for n in (19, 30)]
        plain, spec = plain_and_speculative(model, model, prompts, max_tokens=24, max_seq_len=96)
        assert [s.token_ids for s in spec] == [p.token_ids for p in plain]
        assert sum(s.stats.accepted for s in spec) > 0
    finally:
        model.batch_invariant_(False)
