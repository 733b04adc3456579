"""``tensorrt_llm`` for ``runtime: trtllm-pytorch``: TensorRT-LLM's LLM API behind the tensorrtllm
backend's token tensors.

``1/model.yaml`` holds the ``LLM()`` keyword arguments (``speculative_config`` included) written by
``trtspec package`` from the build hand-off; ``triton_config`` in it is informational (config.pbtxt
rules). Each request runs ``LLM.generate_async`` on its prompt ids and is streamed from a thread.
Acceptance counters come from the request's perf metrics (``return_perf_metrics``; TRT-LLM
releases before PR #17082 report zeros there in the one-model flow).

Runs only inside NVIDIA's TRT-LLM container on a GPU: the CPU test suite renders and parses this
model's config, and imports this module, but never loads it.
"""

from __future__ import annotations

import json
import pathlib
import time

from trtspec.triton.backend.common import (RequestThreads, model_parameters, parsed_requests, request_limits,
                                           resident_bytes, send_error)
from trtspec.triton.backend.requests import GenerationRequest


def _spec_metrics(output) -> tuple[float, int, int]:
    """(acceptance_rate, accepted, drafted) from a TRT-LLM CompletionOutput, zeros when absent."""
    perf = getattr(output, "request_perf_metrics", None)
    sd = getattr(perf, "speculative_decoding", None)
    if sd is None:
        return 0.0, 0, 0
    return (float(getattr(sd, "acceptance_rate", 0.0) or 0.0), int(getattr(sd, "total_accepted_draft_tokens", 0) or 0),
            int(getattr(sd, "total_draft_tokens", 0) or 0))


class _Counters:
    """Duck-typed like RequestStats for :func:`backend_engine.response_tensors`."""

    def __init__(self, rate: float, accepted: int, drafted: int):
        self.acceptance_rate, self.accepted, self.drafted = rate, accepted, drafted


class LlmApiModel:
    pb = None  # triton_python_backend_utils, set by model.py

    def initialize(self, args: dict) -> None:
        import yaml
        from tensorrt_llm import LLM

        p = model_parameters(args)
        self.name = args["model_name"]
        self.served_by = p.get("served_by", "speculative")
        self.limits = request_limits(p)
        path = pathlib.Path(args["model_repository"]) / args["model_version"] / p.get("llm_api_config", "model.yaml")
        kwargs = yaml.safe_load(path.read_text())
        kwargs.pop("triton_config", None)
        self.llm = LLM(**kwargs)
        self.threads = RequestThreads()

    def execute(self, requests):
        for sender, req in parsed_requests(self.pb, requests, self.name, self.limits):
            # not mapped onto the LLM API's SamplingParams here (untested without TRT-LLM): refused clearly
            unmapped = [n for n, on in (("stop_words_list", bool(req.sampling.stop_words)),
                                        ("bad_words_list", bool(req.sampling.bad_words)),
                                        ("return_log_probs", req.sampling.logprobs),
                                        ("num_return_sequences", req.num_return_sequences > 1)) if on]
            if unmapped:
                send_error(self.pb, sender, f"{self.name}: input '{unmapped[0]}' is not supported by the LLM-API "
                                            "model (it serves the penalties, min_tokens and sampling)")
                continue
            self.threads.start(self._serve, sender, req)
        return None

    def _serve(self, sender, req: GenerationRequest) -> None:
        from tensorrt_llm import SamplingParams

        from trtspec.triton.backend.engine import response_tensors  # lazy: trtspec.triton.backend.engine needs torch; this module stays importable without it

        pb = self.pb
        try:
            s = req.sampling
            sp = SamplingParams(max_tokens=s.max_tokens, temperature=s.temperature, top_k=s.top_k or None,
                                top_p=s.top_p, seed=s.seed, end_id=s.end_id, return_perf_metrics=True,
                                repetition_penalty=s.repetition_penalty, presence_penalty=s.presence_penalty,
                                frequency_penalty=s.frequency_penalty, min_tokens=s.min_tokens)
            t0 = time.perf_counter()
            result = self.llm.generate_async(req.input_ids, sampling_params=sp, streaming=req.streaming)
            sent = 0
            outputs = result if req.streaming else [result.result()]
            for out in outputs:
                o = out.outputs[0]
                tokens = list(o.token_ids)
                new, sent = tokens[sent:], len(tokens)
                final = bool(getattr(out, "finished", True)) or not req.streaming
                counters = _Counters(*_spec_metrics(o))
                perf = ""
                if final:
                    elapsed = time.perf_counter() - t0
                    perf = json.dumps({"generated": sent, "drafted": counters.drafted, "accepted": counters.accepted,
                                       "acceptance_rate": round(counters.acceptance_rate, 4),
                                       "total_s": round(elapsed, 6), "tokens_per_s": round(sent / elapsed, 3),
                                       "finish_reason": getattr(o, "finish_reason", None),
                                       "peak_rss_bytes": resident_bytes()})
                if new or final:
                    sender.send(pb.InferenceResponse(output_tensors=response_tensors(
                        pb, new if req.streaming else tokens, counters, self.served_by, perf)),
                        flags=pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL if final else 0)
                if final:
                    return
                if sender.is_cancelled():
                    result.abort()
                    sender.send(flags=pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                    return
        except Exception as e:  # noqa: BLE001 - answer this request, keep serving
            send_error(pb, sender, f"{self.name}: {type(e).__name__}: {e}", invalid_argument=False)

    def finalize(self) -> None:
        self.threads.join()
        shutdown = getattr(self.llm, "shutdown", None)
        if shutdown is not None:
            shutdown()
