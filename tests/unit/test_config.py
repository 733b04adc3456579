"""The recipe schema: every shipped recipe loads; broken recipes fail naming the field."""

from __future__ import annotations

import copy
import pathlib

import pytest
import yaml

from trtspec.config import Lookahead, lookahead_max_draft_len, load_recipe, parse_recipe
from trtspec.errors import ConfigErrors

REPO = pathlib.Path(__file__).resolve().parents[2]
RECIPES = sorted((REPO / "build_configs").glob("*.yaml"))

BASE = {
    "name": "t",
    "target": {"model": "/m/target"},
    "speculation": {"method": "draft_target", "draft": {"model": "/m/draft"}, "max_draft_len": 4},
}


def with_(path: str, value, base=BASE) -> dict:
    d = copy.deepcopy(base)
    node = d
    keys = path.split(".")
    for k in keys[:-1]:
        node = node.setdefault(k, {})
    if value is _DELETE:
        node.pop(keys[-1])
    else:
        node[keys[-1]] = value
    return d


_DELETE = object()


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.name)
def test_shipped_recipes_load(path):
    recipe = load_recipe(path)
    assert recipe.name
    # relative model paths resolve against the recipe's folder, never the cwd
    assert pathlib.Path(recipe.target.model).is_absolute()


def test_at_least_the_required_recipes_ship():
    names = {p.name for p in RECIPES}
    assert {"tiny-cpu-draft-target.yaml", "tiny-cpu-ngram.yaml", "qwen-coder-cpu.yaml",
            "llama3.1-8b-eagle3-fp8-trtllm.yaml", "llama3.3-70b-draft-target-fp8-trtllm.yaml"} <= names


BROKEN = [
    # (id, recipe, field named in the error, words the message must contain)
    ("unknown-top-key", with_("tragte", {"model": "x"}), "tragte", "Extra inputs"),
    ("unknown-nested-key", with_("speculation.max_draft_length", 4), "speculation.max_draft_length", "Extra inputs"),
    ("unknown-method", with_("speculation.method", "medusa2"), "speculation", "medusa2"),
    ("missing-method", with_("speculation.method", _DELETE), "speculation", "method"),
    ("missing-target", with_("target", _DELETE), "target", "required"),
    ("draft-len-zero", with_("speculation.max_draft_len", 0), "speculation.max_draft_len", "greater than or equal to 1"),
    ("draft-len-too-big", with_("speculation.max_draft_len", 99), "speculation.max_draft_len", "less than or equal to 32"),
    ("bad-quant-format", with_("target.quantization", {"format": "int3"}), "target.quantization.format", "fp8"),
    ("bad-kv-format", with_("target.quantization", {"kv_cache": "fp4"}), "target.quantization.kv_cache", "int8"),
    ("bad-runtime", with_("runtime", {"backend": "vllm"}), "runtime.backend", "trtllm-engine"),
    ("medusa-on-torch", {**BASE, "speculation": {"method": "medusa", "head": {"model": "/h"}}, "runtime": {"backend": "torch"}},
     "runtime.backend", "does not run on runtime 'torch'"),
    ("eagle3-on-engine-flow", {**BASE, "speculation": {"method": "eagle3", "head": {"model": "/h"}}, "runtime": {"backend": "trtllm-engine"}},
     "runtime.backend", "eagle3"),
    ("beam-with-speculation", with_("validation", {"sampling": {"beam_width": 4}}), "validation.sampling.beam_width", "beam search"),
    ("lookahead-formula", {**BASE, "speculation": {"method": "lookahead", "window_size": 7, "ngram_size": 7,
                                                   "verification_set_size": 7, "max_draft_len": 64},
                           "runtime": {"backend": "trtllm-engine"}}, "speculation.max_draft_len", "83"),
    ("eagle-tree-deeper-than-layers", {**BASE, "speculation": {"method": "eagle", "head": {"model": "/h"}, "num_eagle_layers": 2,
                                                               "eagle_choices": [[0], [0, 0], [0, 0, 0]]},
                                       "runtime": {"backend": "trtllm-engine"}}, "speculation.eagle_choices", "num_eagle_layers"),
    ("eagle-tree-orphan", {**BASE, "speculation": {"method": "eagle", "head": {"model": "/h"}, "eagle_choices": [[0], [1, 0]]},
                           "runtime": {"backend": "trtllm-engine"}}, "speculation.eagle_choices", "no parent"),
    ("input-longer-than-seq", with_("limits", {"max_input_len": 2048, "max_seq_len": 1024}), "limits", "max_input_len"),
    ("tp-not-power-of-two", with_("limits", {"tensor_parallel_size": 3}), "limits", "tensor_parallel_size"),
    ("torch-with-tp", with_("limits", {"tensor_parallel_size": 2}), "limits.tensor_parallel_size", "one device"),
    ("kv-fractions-over-one", with_("runtime", {"backend": "trtllm-engine", "trtllm": {"kv_cache_free_gpu_mem_fraction": 0.9,
                                                                                    "draft_kv_cache_free_gpu_mem_fraction": 0.3}}),
     "runtime.trtllm", "share the GPU"),
    ("empty-concurrency", with_("validation", {"concurrency": []}), "validation.concurrency", "non-empty"),
    ("bad-name", with_("name", "has space"), "name", "pattern"),
    ("string-for-int", with_("speculation.max_draft_len", "four"), "speculation.max_draft_len", "integer"),
    ("eagle-pipeline-parallel", {**BASE, "speculation": {"method": "eagle", "head": {"model": "/h"}},
                                 "runtime": {"backend": "trtllm-engine"}, "limits": {"pipeline_parallel_size": 2}},
     "limits.pipeline_parallel_size", "pipeline"),
    ("int8-draft-without-a-draft", {**BASE, "speculation": {"method": "ngram", "max_draft_len": 4},
                                    "runtime": {"draft_weight_only": "int8"}},
     "runtime.draft_weight_only", "draft_target"),
    ("int8-draft-bad-value", with_("runtime", {"draft_weight_only": "int4"}), "runtime.draft_weight_only", "int8"),
    ("compile-draft-without-a-draft", {**BASE, "speculation": {"method": "ngram", "max_draft_len": 4},
                                       "runtime": {"compile_draft": True}},
     "runtime.compile_draft", "draft_target"),
    ("draft-vocab-on-trtllm", with_("speculation.draft_vocab_size", 32768, with_("runtime", {"backend": "trtllm-pytorch"})),
     "speculation.draft_vocab_size", "torch runtime"),
    ("draft-vocab-not-multiple-of-64", with_("speculation.draft_vocab_size", 1000), "speculation.draft_vocab_size", "multiple of 64"),
    ("dynamic-tree-bounds", {**BASE, "speculation": {"method": "eagle3", "head": {"model": "/h"}, "max_draft_len": 4,
                                                     "use_dynamic_tree": True, "dynamic_tree_max_top_k": 2,
                                                     "max_total_draft_tokens": 20}},
     "speculation.max_total_draft_tokens", "4..8"),
]


@pytest.mark.parametrize("case,data,field,words", BROKEN, ids=[b[0] for b in BROKEN])
def test_broken_recipe_names_the_field(case, data, field, words):
    with pytest.raises(ConfigErrors) as exc:
        parse_recipe(data, source=f"{case}.yaml")
    fields = [e.field for e in exc.value.errors]
    assert any(f == field or f.startswith(field + ".") for f in fields), (fields, str(exc.value))
    assert words in str(exc.value), str(exc.value)
    # message shape: field, problem, the value that was given
    assert "got" in str(exc.value)


def test_errors_are_collected_not_first_only():
    data = with_("speculation.max_draft_len", 0, with_("limits", {"max_batch_size": 0}))
    with pytest.raises(ConfigErrors) as exc:
        parse_recipe(data)
    assert len(exc.value.errors) == 2


def test_not_a_mapping_and_bad_yaml(tmp_path):
    with pytest.raises(ConfigErrors, match="mapping"):
        parse_recipe(["a", "b"])
    p = tmp_path / "bad.yaml"
    p.write_text("name: [unclosed\n")
    with pytest.raises(ConfigErrors, match="not valid YAML"):
        load_recipe(p)
    with pytest.raises(ConfigErrors, match="not found"):
        load_recipe(tmp_path / "missing.yaml")


def test_lookahead_formula_matches_trtllm_examples():
    # examples/lookahead/README.md: (W, N, G) = (7, 7, 7) → 83
    assert lookahead_max_draft_len(7, 7, 7) == 83
    assert lookahead_max_draft_len(4, 1, 4) == 7 * 0 + 0  # N == 1: no n-grams, no draft
    r = parse_recipe({**BASE, "speculation": {"method": "lookahead", "window_size": 7, "ngram_size": 7,
                                              "verification_set_size": 7}, "runtime": {"backend": "trtllm-engine"}})
    assert isinstance(r.speculation, Lookahead) and r.max_draft_len == 83


def test_relative_paths_resolve_against_recipe_folder(tmp_path):
    sub = tmp_path / "cfg"
    sub.mkdir()
    (sub / "r.yaml").write_text(yaml.safe_dump(with_("target.model", "../models/t")))
    r = load_recipe(sub / "r.yaml")
    assert r.target.model == str((tmp_path / "models" / "t").resolve())


@pytest.mark.parametrize("backend", ["torch", "trtllm-pytorch", "trtllm-engine"])
def test_lm_head_is_checked_against_the_runtime(backend):
    """`trtspec check`: quantization.lm_head names its own field where the runtime cannot run it
    (refused whatever ``force`` says: the quantize stage could not export it), and on the torch
    runtime the kernels line says where the head runs."""
    from trtspec.preflight import CheckReport, check_quantization

    recipe = parse_recipe({
        "name": "lmh", "target": {"model": "t", "quantization": {"format": "int4_awq", "lm_head": "int8_wo",
                                                                  "force": True}},
        "speculation": {"method": "ngram"}, "runtime": {"backend": backend},
    })
    report = CheckReport(recipe="lmh")
    check_quantization(recipe, report)
    failed = [c for c in report.checks if c.status == "fail"]
    if backend == "torch":
        assert not failed
        assert any(c.name == "kernels:target" and "LM head int8_wo on INT8 weights" in c.detail for c in report.checks)
    else:
        assert len(failed) == 1 and failed[0].detail.startswith("target.quantization.lm_head='int8_wo'")
        assert backend in failed[0].detail and "lm_head: none" in failed[0].fix


def test_max_concurrency_is_refused_where_it_cannot_switch_speculation_off():
    ok = parse_recipe(with_("speculation.max_concurrency", 2))
    assert ok.speculation.max_concurrency == 2
    engine_flow = with_("runtime", {"backend": "trtllm-engine"}, with_("speculation.max_concurrency", 2))
    with pytest.raises(ConfigErrors) as e:
        parse_recipe(engine_flow)
    msg = str(e.value)
    assert "speculation.max_concurrency" in msg and "engine flow" in msg and "trtllm-pytorch" in msg
    with pytest.raises(ConfigErrors, match="speculation.max_concurrency"):
        parse_recipe(with_("speculation.max_concurrency", 0))


def test_max_concurrency_reaches_the_llm_api_speculative_config():
    from trtspec.trtllm.llmapi import speculative_config

    base = with_("runtime", {"backend": "trtllm-pytorch"})
    assert "max_concurrency" not in speculative_config(parse_recipe(base), speculative_model="/d")
    cfg = speculative_config(parse_recipe(with_("speculation.max_concurrency", 4, base)), speculative_model="/d")
    assert cfg["max_concurrency"] == 4 and cfg["decoding_type"] == "DraftTarget"
