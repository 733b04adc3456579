"""The LLM-API spellings trtspec writes for TensorRT-LLM 1.2.1 (issue 32): each one a name that the
1.1/1.2.0rc-era and the pre-1.3 tensorrt_llm/llmapi/llm_args.py both accept, except draft-target's
decoding_type, which has none and is reported by `trtspec check`. Fails if a name reverts."""

from __future__ import annotations

import pathlib

import pytest
import yaml

from trtspec.config import load_recipe, parse_recipe
from trtspec.recipe_checks import trtllm_name_lines
from trtspec.trtllm import accepted_names as A
from trtspec.trtllm import llmapi

ROOT = pathlib.Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "build_configs"
GOLDEN = ROOT / "tests" / "golden" / "trtllm"


def _recipe(name: str, **changes):
    data = yaml.safe_load((CONFIGS / name).read_text())
    for dotted, value in changes.items():
        node = data
        *path, last = dotted.split(".")
        for key in path:
            node = node.setdefault(key, {})
        node[last] = value
    return parse_recipe(data, base_dir=CONFIGS)


def test_the_spellings_are_the_ones_both_copies_accept():
    assert A.SPECULATIVE_MODEL_KEY == "speculative_model_dir"
    assert A.DECODING_TYPE_FOR_METHOD == {"eagle3": "Eagle", "draft_target": "DraftTarget", "ngram": "NGram",
                                          "mtp": "MTP"}
    assert A.LLM_API_NAME_INDEX["speculative_config.speculative_model_dir"].confirmed
    assert A.LLM_API_NAME_INDEX["speculative_config.decoding_type=Eagle"].confirmed
    assert not A.LLM_API_NAME_INDEX["speculative_config.decoding_type=DraftTarget"].confirmed
    # the refused spellings are not listed as written names
    for name in ("speculative_config.speculative_model", "speculative_config.decoding_type=Eagle3",
                 "speculative_config.decoding_type=Draft_Target"):
        assert name not in A.LLM_API_NAME_INDEX


def test_every_name_has_both_copies_or_a_note():
    for n in A.LLM_API_NAMES:
        assert (n.older and n.newer) or n.release or n.note, n.name
    # 1.2.1's own quoted text: speculative_model with the speculative_model_dir alias
    assert "speculative_model_dir" in A.LLM_API_NAME_INDEX["speculative_config.speculative_model_dir"].release
    assert A.LLM_ARGS_1_2_1.index_id == "59958270572" and "1.2.1" in A.LLM_ARGS_1_2_1.marks
    assert A.LLM_ARGS_OLDER.path == A.LLM_ARGS_NEWER.path == "tensorrt_llm/llmapi/llm_args.py"
    assert A.LLM_ARGS_OLDEST.commit == "fcd3f31682808ae56118ae43c1d7864a3a945e6f"


def test_eagle3_yaml_loads_on_both_copies():
    r = load_recipe(CONFIGS / "llama3.1-8b-eagle3-fp8-trtllm.yaml")
    opts = llmapi.llm_api_options(r, model="/t", speculative_model="/h")
    sc = opts["speculative_config"]
    assert sc["decoding_type"] == "Eagle" and sc["speculative_model_dir"] == "/h"
    assert "speculative_model" not in sc and sc["eagle3_one_model"] is False
    assert A.unconfirmed_llm_api_names(llmapi.triton_model_yaml(opts, decoupled=True)) == []
    assert A.check_llm_api(llmapi.triton_model_yaml(opts, decoupled=True), triton_model_yaml=True) == []


@pytest.mark.parametrize("golden", ["extra_llm_api_options.yaml", "triton_model.yaml"])
def test_goldens_carry_the_confirmed_spellings(golden):
    text = (GOLDEN / "llama3.1-8b-eagle3-fp8-trtllm" / golden).read_text()
    sc = yaml.safe_load(text)["speculative_config"]
    assert sc["decoding_type"] == "Eagle" and "speculative_model_dir" in sc and "speculative_model" not in sc
    sources = (GOLDEN / "SOURCES.md").read_text()
    for copy in (A.LLM_ARGS_OLDER, A.LLM_ARGS_NEWER, A.LLM_ARGS_1_2_1):
        assert copy.index_id in sources


def test_draft_target_writes_the_from_dict_key_and_check_says_it_is_unconfirmed():
    r = _recipe("llama3.3-70b-draft-target-fp8-trtllm.yaml", **{"runtime.backend": "trtllm-pytorch"})
    sc = llmapi.speculative_config(r, speculative_model="/d")
    assert sc == {"decoding_type": "DraftTarget", "max_draft_len": r.speculation.max_draft_len,
                  "speculative_model_dir": "/d"}
    (line,) = [ln for ln in trtllm_name_lines(r) if ln.name == "trtllm-names"]
    assert line.status == "warn"
    assert "speculative_config.decoding_type=DraftTarget" in line.detail and "Draft_Target" in line.detail


def test_check_reports_confirmed_names_for_the_eagle3_recipe():
    (line,) = trtllm_name_lines(load_recipe(CONFIGS / "llama3.1-8b-eagle3-fp8-trtllm.yaml"))
    assert line.name == "trtllm-names" and line.status == "ok"


def test_unconfirmed_names_are_named():
    probs = A.unconfirmed_llm_api_names({"speculative_config": {"decoding_type": "Eagle3", "speculative_model": "/h"}})
    assert any(p.startswith("speculative_config.decoding_type=Eagle3: ") and "Invalid decoding type" in p for p in probs)
    assert any(p.startswith("speculative_config.speculative_model: ") for p in probs)
    assert A.check_llm_api({"speculative_config": {"decoding_type": "Eagle", "speculative_model": "/h"}}) != []


def test_fast_logits_warning_follows_the_launch_mode():
    name = "llama3.1-70b-tp8-draft-target-fp8-trtllm.yaml"
    (ok,) = trtllm_name_lines(load_recipe(CONFIGS / name))
    assert ok.name == "fast-logits" and ok.status == "ok" and "TRTLLM_ORCHESTRATOR_SPAWN_PROCESSES=0" in ok.detail
    for mode in ("orchestrator", "leader"):
        (warn,) = trtllm_name_lines(_recipe(name, **{"runtime.trtllm.launch_mode": mode}))
        assert warn.status == "warn" and "speculative_decoding_fast_logits" in warn.detail
        assert "orchestrator_prespawn" in warn.fix
    # without draft logits there is nothing to keep
    assert trtllm_name_lines(_recipe(name, **{"speculation.use_draft_logits": False})) == []
