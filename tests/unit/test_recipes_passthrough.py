"""Passthroughs (issue 22): runtime.trtllm.llm_api_options, runtime.trtllm.build_args,
serving.tritonserver_args. Owned keys refused naming the field that sets them, known names
checked, unknown names passed with a warning; golden `trtspec build --dry-run` of the 70B recipe
and a golden tritonserver launch.

Regenerate the goldens after an intended change with TRTSPEC_UPDATE_GOLDEN=1 and review the diff.
"""

from __future__ import annotations

import copy
import json
import pathlib

import pytest
import yaml
from click.testing import CliRunner

from trtspec.config import load_recipe, parse_recipe
from trtspec.errors import ConfigErrors
from trtspec.trtllm import accepted_names as A
from trtspec.trtllm.plan import make_plan
from tests.goldens import check_golden

REPO = pathlib.Path(__file__).resolve().parents[2]
GOLDEN = REPO / "tests" / "golden" / "recipes"


def _golden(name: str, text: str) -> None:
    check_golden(GOLDEN / name, text)


BASE = {
    "name": "t",
    "target": {"model": "/m/target"},
    "speculation": {"method": "ngram", "max_draft_len": 4},
    "runtime": {"backend": "trtllm-pytorch", "device": "cuda", "trtllm": {"model_family": "llama"}},
    "limits": {"max_batch_size": 8, "max_input_len": 512, "max_seq_len": 1024},
}


def _recipe(trtllm: dict | None = None, serving: dict | None = None, backend: str = "trtllm-pytorch"):
    d = copy.deepcopy(BASE)
    d["runtime"]["backend"] = backend
    d["runtime"]["trtllm"].update(trtllm or {})
    if serving:
        d["serving"] = serving
    return parse_recipe(d)


@pytest.mark.parametrize("trtllm,serving,field,words", [
    ({"llm_api_options": {"speculative_config": {"decoding_type": "NGram"}}}, None,
     "runtime.trtllm.llm_api_options", "speculative_config is set by trtspec from speculation"),
    ({"llm_api_options": {"max_batch_size": 64}}, None, "runtime.trtllm.llm_api_options", "limits.max_batch_size"),
    ({"llm_api_options": {"kv_cache_config": {"free_gpu_memory_fraction": 0.5}}}, None,
     "runtime.trtllm.llm_api_options", "runtime.trtllm.kv_cache_free_gpu_mem_fraction"),
    ({"build_args": ["--max_draft_len", "8"]}, None, "runtime.trtllm.build_args", "speculation.max_draft_len"),
    ({"build_args": ["--gemm_plugin=fp8"]}, None, "runtime.trtllm.build_args", "runtime.trtllm.gemm_plugin"),
    ({"build_args": ["--multiple_profiles", "yes"]}, None, "runtime.trtllm.build_args", "not one of enable, disable"),
    ({"build_args": ["--strip_plan=1"]}, None, "runtime.trtllm.build_args", "is a switch"),
    ({"build_args": ["multiple_profiles"]}, None, "runtime.trtllm.build_args", "is not a flag"),
    (None, {"tritonserver_args": ["--grpc-port=9001"]}, "serving.tritonserver_args", "serving.grpc_port"),
    (None, {"tritonserver_args": ["--model-repository", "/x"]}, "serving.tritonserver_args", "trtspec serve REPO"),
])
def test_owned_or_bad_passthroughs_are_refused_naming_field_value_and_fix(trtllm, serving, field, words):
    with pytest.raises(ConfigErrors) as e:
        _recipe(trtllm, serving)
    (err,) = e.value.errors
    assert err.field == field and words in str(err)
    if "set by trtspec" in str(err):
        assert "set that instead, or drop" in str(err)


def test_llm_api_options_merge_into_both_yamls_and_unknown_keys_pass_with_a_warning():
    r = _recipe({"llm_api_options": {"enable_attention_dp": True, "kv_cache_config": {"dtype": "fp8"},
                                     "brand_new_knob": 3}})
    p = make_plan(r, "/out")
    spec = yaml.safe_load(p.files["/out/llmapi/extra_llm_api_options.yaml"])
    base = yaml.safe_load(p.files["/out/llmapi/baseline_llm_api_options.yaml"])
    for doc, frac in ((spec, 0.85), (base, 0.1)):
        assert doc["enable_attention_dp"] is True and doc["brand_new_knob"] == 3
        # merged key by key: trtspec's own kv_cache_config keys stay
        assert doc["kv_cache_config"] == {"free_gpu_memory_fraction": frac, "enable_block_reuse": True, "dtype": "fp8"}
    assert spec["speculative_config"]["decoding_type"] == "NGram"
    assert [n for n in p.notes if "brand_new_knob" in n] and not [n for n in p.notes if "enable_attention_dp" in n]
    assert A.check_llm_api({k: v for k, v in spec.items() if k != "brand_new_knob"}) == []


def test_build_args_reach_every_engine_and_unknown_flags_pass_with_a_warning():
    r = _recipe({"build_args": ["--multiple_profiles=enable", "--strip_plan", "--future_flag", "3"]},
                backend="trtllm-engine")
    p = make_plan(r, "/out")
    for stage in p.stages:
        argv = list(stage.commands[0])
        if argv[0] == "trtllm-build":
            assert argv[-5:] == ["--multiple_profiles", "enable", "--strip_plan", "--future_flag", "3"]
    assert any("--future_flag is not a trtllm-build flag" in n for n in p.notes)
    assert A.check_argv([a for a in p.stages[-1].commands[0] if a not in ("--future_flag", "3")]) == []


def test_a_passthrough_the_runtime_does_not_use_is_warned():
    from trtspec.recipe_checks import passthrough_lines

    r = _recipe({"build_args": ["--multiple_profiles", "enable"]})  # PyTorch flow builds no engines
    (line,) = passthrough_lines(r)
    assert line.status == "warn" and "trtllm-engine only" in line.detail
    r = _recipe({"llm_api_options": {"cuda_graph_config": {"enable_padding": True}}})
    (line,) = passthrough_lines(r)
    assert line.status == "ok" and "cuda_graph_config" in line.detail


def test_build_dry_run_of_the_70b_recipe_shows_calibration_and_passthroughs_golden():
    from trtspec.cli import main

    path = REPO / "build_configs" / "llama3.3-70b-draft-target-fp8-trtllm.yaml"
    res = CliRunner().invoke(main, ["build", str(path), "--dry-run", "-o", "/build/llama3.3-70b"],
                             catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert "--calib_dataset cnn_dailymail --calib_size 512 --calib_max_seq_length 512" in res.output
    assert res.output.count("--multiple_profiles enable") == 2  # target and draft engines
    _golden("llama3.3-70b-build-dry-run.txt", res.output)


def test_tritonserver_args_reach_the_launch_golden(tmp_path, monkeypatch):
    from trtspec.triton.launch.mpi import planned_launch
    from trtspec.manifest import MANIFEST
    from trtspec.triton.render import REPOSITORY_KIND
    from trtspec.triton.launch.server import server_for_repository

    shim = tmp_path / "libtrtspec_argv.so"  # the argv shim as if built (gcc or not, the same golden)
    shim.write_text("")
    monkeypatch.setenv("TRTSPEC_ARGV_SHIM", str(shim))
    recipe = load_recipe(REPO / "build_configs" / "tiny-cpu-ngram.yaml")
    d = json.loads(json.dumps(recipe.model_dump(mode="json")))
    d["serving"]["tritonserver_args"] = ["--log-format=ISO8601", "--model-load-thread-count=2"]
    parse_recipe(d)  # still a valid recipe
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / MANIFEST).write_text(json.dumps({"kind": REPOSITORY_KIND, "recipe": d}))
    plan = planned_launch(server_for_repository(repo, watchdog=None))
    argv = list(plan.argv)
    assert argv[-2:] == ["--log-format=ISO8601", "--model-load-thread-count=2"]
    _golden("tritonserver-launch.json", json.dumps([a.replace(str(repo), "<repo>") for a in argv], indent=2) + "\n")


# ------------------------------------------------ flags that widen exposure (issue 30)

EXPOSURE_CASES = {
    # family: (arguments, words of the error)
    "address": (["--grpc-address=0.0.0.0"], "binds an endpoint"),
    "address, separate value": (["--http-address", "0.0.0.0"], "binds an endpoint"),
    "address, getopt abbreviation": (["--grpc-addr=0.0.0.0"], "tritonserver reads it as --grpc-address"),
    "metrics address": (["--metrics-address=0.0.0.0"], "binds an endpoint"),
    "port": (["--grpc-port=9001"], "opens or moves an endpoint"),
    "sagemaker port": (["--sagemaker-port=8080"], "opens or moves an endpoint"),
    "shared port": (["--reuse-grpc-port=true"], "shares its port"),
    "allow sagemaker": (["--allow-sagemaker=true"], "turns an endpoint or a metrics family on"),
    "allow vertex ai, no value": (["--allow-vertex-ai"], "turns an endpoint or a metrics family on"),
    "allow http back on": (["--allow-http=true"], "turns an endpoint or a metrics family on"),
    "allow metrics, abbreviated": (["--allow-metr=1"], "tritonserver reads it as --allow-metrics"),
    "model control": (["--model-control-mode=poll"], "who may load and unload models"),
    "restricted api": (["--http-restricted-api=inference:k=v"], "restricted-API rule"),
    "restricted protocol": (["--grpc-restricted-protocol=model-repository:trtspec-admin-key=known"],
                            "restricted-API rule"),
    "header forwarding http": (["--http-header-forward-pattern=.*"], "forwards request headers"),
    "header forwarding grpc": (["--grpc-header-forward-pattern", "trtspec.*"], "forwards request headers"),
    "TLS off": (["--grpc-use-ssl=false"], "gRPC's TLS"),
    "another backend folder": (["--backend-directory=/tmp/x"], "loads native code"),
    "another repository agent folder": (["--repoagent-directory=/tmp/x"], "loads native code"),
    "another model repository": (["--model-store=/tmp/models"], "serves models from another folder"),
}


@pytest.mark.parametrize("name", sorted(EXPOSURE_CASES))
def test_flags_that_widen_exposure_are_refused_naming_flag_why_and_fix(name):
    args, words = EXPOSURE_CASES[name]
    with pytest.raises(ConfigErrors) as e:
        _recipe(serving={"tritonserver_args": args})
    (err,) = e.value.errors
    assert err.field == "serving.tritonserver_args"
    text = str(err)
    assert args[0].split("=")[0] in text and words in text and "widens the server's exposure" in text
    assert "serving.unsafe_passthrough: true" in text


@pytest.mark.parametrize("name", sorted(EXPOSURE_CASES))
def test_unsafe_passthrough_lets_them_through_with_a_warning(name):
    from trtspec.recipe_checks import passthrough_lines

    args, _ = EXPOSURE_CASES[name]
    r = _recipe(serving={"tritonserver_args": args, "unsafe_passthrough": True})
    assert r.serving.tritonserver_args == args
    (line,) = passthrough_lines(r)
    assert line.status == "warn" and "widens the server's exposure" in line.detail


@pytest.mark.parametrize("args", [["--allow-gpu-metrics=false"], ["--allow-cpu-metrics", "false"],
                                  ["--allow-sagemaker=0"], ["--log-info=false"], ["--model-load-thread-count=2"]])
def test_flags_that_narrow_or_do_not_touch_exposure_pass(args):
    assert _recipe(serving={"tritonserver_args": args}).serving.tritonserver_args == args


def test_owned_flags_that_do_not_widen_exposure_stay_refused_even_when_unsafe():
    with pytest.raises(ConfigErrors) as e:
        _recipe(serving={"tritonserver_args": ["--exit-timeout-secs=1"], "unsafe_passthrough": True})
    assert "set by trtspec" in str(e.value.errors[0])
    with pytest.raises(ConfigErrors) as e:  # turning an endpoint off is trtspec's (readiness needs HTTP)
        _recipe(serving={"tritonserver_args": ["--allow-http=false"]})
    assert "set by trtspec" in str(e.value.errors[0])


def _repository(tmp_path, serving: dict) -> pathlib.Path:
    from trtspec.manifest import MANIFEST
    from trtspec.triton.render import REPOSITORY_KIND

    recipe = load_recipe(REPO / "build_configs" / "tiny-cpu-ngram.yaml")
    d = json.loads(json.dumps(recipe.model_dump(mode="json")))
    d["serving"].update(serving)
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / MANIFEST).write_text(json.dumps({"kind": REPOSITORY_KIND, "recipe": d}))
    return repo


def test_a_hand_edited_trtspec_json_is_checked_again_at_serve_time(tmp_path):
    from trtspec.errors import ConfigError
    from trtspec.triton.launch.server import server_for_repository

    repo = _repository(tmp_path, {"tritonserver_args": ["--grpc-address=0.0.0.0", "--allow-sagemaker=true"]})
    with pytest.raises(ConfigError) as e:
        server_for_repository(repo, watchdog=None)
    assert "--grpc-address widens the server's exposure" in str(e.value)
    assert "serving.unsafe_passthrough: true" in str(e.value)
    res = CliRunner().invoke(__import__("trtspec.cli", fromlist=["main"]).main, ["serve", str(repo), "--dry-run"])
    assert res.exit_code != 0 and "--grpc-address widens the server's exposure" in res.output


def test_an_unsafe_repository_serves_its_flags_with_a_warning(tmp_path, capfd):
    from trtspec.triton.launch.server import server_for_repository

    repo = _repository(tmp_path, {"tritonserver_args": ["--allow-sagemaker=true"], "unsafe_passthrough": True})
    server = server_for_repository(repo, watchdog=None)
    assert server.extra_args == ("--allow-sagemaker=true",)
    assert "--allow-sagemaker widens the server's exposure" in capfd.readouterr().err
