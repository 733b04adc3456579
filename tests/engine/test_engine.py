"""The torch runtime on the tiny trained pair and on scripted models.

Greedy speculation must be token-identical to plain greedy decoding; KV caches roll back
instead of recomputing; batching, EOS, max-tokens and adaptive drafting behave.
"""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from trtspec.speculative.engine import Engine
from trtspec.speculative.model import ModelArgs, load_causal_lm
from trtspec.speculative.proposers import DraftModelProposer, NgramProposer, Proposal
from trtspec.sampling import Sampling
from trtspec.speculative.stats import Aggregate
from tests.engine.sampled_law import assert_three_token_law
from tests.conftest import worker_threads


@pytest.fixture(scope="module")
def pair(tiny_models):
    torch.set_num_threads(worker_threads())
    t, d = tiny_models
    return load_causal_lm(t).fuse_(), load_causal_lm(d).fuse_()


@pytest.fixture(scope="module")
def tokenizer(tiny_target):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_target)


@pytest.fixture(scope="module")
def prompts(tokenizer) -> list[list[int]]:
    """52 prompts of mixed length (3..160 tokens) cut from held-out stdlib text."""
    from trtspec.corpus import corpus_split

    _, held = corpus_split()
    ids = tokenizer("\n".join(held[:4]), add_special_tokens=False)["input_ids"]
    out, pos = [], 0
    lengths = [3, 7, 12, 20, 33, 48, 64, 90, 120, 160]
    for i in range(52):
        n = lengths[i % len(lengths)]
        out.append(ids[pos : pos + n])
        pos += n + 17
    return out


GREEDY = Sampling(max_tokens=40)


@pytest.fixture(scope="module")
def plain_outputs(pair, prompts):
    target, _ = pair
    return [g.token_ids for g in Engine(target, None, max_batch_size=8).generate(prompts, GREEDY)]


def test_plain_decoding_matches_huggingface_generate(tiny_target, prompts, plain_outputs):
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(tiny_target, dtype=torch.float32).eval()
    for p, ours in list(zip(prompts, plain_outputs))[:3]:
        out = hf.generate(torch.tensor([p]), max_new_tokens=40, do_sample=False, pad_token_id=1)
        theirs = out[0, len(p) :].tolist()
        assert ours == theirs[: len(ours)]


@pytest.mark.parametrize("k,n_prompts", [(1, 12), (4, 52)])
def test_draft_target_greedy_is_token_identical(pair, prompts, plain_outputs, k, n_prompts):
    target, draft = pair
    eng = Engine(target, DraftModelProposer(draft, 8, 1100), max_draft_len=k, max_batch_size=8)
    outs = eng.generate(prompts[:n_prompts], GREEDY)
    assert [o.token_ids for o in outs] == plain_outputs[:n_prompts]
    agg = Aggregate()
    for o in outs:
        agg.add(o.stats)
    assert agg.drafted > 0 and 0 < agg.acceptance_rate <= 1
    assert agg.acceptance_length > 1.2  # the distilled draft really is accepted


def test_ngram_greedy_is_token_identical(pair, prompts, plain_outputs):
    target, _ = pair
    outs = Engine(target, NgramProposer(3, 1), max_draft_len=4, max_batch_size=8).generate(prompts, GREEDY)
    assert [o.token_ids for o in outs] == plain_outputs
    assert sum(o.stats.accepted for o in outs) > 0


def test_batch_of_one_equals_batched(pair, prompts, plain_outputs):
    target, draft = pair
    eng = Engine(target, DraftModelProposer(draft, 1, 1100), max_draft_len=3, max_batch_size=1)
    outs = eng.generate(prompts[:8], GREEDY)
    assert [o.token_ids for o in outs] == plain_outputs[:8]


@pytest.mark.parametrize("max_concurrency", [None, 2])
def test_max_concurrency_drafts_only_at_or_below_it(pair, prompts, plain_outputs, max_concurrency):
    """speculation.max_concurrency: a step with more active requests drafts nothing; outputs stay
    the plain ones, and the draft catches up on the tokens it missed when drafting resumes."""
    target, draft = pair
    proposer = DraftModelProposer(draft, 4, 1100)
    eng = Engine(target, proposer, max_draft_len=3, max_concurrency=max_concurrency, max_batch_size=4)
    active_when_drafting = []
    propose = proposer.propose

    def spy(slots, *args, **kw):
        active_when_drafting.append(sum(s is not None for s in eng.slots))
        return propose(slots, *args, **kw)

    proposer.propose = spy
    outs = eng.generate(prompts[:10], GREEDY)
    assert [o.token_ids for o in outs] == plain_outputs[:10]
    assert sum(o.stats.accepted for o in outs) > 0  # it still speculates (the last requests run alone)
    if max_concurrency is None:
        assert max(active_when_drafting) == 4
    else:
        assert max(active_when_drafting) <= max_concurrency


def test_max_concurrency_draft_catches_up_after_plain_steps(pair, prompts):
    """A request that decoded plainly beside another (max_concurrency 1) drafts again once alone,
    from the whole context: its first proposal then equals that of a fresh draft prefilled with the
    whole sequence (a catch-up that skipped missed tokens would draft from a different context),
    and it accepts as much as without the limit."""
    target, draft = pair
    rates = {}
    for mc in (None, 1):
        proposer = DraftModelProposer(draft, 2, 1100)
        eng = Engine(target, proposer, max_draft_len=3, max_concurrency=mc, max_batch_size=2)
        calls = []
        propose = proposer.propose

        def spy(slots, seqs, ks, params, generators, _propose=propose, _calls=calls):
            out = _propose(slots, seqs, ks, params, generators)
            _calls.append(([list(q) for q in seqs], ks, out.tokens.tolist()))
            return out

        proposer.propose = spy
        agg = Aggregate()
        resumed = []
        for short, long in zip(prompts[10:16:2], prompts[11:17:2]):
            calls.clear()
            outs = eng.generate([short, long], [Sampling(max_tokens=15, ignore_eos=True),
                                                Sampling(max_tokens=80, ignore_eos=True)])
            agg.add(outs[1].stats)
            if mc == 1:
                assert all(len(seqs) == 1 for seqs, _, _ in calls)  # never two rows drafting
                resumed.append((len(long), *calls[0]))  # the long request's first round, after plain steps
        assert agg.drafted > 100, mc
        rates[mc] = agg.acceptance_rate
    for prompt_len, (seq,), (k,), (tokens,) in resumed:
        assert len(seq) >= prompt_len + 15  # it missed the 15 plain steps beside the short request
        fresh = DraftModelProposer(draft, 1, 1100)
        fresh.prefill(0, seq)
        assert fresh.propose([0], [seq], [k], [Sampling()], [None]).tokens.tolist()[0] == tokens[:k]
    assert abs(rates[1] - rates[None]) < 0.1, rates


def test_kv_cache_is_rolled_back_not_recomputed(pair, prompts):
    """Every target forward after prefill processes exactly K+1 new tokens: nothing is re-run."""
    target, draft = pair
    calls: list[int] = []
    handle = target.register_forward_pre_hook(lambda m, args: calls.append(args[0].shape[1]))
    try:
        eng = Engine(target, DraftModelProposer(draft, 1, 1100), max_draft_len=4, max_batch_size=1)
        g = eng.generate([prompts[5]], Sampling(max_tokens=30))[0]
    finally:
        handle.remove()
    assert calls[0] == len(prompts[5])  # one prefill
    assert all(t <= 5 for t in calls[1:])  # then only verify passes of [pending + ≤4 drafts]
    assert sum(calls[1:]) == g.stats.steps + g.stats.drafted


def test_sampling_is_seeded_and_reproducible(pair, prompts):
    target, draft = pair
    params = Sampling(max_tokens=24, temperature=0.8, top_k=50, top_p=0.95, seed=1234)
    runs = []
    for _ in range(2):
        eng = Engine(target, DraftModelProposer(draft, 2, 1100), max_draft_len=4, max_batch_size=2)
        runs.append([o.token_ids for o in eng.generate(prompts[:2], params)])
    assert runs[0] == runs[1]
    other = Engine(target, None, max_batch_size=2).generate(prompts[:2], Sampling(max_tokens=24, temperature=0.8, seed=99))
    assert [o.token_ids for o in other] != runs[0]


def test_sampled_speculation_matches_target_distribution(pair, tokenizer):
    """End to end on the tiny target: the joint law of the first 3 sampled tokens with the draft
    (tokens 2-3 come from one speculative step) equals the exact target law (top-k=3)."""
    target, draft = pair
    params_kw = dict(max_tokens=3, temperature=1.0, top_k=3)
    prompt = tokenizer("    def __init__(self", add_special_tokens=False)["input_ids"]
    # exact P(x1, x2, x3) from the target alone
    from trtspec.speculative.sampling import logits_to_probs

    sp = Sampling(**params_kw)

    def probs(seq):
        with torch.inference_mode():
            return logits_to_probs(target(torch.tensor([seq]), None)[0, -1], sp)

    assert_three_token_law(target, draft, prompt, probs, params_kw)


@pytest.mark.parametrize("policy", ["goodput", "acceptance"])
def test_adaptive_drafting_backs_off_a_useless_draft(tiny_target, tmp_path, pair, prompts, policy):
    """A randomly initialised draft is (almost) never accepted: either policy stops drafting, so
    far fewer tokens are drafted than with a fixed draft length — same output."""
    from trtspec.checkpoints.tiny import TinySettings, _init, _model_args
    from trtspec.speculative.model import CausalLM

    target, _ = pair
    s = TinySettings()
    bad = CausalLM(_model_args(s.draft, s, target.args.eos_token_id))
    _init(bad, 12345)
    bad.eval()
    params = Sampling(max_tokens=48)
    fixed = Engine(target, DraftModelProposer(bad, 1, 1100), max_draft_len=4, max_batch_size=1)
    adaptive = Engine(target, DraftModelProposer(bad, 1, 1100), max_draft_len=4, max_batch_size=1,
                      adaptive=True, adaptive_window=16, policy=policy)
    a = fixed.generate(prompts[:2], params)
    b = adaptive.generate(prompts[:2], params)
    assert [x.token_ids for x in a] == [x.token_ids for x in b]
    drafted_fixed = sum(x.stats.drafted for x in a)
    drafted_adaptive = sum(x.stats.drafted for x in b)
    assert drafted_adaptive < 0.5 * drafted_fixed


def test_goodput_policy_greedy_is_token_identical_whatever_k_it_picks(pair, prompts, plain_outputs):
    """runtime.adaptive.policy goodput: the batch's k changes from step to step (cold start,
    exploration, the batch shrinking as requests finish); greedy output stays the plain one."""
    target, draft = pair
    eng = Engine(target, DraftModelProposer(draft, 4, 1100), max_draft_len=4, max_batch_size=4, adaptive=True,
                 policy="goodput")
    outs = eng.generate(prompts[:8], GREEDY)
    assert [o.token_ids for o in outs] == plain_outputs[:8]
    snap = eng.snapshot()
    assert snap["policy"] == "goodput" and len(snap["chosen_k"]) >= 2, snap["chosen_k"]
    assert sum(snap["chosen_k"].values()) == snap["steps"] > 0
    assert all(0 <= o.stats.mean_draft_len <= 4 for o in outs)
    assert sum(o.stats.drafted for o in outs) > 0


# ---------------------------------------------------------------------------------- scripted models


class ScriptedLM(nn.Module):
    """A 'language model' whose greedy continuation of token t is (t + 1) % V."""

    def __init__(self, vocab: int = 16, eos: int | None = None):
        super().__init__()
        self.args = ModelArgs(vocab, 8, 8, 1, 1, 1, 8, 1e-6, 1e4, 512, False, False, eos_token_id=eos)
        self.lm_head = nn.Linear(8, vocab, bias=False)

    def new_cache(self, batch, max_len):
        return None

    def forward(self, input_ids, cache, step=None, *, logits="all", hidden_layers=()):
        out = torch.full((*input_ids.shape, self.args.vocab_size), -1e4)
        out.scatter_(-1, ((input_ids + 1) % self.args.vocab_size)[..., None], 10.0)
        return out[:, -1:] if logits == "last" else out


class ScriptedProposer:
    """Proposes a fixed continuation rule; ``wrong_at`` makes draft position i wrong."""

    name = "scripted"
    target_hidden_layers = ()

    def __init__(self, vocab=16, wrong_at: int | None = None):
        self.vocab, self.wrong_at = vocab, wrong_at

    def prefill(self, slot, seq, target_hidden=None):
        pass

    def propose(self, slots, seqs, ks, params, generators):
        K = max(ks)
        rows = []
        for seq, k in zip(seqs, ks):
            d, t = [], seq[-1]
            for i in range(K):
                t = (t + 1) % self.vocab
                d.append((t + 5) % self.vocab if i == self.wrong_at else t)
            rows.append(d)
        return Proposal(torch.tensor(rows).view(len(seqs), K), None, torch.tensor(ks))

    def accept(self, slots, seqs, accepted, target_hidden=None):
        pass

    def release(self, slot):
        pass


def test_scripted_all_accepted_bonus_each_step():
    eng = Engine(ScriptedLM(), ScriptedProposer(), max_draft_len=3, max_batch_size=1)
    g = eng.generate([[0]], Sampling(max_tokens=9))[0]
    assert g.token_ids == [1, 2, 3, 4, 5, 6, 7, 8, 9]
    # first token from prefill, then 2 steps of 3 accepted + bonus = 8 tokens
    assert g.stats.steps == 2 and g.stats.accepted == 6 and g.stats.tokens_per_step[4] == 2


def test_scripted_first_rejected_every_step():
    eng = Engine(ScriptedLM(), ScriptedProposer(wrong_at=0), max_draft_len=3, max_batch_size=1)
    g = eng.generate([[0]], Sampling(max_tokens=5))[0]
    assert g.token_ids == [1, 2, 3, 4, 5]
    assert g.stats.accepted == 0 and g.stats.steps == 4 and g.stats.acceptance_rate == 0


def test_scripted_eos_inside_draft_stops_there():
    eos = 6
    eng = Engine(ScriptedLM(eos=eos), ScriptedProposer(), max_draft_len=4, max_batch_size=1)
    g = eng.generate([[2]], Sampling(max_tokens=20))[0]
    # continuation 3,4,5,6(eos),7...: the draft covers EOS; output stops before it
    assert g.token_ids == [3, 4, 5] and g.finish_reason == "stop"


def test_scripted_max_tokens_reached_mid_draft():
    eng = Engine(ScriptedLM(), ScriptedProposer(), max_draft_len=4, max_batch_size=1)
    g = eng.generate([[0]], Sampling(max_tokens=3))[0]
    assert g.token_ids == [1, 2, 3] and g.finish_reason == "length"
    assert g.stats.drafted <= 1  # draft length capped by the tokens still allowed


def test_cost_ratios_count_the_time_between_steps():
    """A served engine spends time between steps (sending the step's tokens, taking requests):
    speculation pays it once per pass, so the adaptive controller's cost ratios include it. A
    prefill between two steps is not counted."""
    import time

    eng = Engine(ScriptedLM(), ScriptedProposer(), max_draft_len=3, max_batch_size=2, adaptive=True)
    eng.add([0], Sampling(max_tokens=400))
    for _ in range(12):
        eng.step()
        time.sleep(0.004)
    o = eng.cost["overhead"]
    assert 0.003 < o < 0.05
    d, v = eng.cost["draft_token"], eng.cost["verify"][3]
    t = eng.cost["target_step"] or min(eng.cost["verify"].values())
    assert eng._cost_ratio() == pytest.approx(d / (t + o))
    eng.cost["target_step"] = t
    assert eng._verify_ratio()[3] == pytest.approx((v + o) / (t + o))
    eng.add([1], Sampling(max_tokens=400))  # a prefill: the next step's gap is not overhead
    time.sleep(0.02)
    eng.step()
    assert eng.cost["overhead"] == o


def test_external_draft_tokens_are_verified_first():
    """The tensorrtllm backend's draft_input_ids: client-supplied drafts verified in step 1."""
    eng = Engine(ScriptedLM(), None, max_draft_len=4, max_batch_size=1)
    ev = eng.add([0], Sampling(max_tokens=10), draft_tokens=[2, 3, 9, 5])
    assert ev.new_tokens == [1]
    evs = eng.step()
    assert evs[0].new_tokens == [2, 3, 4]  # 2 and 3 accepted, 9 rejected → correction 4
    assert evs[0].stats.drafted == 4 and evs[0].stats.accepted == 2


def test_background_engine_picks_the_faster_thread_count_in_its_own_thread(pair, prompts):
    """A served engine runs outside the main thread, where torch's parallel regions cost more:
    the engine thread measures 1 vs the configured count and keeps 1 only where it wins by the
    margin (a pass at most 0.9x as long); the outputs stay those of the offline engine."""
    import threading

    from trtspec.speculative.engine import BackgroundEngine

    target, draft = pair
    saved = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        eng = Engine(target, DraftModelProposer(draft, 2, 512), max_draft_len=3, max_batch_size=2, max_seq_len=400)
        bg = BackgroundEngine(eng)
        try:
            t = bg.threads
            assert t is not None and t["configured"] == 2
            assert t["threads"] == (1 if t["target_step_s_1_thread"] < 0.9 * t["target_step_s_2_threads"] else 2)
            seen, done = [], threading.Event()
            bg.submit(prompts[0], Sampling(max_tokens=12), lambda ev: (seen.extend(ev.new_tokens),
                                                                               ev.finished and done.set()))
            assert done.wait(60)
        finally:
            bg.shutdown()
        ref = Engine(target, None, max_batch_size=1, max_seq_len=400).generate([prompts[0]], Sampling(max_tokens=12))
        assert seen == ref[0].token_ids
        torch.set_num_threads(1)  # one configured thread: nothing to pick
        bg1 = BackgroundEngine(Engine(target, None, max_batch_size=1, max_seq_len=400))
        assert bg1.threads is None
        bg1.shutdown()
    finally:
        torch.set_num_threads(saved)


def test_served_compiled_draft_compiles_before_the_first_request(tiny_models, pair, prompts, plain_outputs,
                                                                  monkeypatch):
    """Compiled code is specialised to the thread count, and the serving thread picks its own:
    the compiled draft step is compiled again for that count before the thread takes requests,
    so no request waits for inductor (a served run once spent seconds per request recompiling)."""
    import threading

    from torch._dynamo.utils import counters

    import trtspec.speculative.engine as engine_mod

    def one_thread(engine):  # what the serving thread picks on this box (see the test above)
        torch.set_num_threads(1)
        return {"threads": 1}

    monkeypatch.setattr(engine_mod, "pick_thread_count", one_thread)
    BackgroundEngine = engine_mod.BackgroundEngine
    target, _ = pair
    saved = torch.get_num_threads()
    torch.set_num_threads(2)  # the engine (and its compiled step) is built with 2
    try:
        dc = load_causal_lm(tiny_models[1]).quantize_weight_only_()
        eng = Engine(target, DraftModelProposer(dc, 4, 512, compile=True), max_draft_len=4, max_batch_size=4,
                     max_seq_len=400)
        bg = BackgroundEngine(eng)
        try:
            compiled = dict(counters["frames"]), dict(counters["stats"])
            seen, done = {i: [] for i in range(6)}, threading.Event()
            left = [6]

            def cb(i):
                def on(ev):
                    seen[i].extend(ev.new_tokens)
                    if ev.finished:
                        left[0] -= 1
                        if not left[0]:
                            done.set()
                return on

            for i in range(6):  # more requests than slots: batches of 1..4 rows at mixed positions
                bg.submit(prompts[i], GREEDY, cb(i))
            assert done.wait(120)
        finally:
            bg.shutdown()
        assert [seen[i] for i in range(6)] == plain_outputs[:6]
        assert (dict(counters["frames"]), dict(counters["stats"])) == compiled
        assert bg.warm_up_error is None
    finally:
        torch.set_num_threads(saved)


def test_background_engine_serves_when_the_proposers_warm_up_fails(pair, prompts, plain_outputs):
    """A failed warm-up in the engine thread is recorded (the Triton model logs it) and the
    engine still serves."""
    import threading

    from trtspec.speculative.engine import BackgroundEngine

    target, _ = pair
    prop = NgramProposer(3, 1)

    def broken():
        raise RuntimeError("InvalidCxxCompiler: No working C++ compiler found\nmore")

    prop.warm_up = broken
    bg = BackgroundEngine(Engine(target, prop, max_batch_size=1, max_seq_len=400), pick_threads=False)
    try:
        assert bg.warm_up_error == "RuntimeError: InvalidCxxCompiler: No working C++ compiler found"
        seen, done = [], threading.Event()
        bg.submit(prompts[0], GREEDY, lambda ev: (seen.extend(ev.new_tokens), ev.finished and done.set()))
        assert done.wait(60)
    finally:
        bg.shutdown()
    assert seen == plain_outputs[0]


def test_background_engine_serves_when_the_thread_count_measurement_fails(pair, prompts, monkeypatch):
    """The measurement runs in the engine thread before its loop: a failure there must leave the
    configured thread count and a working engine, not a dead thread that never answers."""
    import threading

    import trtspec.speculative.engine as engine_mod

    def broken(engine):
        raise RuntimeError("measurement failed")

    monkeypatch.setattr(engine_mod, "pick_thread_count", broken)
    target, _ = pair
    bg = engine_mod.BackgroundEngine(Engine(target, None, max_batch_size=1, max_seq_len=400))
    try:
        assert bg.threads is None
        done = threading.Event()
        bg.submit(prompts[0], Sampling(max_tokens=4), lambda ev: ev.finished and done.set())
        assert done.wait(30), "the engine thread died with the measurement"
    finally:
        bg.shutdown()


def test_fuse_stores_cpu_fp32_weights_input_major_with_the_same_logits(tiny_target):
    """fuse_ changes only where the weights lie (input-major for MKL's multi-row kernel), never
    what the model computes: logits match the unfused checkpoint's for decode and verify shapes."""
    from trtspec.speculative.model import Step

    plain, fused = load_causal_lm(tiny_target), load_causal_lm(tiny_target).fuse_()
    layer = fused.model.layers[0]
    for w in (layer.self_attn.fused[0], layer.mlp.fused, layer.self_attn.o_proj.weight,
              layer.mlp.down_proj.weight, fused.lm_head.weight):
        assert w.stride() == (1, w.shape[0]), "weight not stored input-major"
    ids = torch.randint(2, 4000, (1, 40), generator=torch.Generator().manual_seed(0))
    def decode_and_verify_logits(m):
        with torch.inference_mode():
            cache = m.new_cache(1, 64)
            m(ids[:, :30], cache, Step([0], [0], 30))
            return [m(ids[:, start:start + T], cache, Step([0], [start], T)) for T, start in ((1, 30), (5, 31))]

    for a, b in zip(decode_and_verify_logits(plain), decode_and_verify_logits(fused)):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    assert fused.model.layers[0].self_attn.q_proj.weight.is_contiguous()  # checkpoint modules untouched


def test_int8_linear_is_per_channel_weight_only_quantization():
    """Int8Linear stores round(W / s) with ModelOpt int8_wo's per-channel scales s = max|row| / 127
    and computes x @ (q * s)^T + b; the only other error is bf16 rounding of the activations."""
    from trtspec.speculative.model import Int8Linear

    g = torch.Generator().manual_seed(0)
    w, b, x = torch.randn(96, 64, generator=g), torch.randn(96, generator=g), torch.randn(3, 5, 64, generator=g)
    q = Int8Linear(w, b)
    ref_scales = w.abs().amax(1) / 127
    assert q.qweight.dtype == torch.int8
    assert torch.equal(q.qweight.float(), torch.round(w / q.scales.float()[:, None]).clamp(-127, 127))
    torch.testing.assert_close(q.scales.float(), ref_scales, rtol=1e-2, atol=0)  # kept in bf16
    y = q(x)
    assert y.shape == (3, 5, 96) and y.dtype == torch.float32
    exact = x @ q.dequantized().T + b
    torch.testing.assert_close(y, exact, rtol=0, atol=0.02 * exact.abs().max().item())


def test_int8_weight_only_draft_stays_token_identical(tiny_models, pair, prompts, plain_outputs):
    """runtime.draft_weight_only: int8 changes what the draft proposes, never what is emitted."""
    from trtspec.speculative.model import Int8Linear

    target, draft = pair
    d8 = load_causal_lm(tiny_models[1]).quantize_weight_only_()
    assert type(d8.lm_head) is Int8Linear and type(d8.model.layers[0].mlp.fused) is Int8Linear
    eng = Engine(target, DraftModelProposer(d8, 8, 1100), max_draft_len=4, max_batch_size=8)
    outs = eng.generate(prompts, GREEDY)
    assert [o.token_ids for o in outs] == plain_outputs
    agg8 = Aggregate()
    for o in outs[:16]:  # the same prompts as the fp reference below: only INT8 differs
        agg8.add(o.stats)
    ref = Engine(target, DraftModelProposer(draft, 8, 1100), max_draft_len=4, max_batch_size=8).generate(prompts[:16], GREEDY)
    agg = Aggregate()
    for o in ref:
        agg.add(o.stats)
    assert agg8.acceptance_length > 1.2
    assert abs(agg8.acceptance_rate - agg.acceptance_rate) < 0.1  # INT8 per-channel barely moves the draft


def test_decode_one_matches_forward_at_any_rows_and_positions(pair):
    """CausalLM.decode_one (the compile-friendly one-token step) computes what forward computes:
    same logits and same K/V written, for rows at different positions in a shared cache."""
    from trtspec.speculative.model import Step

    _, draft = pair
    g = torch.Generator().manual_seed(0)
    lens = {0: 9, 2: 23, 3: 4}  # row -> tokens already cached
    with torch.inference_mode():
        ref, new = draft.new_cache(4, 64), draft.new_cache(4, 64)
        for r, n in lens.items():
            ids = torch.randint(0, draft.args.vocab_size, (1, n), generator=g)
            for c in (ref, new):
                draft(ids, c, Step([r], [0], n), logits="none")
        rope = draft._rope(64, torch.device("cpu"), torch.float32)
        rows = list(lens)
        x = torch.randint(0, draft.args.vocab_size, (len(rows), 1), generator=g)
        want = torch.stack([draft(x[i : i + 1], ref, Step([r], [lens[r]], 1))[0, 0] for i, r in enumerate(rows)])
        got = draft.decode_one(x, new, torch.tensor(rows), torch.tensor([lens[r] for r in rows]), max(lens.values()) + 1,
                               rope)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    for r, n in lens.items():
        torch.testing.assert_close(new.k[0][r, :, : n + 1], ref.k[0][r, :, : n + 1])


def test_compiled_draft_step_stays_token_identical(tiny_models, prompts, plain_outputs, pair):
    """runtime.compile_draft: the INT8 draft's one-token step under torch.compile drafts exactly
    what the eager step drafts (same acceptance) and the output stays plain decoding's, batched
    (rows at different positions, requests joining) and alone."""
    target, _ = pair
    d8 = load_causal_lm(tiny_models[1]).quantize_weight_only_()
    eager = Engine(target, DraftModelProposer(d8, 8, 1100), max_draft_len=4, max_batch_size=8).generate(prompts[:20], GREEDY)
    dc = load_causal_lm(tiny_models[1]).quantize_weight_only_()
    prop = DraftModelProposer(dc, 8, 1100, compile=True)
    assert dc.decode is not None
    outs = Engine(target, prop, max_draft_len=4, max_batch_size=8).generate(prompts[:20], GREEDY)
    assert [o.token_ids for o in outs] == plain_outputs[:20]
    assert [o.stats.accepted for o in outs] == [o.stats.accepted for o in eager]
    one = Engine(target, DraftModelProposer(dc, 1, 1100), max_draft_len=4, max_batch_size=1)
    assert one.generate([prompts[5]], GREEDY)[0].token_ids == plain_outputs[5]


def test_compile_draft_failure_is_a_clear_error_at_build_time(tiny_models, monkeypatch):
    """No C++ compiler (or any inductor failure) surfaces when the engine is built, naming the
    setting and the fix, not in the middle of a request."""
    from trtspec.errors import ModelError

    def broken(fn, **kw):
        def run(*a, **k):
            raise RuntimeError("InvalidCxxCompiler: No working C++ compiler found")
        return run

    monkeypatch.setattr(torch, "compile", broken)
    d = load_causal_lm(tiny_models[1])
    with pytest.raises(ModelError, match="compile_draft") as e:
        DraftModelProposer(d, 2, 64, compile=True)
    assert "compile_draft: false" in e.value.fix and "C++ compiler" in str(e.value)
    assert d.decode is None


def test_int8_weight_only_refuses_a_modelopt_model_and_unfuse():
    from trtspec.errors import ModelError
    from trtspec.speculative.model import CausalLM

    args = ModelArgs(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                     num_key_value_heads=2, head_dim=8, rms_norm_eps=1e-6, rope_theta=10000.0,
                     max_position_embeddings=128, tie_word_embeddings=True, attention_bias=True)
    m = CausalLM(args).eval().quantize_weight_only_()
    with pytest.raises(ModelError, match="cannot be unfused"):
        m.unfuse_()
    with pytest.raises(ModelError, match="already runs with INT8"):
        m.quantize_weight_only_()
    assert m(torch.tensor([[1, 2, 3]]), None).shape == (1, 3, 64)  # tied head + qkv bias run in INT8

    class QuantLinear(nn.Linear):  # what ModelOpt's wrappers are called
        pass

    m2 = CausalLM(args).eval()
    m2.model.layers[0].mlp.down_proj = QuantLinear(64, 32, bias=False)
    with pytest.raises(ModelError, match="already quantized"):
        m2.quantize_weight_only_()


def test_draft_warm_start_keeps_the_targets_token_geometry():
    """warm_start_from_target: at full width the projection is a rotation, so the draft's
    embedding-to-head products equal the target's; a narrower draft keeps the top directions;
    a wider one is refused."""
    from trtspec.checkpoints.tiny import warm_start_from_target
    from trtspec.speculative.model import CausalLM

    def lm(hidden, seed):
        torch.manual_seed(seed)
        a = ModelArgs(vocab_size=96, hidden_size=hidden, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=2, head_dim=hidden // 2, rms_norm_eps=1e-6,
                      rope_theta=10000.0, max_position_embeddings=64, tie_word_embeddings=False, attention_bias=False)
        return CausalLM(a)

    target = lm(32, 0)
    full, narrow = lm(32, 1), lm(16, 2)
    warm_start_from_target(full, target)
    e, h = target.model.embed_tokens.weight, target.lm_head.weight
    torch.testing.assert_close(full.model.embed_tokens.weight @ full.lm_head.weight.T, e @ h.T, rtol=1e-4, atol=1e-4)
    warm_start_from_target(narrow, target)
    gram = narrow.model.embed_tokens.weight @ narrow.lm_head.weight.T
    assert 0.3 < torch.nn.functional.cosine_similarity(gram.flatten(), (e @ h.T).flatten(), dim=0) < 1.0
    with pytest.raises(ValueError, match="no wider"):
        warm_start_from_target(lm(64, 3), target)


def test_generate_cli_prints_one_json_object(tiny_models):
    """`trtspec generate --json`: token_ids (generated only), text and stats; speculation (with
    the INT8 draft too) emits exactly plain decoding's tokens; a bad flag combination exits 2."""
    import json

    from click.testing import CliRunner

    from trtspec.cli import main

    t, d = (str(p) for p in tiny_models)
    base = ["generate", "--target", t, "--prompt", "def parse(self, text):", "--max-new-tokens", "24",
            "--threads", "2", "--json"]
    runs = {}
    for name, extra in (("plain", []), ("draft", ["--draft", d]), ("int8", ["--draft", d, "--draft-weight-only", "int8"])):
        r = CliRunner().invoke(main, base + extra)
        assert r.exit_code == 0, r.output
        runs[name] = json.loads(r.output)
    assert len(runs["plain"]["token_ids"]) == 24 or runs["plain"]["stats"]["finish_reason"] == "stop"
    assert runs["draft"]["token_ids"] == runs["plain"]["token_ids"] == runs["int8"]["token_ids"]
    assert runs["plain"]["text"] and runs["plain"]["stats"]["drafted"] == 0
    st = runs["int8"]["stats"]
    assert {"drafted", "accepted", "acceptance_rate", "acceptance_length", "draft_s", "verify_s",
            "tokens_per_s"} <= set(st)
    assert st["draft_weight_only"] == "int8" and st["drafted"] > 0 and st["acceptance_length"] > 1
    bad = CliRunner().invoke(main, ["generate", "--target", t, "--method", "ngram", "--draft-weight-only", "int8",
                                    "--prompt", "x"])
    assert bad.exit_code == 2 and "--draft-weight-only" in bad.output
    bad = CliRunner().invoke(main, ["generate", "--target", t, "--method", "ngram", "--compile-draft", "--prompt", "x"])
    assert bad.exit_code == 2 and "--compile-draft" in bad.output


def test_low_bit_linears_give_each_row_the_same_bits_in_any_batch():
    """Speculation is lossless only if a verify pass over K+1 tokens gives each token exactly what
    a one-token step gives it: torch's INT8 and INT4 weight kernels must be row-invariant."""
    from trtspec.speculative.model import Int4Linear, Int8Linear

    torch.manual_seed(0)
    w = torch.randn(256, 384)
    amax = w.view(256, 3, 128).abs().amax(-1).reshape(-1)
    x = torch.randn(6, 384).bfloat16().float()
    for lin in (Int8Linear(w, None), Int4Linear(w, None, amax)):
        one = torch.cat([lin.forward(x[i:i + 1]) for i in range(6)])
        for m in (2, 3, 5, 6):
            assert torch.equal(lin.forward(x[:m]), one[:m]), (type(lin).__name__, m)


class CountingProposer(ScriptedProposer):
    def __init__(self, **kw):
        super().__init__(**kw)
        self.calls = 0

    def propose(self, slots, seqs, ks, params, generators):
        self.calls += 1
        return super().propose(slots, seqs, ks, params, generators)


def _synthetic_costs(eng: Engine, batch: int, verify, draft_token_s: float) -> None:
    """The goodput policy's cells at ``batch`` measured as ``verify(k)`` seconds; no exploration."""
    g = eng.goodput
    g.explore_every = 0
    for k in range(eng.max_draft_len + 1):
        for _ in range(g.min_samples):
            g.cost.add_verify(batch, k, verify(k))
    g.cost.add_draft(batch, 1, draft_token_s)


def test_goodput_k0_is_plain_decoding_without_a_proposer_call():
    prop = CountingProposer()
    eng = Engine(ScriptedLM(), prop, max_draft_len=3, max_batch_size=1, adaptive=True, policy="goodput")
    _synthetic_costs(eng, 1, lambda k: 0.001 + 0.01 * (k + 1), 0.01)  # every token costs 10 ms
    g = eng.generate([[0]], Sampling(max_tokens=12))[0]
    assert g.token_ids == list(range(1, 13))
    assert prop.calls == 0 and g.stats.drafted == 0 and g.stats.mean_draft_len == 0
    assert eng.snapshot()["chosen_k"] == {"0": g.stats.steps}


def test_goodput_drafts_max_k_when_drafts_are_free_and_always_accepted():
    prop = CountingProposer()
    eng = Engine(ScriptedLM(), prop, max_draft_len=3, max_batch_size=1, adaptive=True, policy="goodput")
    _synthetic_costs(eng, 1, lambda k: 0.01, 0.0)  # a weight-bound 10 ms pass, free drafts
    g = eng.generate([[0]], Sampling(max_tokens=40))[0]
    assert g.token_ids == [t % 16 for t in range(1, 41)]
    assert eng.goodput.chosen == {3: g.stats.steps}  # the policy's pick (the last step has room for 2 only)
    assert g.stats.accepted == g.stats.drafted > 2 * g.stats.steps


def test_max_concurrency_caps_the_goodput_policy():
    prop = CountingProposer()
    eng = Engine(ScriptedLM(), prop, max_draft_len=3, max_batch_size=2, max_concurrency=1, adaptive=True,
                 policy="goodput")
    outs = eng.generate([[0], [5]], Sampling(max_tokens=6, ignore_eos=True))
    assert [o.token_ids for o in outs] == [[1, 2, 3, 4, 5, 6], [6, 7, 8, 9, 10, 11]]
    assert prop.calls == 0  # both requests decode side by side to the end


def test_unknown_policy_is_refused_by_name():
    from trtspec.errors import TrtspecError

    with pytest.raises(TrtspecError, match="policy.*'bogus'"):
        Engine(ScriptedLM(), ScriptedProposer(), adaptive=True, policy="bogus")


def test_step_trace_records_each_prefill_and_step_with_its_batch_and_draft_length(tmp_path):
    """Engine.trace (TRTSPEC_STEP_TRACE in a served worker): one record per prefill and per step,
    each step with its batch size, draft length, the policy's reason and its seconds."""
    from trtspec.errors import TrtspecError
    from trtspec.triton.backend.worker import step_trace_writer

    eng = Engine(ScriptedLM(), ScriptedProposer(), max_draft_len=3, max_batch_size=2, adaptive=True,
                 policy="goodput")
    _synthetic_costs(eng, 2, lambda k: 0.01, 0.0)
    _synthetic_costs(eng, 1, lambda k: 0.01, 0.0)
    eng.trace = step_trace_writer(str(tmp_path / "steps"), "draft_target")
    outs = eng.generate([[0], [5]], Sampling(max_tokens=9, ignore_eos=True))
    assert [o.token_ids for o in outs] == [list(range(1, 10)), [t % 16 for t in range(6, 15)]]
    (path,) = tmp_path.glob("steps.draft_target.*.jsonl")
    events = [json.loads(line) for line in path.read_text().splitlines()]
    assert [e["event"] for e in events[:2]] == ["prefill", "prefill"]
    steps = [e for e in events if e["event"] == "step"]
    assert len(steps) == eng.snapshot()["steps"] and {e["B"] for e in steps} == {2}
    assert all(e["k"] == 3 and e["why"] == "goodput" and e["accepted"] == 6 for e in steps[:-1])
    assert all(e["ms"] >= e["verify_ms"] >= 0 for e in steps)
    assert steps[0]["since_last_ms"] is None and steps[1]["since_last_ms"] >= 0
    # what the policy expected of the k it chose: its goodput over plain decoding's, the catch-up it priced
    g = eng.goodput.last["goodput"]
    assert steps[-1]["gain"] == pytest.approx(g[str(steps[-1]["k"])] / g["0"], abs=1e-3) and steps[-1]["gain"] > 1
    assert all(e["catch_up_ms"] is not None and e["catch_up_ms"] >= 0 for e in steps)
    with pytest.raises(TrtspecError, match=r"TRTSPEC_STEP_TRACE=.*nowhere/steps: cannot write .*unset"):
        step_trace_writer(str(tmp_path / "nowhere" / "steps"), "none")


def test_a_cost_probe_verifies_a_free_guess_without_the_proposer():
    """Where even every draft token accepted would not pay (the costs' verdict), a probe only
    re-measures the verify pass. Served on the Qwen pair such a probe at 4 rows first read every
    token the draft had skipped, 837-983 ms against 106 ms for a plain step, and stalled all four
    requests (P95 at c=4 1.14x the baseline's). A cost probe verifies each row's last token again:
    no proposer call, no catch-up; the verify cell is sampled, the draft's cost and the rows'
    acceptance are not; the output is the plain one."""
    prop = CountingProposer()
    eng = Engine(ScriptedLM(), prop, max_draft_len=3, max_batch_size=2, adaptive=True, policy="goodput")
    _synthetic_costs(eng, 2, lambda k: 0.02 * (k + 1), 0.01)  # every token row costs 10 ms: drafting never pays
    _synthetic_costs(eng, 1, lambda k: 0.01 * (k + 1), 0.01)
    g = eng.goodput
    g.probe_every, g.cost_probe_every = 4, 8
    g.probe_budget = 1e9  # the budget is tests/unit/test_goodput.py's subject: here every probe is due
    verify_samples = g.cost.cells[(2, 1)].n
    steps = []
    eng.trace = steps.append
    outs = eng.generate([[0], [5]], Sampling(max_tokens=30, ignore_eos=True))
    assert [o.token_ids for o in outs] == [[t % 16 for t in range(1, 31)], [t % 16 for t in range(6, 36)]]
    probes = [e for e in steps if e.get("why") == "cost probe"]
    assert len(probes) >= 2 and all(e["k"] == 1 and e["draft_ms"] == 0 and e["accepted"] == 0 for e in probes)
    assert prop.calls == 0  # nothing drafted, nothing caught up
    assert g.cost.cells[(2, 1)].n == verify_samples + len(probes)  # the verify pass was measured
    assert g.cost.draft_cells[(2, 1)].n == 1  # the draft's cost was not: no draft ran
    assert all(o.stats.drafted == 0 and o.stats.accepted == 0 for o in outs)  # a guess is not a draft
    assert eng.cost["draft_token"] is None  # nor is it draft work: `tune` and the acceptance policy read this
    assert g.snapshot()["probes"] == len(probes)
