"""``trtspec_draft_target``: draft-target speculation over two generation models (TRT-LLM engine flow).

Each round (reference/trtllm-triton.md §2.4, our own implementation):

  1. draft   ask the draft model for k = min(num_draft_tokens, remaining - 1) tokens after the context
  2. verify  ask the target for k + 1 tokens with the draft as ``draft_input_ids``: the target keeps
             the matching prefix and continues from its own tokens, so all k + 1 are the target's
  3. commit  accepted = longest common prefix of draft and target tokens; stream the target's tokens

Every round re-sends the whole context (the tensorrtllm backend's KV-cache reuse makes that
cheap on a GPU). Unlike NVIDIA's BLS it streams one response per round and speaks the token
tensors of ``tensorrt_llm`` (the router calls it); NVIDIA's text-level ``tensorrt_llm_bls``
(``trtspec.triton.backend.nvidia_bls``) runs the same :class:`Rounds`. The generation models only
need the tensorrtllm backend's tensors, so the same loop runs over trtspec's torch models.
"""

from __future__ import annotations

import json
import time

from trtspec.triton.backend.common import (
    RequestThreads,
    model_parameters,
    output_array,
    parse_or_reject,
    resident_bytes,
    send_error,
)
from trtspec.triton.backend.requests import GenerationRequest, engine_inputs
from trtspec.speculative.stats import RequestStats


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


class Rounds:
    """Draft-target rounds over the generation models ``self.draft`` and ``self.target`` (BLS calls)."""

    pb = None
    draft = target = ""
    decoupled = True  # whether the generation models are (serving.decoupled): how to call them

    def _generate(self, model: str, req: GenerationRequest, context: list[int], n: int,
                  drafts: list[int] | None = None, generated: int = 0) -> list[int]:
        """``n`` tokens of ``model`` after ``context`` (fewer if it stops)."""
        # each round re-sends the whole context as the prompt: the processors that depend only on the
        # sequence so far (repetition penalty, bad words, stop words) carry over; min_tokens counts on
        sub = GenerationRequest(
            input_ids=context, max_tokens=n, streaming=False, temperature=req.temperature, top_k=req.top_k,
            top_p=req.top_p, seed=req.seed, end_id=req.end_id, pad_id=req.pad_id, draft_input_ids=drafts or None,
            repetition_penalty=req.repetition_penalty, bad_words=req.bad_words, stop_words=req.stop_words,
            min_tokens=max(0, req.min_tokens - generated),
        )
        out: list[int] = []
        for get in self.call_generation(model, engine_inputs(sub), ["output_ids", "sequence_length"]):
            ids = get("output_ids")
            if ids is None:
                continue
            n_valid = get("sequence_length")
            flat = ids.reshape(-1).tolist()
            out.extend(flat[: int(n_valid.reshape(-1)[0])] if n_valid is not None else flat)
        return out

    def call_generation(self, model: str, inputs: dict, outputs: list[str]):
        """The responses of ``model`` to one request, each as ``get(name)`` → array or None (BLS)."""
        pb = self.pb
        bls = pb.InferenceRequest(model_name=model, inputs=[pb.Tensor(k, v) for k, v in inputs.items()],
                                  requested_output_names=outputs)
        for resp in (bls.exec(decoupled=True) if self.decoupled else [bls.exec()]):
            if resp.has_error():
                raise ModelError(resp.error())
            yield lambda name, r=resp: output_array(pb, r, name)

    def rounds(self, req: GenerationRequest, num_draft_tokens: int):
        """Draft-target rounds for ``req``: yields ``(new target tokens, stats, done)`` per round."""
        stats = RequestStats(prompt_tokens=len(req.input_ids))
        t_start = time.perf_counter()
        context = list(req.input_ids)
        out: list[int] = []
        reason = "length"
        while len(out) < req.max_tokens:
            remaining = req.max_tokens - len(out)
            k = min(num_draft_tokens, remaining - 1)
            t0 = time.perf_counter()
            drafts = self._generate(self.draft, req, context, k, generated=len(out)) if k > 0 else []
            t1 = time.perf_counter()
            produced = self._generate(self.target, req, context, len(drafts) + 1, drafts, generated=len(out))
            t2 = time.perf_counter()
            stats.record_step(drafted=len(drafts), accepted=common_prefix(drafts, produced),
                              draft_s=t1 - t0, verify_s=t2 - t1)
            new = produced[:remaining]
            if req.end_id is not None and req.end_id in new:
                new = new[: new.index(req.end_id)]
                reason = "stop"
            elif len(produced) < len(drafts) + 1:
                reason = "stop"  # the target stopped early: end of sequence
            if not out:
                stats.ttft_s = t2 - t_start
            out.extend(new)
            context.extend(new)
            stats.generated = len(out)
            stats.output_ids = list(out)
            done = reason == "stop" or len(out) >= req.max_tokens
            if done:
                stats.finish_reason = reason
                stats.total_s = time.perf_counter() - t_start
                stats.peak_rss_bytes = resident_bytes()
            yield new, stats, done
            if done:
                return


class DraftTargetBls(Rounds):
    pb = None  # triton_python_backend_utils, set by model.py

    def initialize(self, args: dict) -> None:
        p = model_parameters(args)
        self.name = args["model_name"]
        self.target = p["tensorrt_llm_model_name"]
        self.draft = p["tensorrt_llm_draft_model_name"]
        self.num_draft_tokens = int(p["num_draft_tokens"])
        self.decoupled = bool(json.loads(args["model_config"]).get("model_transaction_policy", {}).get("decoupled"))
        self.threads = RequestThreads()

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            req = parse_or_reject(self.pb, request, sender, self.name)
            if req is None:
                continue
            unsupported = [n for n, on in (("num_return_sequences", req.num_return_sequences > 1),
                                           ("presence_penalty", req.presence_penalty != 0),
                                           ("frequency_penalty", req.frequency_penalty != 0),
                                           ("return_log_probs", req.return_log_probs)) if on]
            if unsupported or (req.streaming and not self.decoupled):
                what = (f"input '{unsupported[0]}' is not supported by the draft-target rounds (each round "
                        "re-sends the context as a new prompt)" if unsupported
                        else "streaming=true needs a decoupled model (serving.decoupled: false here)")
                send_error(self.pb, sender, f"{self.name}: {what}")
                continue
            self.threads.start(self._serve, sender, req)
        return None

    def _serve(self, sender, req: GenerationRequest) -> None:
        try:
            self._rounds(sender, req)
        except ModelError as e:
            sender.send(self.pb.InferenceResponse(error=e.error), flags=self.pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        except Exception as e:  # noqa: BLE001 - answer this request, keep serving
            send_error(self.pb, sender, f"{self.name}: {type(e).__name__}: {e}", invalid_argument=False)

    def _rounds(self, sender, req: GenerationRequest) -> None:
        pending: list[int] = []  # non-streaming: everything
        for new, stats, done in self.rounds(req, self.num_draft_tokens):
            if req.streaming:
                self._send(sender, new, stats, done)
            else:
                pending.extend(new)
                if done:
                    self._send(sender, pending, stats, True)

    def _send(self, sender, tokens: list[int], stats, final: bool) -> None:
        from trtspec.triton.backend.engine import response_tensors  # lazy: trtspec.triton.backend.engine needs torch; this module stays importable without it

        pb = self.pb
        perf = json.dumps(stats.to_dict()) if final else ""
        sender.send(pb.InferenceResponse(output_tensors=response_tensors(pb, tokens, stats, "speculative", perf)),
                    flags=pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL if final else 0)

    def finalize(self) -> None:
        self.threads.join()


class ModelError(Exception):
    """A called model answered with an error: passed on to the caller as it is (its code kept)."""

    def __init__(self, error):
        self.error = error
        super().__init__(error.message() if hasattr(error, "message") else str(error))

