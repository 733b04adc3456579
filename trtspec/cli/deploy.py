"""`trtspec deploy k8s`: Kubernetes manifests for a recipe."""

from __future__ import annotations

import json
import os

import click

from trtspec.config import load_recipe
from trtspec.deploy.k8s import K8sOptions, write_k8s
from trtspec.triton.access import REQUIRED_HEADER_ENV
from trtspec.cli.common import OptionGroup, err, handle_errors, out, with_groups


def _k8s_options(target_pending, **fields) -> K8sOptions:
    return K8sOptions(target_pending_requests=target_pending, **fields)


# --name … --monitoring-namespace → K8sOptions (the option names are its fields', but --target-pending)
K8S = OptionGroup("opts", _k8s_options)


@click.group()
def deploy() -> None:
    """Deploy a recipe beyond one machine: Kubernetes manifests (docs/scaleout.md)."""


@deploy.command("k8s")
@click.argument("config", type=click.Path(dir_okay=False))
@click.option("-o", "--out", "out_dir", required=True, type=click.Path(file_okay=False),
              help="New folder, on the volume the pods mount: both repositories, k8s/*.yaml, rollout.sh.")
@click.option("--build-dir", type=click.Path(file_okay=False), default=None,
              help="TRT-LLM runtimes: the folder `trtspec build` wrote (default: build/<recipe name>).")
@click.option("--target", type=click.Path(file_okay=False), default=None, help="torch runtime: serve this target folder.")
@click.option("--draft", type=click.Path(file_okay=False), default=None, help="torch runtime: serve this draft / head folder.")
@K8S.option("--name", default=None, help="Object name prefix (default: the recipe name, DNS-safe).")
@K8S.option("--namespace", default="default", show_default=True)
@K8S.option("--image", default=None, help="Container image (default: trtspec-triton:<version>-<release>, what `make image` builds from docker/Dockerfile on runtime.trtllm.container_image; push it and pass REGISTRY/NAME:TAG).")
@K8S.option("--mount-path", default="/workspace", show_default=True,
            help="Where the pods mount the volume: the build, models and OUT must be under it, at these paths.")
@K8S.option("--pvc", default=None, help="Use this existing PersistentVolumeClaim (default: k8s/pvc.yaml makes NAME-models).")
@K8S.option("--storage", default="1Ti", show_default=True, help="Size of the claim k8s/pvc.yaml makes.")
@K8S.option("--storage-class", default=None, help="StorageClass of that claim (ReadWriteMany).")
@K8S.option("--replicas", default=1, show_default=True, type=click.IntRange(1), help="Pods per track at first; the autoscalers' minimum.")
@K8S.option("--max-replicas", default=4, show_default=True, type=click.IntRange(1), help="Autoscalers' maximum per track.")
@K8S.option("--speculative-weight", default=0, show_default=True, type=click.IntRange(0, 100),
            help="Percent of traffic on the speculative track at first (rollout.sh changes it).")
@K8S.option("--target-pending", type=click.IntRange(1), default=None,
            help="Scale out above this many waiting requests per pod (default: limits.max_batch_size).")
@K8S.option("--target-queue-ms", default=100.0, show_default=True, type=click.FloatRange(min=0, min_open=True),
            help="Scale out above this average queue time per request.")
@K8S.option("--shm-size", default="16Gi", show_default=True, help="/dev/shm of each pod (python backend, NCCL).")
@K8S.option("--cpu", default="4", show_default=True, help="CPU request and limit per pod, e.g. 16.")
@K8S.option("--memory", default="32Gi", show_default=True, help="Memory request and limit per pod, e.g. 256Gi.")
@K8S.option("--image-digest", default=None, help="Pull the image by this digest (sha256:...), not by its tag.")
@K8S.option("--gateway-namespace", default="istio-system", show_default=True,
            help="Namespace of the gateway/mesh ingress that may reach ports 8000/8001 (NetworkPolicy, Istio).")
@K8S.option("--monitoring-namespace", default="monitoring", show_default=True,
            help="Namespace that may scrape the metrics port 8002 (NetworkPolicy).")
@click.option("--force", is_flag=True, help="Replace OUT if it is an earlier deployment folder (nothing else).")
@click.option("--json", "as_json", is_flag=True, help="Print the folder's manifest as JSON.")
@handle_errors
@with_groups(K8S)
def deploy_k8s(config, out_dir, build_dir, target, draft, opts, force, as_json):
    """Kubernetes manifests: the speculative deployment beside its baseline, weighted traffic split.

    \b
    Per track: Deployment (NVIDIA's Triton TRT-LLM container, GPUs of the launch plan, probes on
    /v2/health/ready and /v2/health/live), Service (gRPC 8001, HTTP 8000, metrics 8002) and an
    autoscaler on Triton's queue metrics (prometheus-adapter). One Istio VirtualService splits the
    traffic; rollout.sh PERCENT shifts it, rollout.sh 0 rolls back.
    """
    recipe = load_recipe(config)
    if recipe.runtime.backend != "torch" and build_dir is None:
        build_dir = os.path.join("build", recipe.name)
    res = write_k8s(recipe, out_dir, opts=opts, build_dir=build_dir, target=target, draft=draft, overwrite=force)
    if as_json:
        click.echo(json.dumps(res.manifest, indent=2, default=str))
        return
    m, lay = res.manifest, res.layout
    out.print(f"trtspec deploy k8s → {res.path}")
    out.print(f"  pods     {res.gpus_per_pod} GPU(s) each, launch {lay.mode} (MPI world {lay.world_size}), "
              f"image {m['image']}")
    out.print(f"  tracks   {res.app}-speculative, {res.app}-baseline (namespace {res.namespace}); "
              f"speculative weight {m['speculative_weight']}%")
    out.print(f"  entry    {m['entry_service']} (gRPC 8001, HTTP 8000)")
    for f in res.files:
        out.print(f"  wrote    {f}", markup=False)
    out.print(f"secret:   {m['commands']['secret']}   (once per namespace: the pods' admin key"
              + (f" and ${REQUIRED_HEADER_ENV}" if "required-header" in m['commands']['secret'] else "") + ")",
              markup=False)
    if recipe.serving.tls is not None:
        err.print("note: serving.tls is for `trtspec serve`; in the cluster the mesh's STRICT mTLS "
                  "(k8s/virtualservice.yaml) encrypts the pods' traffic", markup=False)
    out.print(f"apply:    {m['commands']['apply']}", markup=False)
    out.print(f"alerts:   {m['commands']['monitoring']}   (clusters with the Prometheus Operator: "
              "scraping and trtspec's alerts, docs/validation.md)", markup=False)
    out.print(f"shift:    {m['commands']['rollout']}", markup=False)
    out.print(f"rollback: {m['commands']['rollback']}", markup=False)
