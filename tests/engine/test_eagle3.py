"""EAGLE-3 head: lossless greedy decoding, exact cache rollback, seeded sampling, the export
format, and agreement with ModelOpt's EAGLE module on the same weights.

A head is trained for a few steps in a module fixture (seconds): equivalence must hold for any
head, and a briefly trained one accepts some tokens so both the accept and reject paths run.
"""

from __future__ import annotations

import copy
import json
from dataclasses import replace

import pytest
import torch

from trtspec.errors import ModelError
from trtspec.manifest import write_manifest
from trtspec.checkpoints.eagle3 import (
    Eagle3Settings,
    corpus_ids,
    head_config_for,
    init_head,
    make_eagle3_head,
    ttt_loss,
)
from trtspec.speculative.eagle3 import (
    HEAD_TENSORS,
    Eagle3Head,
    Eagle3Proposer,
    default_aux_layers,
    load_eagle3_head,
    save_head,
)
from trtspec.speculative.engine import Engine
from trtspec.speculative.model import Step, load_causal_lm
from trtspec.sampling import Sampling
from trtspec.speculative.verify import verify_greedy

FAST = Eagle3Settings(steps=12, batch_size=4, seq_len=64, ttt_steps=2, eval_prompts=4, eval_new_tokens=8, threads=1)


@pytest.fixture(scope="module", autouse=True)
def _threads():
    # one thread: these models are overhead-bound, and on a shared CPU a second torch thread
    # that gets descheduled stalls every op (measured 20x slower under load)
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


@pytest.fixture(scope="module")
def target(tiny_target):
    return load_causal_lm(tiny_target)


@pytest.fixture(scope="module")
def corpus(tiny_target):
    return corpus_ids(tiny_target, 16)


@pytest.fixture(scope="module")
def head_dir(tiny_target, tmp_path_factory):
    out = tmp_path_factory.mktemp("eagle3") / "head"
    res = make_eagle3_head(tiny_target, out, FAST)
    assert not res.cached
    return out


@pytest.fixture(scope="module")
def head(head_dir, target):
    return load_eagle3_head(head_dir, target)


def mixed_prompts(held: torch.Tensor, n: int) -> list[list[int]]:
    """n held-out prompts, 1..~120 tokens, spread over the text."""
    stride = (held.numel() - 200) // n
    return [held[i * stride : i * stride + 1 + (i * 29) % 121].tolist() for i in range(n)]


def generate(target, proposer, prompts, params, *, k=4, batch=4):
    eng = Engine(target, proposer, max_draft_len=k, max_batch_size=batch, max_seq_len=256)
    return eng.generate(prompts, params)


# --------------------------------------------------------------------------------------------
# lossless decoding


def test_greedy_is_token_identical_to_plain_decoding(target, head, corpus):
    prompts = mixed_prompts(corpus[1], 56)
    assert min(map(len, prompts)) == 1 and max(map(len, prompts)) > 100
    params = Sampling(max_tokens=16, ignore_eos=True)
    plain = generate(target, None, prompts, params, batch=8)
    # different draft lengths and batch compositions (the second on a subset, for time)
    for k, batch, n in ((4, 8, len(prompts)), (2, 3, 12)):
        spec = generate(target, Eagle3Proposer(head, batch, 300), prompts[:n], params, k=k, batch=batch)
        for i, (a, b) in enumerate(zip(plain, spec)):
            assert a.token_ids == b.token_ids, f"prompt {i} (len {len(prompts[i])}) diverged with k={k}"
        accepted = sum(g.stats.accepted for g in spec)
        drafted = sum(g.stats.drafted for g in spec)
        assert 0 < accepted < drafted  # both the accept and the reject paths ran


def test_int8_head_drafts_like_the_fp32_head_and_stays_lossless(target, head_dir, head, corpus):
    """runtime.draft_weight_only: int8 on an EAGLE-3 head: INT8 fc/layer/LM-head copy, the
    target's own LM head untouched; outputs identical to plain decoding, acceptance close to the
    fp32 head's."""
    from trtspec.speculative.model import Int8Linear

    h8 = load_eagle3_head(head_dir, target).quantize_weight_only_()
    assert type(h8.fc) is Int8Linear and type(h8._draft_lm_head) is Int8Linear
    assert type(target.lm_head) is torch.nn.Linear  # the verifier's head is not quantized
    prompts = mixed_prompts(corpus[1], 24)
    params = Sampling(max_tokens=16, ignore_eos=True)
    plain = generate(target, None, prompts, params, batch=8)
    spec8 = generate(target, Eagle3Proposer(h8, 8, 300), prompts, params, batch=8)
    spec = generate(target, Eagle3Proposer(head, 8, 300), prompts, params, batch=8)
    assert [g.token_ids for g in spec8] == [g.token_ids for g in plain]
    rate = lambda gs: sum(g.stats.accepted for g in gs) / sum(g.stats.drafted for g in gs)  # noqa: E731
    assert rate(spec8) > 0 and abs(rate(spec8) - rate(spec)) < 0.1
    with pytest.raises(ModelError, match="already quantized"):
        h8.quantize_weight_only_()


def test_greedy_identical_with_untrained_head(target, corpus):
    """A random head (nothing accepted) must still never change the output."""
    h = Eagle3Head(head_config_for(target, FAST), target.model.embed_tokens, target.lm_head)
    init_head(h, 123)
    h.eval()
    prompts = mixed_prompts(corpus[1], 12)
    params = Sampling(max_tokens=16, ignore_eos=True)
    plain = generate(target, None, prompts, params)
    spec = generate(target, Eagle3Proposer(h, 4, 300), prompts, params)
    assert [g.token_ids for g in plain] == [g.token_ids for g in spec]


def full_features(target, head, seq):
    with torch.inference_mode():
        _, hidden, _ = target(torch.tensor([seq]), None, hidden_layers=head.aux_layers)
    return torch.cat(hidden, -1)


def test_rollback_equals_fresh_prefill(target, head, corpus):
    """After any accept/reject history the head drafts exactly what a fresh head prefilled
    with the whole committed sequence drafts: rolled back, never stale, never recomputed.
    The head trains for seconds, so some prompts get no draft accepted: windows of held-out
    text are tried in order until one history mixes different acceptance lengths."""
    K = 4
    greedy = Sampling(max_tokens=64)
    seen: set[int] = set()
    for start in range(3000, 3000 + 8 * 40, 40):
        prompt = corpus[1][start:start + 40].tolist()
        prop = Eagle3Proposer(head, 2, 300)
        cache = target.new_cache(1, 300)
        with torch.inference_mode():
            logits, hidden, _ = target(torch.tensor([prompt]), cache, Step([0], [0], len(prompt)),
                                       logits="last", hidden_layers=head.aux_layers)
        seq = prompt + [int(logits[0, -1].argmax())]
        valid = len(prompt)
        prop.prefill(1, seq, torch.cat(hidden, -1))  # slot 1: rows need not start at 0
        seen = set()
        for _ in range(10):
            got = prop.propose([1], [seq], [K], [greedy], [None])
            fresh = Eagle3Proposer(head, 1, 300)
            fresh.prefill(0, seq, full_features(target, head, seq[:-1]))
            want = fresh.propose([0], [seq], [K], [greedy], [None])
            assert got.tokens.tolist() == want.tokens.tolist()
            with torch.inference_mode():
                inp = torch.cat([torch.tensor([[seq[-1]]]), got.tokens], 1)
                logits, hidden, _ = target(inp, cache, Step([0], [valid], K + 1), hidden_layers=head.aux_layers)
            n, nxt = verify_greedy(got.tokens, logits, got.lens)
            n, nxt = int(n[0]), int(nxt[0])
            seen.add(n)
            seq = seq + got.tokens[0, :n].tolist() + [nxt]
            valid += n + 1
            prop.accept([1], [seq], [n], torch.cat(hidden, -1))
        if len(seen) > 1:
            break
    assert len(seen) > 1  # some history mixed different acceptance lengths


def test_step_without_drafting_keeps_pending_features(target, head, corpus):
    """k = 0 for a round (adaptive fallback): the next round still drafts from every position."""
    prompts = mixed_prompts(corpus[1], 6)
    params = Sampling(max_tokens=20, ignore_eos=True)
    plain = generate(target, None, prompts, params)
    eng = Engine(target, Eagle3Proposer(head, 3, 300), max_draft_len=3, max_batch_size=3, max_seq_len=256)
    eng._draft_len = lambda s, batch_k=None: 0 if s.stats.generated % 3 == 1 else max(0, min(3, params.max_tokens - s.stats.generated - 1))
    spec = eng.generate(prompts, params)
    assert [g.token_ids for g in plain] == [g.token_ids for g in spec]
    assert sum(g.stats.accepted for g in spec) > 0


# --------------------------------------------------------------------------------------------
# sampling


def test_sampled_decoding_is_seeded_and_uses_draft_probabilities(target, head, corpus):
    prompts = mixed_prompts(corpus[1], 6)
    runs = []
    for seed in (7, 7, 8):
        params = [Sampling(max_tokens=20, temperature=0.8, top_k=50, seed=seed + i, ignore_eos=True)
                  for i in range(len(prompts))]
        runs.append([g.token_ids for g in generate(target, Eagle3Proposer(head, 4, 300), prompts, params)])
    assert runs[0] == runs[1]
    assert runs[0] != runs[2]
    prop = Eagle3Proposer(head, 1, 300)
    seq = prompts[2] + [5]
    prop.prefill(0, seq, full_features(target, head, seq[:-1]))
    p = Sampling(temperature=0.8, top_k=50)
    out = prop.propose([0], [seq], [3], [p], [torch.Generator().manual_seed(0)])
    assert out.probs is not None and out.probs.shape == (1, 3, target.args.vocab_size)
    assert torch.allclose(out.probs.sum(-1), torch.ones(1, 3))
    q = out.probs[0, torch.arange(3), out.tokens[0]]
    assert (q > 0).all()  # every drafted token has mass under the distribution it was drawn from
    assert ((out.probs > 0).sum(-1) <= 50).all()  # top-k applied to the draft distribution too


# --------------------------------------------------------------------------------------------
# format


def test_export_layout_and_round_trip(head_dir, head, target, tmp_path):
    from safetensors.torch import load_file

    cfg = json.loads((head_dir / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["model_type"] == "llama"
    assert cfg["num_hidden_layers"] == 1 and cfg["hidden_size"] == target.args.hidden_size
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == list(default_aux_layers(4)) == [0, 2, 3]
    assert cfg["eagle_config"]["use_aux_hidden_state"] is True
    tensors = load_file(str(head_dir / "model.safetensors"))
    assert set(tensors) == set(HEAD_TENSORS) | {"lm_head.weight"}
    H = target.args.hidden_size
    assert tensors["fc.weight"].shape == (H, 3 * H)
    assert tensors["layers.0.self_attn.q_proj.weight"].shape[1] == 2 * H
    assert torch.equal(tensors["lm_head.weight"], target.lm_head.weight)
    manifest = json.loads((head_dir / "trtspec.json").read_text())
    assert manifest["kind"] == "eagle3_head" and manifest["feature_norm"] == "standard"
    assert manifest["acceptance"]["acceptance_length"] >= 1.0

    save_head(head, tmp_path / "again")
    again = load_eagle3_head(tmp_path / "again", target)
    for k, v in head.state_dict().items():
        assert torch.equal(v, again.state_dict()[k]), k
    f, ids = torch.randn(2, 5, H), torch.randint(0, 4096, (2, 5))
    with torch.inference_mode():
        assert torch.equal(head(f, ids, None), again(f, ids, None))


def test_cache_forward_matches_full_forward(head):
    """Prefill in two chunks through the KV cache == one causal pass."""
    H = head.args.hidden_size
    f, ids = torch.randn(1, 9, H), torch.randint(0, 4096, (1, 9))
    cache = head.new_cache(2, 32)
    with torch.inference_mode():
        full = head(f, ids, None)
        a = head(f[:, :5], ids[:, :5], cache, Step([1], [0], 5))
        b = head(f[:, 5:], ids[:, 5:], cache, Step([1], [5], 4))
    torch.testing.assert_close(torch.cat([a, b], 1), full, rtol=1e-4, atol=1e-5)


def test_cached_make_does_no_work(tiny_target, head_dir):
    res = make_eagle3_head(tiny_target, head_dir, FAST)
    assert res.cached


@pytest.mark.parametrize(
    "edit, match",
    [
        (lambda c: c.update(architectures=["LlamaForCausalLM"]), "not an EAGLE-3 head"),
        (lambda c: c.update(hidden_size=128), "hidden_size 128 != target hidden_size 384"),
        (lambda c: c["eagle_config"].update(eagle_aux_hidden_state_layer_ids=[0, 2, 9]), "layers the target does not have"),
        (lambda c: c["eagle_config"].update(use_aux_hidden_state=False), "use_aux_hidden_state"),
        (lambda c: c.update(draft_vocab_size=1024), "d2t"),
        (lambda c: c.update(rope_scaling={"rope_type": "yarn", "factor": 32.0}), "eagle_export_rope_scaling"),
        (lambda c: c.update(num_hidden_layers=2), "1-layer heads"),
    ],
)
def test_bad_head_configs_are_refused(head_dir, target, tmp_path, edit, match):
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(head_dir, bad)
    cfg = json.loads((bad / "config.json").read_text())
    edit(cfg)
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelError, match=match):
        load_eagle3_head(bad, target)


def test_head_for_another_target_is_refused(head_dir, tiny_target, tmp_path):
    other = load_causal_lm(tiny_target)
    with torch.no_grad():
        other.lm_head.weight.add_(0.5)
    with pytest.raises(ModelError, match="trained for another target"):
        load_eagle3_head(head_dir, other)
    with pytest.raises(ModelError, match="not found"):
        load_eagle3_head(tmp_path / "nope", other)


def test_runtime_builds_eagle3_engine(tiny_target, head_dir):
    from trtspec.speculative.runtime import RuntimeSpec, build_engine

    eng = build_engine(RuntimeSpec(target=str(tiny_target), method="eagle3", draft=str(head_dir), max_draft_len=3,
                                   limits={"max_batch_size": 2, "max_seq_len": 128}))
    assert eng.proposer.name == "eagle3" and eng.proposer.target_hidden_layers == (0, 2, 3)
    (g,) = eng.generate([[10, 20, 30]], Sampling(max_tokens=8, ignore_eos=True))
    assert len(g.token_ids) == 8 and g.stats.drafted > 0
    with pytest.raises(ModelError, match="head folder"):
        build_engine(RuntimeSpec(target=str(tiny_target), method="eagle3", draft=None))


# --------------------------------------------------------------------------------------------
# ModelOpt: same weights → same function (what makes a ModelOpt-trained head loadable)


@pytest.fixture(scope="module")
def modelopt_eagle(tiny_target):
    mtsp = pytest.importorskip("modelopt.torch.speculative")
    from transformers import AutoModelForCausalLM

    if "eagle_ttt_steps" not in mtsp.config.EagleConfig.model_fields:  # ModelOpt 0.37 (NVIDIA's TRT-LLM 1.2 container)
        pytest.skip("this ModelOpt has no EAGLE-3 training options (eagle_ttt_steps): --trainer modelopt needs 0.47")

    model = AutoModelForCausalLM.from_pretrained(str(tiny_target), dtype=torch.float32)
    hc = head_config_for(load_causal_lm(tiny_target), FAST)
    a = hc.layer
    ec = copy.deepcopy(mtsp.EAGLE3_DEFAULT_CFG["config"])
    ec.update(eagle_use_torch_compile=False, eagle_export_rope_scaling={}, eagle_ttt_steps=3)
    ec["eagle_architecture_config"] = {
        "intermediate_size": a.intermediate_size, "num_attention_heads": a.num_attention_heads,
        "num_key_value_heads": a.num_key_value_heads, "head_dim": a.head_dim, "rms_norm_eps": a.rms_norm_eps,
        "rope_theta": a.rope_theta, "rope_scaling": {"rope_type": "default", "rope_theta": a.rope_theta},
        "eagle_aux_hidden_state_layer_ids": list(hc.aux_layers),
    }
    torch.manual_seed(0)
    mtsp.convert(model, [("eagle", ec)])
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # move every weight off its init, norms included (they matter below)
        for n, p in model.eagle_module.named_parameters():
            p.copy_((1 + 0.3 * torch.randn(p.shape, generator=g)) if p.dim() == 1 else 0.05 * torch.randn(p.shape, generator=g))
    return model


def test_modelopt_export_loads_and_matches_modelopt_forward(modelopt_eagle, target, tmp_path):
    from modelopt.torch.export import export_speculative_decoding
    from modelopt.torch.speculative.eagle.utils import make_causal_mask

    out = tmp_path / "mo-head"
    with torch.inference_mode():
        export_speculative_decoding(modelopt_eagle, export_dir=str(out))
    write_manifest(out, "eagle3_head", feature_norm="modelopt")
    ours = load_eagle3_head(out, target)
    assert ours.cfg.feature_norm == "modelopt" and ours.aux_layers == (0, 2, 3)

    em = modelopt_eagle.eagle_module.eval()
    em._maybe_init_rope()
    B, T, H = 2, 11, target.args.hidden_size
    g = torch.Generator().manual_seed(2)
    feats = torch.randn(B, T, 3 * H, generator=g)
    ids = torch.randint(0, 4096, (B, T), generator=g)
    with torch.inference_mode():
        f = em.fc(feats)
        mask = make_causal_mask((B, T), torch.float32, device="cpu", past_key_values_length=0)
        post, pre, _ = em(f, modelopt_eagle.model.embed_tokens(ids), attention_mask=mask, position_ids=None)
        want_logits = modelopt_eagle.lm_head(post)
        got = ours(ours.fc(feats), ids, None)
        torch.testing.assert_close(got, pre, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(ours.logits(got), want_logits, rtol=1e-4, atol=1e-4)
        # the same folder read as "standard" (what TRT-LLM computes) is a different function
        std = copy.deepcopy(ours)
        std.layers[0].feature_norm = "standard"
        assert (std(std.fc(feats), ids, None) - pre).abs().max() > 1e-2


def test_ttt_loss_matches_modelopt_training_loss(modelopt_eagle, target, tmp_path):
    """Our training-time-test steps (mask, feature feedback, labels, decay) are ModelOpt's."""
    from modelopt.torch.export import export_speculative_decoding

    out = tmp_path / "mo-head"
    with torch.inference_mode():
        export_speculative_decoding(modelopt_eagle, export_dir=str(out))
    write_manifest(out, "eagle3_head", feature_norm="modelopt")
    ours = load_eagle3_head(out, target)
    x = torch.randint(0, 4096, (2, 24), generator=torch.Generator().manual_seed(3))
    modelopt_eagle.train()
    try:
        with torch.no_grad():
            mo = modelopt_eagle(input_ids=x)
    finally:
        modelopt_eagle.eval()
    with torch.no_grad():
        loss, accs = ttt_loss(ours, target, x, ttt_steps=2, decay=modelopt_eagle.eagle_loss_decay_factor)
    torch.testing.assert_close(loss, mo.loss.float(), rtol=1e-4, atol=1e-4)


def test_settings_for_trainer():
    assert Eagle3Settings.for_trainer("modelopt").steps < Eagle3Settings.for_trainer("native").steps
    assert Eagle3Settings.for_trainer("native", steps=None, seed=3).steps == Eagle3Settings().steps
    assert Eagle3Settings.for_trainer("native", steps=5).steps == 5


def test_make_rejects_bad_arguments(tiny_target, tmp_path):
    with pytest.raises(ModelError, match="trainer 'magic'"):
        make_eagle3_head(tiny_target, tmp_path / "h", Eagle3Settings(trainer="magic"))
    with pytest.raises(ModelError, match="config.json"):
        make_eagle3_head(tmp_path / "missing", tmp_path / "h", FAST)
    with pytest.raises(ModelError, match="aux_layers"):
        make_eagle3_head(tiny_target, tmp_path / "h", Eagle3Settings(aux_layers=(0, 7), steps=1))


def test_cli_help_and_error(tmp_path):
    from click.testing import CliRunner

    from trtspec.cli import main

    r = CliRunner().invoke(main, ["models", "eagle3", "--help"])
    assert r.exit_code == 0 and "--trainer" in r.output and "--steps" in r.output
    r = CliRunner().invoke(main, ["models", "eagle3", "--target", str(tmp_path / "none"), "--out", str(tmp_path / "h")])
    # a folder no trtspec command makes: the fix says what to put there, and names no wrong command
    assert r.exit_code == 1 and "config.json" in r.output and "trtspec models tiny" not in r.output
    # a tiny-pair folder: the fix names the command that makes it, with its --out
    missing = tmp_path / "models" / "tiny-target"
    r = CliRunner().invoke(main, ["models", "eagle3", "--target", str(missing), "--out", str(tmp_path / "h")])
    # (--out as the user would type it from here: relative below the working folder, else absolute)
    assert r.exit_code == 1 and "trtspec models tiny --out " in r.output, r.output
    assert f"{tmp_path.name}/models` (it writes tiny-target/)" in r.output, r.output


def test_shipped_eagle3_recipe_passes_check_with_a_head(repo_root, tiny_target, head_dir, tmp_path):
    """build_configs/tiny-cpu-eagle3.yaml, pointed at this module's head, is ready."""
    import yaml

    from trtspec.config import load_recipe
    from trtspec.preflight import run_checks

    d = yaml.safe_load((repo_root / "build_configs" / "tiny-cpu-eagle3.yaml").read_text())
    assert d["speculation"]["head"]["model"] == "../models/tiny-eagle3"
    d["target"]["model"], d["speculation"]["head"]["model"] = str(tiny_target), str(head_dir)
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(d))
    report = run_checks(load_recipe(path), str(path))
    status = {c.name: c.status for c in report.checks}
    assert report.ok, report.to_dict()
    assert status["eagle3_head"] == "ok" and status["model:head"] == "ok"


# --------------------------------------------------------------------------------------------
# real scale: features extracted once (cached, resumable) and a draft vocabulary (d2t/t2d)

CUT = Eagle3Settings.real_scale(steps=10, feature_tokens=2048, seq_len=64, batch_size=4, draft_vocab_size=1024,
                                target_dtype="float32", threads=1, eval_prompts=4, eval_new_tokens=8)


@pytest.fixture(scope="module")
def cut_head_dir(tiny_target, tmp_path_factory):
    import os

    cache = tmp_path_factory.mktemp("xdg")
    old = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(cache)
    try:
        out = tmp_path_factory.mktemp("eagle3cut") / "head"
        make_eagle3_head(tiny_target, out, CUT)
        yield out
    finally:
        if old is None:
            os.environ.pop("XDG_CACHE_HOME")
        else:
            os.environ["XDG_CACHE_HOME"] = old


def test_cut_head_exports_d2t_the_way_eagle3_checkpoints_carry_it(cut_head_dir, target, tiny_target):
    from safetensors.torch import load_file

    from trtspec.speculative.vocab import frequent_vocab

    cfg = json.loads((cut_head_dir / "config.json").read_text())
    assert cfg["draft_vocab_size"] == 1024 and cfg["vocab_size"] == target.args.vocab_size == 4096
    t = load_file(str(cut_head_dir / "model.safetensors"))
    H = target.args.hidden_size
    assert t["lm_head.weight"].shape == (1024, H) and t["d2t"].dtype == torch.int64 and t["d2t"].shape == (1024,)
    ids = t["d2t"] + torch.arange(1024)  # TRT-LLM: target id = draft index + d2t[draft index]
    assert torch.equal(ids, frequent_vocab(tiny_target, 1024, 4096).ids)  # the corpus's most frequent tokens
    assert torch.all(ids[1:] > ids[:-1]) and int(ids.max()) < 4096
    assert set(t) == set(HEAD_TENSORS) | {"lm_head.weight", "d2t"}  # ModelOpt's export keys: t2d is derived
    head = load_eagle3_head(cut_head_dir, target)
    assert int(head.t2d.sum()) == 1024 and bool(head.t2d[ids].all())
    m = json.loads((cut_head_dir / "trtspec.json").read_text())
    assert m["data"]["tokens"] == 2048 and m["data"]["draft_vocab_size"] == 1024 and 0 < m["data"]["draft_vocab_coverage"] < 1
    assert len(m["step_accuracy"]) == CUT.ttt_steps + 1


def test_cut_head_is_lossless_and_proposes_only_kept_tokens(cut_head_dir, target, corpus):
    head = load_eagle3_head(cut_head_dir, target)
    assert head.cfg.vocab_cut
    kept = set(head.to_target(torch.arange(1024)).tolist())
    prompts = mixed_prompts(corpus[1], 8)
    greedy = Sampling(max_tokens=24, ignore_eos=True)
    want = [g.token_ids for g in generate(target, None, prompts, greedy, k=0)]
    prop = Eagle3Proposer(head, 4, 300)
    seen: list[int] = []
    orig = prop.propose

    def spy(*a, **k):
        out = orig(*a, **k)
        seen.extend(out.tokens.flatten().tolist())
        return out

    prop.propose = spy
    got = generate(target, prop, prompts, greedy, k=3)
    assert [g.token_ids for g in got] == want
    assert seen and set(seen) <= kept
    assert sum(g.stats.accepted for g in got) > 0  # trained for seconds, it still gets some right
    # sampled: q is a distribution over the target's vocabulary, zero outside the cut
    prop = Eagle3Proposer(head, 1, 300)
    seq = prompts[2] + [5]
    prop.prefill(0, seq, full_features(target, head, seq[:-1]))
    out = prop.propose([0], [seq], [3], [Sampling(temperature=0.8)], [torch.Generator().manual_seed(0)])
    assert out.probs.shape == (1, 3, 4096) and torch.allclose(out.probs.sum(-1), torch.ones(1, 3))
    outside = torch.ones(4096, dtype=torch.bool)
    outside[sorted(kept)] = False
    assert float(out.probs[..., outside].abs().max()) == 0.0 and set(out.tokens.flatten().tolist()) <= kept


def test_feature_extraction_resumes_at_the_first_missing_shard(tiny_target, target, tmp_path, monkeypatch):
    from trtspec.checkpoints.eagle3_data import FeatureSettings, extract_features, feature_dir, load_features

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    fs = FeatureSettings(tokens=1024, seq_len=64, windows_per_shard=4)
    train, _ = corpus_ids(tiny_target, 16)
    folder = feature_dir("t", (0, 2, 3), torch.float32, fs)
    extract_features(target, train, (0, 2, 3), folder, fs, target_id="t")
    assert sorted(p.name for p in folder.glob("shard_*")) == [f"shard_{i:05d}.safetensors" for i in range(4)]
    first = load_features(folder, fs)
    (folder / "shard_00002.safetensors").unlink()
    stamps = {p.name: p.stat().st_mtime_ns for p in folder.glob("shard_*")}
    calls: list[int] = []
    extract_features(target, train, (0, 2, 3), folder, fs, target_id="t",
                     progress=lambda ph, s, n, m: calls.append(s))
    assert calls == [4]  # one shard computed (the 4th of 4 done), the others read from disk
    assert all(p.stat().st_mtime_ns == stamps[p.name] for p in folder.glob("shard_*") if p.name in stamps)
    again = load_features(folder, fs)
    assert torch.equal(first.ids, again.ids) and torch.equal(first.feats, again.feats)
    assert first.feats.shape == (16, 64, 3 * target.args.hidden_size) and first.top_ids.shape == (16, 64, 32)
    # the label is the target's: its argmax is the top-1 id
    with torch.inference_mode():
        logits = target(first.ids[:2], None)
    assert torch.equal(logits.argmax(-1), first.top_ids[:2, :, 0])
    # a larger budget keeps the same first windows (it only adds shards)
    bigger = FeatureSettings(tokens=2048, seq_len=64, windows_per_shard=4)
    assert feature_dir("t", (0, 2, 3), torch.float32, bigger) == folder


def test_scale_presets_and_their_errors(tiny_target, tmp_path):
    from click.testing import CliRunner

    from trtspec.checkpoints.eagle3 import eagle3_settings
    from trtspec.cli import main
    from trtspec.speculative.kernels import cpu_flags

    assert eagle3_settings(tiny_target).feature_tokens is None  # 10M parameters: the target in every step
    real = eagle3_settings(tiny_target, "real")
    assert real.feature_tokens and real.draft_vocab_size == 32768
    assert real.target_dtype == ("bfloat16" if {"avx512_bf16", "amx_bf16"} & cpu_flags() else "float32")
    r = CliRunner().invoke(main, ["models", "eagle3", "--target", str(tiny_target), "--out", str(tmp_path / "h"),
                                  "--scale", "tiny", "--draft-vocab-size", "1024"])
    assert r.exit_code == 1 and "--draft-vocab-size 1024" in r.output and "--scale real" in r.output, r.output
    assert not (tmp_path / "h").exists()


def test_recipe_with_a_cut_head_passes_check_and_serves_losslessly(repo_root, tiny_target, cut_head_dir, tmp_path):
    """A head with a draft vocabulary through the recipe path: `check` says what it drafts over,
    and the runtime the Triton model builds (RuntimeSpec → engine, INT8 head) is lossless."""
    import yaml

    from trtspec.config import load_recipe
    from trtspec.preflight import run_checks
    from trtspec.speculative.runtime import build_engine
    from trtspec.speculative.spec import RuntimeSpec

    d = yaml.safe_load((repo_root / "build_configs" / "tiny-cpu-eagle3.yaml").read_text())
    d["target"]["model"], d["speculation"]["head"]["model"] = str(tiny_target), str(cut_head_dir)
    d["runtime"]["draft_weight_only"] = "int8"
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(d))
    recipe = load_recipe(path)
    report = run_checks(recipe, str(path))
    checks = {c.name: c for c in report.checks}
    assert report.ok and checks["eagle3_head"].status == "ok", report.to_dict()
    assert "drafts over 1024 of the target's 4096 tokens" in checks["eagle3_head"].detail
    spec = RuntimeSpec.from_recipe(recipe)
    eng = build_engine(spec)
    assert eng.proposer.head.cfg.vocab_cut and eng.proposer.head._draft_lm_head is not None
    plain = build_engine(spec.baseline())
    _, held = corpus_ids(tiny_target, 16)
    prompts = mixed_prompts(held, 4)
    greedy = Sampling(max_tokens=16, ignore_eos=True)
    assert [g.token_ids for g in eng.generate(prompts, greedy)] == [g.token_ids for g in plain.generate(prompts, greedy)]


def test_int8_head_on_the_one_call_layer_step_is_lossless(tiny_target, head_dir, corpus):
    """The served form on trtspec's CPU kernels: a bf16 INT8 target (its own layer step) and the
    INT8 head, whose decoder layer runs ``wo_cpu.layer_step_in`` in every draft step: outputs
    identical to plain decoding, acceptance as on the head's torch ops."""
    from trtspec.speculative import kernels

    if kernels.wo_cpu() is None:
        pytest.skip(f"trtspec's CPU kernels do not run here: {kernels.wo_cpu_status()}")
    t = load_causal_lm(tiny_target, dtype=torch.bfloat16).quantize_weight_only_().batch_invariant_()
    fused = load_eagle3_head(head_dir, t, dtype=torch.bfloat16).quantize_weight_only_()
    ops = load_eagle3_head(head_dir, t, dtype=torch.bfloat16).quantize_weight_only_()
    ops._kernel = False  # the same INT8 head on torch ops
    assert fused.kernel_layer() is not None
    calls = []
    real = fused.kernel_layer
    fused.kernel_layer = lambda: calls.append(1) or real()  # count the draft steps that take it
    prompts = mixed_prompts(corpus[1], 12)
    params = Sampling(max_tokens=16, ignore_eos=True)
    plain = generate(t, None, prompts, params, batch=4)
    spec = generate(t, Eagle3Proposer(fused, 4, 300), prompts, params, batch=4)
    spec_ops = generate(t, Eagle3Proposer(ops, 4, 300), prompts, params, batch=4)
    assert [g.token_ids for g in spec] == [g.token_ids for g in plain]
    assert [g.token_ids for g in spec_ops] == [g.token_ids for g in plain]
    assert len(calls) > 12  # every propose after prefill
    rate = lambda gs: sum(g.stats.accepted for g in gs) / sum(g.stats.drafted for g in gs)  # noqa: E731
    assert rate(spec) > 0 and abs(rate(spec) - rate(spec_ops)) < 0.1


def test_the_head_reads_the_prompt_after_the_first_token(target, head, corpus):
    """No head work before the first token (time to first token is the target's prefill alone):
    the prompt's features are read at the first proposal, alone, all but the last position,
    then the batched feed; the catch-up is timed apart for the goodput policy."""
    prompt = corpus[1][:40].tolist()
    prop = Eagle3Proposer(head, 2, 300)
    calls: list[int] = []
    forward = head.forward
    head.forward = lambda feature, ids, *a, **kw: calls.append(ids.shape[1]) or forward(feature, ids, *a, **kw)
    try:
        eng = Engine(target, prop, max_draft_len=3, max_batch_size=2, max_seq_len=256)
        eng.add(prompt, Sampling(max_tokens=8, ignore_eos=True))
        assert calls == [] and prop.pending[0].shape[0] == len(prompt)
        prop.propose([0], [eng.slots[0].seq], [3], [Sampling(max_tokens=8)], [None])
        assert calls[:2] == [len(prompt) - 1, 1]  # the catch-up, then the round's own feed
        secs, tokens = prop.take_catch_up()
        assert tokens == len(prompt) - 1 and secs > 0 and prop.take_catch_up() == (0.0, 0)
    finally:
        del head.forward


def test_continuations_are_the_targets_own_and_resume_at_the_first_missing_shard(tiny_target, target, tmp_path):
    from transformers import AutoTokenizer

    from trtspec.checkpoints.eagle3_data import ContinuationSettings, generate_continuations
    from trtspec.corpus import corpus_split

    tok = AutoTokenizer.from_pretrained(str(tiny_target))
    cs = ContinuationSettings(new_tokens=12, batch_size=4, max_chars=300)
    train_texts = corpus_split(16)[0]
    stream = generate_continuations(target, tok, train_texts, tmp_path, 300, cs)
    shards = sorted(p.name for p in tmp_path.glob("gen_*"))
    assert stream.numel() >= 300 and shards and shards[0] == "gen_00000.safetensors"
    # the first shard: prompt, then exactly the target's plain greedy continuation, then EOS
    from trtspec.corpus import code_request_prompts

    prompts = code_request_prompts(train_texts, 4, seed=0, min_chars=cs.min_chars, max_chars=cs.max_chars)
    p0 = tok.backend_tokenizer.encode(prompts[0], add_special_tokens=False).ids
    want = generate(target, None, [p0], Sampling(max_tokens=12), k=0)[0].token_ids
    got = stream[len(p0) : len(p0) + len(want)].tolist()
    assert stream[: len(p0)].tolist() == p0 and got == want
    assert int(stream[len(p0) + len(want) - (1 if want[-1] == target.args.eos_token_id else 0)]) == \
        target.args.eos_token_id
    # resume: a missing shard is made again, bit for bit; the others are read, not regenerated
    (tmp_path / shards[0]).unlink()
    stamps = {p.name: p.stat().st_mtime_ns for p in tmp_path.glob("gen_*")}
    calls: list[int] = []
    again = generate_continuations(target, tok, train_texts, tmp_path, 300, cs,
                                   progress=lambda ph, s, n, m: calls.append(s))
    assert torch.equal(again, stream) and len(calls) == len(shards)
    assert all(p.stat().st_mtime_ns == stamps[p.name] for p in tmp_path.glob("gen_*") if p.name in stamps)


def test_a_head_trains_on_the_targets_continuations(tiny_target, tmp_path, monkeypatch):
    from click.testing import CliRunner

    from trtspec.cli import main

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    res = make_eagle3_head(tiny_target, tmp_path / "head", replace(CUT, data="continuations", steps=4))
    m = json.loads((tmp_path / "head" / "trtspec.json").read_text())
    assert m["data"]["text"] == "continuations" and m["data"]["tokens"] == 2048
    assert m["data"]["generate_s_this_run"] > 0 and res.acceptance_length >= 1.0
    gen = sorted((tmp_path / "xdg").rglob("gen_*.safetensors"))
    assert gen and all(p.parent == gen[0].parent for p in gen)  # its own cache folder, beside its features
    assert any(gen[0].parent.glob("shard_*.safetensors"))
    r = CliRunner().invoke(main, ["models", "eagle3", "--target", str(tiny_target), "--out", str(tmp_path / "h2"),
                                  "--scale", "tiny", "--data", "continuations"])
    assert r.exit_code == 1 and "--data continuations" in r.output and "--scale real" in r.output, r.output
    assert not (tmp_path / "h2").exists()
