"""Repository rendering: strict templates, every shipped recipe, Triton's own config schema, the
client contract of the ensembles, and the TRT-LLM layouts at their seam (they cannot run here)."""

from __future__ import annotations

import json
import pathlib

import pytest
import yaml
from click.testing import CliRunner
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from trtspec.cli import main
from trtspec.config import load_recipe, parse_recipe
from trtspec.manifest import write_manifest
from trtspec.speculative.runtime import RuntimeSpec
from trtspec.triton.render import (
    TEMPLATES,
    RenderError,
    fill,
    inputs_from_recipe,
    package,
    placeholders,
    plan_repository,
    read_repository_manifest,
    render_repository,
)

REPO = pathlib.Path(__file__).resolve().parent.parent
RECIPES = sorted((REPO / "build_configs").glob("*.yaml"))
T = model_config_pb2.DataType


def parse(path: pathlib.Path) -> model_config_pb2.ModelConfig:
    return text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())


def render(recipe_path: pathlib.Path, out: pathlib.Path):
    recipe = load_recipe(recipe_path)
    build = out.parent / f"build-{recipe.name}" if recipe.runtime.backend != "torch" else None
    return recipe, package(recipe, out, build_dir=build)


# ------------------------------------------------------------------------------ strict templates


def test_fill_is_strict():
    assert fill('a: "${x}" b: ${n}', {"x": 'q"\\', "n": 3}) == 'a: "q\\"\\\\" b: 3'
    assert fill("on: ${b}", {"b": True}) == "on: true"
    with pytest.raises(RenderError, match=r"no value for placeholder\(s\) \$\{y\}"):
        fill("${x} ${y}", {"x": 1})
    with pytest.raises(RenderError, match=r"value\(s\) z match no placeholder"):
        fill("${x}", {"x": 1, "z": 2})
    with pytest.raises(RenderError, match="None"):
        fill("${x}", {"x": None})


def test_only_config_pbtxt_files_are_templates():
    for f in TEMPLATES.rglob("*"):
        if f.is_file() and f.name != "config.pbtxt" and f.suffix in (".py", ".yaml", ".json"):
            assert not placeholders(f.read_text()), f


def test_unknown_template_placeholder_is_an_error(tmp_path, tiny_models):
    templates = tmp_path / "templates"
    import shutil

    shutil.copytree(TEMPLATES, templates)
    cfg = templates / "preprocessing" / "config.pbtxt"
    cfg.write_text(cfg.read_text() + '\nparameters { key: "x" value: { string_value: "${not_a_value}" } }\n')
    inp = inputs_from_recipe(_tiny_recipe(*tiny_models))
    with pytest.raises(RenderError, match=r"preprocessing/config.pbtxt: no value for placeholder\(s\) \$\{not_a_value\}"):
        render_repository(inp, tmp_path / "repo", templates=templates)
    assert not (tmp_path / "repo").exists()  # nothing half-rendered is left behind
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".repo")]


def _tiny_recipe(target, draft, **extra):
    return parse_recipe({
        "name": "tiny-render",
        "target": {"model": str(target)},
        "speculation": {"method": "draft_target", "draft": {"model": str(draft)}, "max_draft_len": 4},
        "runtime": {"backend": "torch", "device": "cpu"},
        "limits": {"max_batch_size": 4, "max_input_len": 128, "max_seq_len": 256},
        **extra,
    })


# ------------------------------------------------------------------------------ every shipped recipe


@pytest.mark.parametrize("recipe_path", RECIPES, ids=lambda p: p.stem)
def test_every_shipped_recipe_renders_configs_triton_parses(recipe_path, tmp_path):
    recipe, res = render(recipe_path, tmp_path / "repo")
    repo = tmp_path / "repo"
    configs = sorted(repo.glob("*/config.pbtxt"))
    assert {c.parent.name for c in configs} == set(res.models)
    parsed = {}
    for c in configs:
        text = c.read_text()
        assert "${" not in text, c
        cfg = parse(c)
        assert cfg.name == c.parent.name
        assert (c.parent / "1").is_dir()
        # round trip: text → message → text → message
        assert text_format.Parse(text_format.MessageToString(cfg), model_config_pb2.ModelConfig()) == cfg
        parsed[cfg.name] = cfg
    # both entry points exist, and every ensemble step names a model of this repository
    assert {"ensemble", "ensemble_baseline", "preprocessing", "postprocessing", "router"} <= set(parsed)
    for name in ("ensemble", "ensemble_baseline"):
        for step in parsed[name].ensemble_scheduling.step:
            assert step.model_name in parsed, (name, step.model_name)
    router = {k: v.string_value for k, v in parsed["router"].parameters.items()}
    assert router["baseline_model"] in parsed
    if recipe.speculation.method != "none":
        assert router["speculative_model"] in parsed
    # python models carry their model.py; the manifest says what is what
    for cfg in parsed.values():
        if cfg.backend == "python":
            assert (repo / cfg.name / "1" / "model.py").is_file(), cfg.name
    m = read_repository_manifest(repo)
    assert m["entry_points"] == {"speculative": "ensemble", "baseline": "ensemble_baseline"}
    assert m["runtime"] == recipe.runtime.backend and m["recipe"]["name"] == recipe.name


def _io(cfg, which):
    return {t.name: (t.data_type, list(t.dims), getattr(t, "optional", False)) for t in getattr(cfg, which)}


def test_ensemble_client_contract(tmp_path, tiny_models):
    """The tensor contract a client SDK relies on (docs/serving.md): names, types, dims, optional."""
    package(_tiny_recipe(*tiny_models), tmp_path / "repo")
    for name in ("ensemble", "ensemble_baseline"):
        cfg = parse(tmp_path / "repo" / name / "config.pbtxt")
        assert cfg.platform == "ensemble" and cfg.max_batch_size >= 1
        # the part trtspec's client relies on; NVIDIA's whole contract: tests/test_contract.py
        assert _io(cfg, "input").items() >= {
            # required, checked by preprocessing: optional here because the 2.51 ensemble answers a
            # request missing a required input with an empty success (tests/test_faults.py)
            "text_input": (T.TYPE_STRING, [1], True),
            "max_tokens": (T.TYPE_INT32, [1], True),
            "stream": (T.TYPE_BOOL, [1], True),
            "temperature": (T.TYPE_FP32, [1], True),
            "top_k": (T.TYPE_INT32, [1], True),
            "top_p": (T.TYPE_FP32, [1], True),
            "seed": (T.TYPE_UINT64, [1], True),
            "end_id": (T.TYPE_INT32, [1], True),
            "pad_id": (T.TYPE_INT32, [1], True),
            "return_perf_metrics": (T.TYPE_BOOL, [1], True),
            "exclude_input_in_output": (T.TYPE_BOOL, [1], True),
        }.items()
        assert {k: v[:2] for k, v in _io(cfg, "output").items()}.items() >= {
            "text_output": (T.TYPE_STRING, [-1]),
            "output_ids": (T.TYPE_INT32, [-1]),
            "acceptance_rate": (T.TYPE_FP32, [1]),
            "total_accepted_draft_tokens": (T.TYPE_INT32, [1]),
            "total_draft_tokens": (T.TYPE_INT32, [1]),
            "served_by": (T.TYPE_STRING, [1]),
            "perf_json": (T.TYPE_STRING, [1]),
        }.items()
    engine = parse(tmp_path / "repo" / "tensorrt_llm" / "config.pbtxt")
    assert engine.model_transaction_policy.decoupled
    names = set(_io(engine, "input"))
    assert {"input_ids", "input_lengths", "request_output_len", "draft_input_ids", "end_id", "pad_id", "streaming",
            "temperature", "runtime_top_k", "runtime_top_p", "seed", "return_perf_metrics"} <= names
    assert {"output_ids", "sequence_length", "acceptance_rate", "total_accepted_draft_tokens",
            "total_draft_tokens"} <= set(_io(engine, "output"))


def test_torch_repository_carries_runtime_specs_and_manifest(tmp_path, tiny_models):
    target, draft = tiny_models
    recipe = _tiny_recipe(target, draft, runtime={"backend": "torch", "device": "cpu", "draft_weight_only": "int8",
                                                  "compile_draft": True, "adaptive": {"enabled": True}})
    res = package(recipe, tmp_path / "repo")
    spec = json.loads((tmp_path / "repo" / "tensorrt_llm" / "1" / "runtime_spec.json").read_text())
    base = json.loads((tmp_path / "repo" / "tensorrt_llm_baseline" / "1" / "runtime_spec.json").read_text())
    assert spec["method"] == "draft_target" and spec["draft"] == str(draft) and spec["target"] == str(target)
    assert (spec["draft_weight_only"], spec["compile_draft"], spec["adaptive"]) == ("int8", True, True)
    assert base["method"] == "none" and base["draft"] is None and base["target"] == str(target)
    # the fallback is ordinary decoding: no option that needs a draft survives (each would be refused)
    assert (base["draft_weight_only"], base["compile_draft"], base["adaptive"]) == ("none", False, False)
    RuntimeSpec.from_json(json.dumps(base))
    m = res.manifest
    assert m["kind"] == "triton-repository"
    assert m["speculative_model"] == "tensorrt_llm" and m["baseline_model"] == "tensorrt_llm_baseline"
    assert m["runtime_spec"]["method"] == "draft_target"
    pre = {k: v.string_value for k, v in parse(tmp_path / "repo" / "preprocessing" / "config.pbtxt").parameters.items()}
    assert pre["tokenizer_dir"] == str(target) and pre["end_id"] == "0"  # the tiny target's EOS


def test_existing_output_needs_force(tmp_path, tiny_models):
    recipe = _tiny_recipe(*tiny_models)
    package(recipe, tmp_path / "repo")
    with pytest.raises(RenderError, match="already exists"):
        package(recipe, tmp_path / "repo")
    (tmp_path / "repo" / "stale").write_text("x")
    package(recipe, tmp_path / "repo", overwrite=True)
    assert not (tmp_path / "repo" / "stale").exists()


def test_method_none_serves_one_model_on_both_paths(tmp_path, tiny_target):
    recipe = parse_recipe({"name": "plain", "target": {"model": str(tiny_target)}, "speculation": {"method": "none"}})
    plans = {p.name: p for p in plan_repository(inputs_from_recipe(recipe))}
    assert "tensorrt_llm_baseline" not in plans
    assert plans["router"].values["speculative_model"] == "" and plans["router"].values["baseline_model"] == "tensorrt_llm"


def test_router_parameters_follow_the_recipe(tiny_models):
    recipe = _tiny_recipe(*tiny_models, serving={"speculative_fraction": 0.25},
                          runtime={"backend": "torch", "adaptive": {"min_acceptance_rate": 0.4, "window": 128}})
    plans = {p.name: p for p in plan_repository(inputs_from_recipe(recipe))}
    r = plans["router"].values
    assert (r["speculative_fraction"], r["min_acceptance_rate"], r["acceptance_window"]) == (0.25, 0.4, 128)
    assert plans["router_baseline"].values["speculative_fraction"] == 0.0
    auto = {p.name: p for p in plan_repository(inputs_from_recipe(_tiny_recipe(*tiny_models)))}
    assert auto["router"].values["min_acceptance_rate"] == "auto"


# ------------------------------------------------------------------------------ TRT-LLM layouts


def _trtllm(tmp_path, stem):
    recipe, res = render(REPO / "build_configs" / f"{stem}.yaml", tmp_path / "repo")
    return recipe, res, tmp_path / "repo"


def test_engine_flow_draft_target_layout(tmp_path):
    recipe, res, repo = _trtllm(tmp_path, "llama3.3-70b-draft-target-fp8-trtllm")
    target, draft = parse(repo / "tensorrt_llm" / "config.pbtxt"), parse(repo / "tensorrt_llm_draft" / "config.pbtxt")
    for cfg, engine in ((target, "target-engine"), (draft, "draft-engine")):
        p = {k: v.string_value for k, v in cfg.parameters.items()}
        assert cfg.backend == "tensorrtllm" and cfg.model_transaction_policy.decoupled
        assert p["gpt_model_path"].endswith(engine)
        assert p["decoding_mode"] == "top_k_top_p" and p["gpt_model_type"] == "inflight_fused_batching"
    assert {k: v.string_value for k, v in target.parameters.items()}["gpu_device_ids"] == "0,1,2,3"
    bls = {k: v.string_value for k, v in parse(repo / "tensorrt_llm_bls" / "config.pbtxt").parameters.items()}
    assert bls == {"tensorrt_llm_model_name": "tensorrt_llm", "tensorrt_llm_draft_model_name": "tensorrt_llm_draft",
                   "num_draft_tokens": "10"}
    router = {k: v.string_value for k, v in parse(repo / "router" / "config.pbtxt").parameters.items()}
    assert (router["speculative_model"], router["speculative_model_kind"]) == ("tensorrt_llm_bls", "trtspec")
    assert (router["baseline_model"], router["baseline_model_kind"]) == ("tensorrt_llm", "tensorrtllm")


def test_engine_flow_eagle_layout(tmp_path):
    recipe, res, repo = _trtllm(tmp_path, "vicuna-7b-eagle-trtllm")
    p = {k: v.string_value for k, v in parse(repo / "tensorrt_llm" / "config.pbtxt").parameters.items()}
    assert p["decoding_mode"] == "eagle" and p["gpt_model_path"].endswith("target-engine")
    if recipe.speculation.eagle_choices:
        assert p["eagle_choices"].startswith("{")
    b = {k: v.string_value for k, v in parse(repo / "tensorrt_llm_baseline" / "config.pbtxt").parameters.items()}
    assert b["decoding_mode"] == "top_k_top_p" and b["gpt_model_path"].endswith("baseline-engine")


def test_llmapi_layout(tmp_path):
    recipe, res, repo = _trtllm(tmp_path, "llama3.1-8b-eagle3-fp8-trtllm")
    spec = yaml.safe_load((repo / "tensorrt_llm" / "1" / "model.yaml").read_text())
    base = yaml.safe_load((repo / "tensorrt_llm_baseline" / "1" / "model.yaml").read_text())
    assert spec["speculative_config"]["decoding_type"] == "Eagle3"
    assert spec["speculative_config"]["max_draft_len"] == recipe.speculation.max_draft_len
    assert "speculative_config" not in base and spec["model"] == base["model"]
    assert spec["triton_config"] == {"max_batch_size": recipe.limits.max_batch_size, "decoupled": True}
    cfg = parse(repo / "tensorrt_llm" / "config.pbtxt")
    assert cfg.backend == "python" and cfg.model_transaction_policy.decoupled


def test_packaging_reads_the_build_hand_off(tmp_path):
    """A finished `trtspec build` (its trtspec.json, kind trtllm-build) wins over the recipe."""
    from trtspec.trtllm.build import plan_build
    from trtspec.trtllm.handoff import KIND

    recipe = load_recipe(REPO / "build_configs" / "llama3.3-70b-draft-target-fp8-trtllm.yaml")
    build = tmp_path / "build"
    handoff = plan_build(recipe, build).handoff.to_dict()
    handoff["engines"] = {"target": "/engines/t", "draft": "/engines/d"}
    build.mkdir()
    write_manifest(build, KIND, **handoff)
    package(recipe, tmp_path / "repo", build_dir=build)
    p = {k: v.string_value for k, v in parse(tmp_path / "repo" / "tensorrt_llm_draft" / "config.pbtxt").parameters.items()}
    assert p["gpt_model_path"] == "/engines/d"
    assert read_repository_manifest(tmp_path / "repo")["trtllm_build"]["engines"]["target"] == "/engines/t"


def test_trtllm_runtime_needs_a_build_dir():
    recipe = load_recipe(REPO / "build_configs" / "llama3.1-8b-eagle3-fp8-trtllm.yaml")
    with pytest.raises(RenderError, match="--build-dir"):
        inputs_from_recipe(recipe)


# ------------------------------------------------------------------------------ CLI


def test_cli_package(tmp_path, tiny_models):
    target, draft = tiny_models
    cfg = tmp_path / "r.yaml"
    cfg.write_text(yaml.safe_dump({
        "name": "cli-pkg", "target": {"model": str(target)},
        "speculation": {"method": "draft_target", "draft": {"model": str(draft)}},
        "runtime": {"backend": "torch", "device": "cpu"},
    }))
    runner = CliRunner()
    res = runner.invoke(main, ["package", str(cfg), "-o", str(tmp_path / "repo"), "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["entry_points"]["speculative"] == "ensemble"
    again = runner.invoke(main, ["package", str(cfg), "-o", str(tmp_path / "repo")])
    assert again.exit_code != 0 and "already exists" in again.output and "--force" in again.output
    forced = runner.invoke(main, ["package", str(cfg), "-o", str(tmp_path / "repo"), "--force"])
    assert forced.exit_code == 0 and "trtspec serve" in forced.output
