"""NVIDIA's tensorrtllm-backend contract and what trtspec does with each tensor of it.

The contract is NVIDIA's ``all_models/inflight_batcher_llm`` templates (tensorrtllm_backend
c2e65b8, the last commit before they moved into TensorRT-LLM's ``triton_backend/``), kept as data
in ``trtspec/data/nvidia_inflight_batcher_llm.json`` (``scripts/nvidia_contract.py`` extracts it).
Every rendered model declares NVIDIA's tensors with NVIDIA's names, data types and dims
(``tests/unit/test_contract.py``); this module says, per tensor, whether it is implemented, accepted
without effect (beam-search knobs at beam width 1, as in TRT-LLM) or rejected, and why. The
request parsers use :data:`REJECTED` and :data:`DEFAULT_ONLY` to answer INVALID_ARG naming the
input; the README's contract table is :func:`markdown_table`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

NVIDIA_COMMIT = "c2e65b88d85255be30cf50440a91662abeb497dd"

# Inputs that are refused whatever their value (tensorrt_llm-level names, as the router and the
# engine models see them; the ensemble passes them through under the same name).
REJECTED: dict[str, str] = {
    **{n: "LoRA adapters are not supported by trtspec's runtimes"
       for n in ("lora_task_id", "lora_weights", "lora_config")},
    **{n: "prompt tables (p-tuning, multimodal embeddings) are not supported"
       for n in ("prompt_embedding_table", "prompt_table_extra_ids", "prompt_vocab_size")},
    **{n: "guided decoding (JSON schema, grammar) is not supported"
       for n in ("guided_decoding_guide_type", "guided_decoding_guide")},
    **{n: "encoder-decoder models are not supported (trtspec serves decoder-only LMs)"
       for n in ("encoder_input_features", "encoder_output_lengths", "decoder_input_ids", "decoder_input_lengths")},
    **{n: "multimodal inputs are not supported"
       for n in ("cross_attention_mask", "skip_cross_attn_blocks", "mrope_rotary_cos_sin", "mrope_position_deltas")},
    "embedding_bias": "logit bias tables (embedding_bias) are not supported",
    "draft_logits": "external drafts are verified as tokens (draft_input_ids); draft logits are not supported",
    "draft_acceptance_threshold": "external drafts are verified exactly (greedy match or speculative sampling); "
                                  "a typical-acceptance threshold is not supported",
    **{n: "top-p decay is not supported" for n in ("runtime_top_p_min", "runtime_top_p_decay", "runtime_top_p_reset_ids")},
    "context_phase_params": "disaggregated (context/generation) serving is not supported",
    **{n: "KV-cache retention priorities need TRT-LLM's paged KV cache; the torch runtime has one slot per request"
       for n in ("retention_token_range_starts", "retention_token_range_ends", "retention_token_range_priorities",
                 "retention_token_range_durations_ms", "retention_decode_priority", "retention_decode_duration_ms")},
    **{n: "lookahead decoding is a TRT-LLM engine mode; trtspec's speculation is set at package time"
       for n in ("lookahead_window_size", "lookahead_ngram_size", "lookahead_verification_set_size")},
}

# Inputs accepted with their default value (what NVIDIA's clients always send) and refused otherwise.
DEFAULT_ONLY: dict[str, tuple[object, str]] = {
    "beam_width": (1, "beam search is not supported; send beam_width 1"),
    "return_context_logits": (False, "the runtime does not return logits; send return_context_logits false"),
    "return_generation_logits": (False, "the runtime does not return logits; send return_generation_logits false"),
}

# Beam-search knobs: accepted and without effect at beam width 1, as in TRT-LLM.
NO_EFFECT = ("len_penalty", "early_stopping", "beam_search_diversity_rate")

# Text-level names of the ensemble / BLS that preprocessing refuses (its input name → the ensemble's).
REJECTED_TEXT: dict[str, tuple[str, str]] = {
    "DECODER_QUERY": ("decoder_text_input", REJECTED["decoder_input_ids"]),
    "EMBEDDING_BIAS_WORDS": ("embedding_bias_words", REJECTED["embedding_bias"]),
    "EMBEDDING_BIAS_WEIGHTS": ("embedding_bias_weights", REJECTED["embedding_bias"]),
    "PROMPT_TABLE_EXTRA_ID": ("prompt_table_extra_id", REJECTED["prompt_table_extra_ids"]),
    "IMAGE_BYTES": ("image_bytes_input", REJECTED["cross_attention_mask"]),
    "IMAGE_URL": ("image_url_input", REJECTED["cross_attention_mask"]),
    "VIDEO_BYTES": ("video_bytes_input", REJECTED["cross_attention_mask"]),
}

# Where trtspec's declaration differs from NVIDIA's, and why (tested: nothing else may differ).
OPTIONAL_HERE = {  # NVIDIA requires these; trtspec declares them optional
    ("ensemble", "text_input"): "Triton 2.51 answers an ensemble request that lacks a required input with an "
                                "empty *successful* response; optional, the request reaches preprocessing, "
                                "which rejects it naming text_input",
    ("ensemble", "max_tokens"): "same 2.51 behaviour; absent, preprocessing applies the recipe's max_tokens",
    ("preprocessing", "QUERY"): "checked in preprocessing (the ensemble forwards an absent text_input)",
    ("preprocessing", "REQUEST_OUTPUT_LEN"): "absent: the recipe's validation.max_tokens",
    ("tensorrt_llm_bls", "text_input"): "checked in the model, which answers INVALID_ARG naming it",
    ("tensorrt_llm_bls", "max_tokens"): "absent: the recipe's validation.max_tokens",
}
EXTRA_INPUTS = {  # declared by trtspec on top of NVIDIA's
    ("ensemble", "random_seed"): "NVIDIA's name for seed before c2e65b8 (both accepted; they must agree)",
    ("tensorrt_llm_bls", "random_seed"): "NVIDIA's name for seed before c2e65b8",
    ("ensemble", "min_length"): "NVIDIA's name for min_tokens before c2e65b8, which genai-perf 0.0.16 sends for "
                                "--output-tokens-mean-deterministic (both accepted; they must agree)",
    ("tensorrt_llm_bls", "min_length"): "NVIDIA's name for min_tokens before c2e65b8",
    ("postprocessing", "CONTEXT_LENGTH"): "ids already sent as text: exact streamed deltas (trtspec.triton.backend.detok)",
    ("postprocessing", "IS_FINAL"): "the last response of a stream flushes held-back bytes",
    ("postprocessing", "REQUEST_KEY"): "lets postprocessing stop the engine request when the client goes away",
}
EXTRA_OUTPUTS = {
    "output_ids": "the generated ids of each response (trtspec's client counts tokens with them)",
    "served_by": "which path answered: speculative or baseline (the router's decision)",
    "perf_json": "the request's RequestStats (draft/verify time, acceptance per position), final response only",
}


@lru_cache(maxsize=1)
def nvidia_contract() -> dict:
    """``{model: {"inputs": [...], "outputs": [...]}}`` of NVIDIA's templates."""
    text = resources.files("trtspec").joinpath("data/nvidia_inflight_batcher_llm.json").read_text()
    return json.loads(text)["models"]


@dataclass(frozen=True)
class Status:
    kind: str  # implemented | no effect | default only | rejected | not produced
    note: str = ""


_TEXT_TO_ENGINE = {"top_k": "runtime_top_k", "top_p": "runtime_top_p", "length_penalty": "len_penalty",
                   "stream": "streaming", "prompt_table_extra_id": "prompt_table_extra_ids",
                   "bad_words": "bad_words_list", "stop_words": "stop_words_list"}
_NOTES = {
    "text_input": "", "max_tokens": "", "input_ids": "", "input_lengths": "", "request_output_len": "",
    "num_return_sequences": "n > 1 samples n sequences, one response stream each with its sequence_index "
                            "(decoupled models; greedy gives n equal sequences)",
    "bad_words_list": "NVIDIA's [2, n] ids/offsets format; banned at every position, draft positions included",
    "stop_words_list": "NVIDIA's [2, n] format; the stop word is kept in the output, as TRT-LLM does",
    "exclude_input_in_output": "streaming never repeats the prompt, as TRT-LLM",
    "end_id": "", "pad_id": "",
    "runtime_top_k": "as TRT-LLM: top_k 0 and top_p 0 (or absent) decode greedily at any temperature",
    "runtime_top_p": "0 = off", "temperature": "",
    "repetition_penalty": "prompt + output tokens", "presence_penalty": "generated tokens",
    "frequency_penalty": "generated tokens", "min_tokens": "no EOS / end_id before min_tokens; also accepted as min_length (ensemble, tensorrt_llm_bls)",
    "seed": "also accepted as random_seed", "return_log_probs": "cum_log_probs, output_log_probs: the target's",
    "return_perf_metrics": "", "streaming": "", "draft_input_ids": "verified by the target in the first step",
    "stop": "stops the request with this request id (also what the ensemble's cancellation uses)",
    "num_draft_tokens": "tensorrt_llm_bls: > 0 runs NVIDIA's draft-target rounds over tensorrt_llm_draft and the "
                        "plain target (at most the recipe's max_draft_len; one response, stream=true refused as "
                        "NVIDIA's); 0 or absent relays to ensemble_baseline",
    "use_draft_logits": "false accepted; true is rejected (drafts are verified as tokens, exactly)",
}
_OUTPUT_NOTES = {
    "text_output": "", "OUTPUT": "", "output_ids": "", "sequence_length": "",
    "cum_log_probs": "with return_log_probs (else 0)", "output_log_probs": "with return_log_probs (else empty)",
    "context_logits": "declared, always empty: return_context_logits true is rejected",
    "generation_logits": "declared, always empty: return_generation_logits true is rejected",
    "batch_index": "always 0: one sequence per request (batches > 1 are rejected)",
    "sequence_index": "0..n-1 with num_return_sequences",
    "context_phase_params": "declared, never produced (no disaggregated serving)",
    "kv_cache_alloc_new_blocks": "1: the torch runtime gives each request one contiguous KV slot",
    "kv_cache_reused_blocks": "0: no prefix reuse", "kv_cache_alloc_total_blocks": "1 (one slot)",
    "arrival_time_ns": "wall clock, ns", "first_scheduled_time_ns": "prefill start",
    "first_token_time_ns": "", "last_token_time_ns": "",
    "acceptance_rate": "accepted / drafted so far", "total_accepted_draft_tokens": "", "total_draft_tokens": "",
    "INPUT_ID": "", "REQUEST_INPUT_LEN": "", "REQUEST_OUTPUT_LEN": "", "OUT_END_ID": "", "OUT_PAD_ID": "",
    "BAD_WORDS_IDS": "", "STOP_WORDS_IDS": "",
}


def input_status(name: str) -> Status:
    """What trtspec does with NVIDIA input ``name`` (any model's spelling)."""
    if name in REJECTED_TEXT:
        return Status("rejected", REJECTED_TEXT[name][1])
    engine = _TEXT_TO_ENGINE.get(name, name)
    if name in ("image_input", "image_bytes_input", "image_url_input", "video_bytes_input"):
        return Status("rejected", REJECTED["cross_attention_mask"])
    if name in ("decoder_text_input",):
        return Status("rejected", REJECTED["decoder_input_ids"])
    if name in ("embedding_bias_words", "embedding_bias_weights"):
        return Status("rejected", REJECTED["embedding_bias"])
    if engine in REJECTED:
        return Status("rejected", REJECTED[engine])
    if engine in DEFAULT_ONLY:
        default, why = DEFAULT_ONLY[engine]
        return Status("default only", f"{json.dumps(default)} accepted; other values rejected ({why.split(';')[0]})")
    if engine in NO_EFFECT:
        return Status("no effect", "beam search only; accepted and ignored at beam width 1, as TRT-LLM")
    upper = {"QUERY": "text_input", "REQUEST_OUTPUT_LEN": "max_tokens", "BAD_WORDS_DICT": "bad_words_list",
             "STOP_WORDS_DICT": "stop_words_list", "END_ID": "end_id", "PAD_ID": "pad_id",
             "TOKENS_BATCH": "input_ids", "SEQUENCE_LENGTH": "input_ids"}
    key = upper.get(name, engine)
    if key == "use_draft_logits":
        return Status("default only", _NOTES[key])
    if key in _NOTES:
        return Status("implemented", _NOTES[key])
    raise KeyError(f"no status for NVIDIA input {name!r}")


def output_status(name: str) -> Status:
    if name in _OUTPUT_NOTES:
        kind = ("not produced" if name == "context_phase_params"
                else "always empty" if name in ("context_logits", "generation_logits") else "implemented")
        return Status(kind, _OUTPUT_NOTES[name])
    if name in ("DECODER_INPUT_ID", "REQUEST_DECODER_INPUT_LEN", "EMBEDDING_BIAS", "OUT_PROMPT_TABLE_EXTRA_IDS",
                "PIXEL_VALUES", "ASPECT_RATIO_IDS", "ASPECT_RATIO_MASK", "CROSS_ATTENTION_MASK", "IMAGE_SIZES",
                "IS_VIDEO_INPUT", "ATTENTION_MASK", "IMAGE_GRID_THW", "VISION_INPUT_ID"):
        return Status("not produced", "declared; the inputs that would produce it are rejected")
    raise KeyError(f"no status for NVIDIA output {name!r}")


def markdown_table() -> str:
    """The README's table: every NVIDIA tensor, the models that declare it, and its status."""
    rows: dict[tuple[str, str], list[str]] = {}
    for model, io in nvidia_contract().items():
        for kind in ("inputs", "outputs"):
            for t in io[kind]:
                rows.setdefault((kind[:-1], t["name"]), []).append(model)
    lines = ["| tensor | in / out | NVIDIA models | trtspec | notes |", "|---|---|---|---|---|"]
    for (kind, name), models in rows.items():
        s = input_status(name) if kind == "input" else output_status(name)
        lines.append(f"| `{name}` | {kind} | {', '.join(models)} | {s.kind} | {s.note} |")
    return "\n".join(lines)
