"""Deployment beyond one machine: Kubernetes manifests for a recipe (``trtspec deploy k8s``).

* ``k8s``  recipe + build → two Triton repositories (speculative, baseline) and the manifests that
  serve them side by side with a weighted traffic split, probes, GPU requests and autoscaling
"""
