"""NVIDIA's tensorrtllm-backend contract: every rendered repository (torch runtime, TRT-LLM engine
flow, TRT-LLM LLM API) declares NVIDIA's inputs and outputs with NVIDIA's names, data types, dims,
optionality and reshape (golden: trtspec/data/nvidia_inflight_batcher_llm.json, extracted from
NVIDIA's templates at c2e65b8 by scripts/nvidia_contract.py); the documented differences are the
only ones; every tensor has a status; unsupported inputs are refused naming them."""

from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from trtspec.config import load_recipe, parse_recipe, recipe_to_dict
from trtspec.triton.contract import (
    DEFAULT_ONLY,
    EXTRA_INPUTS,
    EXTRA_OUTPUTS,
    NVIDIA_COMMIT,
    OPTIONAL_HERE,
    REJECTED,
    input_status,
    markdown_table,
    nvidia_contract,
    output_status,
)
from trtspec.triton.render import package
from trtspec.triton.backend.requests import RequestInputError, parse_generation, words_list, words_tensor

REPO = pathlib.Path(__file__).resolve().parents[2]
RECIPES = {
    "torch": "tiny-cpu-draft-target.yaml",
    "trtllm-engine": "llama3.3-70b-draft-target-fp8-trtllm.yaml",
    "trtllm-pytorch": "llama3.1-8b-eagle3-fp8-trtllm.yaml",
}
# rendered model → the NVIDIA model whose contract it carries
CARRIES = {"ensemble": "ensemble", "ensemble_baseline": "ensemble", "preprocessing": "preprocessing",
           "postprocessing": "postprocessing", "tensorrt_llm": "tensorrt_llm",
           "tensorrt_llm_baseline": "tensorrt_llm", "tensorrt_llm_draft": "tensorrt_llm",
           "tensorrt_llm_bls": "tensorrt_llm_bls"}
# draft-target recipes carry NVIDIA's text BLS and its draft model too
DRAFT_TARGET = {"torch", "trtllm-engine"}
DT = model_config_pb2.DataType


def _render(runtime: str, tmp_path: pathlib.Path, **serving):
    recipe = load_recipe(REPO / "build_configs" / RECIPES[runtime])
    if serving:
        d = recipe_to_dict(recipe)
        d["serving"] = {**d.get("serving", {}), **serving}
        recipe = parse_recipe(d, base_dir=REPO / "build_configs")
    build = tmp_path / "build" if runtime != "torch" else None
    return package(recipe, tmp_path / "repo", build_dir=build).path


def _configs(repo: pathlib.Path) -> dict[str, model_config_pb2.ModelConfig]:
    return {p.parent.name: text_format.Parse(p.read_text(), model_config_pb2.ModelConfig())
            for p in repo.glob("*/config.pbtxt")}


def _tensor(t, inputs: bool) -> dict:
    d = {"name": t.name, "data_type": DT.Name(t.data_type), "dims": list(t.dims)}
    if inputs:
        d["optional"] = bool(t.optional)
        if t.HasField("reshape"):
            d["reshape"] = list(t.reshape.shape)
    return d


@pytest.mark.parametrize("runtime", sorted(RECIPES))
def test_rendered_models_declare_nvidias_tensors_exactly(runtime, tmp_path):
    configs = _configs(_render(runtime, tmp_path))
    checked = set()
    for name, cfg in configs.items():
        nv = CARRIES.get(name)
        if nv is None:
            continue
        checked.add(nv)
        want = nvidia_contract()[nv]
        got_in = {t.name: _tensor(t, True) for t in cfg.input}
        for t in want["inputs"]:
            assert t["name"] in got_in, f"{name}: NVIDIA input {t['name']} not declared"
            g = dict(got_in.pop(t["name"]))
            if (nv, t["name"]) in OPTIONAL_HERE:
                assert g["optional"] and not t["optional"], (name, t["name"])
                g["optional"] = t["optional"]
            assert g == t, name
        assert set(got_in) <= {n for (m, n) in EXTRA_INPUTS if m == nv}, f"{name}: undocumented inputs {set(got_in)}"
        got_out = {t.name: _tensor(t, False) for t in cfg.output}
        for t in want["outputs"]:
            assert got_out.pop(t["name"], None) == t, f"{name}: NVIDIA output {t['name']}"
        assert set(got_out) <= set(EXTRA_OUTPUTS), f"{name}: undocumented outputs {set(got_out)}"
    assert checked == {"ensemble", "preprocessing", "postprocessing", "tensorrt_llm",
                       *(["tensorrt_llm_bls"] if runtime in DRAFT_TARGET else [])}
    assert ("tensorrt_llm_draft" in configs) is (runtime in DRAFT_TARGET)


@pytest.mark.parametrize("runtime", sorted(RECIPES))
@pytest.mark.parametrize("decoupled", [True, False])
def test_serving_decoupled_renders_nvidias_decoupled_mode(runtime, decoupled, tmp_path):
    configs = _configs(_render(runtime, tmp_path, decoupled=decoupled))
    generation = {n for n in configs if n.startswith(("tensorrt_llm", "router", "trtspec_draft_target"))}
    assert generation and {n: configs[n].model_transaction_policy.decoupled for n in generation} == {
        n: decoupled for n in generation}


def test_the_golden_contract_is_nvidias_at_c2e65b8():
    c = nvidia_contract()
    assert NVIDIA_COMMIT.startswith("c2e65b8")
    assert {m: (len(v["inputs"]), len(v["outputs"])) for m, v in c.items()} == {
        "ensemble": (34, 17), "preprocessing": (13, 20), "postprocessing": (2, 1), "tensorrt_llm": (60, 19),
        "tensorrt_llm_bls": (40, 17)}


def test_every_nvidia_tensor_has_a_status_and_the_readme_shows_the_table():
    for io in nvidia_contract().values():
        for t in io["inputs"]:
            assert input_status(t["name"]).kind in ("implemented", "no effect", "default only", "rejected")
        for t in io["outputs"]:
            assert output_status(t["name"]).kind in ("implemented", "not produced", "always empty")
    assert markdown_table() in (REPO / "README.md").read_text()


def _get(**tensors):
    base = {"input_ids": np.array([[5, 6, 7]], np.int32), "request_output_len": np.array([[4]], np.int32)}
    base.update(tensors)
    return lambda name: base.get(name)


@pytest.mark.parametrize("name", sorted(REJECTED))
def test_unsupported_inputs_are_refused_naming_them(name):
    with pytest.raises(RequestInputError, match=f"input '{name}' is not supported"):
        parse_generation(_get(**{name: np.zeros((1, 1), np.float32)}))


@pytest.mark.parametrize("name", sorted(DEFAULT_ONLY))
def test_default_only_inputs_take_nvidias_client_defaults_silently(name):
    default, _ = DEFAULT_ONLY[name]
    dtype = bool if isinstance(default, bool) else np.int32
    parse_generation(_get(**{name: np.array([[default]], dtype)}))
    other = (not default) if isinstance(default, bool) else 4
    with pytest.raises(RequestInputError, match=f"input '{name}'=.*is not supported"):
        parse_generation(_get(**{name: np.array([[other]], dtype)}))


def test_nvidias_request_fields_are_read():
    words = words_tensor([(3, 4), (9,)])
    assert words.tolist() == [[[3, 4, 9], [2, 3, -1]]]
    assert words_list(lambda n: words, "x") == ((3, 4), (9,))
    assert words_list(lambda n: words_tensor([]), "x") == () and words_tensor([]).shape == (1, 2, 0)
    one = lambda v, t: np.array([[v]], t)  # noqa: E731
    req = parse_generation(_get(
        stop_words_list=words, bad_words_list=words_tensor([(8,)]), repetition_penalty=one(1.2, np.float32),
        presence_penalty=one(0.5, np.float32), frequency_penalty=one(0.25, np.float32), min_tokens=one(3, np.int32),
        return_log_probs=one(True, bool), num_return_sequences=one(2, np.int32), random_seed=one(7, np.uint64),
        beam_width=one(1, np.int32), len_penalty=one(0.5, np.float32), temperature=one(0.9, np.float32),
        runtime_top_k=one(4, np.int32)))
    sp = req.sequence_sampling(1)
    assert (sp.stop_words, sp.bad_words, sp.min_tokens, sp.logprobs, sp.seed) == (((3, 4), (9,)), ((8,),), 3, True, 8)
    assert (req.num_return_sequences, req.sampling.seed, req.sampling.top_k) == (2, 7, 4)
    assert sp.repetition_penalty == pytest.approx(1.2) and sp.frequency_penalty == pytest.approx(0.25)
    with pytest.raises(RequestInputError, match="seed=1 and random_seed=2 disagree"):
        parse_generation(_get(seed=one(1, np.uint64), random_seed=one(2, np.uint64)))
    # min_length, min_tokens' name before c2e65b8 (genai-perf 0.0.16 sends it): alone, or agreeing
    assert parse_generation(_get(min_length=one(5, np.int32))).sampling.min_tokens == 5
    assert parse_generation(_get(min_length=one(5, np.int32), min_tokens=one(5, np.int32))).sampling.min_tokens == 5
    with pytest.raises(RequestInputError, match="min_tokens=4 and min_length=5 disagree(?s:.*)older name"):
        parse_generation(_get(min_tokens=one(4, np.int32), min_length=one(5, np.int32)))


@pytest.mark.parametrize("tensors, greedy", [
    ({"temperature": 1.0}, True),  # NVIDIA's end_to_end client default: TRT-LLM decodes greedily
    ({"temperature": 1.0, "runtime_top_k": 1, "runtime_top_p": 0.0}, True),  # inflight client default
    ({"temperature": 0.8, "runtime_top_k": 40}, False),
    ({"temperature": 0.8, "runtime_top_p": 0.9}, False),
    ({"temperature": 0.0, "runtime_top_k": 40}, True),
    ({"runtime_top_k": 40}, False),  # absent temperature = 1
])
def test_trtllms_greedy_rule(tensors, greedy):
    dtypes = {"temperature": np.float32, "runtime_top_k": np.int32, "runtime_top_p": np.float32}
    req = parse_generation(_get(**{k: np.array([[v]], dtypes[k]) for k, v in tensors.items()}))
    assert req.sampling.greedy is greedy


# --------------------------------------------------------------------------------------------
# goldens: the TRT-LLM runtimes' repositories, model by model (NVIDIA's model names and tensors)

GOLDEN = REPO / "tests" / "golden" / "repository"
TRTLLM_RECIPES = sorted(p for p in (REPO / "build_configs").glob("*.yaml")
                        if load_recipe(p).runtime.backend.startswith("trtllm"))


def _summary(cfg: model_config_pb2.ModelConfig) -> dict:
    def tensor(t, inputs: bool) -> str:
        s = f"{t.name} {DT.Name(t.data_type)} {list(t.dims)}"
        if inputs and t.HasField("reshape"):
            s += f" reshape {list(t.reshape.shape)}"
        return s + (" optional" if inputs and t.optional else "")

    out = {"backend": cfg.backend or cfg.platform, "max_batch_size": cfg.max_batch_size,
           "decoupled": cfg.model_transaction_policy.decoupled,
           "inputs": [tensor(t, True) for t in cfg.input], "outputs": [tensor(t, False) for t in cfg.output],
           "parameters": {k: v.string_value for k, v in sorted(cfg.parameters.items())}}
    if cfg.HasField("ensemble_scheduling"):
        out["steps"] = [{"model": s.model_name, "inputs": dict(sorted(s.input_map.items())),
                         "outputs": dict(sorted(s.output_map.items()))} for s in cfg.ensemble_scheduling.step]
    return out


@pytest.mark.parametrize("path", TRTLLM_RECIPES, ids=lambda p: p.stem)
def test_trtllm_repository_matches_golden(path, tmp_path):
    """Every model of a TRT-LLM recipe's repository: NVIDIA's model names (ensemble, preprocessing,
    postprocessing, tensorrt_llm, and for draft-target tensorrt_llm_draft + tensorrt_llm_bls), its
    tensors, parameters and ensemble wiring. Regenerate with TRTSPEC_UPDATE_GOLDEN=1 and review."""
    from tests.goldens import check_golden

    recipe = load_recipe(path)
    # a fixed, absolute build folder (planned, not built) keeps the golden machine-independent
    repo = package(recipe, tmp_path / "repo", build_dir=pathlib.Path("/build") / recipe.name).path
    configs = _configs(repo)
    nvidia = {"ensemble", "preprocessing", "postprocessing", "tensorrt_llm"}
    if recipe.speculation.method == "draft_target":
        nvidia |= {"tensorrt_llm_draft", "tensorrt_llm_bls"}
    assert nvidia <= set(configs)
    if "tensorrt_llm_bls" in configs:  # NVIDIA's text BLS over NVIDIA's engine names
        p = {k: v.string_value for k, v in configs["tensorrt_llm_bls"].parameters.items()}
        assert (p["tensorrt_llm_model_name"], p["tensorrt_llm_draft_model_name"]) == ("tensorrt_llm", "tensorrt_llm_draft")
        assert {t.name for t in configs["tensorrt_llm_bls"].input} >= {
            t["name"] for t in nvidia_contract()["tensorrt_llm_bls"]["inputs"]}
    text = json.dumps({name: _summary(cfg) for name, cfg in sorted(configs.items())}, indent=1) + "\n"
    check_golden(GOLDEN / f"{path.stem}.json", text.replace(str(REPO), "<checkout>"))
