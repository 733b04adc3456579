"""RuntimeSpec: the recipe's runtime and limits sections as the torch engine reads them, and the
JSON a repository carries (version 2; version 1, flat, from older repositories still reads)."""

from __future__ import annotations

import json

import pytest

from trtspec.config import parse_recipe
from trtspec.errors import ConfigErrors, TrtspecError
from trtspec.speculative.spec import SPEC_VERSION, RuntimeSpec, TorchLimits, TorchRuntime


def _recipe(**runtime):
    return parse_recipe({
        "name": "spec-test", "target": {"model": "/m/target"},
        "speculation": {"method": "draft_target", "draft": {"model": "/m/draft"}, "max_draft_len": 5},
        "runtime": {"backend": "torch", "dtype": "bfloat16", "device": "cpu", "torch_threads": 3,
                    "draft_weight_only": "int8", "adaptive": {"enabled": True, "window": 32,
                                                              "min_acceptance_rate": 0.4}, **runtime},
        "limits": {"max_batch_size": 6, "max_input_len": 100, "max_seq_len": 300},
    })


def test_from_recipe_carries_the_recipes_own_sections():
    r = _recipe()
    spec = RuntimeSpec.from_recipe(r, target="/q/target")
    assert (spec.target, spec.draft, spec.method, spec.max_draft_len) == ("/q/target", "/m/draft", "draft_target", 5)
    assert spec.runtime.model_dump() == r.runtime.model_dump(include=set(TorchRuntime.model_fields))
    assert spec.limits == TorchLimits(max_batch_size=6, max_seq_len=300)
    # the subset keeps the recipe's bounds: a value the recipe refuses, the spec refuses, naming it
    with pytest.raises(ConfigErrors, match="torch_threads"):
        RuntimeSpec(target="/t", runtime={"torch_threads": 0})


def test_json_round_trips_and_the_baseline_drops_every_draft_option():
    spec = RuntimeSpec.from_recipe(_recipe())
    d = json.loads(spec.to_json())
    assert d["version"] == SPEC_VERSION and d["runtime"]["adaptive"]["window"] == 32
    assert RuntimeSpec.from_json(spec.to_json()) == spec
    base = spec.baseline()
    assert (base.method, base.draft, base.runtime.draft_weight_only, base.runtime.adaptive.enabled,
            base.runtime.adaptive.min_acceptance_rate) == ("none", None, "none", False, None)
    assert base.runtime.dtype == "bfloat16" and base.limits == spec.limits


def test_a_version_1_spec_from_an_older_repository_reads_the_same():
    spec = RuntimeSpec.from_recipe(_recipe())
    flat = {"target": "/m/target", "method": "draft_target", "draft": "/m/draft", "max_draft_len": 5,
            "max_matching_ngram_size": 3, "min_matching_ngram_size": 1, "dtype": "bfloat16", "device": "cpu",
            "max_batch_size": 6, "max_seq_len": 300, "adaptive": True, "adaptive_window": 32,
            "min_acceptance_rate": 0.4, "torch_threads": 3, "draft_weight_only": "int8", "compile_draft": False,
            "quantized_kernels": "native", "extra": {}}
    assert RuntimeSpec.from_json(json.dumps(flat)) == spec
    with pytest.raises(TrtspecError, match="version 3 is not one this trtspec reads"):
        RuntimeSpec.from_json(json.dumps({**spec.to_dict(), "version": 3}))


def test_an_engine_spec_built_by_hand_keeps_adaptive_drafting_off():
    assert RuntimeSpec(target="/t").runtime.adaptive.enabled is False
    assert _recipe().runtime.adaptive.enabled is True  # a recipe's default is on


@pytest.mark.parametrize("field,value", [("max_concurrency", 1), ("draft_vocab_size", 32768)])
def test_a_draft_option_travels_from_the_recipe_and_the_baseline_drops_it(field, value):
    r = parse_recipe({
        "name": "opt", "target": {"model": "/m/target"},
        "speculation": {"method": "draft_target", "draft": {"model": "/m/draft"}, "max_draft_len": 2, field: value},
    })
    spec = RuntimeSpec.from_recipe(r)
    assert getattr(spec, field) == value
    assert getattr(RuntimeSpec.from_json(spec.to_json()), field) == value
    assert getattr(spec.baseline(), field) is None
    assert getattr(RuntimeSpec.from_recipe(_recipe()), field) is None  # default: always speculate, whole vocabulary
