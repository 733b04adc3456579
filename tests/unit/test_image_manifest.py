"""The serving image and the manifests agree (issue 30): docker/Dockerfile's ENTRYPOINT/CMD and the
command/args of every pod `trtspec deploy k8s` writes, combined the way Kubernetes does (a
container's ``command`` replaces the image's ENTRYPOINT, its ``args`` replace CMD; ``command``
without ``args`` drops CMD), start tritonserver (or mpirun over tritonservers) with the flags
docs/scaleout.md and docs/security.md describe. An ENTRYPOINT of ``["trtspec"]`` made every pod run
``trtspec tritonserver ...`` and crash-loop: the checker catches it."""

from __future__ import annotations

import json
import pathlib
import re
import shlex

import pytest
import yaml

from trtspec.config import load_recipe, parse_recipe, recipe_to_dict
from trtspec.deploy.k8s import EXIT_TIMEOUT_S, K8sOptions, k8s_files
from trtspec.triton.access import ARGV_SHIM_ENV, IMAGE_ARGV_SHIM, SECRET_ENV, hidden_restricted_args
from trtspec.triton.placement import layout_for
from trtspec.trtllm.plan import make_plan

REPO = pathlib.Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "docker" / "Dockerfile"
NVIDIA_ENTRYPOINT = "/opt/nvidia/nvidia_entrypoint.sh"  # NGC images' entrypoint: sets up, then execs "$@"


def image_config(text: str) -> dict:
    """ENTRYPOINT, CMD and ENV of the final stage of a Dockerfile (exec form only: a shell-form
    ENTRYPOINT would ignore the pod's args). Unset ENTRYPOINT/CMD: inherited from the base (None)."""
    joined = re.sub(r"\\\n", " ", text)
    stage: dict = {}
    for line in joined.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        word, _, rest = line.partition(" ")
        word = word.upper()
        if word == "FROM":
            stage = {"ENTRYPOINT": None, "CMD": None, "ENV": {}}
        elif word in ("ENTRYPOINT", "CMD"):
            value = json.loads(rest)  # exec form; a shell form fails here on purpose
            assert isinstance(value, list) and all(isinstance(v, str) for v in value), line
            stage[word] = value
            if word == "ENTRYPOINT":
                stage["CMD"] = None  # Docker resets CMD when ENTRYPOINT is set
        elif word == "ENV":
            k, _, v = rest.partition("=")
            stage["ENV"][k.strip()] = v.strip()
    return stage


def effective_argv(image: dict, container: dict, base_entrypoint: list[str] | None = None) -> list[str]:
    """The argv a container runs (Kubernetes: command replaces ENTRYPOINT, args replace CMD;
    command without args ignores CMD)."""
    entrypoint = image["ENTRYPOINT"] if image["ENTRYPOINT"] is not None else (base_entrypoint or [])
    cmd = image["CMD"] or []
    if "command" in container:
        return list(container["command"]) + list(container.get("args", []))
    return list(entrypoint) + list(container["args"] if "args" in container else cmd)


def exec_after_entrypoint(argv: list[str]) -> list[str]:
    """NVIDIA's entrypoint execs its arguments; anything else runs as it is."""
    return argv[1:] if argv and argv[0] == NVIDIA_ENTRYPOINT else argv


def tritonserver_contexts(argv: list[str]) -> list[tuple[dict[str, str | None], list[str]]]:
    """[(env given with -x, tritonserver argv)] of ``tritonserver ...`` or ``mpirun ... : ...``."""
    if argv[0] == "tritonserver":
        return [({}, argv)]
    assert argv[0] == "mpirun", f"the pod runs {shlex.join(argv[:3])} ..., not tritonserver or mpirun"
    out, rest = [], argv[1:]
    while rest and rest[0].startswith("--"):  # mpirun's own options
        rest = rest[1:]
    for ctx in _split_contexts(rest):
        env: dict[str, str | None] = {}
        assert ctx[:2] == ["-n", "1"], ctx[:4]
        ctx = ctx[2:]
        while ctx[0] == "-x":
            k, eq, v = ctx[1].partition("=")
            env[k] = v if eq else None
            ctx = ctx[2:]
        out.append((env, ctx))
    return out


def _split_contexts(rest: list[str]) -> list[list[str]]:
    out, cur = [], []
    for a in rest:
        if a == ":":
            out.append(cur)
            cur = []
        else:
            cur.append(a)
    return out + [cur]


def check_pod(image: dict, container: dict, *, repository_prefix: str, header: str | None) -> list[str]:
    """Problems of one pod (empty: it starts tritonserver with the documented flags)."""
    argv = exec_after_entrypoint(effective_argv(image, container))
    if not argv or argv[0] not in ("tritonserver", "mpirun"):
        return [f"the pod runs {shlex.join(argv[:3])} ..., not tritonserver (or mpirun over tritonservers)"]
    problems = []
    env = {e["name"]: e.get("value") for e in container.get("env", [])}
    shim = image["ENV"].get(ARGV_SHIM_ENV)
    if env.get("LD_PRELOAD") != shim:
        problems.append(f"LD_PRELOAD is {env.get('LD_PRELOAD')!r}, the image's shim is {shim!r}")
    if SECRET_ENV not in env:
        problems.append(f"no {SECRET_ENV} from the app's Secret")
    contexts = tritonserver_contexts(argv)
    for rank, (xenv, targv) in enumerate(contexts):
        if targv[0] != "tritonserver":
            problems.append(f"rank {rank} runs {targv[0]}")
        flags = set(targv[1:])
        if not any(f.startswith(f"--model-repository={repository_prefix}") for f in flags):
            problems.append(f"rank {rank}: no --model-repository under {repository_prefix}")
        if not set(hidden_restricted_args()) <= flags:
            problems.append(f"rank {rank}: the admin APIs are not closed behind the pod's secret")
        if header and not any(f.startswith("--grpc-restricted-protocol=@trtspec@inference,") and f":{header}=" in f
                              for f in flags):
            problems.append(f"rank {rank}: the required header {header} is not enforced")
        if f"--exit-timeout-secs={EXIT_TIMEOUT_S}" not in flags:
            problems.append(f"rank {rank}: no graceful drain of {EXIT_TIMEOUT_S} s")
        if any("$(" in f for f in flags):
            problems.append(f"rank {rank}: a $(VAR) Kubernetes would expand into the command line")
        if rank == 0:
            want = {"--http-address=0.0.0.0", "--http-port=8000", "--grpc-address=0.0.0.0", "--grpc-port=8001",
                    "--metrics-address=0.0.0.0", "--metrics-port=8002"}
            if not want <= flags:
                problems.append(f"rank 0 lacks {sorted(want - flags)}")
        else:
            want = {"--allow-http=false", "--allow-grpc=false", "--allow-metrics=false", "--model-control-mode=explicit"}
            if not want <= flags:
                problems.append(f"rank {rank} lacks {sorted(want - flags)}")
        if len(contexts) > 1 and (xenv.get("LD_PRELOAD") != shim or SECRET_ENV not in xenv or xenv[SECRET_ENV]):
            problems.append(f"rank {rank}: mpirun does not export the shim and the secret's name (-x)")
    return problems


BUILD = pathlib.Path("/workspace/build")
CASES = {
    "llama3.3-70b-5gpu": "llama3.3-70b-draft-target-fp8-trtllm.yaml",
    "llama3.1-70b-tp8-8gpu": "llama3.1-70b-tp8-draft-target-fp8-trtllm.yaml",
    "tiny-cpu": "tiny-cpu-draft-target.yaml",
}


def _pods(recipe_file: str, header: str | None = None):
    recipe = load_recipe(REPO / "build_configs" / recipe_file)
    if header:
        d = recipe_to_dict(recipe)
        d["serving"]["require_header"] = header
        recipe = parse_recipe(d)
    build = make_plan(recipe, BUILD / recipe.name).handoff if recipe.runtime.backend != "torch" else None
    layout = layout_for(recipe, build)
    base = f"/workspace/deploy/{recipe.name}"
    files = k8s_files(recipe, layout, repository=f"{base}/repository", baseline_repository=f"{base}/repository-baseline",
                      opts=K8sOptions())
    for track in ("speculative", "baseline"):
        for o in yaml.safe_load_all(files[f"k8s/{track}.yaml"]):
            if o["kind"] == "Deployment":
                yield base, o["spec"]["template"]["spec"]["containers"][0]


@pytest.mark.parametrize("header", [None, "x-gateway-key"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_every_pod_of_the_image_starts_tritonserver_with_the_documented_flags(case, header):
    image = image_config(DOCKERFILE.read_text())
    assert image["ENV"].get(ARGV_SHIM_ENV) == IMAGE_ARGV_SHIM  # where k8s.py preloads it from
    pods = list(_pods(CASES[case], header))
    assert len(pods) == 2
    for base, container in pods:
        assert check_pod(image, container, repository_prefix=base, header=header) == []


def test_the_image_installs_the_shim_where_the_pods_preload_it():
    text = DOCKERFILE.read_text()
    assert f"COPY --from=wheel /shim/libtrtspec_argv.so {IMAGE_ARGV_SHIM}" in text
    assert "trtspec/triton/launch/argv_secrets.c" in text


def test_docker_run_with_a_trtspec_command_and_without_one():
    image = image_config(DOCKERFILE.read_text())
    # `docker run IMAGE trtspec serve REPO` (the arguments replace CMD) and `docker run IMAGE`
    assert exec_after_entrypoint(effective_argv(image, {"args": ["trtspec", "serve", "/r"]})) == \
        ["trtspec", "serve", "/r"]
    assert exec_after_entrypoint(effective_argv(image, {})) == ["trtspec", "--help"]


def test_the_old_entrypoint_is_caught():
    old = DOCKERFILE.read_text().replace(f'ENTRYPOINT ["{NVIDIA_ENTRYPOINT}"]', 'ENTRYPOINT ["trtspec"]')
    old = old.replace('CMD ["trtspec", "--help"]', 'CMD ["--help"]')
    image = image_config(old)
    base, container = next(_pods(CASES["tiny-cpu"]))
    (problem,) = check_pod(image, container, repository_prefix=base, header=None)
    assert "the pod runs trtspec tritonserver" in problem
    # and a pod whose secret is expanded by Kubernetes into argv is caught too
    image = image_config(DOCKERFILE.read_text())
    leaky = {**container, "args": [a.replace("{" + SECRET_ENV + "}", f"$({SECRET_ENV})").replace("@trtspec@", "")
                                   for a in container["args"]]}
    assert any("admin APIs" in p for p in check_pod(image, leaky, repository_prefix=base, header=None))
