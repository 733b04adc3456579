"""The ``trtspec_watchdog`` python model: puts the launcher's watchdog counters on Triton's /metrics.

The launcher (``trtspec.triton.launch.watchdog``) is a separate process; Prometheus scrapes Triton's
metrics port. So the launcher copies this tiny model (``templates/trtspec_watchdog``) into its own
work folder (not the user's repository), loads it and reports each event to it as an inference request: ``EVENT`` (``declare``,
``reload``, ``reload_failed``, ``probe_failed``), ``MODEL`` (the model concerned) and ``SECONDS``
(time to recovery). Metric calls come only from ``execute`` (one thread), under the lock anyway.

Anyone who reaches the server can send this model requests, so it counts only what the launcher
sends: ``SECRET`` must be this launch's secret (``trtspec.triton.access``, from the environment the
stub inherits) and every model named must be one the launcher listed in the ``models`` parameter
(the repository's models): no forged counts, no label values an attacker chooses.
"""

from __future__ import annotations

import hmac
import json
import os
import threading

import numpy as np

from trtspec.triton.access import SECRET_ENV, SECRET_INPUT

NAME = "trtspec_watchdog"
MAX_MODELS_BYTES = 4096  # the MODEL input: a comma-separated list of repository model names

# event → (metric, kind, description)
FAMILIES = {
    "reload": ("trtspec_watchdog_reloads_total", "COUNTER",
               "Models the watchdog reloaded after their python stub died (READY but failing)"),
    "reload_failed": ("trtspec_watchdog_reload_failures_total", "COUNTER",
                      "Reloads that failed or did not finish within the load timeout"),
    "probe_failed": ("trtspec_watchdog_probe_failures_total", "COUNTER",
                     "End-to-end probe requests that failed"),
    "recovery": ("trtspec_watchdog_last_recovery_seconds", "GAUGE",
                 "Seconds from detecting a dead stub to the model being loaded again"),
}


class WatchdogModel:
    pb = None  # triton_python_backend_utils, set by model.py

    def initialize(self, args: dict) -> None:
        self.lock = threading.Lock()
        self.families = {event: self.pb.MetricFamily(name=name, description=desc,
                                                     kind=getattr(self.pb.MetricFamily, kind))
                         for event, (name, kind, desc) in FAMILIES.items()}
        self.metrics: dict[tuple[str, str], object] = {}
        self.secret = (os.environ.get(SECRET_ENV) or "").encode()
        params = json.loads(args.get("model_config") or "{}").get("parameters") or {}
        listed = (params.get("models") or {}).get("string_value", "")
        self.allowed = set(filter(None, listed.split(",")))

    def _metric(self, event: str, model: str):
        key = (event, model)
        if key not in self.metrics:
            self.metrics[key] = self.families[event].Metric(labels={"model": model})
        return self.metrics[key]

    def execute(self, requests):
        pb = self.pb
        out = []
        for r in requests:
            try:
                secret = pb.get_input_tensor_by_name(r, SECRET_INPUT)
                secret = secret.as_numpy().reshape(-1)[0] if secret is not None else b""
                if not self.secret or not hmac.compare_digest(bytes(secret), self.secret):
                    raise PermissionError("only trtspec's launcher may report watchdog events")
                raw = pb.get_input_tensor_by_name(r, "MODEL").as_numpy().reshape(-1)[0]
                if len(raw) > MAX_MODELS_BYTES:
                    raise ValueError(f"MODEL is {len(raw)} bytes (at most {MAX_MODELS_BYTES})")
                event = pb.get_input_tensor_by_name(r, "EVENT").as_numpy().reshape(-1)[0].decode()
                models = raw.decode()
                seconds = float(pb.get_input_tensor_by_name(r, "SECONDS").as_numpy().reshape(-1)[0])
                unknown = [m for m in filter(None, models.split(",")) if m not in self.allowed]
                if unknown:
                    raise ValueError(f"not a model of this repository: {unknown[0][:64]!r}")
                with self.lock:
                    for model in filter(None, models.split(",")):
                        if event == "declare":  # every series exists (at 0) before the first event
                            for e in ("reload", "reload_failed", "probe_failed"):
                                self._metric(e, model)
                        elif event == "reload":
                            self._metric("reload", model).increment(1)
                            self._metric("recovery", model).set(seconds)
                        elif event in FAMILIES:
                            self._metric(event, model).increment(1)
                        else:
                            raise ValueError(f"unknown event {event!r}")
                out.append(pb.InferenceResponse([pb.Tensor("OK", np.array([True]))]))
            except Exception as e:  # noqa: BLE001 - answer this request, keep serving
                out.append(pb.InferenceResponse(error=pb.TritonError(f"{NAME}: {type(e).__name__}: {e}",
                                                                    pb.TritonError.INVALID_ARG)))
        return out
