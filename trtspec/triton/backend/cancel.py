"""How a client's cancellation reaches the engine through the ensemble (Triton 2.51).

What 2.51 does by itself (measured, see docs/reliability.md):

* a request sent to ``tensorrt_llm`` directly: ``response_sender.is_cancelled()`` turns True
  when the client cancels or disconnects; the engine model stops it at its next step;
* through ``ensemble`` (preprocessing → router → postprocessing): the ensemble marks only the
  composing requests it creates *after* the cancel as cancelled. The router's request, already
  running, never is, and a BLS request has no cancel call in 2.51 (``ResponseIterator.cancel()``
  came in a later python backend). So the router keeps relaying and the engine runs to
  ``max_tokens``.

What trtspec adds, so a disconnect on ``ensemble`` stops the engine within a step or two:

1. the router gives every engine request its own id and sends postprocessing a
   ``request_key`` = ``<engine model>/<engine request id>`` with each response;
2. postprocessing runs once per streamed response, as a *new* composing request, so it does see
   the cancel (checked at most every :data:`CHECK_EVERY_S` per request); it then sends the
   engine a ``stop`` request for that id, as NVIDIA's tensorrtllm backend's ``stop`` input does;
3. the engine model stops the request at its next step (``BackgroundEngine``: the callback
   returns False) and answers with the final response, which closes the router's relay.

A streamed request needs at least one response after the cancel to be noticed; a ``stream=false``
request has no intermediate responses, so through the ensemble it still runs to the end (a
request to ``tensorrt_llm`` directly is stopped either way).
"""

from __future__ import annotations

import secrets

import numpy as np

from trtspec.triton.access import secret_from_env, signed_stop_id

STOP_INPUT = "stop"
CHECK_EVERY_S = 0.25  # how often postprocessing asks Triton whether a request was cancelled
_SEP = "/"


def new_request_id(owner: str) -> str:
    """A request id unique on this server and unguessable (128 random bits): nobody can aim a
    request at another client's (trtspec.triton.access)."""
    return f"{owner}-{secrets.token_hex(16)}"


def request_key(model: str, request_id: str) -> str:
    return f"{model}{_SEP}{request_id}"


def parse_request_key(key: str) -> tuple[str, str] | None:
    """``(engine model, engine request id)``, or None for an empty or foreign key."""
    model, sep, rid = key.partition(_SEP)
    return (model, rid) if sep and model and rid else None


def stop_inputs(pb) -> list:
    """The tensors of a ``stop`` request: the required generation inputs (placeholders, never
    read) and ``stop = true``; the request's id names the request to stop."""
    return [
        pb.Tensor("input_ids", np.zeros((1, 1), dtype=np.int32)),
        pb.Tensor("input_lengths", np.ones((1, 1), dtype=np.int32)),
        pb.Tensor("request_output_len", np.ones((1, 1), dtype=np.int32)),
        pb.Tensor(STOP_INPUT, np.ones((1, 1), dtype=bool)),
    ]


def send_stop(pb, model: str, request_id: str) -> None:
    """Ask ``model`` (a trtspec engine model) to stop its request ``request_id``; waits for the
    model's answer (one empty final response). Raises on a BLS error. The stop request's id is
    ``request_id`` signed with the launch's secret: the engine honours no other."""
    secret = secret_from_env()
    if not secret:
        raise RuntimeError("no launch secret in this stub's environment: the engine would refuse the stop")
    req = pb.InferenceRequest(model_name=model, inputs=stop_inputs(pb), requested_output_names=[],
                              request_id=signed_stop_id(request_id, secret))
    for resp in req.exec(decoupled=True):
        if resp.has_error():
            raise RuntimeError(f"stop request to {model} failed: {resp.error().message()}")
