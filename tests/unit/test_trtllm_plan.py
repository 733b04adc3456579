"""TRT-LLM build plans: golden argv lists and YAML for every shipped TRT-LLM recipe, and every flag
and key checked against the names TRT-LLM 1.2.x accepts (trtspec.trtllm.accepted_names).

Regenerate the goldens after an intended change with ``TRTSPEC_UPDATE_GOLDEN=1 pytest tests/unit/test_trtllm_plan.py``
and review the diff.
"""

from __future__ import annotations

import copy
import json
import pathlib

import pytest
import yaml

from trtspec.config import load_recipe, parse_recipe, recipe_to_dict
from trtspec.errors import ConfigError, ModelError
from trtspec.manifest import hash_json
from trtspec.trtllm import accepted_names as A
from trtspec.trtllm.handoff import TrtllmBuild, triton_choices
from trtspec.trtllm.llmapi import triton_model_yaml
from trtspec.trtllm.plan import make_plan
from tests.goldens import check_golden

REPO = pathlib.Path(__file__).resolve().parents[2]
GOLDEN = REPO / "tests" / "golden" / "trtllm"

TRTLLM_RECIPES = sorted(
    p for p in (REPO / "build_configs").glob("*.yaml")
    if yaml.safe_load(p.read_text()).get("runtime", {}).get("backend", "torch").startswith("trtllm")
)


def _plan(path: pathlib.Path):
    recipe = load_recipe(path)
    # a fixed, absolute output folder keeps the goldens machine-independent
    return make_plan(recipe, pathlib.Path("/build") / recipe.name)


def _golden(name: str, text: str) -> None:
    check_golden(GOLDEN / name, text)


def test_the_shipped_trtllm_recipes_are_covered():
    names = {p.name for p in TRTLLM_RECIPES}
    assert {"llama3.1-8b-eagle3-fp8-trtllm.yaml", "llama3.3-70b-draft-target-fp8-trtllm.yaml",
            "vicuna-7b-eagle-trtllm.yaml", "vicuna-7b-medusa-fp8-trtllm.yaml"} <= names


@pytest.mark.parametrize("path", TRTLLM_RECIPES, ids=lambda p: p.stem)
def test_plan_matches_golden(path):
    plan = _plan(path)
    commands = [{"stage": s.id, "output": s.output, "argv": list(argv)} for s in plan.stages for argv in s.commands]
    _golden(f"{path.stem}/commands.json", json.dumps(commands, indent=2) + "\n")
    h = plan.handoff.to_dict()
    # the recipe hash covers every schema default, so it moves whenever the schema grows a field;
    # it is checked against the recipe below instead of being frozen here
    assert h.pop("recipe_sha256") == hash_json(recipe_to_dict(load_recipe(path)))
    _golden(f"{path.stem}/handoff.json", json.dumps(h, indent=2, sort_keys=True) + "\n")
    for file_path, text in plan.files.items():
        _golden(f"{path.stem}/{pathlib.Path(file_path).name}", text)
    if plan.handoff.llm_api is not None:
        doc = triton_model_yaml(plan.handoff.llm_api, decoupled=True)
        _golden(f"{path.stem}/triton_model.yaml", yaml.safe_dump(doc, sort_keys=False))


@pytest.mark.parametrize("path", TRTLLM_RECIPES, ids=lambda p: p.stem)
def test_every_flag_and_key_is_accepted_by_trtllm(path):
    plan = _plan(path)
    assert plan.stages or plan.files
    for stage in plan.stages:
        for argv in stage.commands:
            tool = A.tool_for(argv)
            if argv[:3] == ("python3", "-m", "trtspec.trtllm.calibration"):
                continue  # ours; run for real in test_calibration_module
            if argv[:2] == ("trtspec", "quantize"):
                flags = {a for a in argv[2:] if a.startswith("-")}
                assert flags <= A.TRTSPEC_QUANTIZE_FLAGS, flags - A.TRTSPEC_QUANTIZE_FLAGS
                continue
            assert tool is not None, f"stage {stage.id} runs an unknown tool: {argv[:2]}"
            assert A.check_argv(argv) == [], (stage.id, argv)
    h = plan.handoff
    for opts in (h.llm_api, h.llm_api_baseline):
        if opts is not None:
            assert A.check_llm_api(opts) == []
            assert A.check_llm_api(triton_model_yaml(opts, decoupled=True), triton_model_yaml=True) == []
    for text in plan.files.values():
        assert A.check_llm_api(yaml.safe_load(text)) == []
    if h.serve_command:
        assert A.check_argv(h.serve_command) == []


# --------------------------------------------------------------------------------------------
# the checker itself must be able to fail


def test_check_argv_rejects_unknown_flags_bad_choices_and_missing_values():
    good = ["trtllm-build", "--checkpoint_dir", "c", "--speculative_decoding_mode", "eagle", "--gather_generation_logits"]
    assert A.check_argv(good) == []
    assert "unknown flag --max_draft_length" in A.check_argv(["trtllm-build", "--max_draft_length", "4"])[0]
    assert "not one of" in A.check_argv(["trtllm-build", "--speculative_decoding_mode", "eagle3"])[0]
    assert "needs a value" in A.check_argv(["trtllm-build", "--checkpoint_dir", "--output_dir", "o"])[0]
    # Medusa's converter takes --max_medusa_token_len, not --max_draft_len, and no "auto" dtype
    medusa = ["python3", "/x/examples/medusa/convert_checkpoint.py", "--max_draft_len", "63", "--dtype", "auto"]
    assert len(A.check_argv(medusa)) == 2
    assert A.tool_for(["python3", "/x/examples/not/a_script.py"]) is None


def test_check_llm_api_rejects_unknown_keys_and_engine_only_methods():
    assert A.check_llm_api({"model": "m", "speculative_config": {"decoding_type": "Eagle3", "max_draft_len": 3}}) == []
    assert "unknown key 'max_draft_len'" in A.check_llm_api({"max_draft_len": 3})[0]
    assert "kv_cache_config.free_gpu_mem_fraction" in A.check_llm_api({"kv_cache_config": {"free_gpu_mem_fraction": .9}})[0]
    assert "PyTorch backend" in A.check_llm_api({"speculative_config": {"decoding_type": "Medusa"}})[0]
    assert "unknown speculative_config.decoding_type" in A.check_llm_api({"speculative_config": {"decoding_type": "Eagle4"}})[0]
    assert "triton_config" in A.check_llm_api({"triton_config": {}})[0]  # only in Triton's model.yaml


def test_trtspec_quantize_flags_match_the_cli_when_it_exists():
    import click

    from trtspec.cli import main

    cmd = main.get_command(click.Context(main), "quantize")
    opts = {o for p in cmd.params for o in getattr(p, "opts", [])}
    assert A.TRTSPEC_QUANTIZE_FLAGS <= opts, A.TRTSPEC_QUANTIZE_FLAGS - opts


# --------------------------------------------------------------------------------------------
# method by method: the flags that make each flow what it is

BASE = {
    "name": "t",
    "target": {"model": "/m/target"},
    "speculation": {"method": "none"},
    "runtime": {"backend": "trtllm-engine", "device": "cuda", "trtllm": {"model_family": "llama"}},
    "limits": {"max_batch_size": 4, "max_input_len": 512, "max_seq_len": 1024},
}


def recipe(**over):
    d = copy.deepcopy(BASE)
    for path, value in over.items():
        node = d
        keys = path.split("__")
        for k in keys[:-1]:
            node = node.setdefault(k, {})
        node[keys[-1]] = value
    return parse_recipe(d)


def plan_of(r):
    return make_plan(r, "/out")


def argv_of(plan, stage_id):
    (stage,) = [s for s in plan.stages if s.id == stage_id]
    (argv,) = stage.commands
    return list(argv)


def flag(argv, name):
    return argv[argv.index(name) + 1]


def test_lookahead_builds_with_the_formula_draft_len_and_a_plain_baseline():
    p = plan_of(recipe(speculation={"method": "lookahead", "window_size": 7, "ngram_size": 7,
                                    "verification_set_size": 7}))
    target = argv_of(p, "target-engine")
    assert flag(target, "--speculative_decoding_mode") == "lookahead_decoding"
    assert flag(target, "--max_draft_len") == "83"  # (N-2) + (W-1+G)(N-1) for (7,7,7)
    base = argv_of(p, "baseline-engine")
    assert "--speculative_decoding_mode" not in base
    assert flag(base, "--checkpoint_dir") == "/out/target-ckpt"  # same checkpoint, built plainly
    assert p.handoff.lookahead == (7, 7, 7) and p.handoff.decoding_mode == "lookahead"
    assert p.handoff.triton_parameters()["lookahead_window_size"] == 7


def test_ngram_on_the_engine_flow_is_draft_tokens_external():
    p = plan_of(recipe(speculation={"method": "ngram", "max_draft_len": 6, "max_matching_ngram_size": 2}))
    target = argv_of(p, "target-engine")
    assert flag(target, "--speculative_decoding_mode") == "draft_tokens_external"
    assert flag(target, "--use_paged_context_fmha") == "enable"
    assert p.handoff.ngram_max_matching_size == 2
    assert [s.id for s in p.stages] == ["target-ckpt", "target-engine"]


def test_draft_logits_gather_generation_logits_on_both_engines_and_tp_reaches_the_converter():
    p = plan_of(recipe(speculation={"method": "draft_target", "draft": {"model": "/m/draft"}, "max_draft_len": 5,
                                    "use_draft_logits": True},
                       limits__tensor_parallel_size=2, limits__draft_tensor_parallel_size=1))
    assert "--gather_generation_logits" in argv_of(p, "target-engine")
    assert "--gather_generation_logits" in argv_of(p, "draft-engine")
    assert flag(argv_of(p, "target-ckpt"), "--tp_size") == "2"
    assert flag(argv_of(p, "draft-ckpt"), "--tp_size") == "1"
    assert argv_of(p, "target-ckpt")[1].endswith("models/core/llama/convert_checkpoint.py")
    assert p.handoff.gpu_device_ids == [0, 1] and p.handoff.draft_gpu_device_ids == [0]
    assert [s.expect for s in p.stages if s.id == "target-engine"][0] == ("config.json", "rank0.engine", "rank1.engine")


def test_qwen_family_uses_the_qwen_converter_and_medusa_model_type():
    p = plan_of(recipe(runtime__trtllm={"model_family": "qwen", "checkpoint_dtype": "bfloat16"},
                       speculation={"method": "medusa", "head": {"model": "/m/heads"}}))
    target = argv_of(p, "target-ckpt")
    assert target[1].endswith("examples/medusa/convert_checkpoint.py")
    assert flag(target, "--model_type") == "qwen2" and flag(target, "--max_medusa_token_len") == "63"
    assert argv_of(p, "baseline-ckpt")[1].endswith("models/core/qwen/convert_checkpoint.py")


def test_eagle_fp8_goes_through_one_modelopt_checkpoint():
    p = plan_of(recipe(target={"model": "/m/target", "quantization": {"format": "fp8", "kv_cache": "fp8"}},
                       speculation={"method": "eagle", "head": {"model": "/m/eagle"},
                                    "eagle_choices": [[0], [0, 0], [1]]}))
    assert [s.id for s in p.stages] == ["calib", "eagle-quant", "target-ckpt", "target-engine",
                                        "baseline-ckpt", "baseline-engine"]
    quant = argv_of(p, "eagle-quant")
    assert quant[1].endswith("examples/eagle/quantize.py") and flag(quant, "--qformat") == "fp8"
    convert = argv_of(p, "target-ckpt")
    assert flag(convert, "--model_dir") == "/out/eagle-quant" and "--eagle_model_dir" not in convert
    assert p.handoff.triton_parameters()["eagle_choices"] == "{0}, {0, 0}, {1}"
    assert p.handoff.triton_parameters("baseline")["decoding_mode"] == "top_k_top_p"


def test_eagle_modelopt_checkpoint_converts_the_head_folder_alone():
    p = plan_of(recipe(speculation={"method": "eagle", "head": {"model": "/m/modelopt-eagle"},
                                    "modelopt_checkpoint": True}))
    convert = argv_of(p, "target-ckpt")
    assert flag(convert, "--model_dir") == "/m/modelopt-eagle" and "--eagle_model_dir" not in convert


@pytest.mark.parametrize("over,field", [
    ({"runtime__trtllm": {"model_family": "auto"}}, "runtime.trtllm.model_family"),
    ({"runtime__trtllm": {"model_family": "llama", "gpu_device_ids": [0, 1]}}, "runtime.trtllm.gpu_device_ids"),
    ({"speculation": {"method": "medusa", "head": {"model": "/h"}},
      "runtime__trtllm": {"model_family": "llama", "checkpoint_dtype": "auto"}}, "runtime.trtllm.checkpoint_dtype"),
    ({"speculation": {"method": "eagle", "head": {"model": "/h", "quantization": {"format": "fp8"}}}},
     "speculation.head.quantization.format"),
    ({"speculation": {"method": "draft_target", "draft": {"model": "/d"}},
      "runtime__trtllm": {"model_family": "llama", "enable_kv_cache_reuse": False}},
     "runtime.trtllm.enable_kv_cache_reuse"),
    ({"runtime__backend": "torch", "runtime__device": "cpu"}, "runtime.backend"),
])
def test_plan_refuses_what_cannot_build_naming_the_field(over, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        plan_of(recipe(**over))


def test_pytorch_flow_without_quantization_has_no_stages_only_yaml():
    p = plan_of(recipe(runtime__backend="trtllm-pytorch",
                       speculation={"method": "ngram", "max_draft_len": 4, "max_matching_ngram_size": 3}))
    assert p.stages == ()
    spec = yaml.safe_load(p.files["/out/llmapi/extra_llm_api_options.yaml"])
    assert spec["speculative_config"] == {"decoding_type": "NGram", "max_draft_len": 4, "max_matching_ngram_size": 3}
    assert "model" not in spec  # trtllm-serve takes MODEL as an argument
    assert p.handoff.llm_api["model"] == "/m/target"


def test_mtp_uses_num_nextn_predict_layers_which_sets_max_draft_len_in_1_2():
    p = plan_of(recipe(runtime__backend="trtllm-pytorch", speculation={"method": "mtp", "max_draft_len": 3}))
    sc = p.handoff.llm_api["speculative_config"]
    assert sc["decoding_type"] == "MTP" and sc["num_nextn_predict_layers"] == 3 and "max_draft_len" not in sc
    assert "disable_overlap_scheduler" not in p.handoff.llm_api  # one-model


def test_eagle3_dynamic_tree_fields():
    p = plan_of(recipe(runtime__backend="trtllm-pytorch",
                       speculation={"method": "eagle3", "head": {"model": "/m/e3"}, "max_draft_len": 6,
                                    "use_dynamic_tree": True, "dynamic_tree_max_top_k": 10,
                                    "max_total_draft_tokens": 60, "eagle3_one_model": True}))
    sc = p.handoff.llm_api["speculative_config"]
    assert (sc["use_dynamic_tree"], sc["dynamic_tree_max_topK"], sc["max_total_draft_tokens"]) == (True, 10, 60)
    assert A.check_llm_api(p.handoff.llm_api) == []


# --------------------------------------------------------------------------------------------
# hand-off


def test_handoff_round_trips_and_refuses_unknown_fields():
    plan = _plan(REPO / "build_configs" / "llama3.3-70b-draft-target-fp8-trtllm.yaml")
    h = plan.handoff
    d = json.loads(json.dumps({"kind": "trtllm-build", "created": "x", **h.to_dict()}))
    assert TrtllmBuild.from_dict(d) == h
    with pytest.raises(ModelError, match="unknown field"):
        TrtllmBuild.from_dict({**d, "engine_dir": "/x"})
    with pytest.raises(ModelError, match="lacks field"):
        TrtllmBuild.from_dict({k: v for k, v in d.items() if k != "tokenizer_dir"})
    assert h.triton_parameters("draft")["gpu_device_ids"] == "4"
    assert h.triton_parameters("target")["gpu_device_ids"] == "0,1,2,3"
    assert h.triton_parameters("draft")["kv_cache_free_gpu_mem_fraction"] == 0.3
    with pytest.raises(ModelError, match="no 'baseline' engine"):
        h.triton_parameters("baseline")


def test_triton_choices_format():
    assert triton_choices([[0], [0, 1], [2]]) == "{0}, {0, 1}, {2}"


def test_calibration_module_writes_rows_of_the_requested_count(tmp_path):
    from trtspec.trtllm.calibration import main

    src = tmp_path / "calib.jsonl"
    src.write_text("\n".join(json.dumps({"text": f"sample {i} " * 50}) for i in range(3)) + "\n")
    assert main(["--source", str(src), "--size", "5", "--seq-len", "16", "--output", str(tmp_path / "out")]) == 0
    rows = [json.loads(x)["text"] for x in (tmp_path / "out" / "train.jsonl").read_text().splitlines()]
    assert len(rows) == 5 and all(len(r) <= 16 * 6 for r in rows)
    assert main(["--source", str(tmp_path / "missing.jsonl"), "--size", "5", "--seq-len", "16",
                 "--output", str(tmp_path / "o2")]) == 2
