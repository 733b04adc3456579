"""The built wheel, installed as users install it: non-editable, into fresh venvs, run from a folder
that is not the checkout (so templates and recipes must come from the wheel's package data).

- `[client]` only: torch, ModelOpt and tritonserver are absent; `trtspec bench --help`, `check`,
  `build --dry-run`, `recipes copy` and `package` (tiny recipe) work; a command that needs a missing
  extra names it.
- `[all]` (torch 2.13.0 first, as the Makefile does): `trtspec serve` of that repository, and
  `trtspec bench` from the `[client]` venv against it: one served measurement end to end through two
  installs that share nothing with the checkout.

Needs the package index (pip resolves each extra's dependencies) and takes about 2 minutes: the
venvs are installed without pip's byte-compile pass (measure_extras.make_venv), which is not what
is under test and took half of the ``[all]`` install (105 s against 56 s on the 2-core Xeon).
"""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import subprocess

import pytest

from tests.conftest import REPO
from tests.serve_process import serve_process

_spec = importlib.util.spec_from_file_location("measure_extras", REPO / "scripts" / "measure_extras.py")
measure_extras = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(measure_extras)

RECIPE = "tiny-cpu-draft-target"


def _run(venv: pathlib.Path, *args: str, cwd: pathlib.Path, timeout: float = 300, check: bool = True):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env["PATH"] = f"{venv / 'bin'}:{env.get('PATH', '')}"
    r = subprocess.run([str(venv / "bin" / "trtspec"), *args], cwd=cwd, env=env, capture_output=True, text=True,
                       timeout=timeout)
    if check:
        assert r.returncode == 0, f"trtspec {' '.join(args)} → {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> pathlib.Path:
    return measure_extras.build_wheel(tmp_path_factory.mktemp("dist"))


@pytest.fixture(scope="module")
def client_venv(wheel, tmp_path_factory) -> pathlib.Path:
    venv = tmp_path_factory.mktemp("venvs") / "client"
    measure_extras.make_venv(venv, wheel, "client", torch_first=False, byte_compile=False)
    return venv


@pytest.fixture(scope="module")
def all_venv(wheel, tmp_path_factory) -> pathlib.Path:
    venv = tmp_path_factory.mktemp("venvs") / "all"
    measure_extras.make_venv(venv, wheel, "all", torch_first=True, byte_compile=False)
    return venv


@pytest.fixture(scope="module", autouse=True)
def installs_first(client_venv, all_venv) -> None:
    """Both venvs before anything needs the tiny pair: on a fresh checkout their installs overlap
    its training on the other xdist worker (tests/conftest.py schedules this file first)."""


@pytest.fixture(scope="module")
def outside(tmp_path_factory, tiny_models) -> pathlib.Path:
    """A working folder with no checkout above it: recipes and templates must come from the wheel.
    ``models`` links to the trained tiny pair, where the shipped tiny recipe (copied to
    ``recipes/``) looks for it."""
    root = tmp_path_factory.mktemp("user")
    (root / "models").symlink_to(tiny_models[0].parent, target_is_directory=True)
    return root


def test_client_wheel_has_no_torch_and_runs_the_core_commands(client_venv, outside, tiny_models):
    pkgs = measure_extras.installed(client_venv)
    for absent in ("torch", "nvidia-modelopt", "nvidia-pytriton", "tensorrt-llm"):
        assert absent not in pkgs, f"[client] installed {absent}"
    assert "tritonclient" in pkgs
    # non-editable: the module comes from the venv, not from this checkout
    where = subprocess.run([str(client_venv / "bin" / "python"), "-c", "import trtspec; print(trtspec.__file__)"],
                           cwd=outside, capture_output=True, text=True, check=True).stdout.strip()
    assert where.startswith(str(client_venv)), where

    assert "--url" in _run(client_venv, "bench", "--help", cwd=outside).stdout
    assert "llama3.1-8b-eagle3-fp8-trtllm" in _run(client_venv, "recipes", "list", "--json", cwd=outside).stdout
    for name in (RECIPE, "llama3.1-8b-eagle3-fp8-trtllm"):
        _run(client_venv, "recipes", "copy", name, "recipes", cwd=outside)
    recipe = outside / "recipes" / f"{RECIPE}.yaml"
    assert recipe.is_file()
    _run(client_venv, "check", str(recipe), cwd=outside)
    dry = _run(client_venv, "build", "recipes/llama3.1-8b-eagle3-fp8-trtllm.yaml", "--dry-run", cwd=outside).stdout
    assert "trtllm-build" in dry or "trtllm-serve" in dry, dry[-2000:]
    _run(client_venv, "package", str(recipe), "-o", "repo", cwd=outside)
    assert (outside / "repo" / "ensemble" / "config.pbtxt").is_file()
    assert (outside / "repo" / "tensorrt_llm" / "1" / "model.py").is_file()
    # a command whose extra is missing names it (no ImportError traceback)
    r = _run(client_venv, "generate", "--help", cwd=outside, check=False)
    assert r.returncode == 2 and "trtspec[torch-runtime]" in r.stderr, r.stderr


def test_bench_from_client_wheel_against_server_from_all_wheel(client_venv, all_venv, outside, tiny_models):
    assert measure_extras.installed(all_venv).get("torch", "").startswith("2.13.0")
    repo = outside / "repo"
    if not repo.is_dir():  # run alone: package it here
        _run(client_venv, "recipes", "copy", RECIPE, "recipes", cwd=outside)
        _run(client_venv, "package", f"recipes/{RECIPE}.yaml", "-o", "repo", cwd=outside)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env["PATH"] = f"{all_venv / 'bin'}:{env.get('PATH', '')}"
    cmd = [str(all_venv / "bin" / "trtspec"), "serve", str(repo), "--json", "--no-watchdog", "--ready-timeout", "240"]
    with serve_process(cmd, outside / "serve.log", cwd=outside, env=env) as (info, proc):
        _run(client_venv, "bench", "--url", info["grpc"], "--prompts", "builtin:code", "--num-prompts", "2",
             "--concurrency", "1", "--requests", "4", "--warmup", "1", "--output-len", "16",
             "--tokenizer", str(tiny_models[0]), "-o", "bench-out", cwd=outside, timeout=600)
        report = json.loads((outside / "bench-out" / "report.json").read_text())
        assert report
    assert proc.returncode == 0, (outside / "serve.log").read_text()[-3000:]
