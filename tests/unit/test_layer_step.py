"""trtspec's one-call CPU layer step (kernels/wo_cpu.cpp ``layer_step``, ``CausalLM.kernel_layers``):
a decode or verify pass runs each decoder layer as one C++ call instead of ~55 torch ops.

It must compute what the torch ops compute (the same bf16 roundings; attention per query row in
fp32, like ``batch_invariant``'s), be used exactly where every layer qualifies, give each token row
the same bits in any pass, and refuse bad input with an error instead of writing out of bounds.
Skipped, with the reason, where trtspec's CPU kernels do not run (no AVX512, no compiler).
"""

from __future__ import annotations

import pytest
import torch

from trtspec.speculative import kernels
from trtspec.speculative.eagle3 import Eagle3Head, HeadConfig
from trtspec.speculative.model import CausalLM, ModelArgs, Step, int4_layer_, step_inputs

ARGS = ModelArgs(vocab_size=384, hidden_size=256, intermediate_size=640, num_hidden_layers=2,
                 num_attention_heads=8, num_key_value_heads=2, head_dim=32, rms_norm_eps=1e-6,
                 rope_theta=10000.0, max_position_embeddings=512, tie_word_embeddings=False,
                 attention_bias=True)


@pytest.fixture(autouse=True)
def _kernels():
    kernels._load.cache_clear()
    if kernels.wo_cpu() is None:
        pytest.skip(f"trtspec's CPU kernels do not run here: {kernels.wo_cpu_status()}")
    yield
    kernels._load.cache_clear()


def _model(bits: int, *, seed: int = 0, dtype=torch.bfloat16) -> CausalLM:
    torch.manual_seed(seed)
    m = CausalLM(ARGS)
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0, 0.3)
        for n in [m.model.norm] + [x for layer in m.model.layers
                                   for x in (layer.input_layernorm, layer.post_attention_layernorm)]:
            n.weight.uniform_(0.5, 1.5)
    m = m.to(dtype).eval()
    if bits == 0:
        return m.fuse_()
    if bits == 8:
        return m.quantize_weight_only_()
    for layer in m.model.layers:  # INT4 blocks of 64, ranges from the weights (ModelOpt's rule)
        at, mlp = layer.self_attn, layer.mlp
        amax = {n: getattr(mod, n).weight.detach().float().view(-1, 64).abs().amax(-1)
                for mod, names in ((at, ("q_proj", "k_proj", "v_proj", "o_proj")),
                                   (mlp, ("gate_proj", "up_proj", "down_proj"))) for n in names}
        int4_layer_(at, mlp, amax, group=64)
    return m


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("T", [1, 3])
def test_one_layer_matches_the_torch_ops(bits, T):
    m = _model(bits)
    layers = m.kernel_layers()
    assert layers is not None and len(layers) == ARGS.num_hidden_layers
    g = torch.Generator().manual_seed(T)
    cos_t, sin_t = m._rope(64, "cpu", torch.bfloat16)
    step = Step([1], [20], T)
    x = torch.randn(T, ARGS.hidden_size, generator=g).to(torch.bfloat16)
    ours, ref = m.new_cache(2, 64), m.new_cache(2, 64)
    for c in (ours, ref):  # the same 20 cached keys/values before the step
        for t in c.k + c.v:
            t.copy_(torch.randn(t.shape, generator=torch.Generator().manual_seed(9)).to(torch.bfloat16))
    weights, meta, eps = layers[0]
    with torch.no_grad():
        y = kernels.wo_cpu().layer_step(x, weights, meta, eps, ours.k[0], ours.v[0], step.rows, step.starts, T,
                                        cos_t, sin_t)
        layer = m.model.layers[0]
        layer.self_attn.batch_invariant = True  # the torch ops' per-row attention: the same function
        cos, sin, mask, index = step_inputs(step, 1, T, cos_t, sin_t, cached=True)
        want = layer.forward(x[None], cos, sin, ref.k[0], ref.v[0], step, mask, index)[0]
    # K/V written where the torch ops write them, nowhere else
    assert torch.equal(ours.k[0], ref.k[0]) and torch.equal(ours.v[0], ref.v[0])
    # every op rounds where the torch ops round; only fp32 sums inside attention and the norms
    # may add in another order: the bf16 outputs agree to a unit in the last place
    diff = (y.float() - want.float()).abs()
    assert diff.max() <= want.float().abs().max() * 2**-7, diff.max()
    assert (diff == 0).float().mean() >= 0.95


@pytest.mark.parametrize("bits", [4, 8])
def test_verify_pass_equals_one_token_steps_bitwise(bits):
    """What runtime.batch_invariant promises, on the layer step: a token's logits do not depend
    on the pass (3 tokens at once, or one at a time, or beside another row at another length)."""
    m = _model(bits, seed=1)
    g = torch.Generator().manual_seed(5)
    prompt = torch.randint(0, ARGS.vocab_size, (2, 30), generator=g)
    new = torch.randint(0, ARGS.vocab_size, (2, 3), generator=g)
    with torch.no_grad():
        c = m.new_cache(2, 64)
        m(prompt[:1], c, Step([0], [0], 30))
        m(prompt[1:, :25], c, Step([1], [0], 25))
        both = m(new, c, Step([0, 1], [30, 25], 3))  # two rows at different lengths, 3 tokens each
        assert m.kernel_layers() is not None
        c = m.new_cache(1, 64)
        m(prompt[:1], c, Step([0], [0], 30))
        steps = [m(new[:1, i : i + 1], c, Step([0], [30 + i], 1))[0, 0] for i in range(3)]
    for i in range(3):
        assert torch.equal(both[0, i], steps[i]), i


def test_whole_model_follows_the_torch_ops():
    """A decode pass through every layer and the LM head: logits within bf16 noise of the torch ops."""
    m = _model(8, seed=2)
    g = torch.Generator().manual_seed(2)
    prompt = torch.randint(0, ARGS.vocab_size, (1, 24), generator=g)
    nxt = torch.randint(0, ARGS.vocab_size, (1, 2), generator=g)
    outs = []
    for fused in (True, False):
        m._kernel_layers = None if fused else False
        with torch.no_grad():
            c = m.new_cache(1, 64)
            m(prompt, c, Step([0], [0], 24))
            outs.append(m(nxt, c, Step([0], [24], 2)).float())
    scale = outs[1].abs().max()
    assert (outs[0] - outs[1]).abs().max() <= 0.05 * scale


def test_used_only_where_every_layer_qualifies(monkeypatch):
    assert _model(8).kernel_layers() is not None
    assert _model(4).kernel_layers() is not None
    fp = _model(0)  # no quantized projections: torch ops
    assert fp.kernel_layers() is None
    fp32 = _model(8, dtype=torch.float32)  # the kernel's path is bf16 only
    assert fp32.kernel_layers() is None
    awq = _model(4)  # an AWQ pre-scale on one projection: that layer, hence the model, stays on torch ops
    awq.model.layers[1].mlp.down_proj.pre_quant_scale = torch.ones(ARGS.intermediate_size, dtype=torch.bfloat16)
    awq._kernel_layers = None
    assert awq.kernel_layers() is None
    monkeypatch.setenv(kernels.ENV, "torch")  # the A/B switch turns it off with the matmul kernel
    kernels._load.cache_clear()
    assert _model(8).kernel_layers() is None


def test_bad_positions_are_refused_not_written():
    m = _model(8)
    weights, meta, eps = m.kernel_layers()[0]
    cache = m.new_cache(1, 16)
    cos_t, sin_t = m._rope(64, "cpu", torch.bfloat16)
    x = torch.zeros(2, ARGS.hidden_size, dtype=torch.bfloat16)
    before = cache.k[0].clone()
    with pytest.raises(RuntimeError, match="outside the cache"):
        kernels.wo_cpu().layer_step(x, weights, meta, eps, cache.k[0], cache.v[0], [0], [15], 2, cos_t, sin_t)
    with pytest.raises(RuntimeError, match="outside the cache"):
        kernels.wo_cpu().layer_step(x, weights, meta, eps, cache.k[0], cache.v[0], [3], [0], 2, cos_t, sin_t)
    assert torch.equal(cache.k[0], before)


def _head(seed: int = 3):
    """An EAGLE-3 head over ARGS's target shapes, random weights, INT8 (its served form)."""
    torch.manual_seed(seed)
    embed = torch.nn.Embedding(ARGS.vocab_size, ARGS.hidden_size)
    lm = torch.nn.Linear(ARGS.hidden_size, ARGS.vocab_size, bias=False)
    head = Eagle3Head(HeadConfig(ARGS, (0, 1, 1)), embed, lm)
    with torch.no_grad():
        for p in list(head.parameters()) + [embed.weight, lm.weight]:
            p.normal_(0, 0.3)
        layer = head.layers[0]
        for n in (head.norm, layer.input_layernorm, layer.hidden_norm, layer.post_attention_layernorm):
            n.weight.uniform_(0.5, 1.5)
    embed.to(torch.bfloat16), lm.to(torch.bfloat16)
    return head.to(torch.bfloat16).eval().quantize_weight_only_()


@pytest.mark.parametrize("T", [1, 3])
def test_eagle3_head_layer_matches_the_torch_ops(T):
    """The head's decoder layer through ``layer_step_in`` (attention input concat(norm(embedding),
    hidden_norm(feature)), 2H wide; residual the feature): the torch ops' K/V and outputs."""
    head = _head()
    assert head.kernel_layer() is not None
    g = torch.Generator().manual_seed(7 + T)
    feature = torch.randn(2, T, ARGS.hidden_size, generator=g).to(torch.bfloat16)
    ids = torch.randint(0, ARGS.vocab_size, (2, T), generator=g)
    step = Step([1, 0], [11, 17], T)
    outs, caches = [], []
    for fused in (True, False):
        head._kernel = None if fused else False
        head.layers[0].self_attn.batch_invariant = True  # the torch ops' per-row attention
        cache = head.new_cache(2, 64)
        for t in cache.k + cache.v:
            t.copy_(torch.randn(t.shape, generator=torch.Generator().manual_seed(9)).to(torch.bfloat16))
        with torch.no_grad():
            outs.append(head(feature, ids, cache, step).float())
        caches.append(cache)
    assert torch.equal(caches[0].k[0], caches[1].k[0]) and torch.equal(caches[0].v[0], caches[1].v[0])
    diff = (outs[0] - outs[1]).abs()
    assert diff.max() <= outs[1].abs().max() * 2**-7, diff.max()
    assert (diff == 0).float().mean() >= 0.95


def test_eagle3_head_kernel_only_where_it_applies():
    head = _head()
    assert head.kernel_layer() is not None
    weights, meta, eps = head.kernel_layer()
    cache = head.new_cache(1, 16)
    cos_t, sin_t = head.cos_sin(64, "cpu", torch.bfloat16)
    x = torch.zeros(2, ARGS.hidden_size, dtype=torch.bfloat16)
    narrow = torch.zeros(2, ARGS.hidden_size, dtype=torch.bfloat16)  # q|k|v read 2H: an H-wide input is refused
    with pytest.raises(RuntimeError, match="shapes"):
        kernels.wo_cpu().layer_step_in(x, narrow, weights, meta, eps, cache.k[0], cache.v[0], [0], [3], 2, cos_t, sin_t)
    fp = _head()
    fp._kernel = None
    fp.layers[0].self_attn.fused = None  # an unquantized layer: torch ops
    assert fp.kernel_layer() is None
