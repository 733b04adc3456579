"""Repository rendering: strict templates, every shipped recipe, Triton's own config schema, the
client contract of the ensembles, and the TRT-LLM layouts at their seam (they cannot run here)."""

from __future__ import annotations

import json
import pathlib

import pytest
import yaml
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from trtspec.config import load_recipe
from trtspec.manifest import write_manifest
from trtspec.triton.render import (
    TEMPLATES,
    RenderError,
    fill,
    inputs_from_recipe,
    package,
    placeholders,
    read_repository_manifest,
)

REPO = pathlib.Path(__file__).resolve().parents[2]
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
    rounds = {k: v.string_value for k, v in parse(repo / "trtspec_draft_target" / "config.pbtxt").parameters.items()}
    limits = json.loads(rounds.pop("request_limits"))  # every python model checks the recipe's limits
    assert limits["max_seq_len"] == recipe.limits.max_seq_len and limits["max_words"] == recipe.limits.max_words
    assert rounds == {"tensorrt_llm_model_name": "tensorrt_llm", "tensorrt_llm_draft_model_name": "tensorrt_llm_draft",
                      "num_draft_tokens": "10"}
    # NVIDIA's text BLS over the same two engines (its contract: tests/unit/test_contract.py)
    bls = {k: v.string_value for k, v in parse(repo / "tensorrt_llm_bls" / "config.pbtxt").parameters.items()}
    assert json.loads(bls.pop("request_limits")) == limits
    assert bls == {"tensorrt_llm_model_name": "tensorrt_llm", "tensorrt_llm_draft_model_name": "tensorrt_llm_draft",
                   "plain_model": "ensemble_baseline", "max_draft_len": "10", "accumulate_tokens": "false"}
    router = {k: v.string_value for k, v in parse(repo / "router" / "config.pbtxt").parameters.items()}
    assert (router["speculative_model"], router["speculative_model_kind"]) == ("trtspec_draft_target", "trtspec")
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
    assert spec["speculative_config"]["decoding_type"] == "Eagle"  # EAGLE-3, spelled as both bracketing llm_args.py copies take it
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




def test_package_cli_writes_absolute_model_folders(tmp_path, monkeypatch):
    """--target / --draft relative to the caller's folder: the server's stubs run elsewhere."""
    import json

    from click.testing import CliRunner

    from trtspec.cli.build import package as package_cmd

    monkeypatch.chdir(tmp_path)
    (tmp_path / "quantized").mkdir()
    res = CliRunner().invoke(package_cmd, [str(REPO / "build_configs" / "tiny-cpu-draft-target.yaml"), "-o", "repo",
                                           "--target", "quantized", "--draft", "quantized"])
    assert res.exit_code == 0, res.output
    spec = json.loads((tmp_path / "repo" / "tensorrt_llm" / "1" / "runtime_spec.json").read_text())
    assert spec["target"] == spec["draft"] == str(tmp_path / "quantized")
    draft = json.loads((tmp_path / "repo" / "tensorrt_llm_draft" / "1" / "runtime_spec.json").read_text())
    assert (draft["target"], draft["method"], draft["draft"]) == (str(tmp_path / "quantized"), "none", None)
