"""Running a TRT-LLM build plan with fake tools: caching, atomic stage folders, failures, the
version gate and the preflight, and ``trtspec build --dry-run`` on this CPU machine.

The fakes (``python3``, ``trtllm-build``, ``trtspec`` put first on PATH) check their arguments
against ``accepted_names`` exactly as the golden tests do, write placeholder outputs shaped like the
real ones (``rank{i}.safetensors`` per TP rank, ``rank{i}.engine``), log every call, and fail on
request (``FAKE_FAIL=<text in argv>``) after writing part of their output.
"""

from __future__ import annotations

import json
import os
import pathlib
import shlex
import sys

import pytest
import yaml
from click.testing import CliRunner

from trtspec.cli import main
from trtspec.config import parse_recipe
from trtspec.errors import CommandError, PreflightError, StageError
from trtspec.trtllm.build import build, plan_build, version_gate
from trtspec.trtllm.handoff import TrtllmBuild

REPO = pathlib.Path(__file__).resolve().parents[2]
R70B = REPO / "build_configs" / "llama3.3-70b-draft-target-fp8-trtllm.yaml"
R8B = REPO / "build_configs" / "llama3.1-8b-eagle3-fp8-trtllm.yaml"
REAL_SCRIPTS = ("quantization/quantize.py", "eagle/quantize.py", "eagle/convert_checkpoint.py",
                "medusa/convert_checkpoint.py", "models/core/llama/convert_checkpoint.py",
                "models/core/qwen/convert_checkpoint.py")

FAKE = r'''#!{python}
"""Fake TRT-LLM tool for trtspec's tests."""
import json, os, pathlib, sys

argv = [pathlib.Path(sys.argv[0]).name] + sys.argv[1:]
with open(os.environ["FAKE_LOG"], "a") as f:
    f.write(json.dumps(argv) + "\n")

def opt(name, default=None):
    return argv[argv.index(name) + 1] if name in argv else default

def fail_if_asked(out):
    needle = os.environ.get("FAKE_FAIL")
    if needle and any(needle in a for a in argv):
        pathlib.Path(out).mkdir(parents=True, exist_ok=True)
        (pathlib.Path(out) / "rank0.engine.partial").write_text("half")
        sys.stderr.write("loading...\n[TRT] [E] fake failure: CUDA out of memory\n")
        sys.exit(3)

if argv[0] == "trtspec":  # trtspec quantize ... -o OUT
    out = pathlib.Path(opt("-o"))
    fail_if_asked(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text("{}")
    (out / "hf_quant_config.json").write_text(json.dumps({"quantization": {"quant_algo": opt("--format").upper()}}))
    sys.exit(0)

if argv[:3] == ["python3", "-m", "trtspec.trtllm.calibration"]:
    out = pathlib.Path(opt("--output"))
    out.mkdir(parents=True, exist_ok=True)
    (out / "train.jsonl").write_text('{"text": "x"}\n')
    sys.exit(0)

from trtspec.trtllm.accepted_names import check_argv, tool_for
tool = tool_for(argv)
if tool is None:
    sys.stderr.write(f"fake: unknown tool {argv[:2]}\n"); sys.exit(2)
problems = check_argv(argv)
if problems:
    sys.stderr.write("usage error: " + "; ".join(problems) + "\n"); sys.exit(2)
if argv[0] == "python3" and not pathlib.Path(argv[1]).is_file():
    sys.stderr.write(f"python3: can't open file {argv[1]!r}\n"); sys.exit(2)
out = pathlib.Path(opt("--output_dir"))
fail_if_asked(out)
if os.environ.get("FAKE_NO_OUTPUT") and os.environ["FAKE_NO_OUTPUT"] in " ".join(argv):
    sys.exit(0)
out.mkdir(parents=True, exist_ok=True)
if argv[0] == "trtllm-build":
    ckpt = pathlib.Path(opt("--checkpoint_dir"))
    cfg = json.loads((ckpt / "config.json").read_text())  # a real build reads it too
    world = cfg["mapping"]["world_size"]
    (out / "config.json").write_text(json.dumps({"build_config": {"max_draft_len": int(opt("--max_draft_len", 0))},
                                                 "pretrained_config": cfg}))
    for r in range(world):
        (out / f"rank{r}.engine").write_text("engine")
elif argv[1].endswith("eagle/quantize.py"):
    (out / "config.json").write_text(json.dumps({"eagle": {}}))
    (out / "hf_quant_config.json").write_text("{}")
else:
    tp, pp = int(opt("--tp_size", 1)), int(opt("--pp_size", 1))
    (out / "config.json").write_text(json.dumps({"mapping": {"world_size": tp * pp, "tp_size": tp}}))
    for r in range(tp * pp):
        (out / f"rank{r}.safetensors").write_text("weights")
'''


@pytest.fixture
def fake(tmp_path):
    """(env, calls(), examples_dir, models_dir): fake tools first on PATH, real-looking example scripts."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("python3", "trtllm-build", "trtspec"):
        p = bin_dir / name
        p.write_text(FAKE.replace("{python}", sys.executable))
        p.chmod(0o755)
    examples = tmp_path / "TensorRT-LLM" / "examples"
    for rel in REAL_SCRIPTS:
        (examples / rel).parent.mkdir(parents=True, exist_ok=True)
        (examples / rel).write_text("# placeholder: the fake python3 validates the arguments\n")
    log = tmp_path / "calls.jsonl"
    log.write_text("")
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "FAKE_LOG": str(log)}
    env.pop("FAKE_FAIL", None)

    def calls() -> list[list[str]]:
        return [json.loads(x) for x in log.read_text().splitlines()]

    return env, calls, examples, tmp_path / "models"


def _model(folder: pathlib.Path, model_type: str = "llama") -> str:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"model_type": model_type, "vocab_size": 128256}))
    (folder / "model.safetensors").write_text("weights")
    return str(folder)


def _recipe(path: pathlib.Path, examples: pathlib.Path, models: pathlib.Path):
    """The shipped recipe with its models and examples folder moved under tmp_path."""
    d = yaml.safe_load(path.read_text())
    d["target"]["model"] = _model(models / "target")
    for key in ("draft", "head"):
        if key in d["speculation"]:
            d["speculation"][key]["model"] = _model(models / key)
    d["runtime"]["trtllm"]["examples_dir"] = str(examples)
    return parse_recipe(d)


def _leftovers(out: pathlib.Path) -> list[str]:
    return [p.name for p in out.iterdir() if ".tmp-" in p.name or ".old-" in p.name]


# --------------------------------------------------------------------------------------------


def test_engine_build_runs_every_stage_then_a_rerun_does_nothing(fake, tmp_path):
    env, calls, examples, models = fake
    recipe = _recipe(R70B, examples, models)
    out = tmp_path / "out"
    res = build(recipe, out, installed_version="1.2.1", env=env)

    # no calib stage: the recipe calibrates on cnn_dailymail, which quantize.py reads by name
    assert res.ran == ["target-ckpt", "target-engine", "draft-ckpt", "draft-engine"] and res.cached == []
    assert len(calls()) == 4
    assert sorted(p.name for p in (out / "target-engine").iterdir()) == [
        "config.json", "rank0.engine", "rank1.engine", "rank2.engine", "rank3.engine", "trtspec.json"]
    assert _leftovers(out) == []
    # the hand-off: what the packager reads, equal to what the build returned
    h = TrtllmBuild.from_build_dir(out)
    assert h == res.handoff
    assert h.engines == {"target": str(out / "target-engine"), "draft": str(out / "draft-engine")}
    assert set(h.stages) == set(res.ran) and all(len(k) == 64 for k in h.stages.values())
    # the runner logged the exact commands
    assert "$ trtllm-build --checkpoint_dir" in (out / "logs" / "target-engine.log").read_text()

    manifest_mtime = (out / "trtspec.json").stat().st_mtime_ns
    again = build(recipe, out, installed_version="1.2.1", env=env)
    assert again.ran == [] and again.cached == res.ran
    assert len(calls()) == 4, "an unchanged recipe must run nothing"
    assert not again.manifest_written and (out / "trtspec.json").stat().st_mtime_ns == manifest_mtime


def test_a_changed_input_rebuilds_only_what_depends_on_it(fake, tmp_path):
    env, calls, examples, models = fake
    recipe = _recipe(R70B, examples, models)
    out = tmp_path / "out"
    build(recipe, out, installed_version="1.2.1", env=env)
    (models / "draft" / "model.safetensors").write_text("new draft weights")
    res = build(recipe, out, installed_version="1.2.1", env=env)
    assert res.ran == ["draft-ckpt", "draft-engine"]
    assert res.cached == ["target-ckpt", "target-engine"]
    assert res.manifest_written


def test_a_failure_in_the_middle_leaves_no_half_written_engine_and_names_the_command(fake, tmp_path):
    env, calls, examples, models = fake
    recipe = _recipe(R70B, examples, models)
    out = tmp_path / "out"
    build(recipe, out, installed_version="1.2.1", env=env)  # a previous good build
    (models / "draft" / "model.safetensors").write_text("new draft weights")  # draft stages must rerun

    with pytest.raises(CommandError) as e:
        build(recipe, out, installed_version="1.2.1", env={**env, "FAKE_FAIL": "draft-engine"})
    err = e.value
    assert err.returncode == 3 and err.argv[0] == "trtllm-build"
    msg = str(err)
    assert "command failed (exit 3): trtllm-build --checkpoint_dir" in msg
    assert "fake failure: CUDA out of memory" in msg and "draft-engine.log" in msg
    # the failed stage's temp folder is gone and the previous engine is untouched
    assert _leftovers(out) == []
    assert not list((out / "draft-engine").glob("*.partial"))
    # the old hand-off described folders this run replaced (draft-ckpt): it is gone until a build succeeds
    assert not (out / "trtspec.json").exists()

    res = build(recipe, out, installed_version="1.2.1", env=env)
    assert res.ran == ["draft-engine"]  # draft-ckpt succeeded before the failure and is reused
    assert (out / "trtspec.json").exists()


def test_a_failure_on_a_fresh_build_leaves_no_stage_folder(fake, tmp_path):
    env, calls, examples, models = fake
    out = tmp_path / "out"
    with pytest.raises(CommandError, match="target-engine"):
        build(_recipe(R70B, examples, models), out, installed_version="1.2.1",
              env={**env, "FAKE_FAIL": "target-engine"})
    assert not (out / "target-engine").exists() and _leftovers(out) == []
    assert (out / "target-ckpt" / "rank3.safetensors").exists()


def test_a_tool_that_exits_0_without_its_outputs_is_an_error(fake, tmp_path):
    env, calls, examples, models = fake
    out = tmp_path / "out"
    with pytest.raises(StageError, match="did not write config.json"):
        build(_recipe(R70B, examples, models), out, installed_version="1.2.1",
              env={**env, "FAKE_NO_OUTPUT": "--qformat"})
    assert not (out / "target-ckpt").exists()


def test_preflight_stops_before_any_work(fake, tmp_path):
    env, calls, examples, models = fake
    recipe = _recipe(R70B, examples, models)
    no_build = {**env, "PATH": os.pathsep.join(p for p in env["PATH"].split(os.pathsep)[1:])}
    (examples / "quantization" / "quantize.py").unlink()
    with pytest.raises(PreflightError) as e:
        build(recipe, tmp_path / "out", installed_version="1.2.1", env=no_build)
    msg = str(e.value)
    assert "'trtllm-build' is not on PATH" in msg and "quantization/quantize.py does not exist" in msg
    assert calls() == [] and not (tmp_path / "out").exists()


@pytest.mark.parametrize("installed,words", [
    (None, ["not installed", "tritonserver:25.12-trtllm-python-py3", "--dry-run", "trtllm-pytorch"]),
    ("1.3.0rc21", ["has no engine flow", "removed after 1.2.x", "trtllm-pytorch"]),
    ("1.1.0", ["generated for 1.2.1", "runtime.trtllm.version"]),
])
def test_version_gate_stops_the_engine_flow_before_any_work(fake, tmp_path, installed, words):
    env, calls, examples, models = fake
    with pytest.raises(PreflightError) as e:
        build(_recipe(R70B, examples, models), tmp_path / "out", installed_version=installed, env=env)
    for w in words:
        assert w in str(e.value)
    assert calls() == [] and not (tmp_path / "out").exists()


def test_version_gate_pytorch_flow():
    version_gate("trtllm-pytorch", "1.2.1", None)  # building the YAML needs no TensorRT-LLM here
    version_gate("trtllm-pytorch", "1.2.1", "1.3.0")
    with pytest.raises(PreflightError, match="predates"):
        version_gate("trtllm-pytorch", "1.2.1", "0.21.0")


def test_pytorch_flow_build_quantizes_then_writes_the_llm_api_yaml(fake, tmp_path):
    env, calls, examples, models = fake
    recipe = _recipe(R8B, examples, models)
    out = tmp_path / "out"
    res = build(recipe, out, installed_version=None, env=env)
    assert res.ran == ["target-quant"]
    (call,) = calls()
    assert call[:2] == ["trtspec", "quantize"] and call[call.index("--export") + 1] == "hf"
    spec = yaml.safe_load((out / "llmapi" / "extra_llm_api_options.yaml").read_text())
    assert spec["speculative_config"]["speculative_model_dir"] == str(models / "head")
    h = TrtllmBuild.from_build_dir(out)
    assert h.llm_api["model"] == str(out / "target-quant")
    assert h.triton_model_yaml(decoupled=True)["triton_config"] == {"max_batch_size": 0, "decoupled": True}
    again = build(recipe, out, installed_version=None, env=env)
    assert again.ran == [] and again.files_written == [] and not again.manifest_written and len(calls()) == 1


# --------------------------------------------------------------------------------------------
# the CLI


@pytest.mark.parametrize("path", [R70B, R8B], ids=["70b-draft-target", "8b-eagle3"])
def test_cli_dry_run_prints_the_complete_plan_without_tensorrt_llm(path, tmp_path):
    out = tmp_path / "plan-out"
    res = CliRunner().invoke(main, ["build", str(path), "--dry-run", "-o", str(out)])
    assert res.exit_code == 0, res.output
    plan = plan_build(__import__("trtspec.config", fromlist=["load_recipe"]).load_recipe(path), out)
    for stage in plan.stages:
        assert f"{stage.output}/" in res.output
        for argv in stage.commands:
            assert shlex.join(argv) in res.output  # every command, copy-pastable
    for file_path, text in plan.files.items():
        assert file_path in res.output
        for line in text.splitlines():
            assert f"| {line}" in res.output
    assert f"{out}/trtspec.json" in res.output
    assert not out.exists(), "a dry run writes nothing"


def test_cli_dry_run_json_and_real_build_error_here(tmp_path):
    res = CliRunner().invoke(main, ["build", str(R70B), "--dry-run", "--json", "-o", str(tmp_path / "o")])
    assert res.exit_code == 0
    data = json.loads(res.output)
    assert [s["id"] for s in data["stages"]] == ["target-ckpt", "target-engine", "draft-ckpt", "draft-engine"]
    assert data["handoff"]["max_draft_len"] == 10
    from trtspec.versions import installed_trtllm_version

    if installed_trtllm_version() is None:
        res = CliRunner().invoke(main, ["build", str(R70B), "-o", str(tmp_path / "o")])
        assert res.exit_code == 1
        assert "tensorrt_llm is not installed" in res.output and not (tmp_path / "o").exists()


def test_cli_error_output_keeps_the_stderr_tail_verbatim(capsys):
    from trtspec.cli.common import handle_errors

    @handle_errors
    def failing():
        raise CommandError(["trtllm-build", "--checkpoint_dir", "c"], 1,
                           "[TensorRT-LLM][ERROR] Assertion failed: 16 != 40\n[bold] kernel [E] /x/[red]")

    with pytest.raises(SystemExit) as e:
        failing()
    assert e.value.code == 1
    err = capsys.readouterr().err
    assert "trtllm-build --checkpoint_dir c" in err
    assert "[TensorRT-LLM][ERROR] Assertion failed: 16 != 40" in err and "[bold] kernel [E] /x/[red]" in err
