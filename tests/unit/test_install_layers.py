"""What each install layer imports, checked in a fresh interpreter (no test's imports leak in).

The torch-free entry points (the client, bench and validate, the router's maths, the renderer,
the TRT-LLM plans and calibration script, the recipe and preflight) must not import torch,
ModelOpt or transformers: `pip install 'trtspec[client]'` has none of them. And a command whose
extra is missing names the extra instead of failing with an ImportError.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]

# entry point → the heavy packages it must not import
TORCH_FREE_ENTRY_POINTS = {
    "trtspec.client": ("torch", "modelopt", "transformers"),
    "trtspec.client.loadgen": ("torch", "modelopt", "transformers"),
    "trtspec.client.metrics": ("torch", "modelopt", "transformers"),
    "trtspec.validate.run": ("torch", "modelopt"),
    "trtspec.validate.report": ("torch", "modelopt", "transformers"),
    "trtspec.triton.backend.routing": ("torch", "modelopt", "transformers"),
    "trtspec.triton.backend.router": ("torch", "modelopt", "transformers"),
    "trtspec.triton.render": ("torch", "modelopt", "transformers"),
    "trtspec.triton.launch.server": ("torch", "modelopt", "transformers"),
    "trtspec.trtllm.plan": ("torch", "modelopt", "transformers"),
    "trtspec.trtllm.calibration": ("torch", "modelopt", "transformers"),
    "trtspec.config": ("torch", "modelopt", "transformers"),
    "trtspec.preflight": ("torch", "modelopt"),
    "trtspec.acceptance": ("torch", "modelopt", "transformers", "numpy"),
    "trtspec.cli.measure": ("torch", "modelopt", "transformers"),
    "trtspec.cli.serve": ("torch", "modelopt", "transformers"),
    "trtspec.cli.build": ("torch", "modelopt", "transformers"),
    "trtspec.cli.inspect": ("torch", "modelopt", "transformers"),
}


def _imported(module: str) -> set[str]:
    code = f"import json, sys, {module}; print(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}})))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


@pytest.mark.parametrize("module", sorted(TORCH_FREE_ENTRY_POINTS))
def test_torch_free_entry_points_import_no_heavy_package(module):
    heavy = _imported(module) & set(TORCH_FREE_ENTRY_POINTS[module])
    assert not heavy, f"importing {module} imports {sorted(heavy)}"


def test_the_import_check_sees_torch_where_it_is_imported():
    # the check above can fail: the torch runtime does import torch
    assert "torch" in _imported("trtspec.speculative.runtime")


def _run_without(modules: list[str], args: list[str], tmp_path: pathlib.Path) -> subprocess.CompletedProcess:
    """`trtspec ARGS` in a fresh interpreter where importing any of ``modules`` fails as it does
    when the package is not installed (a meta-path finder raises ModuleNotFoundError for them)."""
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(textwrap.dedent(f"""
        import sys
        BLOCKED = {tuple(modules)!r}
        class _Absent:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in BLOCKED:
                    raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
                return None
        sys.meta_path.insert(0, _Absent())
    """))
    env = {**os.environ, "PYTHONPATH": str(site)}
    code = "import sys; from trtspec.cli import main; sys.argv = ['trtspec', *sys.argv[1:]]; main()"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=tmp_path,
                          env=env, timeout=120)


@pytest.mark.parametrize("blocked, args, extra", [
    (["torch"], ["generate", "--target", "x", "--prompt", "hi"], "torch-runtime"),
    (["torch"], ["models", "tiny"], "torch-runtime"),
    (["modelopt", "torch"], ["quantize", "--model", "x", "--format", "fp8", "--export", "hf", "-o", "q"], "quantize"),
    (["tritonclient", "numpy"], ["serve", "."], "serve"),
    (["tritonclient", "numpy"], ["bench", "--url", "localhost:1"], "client"),
])
def test_a_missing_extra_names_the_extra(tmp_path, blocked, args, extra):
    r = _run_without(blocked, args, tmp_path)
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert f"pip install 'trtspec[{extra}]'" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_core_commands_run_without_torch(tmp_path):
    r = _run_without(["torch", "modelopt", "transformers", "tritonclient"],
                     ["check", str(ROOT / "build_configs" / "llama3.1-8b-eagle3-fp8-trtllm.yaml"), "--json"], tmp_path)
    assert r.returncode in (0, 1), r.stderr  # 1: a preflight check failed (the model folders are not here)
    assert json.loads(r.stdout)["checks"], r.stdout
    r = _run_without(["torch", "modelopt", "transformers", "tritonclient"], ["recipes", "list", "--json"], tmp_path)
    assert r.returncode == 0 and "tiny-cpu-draft-target" in r.stdout, r.stderr


def test_package_renders_a_torch_runtime_repository_without_torch(tmp_path):
    # `trtspec package` is a core command: rendering a torch-runtime recipe reads the recipe and the
    # models' config.json, and must not import the engine (found by installing the [client] wheel)
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    (recipes / "tiny.yaml").write_text((ROOT / "build_configs" / "tiny-cpu-draft-target.yaml").read_text())
    for name in ("tiny-target", "tiny-draft"):
        folder = tmp_path / "models" / name
        folder.mkdir(parents=True)
        (folder / "config.json").write_text(json.dumps({"eos_token_id": 0, "pad_token_id": 1}))
    r = _run_without(["torch", "modelopt", "transformers", "tritonclient"],
                     ["package", "recipes/tiny.yaml", "-o", "repo"], tmp_path)
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert (tmp_path / "repo" / "tensorrt_llm" / "config.pbtxt").is_file()
    assert json.loads((tmp_path / "repo" / "trtspec.json").read_text())["kind"]
