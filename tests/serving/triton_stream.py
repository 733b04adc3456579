"""A minimal gRPC streaming client for the serving tests (the contract of docs/serving.md)."""

from __future__ import annotations

import json
import queue
import time
import urllib.request
from dataclasses import dataclass, field

import numpy as np
import tritonclient.grpc as grpcclient

TYPES = {
    "text_input": ("BYTES", np.object_), "max_tokens": ("INT32", np.int32), "stream": ("BOOL", bool),
    "temperature": ("FP32", np.float32), "top_k": ("INT32", np.int32), "top_p": ("FP32", np.float32),
    "seed": ("UINT64", np.uint64), "end_id": ("INT32", np.int32), "pad_id": ("INT32", np.int32),
    "return_perf_metrics": ("BOOL", bool), "exclude_input_in_output": ("BOOL", bool),
}
OUTPUTS = ("text_output", "output_ids", "acceptance_rate", "total_accepted_draft_tokens", "total_draft_tokens",
           "served_by", "perf_json")


def inputs(**values) -> list:
    out = []
    for name, v in values.items():
        dt, np_dt = TYPES.get(name, ("FP32", np.float32))
        if isinstance(v, tuple):  # (value, "TYPE") for inputs outside the contract
            v, dt = v
            np_dt = {"FP32": np.float32, "INT32": np.int32, "BOOL": bool, "BYTES": np.object_}[dt]
        if dt == "BYTES" and isinstance(v, str):
            v = v.encode()
        t = grpcclient.InferInput(name, [1, 1], dt)
        t.set_data_from_numpy(np.array([[v]], dtype=np_dt))
        out.append(t)
    return out


@dataclass
class Reply:
    responses: list[dict] = field(default_factory=list)
    times: list[float] = field(default_factory=list)
    error: str | None = None
    finals: int = 0

    @property
    def text(self) -> str:
        return "".join(r["text_output"] for r in self.responses)

    @property
    def ids(self) -> list[int]:
        return [i for r in self.responses for i in r["output_ids"]]

    @property
    def last(self) -> dict:
        return self.responses[-1]

    @property
    def perf(self) -> dict:
        return json.loads(self.last["perf_json"])


def _decode(result) -> dict:
    d = {}
    for k in OUTPUTS:
        a = result.as_numpy(k)
        if a is None:
            d[k] = None
        elif k in ("text_output", "served_by", "perf_json"):
            d[k] = a.reshape(-1)[0].decode()
        elif k == "output_ids":
            d[k] = [int(x) for x in a.reshape(-1)]
        else:
            d[k] = a.reshape(-1)[0].item()
    return d


def generate_many(url: str, model: str, requests: list[dict], timeout: float = 120) -> list[Reply]:
    """Send every request on one gRPC stream at once; collect responses per request id."""
    client = grpcclient.InferenceServerClient(url)
    q: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: q.put((time.perf_counter(), result, error)))
    replies = [Reply() for _ in requests]
    t0 = time.perf_counter()
    try:
        for i, values in enumerate(requests):
            client.async_stream_infer(model, inputs(**values), request_id=str(i), enable_empty_final_response=True)
        open_ = set(range(len(requests)))
        deadline = time.monotonic() + timeout
        while open_:
            t, result, error = q.get(timeout=max(0.1, deadline - time.monotonic()))
            if error is not None:
                # tritonclient does not say which request an in-stream error belongs to; with one
                # request per stream (the error tests) it is that one
                target = min(open_)
                replies[target].error = error.message()
                open_.discard(target)
                continue
            resp = result.get_response()
            rid = int(resp.id)
            final = resp.parameters["triton_final_response"].bool_param
            if result.as_numpy("text_output") is not None:
                replies[rid].responses.append(_decode(result))
                replies[rid].times.append(t - t0)
            if final:
                replies[rid].finals += 1
                open_.discard(rid)
    finally:
        client.stop_stream()
        client.close()
    return replies


def generate(url: str, model: str, text_input: str, **values) -> Reply:
    return generate_many(url, model, [{"text_input": text_input, **values}])[0]


def metrics(url: str) -> dict[str, float]:
    """Prometheus text → {'name{labels}': value} (labels as printed)."""
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


def metric(values: dict[str, float], name: str, **labels) -> float:
    """Sum of ``name`` over the series whose labels include ``labels``."""
    total = 0.0
    for key, v in values.items():
        base, _, rest = key.partition("{")
        if base != name:
            continue
        if all(f'{k}="{val}"' in rest for k, val in labels.items()):
            total += v
    return total


def raw_stream(url: str, model: str, tensors: dict, timeout: float = 120) -> list:
    """One request with raw tensors (name → array, any shape) on a stream; its results, in order."""
    client = grpcclient.InferenceServerClient(url)
    q: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: q.put((result, error)))
    ins = []
    for name, arr in tensors.items():
        dt = {np.dtype(np.int32): "INT32", np.dtype(bool): "BOOL", np.dtype(np.float32): "FP32",
              np.dtype(np.uint64): "UINT64"}[arr.dtype]
        t = grpcclient.InferInput(name, list(arr.shape), dt)
        t.set_data_from_numpy(arr)
        ins.append(t)
    out = []
    try:
        client.async_stream_infer(model, ins, enable_empty_final_response=True)
        while True:
            result, error = q.get(timeout=timeout)
            if error is not None:
                raise AssertionError(f"{model}: {error}")
            out.append(result)
            if result.get_response().parameters["triton_final_response"].bool_param:
                return out
    finally:
        client.stop_stream()
        client.close()
