"""Multi-GPU serving plans (trtspec.triton.launch.mpi): golden argv for 1, 2, 4 and 8 GPUs, draft-target
with different TP for draft and target, orchestrator and orchestrator_prespawn (participant_ids);
the rendered repository agrees with the plan; the runner, against a fake mpirun and (when
installed) the real OpenMPI mpirun with the CPU tritonserver.

Regenerate the goldens after an intended change with
``TRTSPEC_UPDATE_GOLDEN=1 pytest tests/unit/test_scaleout_mpi.py`` and review the diff.
"""

from __future__ import annotations

import copy
import json
import pathlib
import shutil
import sys
import textwrap
import time
import urllib.request

import pytest

from trtspec.config import load_recipe, parse_recipe
from trtspec.errors import ConfigError, ServerError
from trtspec.triton import placement
from trtspec.triton.launch import mpi
from trtspec.triton.launch.mpi import MpiTritonServer, launch_plan
from trtspec.triton.placement import Layout, Placement, layout_for
from trtspec.triton.access import SECRET_ENV, hidden_restricted_args
from trtspec.trtllm.plan import make_plan
from tests.goldens import check_golden

REPO = pathlib.Path(__file__).resolve().parents[2]
GOLDEN = REPO / "tests" / "golden" / "scaleout" / "mpi"


def _golden(name: str, text: str) -> None:
    check_golden(GOLDEN / name, text)


BASE = {
    "name": "llama-70b",
    "target": {"model": "/workspace/models/Llama-3.1-70B-Instruct",
               "quantization": {"format": "fp8", "kv_cache": "fp8"}},
    "speculation": {"method": "none"},
    "runtime": {"backend": "trtllm-engine", "dtype": "bfloat16", "device": "cuda", "gpu_arch": "hopper",
                "trtllm": {"model_family": "llama"}},
    "limits": {"max_batch_size": 16, "max_input_len": 4096, "max_seq_len": 8192},
}
DRAFT = {"method": "draft_target", "draft": {"model": "/workspace/models/Llama-3.2-1B-Instruct"}, "max_draft_len": 10}


def _recipe(*, tp=1, pp=1, speculation=None, draft_tp=None, trtllm=None):
    d = copy.deepcopy(BASE)
    d["limits"].update(tensor_parallel_size=tp, pipeline_parallel_size=pp)
    if draft_tp is not None:
        d["limits"]["draft_tensor_parallel_size"] = draft_tp
    if speculation is not None:
        d["speculation"] = speculation
    d["runtime"]["trtllm"].update(trtllm or {})
    return parse_recipe(d)


def _layout(recipe):
    build = make_plan(recipe, pathlib.Path("/workspace/build") / recipe.name).handoff
    return layout_for(recipe, build)


EAGLE = {"method": "eagle", "head": {"model": "/workspace/models/EAGLE-Vicuna-7B"}}
CASES = {
    # one engine: leader mode, world size = tp x pp
    "1gpu-tp1": dict(tp=1),
    "2gpu-tp2": dict(tp=2),
    "4gpu-tp4": dict(tp=4),
    "8gpu-tp8": dict(tp=8),
    "8gpu-tp4-pp2": dict(tp=4, pp=2),
    # two engines: orchestrator (TRT-LLM spawns the ranks), draft TP 1 beside target TP 4 on its own GPU
    "5gpu-draft-tp1-target-tp4-orchestrator": dict(
        tp=4, draft_tp=1, speculation=DRAFT, trtllm={"gpu_device_ids": [0, 1, 2, 3], "draft_gpu_device_ids": [4]}),
    # draft logits → orchestrator_prespawn: world 1 + 2 + 4, participant_ids, fast logits
    "6gpu-draft-tp2-target-tp4-prespawn": dict(
        tp=4, draft_tp=2, speculation={**DRAFT, "use_draft_logits": True},
        trtllm={"gpu_device_ids": [0, 1, 2, 3], "draft_gpu_device_ids": [4, 5]}),
    # 8 GPUs, draft on the target's first GPU, prespawn asked for explicitly (no draft logits)
    "8gpu-draft-tp1-target-tp8-prespawn": dict(
        tp=8, draft_tp=1, speculation=DRAFT, trtllm={"launch_mode": "orchestrator_prespawn"}),
    # EAGLE drafts inside the target engine; the plain baseline engine shares its GPUs
    "2gpu-eagle-tp2-with-baseline-orchestrator": dict(tp=2, speculation=EAGLE),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_plan_matches_golden(case):
    plan = launch_plan(_layout(_recipe(**CASES[case])), repository="/workspace/deploy/llama-70b/repository")
    _golden(f"{case}.txt", plan.describe())
    _golden(f"{case}.json", json.dumps(plan.to_dict(), indent=2) + "\n")


def test_leader_ranks_follow_launch_triton_server():
    """Rank 0 serves the whole repository with ports; every other rank loads only the engine,
    explicitly, with no endpoint; each rank has its own python-backend shared-memory prefix."""
    plan = launch_plan(_layout(_recipe(tp=4)), repository="/r")
    assert plan.layout.mode == "leader" and plan.layout.world_size == 4
    argv = plan.argv
    assert argv[:2] == ("mpirun", "--allow-run-as-root")
    contexts = " ".join(argv[2:]).split(" : ")
    assert len(contexts) == 4 and all(c.startswith("-n 1 tritonserver --model-repository=/r ") for c in contexts)
    assert "--grpc-port=8001" in contexts[0] and "--model-control-mode" not in contexts[0]
    for i, c in enumerate(contexts):
        assert f"shm-region-prefix-name=prefix{i}_" in c
        assert "--disable-auto-complete-config" in c
        if i:
            assert "--model-control-mode=explicit --load-model=tensorrt_llm --allow-http=false" in c
            assert "--grpc-port" not in c
    assert "TRTLLM_ORCHESTRATOR" not in " ".join(argv)


def test_orchestrator_env_rides_on_every_app_context():
    plan = launch_plan(_layout(_recipe(**CASES["6gpu-draft-tp2-target-tp4-prespawn"])), repository="/r")
    contexts = " ".join(plan.argv[2:]).split(" : ")
    assert len(contexts) == plan.layout.world_size == 7
    for c in contexts:
        assert c.startswith("-n 1 -x TRTLLM_ORCHESTRATOR=1 -x TRTLLM_ORCHESTRATOR_SPAWN_PROCESSES=0 tritonserver ")
    assert "--load-model=tensorrt_llm_draft --load-model=tensorrt_llm" in contexts[1]


def test_participant_ids_give_rank_zero_to_the_orchestrator_and_the_draft_the_next_ranks():
    lay = _layout(_recipe(**CASES["6gpu-draft-tp2-target-tp4-prespawn"]))
    assert lay.mode == "orchestrator_prespawn" and lay.world_size == 1 + 2 + 4
    assert lay.placement("draft").parameters() == {
        "gpu_device_ids": "4,5", "participant_ids": "1,2", "speculative_decoding_fast_logits": "1"}
    assert lay.placement("target").parameters() == {
        "gpu_device_ids": "0,1,2,3", "participant_ids": "3,4,5,6", "speculative_decoding_fast_logits": "1"}
    assert lay.gpus == (0, 1, 2, 3, 4, 5)


def test_spawning_orchestrator_turns_off_triton_memory_pools_on_the_engines_gpus():
    plan = launch_plan(_layout(_recipe(**CASES["5gpu-draft-tp1-target-tp4-orchestrator"])), repository="/r")
    assert plan.layout.world_size == 1 and ":" not in plan.argv
    assert [a for a in plan.argv if a.startswith("--cuda-memory-pool")] == [
        f"--cuda-memory-pool-byte-size={g}:0" for g in range(5)]
    assert "--pinned-memory-pool-byte-size=0" in plan.argv and "--enable-peer-access=false" in plan.argv
    assert all("participant_ids" not in p.parameters() for p in plan.layout.placements)


def test_the_shipped_70b_recipe_is_served_by_the_orchestrator():
    recipe = load_recipe(REPO / "build_configs" / "llama3.3-70b-draft-target-fp8-trtllm.yaml")
    lay = _layout(recipe)
    assert (lay.mode, lay.world_size, lay.gpus) == ("orchestrator", 1, (0, 1, 2, 3, 4))


def test_the_8gpu_recipe_is_a_prespawned_world_of_ten():
    recipe = load_recipe(REPO / "build_configs" / "llama3.1-70b-tp8-draft-target-fp8-trtllm.yaml")
    lay = _layout(recipe)
    assert (lay.mode, lay.world_size, lay.gpus) == ("orchestrator_prespawn", 10, tuple(range(8)))
    assert lay.placement("draft").participant_ids == (1,)
    assert lay.placement("target").participant_ids == tuple(range(2, 10))


def test_single_process_for_the_torch_runtime():
    recipe = load_recipe(REPO / "build_configs" / "tiny-cpu-draft-target.yaml")
    lay = layout_for(recipe)
    plan = launch_plan(lay, repository="/r")
    assert (lay.mode, lay.world_size, lay.gpus) == ("single", 1, ())
    assert plan.argv[0] == "tritonserver" and "mpirun" not in plan.argv


# ---------------------------------------------------------------------------------- errors


def test_leader_mode_cannot_serve_two_engines():
    with pytest.raises(ConfigError, match="runtime.trtllm.launch_mode") as e:
        _layout(_recipe(tp=2, speculation=EAGLE, trtllm={"launch_mode": "leader"}))
    assert "orchestrator" in str(e.value) and "tensorrt_llm_baseline" in str(e.value)


def test_a_hand_off_with_too_few_gpu_ids_is_refused():
    recipe = _recipe(tp=4)
    build = make_plan(recipe, pathlib.Path("/b")).handoff
    import dataclasses

    with pytest.raises(ConfigError, match=r"runtime.trtllm.gpu_device_ids.*4 rank\(s\)"):
        placement.engine_layout(dataclasses.replace(build, gpu_device_ids=[0, 1]))


def test_multi_gpu_llm_api_serving_is_refused_with_a_way_out():
    d = copy.deepcopy(BASE)
    d["runtime"]["backend"] = "trtllm-pytorch"
    d["limits"]["tensor_parallel_size"] = 2
    with pytest.raises(ConfigError, match="limits.tensor_parallel_size") as e:
        layout_for(parse_recipe(d))
    assert "trtllm-engine" in str(e.value)


def test_unknown_launch_mode_is_a_recipe_error():
    d = copy.deepcopy(BASE)
    d["runtime"]["trtllm"]["launch_mode"] = "spawn"
    with pytest.raises(Exception, match="runtime.trtllm.launch_mode"):
        parse_recipe(d)


# ---------------------------------------------------------------------------------- the repository agrees


ENGINE_CASES = [c for c in sorted(CASES)]


@pytest.mark.parametrize("case", ENGINE_CASES)
def test_rendered_engine_configs_carry_the_plans_placement(case, tmp_path):
    """The renderer and the launcher read one layout: every engine model's gpu_device_ids /
    participant_ids in config.pbtxt are the plan's, and no other model uses the tensorrtllm backend."""
    from trtspec.triton.render import package

    recipe = _recipe(**CASES[case])
    package(recipe, tmp_path / "repo", build_dir="/workspace/build/llama-70b")
    layout, _ = mpi.repository_layout(tmp_path / "repo")
    assert layout == _layout(recipe)
    plan = mpi.plan_for_repository(tmp_path / "repo")
    assert plan.repository == str((tmp_path / "repo").resolve())


def test_a_hand_edited_placement_is_caught_before_launch(tmp_path):
    from trtspec.triton.render import package

    package(_recipe(**CASES["6gpu-draft-tp2-target-tp4-prespawn"]), tmp_path / "repo", build_dir="/b")
    cfg = tmp_path / "repo" / "tensorrt_llm" / "config.pbtxt"
    cfg.write_text(cfg.read_text().replace('string_value: "3,4,5,6"', 'string_value: "2,3,4,5"'))
    with pytest.raises(ServerError, match=r"tensorrt_llm/config.pbtxt: participant_ids is '2,3,4,5'.*'3,4,5,6'"):
        mpi.plan_for_repository(tmp_path / "repo")


def test_a_repository_trtspec_did_not_render_is_refused(tmp_path):
    with pytest.raises(ServerError, match="not a repository trtspec rendered"):
        mpi.plan_for_repository(tmp_path)


# ---------------------------------------------------------------------------------- the runner

FAKE_MPIRUN = textwrap.dedent('''\
    #!PYTHON
    """mpirun stand-in: checks the MPMD syntax, records every app context, answers Triton's health
    endpoints on rank 0's HTTP port (and opens its metrics port) until SIGTERM; FAKE_MPIRUN_FAIL=1 fails like a rank that died."""
    import http.server, json, os, sys, threading
    args = sys.argv[1:]
    assert args[0] == "--allow-run-as-root", args
    contexts, cur = [], []
    for a in args[1:] + [":"]:
        if a == ":":
            assert cur[:2] == ["-n", "1"], cur
            env, rest = {}, cur[2:]
            while rest[0] == "-x":
                k, eq, v = rest[1].partition("=")
                env[k] = v if eq else {"from mpirun's environment": os.environ.get(k)}  # -x NAME
                rest = rest[2:]
            contexts.append({"env": env, "argv": rest})
            cur = []
        else:
            cur.append(a)
    with open(os.environ["FAKE_MPIRUN_RECORD"], "w") as f:
        json.dump({"contexts": contexts, "mpirun_preload": os.environ.get("LD_PRELOAD")}, f)
    if os.environ.get("FAKE_MPIRUN_FAIL"):
        print("rank 1: E0101 failed to load 'tensorrt_llm' version 1: CUDA out of memory", file=sys.stderr)
        sys.exit(1)
    opts = dict(a[2:].split("=", 1) for a in contexts[0]["argv"][1:] if a.startswith("--") and "=" in a)

    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path in ("/v2/health/ready", "/v2/health/live") else 404)
            self.end_headers()
        def log_message(self, *a):
            pass

    print(f"world {len(contexts)}", flush=True)
    if "metrics-port" in opts:  # rank 0's tritonserver opens its metrics port too
        metrics = http.server.HTTPServer((opts.get("metrics-address", opts["http-address"]), int(opts["metrics-port"])), H)
        threading.Thread(target=metrics.serve_forever, daemon=True).start()
    http.server.HTTPServer((opts["http-address"], int(opts["http-port"])), H).serve_forever()
''').replace("PYTHON", sys.executable)


@pytest.fixture
def fake_mpirun(tmp_path, monkeypatch):
    path = tmp_path / "bin" / "mpirun"
    path.parent.mkdir()
    path.write_text(FAKE_MPIRUN)
    path.chmod(0o755)
    record = tmp_path / "record.json"
    monkeypatch.setenv("FAKE_MPIRUN_RECORD", str(record))
    return path, record


def test_runner_starts_every_rank_waits_for_ready_and_stops(tmp_path, fake_mpirun):
    mpirun, record = fake_mpirun
    (tmp_path / "repo").mkdir()
    layout = _layout(_recipe(**CASES["6gpu-draft-tp2-target-tp4-prespawn"]))
    server = MpiTritonServer(tmp_path / "repo", layout, mpirun=str(mpirun), binary="/opt/tritonserver/bin/tritonserver",
                             workdir=tmp_path / "work", ready_timeout=20)
    with server:
        assert server.running
        e = server.endpoints
        with urllib.request.urlopen(f"{e.http}/v2/health/ready", timeout=5) as r:
            assert r.status == 200
        recorded = json.loads(record.read_text())
        cmdline = pathlib.Path(f"/proc/{server.proc.pid}/cmdline").read_bytes()
    contexts = recorded["contexts"]
    assert server.returncode is not None and not server.running
    assert len(contexts) == 7
    shim = str(server.argv_shim)
    # every rank: the orchestrator's variables, the argv shim, and the secret by name only (mpirun
    # passes its own value; mpirun itself does not preload the shim)
    assert all(c["env"] == {"TRTLLM_ORCHESTRATOR": "1", "TRTLLM_ORCHESTRATOR_SPAWN_PROCESSES": "0",
                            "LD_PRELOAD": shim, SECRET_ENV: {"from mpirun's environment": server.secret}}
               for c in contexts)
    assert recorded["mpirun_preload"] is None
    assert server.secret.encode() not in cmdline and f"-x {SECRET_ENV} ".encode().replace(b" ", b"\0") in cmdline
    assert [c["argv"] for c in contexts] == [list(r) for r in server.plan.ranks]
    # every rank closes the admin APIs (placeholders the shim fills from the secret)
    assert all(set(hidden_restricted_args()) <= set(c["argv"]) for c in contexts)
    # the plan the runner ran is the pure plan with this server's ports, binary and shm prefix
    assert server.plan == launch_plan(layout, repository=str((tmp_path / "repo").resolve()), host=e.host,
                                      grpc_port=e.grpc_port, http_port=e.http_port, metrics_port=e.metrics_port,
                                      tritonserver="/opt/tritonserver/bin/tritonserver", mpirun=str(mpirun),
                                      shm_prefix=server.shm_prefix, exit_timeout=server.exit_timeout,
                                      log_verbose=0, extra_args=tuple(hidden_restricted_args()), argv_shim=shim,
                                      controls=server.plan.controls)
    assert mpi.WATCHDOG_MPI in server.plan.controls
    assert len(set(server.plan.shm_prefixes)) == 7 and all(p.startswith(server.shm_prefix) for p in server.plan.shm_prefixes)


def test_runner_reports_a_failed_rank_with_its_log(tmp_path, fake_mpirun, monkeypatch):
    mpirun, _ = fake_mpirun
    monkeypatch.setenv("FAKE_MPIRUN_FAIL", "1")
    (tmp_path / "repo").mkdir()
    server = MpiTritonServer(tmp_path / "repo", _layout(_recipe(tp=2)), mpirun=str(mpirun),
                             binary="/opt/tritonserver/bin/tritonserver", workdir=tmp_path / "work", ready_timeout=20)
    with pytest.raises(ServerError, match=r"(?s)exited \(code 1\).*tensorrt_llm: CUDA out of memory"):
        server.start()
    assert not server.running


def test_runner_without_mpirun_says_where_to_run(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    (tmp_path / "repo").mkdir()
    server = MpiTritonServer(tmp_path / "repo", _layout(_recipe(tp=2)), binary="/opt/tritonserver/bin/tritonserver",
                             workdir=tmp_path / "work")
    with pytest.raises(ServerError, match="mpirun not found") as e:
        server.start()
    assert "--dry-run" in str(e.value)


ECHO_CONFIG = """name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "IN" data_type: TYPE_INT32 dims: [ -1 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_INT32 dims: [ -1 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
"""
ECHO_MODEL = """import json
import os

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        # record which MPI rank loaded this model, and the TRT-LLM launch variables it saw
        ranks = os.path.join(args["model_repository"], "..", "..", "ranks")
        os.makedirs(ranks, exist_ok=True)
        rank = os.environ.get("OMPI_COMM_WORLD_RANK", "none")
        with open(os.path.join(ranks, args["model_name"] + "@" + rank), "w") as f:
            json.dump({k: v for k, v in os.environ.items() if k.startswith("TRTLLM_")}, f)

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy())])
                for r in requests]
"""

REAL_LAYOUTS = {
    "leader-2-ranks": Layout(mode="leader", world_size=2,
                             placements=(Placement("tensorrt_llm", "target", 2, (0, 1)),)),
    "prespawn-3-ranks": Layout(mode="orchestrator_prespawn", world_size=3, placements=(
        Placement("tensorrt_llm_draft", "draft", 1, (0,), (1,)), Placement("tensorrt_llm", "target", 1, (0,), (2,)))),
}


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("mpirun") is None, reason="OpenMPI's mpirun is not installed (apt-get install openmpi-bin)")
@pytest.mark.parametrize("name", sorted(REAL_LAYOUTS))
def test_real_mpirun_runs_the_plan_with_the_cpu_tritonserver(tmp_path, name):
    """The plan's MPMD command under the real OpenMPI mpirun and real tritonservers: rank 0 loads
    the repository and serves; the other ranks load only the engine models, open no endpoint and
    see the launch's TRT-LLM variables; the python backends of the ranks do not collide (each rank
    has its own shared-memory prefix)."""
    from trtspec.triton.launch.paths import bundled_tritonserver

    if bundled_tritonserver() is None:
        pytest.skip("nvidia-pytriton's tritonserver is not installed")
    layout = REAL_LAYOUTS[name]
    repo = tmp_path / "repo"
    models = (*layout.engine_models, "preprocessing")
    for model in models:
        (repo / model / "1").mkdir(parents=True)
        (repo / model / "config.pbtxt").write_text(ECHO_CONFIG.format(name=model))
        (repo / model / "1" / "model.py").write_text(ECHO_MODEL)
    server = MpiTritonServer(repo, layout, workdir=tmp_path / "work", ready_timeout=90, oversubscribe=True)
    expect = {f"{m}@{r}" for r in range(layout.world_size) for m in layout.engine_models} | {"preprocessing@0"}
    with server:
        shm = sorted(p.name for p in pathlib.Path("/dev/shm").glob(server.shm_prefix + "*"))
        body = json.dumps({"inputs": [{"name": "IN", "datatype": "INT32", "shape": [3], "data": [1, 2, 3]}]}).encode()
        req = urllib.request.Request(f"{server.endpoints.http}/v2/models/tensorrt_llm/infer", data=body)
        with urllib.request.urlopen(req, timeout=10) as r:
            assert json.loads(r.read())["outputs"][0]["data"] == [1, 2, 3]
        deadline = time.monotonic() + 30  # the other ranks load on their own clock
        while {p.name for p in (tmp_path / "ranks").iterdir()} != expect and time.monotonic() < deadline:
            time.sleep(0.2)
    assert server.plan.argv[0] == "mpirun" and server.plan.layout.world_size == layout.world_size
    assert {p.name for p in (tmp_path / "ranks").iterdir()} == expect  # preprocessing on rank 0 only
    for p in (tmp_path / "ranks").iterdir():
        assert json.loads(p.read_text()) == dict(layout.env), p.name
    assert {n[len(server.shm_prefix):].split("_")[0] for n in shm} == {str(r) for r in range(layout.world_size)}
    assert not list(pathlib.Path("/dev/shm").glob(server.shm_prefix + "*"))  # cleaned up on stop


def test_with_repository_layout_keeps_single_process_repositories_and_wraps_engine_ones(tmp_path):
    from trtspec.triton.render import package
    from trtspec.triton.launch.server import TritonServer

    package(load_recipe(REPO / "build_configs" / "tiny-cpu-draft-target.yaml"), tmp_path / "cpu")
    plain = TritonServer(tmp_path / "cpu")
    assert mpi.with_repository_layout(plain) is plain
    (tmp_path / "other").mkdir()  # a repository trtspec did not render is served as it is
    other = TritonServer(tmp_path / "other")
    assert mpi.with_repository_layout(other) is other

    package(_recipe(tp=4), tmp_path / "tp4", build_dir="/b")
    single = TritonServer(tmp_path / "tp4", host="0.0.0.0", grpc_port=9001, http_port=9000, metrics_port=9002,
                          ready_timeout=600, binary="/opt/tritonserver/bin/tritonserver")
    server = mpi.with_repository_layout(single)
    assert isinstance(server, MpiTritonServer) and server.layout.world_size == 4
    assert (server.host, server.ports, server.ready_timeout, server.binary) == (
        "0.0.0.0", (9001, 9000, 9002), 600, single.binary)


# ------------------------------------------------- every launch path keeps every control (issue 30)

DRY_RUN_CASES = {
    # an engine world of 7 ranks behind TLS and a required header, bound to every address
    "dry-run-6gpu-prespawn-tls-header": dict(
        recipe=dict(tp=4, draft_tp=2, speculation={**DRAFT, "use_draft_logits": True},
                    trtllm={"gpu_device_ids": [0, 1, 2, 3], "draft_gpu_device_ids": [4, 5]}),
        tls=True, header=True, shim=True),
    # leader mode, no TLS, no header: still the admin secret on every rank, and no watchdog (said why)
    "dry-run-2gpu-leader": dict(recipe=dict(tp=2), tls=False, header=False, shim=True),
    # no C compiler: the values themselves go on the command line, and the plan says so
    "dry-run-2gpu-leader-no-shim": dict(recipe=dict(tp=2), tls=False, header=False, shim=False),
    # the single-process launch of the torch runtime: watchdog flags, HTTP on loopback under TLS
    "dry-run-single-tls-header": dict(recipe=None, tls=True, header=True, shim=True),
}
HEADER_VALUE = "gateway-value-0123456789abcdef"


def _dry_run(tmp_path, monkeypatch, case: dict, as_json: bool = False):
    from click.testing import CliRunner
    from trtspec.cli import main
    from trtspec.triton.render import package

    repo = tmp_path / "repo"
    if case["recipe"] is None:
        package(load_recipe(REPO / "build_configs" / "tiny-cpu-ngram.yaml"), repo)
    else:
        package(_recipe(**case["recipe"]), repo, build_dir="/workspace/build/llama-70b")
    shim = tmp_path / "libtrtspec_argv.so"
    shim.write_text("")
    monkeypatch.setenv("TRTSPEC_ARGV_SHIM", str(shim) if case["shim"] else str(tmp_path / "no-such-shim.so"))
    monkeypatch.setenv("TRTSPEC_REQUIRED_HEADER_VALUE", HEADER_VALUE)
    monkeypatch.delenv("TRTSPEC_HOST", raising=False)
    args = ["serve", str(repo), "--dry-run", "--host", "0.0.0.0", "--grpc-port", "8001", "--http-port", "8000",
            "--metrics-port", "8002"]
    if case["tls"]:
        for name in ("cert.pem", "key.pem", "ca.pem"):
            (tmp_path / name).write_text("")
        args += ["--tls-cert", tmp_path / "cert.pem", "--tls-key", tmp_path / "key.pem", "--tls-ca", tmp_path / "ca.pem"]
    if case["header"]:
        args += ["--require-header", "x-gateway-key"]
    res = CliRunner().invoke(main, [str(a) for a in args] + (["--json"] if as_json else []), catch_exceptions=False)
    assert res.exit_code == 0, res.output
    return res.stdout.replace(str(tmp_path), "<tmp>")


@pytest.mark.parametrize("name", sorted(DRY_RUN_CASES))
def test_the_dry_run_plan_carries_every_control_golden(name, tmp_path, monkeypatch):
    case = DRY_RUN_CASES[name]
    text = _dry_run(tmp_path, monkeypatch, case)
    plan = json.loads(_dry_run(tmp_path / "again", monkeypatch, case, as_json=True)
                      .replace("<tmp>/again", "<tmp>"))
    _golden(f"{name}.txt", text)
    mpi_world = case["recipe"] is not None
    assert HEADER_VALUE not in text
    ranks = plan["ranks"]
    for argv in ranks:  # every rank: the admin APIs closed; the required header when asked for
        assert sum(a.startswith(("--http-restricted-api=", "--grpc-restricted-protocol=")) for a in argv) == \
            2 * (1 + case["header"])
        if case["shim"]:
            assert set(hidden_restricted_args()) <= set(argv)
        else:
            assert "--http-restricted-api=model-repository,shared-memory,trace,logging:trtspec-admin-key="\
                   "<per-launch secret>" in argv
    rank0 = ranks[0]
    assert "--grpc-address=0.0.0.0" in rank0 and "--metrics-address=0.0.0.0" in rank0
    # Triton 2.51 has no HTTP TLS: under TLS, HTTP binds loopback
    assert f"--http-address={'127.0.0.1' if case['tls'] else '0.0.0.0'}" in rank0
    assert ("--grpc-use-ssl-mutual=true" in rank0) == case["tls"]
    controls = "\n".join(plan["controls"])
    if mpi_world:
        assert mpi.WATCHDOG_MPI in plan["controls"]
        if case["shim"]:  # each app context exports the shim and the secret's name (never its value)
            contexts = " ".join(plan["argv"]).split(" : ")
            assert all("-x LD_PRELOAD=<tmp>/libtrtspec_argv.so -x TRTSPEC_LAUNCH_SECRET" in c for c in contexts)
    else:
        assert "--model-control-mode=explicit" in rank0 and "watchdog: on" in controls
    assert ("secrets on the command line: none" in controls) == case["shim"]
    if not case["shim"]:
        assert "install gcc" in controls


def test_serve_says_an_mpi_world_has_no_watchdog(tmp_path, fake_mpirun, capfd):
    from trtspec.triton.launch.server import TritonServer
    from trtspec.triton.launch.watchdog import WatchdogSettings
    from trtspec.triton.render import package

    mpirun, _ = fake_mpirun
    package(_recipe(tp=2), tmp_path / "tp2", build_dir="/b")
    plain = TritonServer(tmp_path / "tp2", binary="/opt/tritonserver/bin/tritonserver", workdir=tmp_path / "work",
                         watchdog=WatchdogSettings(), ready_timeout=20)
    server = mpi.with_repository_layout(plain)
    server.mpirun = str(mpirun)
    with server:
        assert server.watchdog is None
    assert mpi.WATCHDOG_MPI in capfd.readouterr().err
