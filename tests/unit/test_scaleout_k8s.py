"""Kubernetes manifests (trtspec.deploy.k8s): goldens; every object validated against the Kubernetes
JSON schemas (kubernetes-validate, strict: unknown fields fail) and the Istio VirtualService against
Istio's API model (cloudcoil-models-istio; a field it does not know fails), the ServiceMonitor and
PrometheusRule against the Prometheus Operator's (cloudcoil-models-prometheus-operator); deliberately broken
manifests fail; cross-object wiring (selectors, ports, autoscaler targets, route hosts); GPU
requests equal the launch plan's world; rollout.sh patches the weights; the deployment folder.

Regenerate the goldens after an intended change with
``TRTSPEC_UPDATE_GOLDEN=1 pytest tests/unit/test_scaleout_k8s.py`` and review the diff.
"""

from __future__ import annotations

import copy
import functools
import json
import os
import pathlib
import re
import subprocess

import pytest
import yaml

from trtspec.config import load_recipe, parse_recipe, recipe_to_dict
from trtspec.deploy.k8s import (RULES_FILE, K8sOptions, admin_secret_name, app_name, k8s_files, liveness_command,
                                pod_server_args, secret_command, serving_image, write_k8s)
from trtspec.triton.access import IMAGE_ARGV_SHIM, REQUIRED_HEADER_ENV, SECRET_ENV
from trtspec.errors import ConfigError, StageError
from trtspec.triton.launch.mpi import launch_plan
from trtspec.triton.placement import layout_for
from trtspec.trtllm.plan import make_plan
from tests.goldens import check_golden

kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="pip install -e '.[dev]' (kubernetes-validate)")
istio_v1 = pytest.importorskip("cloudcoil.models.istio.networking.v1", reason="pip install -e '.[dev]' (cloudcoil-models-istio)")
istio_security = pytest.importorskip("cloudcoil.models.istio.security.v1", reason="pip install -e '.[dev]' (cloudcoil-models-istio)")
prom_operator = pytest.importorskip("cloudcoil.models.prometheus_operator.v1",
                                    reason="pip install -e '.[dev]' (cloudcoil-models-prometheus-operator)")
ISTIO = {"VirtualService": istio_v1.VirtualService, "PeerAuthentication": istio_security.PeerAuthentication,
         "AuthorizationPolicy": istio_security.AuthorizationPolicy}
# custom resources the Kubernetes schemas do not know: checked against their API models the same way
CRDS = {**ISTIO, "ServiceMonitor": prom_operator.ServiceMonitor, "PrometheusRule": prom_operator.PrometheusRule}

REPO = pathlib.Path(__file__).resolve().parents[2]
GOLDEN = REPO / "tests" / "golden" / "scaleout" / "k8s"
K8S_VERSIONS = ("1.30.0", kubernetes_validate.utils.latest_version())
# the schema files are large and read on every call: read each once
kubernetes_validate.utils.schema_contents = functools.lru_cache(maxsize=None)(kubernetes_validate.utils.schema_contents)


def _golden(name: str, text: str) -> None:
    check_golden(GOLDEN / name, text)


# ---------------------------------------------------------------------------------- schema validation


def validate_object(obj: dict) -> None:
    """Raise unless ``obj`` is valid for its kind's published schema."""
    if obj.get("kind") in CRDS:
        model = CRDS[obj["kind"]].model_validate(obj)  # types and enums
        back = model.model_dump(mode="json", by_alias=True, exclude_unset=True)
        if back != obj:  # the model drops what it does not know: a typo or a wrong nesting
            raise ValueError(f"{obj['kind']} has fields its schema does not define: {_diff(obj, back)}")
        return
    for version in K8S_VERSIONS:
        kubernetes_validate.validate(obj, version, strict=True)


def _diff(a, b, path=""):
    if isinstance(a, dict) and isinstance(b, dict):
        for k in a:
            if k not in b:
                return f"{path}.{k}"
            d = _diff(a[k], b[k], f"{path}.{k}")
            if d:
                return d
    elif isinstance(a, list) and isinstance(b, list):
        for i, (x, y) in enumerate(zip(a, b)):
            d = _diff(x, y, f"{path}[{i}]")
            if d:
                return d
    elif a != b:
        return path
    return None


def objects(files: dict[str, str]) -> list[dict]:
    return [o for path, text in files.items() if path.startswith(("k8s/", "monitoring/"))
            for o in yaml.safe_load_all(text) if o]


# ---------------------------------------------------------------------------------- cases

BUILD = pathlib.Path("/workspace/build")


def _case(recipe_file: str, opts: dict | None = None):
    opts = opts or {}
    recipe = load_recipe(REPO / "build_configs" / recipe_file)
    build = make_plan(recipe, BUILD / recipe.name).handoff if recipe.runtime.backend != "torch" else None
    layout = layout_for(recipe, build)
    base = f"/workspace/deploy/{recipe.name}"
    files = k8s_files(recipe, layout, repository=f"{base}/repository", baseline_repository=f"{base}/repository-baseline",
                      opts=K8sOptions(**opts))
    return recipe, layout, files


CASES = {
    # target TP4 + draft on a fifth GPU: 5 GPUs per pod, orchestrator mode
    "llama3.3-70b-5gpu": ("llama3.3-70b-draft-target-fp8-trtllm.yaml", dict(speculative_weight=10)),
    # one 8-GPU node per pod, prespawned world of 10, an existing claim, autoscaling to 8 nodes
    "llama3.1-70b-tp8-8gpu": ("llama3.1-70b-tp8-draft-target-fp8-trtllm.yaml",
                              dict(namespace="llm", pvc="models", replicas=2, max_replicas=8, cpu="64", memory="512Gi")),
    # the CPU demo: no GPU, N replicas of the torch runtime
    "tiny-cpu": ("tiny-cpu-draft-target.yaml", dict(name="tiny", replicas=3, max_replicas=6, target_pending_requests=4,
                                                    shm_size="1Gi", storage="10Gi", storage_class="nfs")),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_manifests_match_golden(case):
    recipe_file, opts = CASES[case]
    _, _, files = _case(recipe_file, opts)
    for path, text in sorted(files.items()):
        _golden(f"{case}/{path}", text)


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_object_validates_against_its_schema(case):
    recipe_file, opts = CASES[case]
    _, _, files = _case(recipe_file, opts)
    objs = objects(files)
    assert {o["kind"] for o in objs} >= {"Deployment", "Service", "HorizontalPodAutoscaler", "VirtualService",
                                         "ServiceMonitor", "PrometheusRule"}
    for o in objs:
        validate_object(o)
    yaml.safe_load(files["prometheus-adapter-values.yaml"])


def _deployment(files, track="speculative"):
    return next(o for o in yaml.safe_load_all(files[f"k8s/{track}.yaml"]) if o["kind"] == "Deployment")


def _container(o):
    return o["spec"]["template"]["spec"]["containers"][0]


def _rename(d, old, new):
    d[new] = d.pop(old)


BROKEN = {  # kind → how to break it
    "replicas is not an integer": ("Deployment", lambda o: o["spec"].__setitem__("replicas", "two")),
    "misspelled probe key": ("Deployment", lambda o: _rename(_container(o), "readinessProbe", "readinessProbes")),
    "container without an image name": ("Deployment", lambda o: _container(o).pop("name")),
    "gpu limit is not a quantity": ("Deployment", lambda o: _container(o)["resources"]["limits"].__setitem__(
        "nvidia.com/gpu", [5])),
    "autoscaler target of no type": ("HorizontalPodAutoscaler", lambda o: o["spec"]["metrics"][0]["pods"][
        "target"].pop("type")),
    "autoscaler without maxReplicas": ("HorizontalPodAutoscaler", lambda o: o["spec"].pop("maxReplicas")),
    "service port as text": ("Service", lambda o: o["spec"]["ports"][0].__setitem__("port", "eight thousand")),
    "claim with a misspelled access mode key": ("PersistentVolumeClaim", lambda o: _rename(
        o["spec"], "accessModes", "accessMode")),
    "route weight misspelled": ("VirtualService", lambda o: _rename(o["spec"]["http"][0]["route"][0], "weight", "wieght")),
    "route weight not a number": ("VirtualService", lambda o: o["spec"]["http"][0]["route"][0].__setitem__(
        "weight", "ninety")),
    "route destination nested wrongly": ("VirtualService", lambda o: o["spec"]["http"][0].__setitem__(
        "destination", o["spec"]["http"][0].pop("route")[0]["destination"])),
    "scrape endpoint port misspelled": ("ServiceMonitor", lambda o: _rename(o["spec"]["endpoints"][0], "port", "prot")),
    "alert expression under a misspelled key": ("PrometheusRule", lambda o: _rename(
        o["spec"]["groups"][1]["rules"][0], "expr", "expression")),
    "alert's for not a duration": ("PrometheusRule", lambda o: o["spec"]["groups"][1]["rules"][0].__setitem__(
        "for", "ten minutes")),
}


@pytest.mark.parametrize("breakage", sorted(BROKEN))
def test_a_broken_manifest_fails_validation(breakage):
    """The validator really validates: each object passes as written and fails once broken."""
    import pydantic

    kind, breaks = BROKEN[breakage]
    _, _, files = _case(*CASES["llama3.3-70b-5gpu"])
    obj = next(o for o in objects(files) if o["kind"] == kind)
    validate_object(obj)
    broken = copy.deepcopy(obj)
    breaks(broken)
    with pytest.raises((kubernetes_validate.ValidationError, pydantic.ValidationError, ValueError)):
        validate_object(broken)


# ---------------------------------------------------------------------------------- wiring


@pytest.mark.parametrize("case", sorted(CASES))
def test_objects_are_wired_to_each_other(case):
    recipe_file, opts = CASES[case]
    recipe, _, files = _case(recipe_file, opts)
    objs = objects(files)
    by = {(o["kind"], o["metadata"]["name"]): o for o in objs}
    deployments = [o for o in objs if o["kind"] == "Deployment"]
    services = [o for o in objs if o["kind"] == "Service"]
    for o in objs:
        assert re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", o["metadata"]["name"]) and len(o["metadata"]["name"]) <= 63
    for d in deployments:
        pod = d["spec"]["template"]
        assert d["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
        c = pod["spec"]["containers"][0]
        names = {p["name"] for p in c["ports"]}
        assert c["readinessProbe"]["httpGet"]["port"] == "http"
        assert c["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
        assert c["livenessProbe"]["exec"]["command"][:2] == ["python3", "-c"]  # a request (tests/unit/test_security_k8s.py)
        claims = {v["persistentVolumeClaim"]["claimName"] for v in pod["spec"]["volumes"] if "persistentVolumeClaim" in v}
        assert claims == {opts.get("pvc") or f"{app_name(recipe.name, opts.get('name'))}-models"}
        assert ("PersistentVolumeClaim", next(iter(claims))) in by or opts.get("pvc")
        hpa = by[("HorizontalPodAutoscaler", d["metadata"]["name"])]
        assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": d["metadata"]["name"]}
        svc = by[("Service", d["metadata"]["name"])]
        assert svc["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
        assert {p["targetPort"] for p in svc["spec"]["ports"]} <= names
    entry = [s for s in services if "trtspec/track" not in s["spec"]["selector"]]
    assert len(entry) == 1 and all(entry[0]["spec"]["selector"].items() <= d["spec"]["template"]["metadata"]["labels"].items()
                                   for d in deployments)
    vs = next(o for o in objs if o["kind"] == "VirtualService")
    ns = opts.get("namespace", "default")
    service_hosts = {f"{s['metadata']['name']}.{ns}.svc.cluster.local": {p["port"] for p in s["spec"]["ports"]}
                     for s in services}
    assert vs["spec"]["hosts"] == [f"{entry[0]['metadata']['name']}.{ns}.svc.cluster.local"]
    for http in vs["spec"]["http"]:
        assert sum(r["weight"] for r in http["route"]) == 100
        port = http["match"][0]["port"]
        for r in http["route"]:
            assert port in service_hosts[r["destination"]["host"]] and r["destination"]["port"]["number"] == port
    assert [r["weight"] for r in vs["spec"]["http"][0]["route"]] == [100 - opts.get("speculative_weight", 0),
                                                                      opts.get("speculative_weight", 0)]
    # the ServiceMonitor scrapes exactly the two track Services, on their metrics port, which the
    # NetworkPolicy opens to the monitoring namespace
    sm = next(o for o in objs if o["kind"] == "ServiceMonitor")
    sel = sm["spec"]["selector"]
    picked = [s for s in services if sel["matchLabels"].items() <= s["metadata"]["labels"].items()
              and all(s["metadata"]["labels"].get(e["key"]) in e["values"] for e in sel["matchExpressions"])]
    assert sorted(s["metadata"]["name"] for s in picked) == sorted(d["metadata"]["name"] for d in deployments)
    assert sm["spec"]["namespaceSelector"]["matchNames"] == [ns]
    (ep,) = sm["spec"]["endpoints"]
    assert all(ep["port"] in {p["name"] for p in s["spec"]["ports"]} for s in picked)
    metrics_port = next(p["port"] for p in picked[0]["spec"]["ports"] if p["name"] == ep["port"])
    netpol = next(o for o in objs if o["kind"] == "NetworkPolicy")
    assert any(r["from"] == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": opts.get(
        "monitoring_namespace", "monitoring")}}}] and {"protocol": "TCP", "port": metrics_port} in r["ports"]
        for r in netpol["spec"]["ingress"])
    # the labels the rules group by come from the Services' labels
    targets = {r["targetLabel"]: r["sourceLabels"] for r in ep["relabelings"]}
    assert targets == {"app": ["__meta_kubernetes_service_label_app_kubernetes_io_name"],
                       "track": ["__meta_kubernetes_service_label_trtspec_track"]}
    # the PrometheusRule carries the shipped rules, unchanged
    rule = next(o for o in objs if o["kind"] == "PrometheusRule")
    assert rule["spec"]["groups"] == yaml.safe_load(RULES_FILE.read_text())["groups"]
    assert rule["metadata"]["namespace"] == ns


@pytest.mark.parametrize("case", sorted(CASES))
def test_pods_ask_for_the_gpus_and_run_the_command_of_the_launch_plan(case):
    recipe_file, opts = CASES[case]
    recipe, layout, files = _case(recipe_file, opts)
    for track in ("speculative", "baseline"):
        c = _deployment(files, track)["spec"]["template"]["spec"]["containers"][0]
        gpus = c.get("resources", {}).get("limits", {}).get("nvidia.com/gpu", 0)
        assert gpus == len(layout.gpus)
        repo = f"/workspace/deploy/{recipe.name}/" + ("repository" if track == "speculative" else "repository-baseline")
        plan = launch_plan(layout, repository=repo, exit_timeout=30, extra_args=pod_server_args(recipe),
                           argv_shim=IMAGE_ARGV_SHIM)
        assert c["args"] == list(plan.argv)
        # every rank closes the admin APIs behind the pod's secret: a placeholder the image's argv
        # shim fills from the container's environment (the app's Secret), so the value is in no file
        # trtspec writes and on no command line (not $(VAR), which Kubernetes puts into argv)
        for rank in plan.ranks:
            assert f"--grpc-restricted-protocol=@trtspec@model-repository,shared-memory,trace,logging:" \
                   f"trtspec-admin-key={{{SECRET_ENV}}}" in rank
        assert "$(" not in " ".join(c["args"])
        assert {"name": "LD_PRELOAD", "value": IMAGE_ARGV_SHIM} in c["env"]
        if layout.mode != "single":  # each MPI app context exports the shim and the secret's name
            assert c["args"].count(f"LD_PRELOAD={IMAGE_ARGV_SHIM}") == layout.world_size
            assert c["args"].count(SECRET_ENV) == layout.world_size
        assert {"name": SECRET_ENV, "valueFrom": {"secretKeyRef": {"name": admin_secret_name(_deployment(files, track)["metadata"]["labels"]["app.kubernetes.io/name"]),
                                                                   "key": "admin-key"}}} in c["env"]
        # the trtspec serving image docker/Dockerfile builds on the recipe's NVIDIA base (make image)
        assert c["image"] == serving_image(recipe)
    if case == "llama3.1-70b-tp8-8gpu":
        assert layout.world_size == 10 and len(layout.gpus) == 8
        args = _deployment(files)["spec"]["template"]["spec"]["containers"][0]["args"]
        assert args.count(":") == 9 and args.count("--load-model=tensorrt_llm_draft") == 9


def test_default_image_is_the_trtspec_image_built_on_the_recipe_base():
    from trtspec import __version__

    recipe = load_recipe(REPO / "build_configs" / "llama3.1-8b-eagle3-fp8-trtllm.yaml")
    assert recipe.runtime.trtllm.container_image == "nvcr.io/nvidia/tritonserver:25.12-trtllm-python-py3"
    assert serving_image(recipe) == f"trtspec-triton:{__version__}-25.12"
    assert serving_image(recipe, registry="reg.example.com/ml/") == f"reg.example.com/ml/trtspec-triton:{__version__}-25.12"
    # the Dockerfile's default base and the Makefile's image target agree with the recipe
    dockerfile = (REPO / "docker" / "Dockerfile").read_text()
    assert f"ARG BASE_IMAGE={recipe.runtime.trtllm.container_image}" in dockerfile
    assert "serving_image" in (REPO / "Makefile").read_text()


# ---------------------------------------------------------------------------------- rollout.sh


def _fake_kubectl(tmp_path) -> tuple[dict, pathlib.Path]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    record = tmp_path / "kubectl.json"
    kubectl = bin_dir / "kubectl"
    kubectl.write_text(f"#!{os.sys.executable}\nimport json, sys\njson.dump(sys.argv[1:], open({str(record)!r}, 'w'))\n")
    kubectl.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    return env, record


def _apply_patch(doc: dict, ops: list[dict]) -> dict:
    doc = copy.deepcopy(doc)
    for op in ops:
        assert op["op"] == "replace"
        *parents, last = [int(p) if p.isdigit() else p for p in op["path"].strip("/").split("/")]
        node = doc
        for p in parents:
            node = node[p]
        assert last in node if isinstance(node, dict) else last < len(node)
        node[last] = op["value"]
    return doc


@pytest.mark.parametrize("percent", [0, 10, 100])
def test_rollout_script_shifts_the_weights_with_one_kubectl_patch(tmp_path, percent):
    _, _, files = _case(*CASES["llama3.1-70b-tp8-8gpu"])
    script = tmp_path / "rollout.sh"
    script.write_text(files["rollout.sh"])
    script.chmod(0o755)
    env, record = _fake_kubectl(tmp_path)
    subprocess.run([str(script), str(percent)], env=env, check=True, timeout=30)
    argv = json.loads(record.read_text())
    assert argv[:6] == ["-n", "llm", "patch", "virtualservice", "llama3-1-70b-tp8-draft-target-fp8", "--type=json"]
    assert argv[6] == "-p"
    vs = next(o for o in objects(files) if o["kind"] == "VirtualService")
    patched = _apply_patch(vs, json.loads(argv[7]))
    validate_object(patched)
    for http in patched["spec"]["http"]:
        weights = {r["destination"]["host"].split(".")[0].rsplit("-", 1)[1]: r["weight"] for r in http["route"]}
        assert weights == {"baseline": 100 - percent, "speculative": percent}


@pytest.mark.parametrize("bad", ["", "abc", "101", "-5", "10.5"])
def test_rollout_script_refuses_a_bad_percentage_without_calling_kubectl(tmp_path, bad):
    _, _, files = _case(*CASES["llama3.3-70b-5gpu"])
    script = tmp_path / "rollout.sh"
    script.write_text(files["rollout.sh"])
    script.chmod(0o755)
    env, record = _fake_kubectl(tmp_path)
    res = subprocess.run([str(script), bad], env=env, capture_output=True, text=True, timeout=30)
    assert res.returncode == 2 and "0-100" in res.stderr
    assert not record.exists()


# ---------------------------------------------------------------------------------- errors


def test_gpu_ids_a_pod_cannot_see_are_refused():
    d = recipe_to_dict(load_recipe(REPO / "build_configs" / "llama3.3-70b-draft-target-fp8-trtllm.yaml"))
    d["runtime"]["trtllm"]["gpu_device_ids"] = [4, 5, 6, 7]
    d["runtime"]["trtllm"]["draft_gpu_device_ids"] = [4]
    recipe = parse_recipe(d)
    layout = layout_for(recipe, make_plan(recipe, BUILD / "x").handoff)
    with pytest.raises(ConfigError, match=r"runtime.trtllm.gpu_device_ids.*devices 0\.\.3"):
        k8s_files(recipe, layout, repository="/r", baseline_repository="/b", opts=K8sOptions())


def test_a_torch_recipe_must_say_cpu_or_cuda():
    d = recipe_to_dict(load_recipe(REPO / "build_configs" / "tiny-cpu-draft-target.yaml"))
    d["runtime"]["device"] = "auto"
    recipe = parse_recipe(d)
    with pytest.raises(ConfigError, match="runtime.device"):
        k8s_files(recipe, layout_for(recipe), repository="/r", baseline_repository="/b", opts=K8sOptions())


@pytest.mark.parametrize("opts, flag", [
    (dict(speculative_weight=101), "--speculative-weight"),
    (dict(replicas=3, max_replicas=2), "--max-replicas"),
    (dict(storage="lots"), "--storage"),
    (dict(namespace="LLM"), "--namespace"),
    (dict(mount_path="workspace"), "--mount-path"),
    (dict(target_queue_ms=0), "--target-queue-ms"),
])
def test_bad_options_name_the_option(opts, flag):
    with pytest.raises(ConfigError, match=re.escape(flag)):
        K8sOptions(**opts).check()


def test_long_recipe_names_need_a_shorter_name():
    assert app_name("llama3.3-70b_Draft") == "llama3-3-70b-draft"
    with pytest.raises(ConfigError, match="--name"):
        app_name("x" * 60)


# ---------------------------------------------------------------------------------- the folder


def test_write_k8s_for_the_cpu_demo(tmp_path):
    d = recipe_to_dict(load_recipe(REPO / "build_configs" / "tiny-cpu-draft-target.yaml"))
    d["target"]["model"] = str(tmp_path / "models" / "tiny-target")  # on the volume (read by the pods only)
    d["speculation"]["draft"]["model"] = str(tmp_path / "models" / "tiny-draft")
    recipe = parse_recipe(d)
    res = write_k8s(recipe, tmp_path / "deploy", opts=K8sOptions(mount_path=str(tmp_path), replicas=2))
    out = tmp_path / "deploy"
    assert sorted(p.relative_to(out).as_posix() for p in out.iterdir()) == [
        "k8s", "monitoring", "prometheus-adapter-values.yaml", "repository", "repository-baseline", "rollout.sh",
        "trtspec.json"]
    assert os.access(out / "rollout.sh", os.X_OK)
    m = json.loads((out / "trtspec.json").read_text())
    assert m["kind"] == "k8s-deployment" and m["gpus_per_pod"] == 0 and m["launch"]["mode"] == "single"
    assert m["commands"]["rollback"] == f"{out / 'rollout.sh'} 0"
    spec = json.loads((out / "repository" / "trtspec.json").read_text())
    base = json.loads((out / "repository-baseline" / "trtspec.json").read_text())
    assert spec["routing"]["speculative_fraction"] == 1.0 and base["routing"]["speculative_fraction"] == 0.0
    assert set(spec["models"]) == set(base["models"])  # the same pod, speculation switched off at the router
    args = _deployment({"k8s/speculative.yaml": (out / "k8s" / "speculative.yaml").read_text()})[
        "spec"]["template"]["spec"]["containers"][0]["args"]
    assert f"--model-repository={out / 'repository'}" in args
    assert res.gpus_per_pod == 0 and not list(tmp_path.glob(".deploy.tmp-*"))


def test_write_k8s_for_an_8gpu_engine_build(tmp_path):
    from trtspec.triton.launch.mpi import repository_layout

    recipe = load_recipe(REPO / "build_configs" / "llama3.1-70b-tp8-draft-target-fp8-trtllm.yaml")
    d = recipe_to_dict(recipe)  # the models sit on the volume too (their paths are only read by the pods)
    d["target"]["model"] = str(tmp_path / "models" / "Llama-3.1-70B-Instruct")
    d["speculation"]["draft"]["model"] = str(tmp_path / "models" / "Llama-3.2-1B-Instruct")
    recipe = parse_recipe(d)
    res = write_k8s(recipe, tmp_path / "deploy", build_dir=tmp_path / "build",
                    opts=K8sOptions(mount_path=str(tmp_path)))
    assert res.gpus_per_pod == 8 and res.layout.mode == "orchestrator_prespawn"
    for repo in ("repository", "repository-baseline"):
        layout, _ = repository_layout(tmp_path / "deploy" / repo)  # configs agree with the plan
        assert layout == res.layout


def test_write_k8s_refuses_paths_the_pods_cannot_read(tmp_path):
    recipe = load_recipe(REPO / "build_configs" / "llama3.1-70b-tp8-draft-target-fp8-trtllm.yaml")
    with pytest.raises(StageError, match="deployment folder"):
        write_k8s(recipe, tmp_path / "deploy", build_dir=tmp_path / "build", opts=K8sOptions(mount_path="/workspace"))
    with pytest.raises(StageError, match=r"pods read the tokenizer at /workspace/models") as e:
        write_k8s(recipe, tmp_path / "deploy", build_dir=tmp_path / "build", opts=K8sOptions(mount_path=str(tmp_path)))
    assert "--mount-path" in str(e.value)
    assert not (tmp_path / "deploy").exists()


def test_the_yaml_in_docs_scaleout_validates():
    """The workspace volume and pod that docs/scaleout.md asks users to apply are valid objects."""
    text = (REPO / "docs" / "scaleout.md").read_text()
    blocks = re.findall(r"```yaml\n(.*?)```", text, re.S)
    objs = [o for b in blocks for o in yaml.safe_load_all(b) if isinstance(o, dict) and "kind" in o]
    assert {o["kind"] for o in objs} == {"PersistentVolumeClaim", "Pod"}
    for o in objs:
        validate_object(o)


def test_a_required_header_reaches_the_pods_through_the_secret_and_the_probe_sends_it(tmp_path):
    """serving.require_header in the pods: the gated APIs need it, the value comes from the app's
    Secret (made by the `secret` command from the deployer's environment), the liveness probe
    reads it from the container's environment."""
    d = recipe_to_dict(load_recipe(REPO / "build_configs" / "tiny-cpu-draft-target.yaml"))
    d["serving"]["require_header"] = "x-gateway-key"
    recipe = parse_recipe(d)
    args = pod_server_args(recipe)
    assert f"--grpc-restricted-protocol=@trtspec@inference,metadata,model-config,statistics:x-gateway-key=" \
           f"{{{REQUIRED_HEADER_ENV}}}" in args
    cmd = secret_command("app", recipe, "llm")
    assert "create secret generic app-admin" in cmd and f'required-header="${REQUIRED_HEADER_ENV}"' in cmd
    probe = liveness_command(header="x-gateway-key")[-1]
    compile(probe, "probe", "exec")  # the probe is valid python
    assert f"'x-gateway-key': os.environ[{REQUIRED_HEADER_ENV!r}]" in probe
    layout = layout_for(recipe, None)
    files = k8s_files(recipe, layout, repository="/workspace/r", baseline_repository="/workspace/b",
                      opts=K8sOptions(mount_path="/workspace"))
    c = _container(_deployment(files))
    assert [e["name"] for e in c["env"]] == [SECRET_ENV, REQUIRED_HEADER_ENV, "LD_PRELOAD"]
    assert c["livenessProbe"]["exec"]["command"][-1] == probe
