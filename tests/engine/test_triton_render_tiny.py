"""Rendering repositories for the trained tiny pair (no server): contracts, runtime specs, the package command."""

from __future__ import annotations

import json
import pytest
import yaml
from click.testing import CliRunner
from trtspec.cli import main
from trtspec.config import parse_recipe
from trtspec.speculative.runtime import RuntimeSpec
from trtspec.triton.render import (
    TEMPLATES,
    RenderError,
    inputs_from_recipe,
    package,
    plan_repository,
    render_repository,
)
from tests.unit.test_triton_render import T, parse


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


def _io(cfg, which):
    return {t.name: (t.data_type, list(t.dims), getattr(t, "optional", False)) for t in getattr(cfg, which)}


def test_ensemble_client_contract(tmp_path, tiny_models):
    """The tensor contract a client SDK relies on (docs/serving.md): names, types, dims, optional."""
    package(_tiny_recipe(*tiny_models), tmp_path / "repo")
    for name in ("ensemble", "ensemble_baseline"):
        cfg = parse(tmp_path / "repo" / name / "config.pbtxt")
        assert cfg.platform == "ensemble" and cfg.max_batch_size >= 1
        # the part trtspec's client relies on; NVIDIA's whole contract: tests/unit/test_contract.py
        assert _io(cfg, "input").items() >= {
            # required, checked by preprocessing: optional here because the 2.51 ensemble answers a
            # request missing a required input with an empty success (tests/serving/test_faults.py)
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
    assert spec["version"] == 2
    rt, base_rt = spec["runtime"], base["runtime"]
    assert (rt["draft_weight_only"], rt["compile_draft"], rt["adaptive"]["enabled"]) == ("int8", True, True)
    assert base["method"] == "none" and base["draft"] is None and base["target"] == str(target)
    # the fallback is ordinary decoding: no option that needs a draft survives (each would be refused)
    assert (base_rt["draft_weight_only"], base_rt["compile_draft"], base_rt["adaptive"]["enabled"]) == ("none", False, False)
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
