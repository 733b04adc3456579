"""LLM-API options for ``runtime: trtllm-pytorch`` (TRT-LLM ≥ 1.0, PyTorch backend).

One dict of ``LLM()`` keyword arguments is the source of truth; it becomes
- the YAML for ``trtllm-serve MODEL --extra_llm_api_options FILE`` (:func:`extra_options`:
  ``model``/``backend``/``tokenizer`` go on the command line instead), and
- Triton's llmapi ``tensorrt_llm/1/model.yaml`` (:func:`triton_model_yaml`: the same keys plus
  ``triton_config``).

Keys and ``decoding_type`` values are the ones in ``accepted_names`` (tensorrt_llm/llmapi/llm_args.py,
whose models forbid unknown keys): where the 1.1/1.2.0rc-era and the pre-1.3 copies of that file
disagree, the spelling both accept (``speculative_model_dir``, ``decoding_type: Eagle`` for EAGLE-3);
draft-target has no such spelling and gets the from_dict-era ``DraftTarget``, which 1.2.1 (from_dict
era by its quoted text) should take (``accepted_names.LLM_API_NAMES``; ``trtspec check`` says it is
unconfirmed). Nothing here rewrites a recipe value; what the recipe leaves unset stays
unset so TRT-LLM's own default applies.
"""

from __future__ import annotations

from typing import Any

import yaml

from trtspec.config import MTP, DraftTarget, Eagle3, NGram, Recipe
from trtspec.trtllm.accepted_names import DECODING_TYPE_FOR_METHOD, SPECULATIVE_MODEL_KEY

# keys that trtllm-serve takes as arguments, not from the extra-options YAML
_CLI_KEYS = ("model", "backend", "tokenizer")


def speculative_config(recipe: Recipe, *, speculative_model: str | None) -> dict[str, Any] | None:
    """``speculative_config`` for the recipe's method (None for ``method: none``).

    ``speculative_model`` is the draft / EAGLE-3 head folder the server loads (the quantized
    export when the build made one)."""
    cfg = _speculative_config(recipe, speculative_model=speculative_model)
    max_concurrency = getattr(recipe.speculation, "max_concurrency", None)
    if cfg is not None and max_concurrency is not None:
        cfg["max_concurrency"] = max_concurrency  # speculation off above this batch size
    return cfg


def _speculative_config(recipe: Recipe, *, speculative_model: str | None) -> dict[str, Any] | None:
    s = recipe.speculation
    if isinstance(s, Eagle3):
        # "Eagle": the older llm_args.py has no "Eagle3"; the newer one runs "Eagle" as EAGLE-3
        cfg: dict[str, Any] = {
            "decoding_type": DECODING_TYPE_FOR_METHOD["eagle3"],
            "max_draft_len": s.max_draft_len,
            SPECULATIVE_MODEL_KEY: speculative_model,
            "eagle3_one_model": s.eagle3_one_model,
        }
        if s.use_dynamic_tree:
            # EAGLE-2-style dynamic tree: max_draft_len <= max_total_draft_tokens <= topK * max_draft_len
            cfg["use_dynamic_tree"] = True
            cfg["dynamic_tree_max_topK"] = s.dynamic_tree_max_top_k
            cfg["max_total_draft_tokens"] = s.max_total_draft_tokens or s.dynamic_tree_max_top_k * s.max_draft_len
        return cfg
    if isinstance(s, DraftTarget):
        return {"decoding_type": DECODING_TYPE_FOR_METHOD["draft_target"], "max_draft_len": s.max_draft_len,
                SPECULATIVE_MODEL_KEY: speculative_model}
    if isinstance(s, NGram):
        return {
            "decoding_type": DECODING_TYPE_FOR_METHOD["ngram"],
            "max_draft_len": s.max_draft_len,
            "max_matching_ngram_size": s.max_matching_ngram_size,
        }
    if isinstance(s, MTP):
        return {
            "decoding_type": DECODING_TYPE_FOR_METHOD["mtp"],
            "num_nextn_predict_layers": s.max_draft_len,
            "use_relaxed_acceptance_for_thinking": s.use_relaxed_acceptance_for_thinking,
        }
    if s.method == "none":
        return None
    raise ValueError(f"speculation method {s.method!r} does not run on the TRT-LLM PyTorch flow")


def _two_model(recipe: Recipe) -> bool:
    """Drafting outside the target's forward pass (a separate draft model, the n-gram drafter,
    EAGLE-3 two-model): TRT-LLM 1.0's feature matrix lists these as not compatible with the
    overlap scheduler, and NVIDIA's 1.2 draft-target playbook disables it."""
    s = recipe.speculation
    return isinstance(s, (DraftTarget, NGram)) or (isinstance(s, Eagle3) and not s.eagle3_one_model)


def _base(recipe: Recipe, *, model: str, kv_fraction: float) -> dict[str, Any]:
    lim, t = recipe.limits, recipe.runtime.trtllm
    opts: dict[str, Any] = {"model": model, "backend": "pytorch"}
    if recipe.target.tokenizer:
        opts["tokenizer"] = recipe.target.tokenizer
    opts.update(
        tensor_parallel_size=lim.tensor_parallel_size,
        pipeline_parallel_size=lim.pipeline_parallel_size,
        max_batch_size=lim.max_batch_size,
        max_input_len=lim.max_input_len,
        max_seq_len=lim.max_seq_len,
    )
    if t.max_num_tokens is not None:
        opts["max_num_tokens"] = t.max_num_tokens
    opts["kv_cache_config"] = {"free_gpu_memory_fraction": kv_fraction, "enable_block_reuse": t.enable_kv_cache_reuse}
    return opts


def llm_api_options(recipe: Recipe, *, model: str, speculative_model: str | None = None) -> dict[str, Any]:
    """``LLM()`` kwargs of the speculative deployment.

    ``model``: the target folder to load (the quantized export when there is one);
    ``speculative_model``: the draft / EAGLE-3 head folder (draft_target, eagle3)."""
    opts = _base(recipe, model=model, kv_fraction=recipe.runtime.trtllm.kv_cache_free_gpu_mem_fraction)
    spec = speculative_config(recipe, speculative_model=speculative_model)
    if spec is not None:
        if _two_model(recipe):
            opts["disable_overlap_scheduler"] = True
        opts["speculative_config"] = spec
    return opts


def llm_api_baseline(recipe: Recipe, *, model: str) -> dict[str, Any]:
    """``LLM()`` kwargs of the plain (non-speculative) deployment served beside it. It shares the
    GPUs with the speculative model, so it gets the recipe's second KV-cache share
    (``draft_kv_cache_free_gpu_mem_fraction``)."""
    return _base(recipe, model=model, kv_fraction=recipe.runtime.trtllm.draft_kv_cache_free_gpu_mem_fraction)


def extra_options(options: dict[str, Any]) -> dict[str, Any]:
    """The ``--extra_llm_api_options`` YAML body: everything but what trtllm-serve takes as arguments."""
    return {k: v for k, v in options.items() if k not in _CLI_KEYS}


def triton_model_yaml(options: dict[str, Any], *, decoupled: bool) -> dict[str, Any]:
    """Triton llmapi ``tensorrt_llm/1/model.yaml``: the LLM() kwargs plus ``triton_config``.

    ``max_batch_size: 0``: the upstream llmapi model does no Triton-side batching (its template
    says so); the LLM's own ``max_batch_size`` above still bounds in-flight batching.
    ``decoupled`` must be true for streaming responses."""
    return {**options, "triton_config": {"max_batch_size": 0, "decoupled": decoupled}}


def to_yaml(options: dict[str, Any]) -> str:
    """Stable YAML text (key order as built, block style)."""
    return yaml.safe_dump(options, sort_keys=False, default_flow_style=False)
