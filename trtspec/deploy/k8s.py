"""Kubernetes manifests for a recipe: the speculative deployment beside its baseline, behind a
weighted traffic split (``trtspec deploy k8s``).

What one call writes into a fresh folder ``OUT`` (atomically, with ``OUT/trtspec.json``)::

    repository/            Triton repository of the speculative track (`trtspec package`)
    repository-baseline/   the same models with the router sending no traffic to speculation:
                           the baseline track is the same pod, so the A/B compares like with like
    k8s/pvc.yaml           the volume both tracks read the repositories, engines and tokenizer from
    k8s/speculative.yaml   Deployment + Service + HorizontalPodAutoscaler of the speculative track
    k8s/baseline.yaml      the same for the baseline track
    k8s/service.yaml       the stable entry point clients use (both tracks; inference ports only)
    k8s/networkpolicy.yaml who may reach the pods: 8000/8001 from the gateway/mesh namespace and the
                           app's own namespace, 8002 from the monitoring namespace only
    k8s/virtualservice.yaml  Istio VirtualService: the baseline/speculative weights (gRPC and HTTP),
                           PeerAuthentication (STRICT mTLS) and AuthorizationPolicy for the pods
    prometheus-adapter-values.yaml  the custom metrics the autoscalers read (Helm values)
    monitoring/prometheus-operator.yaml  for clusters with the Prometheus Operator: a ServiceMonitor
                           scraping both tracks' metrics port and a PrometheusRule with trtspec's
                           recording and alerting rules (trtspec/data/prometheus/rules.yml); outside
                           k8s/ so that `kubectl apply -f k8s/` works on a cluster without its CRDs
    rollout.sh             ./rollout.sh PERCENT: shift traffic; ./rollout.sh 0 rolls back at once

Every pod runs the trtspec serving image (:func:`serving_image`: docker/Dockerfile built on the
recipe's ``runtime.trtllm.container_image``, NVIDIA's Triton TRT-LLM container; or ``--image``) with
the command :mod:`trtspec.triton.launch.mpi` plans (mpirun over the engine's ranks for TRT-LLM engines),
asks for as many GPUs as that plan uses (``nvidia.com/gpu``), mounts the volume read-only at the
same path the build used, and is probed on Triton's ``/v2/health/ready`` and ``/v2/health/live``.
Autoscaling reads Triton's own metrics through prometheus-adapter: requests waiting in the pod's
queues (``nv_inference_pending_request_count``) and the average queue time per request
(``nv_inference_queue_duration_us``).

Hardening (docs/security.md): pods run under the Pod Security "restricted" profile (non-root,
no privilege escalation, every capability dropped, seccomp RuntimeDefault, read-only root with
``/tmp`` and ``/dev/shm`` as emptyDirs), mount no service-account token, get CPU and memory
requests and limits by default, pull the image by digest when ``--image-digest`` is given, and
their liveness probe sends a one-token request through the entry model, so a pod whose python
stub died (Triton keeps it READY, reference/triton-cpu.md §8) is restarted. The admin secret and
the required header's value reach tritonserver as placeholders that the image's argv shim
(``LD_PRELOAD``, docker/Dockerfile) fills from the container's environment: they are on no command
line (an image without the shim fails closed: tritonserver refuses the placeholder). The image keeps
NVIDIA's ENTRYPOINT; the pods give only ``args``, which replace its CMD
(tests/unit/test_image_manifest.py).

Why Istio for the split: one VirtualService carries the weights for gRPC and HTTP alike, in-mesh
clients need no gateway, and its schema can be checked offline (tests/unit/test_scaleout_k8s.py). Without
Istio the entry Service still works and spreads requests over both tracks by pod count.
"""

from __future__ import annotations

import math
import os
import pathlib
import re
import shlex
from dataclasses import asdict, dataclass
from typing import Any

import yaml

from trtspec.errors import ConfigError, StageError
from trtspec.manifest import atomic_dir, write_manifest
from trtspec.triton.access import IMAGE_ARGV_SHIM, REQUIRED_HEADER_ENV, SECRET_ENV, RequiredHeader, hidden_restricted_args
from trtspec.triton.launch.mpi import launch_plan
from trtspec.triton.placement import Layout, layout_for
from trtspec import __version__
from trtspec.config import TrtllmOptions, parse_recipe, recipe_to_dict
from trtspec.triton.render import RenderError, package
from trtspec.trtllm.handoff import TrtllmBuild
from trtspec.outputs import check_replaceable

KIND = "k8s-deployment"
TRACKS = ("speculative", "baseline")
HTTP_PORT, GRPC_PORT, METRICS_PORT = 8000, 8001, 8002
TRACK_LABEL = "trtspec/track"
NAME_LABEL = "app.kubernetes.io/name"
PENDING_METRIC = "trtspec_pending_requests"  # custom metric names prometheus-adapter serves (values file)
QUEUE_METRIC = "trtspec_queue_time_ms"
EXIT_TIMEOUT_S = 30  # tritonserver drains in-flight requests this long on SIGTERM
# the shipped Prometheus rules (docs/validation.md, "Alerts"); the PrometheusRule carries its groups
RULES_FILE = pathlib.Path(__file__).resolve().parents[1] / "data" / "prometheus" / "rules.yml"
SCRAPE_INTERVAL = "15s"

_DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E|m)?$")


@dataclass(frozen=True)
class K8sOptions:
    """Deployment choices the recipe does not make (each is a ``trtspec deploy k8s`` option)."""

    name: str | None = None  # object name prefix; default: the recipe name made DNS-safe
    namespace: str = "default"
    image: str | None = None  # default: serving_image(recipe), the image docker/Dockerfile builds
    mount_path: str = "/workspace"  # where the volume is mounted, in the pods and where the build ran
    pvc: str | None = None  # an existing claim; None: k8s/pvc.yaml makes <name>-models
    storage: str = "1Ti"
    storage_class: str | None = None
    replicas: int = 1  # per track: the starting count and the autoscaler's minimum
    max_replicas: int = 4
    speculative_weight: int = 0  # percent of traffic to the speculative track at first
    target_pending_requests: int | None = None  # per pod; default: limits.max_batch_size
    target_queue_ms: float = 100.0
    shm_size: str = "16Gi"  # /dev/shm: the python backend's tensors and NCCL between ranks
    cpu: str | None = "4"  # per pod requests and limits (a pod without limits can starve its node)
    memory: str | None = "32Gi"
    image_digest: str | None = None  # sha256:<64 hex>: the image is pulled by digest, not by a mutable tag
    gateway_namespace: str = "istio-system"  # who may reach 8000/8001 besides the app's own namespace
    monitoring_namespace: str = "monitoring"  # who may scrape 8002
    run_as_user: int = 1000  # NVIDIA's Triton images have the non-root user triton-server, uid 1000

    def check(self) -> None:
        if self.name is not None and not _DNS_LABEL.match(self.name):
            raise ConfigError("--name", self.name, "must be a DNS label: lowercase letters, digits and '-', "
                              "starting with a letter", fix="e.g. --name llama-70b")
        if not _DNS_LABEL.match(self.namespace):
            raise ConfigError("--namespace", self.namespace, "must be a DNS label", fix="e.g. --namespace llm")
        if not 0 <= self.speculative_weight <= 100:
            raise ConfigError("--speculative-weight", self.speculative_weight, "is a percentage",
                              fix="use 0..100 (0 = all traffic on the baseline)")
        if not 1 <= self.replicas <= self.max_replicas:
            raise ConfigError("--max-replicas", self.max_replicas,
                              f"must be at least --replicas ({self.replicas}), and --replicas at least 1",
                              fix=f"pass --max-replicas {max(self.replicas, 1)} or more")
        if self.target_pending_requests is not None and self.target_pending_requests < 1:
            raise ConfigError("--target-pending", self.target_pending_requests, "must be >= 1")
        if not self.target_queue_ms > 0:
            raise ConfigError("--target-queue-ms", self.target_queue_ms, "must be > 0")
        if not pathlib.PurePosixPath(self.mount_path).is_absolute():
            raise ConfigError("--mount-path", self.mount_path, "must be an absolute path", fix="e.g. /workspace")
        for flag, q in (("--storage", self.storage), ("--shm-size", self.shm_size), ("--cpu", self.cpu),
                        ("--memory", self.memory)):
            if q is not None and not _QUANTITY.match(q):
                raise ConfigError(flag, q, "is not a Kubernetes quantity", fix="e.g. 500Gi, 16Gi, 8")
        if self.image_digest is not None and not _DIGEST.match(self.image_digest):
            raise ConfigError("--image-digest", self.image_digest, "is not an image digest",
                              fix="sha256: and 64 hex digits, as `docker inspect --format '{{.RepoDigests}}'` shows")
        for flag, ns in (("--gateway-namespace", self.gateway_namespace),
                         ("--monitoring-namespace", self.monitoring_namespace)):
            if not _DNS_LABEL.match(ns):
                raise ConfigError(flag, ns, "must be a DNS label", fix="e.g. istio-system, monitoring")
        if self.run_as_user < 1:
            raise ConfigError("--run-as-user", self.run_as_user, "must be a non-root uid (>= 1)")

    def image_ref(self, image: str) -> str:
        """``image`` pinned to :attr:`image_digest` when given (any tag dropped: the digest decides)."""
        if self.image_digest is None:
            return image
        name = image.split("@", 1)[0]
        last = name.rsplit("/", 1)
        if ":" in last[-1]:
            name = name[: name.rindex(":")]
        return f"{name}@{self.image_digest}"


def app_name(recipe_name: str, override: str | None = None) -> str:
    """A DNS-label object name for a recipe (``llama3.3-70b`` → ``llama3-3-70b``)."""
    if override:
        return override
    name = re.sub(r"[^a-z0-9-]+", "-", recipe_name.lower()).strip("-")
    name = re.sub(r"-+", "-", name)
    if not name[:1].isalpha():
        name = "m-" + name
    longest = max(len(f"-{t}") for t in TRACKS)
    if len(name) + longest > 63:
        raise ConfigError("name", recipe_name, f"'{name}-speculative' is longer than the 63 characters "
                          "Kubernetes allows in a name", fix="pass --name with a shorter name")
    return name


def pod_gpus(recipe, layout: Layout) -> int:
    """GPUs one pod asks for: every device the launch plan uses, numbered 0..N-1 inside the pod."""
    if recipe.runtime.backend == "torch" and recipe.runtime.device == "auto":
        raise ConfigError("runtime.device", "auto", "a pod must know whether to ask for a GPU",
                          fix="set runtime.device: cpu or cuda")
    n = len(layout.gpus)
    if tuple(layout.gpus) != tuple(range(n)):
        field = "runtime.trtllm.gpu_device_ids"
        raise ConfigError(field, list(layout.gpus),
                          f"a pod sees the {n} GPU(s) it asks for as devices 0..{n - 1}",
                          fix=f"number the recipe's GPUs 0..{n - 1} (gpu_device_ids and draft_gpu_device_ids) "
                              "and rebuild the hand-off")
    return n


# --------------------------------------------------------------------------------------------
# the objects (pure)


def _labels(app: str, track: str | None = None) -> dict[str, str]:
    labels = {NAME_LABEL: app, "app.kubernetes.io/part-of": "trtspec"}
    if track:
        labels[TRACK_LABEL] = track
    return labels


def _meta(name: str, opts: K8sOptions, labels: dict[str, str]) -> dict[str, Any]:
    return {"name": name, "namespace": opts.namespace, "labels": labels}


def _ports(service: bool) -> list[dict[str, Any]]:
    # Istio reads the protocol from the port name (grpc, http, http-*)
    ports = [("http", HTTP_PORT, "http"), ("grpc", GRPC_PORT, "grpc"), ("http-metrics", METRICS_PORT, "http")]
    if service:
        return [{"name": n, "port": p, "targetPort": n if n != "http-metrics" else "metrics", "protocol": "TCP",
                 "appProtocol": a} for n, p, a in ports]
    return [{"name": n if n != "http-metrics" else "metrics", "containerPort": p, "protocol": "TCP"}
            for n, p, _ in ports]


def _deployment(app: str, track: str, recipe, argv: tuple[str, ...], gpus: int, claim: str,
                image: str, opts: K8sOptions) -> dict[str, Any]:
    name = f"{app}-{track}"
    period = 10
    startup_failures = max(3, math.ceil(recipe.serving.ready_timeout_s / period))
    resources: dict[str, Any] = {}
    if gpus:
        resources["limits"] = {"nvidia.com/gpu": gpus}
    requests = {k: v for k, v in (("cpu", opts.cpu), ("memory", opts.memory)) if v is not None}
    if requests:
        resources["requests"] = requests
        resources.setdefault("limits", {}).update(requests)  # guaranteed: nothing beyond what it asked for
    container: dict[str, Any] = {
        "name": "tritonserver",
        "image": opts.image_ref(image),
        # args, not command: the image's ENTRYPOINT (NVIDIA's nvidia_entrypoint.sh, kept by
        # docker/Dockerfile) sets the container up, then execs them; they replace the image's CMD
        "args": list(argv),
        "ports": _ports(service=False),
        "startupProbe": {"httpGet": {"path": "/v2/health/ready", "port": "http"},
                         "periodSeconds": period, "failureThreshold": startup_failures},
        "readinessProbe": {"httpGet": {"path": "/v2/health/ready", "port": "http"},
                           "periodSeconds": 5, "failureThreshold": 3},
        # /v2/health/live stays green while a python stub is dead and every request fails: the
        # liveness check is a one-token request through each entry model
        "livenessProbe": {"exec": {"command": liveness_command(ENTRY_MODELS,
                                                               header=recipe.serving.require_header)},
                          "periodSeconds": 30, "timeoutSeconds": 30, "failureThreshold": 3},
        "volumeMounts": [{"name": "models", "mountPath": opts.mount_path, "readOnly": True},
                         {"name": "dshm", "mountPath": "/dev/shm"},
                         {"name": "tmp", "mountPath": "/tmp"}],  # the python backend's python_env_* folders
        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                            "runAsNonRoot": True, "capabilities": {"drop": ["ALL"]}},
    }
    if resources:
        container["resources"] = resources
    # the pod's admin secret (and the required header's value): from the Secret the `secret` command
    # makes; tritonserver's args hold placeholders that the image's argv shim (LD_PRELOAD) fills from
    # these variables, so the values are on no command line (docs/security.md)
    container["env"] = [{"name": var, "valueFrom": {"secretKeyRef": {"name": admin_secret_name(app), "key": key}}}
                        for var, key in _secret_env(recipe)] + [{"name": "LD_PRELOAD", "value": IMAGE_ARGV_SHIM}]
    pod: dict[str, Any] = {
        "terminationGracePeriodSeconds": EXIT_TIMEOUT_S + 30,
        "automountServiceAccountToken": False,  # tritonserver never talks to the Kubernetes API
        "securityContext": {"runAsNonRoot": True, "runAsUser": opts.run_as_user, "runAsGroup": opts.run_as_user,
                            "fsGroup": opts.run_as_user, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [container],
        "volumes": [{"name": "models", "persistentVolumeClaim": {"claimName": claim, "readOnly": True}},
                    {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": opts.shm_size}},
                    {"name": "tmp", "emptyDir": {"sizeLimit": "8Gi"}}],
    }
    if gpus:
        pod["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(name, opts, _labels(app, track)),
        "spec": {
            "replicas": opts.replicas,
            "selector": {"matchLabels": {NAME_LABEL: app, TRACK_LABEL: track}},
            "template": {
                "metadata": {
                    "labels": _labels(app, track),
                    "annotations": {"prometheus.io/scrape": "true", "prometheus.io/port": str(METRICS_PORT),
                                    "prometheus.io/path": "/metrics", "trtspec/recipe": recipe.name},
                },
                "spec": pod,
            },
        },
    }


def _service(name: str, app: str, track: str | None, opts: K8sOptions) -> dict[str, Any]:
    selector = {NAME_LABEL: app, **({TRACK_LABEL: track} if track else {})}
    ports = _ports(service=True)
    if track is None:  # the clients' entry point: inference only; Prometheus scrapes the pods
        ports = [p for p in ports if p["port"] != METRICS_PORT]
    return {"apiVersion": "v1", "kind": "Service", "metadata": _meta(name, opts, _labels(app, track)),
            "spec": {"selector": selector, "ports": ports}}


ENTRY_MODELS = ("ensemble", "ensemble_baseline")


ADMIN_KEY = "admin-key"  # the Secret's key for the launch secret (the admin APIs)
HEADER_KEY = "required-header"  # its key for serving.require_header's value


def admin_secret_name(app: str) -> str:
    return f"{app}-admin"


def _secret_env(recipe) -> list[tuple[str, str]]:
    """(environment variable, Secret key) the pods read from the app's admin Secret."""
    return [(SECRET_ENV, ADMIN_KEY)] + ([(REQUIRED_HEADER_ENV, HEADER_KEY)] if recipe.serving.require_header else [])


def pod_server_args(recipe) -> tuple[str, ...]:
    """What every rank's tritonserver gets besides the launch plan: the admin APIs closed behind
    the pod's secret, the required header (serving.require_header), serving.tritonserver_args.
    The secrets are placeholders (``{TRTSPEC_LAUNCH_SECRET}``) that the image's argv shim fills from
    the container's environment (the Secret) inside tritonserver: not Kubernetes' ``$(VAR)``, which
    the kubelet expands into the process's argv, readable in /proc/<pid>/cmdline. An image without
    the shim leaves the placeholder, which tritonserver refuses (the pod fails, closed)."""
    args = hidden_restricted_args(SECRET_ENV)
    if recipe.serving.require_header:
        args += RequiredHeader(recipe.serving.require_header, "").args(hide=True)
    return (*args, *recipe.serving.tritonserver_args)


def secret_command(app: str, recipe, namespace: str) -> str:
    """The one command that makes the pods' Secret (a random admin key; the header's value from the
    environment of whoever runs it). The value never lands in a file trtspec writes."""
    cmd = (f"kubectl -n {shlex.quote(namespace)} create secret generic {admin_secret_name(app)} "
           f"--from-literal={ADMIN_KEY}=\"$(openssl rand -hex 32)\"")
    if recipe.serving.require_header:
        cmd += f" --from-literal={HEADER_KEY}=\"${REQUIRED_HEADER_ENV}\""
    return cmd


def liveness_command(models: tuple[str, ...] = ENTRY_MODELS, timeout_s: int = 25, port: int = HTTP_PORT,
                     header: str | None = None) -> list[str]:
    """An exec probe: a one-token request to each entry model over HTTP on localhost; exit 1 on
    any failure (NVIDIA's Triton images have python3; no curl needed). With ``header`` (a
    required header) it sends the value the container has in its environment."""
    headers = "{'Content-Type': 'application/json'" + (
        f", {header!r}: os.environ[{REQUIRED_HEADER_ENV!r}]" if header else "") + "}"
    code = ("import json,os,sys,urllib.error as e,urllib.request as u\n"
            f"for m in {list(models)!r}:\n"
            "    r = u.Request('http://127.0.0.1:%d/v2/models/%s/generate' % (" + str(port) + ", m),\n"
            "                  data=json.dumps({'text_input': 'a', 'max_tokens': 1, 'stream': False}).encode(),\n"
            f"                  headers={headers})\n"
            "    try:\n"
            f"        u.urlopen(r, timeout={timeout_s}).read()\n"
            "    except e.HTTPError as x:\n"
            "        sys.exit('%s: %s' % (m, x.read().decode(errors='replace')[:500]))\n")
    return ["python3", "-c", code]


def _network_policy(app: str, opts: K8sOptions) -> dict[str, Any]:
    """8000/8001 from the app's namespace and the gateway/mesh namespace; 8002 from monitoring."""
    def ns(name: str) -> dict[str, Any]:
        return {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": name}}}

    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _meta(app, opts, _labels(app)),
        "spec": {
            "podSelector": {"matchLabels": {NAME_LABEL: app}},
            "policyTypes": ["Ingress"],
            "ingress": [
                {"from": [ns(opts.namespace), ns(opts.gateway_namespace)],
                 "ports": [{"protocol": "TCP", "port": HTTP_PORT}, {"protocol": "TCP", "port": GRPC_PORT}]},
                {"from": [ns(opts.monitoring_namespace)], "ports": [{"protocol": "TCP", "port": METRICS_PORT}]},
            ],
        },
    }


def _mesh_auth(app: str, opts: K8sOptions) -> list[dict[str, Any]]:
    """Istio: mTLS required for the app's pods (STRICT), and only workloads of the app's own and the
    gateway's namespaces may call 8000/8001; the metrics port is left to the NetworkPolicy
    (Prometheus usually scrapes outside the mesh)."""
    selector = {"matchLabels": {NAME_LABEL: app}}
    return [
        {"apiVersion": "security.istio.io/v1", "kind": "PeerAuthentication",
         "metadata": _meta(app, opts, _labels(app)),
         "spec": {"selector": selector, "mtls": {"mode": "STRICT"},
                  "portLevelMtls": {str(METRICS_PORT): {"mode": "PERMISSIVE"}}}},
        {"apiVersion": "security.istio.io/v1", "kind": "AuthorizationPolicy",
         "metadata": _meta(app, opts, _labels(app)),
         "spec": {"selector": selector, "action": "ALLOW", "rules": [
             {"from": [{"source": {"namespaces": [opts.namespace, opts.gateway_namespace]}}],
              "to": [{"operation": {"ports": [str(HTTP_PORT), str(GRPC_PORT)]}}]},
             {"to": [{"operation": {"ports": [str(METRICS_PORT)]}}]},
         ]}},
    ]


def _hpa(app: str, track: str, pending: int, opts: K8sOptions) -> dict[str, Any]:
    name = f"{app}-{track}"

    def pods_metric(metric: str, value: str) -> dict[str, Any]:
        return {"type": "Pods", "pods": {"metric": {"name": metric},
                                         "target": {"type": "AverageValue", "averageValue": value}}}

    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": _meta(name, opts, _labels(app, track)),
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": name},
            "minReplicas": opts.replicas,
            "maxReplicas": opts.max_replicas,
            # the larger of the two recommendations wins
            "metrics": [pods_metric(PENDING_METRIC, str(pending)),
                        pods_metric(QUEUE_METRIC, _fmt_quantity(opts.target_queue_ms))],
            # GPU pods take minutes to load: add one at a time, give them back slowly
            "behavior": {
                "scaleUp": {"stabilizationWindowSeconds": 60,
                            "policies": [{"type": "Pods", "value": 1, "periodSeconds": 120}]},
                "scaleDown": {"stabilizationWindowSeconds": 600,
                              "policies": [{"type": "Pods", "value": 1, "periodSeconds": 300}]},
            },
        },
    }


def _fmt_quantity(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x}"


def _virtual_service(app: str, weight: int, opts: K8sOptions) -> dict[str, Any]:
    def host(name: str) -> str:
        return f"{name}.{opts.namespace}.svc.cluster.local"

    def route(port: int) -> list[dict[str, Any]]:
        # index 0 = baseline, 1 = speculative: rollout.sh patches these positions
        return [{"destination": {"host": host(f"{app}-baseline"), "port": {"number": port}}, "weight": 100 - weight},
                {"destination": {"host": host(f"{app}-speculative"), "port": {"number": port}}, "weight": weight}]

    return {
        "apiVersion": "networking.istio.io/v1",
        "kind": "VirtualService",
        "metadata": _meta(app, opts, _labels(app)),
        "spec": {
            "hosts": [host(app)],
            "http": [{"name": "grpc", "match": [{"port": GRPC_PORT}], "route": route(GRPC_PORT)},
                     {"name": "http", "match": [{"port": HTTP_PORT}], "route": route(HTTP_PORT)}],
        },
    }


def _pvc(claim: str, app: str, opts: K8sOptions) -> dict[str, Any]:
    spec: dict[str, Any] = {
        # written once (build, deploy), read by every replica of both tracks, on any node
        "accessModes": ["ReadWriteMany"],
        "resources": {"requests": {"storage": opts.storage}},
    }
    if opts.storage_class:
        spec["storageClassName"] = opts.storage_class
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": _meta(claim, opts, _labels(app)),
            "spec": spec}


def adapter_values(opts: K8sOptions) -> dict[str, Any]:
    """prometheus-adapter Helm values: Triton's per-pod series → the two custom metrics the
    autoscalers read (custom.metrics.k8s.io)."""
    def resources() -> dict[str, Any]:  # a fresh dict per rule: no YAML anchors in the file
        return {"overrides": {"namespace": {"resource": "namespace"}, "pod": {"resource": "pod"}}}

    return {"rules": {"default": False, "custom": [
        {
            # requests waiting in any model queue of the pod (ensemble, router, engines)
            "seriesQuery": 'nv_inference_pending_request_count{namespace!="",pod!=""}',
            "resources": resources(),
            "name": {"matches": "^nv_inference_pending_request_count$", "as": PENDING_METRIC},
            "metricsQuery": "sum(<<.Series>>{<<.LabelMatchers>>}) by (<<.GroupBy>>)",
        },
        {
            # average time a request waits in the engine models' queues, ms, over the last minute
            "seriesQuery": 'nv_inference_queue_duration_us{namespace!="",pod!=""}',
            "resources": resources(),
            "name": {"matches": "^nv_inference_queue_duration_us$", "as": QUEUE_METRIC},
            "metricsQuery": (
                'sum(rate(nv_inference_queue_duration_us{<<.LabelMatchers>>,model=~"tensorrt_llm.*"}[1m])) '
                'by (<<.GroupBy>>) / 1000 / clamp_min(sum(rate(nv_inference_request_success'
                '{<<.LabelMatchers>>,model=~"tensorrt_llm.*"}[1m])) by (<<.GroupBy>>), 0.001)'
            ),
        },
    ]}}


def _service_monitor(app: str, opts: K8sOptions) -> dict[str, Any]:
    """Scrape both tracks' Services on the metrics port; the series get ``app`` and ``track``
    labels (the operator adds ``namespace``, ``pod``, ``service``), which the rules group by."""
    def copy(service_label: str, target: str) -> dict[str, Any]:
        meta = "__meta_kubernetes_service_label_" + re.sub(r"[^a-zA-Z0-9_]", "_", service_label)
        return {"sourceLabels": [meta], "targetLabel": target, "action": "replace"}

    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": _meta(app, opts, _labels(app)),
        "spec": {
            # the track Services (the entry Service has no metrics port)
            "selector": {"matchLabels": {NAME_LABEL: app},
                         "matchExpressions": [{"key": TRACK_LABEL, "operator": "In", "values": list(TRACKS)}]},
            "namespaceSelector": {"matchNames": [opts.namespace]},
            "endpoints": [{"port": "http-metrics", "path": "/metrics", "interval": SCRAPE_INTERVAL,
                           "relabelings": [copy(NAME_LABEL, "app"), copy(TRACK_LABEL, "track")]}],
        },
    }


def _prometheus_rule(app: str, opts: K8sOptions) -> dict[str, Any]:
    groups = yaml.safe_load(RULES_FILE.read_text())["groups"]
    return {"apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule",
            "metadata": _meta(f"{app}-rules", opts, _labels(app)), "spec": {"groups": groups}}


class _BlockDumper(yaml.SafeDumper):
    """Multi-line strings (PromQL, alert descriptions) as ``|`` blocks, as in rules.yml."""


_BlockDumper.add_representer(str, lambda d, s: d.represent_scalar(
    "tag:yaml.org,2002:str", s, style="|" if "\n" in s else None))


def rollout_script(app: str, opts: K8sOptions) -> str:
    """``rollout.sh PERCENT``: one kubectl patch sets the speculative track's share of gRPC and HTTP."""
    ops = []
    for i in range(2):  # http[0] = gRPC, http[1] = HTTP; route[0] = baseline, route[1] = speculative
        ops.append(f'{{"op":"replace","path":"/spec/http/{i}/route/0/weight","value":$b}}')
        ops.append(f'{{"op":"replace","path":"/spec/http/{i}/route/1/weight","value":$p}}')
    patch = "[" + ",".join(ops) + "]"
    return f"""#!/bin/sh
# Send PERCENT of {app}'s traffic (gRPC and HTTP) to the speculative track, the rest to the baseline.
#   ./rollout.sh 10     canary
#   ./rollout.sh 100    all speculative
#   ./rollout.sh 0      roll back: all traffic on the baseline at once (both tracks stay warm)
# Written by `trtspec deploy k8s`; needs kubectl and Istio (VirtualService {app}).
set -eu
p="${{1:-}}"
case "$p" in
  ''|*[!0-9]*) echo "usage: $0 PERCENT   (an integer 0-100: the speculative track's share)" >&2; exit 2 ;;
esac
if [ "$p" -gt 100 ]; then echo "PERCENT must be 0-100, got $p" >&2; exit 2; fi
b=$((100 - p))
exec kubectl -n {shlex.quote(opts.namespace)} patch virtualservice {shlex.quote(app)} --type=json -p "{patch.replace('"', chr(92) + '"')}"
"""


def serving_image(recipe=None, registry: str | None = None) -> str:
    """The image docker/Dockerfile builds for a recipe: NVIDIA's Triton TRT-LLM container
    (``runtime.trtllm.container_image``) with this trtspec installed, tagged
    ``trtspec-triton:<trtspec version>-<base tag's release>`` (``make image`` builds it under this
    name; push it and pass ``--image REGISTRY/...``, or give ``registry``)."""
    base = recipe.runtime.trtllm.container_image if recipe is not None else TrtllmOptions().container_image
    tag = base.rsplit("/", 1)[-1].partition(":")[2] or "latest"
    release = tag.split("-", 1)[0]
    name = f"trtspec-triton:{__version__}-{release}"
    return f"{registry.rstrip('/')}/{name}" if registry else name



def k8s_files(recipe, layout: Layout, *, repository: str, baseline_repository: str,
              opts: K8sOptions) -> dict[str, str]:
    """Every file of the deployment folder but the repositories, as text (pure)."""
    opts.check()
    app = app_name(recipe.name, opts.name)
    gpus = pod_gpus(recipe, layout)
    image = opts.image or serving_image(recipe)
    claim = opts.pvc or f"{app}-models"
    pending = opts.target_pending_requests or recipe.limits.max_batch_size
    docs: dict[str, list[dict[str, Any]]] = {}
    if opts.pvc is None:
        docs["k8s/pvc.yaml"] = [_pvc(claim, app, opts)]
    for track, repo in (("speculative", repository), ("baseline", baseline_repository)):
        plan = launch_plan(layout, repository=repo, host="0.0.0.0", grpc_port=GRPC_PORT, http_port=HTTP_PORT,
                           metrics_port=METRICS_PORT, exit_timeout=EXIT_TIMEOUT_S, extra_args=pod_server_args(recipe),
                           argv_shim=IMAGE_ARGV_SHIM)
        docs[f"k8s/{track}.yaml"] = [
            _deployment(app, track, recipe, plan.argv, gpus, claim, image, opts),
            _service(f"{app}-{track}", app, track, opts),
            _hpa(app, track, pending, opts),
        ]
    docs["k8s/service.yaml"] = [_service(app, app, None, opts)]
    docs["k8s/networkpolicy.yaml"] = [_network_policy(app, opts)]
    docs["k8s/virtualservice.yaml"] = [_virtual_service(app, opts.speculative_weight, opts), *_mesh_auth(app, opts)]
    files = {path: _dump_all(objs) for path, objs in docs.items()}
    files["monitoring/prometheus-operator.yaml"] = (
        f"# For a cluster with the Prometheus Operator: scrape {app}'s pods and load trtspec's rules\n"
        "# (docs/validation.md, \"Alerts\"). Your Prometheus must select them: add the labels its\n"
        "# serviceMonitorSelector / ruleSelector match (kube-prometheus-stack: release: <its Helm release>).\n"
        + _dump_all([_service_monitor(app, opts), _prometheus_rule(app, opts)], dumper=_BlockDumper)
    )
    files["prometheus-adapter-values.yaml"] = (
        "# Helm values for prometheus-community/prometheus-adapter: the custom metrics the\n"
        f"# HorizontalPodAutoscalers of {app} read. Prometheus must scrape the pods (annotations prometheus.io/*,\n"
        "# or monitoring/prometheus-operator.yaml's ServiceMonitor).\n"
        + yaml.safe_dump(adapter_values(opts), sort_keys=False, width=1000)
    )
    files["rollout.sh"] = rollout_script(app, opts)
    return files


def _dump_all(objs: list[dict[str, Any]], dumper=yaml.SafeDumper) -> str:
    return "".join("---\n" + yaml.dump(o, Dumper=dumper, sort_keys=False, width=1000) for o in objs)


# --------------------------------------------------------------------------------------------
# writing the folder


@dataclass
class K8sDeployment:
    path: pathlib.Path
    app: str
    namespace: str
    gpus_per_pod: int
    layout: Layout
    files: list[str]
    manifest: dict[str, Any]


def _pod_paths(repo_manifest: dict[str, Any]) -> dict[str, str]:
    """Absolute paths the served models read outside the repository: {what: path}."""
    paths = {"tokenizer": repo_manifest["tokenizer_dir"]}
    spec = repo_manifest.get("runtime_spec") or {}
    for key in ("target", "draft"):
        if spec.get(key):
            paths[f"{key} model"] = spec[key]
    build = repo_manifest.get("trtllm_build") or {}
    for role, path in (build.get("engines") or {}).items():
        paths[f"{role} engine"] = path
    for opts_key in ("llm_api", "llm_api_baseline"):
        o = build.get(opts_key) or {}
        if isinstance(o.get("model"), str):
            paths[f"{opts_key} model"] = o["model"]
        sc = o.get("speculative_config") or {}
        for k in ("speculative_model", "speculative_model_dir"):
            if isinstance(sc.get(k), str):
                paths[f"{opts_key} {k}"] = sc[k]
    return paths


def _check_on_volume(paths: dict[str, str], mount: str) -> None:
    root = pathlib.PurePosixPath(mount)
    for what, path in paths.items():
        p = pathlib.PurePosixPath(path)
        if not p.is_absolute() or not (p == root or root in p.parents):
            raise StageError(
                f"the pods read the {what} at {path}, which is not under the volume's mount path {mount}",
                fix=f"build and deploy on the volume, mounted at {mount} where the pods mount it (docs/scaleout.md), "
                    "or pass --mount-path to the folder that holds all of them")


def write_k8s(
    recipe,
    out: str | os.PathLike,
    *,
    opts: K8sOptions = K8sOptions(),
    build_dir: str | os.PathLike | None = None,
    target: str | None = None,
    draft: str | None = None,
    overwrite: bool = False,
) -> K8sDeployment:
    """``trtspec deploy k8s``: both repositories and the manifests, into the fresh folder ``out``."""

    opts.check()
    out = pathlib.Path(out).resolve()
    if out.exists() and not overwrite:
        raise RenderError(f"output folder {out} already exists", fix="choose a new folder, or pass --force")

    check_replaceable(out, KIND, overwrite)  # --force replaces only a deployment folder trtspec wrote
    _check_on_volume({"deployment folder": str(out)}, opts.mount_path)
    app = app_name(recipe.name, opts.name)
    d = recipe_to_dict(recipe)
    d["serving"]["speculative_fraction"] = 0.0
    baseline_recipe = parse_recipe(d)
    with atomic_dir(out, overwrite=overwrite) as tmp:
        spec = package(recipe, tmp / "repository", target=target, draft=draft, build_dir=build_dir)
        package(baseline_recipe, tmp / "repository-baseline", target=target, draft=draft, build_dir=build_dir)
        m = spec.manifest
        build = TrtllmBuild.from_dict(m["trtllm_build"]) if m.get("trtllm_build") else None
        _check_on_volume(_pod_paths(m), opts.mount_path)
        layout = layout_for(recipe, build)
        files = k8s_files(recipe, layout, repository=str(out / "repository"),
                          baseline_repository=str(out / "repository-baseline"), opts=opts)
        for rel, text in files.items():
            path = tmp / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        (tmp / "rollout.sh").chmod(0o755)
        gpus = pod_gpus(recipe, layout)
        manifest = write_manifest(
            tmp, KIND,
            recipe_name=recipe.name, app=app, namespace=opts.namespace,
            image=opts.image or serving_image(recipe),
            base_image=recipe.runtime.trtllm.container_image,
            gpus_per_pod=gpus, launch=layout.to_dict(),
            tracks={t: {"deployment": f"{app}-{t}", "service": f"{app}-{t}",
                        "repository": str(out / ("repository" if t == "speculative" else "repository-baseline"))}
                    for t in TRACKS},
            entry_service=f"{app}.{opts.namespace}.svc.cluster.local",
            speculative_weight=opts.speculative_weight,
            options=asdict(opts),
            files=sorted(files),
            admin_secret=admin_secret_name(app),
            commands={
                "secret": secret_command(app, recipe, opts.namespace),
                "apply": f"kubectl apply -f {out / 'k8s'}",
                "monitoring": f"kubectl apply -f {out / 'monitoring'}",
                "rollout": f"{out / 'rollout.sh'} PERCENT",
                "rollback": f"{out / 'rollout.sh'} 0",
            },
        )
    return K8sDeployment(path=out, app=app, namespace=opts.namespace, gpus_per_pod=gpus, layout=layout,
                         files=sorted(files), manifest=manifest)
