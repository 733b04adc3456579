"""Names TensorRT-LLM 1.2.x accepts: command-line flags, their allowed values, LLM-API keys.

Data, not logic. Every plan trtspec generates is checked against it (``check_argv``,
``check_llm_api``), in the golden tests and again before a real build runs. Each entry names
the upstream file it was read from (NVIDIA/TensorRT-LLM unless said otherwise) and the commit of
the copy that was read. The 1.2.1 tag itself was not in the source index; these are 1.x copies
of the same files (the engine-flow scripts did not change their flags within 1.x). The LLM-API
names are held against two copies of llm_args.py that bracket 1.2.1 and a quoted excerpt of
1.2.1's own (LLM_API_NAMES): trtspec writes the spellings those accept, and reports the rest
(``unconfirmed_llm_api_names``).

Flag spec: ``FLAG`` → ``None`` for a store-true switch (takes no value), ``VALUE`` for any single
value, or a tuple of the allowed values (argparse ``choices``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Union

TRTLLM_RELEASE = "1.2.1"

VALUE = "<value>"
FlagSpec = Union[None, str, tuple]


@dataclass(frozen=True)
class Tool:
    """One command-line entry point and the flags it accepts."""

    name: str
    source: str  # upstream path (and commit) the flags were read from
    flags: Mapping[str, FlagSpec]


_DTYPE_AUTO = ("auto", "float16", "bfloat16", "float32")
_DTYPE = ("float32", "bfloat16", "float16")

# tensorrt_llm/commands/build.py parse_arguments() + tensorrt_llm/plugin/plugin.py add_plugin_argument()
TRTLLM_BUILD = Tool(
    name="trtllm-build",
    source="tensorrt_llm/commands/build.py @65f1d1536e18 + tensorrt_llm/plugin/plugin.py @c20322ffd3dc (cli_plugin_args)",
    flags={
        "--checkpoint_dir": VALUE,
        "--model_config": VALUE,
        "--build_config": VALUE,
        "--output_dir": VALUE,
        "--max_batch_size": VALUE,
        "--max_input_len": VALUE,
        "--max_seq_len": VALUE,
        "--max_beam_width": VALUE,
        "--max_num_tokens": VALUE,
        "--opt_num_tokens": VALUE,
        "--kv_cache_type": ("continuous", "paged", "disabled"),  # KVCacheType.from_string
        "--workers": VALUE,
        "--log_level": VALUE,
        "--strip_plan": None,
        "--weight_streaming": None,
        "--fast_build": None,
        "--monitor_memory": None,
        "--logits_dtype": ("float16", "float32"),
        "--gather_context_logits": None,
        "--gather_generation_logits": None,
        "--gather_all_token_logits": None,
        # "Speculative decoding arguments" group
        "--speculative_decoding_mode": (
            "draft_tokens_external", "lookahead_decoding", "medusa", "explicit_draft_tokens", "eagle",
        ),
        "--max_draft_len": VALUE,
        # plugin.py: Optional[Literal[...]] plugins, "disable" for None
        "--gemm_plugin": ("auto", "float16", "float32", "bfloat16", "int32", "fp8", "nvfp4", "disable"),
        "--gpt_attention_plugin": ("auto", "float16", "float32", "bfloat16", "int32", "disable"),
        "--nccl_plugin": ("auto", "float16", "float32", "bfloat16", "int32", "disable"),
        # plugin.py: bool features take enable/disable
        "--context_fmha": ("enable", "disable"),
        "--remove_input_padding": ("enable", "disable"),
        "--use_paged_context_fmha": ("enable", "disable"),
        "--use_fp8_context_fmha": ("enable", "disable"),
        "--multiple_profiles": ("enable", "disable"),
        "--use_fused_mlp": ("enable", "disable"),
        "--tokens_per_block": VALUE,
    },
)

# examples/models/core/llama/convert_checkpoint.py (also Mistral, Mixtral)
CONVERT_LLAMA = Tool(
    name="examples/models/core/llama/convert_checkpoint.py",
    source="examples/models/core/llama/convert_checkpoint.py @fd96a08bdc48",
    flags={
        "--model_dir": VALUE,
        "--meta_ckpt_dir": VALUE,
        "--output_dir": VALUE,
        "--dtype": _DTYPE_AUTO,
        "--tp_size": VALUE,
        "--pp_size": VALUE,
        "--cp_size": VALUE,
        "--moe_tp_size": VALUE,
        "--moe_ep_size": VALUE,
        "--workers": VALUE,
        "--use_weight_only": None,
        "--weight_only_precision": ("int8", "int4", "int8_gptq", "int4_gptq", "int4_awq"),
        "--int8_kv_cache": None,
        "--fp8_kv_cache": None,
        "--use_fp8": None,
        "--load_by_shard": None,
        "--load_model_on_cpu": None,
        "--use_parallel_embedding": None,
        "--log_level": VALUE,
    },
)

# examples/models/core/qwen/convert_checkpoint.py (Qwen, Qwen2, Qwen2.5)
CONVERT_QWEN = Tool(
    name="examples/models/core/qwen/convert_checkpoint.py",
    source="examples/models/core/qwen/convert_checkpoint.py @65b31db1b401",
    flags={
        "--model_dir": VALUE,
        "--output_dir": VALUE,
        "--dtype": _DTYPE_AUTO,
        "--tp_size": VALUE,
        "--pp_size": VALUE,
        "--cp_size": VALUE,
        "--moe_tp_size": VALUE,
        "--moe_ep_size": VALUE,
        "--workers": VALUE,
        "--use_weight_only": None,
        "--weight_only_precision": ("int8", "int4", "int4_gptq"),
        "--int8_kv_cache": None,
        "--load_model_on_cpu": None,
        "--use_parallel_embedding": None,
    },
)

# examples/eagle/convert_checkpoint.py: two checkpoints (--eagle_model_dir) or, without it, the
# "Single checkpoint for ModelOpt" path that reads <model_dir>/hf_quant_config.json
CONVERT_EAGLE = Tool(
    name="examples/eagle/convert_checkpoint.py",
    source="examples/eagle/convert_checkpoint.py @65b31db1b401",
    flags={
        "--model_dir": VALUE,
        "--eagle_model_dir": VALUE,
        "--output_dir": VALUE,
        "--dtype": _DTYPE_AUTO,
        "--tp_size": VALUE,
        "--pp_size": VALUE,  # asserted == 1
        "--workers": VALUE,
        "--max_draft_len": VALUE,  # asserted <= 256
        "--num_eagle_layers": VALUE,
        "--max_non_leaves_per_layer": VALUE,
        "--use_weight_only": None,
        "--weight_only_precision": ("int8", "int4", "int4_gptq"),
        "--int8_kv_cache": None,
        "--load_by_shard": None,
    },
)

# examples/medusa/convert_checkpoint.py (no "auto" dtype; --max_medusa_token_len, not --max_draft_len)
CONVERT_MEDUSA = Tool(
    name="examples/medusa/convert_checkpoint.py",
    source="examples/medusa/convert_checkpoint.py @b93e14ca093e",
    flags={
        "--model_dir": VALUE,
        "--medusa_model_dir": VALUE,
        "--output_dir": VALUE,
        "--dtype": _DTYPE,
        "--tp_size": VALUE,
        "--pp_size": VALUE,
        "--workers": VALUE,
        "--num_medusa_heads": VALUE,
        "--num_medusa_layers": VALUE,
        "--max_medusa_token_len": VALUE,
        "--medusa_hidden_act": VALUE,
        "--model_type": ("llama", "mixtral", "qwen2"),
    },
)

# examples/quantization/quantize.py: ModelOpt PTQ → TRT-LLM checkpoint (the engine flow's route,
# used by NVIDIA's draft-target blog recipe); also FP8 base + FP16 Medusa heads
QUANTIZE = Tool(
    name="examples/quantization/quantize.py",
    source="examples/quantization/quantize.py @c8c6df08bd0e",
    flags={
        "--model_dir": VALUE,
        "--output_dir": VALUE,
        "--dtype": _DTYPE_AUTO,
        "--qformat": ("nvfp4", "fp8", "fp8_pc_pt", "int8_sq", "int4_awq", "w4a8_awq", "int8_wo", "int4_wo", "full_prec"),
        "--kv_cache_dtype": ("int8", "fp8"),
        "--calib_dataset": VALUE,
        "--calib_size": VALUE,
        "--calib_max_seq_length": VALUE,
        "--batch_size": VALUE,
        "--tp_size": VALUE,
        "--pp_size": VALUE,
        "--cp_size": VALUE,
        "--awq_block_size": VALUE,
        "--seed": VALUE,
        "--device": ("cuda", "cpu"),
        "--device_map": ("auto", "sequential", "cpu", "gpu"),
        "--tokenizer_max_seq_length": VALUE,
        "--quantize_lm_head": None,
        "--num_medusa_heads": VALUE,
        "--num_medusa_layers": VALUE,
        "--max_draft_len": VALUE,
        "--medusa_hidden_act": VALUE,
        "--medusa_model_dir": VALUE,
        "--quant_medusa_head": None,
        "--autoq_format": VALUE,
        "--auto_quantize_bits": VALUE,
    },
)

# examples/eagle/quantize.py: ModelOpt FP8 of base + EAGLE head → one unified HF checkpoint
QUANTIZE_EAGLE = Tool(
    name="examples/eagle/quantize.py",
    source="examples/eagle/quantize.py @3867163ae2d4",
    flags={
        "--model_dir": VALUE,
        "--eagle_model_dir": VALUE,
        "--eagle_num_layers": VALUE,  # decoder layers inside the EAGLE head (default 1)
        "--output_dir": VALUE,
        "--qformat": ("fp8",),
        "--kv_cache_dtype": ("int8", "fp8"),
        "--calib_dataset": VALUE,
        "--calib_size": VALUE,
        "--calib_max_seq_length": VALUE,
        "--batch_size": VALUE,
        "--seed": VALUE,
        "--device": ("cuda", "cpu"),
        "--device_map": ("auto", "sequential", "cpu", "gpu"),
        "--tokenizer_max_seq_length": VALUE,
    },
)

# tensorrt_llm/commands/serve.py (click options of `trtllm-serve MODEL`)
TRTLLM_SERVE = Tool(
    name="trtllm-serve",
    source="tensorrt_llm/commands/serve.py @00209af149e7",
    flags={
        "--tokenizer": VALUE,
        "--host": VALUE,
        "--port": VALUE,
        "--backend": ("pytorch", "tensorrt", "trt", "_autodeploy"),
        "--max_batch_size": VALUE,
        "--max_num_tokens": VALUE,
        "--max_seq_len": VALUE,
        "--tp_size": VALUE,
        "--pp_size": VALUE,
        "--kv_cache_free_gpu_memory_fraction": VALUE,
        "--trust_remote_code": None,
        "--extra_llm_api_options": VALUE,
    },
)

TOOLS: dict[str, Tool] = {t.name: t for t in (
    TRTLLM_BUILD, CONVERT_LLAMA, CONVERT_QWEN, CONVERT_EAGLE, CONVERT_MEDUSA, QUANTIZE, QUANTIZE_EAGLE, TRTLLM_SERVE,
)}


# --------------------------------------------------------------------------------------------
# LLM-API keys: tensorrt_llm/llmapi/llm_args.py. TorchLlmArgs/BaseLlmArgs are pydantic models with
# extra="forbid", so an unknown key is an error at load time.
#
# Which copy is TRT-LLM 1.2.1's could not be read: the source index holds thousands of versions of
# llm_args.py, none at a release/1.2.1 commit (the tensorrtllm_backend submodule commits of
# v1.2.0rc4 … release/1.2.1 were each tried), and the index gives no commit for a copy found by its
# text. Two copies that bracket 1.2.1 were read instead (issue 32):
#
# - LLM_ARGS_OLDER: the 1.1/1.2.0rc-era copy. DecodingBaseConfig(StrictBaseModel) has
#   ``speculative_model_dir`` only; ``DecodingBaseConfig.from_dict`` dispatches on the keys MTP,
#   Medusa, Eagle, Lookahead, NGram, DraftTarget, SaveState, UserProvided, AUTO and raises
#   "Invalid decoding type" for anything else (no Eagle3); ``update_llm_args_with_extra_dict`` sends
#   a YAML ``speculative_config`` through ``from_dict``.
# - LLM_ARGS_NEWER: a pre-1.3 copy (MTPDecodingConfig warns the flag "will do nothing in release
#   1.3"). ``SpeculativeConfig`` is a pydantic union with ``discriminator="decoding_type"``: the
#   literals are Draft_Target, Eagle, Eagle3, Lookahead, Medusa, MTP, NGram, User_Provided,
#   SaveState, PARD, AUTO ("DraftTarget" is refused); ``speculative_model`` takes the alias
#   ``speculative_model_dir`` (AliasChoices); TorchLlmArgs turns ``Eagle`` into Eagle3DecodingConfig
#   on the PyTorch backend, with a warning.
#
# - LLM_ARGS_1_2_1: no copy of 1.2.1's file, but a third-party schema-extraction transcript that
#   quotes two of its classes, labelled "tensorrt library, version 1.2.1": DecodingBaseConfig has
#   ``speculative_model`` with AliasChoices("speculative_model", "speculative_model_dir") and
#   ``draft_len_schedule`` (the 1.2 release notes' "dynamic draft length"), and
#   LookaheadDecodingConfig still has the older ``from_dict``/``__init__`` and no Literal
#   decoding_type. So 1.2.1 lies between the two copies: the alias is in, the discriminated union
#   is not, and a YAML decoding_type still goes through ``DecodingBaseConfig.from_dict``.
#
# trtspec writes the spelling both bracketing copies accept wherever one exists
# (``speculative_model_dir``, ``decoding_type: Eagle`` + ``eagle3_one_model`` for EAGLE-3).
# Draft-target has none: the older copy (and every from_dict-era copy read) dispatches only
# "DraftTarget", the newer copy's union takes only "Draft_Target". Since 1.2.1 is from_dict era,
# trtspec writes "DraftTarget"; 1.2.1's own dispatch table was not seen, so ``trtspec check`` says
# it is unconfirmed. LLM_API_NAMES below lists every name the YAML writes,
# where each copy defines it (class.field; "char N" is the position in that copy's text), and
# whether both copies accept it. tests/golden/trtllm/SOURCES.md says the same for the goldens.


@dataclass(frozen=True)
class SourceCopy:
    """One stored copy of an upstream file that names were read from."""

    path: str
    commit: str | None  # None: the source index gave no commit for this copy
    index_id: str  # the source index's id of the copy (read_file id=...)
    chars: int
    marks: str  # what dates it

    def cite(self) -> str:
        at = f"@{self.commit[:12]}" if self.commit else f"(index copy {self.index_id}, {self.chars} chars, commit not given)"
        return f"{self.path} {at}"


LLM_ARGS_PATH = "tensorrt_llm/llmapi/llm_args.py"
LLM_ARGS_OLDER = SourceCopy(
    LLM_ARGS_PATH, None, "1090804222", 121745,
    "1.1/1.2.0rc era: StrictBaseModel DecodingBaseConfig with speculative_model_dir; from_dict keys "
    "MTP/Medusa/Eagle/Lookahead/NGram/DraftTarget/SaveState/UserProvided/AUTO; no Eagle3")
LLM_ARGS_NEWER = SourceCopy(
    LLM_ARGS_PATH, None, "7019226376", 139423,
    "pre-1.3: discriminated SpeculativeConfig union (Eagle3DecodingConfig, PARD, AUTO; no DFlash/SA); "
    "speculative_model with AliasChoices(speculative_model, speculative_model_dir); MTP warns of release 1.3")
# The oldest copy the index names a commit for (0.2x: DecodingBaseConfig(BaseModel) with
# ``speculative_model``, from_dict key "DraftTarget"): the field was renamed to
# speculative_model_dir in between, and back (with the alias) in the newer copy.
LLM_ARGS_OLDEST = SourceCopy(
    LLM_ARGS_PATH, "fcd3f31682808ae56118ae43c1d7864a3a945e6f", "292162234", 83880,
    "0.2x: DecodingBaseConfig(BaseModel) with speculative_model; from_dict key DraftTarget")
# TRT-LLM 1.2.1 itself, as quoted by a third-party transcript (not NVIDIA's repository): the
# DecodingBaseConfig fields and a pre-union LookaheadDecodingConfig (from_dict, __init__).
LLM_ARGS_1_2_1 = SourceCopy(
    "schema-extraction transcript 'decoding_configs', quoting " + LLM_ARGS_PATH, None, "59958270572", 12244,
    "labelled 'tensorrt library, version 1.2.1': speculative_model + AliasChoices(speculative_model, "
    "speculative_model_dir), draft_len_schedule; LookaheadDecodingConfig with from_dict/__init__ (no Literal)")
# The same transcript series for 1.0.0 (index copy 59861367871) quotes DecodingBaseConfig.from_dict
# with the key "DraftTarget" and speculative_model_dir.
LLM_ARGS_SOURCE = f"{LLM_ARGS_PATH} (BaseLlmArgs, TorchLlmArgs, KvCacheConfig, *DecodingConfig)"


@dataclass(frozen=True)
class NameCheck:
    """One name trtspec's LLM-API YAML writes, and where each bracketing copy of llm_args.py
    defines it ("" = that copy refuses it); ``release``: where LLM_ARGS_1_2_1 shows it ("" = not
    quoted there)."""

    name: str  # dotted path in the YAML; decoding_type values as "speculative_config.decoding_type=VALUE"
    older: str
    newer: str
    note: str = ""
    release: str = ""

    @property
    def confirmed(self) -> bool:
        """1.2.1's quoted text has it, or both bracketing copies accept it (so it loads whichever
        of them 1.2.1's llm_args.py follows for this name)."""
        return bool(self.release) or bool(self.older and self.newer)


_D = "speculative_config."
LLM_API_NAMES: tuple[NameCheck, ...] = (
    NameCheck("model", "BaseLlmArgs.model", "BaseLlmArgs.model"),
    NameCheck("tokenizer", "BaseLlmArgs.tokenizer", "BaseLlmArgs.tokenizer"),
    NameCheck("backend", "BaseLlmArgs.backend", "BaseLlmArgs.backend; TorchLlmArgs.backend Literal['pytorch']"),
    NameCheck("tensor_parallel_size", "BaseLlmArgs.tensor_parallel_size", "BaseLlmArgs.tensor_parallel_size"),
    NameCheck("pipeline_parallel_size", "BaseLlmArgs.pipeline_parallel_size", "BaseLlmArgs.pipeline_parallel_size"),
    NameCheck("max_batch_size", "BaseLlmArgs.max_batch_size", "BaseLlmArgs.max_batch_size"),
    NameCheck("max_input_len", "BaseLlmArgs.max_input_len", "BaseLlmArgs.max_input_len"),
    NameCheck("max_seq_len", "BaseLlmArgs.max_seq_len", "BaseLlmArgs.max_seq_len"),
    NameCheck("max_num_tokens", "BaseLlmArgs.max_num_tokens", "BaseLlmArgs.max_num_tokens"),
    NameCheck("kv_cache_config", "BaseLlmArgs.kv_cache_config", "BaseLlmArgs.kv_cache_config"),
    NameCheck("kv_cache_config.free_gpu_memory_fraction", "KvCacheConfig.free_gpu_memory_fraction (char 48373)",
              "KvCacheConfig.free_gpu_memory_fraction (char 72332)"),
    NameCheck("kv_cache_config.enable_block_reuse", "KvCacheConfig.enable_block_reuse",
              "KvCacheConfig.enable_block_reuse"),
    NameCheck("disable_overlap_scheduler", "TorchLlmArgs.disable_overlap_scheduler (char 97061)",
              "TorchLlmArgs.disable_overlap_scheduler"),
    NameCheck("speculative_config", "BaseLlmArgs.speculative_config (char 62888); YAML via DecodingBaseConfig.from_dict",
              "BaseLlmArgs.speculative_config: SpeculativeConfig (discriminator decoding_type)"),
    NameCheck(_D + "decoding_type=Eagle", "DecodingBaseConfig.from_dict key 'Eagle' (char 17839) -> EagleDecodingConfig (EAGLE-3 on PyTorch: "
              "spec_dec_mode EAGLE3 / EAGLE3_ONE_MODEL)", "EagleDecodingConfig Literal['Eagle'], made "
              "Eagle3DecodingConfig by TorchLlmArgs.validate_speculative_config (with a warning)",
              "EAGLE-3; 'Eagle3' is refused by the older copy (\"Invalid decoding type\")"),
    NameCheck(_D + "decoding_type=DraftTarget", "DecodingBaseConfig.from_dict key 'DraftTarget' (char 17839)", "",
              "the pre-1.3 copy's union takes only 'Draft_Target' (DraftTargetDecodingConfig Literal, char 47366; "
              "union char 70485); 1.2.1 is from_dict era (LLM_ARGS_1_2_1) and every from_dict-era copy read keys "
              "'DraftTarget' (the ClassVar 'Draft_Target' is not looked up), but 1.2.1's own table was not seen"),
    NameCheck(_D + "decoding_type=NGram", "from_dict key 'NGram'", "NGramDecodingConfig Literal['NGram']"),
    NameCheck(_D + "decoding_type=MTP", "from_dict key 'MTP'", "MTPDecodingConfig Literal['MTP']"),
    NameCheck(_D + "max_draft_len", "DecodingBaseConfig.max_draft_len", "DecodingBaseConfig.max_draft_len",
              release="DecodingBaseConfig.max_draft_len"),
    NameCheck(_D + "speculative_model_dir", "DecodingBaseConfig.speculative_model_dir",
              "DecodingBaseConfig.speculative_model, validation_alias AliasChoices('speculative_model', "
              "'speculative_model_dir')", "'speculative_model' is refused by the older copy",
              release="DecodingBaseConfig.speculative_model, validation_alias AliasChoices('speculative_model', "
                      "'speculative_model_dir') (transcript char 5413)"),
    NameCheck(_D + "max_concurrency", "DecodingBaseConfig.max_concurrency", "DecodingBaseConfig.max_concurrency",
              release="DecodingBaseConfig.max_concurrency"),
    NameCheck(_D + "max_total_draft_tokens", "DecodingBaseConfig.max_total_draft_tokens",
              "DecodingBaseConfig.max_total_draft_tokens", release="DecodingBaseConfig.max_total_draft_tokens"),
    NameCheck(_D + "eagle3_one_model", "EagleDecodingConfig.eagle3_one_model", "EagleDecodingConfig.eagle3_one_model"),
    NameCheck(_D + "use_dynamic_tree", "EagleDecodingConfig.use_dynamic_tree", "EagleDecodingConfig.use_dynamic_tree"),
    NameCheck(_D + "dynamic_tree_max_topK", "EagleDecodingConfig.dynamic_tree_max_topK",
              "EagleDecodingConfig.dynamic_tree_max_topK"),
    NameCheck(_D + "max_matching_ngram_size", "NGramDecodingConfig.max_matching_ngram_size",
              "NGramDecodingConfig.max_matching_ngram_size"),
    NameCheck(_D + "num_nextn_predict_layers", "MTPDecodingConfig.num_nextn_predict_layers",
              "MTPDecodingConfig.num_nextn_predict_layers"),
    NameCheck(_D + "use_relaxed_acceptance_for_thinking", "MTPDecodingConfig.use_relaxed_acceptance_for_thinking",
              "MTPDecodingConfig.use_relaxed_acceptance_for_thinking"),
)
LLM_API_NAME_INDEX = {n.name: n for n in LLM_API_NAMES}

# The decoding_type trtspec writes for each recipe method (PyTorch flow).
DECODING_TYPE_FOR_METHOD = {"eagle3": "Eagle", "draft_target": "DraftTarget", "ngram": "NGram", "mtp": "MTP"}
# The draft / head folder key of speculative_config.
SPECULATIVE_MODEL_KEY = "speculative_model_dir"

LLM_ARGS_KEYS = frozenset({
    "model", "tokenizer", "backend", "trust_remote_code", "dtype",
    "tensor_parallel_size", "pipeline_parallel_size",
    "max_batch_size", "max_input_len", "max_seq_len", "max_num_tokens", "max_beam_width",
    "kv_cache_config", "speculative_config", "enable_chunked_prefill",
    "disable_overlap_scheduler",  # TorchLlmArgs
})

# Further BaseLlmArgs / TorchLlmArgs fields (the same file, a 1.x copy read for issue 22): keys a
# recipe may pass through runtime.trtllm.llm_api_options. trtspec writes none of them itself.
LLM_API_PASSTHROUGH_KEYS = frozenset({
    # BaseLlmArgs
    "tokenizer_mode", "skip_tokenizer_init", "revision", "tokenizer_revision", "context_parallel_size",
    "gpus_per_node", "moe_cluster_parallel_size", "moe_tensor_parallel_size", "moe_expert_parallel_size",
    "enable_attention_dp", "enable_lm_head_tp_in_adp", "cp_config", "load_format",
    "fail_fast_on_attention_window_too_large", "enable_lora", "lora_config", "guided_decoding_backend",
    "iter_stats_max_iterations", "request_stats_max_iterations", "peft_cache_config", "scheduler_config",
    "cache_transceiver_config", "sparse_attention_config", "gather_generation_logits", "num_postprocess_workers",
    "postprocess_tokenizer_dir", "reasoning_parser", "return_perf_metrics", "orchestrator_type",
    # TorchLlmArgs
    "garbage_collection_gen0_threshold", "cuda_graph_config", "attention_dp_config", "moe_config", "attn_backend",
    "sampler_type", "enable_iter_perf_stats", "enable_iter_req_stats", "print_iter_log", "perf_metrics_max_requests",
    "batch_wait_timeout_ms", "batch_wait_timeout_iters", "batch_wait_max_tokens_ratio", "torch_compile_config",
    "enable_autotuner", "enable_layerwise_nvtx_marker", "enable_min_latency", "stream_interval",
    "force_dynamic_quantization", "allreduce_strategy", "checkpoint_format", "kv_connector_config",
    "mm_encoder_only", "ray_worker_extension_cls",
})

KV_CACHE_CONFIG_KEYS = frozenset({
    "enable_block_reuse", "max_tokens", "free_gpu_memory_fraction", "host_cache_size", "onboard_blocks",
    "enable_partial_reuse", "copy_on_partial_reuse", "dtype", "tokens_per_block", "max_attention_window",
})

# DecodingBaseConfig fields both copies define (the head/draft folder as speculative_model_dir,
# which both accept; the newer copy's speculative_model and draft_len_schedule are left out).
_DECODING_BASE = frozenset({
    "decoding_type", "max_draft_len", "max_total_draft_tokens", "speculative_model_dir", "max_concurrency",
    "load_format", "acceptance_window", "acceptance_length_threshold",
})
_EAGLE = _DECODING_BASE | {
    "eagle_choices", "greedy_sampling", "posterior_threshold", "use_dynamic_tree", "dynamic_tree_max_topK",
    "num_eagle_layers", "max_non_leaves_per_layer", "eagle3_one_model", "eagle3_layers_to_capture",
}

# decoding_type → keys of its config class. Only spellings at least one bracketing copy accepts;
# those not in both are reported by unconfirmed_llm_api_names (see LLM_API_NAMES).
SPECULATIVE_CONFIG_KEYS: dict[str, frozenset] = {
    "Eagle": frozenset(_EAGLE),
    "Eagle3": frozenset(_EAGLE),  # newer copy only
    "DraftTarget": _DECODING_BASE,  # from_dict-era key (older copy; 1.2.1 is from_dict era)
    "Draft_Target": _DECODING_BASE,  # pre-1.3 union literal only
    "NGram": _DECODING_BASE | {"max_matching_ngram_size", "is_keep_all", "is_use_oldest", "is_public_pool"},
    "MTP": _DECODING_BASE | {
        "num_nextn_predict_layers", "use_relaxed_acceptance_for_thinking", "relaxed_topk", "relaxed_delta",
        "use_mtp_vanilla", "mtp_eagle_one_model",
    },
    "Medusa": _DECODING_BASE | {"medusa_choices", "num_medusa_heads"},
    "Lookahead": _DECODING_BASE | {"max_window_size", "max_ngram_size", "max_verification_set_size"},
}
# decoding_type spellings only one bracketing copy accepts, and what the other one takes instead
ONE_COPY_DECODING_TYPES = {
    "Eagle3": "the 1.1/1.2.0rc-era llm_args.py has no Eagle3 (\"Invalid decoding type\"); 'Eagle' loads on both",
    "Draft_Target": "from_dict-era llm_args.py (1.1/1.2.0rc, and 1.2.1 by its quoted text) dispatches 'DraftTarget' only",
    "DraftTarget": "the pre-1.3 llm_args.py's discriminator takes 'Draft_Target' only",
}

# Which decoding types the PyTorch backend runs (``supports_backend``): Medusa and Lookahead do not.
PYTORCH_DECODING_TYPES = frozenset({"Eagle3", "Eagle", "Draft_Target", "DraftTarget", "NGram", "MTP"})

# Triton's llmapi model (triton_backend/all_models/llmapi/tensorrt_llm/1/model.yaml @0ebb1536ac12):
# LLM() kwargs plus a triton_config block. Its model.py (index copy 977111432,
# TritonPythonModel.initialize) reads the rest through update_llm_args_with_extra_dict, the same
# reader as trtllm-serve's --extra_llm_api_options, so LLM_API_NAMES holds for both files.
TRITON_LLMAPI_EXTRA_KEYS = frozenset({"triton_config"})
TRITON_CONFIG_KEYS = frozenset({"max_batch_size", "decoupled"})


# trtllm-bench (tensorrt_llm/commands/bench.py global options + tensorrt_llm/bench/benchmark/throughput.py
# @000a01de66f0): `trtllm-bench --model M [--model_path P] throughput FLAGS`, used by `trtspec tune --trtllm`
TRTLLM_BENCH_SOURCE = "tensorrt_llm/bench/benchmark/throughput.py @000a01de66f0"
TRTLLM_BENCH_GLOBAL_FLAGS = frozenset({"--model", "--model_path", "--workspace", "--log_level"})
TRTLLM_BENCH_THROUGHPUT_FLAGS = frozenset({
    "--engine_dir", "--backend", "--extra_llm_api_options", "--max_batch_size", "--max_num_tokens", "--max_seq_len",
    "--beam_width", "--kv_cache_free_gpu_mem_fraction", "--dataset", "--eos_id", "--modality", "--max_input_len",
    "--num_requests", "--warmup", "--target_input_len", "--target_output_len", "--tp", "--pp", "--ep",
    "--cluster_size", "--concurrency", "--streaming", "--report_json", "--iteration_log", "--output_json",
    "--request_json", "--enable_chunked_context", "--scheduler_policy",
})


# tritonserver options, from `tritonserver --help` of the server nvidia-pytriton 0.7.0 bundles
# (Triton 2.51); serving.tritonserver_args is checked against them
TRITONSERVER_SOURCE = "tritonserver --help (Triton 2.51, bundled with nvidia-pytriton 0.7.0)"
TRITONSERVER_FLAGS = frozenset("""
--allow-cpu-metrics --allow-gpu-metrics --allow-grpc --allow-http --allow-metrics --allow-sagemaker
--allow-vertex-ai --backend-config --backend-directory --buffer-manager-thread-count --cache-config
--cache-directory --cuda-memory-pool-byte-size --cuda-virtual-address-size --disable-auto-complete-config
--enable-peer-access --exit-on-error --exit-timeout-secs --grpc-address --grpc-header-forward-pattern
--grpc-http2-max-ping-strikes --grpc-http2-max-pings-without-data --grpc-http2-min-recv-ping-interval-without-data
--grpc-infer-allocation-pool-size --grpc-infer-response-compression-level --grpc-keepalive-permit-without-calls
--grpc-keepalive-time --grpc-keepalive-timeout --grpc-max-connection-age --grpc-max-connection-age-grace
--grpc-port --grpc-restricted-protocol --grpc-root-cert --grpc-server-cert --grpc-server-key --grpc-use-ssl
--grpc-use-ssl-mutual --host-policy --http-address --http-header-forward-pattern --http-port
--http-restricted-api --http-thread-count --id --load-model --log-error --log-file --log-format --log-info
--log-verbose --log-warning --metrics-address --metrics-config --metrics-interval-ms --metrics-port
--min-supported-compute-capability --model-config-name --model-control-mode --model-load-gpu-limit
--model-load-retry-count --model-load-thread-count --model-namespacing --model-repository --model-store
--pinned-memory-pool-byte-size --rate-limit --rate-limit-resource --repoagent-directory --repository-poll-secs
--response-cache-byte-size --reuse-grpc-port --reuse-http-port --sagemaker-port --sagemaker-safe-port-range
--sagemaker-thread-count --strict-model-config --strict-readiness --trace-config --trace-count --trace-file
--trace-level --trace-log-frequency --trace-rate --vertex-ai-default-model --vertex-ai-port
--vertex-ai-thread-count
""".split())


# --------------------------------------------------------------------------------------------
# checks


def tool_for(argv: list[str] | tuple[str, ...]) -> Tool | None:
    """The TRT-LLM tool an argv runs: ``trtllm-build ...`` / ``trtllm-serve ...`` or
    ``python3 <examples_dir>/<path>.py ...`` (matched on the path's tail)."""
    if not argv:
        return None
    if argv[0] in TOOLS:
        return TOOLS[argv[0]]
    if len(argv) > 1 and argv[1].endswith(".py"):
        script = argv[1].replace("\\", "/")
        for name, tool in TOOLS.items():
            if name.endswith(".py") and (script == name or script.endswith("/" + name)):
                return tool
    return None


def check_argv(argv: list[str] | tuple[str, ...], tool: Tool | None = None) -> list[str]:
    """Problems with ``argv`` for ``tool`` (found from argv if not given): unknown flags, a value
    missing or not among the allowed choices, a value given to a switch. Empty list = accepted."""
    tool = tool or tool_for(argv)
    if tool is None:
        return [f"not a known TRT-LLM tool: {' '.join(argv[:2])}"]
    start = 1 if argv[0] == tool.name else 2
    if tool.name == "trtllm-serve":
        start += 1  # the positional MODEL
    problems: list[str] = []
    i = start
    while i < len(argv):
        flag = argv[i]
        if not flag.startswith("--"):
            problems.append(f"{tool.name}: unexpected positional argument {flag!r}")
            i += 1
            continue
        if flag not in tool.flags:
            problems.append(f"{tool.name}: unknown flag {flag} (upstream: {tool.source})")
            # its value, if any, is not a second problem
            i += 2 if i + 1 < len(argv) and not argv[i + 1].startswith("--") else 1
            continue
        spec = tool.flags[flag]
        if spec is None:  # a switch
            i += 1
            continue
        if i + 1 >= len(argv) or argv[i + 1].startswith("--"):
            problems.append(f"{tool.name}: {flag} needs a value")
            i += 1
            continue
        value = argv[i + 1]
        if isinstance(spec, tuple) and value not in spec:
            problems.append(f"{tool.name}: {flag} {value!r} is not one of {', '.join(spec)}")
        i += 2
    return problems


def check_llm_api(options: Mapping, *, triton_model_yaml: bool = False) -> list[str]:
    """Problems with an LLM-API options dict (``--extra_llm_api_options`` YAML or Triton's
    llmapi ``model.yaml`` when ``triton_model_yaml``): unknown keys at any level, an unknown
    ``decoding_type`` or one the PyTorch backend does not run."""
    problems: list[str] = []
    allowed = LLM_ARGS_KEYS | LLM_API_PASSTHROUGH_KEYS | (TRITON_LLMAPI_EXTRA_KEYS if triton_model_yaml else frozenset())
    for key in options:
        if key not in allowed:
            problems.append(f"LLM-API: unknown key {key!r} ({LLM_ARGS_SOURCE})")
    for key in options.get("kv_cache_config") or {}:
        if key not in KV_CACHE_CONFIG_KEYS:
            problems.append(f"LLM-API: unknown key kv_cache_config.{key}")
    spec = options.get("speculative_config")
    if spec is not None:
        dtype = spec.get("decoding_type")
        keys = SPECULATIVE_CONFIG_KEYS.get(dtype)
        if keys is None:
            problems.append(f"LLM-API: unknown speculative_config.decoding_type {dtype!r}")
        else:
            if options.get("backend", "pytorch") == "pytorch" and dtype not in PYTORCH_DECODING_TYPES:
                problems.append(f"LLM-API: decoding_type {dtype!r} does not run on the PyTorch backend")
            for key in spec:
                if key not in keys:
                    problems.append(f"LLM-API: unknown key speculative_config.{key} for decoding_type {dtype}")
    if triton_model_yaml:
        for key in options.get("triton_config") or {}:
            if key not in TRITON_CONFIG_KEYS:
                problems.append(f"Triton llmapi model.yaml: unknown key triton_config.{key}")
    return problems


def _yaml_names(options: Mapping) -> list[str]:
    """The dotted names of an LLM-API options dict, in LLM_API_NAMES's form."""
    names: list[str] = []
    for key, value in options.items():
        if key == "triton_config":
            continue
        names.append(key)
        if key in ("kv_cache_config", "speculative_config") and isinstance(value, Mapping):
            for sub, v in value.items():
                names.append(f"{key}.{sub}={v}" if (key, sub) == ("speculative_config", "decoding_type") else f"{key}.{sub}")
    return names


def unconfirmed_llm_api_names(options: Mapping) -> list[str]:
    """Names in ``options`` (an LLM-API YAML trtspec wrote) that are not confirmed to load on
    TRTLLM_RELEASE: not accepted by both bracketing copies of llm_args.py, or not in LLM_API_NAMES
    at all (a recipe passthrough). Each entry says why."""
    out: list[str] = []
    for name in _yaml_names(options):
        check = LLM_API_NAME_INDEX.get(name)
        if check is None:
            if name.startswith("speculative_config.decoding_type="):
                dtype = name.split("=", 1)[1]
                why = ONE_COPY_DECODING_TYPES.get(dtype, "not read in either copy")
            elif name.split(".")[0] in ("kv_cache_config", "speculative_config") or name in LLM_API_PASSTHROUGH_KEYS:
                why = "a passthrough name, checked against one 1.x copy only"
            else:
                why = "not read in either copy"
            out.append(f"{name}: {why}")
        elif not check.confirmed:
            which = "the 1.1/1.2.0rc-era copy" if not check.older else "the pre-1.3 copy"
            out.append(f"{name}: not in 1.2.1's quoted text and refused by {which} of {LLM_ARGS_PATH}; "
                       f"{check.note}".rstrip("; "))
    return out


# This project's own `trtspec quantize` (issue 6's CLI shape) which the PyTorch flow's quantize
# stage runs; the tests hold it against trtspec.cli once that command exists.
TRTSPEC_QUANTIZE_FLAGS = frozenset({
    "--model", "--format", "--kv-cache", "--calib", "--calib-split", "--calib-column", "--calib-size",
    "--calib-seq-len", "--export", "-o",
})
