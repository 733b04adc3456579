"""`trtspec serve --dry-run` and `trtspec deploy k8s` as a user runs them (click's CliRunner)."""

from __future__ import annotations

import json
import pathlib

import yaml
from click.testing import CliRunner

from trtspec.cli import main
from trtspec.config import load_recipe, recipe_to_dict
from trtspec.triton.render import package

REPO = pathlib.Path(__file__).resolve().parents[2]
TP8 = REPO / "build_configs" / "llama3.1-70b-tp8-draft-target-fp8-trtllm.yaml"


def _run(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def test_serve_dry_run_prints_the_mpi_plan_and_starts_nothing(tmp_path):
    package(load_recipe(TP8), tmp_path / "repo", build_dir="/workspace/build/l70")
    res = _run("serve", tmp_path / "repo", "--dry-run", "--grpc-port", "9001", "--http-port", "9000",
               "--metrics-port", "9002")
    assert res.exit_code == 0, res.output
    assert "launch: orchestrator_prespawn, MPI world size 10, GPUs [0, 1, 2, 3, 4, 5, 6, 7]" in res.output
    assert "MPI ranks [2, 3, 4, 5, 6, 7, 8, 9]" in res.output
    assert res.output.count("shm-region-prefix-name=prefix") == 10 and "--grpc-port=9001" in res.output
    res = _run("serve", tmp_path / "repo", "--dry-run", "--json")
    plan = json.loads(res.stdout)
    assert plan["argv"][:2] == ["mpirun", "--allow-run-as-root"] and plan["world_size"] == 10
    assert "free port at start" in res.stderr


def test_serve_dry_run_refuses_a_repository_whose_placements_were_edited(tmp_path):
    package(load_recipe(TP8), tmp_path / "repo", build_dir="/b")
    cfg = tmp_path / "repo" / "tensorrt_llm_draft" / "config.pbtxt"
    cfg.write_text(cfg.read_text().replace('key: "participant_ids" value: { string_value: "1" }',
                                           'key: "participant_ids" value: { string_value: "9" }'))
    res = _run("serve", tmp_path / "repo", "--dry-run")
    assert res.exit_code == 1
    assert "tensorrt_llm_draft/config.pbtxt: participant_ids is '9'" in res.stderr and "fix:" in res.stderr


def test_deploy_k8s_writes_the_folder_and_says_how_to_apply_shift_and_roll_back(tmp_path):
    d = recipe_to_dict(load_recipe(TP8))
    d["target"]["model"] = str(tmp_path / "models" / "Llama-3.1-70B-Instruct")
    d["speculation"]["draft"]["model"] = str(tmp_path / "models" / "Llama-3.2-1B-Instruct")
    recipe_file = tmp_path / "recipe.yaml"
    recipe_file.write_text(yaml.safe_dump(d))
    res = _run("deploy", "k8s", recipe_file, "-o", tmp_path / "deploy", "--build-dir", tmp_path / "build",
               "--mount-path", tmp_path, "--namespace", "llm", "--replicas", "2", "--max-replicas", "6",
               "--speculative-weight", "5")
    assert res.exit_code == 0, res.output
    out = tmp_path / "deploy"
    assert "8 GPU(s) each, launch orchestrator_prespawn (MPI world 10)" in res.output
    assert f"rollback: {out / 'rollout.sh'} 0" in res.output
    assert f"apply:    kubectl apply -f {out / 'k8s'}" in res.output
    assert f"alerts:   kubectl apply -f {out / 'monitoring'}" in res.output
    assert (out / "monitoring" / "prometheus-operator.yaml").is_file()
    hpa = [o for o in yaml.safe_load_all((out / "k8s" / "speculative.yaml").read_text())
           if o["kind"] == "HorizontalPodAutoscaler"][0]
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"], hpa["metadata"]["namespace"]) == (2, 6, "llm")
    assert json.loads((out / "trtspec.json").read_text())["speculative_weight"] == 5


def test_deploy_k8s_errors_name_the_option_and_the_fix(tmp_path):
    recipe = REPO / "build_configs" / "tiny-cpu-draft-target.yaml"
    res = _run("deploy", "k8s", recipe, "-o", tmp_path / "d", "--mount-path", tmp_path, "--storage", "lots")
    assert res.exit_code == 2 and "--storage: is not a Kubernetes quantity (got 'lots')" in res.stderr
    res = _run("deploy", "k8s", recipe, "-o", tmp_path / "d", "--mount-path", "/workspace")
    assert res.exit_code == 1 and "not under the volume's mount path /workspace" in res.stderr
    res = _run("deploy", "k8s", recipe, "-o", tmp_path / "d", "--speculative-weight", "150")
    assert res.exit_code == 2 and "--speculative-weight" in res.output + res.stderr
    assert not (tmp_path / "d").exists()
