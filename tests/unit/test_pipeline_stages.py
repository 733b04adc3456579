"""The pipeline's stage objects: names (folders, --from/--until, key order) as before, a description
per runtime family, and typed outputs that read back from a manifest exactly as they were written."""

from __future__ import annotations

import json

import pytest

from trtspec.pipeline import (
    PIPELINE,
    STAGES,
    BuildOrTune,
    Checked,
    EnginesBuilt,
    Packaged,
    Quantized,
    QuantizedModel,
    Reported,
    Skipped,
    Tuned,
    Validated,
)


def test_stage_names_and_order_are_the_cache_keys_and_folders_of_before():
    assert STAGES == ("check", "quantize", "build", "package", "serve", "validate", "report")
    for st in PIPELINE:
        assert set(st.does) == {"torch", "trtllm"} and all(st.does.values()), st.name
    assert "tune" in BuildOrTune.does["torch"] and "TensorRT-LLM" in BuildOrTune.does["trtllm"]


@pytest.mark.parametrize("stage, output", [
    ("check", Checked(12, 1, {"mode": "single"})),
    ("quantize", Quantized({"draft": QuantizedModel("/w/quantize/draft", "int8_wo", "none", {"top1_agreement": 0.99})})),
    ("quantize", Skipped("no model is quantized in this recipe")),
    ("build", Tuned("/w/build/tune.json", 3, 4, 1.21, 1.25, [0.8, 0.6, 0.4], 0.12)),
    ("build", EnginesBuilt({"kind": "trtllm-build"}, 3, 1)),
    ("package", Packaged("/w/package/repository", ["ensemble", "tensorrt_llm"])),
    ("validate", Validated("/w/validate/report.md", "/w/validate/report.json", {"plot": "a.png"},
                           {"decision": "deploy speculative", "deploy_speculative": True, "gates": []},
                           {"1": 1.4}, {"acceptance_rate": 0.6})),
    ("report", Reported("/w/report", "/w/report/report.md")),
])
def test_outputs_read_back_from_their_manifest_form(stage, output):
    st = next(s for s in PIPELINE if s.name == stage)
    stored = json.loads(json.dumps(output.to_dict()))  # as trtspec.json holds it
    assert st.read(stored) == output


def test_an_output_of_another_shape_is_not_reused():
    st = next(s for s in PIPELINE if s.name == "package")
    with pytest.raises(TypeError):
        st.read({"repository": "/r", "models": [], "extra": 1})


def test_build_and_package_serve_the_quantize_stages_exports_else_the_recipes_folders(tmp_path):
    from trtspec.config import parse_recipe
    from trtspec.pipeline import ModelFolders, Pipeline

    recipe = parse_recipe({"name": "folders", "target": {"model": str(tmp_path / "t")},
                           "speculation": {"method": "draft_target", "draft": {"model": str(tmp_path / "d")}}})
    p = Pipeline(recipe, tmp_path / "w")
    assert p.model_folders() == ModelFolders(str(tmp_path / "t"), str(tmp_path / "d"))
    p.results["quantize"] = Quantized({"draft": QuantizedModel("/w/quantize/draft", "int8_wo", "none", None)})
    assert p.model_folders() == ModelFolders(str(tmp_path / "t"), "/w/quantize/draft")
    p.results["quantize"] = Skipped("no model is quantized in this recipe")
    assert p.model_folders().draft == str(tmp_path / "d")
