"""Results are never lost or stale (trtspec.outputs, trtspec.run_inputs): output folders are
replaced only when they are trtspec's of the same kind, reports are written atomically, one
``trtspec run`` per work folder, server logs rotate, and stage keys follow file contents."""

from __future__ import annotations

import json
import multiprocessing
import pathlib
import time

import pytest
from click.testing import CliRunner

from trtspec.cli import main
from trtspec.config import load_recipe, parse_recipe
from trtspec.manifest import write_manifest
from trtspec.outputs import BENCH_REPORT, OutputError, check_replaceable, work_lock, write_atomically
from trtspec.run_inputs import explain, stage_inputs
from trtspec.triton.render import package
from trtspec.triton.launch.server import rotate_log

REPO = pathlib.Path(__file__).resolve().parents[2]


def foreign(tmp_path) -> pathlib.Path:
    d = tmp_path / "mine"
    d.mkdir()
    (d / "thesis.tex").write_text("years of work")
    return d


def test_a_non_empty_folder_needs_force_and_force_needs_the_same_kind(tmp_path):
    check_replaceable(tmp_path / "new", BENCH_REPORT, False)
    (tmp_path / "empty").mkdir()
    check_replaceable(tmp_path / "empty", BENCH_REPORT, False)
    d = foreign(tmp_path)
    with pytest.raises(OutputError, match="not empty.*|pass --force"):
        check_replaceable(d, BENCH_REPORT, False)
    with pytest.raises(OutputError, match="--force replaces only a bench-report folder .*no trtspec.json"):
        check_replaceable(d, BENCH_REPORT, True)
    write_manifest(d, "validation-report")
    with pytest.raises(OutputError, match="kind 'validation-report'"):
        check_replaceable(d, BENCH_REPORT, True)
    assert (d / "thesis.tex").read_text() == "years of work"


def test_reports_are_replaced_atomically_and_an_interrupted_write_keeps_the_earlier_one(tmp_path):
    out = tmp_path / "bench"
    write_atomically(out, BENCH_REPORT, lambda t: (t / "report.md").write_text("first"))
    assert json.loads((out / "trtspec.json").read_text())["kind"] == BENCH_REPORT

    def interrupted(t):
        (t / "report.md").write_text("half")
        (t / "plot.png").write_bytes(b"x")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write_atomically(out, BENCH_REPORT, interrupted, force=True)
    assert (out / "report.md").read_text() == "first" and not (out / "plot.png").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["bench"]  # no temp folder left
    with pytest.raises(OutputError, match="not empty"):
        write_atomically(out, BENCH_REPORT, lambda t: None)
    (out / "stale.png").write_bytes(b"old plot")
    write_atomically(out, BENCH_REPORT, lambda t: (t / "report.md").write_text("second"), force=True)
    assert (out / "report.md").read_text() == "second" and not (out / "stale.png").exists()


@pytest.mark.parametrize("cmd", [["bench", "--url", "127.0.0.1:1"],
                                 ["validate", "--url", "127.0.0.1:1", str(REPO / "build_configs" / "tiny-cpu-draft-target.yaml")]])
def test_bench_and_validate_refuse_a_non_empty_out_before_running(tmp_path, cmd):
    d = foreign(tmp_path)
    t0 = time.monotonic()
    r = CliRunner().invoke(main, [*cmd, "-o", str(d)])
    assert r.exit_code == 2 and "not empty" in r.output and "--force" in r.output, r.output
    r = CliRunner().invoke(main, [*cmd, "-o", str(d), "--force"])
    assert r.exit_code == 2 and "replaces only" in r.output, r.output
    assert time.monotonic() - t0 < 30  # refused up front, not after a load test
    assert sorted(p.name for p in d.iterdir()) == ["thesis.tex"]


def test_package_and_deploy_force_replace_only_their_own_kind(tmp_path):
    recipe = load_recipe(REPO / "build_configs" / "llama3.1-8b-eagle3-fp8-trtllm.yaml")
    d = foreign(tmp_path)
    with pytest.raises(OutputError, match="triton-repository"):
        package(recipe, d, build_dir=tmp_path / "build", overwrite=True)
    assert sorted(p.name for p in d.iterdir()) == ["thesis.tex"]
    repo = tmp_path / "repo"
    package(recipe, repo, build_dir=tmp_path / "build")
    package(recipe, repo, build_dir=tmp_path / "build", overwrite=True)  # its own kind: replaced
    r = CliRunner().invoke(main, ["deploy", "k8s", str(REPO / "build_configs" / "llama3.1-8b-eagle3-fp8-trtllm.yaml"),
                                  "-o", str(d), "--force", "--build-dir", str(tmp_path / "build")])
    assert r.exit_code != 0 and "replaces only" in r.output, r.output
    assert sorted(p.name for p in d.iterdir()) == ["thesis.tex"]


def _hold(workdir, ready, release):
    with work_lock(workdir):
        ready.set()
        release.wait(30)


def test_one_run_per_work_folder(tmp_path):
    ctx = multiprocessing.get_context("fork")
    ready, release = ctx.Event(), ctx.Event()
    p = ctx.Process(target=_hold, args=(tmp_path, ready, release))
    p.start()
    try:
        assert ready.wait(30)
        with pytest.raises(OutputError, match=f"another trtspec run is using the work folder .*pid {p.pid}"):
            with work_lock(tmp_path):
                pass
    finally:
        release.set()
        p.join(30)
    with work_lock(tmp_path):  # free again
        pass


def test_two_concurrent_trtspec_runs_of_one_recipe_do_not_interleave(tmp_path):
    """Two `trtspec run`s on one work folder: the second is refused at once, the first finishes."""
    import subprocess
    import sys

    cfg = tmp_path / "r.yaml"
    cfg.write_text((REPO / "build_configs" / "llama3.1-8b-eagle3-fp8-trtllm.yaml").read_text())
    trtspec = pathlib.Path(sys.executable).parent / "trtspec"
    wd = tmp_path / "work"
    ctx = multiprocessing.get_context("fork")
    ready, release = ctx.Event(), ctx.Event()
    holder = ctx.Process(target=_hold, args=(wd, ready, release))  # a run in progress
    holder.start()
    try:
        assert ready.wait(30)
        r = subprocess.run([str(trtspec), "run", str(cfg), "--workdir", str(wd), "--until", "check"],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and "another trtspec run is using the work folder" in r.stderr, r.stderr
        assert not (wd / "check").exists()  # it did nothing
    finally:
        release.set()
        holder.join(30)


def test_server_logs_rotate(tmp_path):
    log = tmp_path / "tritonserver.log"
    for i in range(5):
        rotate_log(log)
        log.write_text(f"run {i}")
    assert log.read_text() == "run 4"
    assert [(tmp_path / f"tritonserver.log.{i}").read_text() for i in (1, 2, 3)] == ["run 3", "run 2", "run 1"]
    assert not (tmp_path / "tritonserver.log.4").exists()


# ------------------------------------------------------------------------------ stage keys


def _recipe(tmp_path, **over):
    tok = tmp_path / "tok"
    tok.mkdir(exist_ok=True)
    if not (tok / "tokenizer.json").exists():
        (tok / "tokenizer.json").write_text('{"v": 1}')
    (tmp_path / "prompts.jsonl").exists() or (tmp_path / "prompts.jsonl").write_text('{"text": "a"}\n')
    (tmp_path / "calib.jsonl").exists() or (tmp_path / "calib.jsonl").write_text('{"text": "c"}\n')
    return parse_recipe({
        "name": "keys", "target": {"model": str(tok), "quantization": {
            "format": "int8_wo", "calibration": {"dataset": str(tmp_path / "calib.jsonl")}}},
        "speculation": {"method": "none"},
        "validation": {"prompts": str(tmp_path / "prompts.jsonl")}, **over})


def _changed(tmp_path, edit) -> set[str]:
    before = {s: stage_inputs(_recipe(tmp_path), s) for s in ("check", "quantize", "build", "package", "validate")}
    edit()
    after = {s: stage_inputs(_recipe(tmp_path), s) for s in before}
    return {s for s in before if before[s] != after[s]}


def test_edited_input_files_change_the_right_stages(tmp_path):
    _recipe(tmp_path)
    assert _changed(tmp_path, lambda: (tmp_path / "prompts.jsonl").write_text('{"text": "b"}\n')) == {"build", "validate"}
    assert _changed(tmp_path, lambda: (tmp_path / "calib.jsonl").write_text('{"text": "d"}\n')) == {"quantize"}
    assert _changed(tmp_path, lambda: (tmp_path / "tok" / "tokenizer.json").write_text('{"v": 2}')) == \
        {"build", "package", "validate"}
    assert _changed(tmp_path, lambda: (tmp_path / "tok" / "model.safetensors").write_bytes(b"w")) == set()
    # same size, same name, new content: still seen (contents, not names or sizes)
    assert _changed(tmp_path, lambda: (tmp_path / "prompts.jsonl").write_text('{"text": "c"}\n')) == {"build", "validate"}


def test_the_trtspec_version_is_part_of_every_stage_key(tmp_path, monkeypatch):
    import trtspec.run_inputs as ri

    before = {s: stage_inputs(_recipe(tmp_path), s) for s in ("check", "report")}
    monkeypatch.setattr(ri, "__version__", "999.0")
    assert all(stage_inputs(_recipe(tmp_path), s) != before[s] for s in before)


def test_explain_names_what_changed():
    stages = ("check", "quantize", "build")
    old = {"inputs": {"prompts": "a", "tokenizer": "t"}, "recipe_hash": "r", "prev": ["k1", "k2"]}
    assert explain("build", None, inputs={}, recipe="r", prev=[], forced_by=None, stages=stages).startswith("no finished")
    assert explain("build", old, inputs={}, recipe="r", prev=[], forced_by="quantize", stages=stages) == \
        "forced by --from quantize"
    why = explain("build", old, inputs={"prompts": "b", "tokenizer": "t"}, recipe="r2", prev=["k1", "k3"],
                  forced_by=None, stages=stages)
    assert why == "the recipe changed; changed: prompts; an earlier stage ran again: quantize"


def test_an_edited_prompts_file_reruns_build_and_package_and_run_explain_says_why(tmp_path, tiny_models):
    """`trtspec run --until package` twice around an edit of the prompts file (same name): the
    second run re-runs the stages that read it (build tunes on the prompts) and what follows,
    reuses the rest, and --explain names the changed input."""
    import sys

    import yaml

    target, draft = tiny_models
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"text": "def add(a, b):\\n    return a + b\\n"}\n{"text": "class Stack:\\n    def push(self, x):"}\n')
    cfg = tmp_path / "r.yaml"
    cfg.write_text(yaml.safe_dump({
        "name": "explain-test", "target": {"model": str(target)},
        "speculation": {"method": "draft_target", "draft": {"model": str(draft)}, "max_draft_len": 3},
        "runtime": {"backend": "torch", "dtype": "float32", "device": "cpu", "torch_threads": 1},
        "limits": {"max_batch_size": 4, "max_input_len": 256, "max_seq_len": 512},
        "validation": {"prompts": str(prompts), "num_prompts": 2, "max_tokens": 8}}))
    trtspec = pathlib.Path(sys.executable).parent / "trtspec"
    wd = tmp_path / "work"

    def run():
        import subprocess

        r = subprocess.run([str(trtspec), "run", str(cfg), "--workdir", str(wd), "--until", "package", "--explain"],
                           capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stdout + r.stderr
        return r.stdout

    first = run()
    assert "no finished earlier run of this stage" in first
    again = run()
    assert "▶" not in again  # nothing ran: every stage reused, and said so
    assert again.count("reused: same recipe, earlier stages and inputs") >= 3
    prompts.write_text(prompts.read_text().replace("add", "sub"))  # same name, new content
    edited = run()
    lines = {ln.split()[1]: ln for ln in edited.splitlines() if ln.startswith("▶")}
    assert set(lines) == {"build", "package"}, edited
    assert "changed: prompts" in lines["build"]
    assert "an earlier stage ran again: build" in lines["package"]
