"""speculation.draft_vocab_size: the draft scores only its most frequent tokens (FR-Spec / EAGLE-3's
draft vocabulary); the target still verifies every token, so output does not change.

A small random model (no training), on each LM head kind the runtime has: a plain bf16 linear,
a tied one, INT8 and INT4 weight-only heads. The cut head's logits are the full head's at the kept
rows, bit for bit; the proposer drafts only kept tokens; the Engine's greedy output with a cut
draft equals plain decoding; the d2t / t2d maps follow EAGLE-3's convention; the frequency count
is cached and follows the tokenizer.
"""

from __future__ import annotations

import json

import pytest
import torch

from trtspec.errors import ModelError
from trtspec.sampling import Sampling
from trtspec.speculative.engine import Engine
from trtspec.speculative.model import CausalLM, Int4Linear, ModelArgs, Step
from trtspec.speculative.proposers import DraftModelProposer
from trtspec.speculative.vocab import DraftVocab, frequent_vocab

V = 512


def _args(tie: bool) -> ModelArgs:
    return ModelArgs(vocab_size=V, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, head_dim=32, rms_norm_eps=1e-6,
                     rope_theta=10000.0, max_position_embeddings=512, tie_word_embeddings=tie,
                     attention_bias=False)


def _model(head: str, seed: int = 0) -> CausalLM:
    torch.manual_seed(seed)
    m = CausalLM(_args(head == "tied"))
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0, 0.3)
    m = m.eval()
    if head == "int8":
        return m.to(torch.bfloat16).quantize_weight_only_()
    if head == "int4":
        w = m.lm_head.weight
        amax = w.detach().view(V, -1, 128).abs().amax(-1)
        m.lm_head = Int4Linear(w, None, amax, group=128)
        return m.to(torch.bfloat16)
    return m.fuse_()


IDS = torch.tensor(sorted(set(range(0, V, 3)) | {V - 1}))[:128]


@pytest.mark.parametrize("head", ["linear", "tied", "int8", "int4"])
def test_cut_head_gives_the_full_heads_logits_at_the_kept_rows(head):
    m = _model(head)
    ids = torch.randint(0, V, (1, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = m(ids, m.new_cache(1, 64), Step([0], [0], 12))
        emb_before = m.model.embed_tokens.weight.clone()
        m.restrict_vocab_(IDS)
        cut = m(ids, m.new_cache(1, 64), Step([0], [0], 12))
    assert cut.shape[-1] == IDS.numel()
    assert torch.equal(cut, full[..., IDS])
    assert torch.equal(m.model.embed_tokens.weight, emb_before)  # a tied head's embedding keeps every row
    assert m.restrict_vocab_(IDS) is m  # the same cut again: nothing to do (engines share a draft)
    with pytest.raises(ModelError, match="another vocabulary cut"):
        m.restrict_vocab_(IDS[:64])


def test_d2t_and_t2d_follow_eagle3s_convention():
    vocab = DraftVocab(IDS, V, 1.0)
    d2t, t2d = vocab.d2t(), vocab.t2d()
    assert torch.equal(torch.arange(vocab.size) + d2t, IDS)  # target id = draft index + d2t[index]
    assert t2d.dtype == torch.bool and t2d.shape == (V,) and int(t2d.sum()) == vocab.size
    assert torch.equal(torch.nonzero(t2d)[:, 0], IDS)
    assert torch.equal(DraftVocab.from_d2t(d2t, V).ids, IDS)


@pytest.mark.parametrize("greedy", [True, False])
def test_a_cut_draft_proposes_only_kept_tokens_and_the_output_is_the_targets(greedy):
    target = _model("linear", seed=0)
    draft = _model("linear", seed=0)  # the target's own weights: high agreement inside the cut
    prompts = [torch.randint(0, V, (16,), generator=torch.Generator().manual_seed(s)).tolist() for s in range(3)]
    params = Sampling(max_tokens=24, ignore_eos=True) if greedy else \
        Sampling(max_tokens=24, ignore_eos=True, temperature=0.8, seed=3)
    plain = Engine(target, None, max_batch_size=1, max_seq_len=64)
    proposer = DraftModelProposer(draft, 1, 80, vocab=DraftVocab(IDS, V, 1.0))
    seen: list[int] = []
    propose = proposer.propose

    def spy(*a, **kw):
        p = propose(*a, **kw)
        seen.extend(p.tokens.flatten().tolist())
        if p.probs is not None:  # a distribution over the whole vocabulary, zero outside the cut
            assert p.probs.shape[-1] == V
            outside = torch.ones(V, dtype=torch.bool)
            outside[IDS] = False
            assert float(p.probs[..., outside].abs().sum()) == 0.0
        return p

    proposer.propose = spy
    spec = Engine(target, proposer, max_draft_len=3, max_batch_size=1, max_seq_len=64)
    for p in prompts:
        if greedy:
            assert spec.generate([p], params)[0].token_ids == plain.generate([p], params)[0].token_ids
        else:
            out = spec.generate([p], params)[0].token_ids
            assert len(out) == 24 and all(0 <= t < V for t in out)
    assert seen and set(seen) <= set(IDS.tolist())


def _word_tokenizer(folder, words: list[str]) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, "<eos>": 1, **{w: i + 2 for i, w in enumerate(words)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(["<eos>"])
    tok.save(str(folder / "tokenizer.json"))


def test_frequent_vocab_keeps_specials_and_the_commonest_tokens_and_is_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    words = ["zzzunusedword", "def", "self", "return", "(", ")", ":", "import", "qqqneverseen"] + \
        [f"w{i}" for i in range(60)]
    _word_tokenizer(tmp_path, words)
    vocab = frequent_vocab(tmp_path, 8, len(words) + 2, cfg={"eos_token_id": 1})
    kept = set(vocab.ids.tolist())
    assert {1, 0} <= kept  # EOS (special) and [UNK] (every other word in the corpus)
    assert {words.index(w) + 2 for w in ("def", "self", "return", "(", ")", ":")} <= kept
    assert words.index("qqqneverseen") + 2 not in kept and 0 < vocab.coverage <= 1
    cached = list((tmp_path / "cache" / "trtspec" / "draft_vocab").glob("*.json"))
    assert len(cached) == 1 and json.loads(cached[0].read_text())["ids"] == sorted(kept)
    assert torch.equal(frequent_vocab(tmp_path, 8, len(words) + 2).ids, vocab.ids)  # from the cache
    _word_tokenizer(tmp_path, list(reversed(words)))  # another tokenizer: counted again, its own ids
    assert frequent_vocab(tmp_path, 8, len(words) + 2).ids.tolist() != vocab.ids.tolist()


def test_frequent_vocab_errors_name_the_field_and_the_fix(tmp_path):
    with pytest.raises(ModelError, match="draft_vocab_size.*no tokenizer.json"):
        frequent_vocab(tmp_path, 64, 512)
    _word_tokenizer(tmp_path, ["a", "b"])
    with pytest.raises(ModelError, match=r"draft_vocab_size: 1024 is not in 1\.\.512"):
        frequent_vocab(tmp_path, 1024, 512)


def test_the_draft_reports_what_it_is_behind_and_what_its_catch_up_read():
    """The goodput policy prices drafting after plain steps by these two figures (goodput.py)."""
    proposer = DraftModelProposer(_model("linear"), 2, 80)
    seq = list(range(1, 18))  # a prompt and the target's first token: 17 committed tokens
    proposer.prefill(0, seq)
    assert proposer.behind([0], [seq]) == 16  # the prompt, read at the first proposal, is priced too
    assert proposer.behind([0], [seq + list(range(30, 40))]) == 26  # ... and ten plain steps' tokens
    assert proposer.take_catch_up() == (0.0, 0)
    proposer.propose([0], [seq], [2], [Sampling()], [None])
    seconds, tokens = proposer.take_catch_up()
    assert tokens == 16 and seconds > 0 and proposer.take_catch_up() == (0.0, 0)
    proposer.accept([0], [seq + [5, 6]], [1], None)  # one draft token accepted, plus the target's
    assert proposer.behind([0], [seq + [5, 6]]) == 0  # 1-2 tokens: the batched feed's, not a catch-up
    plain = seq + [5, 6] + list(range(20, 30))  # ten plain steps later
    assert proposer.behind([0], [plain]) >= 10
