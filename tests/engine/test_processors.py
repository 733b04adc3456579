"""Logits processors (penalties, bad words, min length, stop words, log-probs) in the torch runtime.

Hand-built logits for the rules; then the property that matters: speculation under each processor
is token-identical to plain decoding with the same settings (greedy), with draft-target and n-gram
proposers, and sampled speculation follows the *processed* target distribution. The models are
random-initialised small Llamas (a 48-token vocabulary repeats itself, so penalties bite).
"""

from __future__ import annotations

import copy

import pytest
import torch

from trtspec.speculative.engine import Engine
from trtspec.speculative.model import CausalLM, ModelArgs
from trtspec.speculative.processors import ends_with_stop_word, log_probs, process_window
from trtspec.speculative.proposers import DraftModelProposer, NgramProposer
from trtspec.sampling import Sampling, SamplingError
from trtspec.speculative.sampling import logits_to_probs
from tests.engine.sampled_law import assert_three_token_law

EOS = 18  # a token the random target emits early for some prompts
VOCAB = 48


def random_lm(seed: int, layers: int = 2) -> CausalLM:
    torch.manual_seed(seed)
    args = ModelArgs(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                     num_attention_heads=4, num_key_value_heads=2, head_dim=8, rms_norm_eps=1e-6,
                     rope_theta=10000.0, max_position_embeddings=512, tie_word_embeddings=False,
                     attention_bias=False, eos_token_id=EOS)
    m = CausalLM(args).eval()
    with torch.no_grad():
        m.lm_head.weight.mul_(6.0)  # peaky distributions: long greedy runs, rare ties
    return m


@pytest.fixture(scope="module")
def target():
    return random_lm(0)


@pytest.fixture(scope="module")
def draft(target):
    """The target with noise on its head: agrees often, not always (both accept and reject paths)."""
    d = copy.deepcopy(target)
    with torch.no_grad():
        d.lm_head.weight.add_(torch.randn_like(d.lm_head.weight) * 0.5)
    return d


PROMPTS = [[5, 9, 11, 5, 9], [7, 7, 30, 12], [40, 1, 3, 22, 17, 8, 6], [19]]


def test_repetition_penalty_divides_positive_and_multiplies_negative_logits_of_seen_tokens():
    logits = torch.tensor([[2.0, -2.0, 2.0, -2.0]])
    p = Sampling(repetition_penalty=2.0)
    out = process_window(logits, p, [0, 1], prompt_len=2, drafts=[], end_ids=set())
    assert out.tolist() == [[1.0, -4.0, 2.0, -2.0]]  # prompt tokens count for repetition


def test_presence_and_frequency_count_generated_tokens_only_and_each_window_position_sees_its_drafts():
    logits = torch.zeros(3, 4)
    p = Sampling(presence_penalty=1.0, frequency_penalty=0.5)
    # prompt [3], generated [1, 1]; window positions 1 and 2 come after drafts 2 then 1
    out = process_window(logits, p, [3, 1, 1], prompt_len=1, drafts=[2, 1], end_ids=set())
    assert out[0].tolist() == [0.0, -2.0, 0.0, 0.0]  # token 1: presence 1 + 2 × 0.5
    assert out[1].tolist() == [0.0, -2.0, -1.5, 0.0]  # + draft 2 once
    assert out[2].tolist() == [0.0, -2.5, -1.5, 0.0]  # + draft 1 a third time


def test_bad_words_ban_the_last_token_after_their_prefix_and_min_tokens_bans_the_end_tokens():
    logits = torch.zeros(2, 6)
    p = Sampling(bad_words=((4,), (1, 5)), min_tokens=2)
    out = process_window(logits, p, [0, 3], prompt_len=1, drafts=[1], end_ids={2})
    inf = float("-inf")
    assert out[0].tolist() == [0, 0, inf, 0, inf, 0]  # 1 generated < 2: EOS banned; (1,5) not primed
    assert out[1].tolist() == [0, 0, 0, 0, inf, inf]  # after draft 1: 5 banned; 2 generated: EOS allowed


def test_nothing_to_process_returns_the_same_tensor_and_bad_values_are_rejected():
    logits = torch.randn(2, 5)
    assert process_window(logits, Sampling(), [1], 1, [3], {2}) is logits
    for kw, field in ((dict(repetition_penalty=0.0), "repetition_penalty"), (dict(min_tokens=-1), "min_tokens"),
                      (dict(presence_penalty=float("nan")), "presence_penalty"), (dict(bad_words=((),)), "bad_words")):
        with pytest.raises(SamplingError, match=field):
            Sampling(**kw)
    assert ends_with_stop_word([1, 2, 3], ((2, 3),)) and not ends_with_stop_word([1, 2, 3], ((1, 2),))


SETTINGS = {
    "repetition_penalty": dict(repetition_penalty=1.8),
    "presence_penalty": dict(presence_penalty=3.0),
    "frequency_penalty": dict(frequency_penalty=1.5),
    "bad_words": dict(bad_words=((3,), (41, 38), (30, 12, 7))),
    "min_tokens": dict(min_tokens=30),
    "stop_words": dict(stop_words=((31, 39),)),
    "all": dict(repetition_penalty=1.3, presence_penalty=0.5, frequency_penalty=0.4, bad_words=((3,),),
                min_tokens=10, stop_words=((37, 31),)),
}


def _plain(target, prompts, params):
    return Engine(target, None, max_batch_size=4, max_seq_len=256).generate(prompts, params)


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_speculation_is_token_identical_to_plain_decoding_under_each_processor(target, draft, name):
    params = Sampling(max_tokens=40, logprobs=True, **SETTINGS[name])
    plain = _plain(target, PROMPTS, params)
    baseline = _plain(target, PROMPTS, Sampling(max_tokens=40))
    # the processor changes the output somewhere, or this test proves nothing
    assert [g.token_ids for g in plain] != [g.token_ids for g in baseline]
    for proposer in (DraftModelProposer(draft, 4, 300), NgramProposer()):
        spec = Engine(target, proposer, max_draft_len=4, max_batch_size=4, max_seq_len=256).generate(PROMPTS, params)
        assert [g.token_ids for g in spec] == [g.token_ids for g in plain], proposer.name
        if proposer.name == "draft_target":  # both the accept and the reject path ran
            assert sum(g.stats.accepted for g in spec) > 0
            assert sum(g.stats.drafted - g.stats.accepted for g in spec) > 0
        for s, p in zip(spec, plain):
            assert len(s.logprobs) == len(s.token_ids)
            torch.testing.assert_close(torch.tensor(s.logprobs), torch.tensor(p.logprobs), atol=1e-4, rtol=1e-4)


def test_the_processors_hold_in_the_output(target):
    def gen(**kw):
        return _plain(target, PROMPTS, Sampling(max_tokens=40, **kw))

    for g in gen(bad_words=((3,), (41, 38))):
        seq = g.request.prompt + g.token_ids
        assert 3 not in g.token_ids and all(seq[i:i + 2] != [41, 38] for i in range(len(g.request.prompt) - 1, len(seq)))
    free = gen()
    assert any(g.finish_reason == "stop" and len(g.token_ids) < 30 for g in free)  # EOS comes early without it
    assert all(len(g.token_ids) >= 30 or g.finish_reason == "length" for g in gen(min_tokens=30))
    stopped = gen(stop_words=((31, 39),))
    for g, f in zip(stopped, free):
        if g.token_ids[-2:] == [31, 39]:  # kept in the output, generation ends there
            assert g.finish_reason == "stop" and g.token_ids == f.token_ids[: len(g.token_ids)]
    assert sum(g.token_ids[-2:] == [31, 39] for g in stopped) >= 2


def test_log_probs_are_the_targets_at_each_position(target):
    params = Sampling(max_tokens=12, logprobs=True, repetition_penalty=1.5)
    g = _plain(target, PROMPTS[:1], params)[0]
    seq = g.request.prompt + g.token_ids
    with torch.inference_mode():
        full = target(torch.tensor([seq]), None)[0]  # [T, V]
    n = len(g.request.prompt)
    want = []
    for i, tok in enumerate(g.token_ids):
        row = process_window(full[n - 1 + i:n + i], params, seq[: n + i], n, [], {EOS})[0]
        want.append(float(log_probs(row, params)[tok]))
    torch.testing.assert_close(torch.tensor(g.logprobs), torch.tensor(want), atol=1e-4, rtol=1e-4)


def test_sampled_speculation_follows_the_processed_target_distribution(target, draft):
    """Joint law of the first 3 sampled tokens (2-3 from one speculative step) against the exact
    law of the target with penalties and a bad word applied at each position."""
    kw = dict(max_tokens=3, temperature=1.0, top_k=3, repetition_penalty=1.6, presence_penalty=0.7,
              frequency_penalty=0.3, bad_words=((9, 11),))
    sp = Sampling(**kw)
    prompt = [5, 9, 11, 5, 9]
    moved = []

    def probs(seq):
        with torch.inference_mode():
            logits = target(torch.tensor([seq]), None)[0, -1:]
        p = logits_to_probs(process_window(logits, sp, seq, len(prompt), [], {EOS})[0], sp)
        moved.append(float((p - logits_to_probs(logits[0], sp)).abs().sum()))
        return p

    assert_three_token_law(target, draft, prompt, probs, kw)
    assert max(moved) > 0.2  # the processors really moved the law being tested
