"""`trtspec run`: stages, reuse, resume after failure, and a server that dies mid-validation."""

from __future__ import annotations

import os
import pathlib
import shutil
import signal
import threading
import time

import pytest
import yaml
from click.testing import CliRunner

from trtspec.cli import main
from trtspec.config import load_recipe
from trtspec.errors import StageError, TrtspecError
from trtspec.pipeline import STAGES, Pipeline


def _recipe(tmp_path: pathlib.Path, target: pathlib.Path, draft: pathlib.Path | None, **over) -> pathlib.Path:
    spec = {"method": "ngram", "max_draft_len": 3} if draft is None else {
        "method": "draft_target", "draft": {"model": str(draft)}, "max_draft_len": 3}
    data = {
        "name": over.pop("name", "pipe-test"),
        "target": {"model": str(target)},
        "speculation": spec,
        "runtime": {"backend": "torch", "dtype": "float32", "device": "cpu", "torch_threads": 1},
        "limits": {"max_batch_size": 4, "max_input_len": 256, "max_seq_len": 512},
        "validation": {"prompts": "builtin:stdlib", "num_prompts": 3, "max_tokens": 16, "concurrency": [1],
                       "requests_per_level": 3, "max_requests_per_level": 3, "warmup_requests": 0,
                       "gates": {"min_speedup": 0.01, "min_acceptance_rate": 0.0}},
        **over,
    }
    p = tmp_path / f"{data['name']}.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


def _stage_manifests(workdir: pathlib.Path) -> set[str]:
    return {s for s in STAGES if (workdir / s / "trtspec.json").is_file()}


def test_until_stops_and_rerun_reuses_every_finished_stage(tmp_path, tiny_models):
    target, draft = tiny_models
    cfg = _recipe(tmp_path, target, draft)
    wd = tmp_path / "work"
    r1 = CliRunner().invoke(main, ["run", str(cfg), "--workdir", str(wd), "--until", "package"])
    assert r1.exit_code == 0, r1.output
    assert _stage_manifests(wd) == {"check", "quantize", "build", "package"}
    assert (wd / "package" / "repository" / "ensemble" / "config.pbtxt").is_file()
    assert (wd / "build" / "tune.json").is_file()  # the torch runtime's build measures max_draft_len
    r2 = CliRunner().invoke(main, ["run", str(cfg), "--workdir", str(wd), "--until", "package"])
    assert r2.exit_code == 0, r2.output
    assert r2.output.count("reused") == 4 and "▶" not in r2.output
    # --from forces that stage (and later ones) to run again
    r3 = CliRunner().invoke(main, ["run", str(cfg), "--workdir", str(wd), "--from", "package", "--until", "package"])
    assert r3.exit_code == 0 and "▶ package" in r3.output and r3.output.count("reused") == 3


def test_bad_draft_fails_mid_way_then_resumes_from_the_failed_stage(tmp_path, tiny_models):
    target, draft = tiny_models
    bad = tmp_path / "bad-draft"
    shutil.copytree(draft, bad)
    (bad / "model.safetensors").write_bytes(b"not a safetensors file")
    cfg = _recipe(tmp_path, target, bad)
    wd = tmp_path / "work"
    r = CliRunner().invoke(main, ["run", str(cfg), "--workdir", str(wd), "--until", "package"])
    assert r.exit_code == 2, r.output
    assert "error" in r.output and "resume" in r.output
    assert "Traceback" not in r.output
    assert _stage_manifests(wd) == {"check", "quantize"}  # build failed: nothing after it recorded
    # repair the draft: the re-run reuses the check and runs the failed stage onwards (quantize is
    # keyed on the model files, which changed, so it is re-evaluated too)
    shutil.copy2(draft / "model.safetensors", bad / "model.safetensors")
    r = CliRunner().invoke(main, ["run", str(cfg), "--workdir", str(wd), "--until", "package"])
    assert r.exit_code == 0, r.output
    assert "↺ check" in r.output and "▶ build" in r.output and "✓ package" in r.output


def test_unknown_stage_names_are_refused(tmp_path, tiny_models):
    recipe = load_recipe(_recipe(tmp_path, tiny_models[0], None))
    with pytest.raises(TrtspecError, match="not a stage"):
        Pipeline(recipe, tmp_path / "w").run(until="deploy")


def _alive(pgid: int) -> list[str]:
    """Live (non-zombie) processes of a process group: the killed server's orphaned stubs are
    reparented to PID 1, which in a container may not reap them; zombies run nothing."""
    live = []
    for stat in pathlib.Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        state, pg = fields[0], int(fields[2])
        if pg == pgid and state != "Z":
            live.append(f"{stat.parent.name} ({state})")
    return live


@pytest.mark.slow
def test_server_dying_mid_validation_fails_cleanly_and_rerun_completes(tmp_path, tiny_models):
    target, _ = tiny_models
    # enough validation work that it is still running when the server is killed, on any machine
    validation = {"prompts": "builtin:stdlib", "num_prompts": 6, "max_tokens": 64, "concurrency": [1],
                  "requests_per_level": 12, "max_requests_per_level": 12, "warmup_requests": 0,
                  "gates": {"min_speedup": 0.01, "min_acceptance_rate": 0.0}}
    recipe = load_recipe(_recipe(tmp_path, target, None, name="pipe-dies", validation=validation))
    wd = tmp_path / "work"
    killed: dict = {}

    def on_event(stage, what, info):
        if stage == "serve" and what == "done":
            server = pipe.server

            def kill():
                time.sleep(0.3)
                killed["pgid"] = server.proc.pid
                killed["shm"] = server.shm_prefix
                os.killpg(server.proc.pid, signal.SIGKILL)

            threading.Thread(target=kill, daemon=True).start()

    pipe = Pipeline(recipe, wd, on_event=on_event)
    with pytest.raises(StageError, match="died during validation"):
        pipe.run()
    assert killed, "the server was never started"
    assert not _alive(killed["pgid"]), f"server processes left running: {_alive(killed['pgid'])}"
    assert not list(pathlib.Path("/dev/shm").glob(killed["shm"] + "*")), "shared memory left behind"
    assert _stage_manifests(wd) == {"check", "quantize", "build", "package"}

    events = []
    res = Pipeline(recipe, wd, on_event=lambda s, w, i: events.append((s, w))).run()
    assert ("package", "reused") in events and ("validate", "done") in events
    assert res.verdict is not None and res.report_dir is not None
    report = (res.report_dir / "report.md").read_text()
    assert "Verdict" in report and "acceptance rate" in report


def test_sigterm_mid_validation_stops_the_server_and_keeps_finished_stages(tmp_path, tiny_models):
    """`trtspec run` stopped by SIGTERM (a CI job cancelled, a pod evicted) while its server is up:
    the server, in its own process group, is stopped rather than orphaned; exit 128+SIGTERM; the
    stages finished before are kept for the re-run."""
    import subprocess
    import sys

    from tests.serving.test_triton_launcher import sigterm_launcher

    target, _ = tiny_models
    validation = {"prompts": "builtin:stdlib", "num_prompts": 6, "max_tokens": 64, "concurrency": [1],
                  "requests_per_level": 200, "warmup_requests": 0,
                  "gates": {"min_speedup": 0.01, "min_acceptance_rate": 0.0}}
    recipe = _recipe(tmp_path, target, None, name="pipe-term", validation=validation)
    tmp, wd = tmp_path / "tmp", tmp_path / "work"
    tmp.mkdir()
    records = tmp / f"trtspec-{os.getuid()}"  # the per-user state folder
    trtspec = pathlib.Path(sys.executable).parent / "trtspec"
    proc = subprocess.Popen([str(trtspec), "run", str(recipe), "--workdir", str(wd)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "TMPDIR": str(tmp), "XDG_RUNTIME_DIR": ""})
    try:
        seen = []
        for line in proc.stdout:  # the CLI prints each stage; the server is up once "serve" is done
            seen.append(line)
            if "serve" in line and "gRPC" in line:
                break
        else:
            pytest.fail("".join(seen) + proc.stderr.read())
    except BaseException:
        proc.kill()
        raise
    server_pid, rc, out, err = sigterm_launcher(proc, records, timeout=120)
    assert rc == 128 + signal.SIGTERM, err[-4000:]  # a native crash's stacks (faulthandler) end stderr
    assert "terminated: everything started was stopped" in err
    assert not _alive(server_pid), f"server processes left running: {_alive(server_pid)}"
    assert not list(records.glob("*.json"))
    assert _stage_manifests(wd) == {"check", "quantize", "build", "package"}
