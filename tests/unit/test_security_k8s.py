"""Hardened Kubernetes manifests (trtspec.deploy.k8s; schemas are checked in test_scaleout_k8s.py):
the Pod Security "restricted" profile, no service-account token, NetworkPolicy and Istio mTLS /
authorization, requests and limits, image by digest, the entry Service without the metrics port,
and a liveness probe that fails on a dead python stub (run against a real tritonserver)."""

from __future__ import annotations

import copy
import os
import pathlib
import signal
import subprocess
import sys

import pytest
import yaml

from trtspec.deploy.k8s import liveness_command
from trtspec.errors import ConfigError
from trtspec.triton.procs import stubs_of
from trtspec.triton.launch.server import TritonServer

REPO = pathlib.Path(__file__).resolve().parents[2]
DIGEST = "sha256:" + "ab" * 32


def files_for(stem="tiny-cpu-draft-target", **opts) -> dict[str, str]:
    from tests.unit.test_scaleout_k8s import _case

    return _case(f"{stem}.yaml", opts)[2]


def objects(files) -> list[dict]:
    return [o for path, text in files.items() if path.startswith("k8s/") for o in yaml.safe_load_all(text) if o]


def pods(objs):
    return [o["spec"]["template"]["spec"] for o in objs if o["kind"] == "Deployment"]


ALLOWED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected",
                   "secret", "name"}


def restricted_violations(pod: dict) -> list[str]:
    """What breaks the Pod Security Standards' "restricted" profile (kubernetes.io/docs/concepts/
    security/pod-security-standards, v1.30), control by control."""
    bad = []
    psc = pod.get("securityContext") or {}
    for k in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(k):
            bad.append(k)
    for v in pod.get("volumes") or []:
        if set(v) - ALLOWED_VOLUMES:
            bad.append(f"volume type {sorted(set(v) - ALLOWED_VOLUMES)}")
    if psc.get("runAsUser") == 0:
        bad.append("pod runAsUser 0")
    if psc.get("sysctls"):
        bad.append("sysctls")
    for c in (pod.get("initContainers") or []) + pod["containers"]:
        sc = c.get("securityContext") or {}
        n = c["name"]
        if sc.get("privileged"):
            bad.append(f"{n}: privileged")
        if sc.get("allowPrivilegeEscalation") is not False:
            bad.append(f"{n}: allowPrivilegeEscalation not false")
        caps = sc.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            bad.append(f"{n}: capabilities not drop ALL")
        if set(caps.get("add") or []) - {"NET_BIND_SERVICE"}:
            bad.append(f"{n}: adds capabilities")
        if not (sc.get("runAsNonRoot", psc.get("runAsNonRoot"))):
            bad.append(f"{n}: runAsNonRoot not true")
        if sc.get("runAsUser") == 0:
            bad.append(f"{n}: runAsUser 0")
        seccomp = (sc.get("seccompProfile") or psc.get("seccompProfile") or {}).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            bad.append(f"{n}: seccompProfile {seccomp}")
        if any(p.get("hostPort") for p in c.get("ports") or []):
            bad.append(f"{n}: hostPort")
        if sc.get("procMount") not in (None, "Default"):
            bad.append(f"{n}: procMount")
    return bad


@pytest.mark.parametrize("stem", ["tiny-cpu-draft-target", "llama3.3-70b-draft-target-fp8-trtllm"])
def test_pods_meet_the_restricted_pod_security_profile(stem):
    for pod in pods(objects(files_for(stem))):
        assert restricted_violations(pod) == []
        assert pod["automountServiceAccountToken"] is False
        c = pod["containers"][0]
        assert c["securityContext"]["readOnlyRootFilesystem"] is True
        mounts = {m["mountPath"] for m in c["volumeMounts"]}
        assert {"/tmp", "/dev/shm"} <= mounts  # the only places tritonserver writes


@pytest.mark.parametrize("breakage", [
    lambda pod: pod["containers"][0]["securityContext"]["capabilities"].__setitem__("drop", []),
    lambda pod: pod["containers"][0]["securityContext"].__setitem__("allowPrivilegeEscalation", True),
    lambda pod: pod["securityContext"].pop("seccompProfile"),
    lambda pod: pod["securityContext"].__setitem__("runAsNonRoot", False) or
    pod["containers"][0]["securityContext"].pop("runAsNonRoot"),
    lambda pod: pod["volumes"].append({"name": "h", "hostPath": {"path": "/"}}),
    lambda pod: pod.__setitem__("hostNetwork", True),
])
def test_the_profile_check_catches_a_broken_pod(breakage):
    pod = copy.deepcopy(pods(objects(files_for()))[0])
    breakage(pod)
    assert restricted_violations(pod)


def test_requests_and_limits_by_default_and_image_by_digest():
    for pod in pods(objects(files_for())):
        r = pod["containers"][0]["resources"]
        assert r["requests"]["cpu"] == r["limits"]["cpu"] and r["requests"]["memory"] == r["limits"]["memory"]
    pinned = pods(objects(files_for(image="nvcr.io/nvidia/tritonserver:24.12-trtllm-python-py3", image_digest=DIGEST)))
    assert {p["containers"][0]["image"] for p in pinned} == {f"nvcr.io/nvidia/tritonserver@{DIGEST}"}
    local = pods(objects(files_for(image="registry:5000/triton:1", image_digest=DIGEST)))
    assert local[0]["containers"][0]["image"] == f"registry:5000/triton@{DIGEST}"
    with pytest.raises(ConfigError, match="--image-digest"):
        files_for(image_digest="latest")


def test_network_policy_and_the_entry_service():
    objs = objects(files_for(namespace="llm", gateway_namespace="gw", monitoring_namespace="mon"))
    np_ = next(o for o in objs if o["kind"] == "NetworkPolicy")
    rules = {tuple(p["port"] for p in r["ports"]): [f["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"]
                                                    for f in r["from"]] for r in np_["spec"]["ingress"]}
    assert rules == {(8000, 8001): ["llm", "gw"], (8002,): ["mon"]}
    assert np_["spec"]["policyTypes"] == ["Ingress"]
    entry = next(o for o in objs if o["kind"] == "Service" and "trtspec/track" not in o["spec"]["selector"])
    assert {p["port"] for p in entry["spec"]["ports"]} == {8000, 8001}


def test_istio_requires_mtls_and_authorizes_only_the_app_and_the_gateway():
    objs = objects(files_for(namespace="llm", gateway_namespace="gw"))
    pa = next(o for o in objs if o["kind"] == "PeerAuthentication")
    assert pa["spec"]["mtls"] == {"mode": "STRICT"}
    ap = next(o for o in objs if o["kind"] == "AuthorizationPolicy")
    assert ap["spec"]["action"] == "ALLOW"
    inference = next(r for r in ap["spec"]["rules"] if "from" in r)
    assert inference["from"][0]["source"]["namespaces"] == ["llm", "gw"]
    assert inference["to"][0]["operation"]["ports"] == ["8000", "8001"]


GENERATE_CONFIG = """name: "ensemble"
backend: "python"
max_batch_size: 0
input [ { name: "text_input" data_type: TYPE_STRING dims: [ 1 ] },
        { name: "max_tokens" data_type: TYPE_INT32 dims: [ 1 ] },
        { name: "stream" data_type: TYPE_BOOL dims: [ 1 ] } ]
output [ { name: "text_output" data_type: TYPE_STRING dims: [ 1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""
GENERATE_MODEL = """import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("text_output", np.array([b"x"], dtype=np.object_))])
                for r in requests]
"""


def test_the_liveness_probe_fails_on_a_dead_stub_while_health_live_stays_green(tmp_path):
    import urllib.request

    d = tmp_path / "repo" / "ensemble"
    (d / "1").mkdir(parents=True)
    (d / "config.pbtxt").write_text(GENERATE_CONFIG)
    (d / "1" / "model.py").write_text(GENERATE_MODEL)
    # exit_timeout 2: a server whose stub was killed waits the whole exit timeout to stop (Triton 2.51),
    # which is not what this test is about (10 s of the fast tier's minute with the default)
    with TritonServer(tmp_path / "repo", workdir=tmp_path / "w", exit_timeout=2) as s:
        cmd = liveness_command(("ensemble",), timeout_s=10, port=s.endpoints.http_port)
        cmd[0] = sys.executable  # the pod's python3

        def probe():
            return subprocess.run(cmd, capture_output=True, text=True, timeout=60)

        ok = probe()
        assert ok.returncode == 0, ok.stderr
        for stub in stubs_of(s.proc.pid):
            os.kill(stub.pid, signal.SIGKILL)
        dead = probe()
        assert dead.returncode != 0 and "not healthy" in dead.stderr
        with urllib.request.urlopen(f"{s.endpoints.http}/v2/health/live", timeout=5) as r:
            assert r.status == 200  # what the old probe asked: still green
