"""Models by Hugging Face hub id (issue 22), against a cache folder the test builds in tmp_path
(the layout huggingface_hub writes: models--org--name/refs/<branch>, snapshots/<commit>/...).
Offline throughout: HF_HUB_OFFLINE=1."""

from __future__ import annotations

import copy
import json
import pathlib

import pytest

from trtspec.config import load_recipe, parse_recipe
from trtspec.errors import ConfigError
from trtspec.hub import is_hub_id, resolve_model

COMMIT = "0123456789abcdef0123456789abcdef01234567"
OLD = "fedcba9876543210fedcba9876543210fedcba98"


def _snapshot(cache: pathlib.Path, rid: str, commit: str, *, vocab: dict, branch: str | None = "main") -> pathlib.Path:
    repo = cache / ("models--" + rid.replace("/", "--"))
    snap = repo / "snapshots" / commit
    snap.mkdir(parents=True)
    (snap / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                                                  "vocab_size": len(vocab), "max_position_embeddings": 4096}))
    (snap / "tokenizer.json").write_text(json.dumps({"model": {"vocab": vocab}, "added_tokens": []}))
    (snap / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>", "pad_token": None}))
    if branch:
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / branch).write_text(commit)
    return snap


@pytest.fixture
def hub_cache(tmp_path, monkeypatch) -> pathlib.Path:
    cache = tmp_path / "hf-cache"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_TOKEN", "hf_secret_never_written")
    vocab = {"</s>": 0, "a": 1, "b": 2}
    _snapshot(cache, "org/big-chat", COMMIT, vocab=vocab)
    _snapshot(cache, "org/big-chat", OLD, vocab=vocab, branch=None)
    _snapshot(cache, "org/small-chat", COMMIT, vocab=vocab)
    return cache


def test_ids_resolve_to_cached_snapshots_at_main_or_a_pinned_revision(hub_cache):
    assert resolve_model("org/big-chat") == hub_cache / "models--org--big-chat" / "snapshots" / COMMIT
    assert resolve_model("hf://org/big-chat", OLD) == hub_cache / "models--org--big-chat" / "snapshots" / OLD
    assert is_hub_id("hf://org/x") and is_hub_id("org/x") and not is_hub_id("/abs/path") and not is_hub_id("../m/x")


def test_an_id_missing_offline_is_an_error_naming_the_field_and_what_to_download(hub_cache):
    with pytest.raises(ConfigError) as e:
        resolve_model("meta-llama/Llama-3.1-8B-Instruct", "v1", field="speculation.draft.model")
    err = e.value
    assert err.field == "speculation.draft.model" and err.value == "meta-llama/Llama-3.1-8B-Instruct"
    assert "not in the Hugging Face cache" in err.problem and "HF_HUB_OFFLINE=1" in err.problem
    assert "huggingface-cli download meta-llama/Llama-3.1-8B-Instruct --revision v1" in err.fix
    assert "HF_TOKEN" in err.fix and "hf_secret_never_written" not in str(err)


def test_recipe_keeps_ids_and_check_reads_config_and_tokenizer_from_the_cache(hub_cache, tmp_path):
    from trtspec.preflight import run_checks

    path = tmp_path / "r.yaml"
    path.write_text(json.dumps({
        "name": "hub", "target": {"model": "hf://org/big-chat", "revision": COMMIT},
        "speculation": {"method": "draft_target", "draft": {"model": "org/small-chat"}, "max_draft_len": 4},
        "runtime": {"backend": "trtllm-pytorch", "device": "cuda"},
    }))
    recipe = load_recipe(path)
    assert (recipe.target.model, recipe.draft_spec.model) == ("hf://org/big-chat", "org/small-chat")
    report = run_checks(recipe, str(path))
    checks = {c.name: c for c in report.checks}
    assert checks["hub:target.model"].status == "ok" and COMMIT in checks["hub:target.model"].detail
    assert checks["tokenizer"].status == "ok" and checks["special_tokens"].status == "ok"  # read from the cache
    assert checks["model:target"].status == "ok" and report.ok
    assert "hf_secret_never_written" not in json.dumps(report.to_dict())


def test_check_fails_an_uncached_id_offline(hub_cache):
    from trtspec.preflight import run_checks

    recipe = parse_recipe({"name": "x", "target": {"model": "org/not-downloaded"}, "speculation": {"method": "none"}})
    checks = {c.name: c for c in run_checks(recipe).checks}
    line = checks["hub:target.model"]
    assert line.status == "fail" and "target.model='org/not-downloaded'" in line.detail
    assert "huggingface-cli download org/not-downloaded" in line.fix and "model:target" not in checks


def test_build_plan_uses_the_snapshot_folder_and_keeps_an_uncached_id_with_a_note(hub_cache, tmp_path):
    from trtspec.trtllm.build import plan_build

    d = {"name": "hub", "target": {"model": "org/big-chat", "quantization": {"format": "fp8"}},
         "speculation": {"method": "draft_target", "draft": {"model": "org/uncached"}, "max_draft_len": 4},
         "runtime": {"backend": "trtllm-pytorch", "device": "cuda"}}
    plan = plan_build(parse_recipe(copy.deepcopy(d)), tmp_path / "out")
    snap = str(hub_cache / "models--org--big-chat" / "snapshots" / COMMIT)
    quant = list(plan.stages[0].commands[0])
    assert quant[quant.index("--model") + 1] == snap
    assert plan.handoff.llm_api["speculative_config"]["speculative_model_dir"] == "org/uncached"
    assert any("speculation.draft.model: org/uncached is not in the Hugging Face cache" in n for n in plan.notes)
    assert "hf_secret_never_written" not in json.dumps(plan.to_dict())
    with pytest.raises(ConfigError, match="org/uncached"):  # a real build must resolve it: offline it cannot
        plan_build(parse_recipe(copy.deepcopy(d)), tmp_path / "out", download=True)
