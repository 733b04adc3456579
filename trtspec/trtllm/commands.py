"""Pure argv builders for the TensorRT-LLM engine flow (TRT-LLM ≤ 1.2.x) and its neighbours.

Each function returns one argv list and touches nothing. Flag names and values are the ones in
``trtspec.trtllm.accepted_names`` (read from the upstream scripts); the golden tests hold every
list generated for the shipped recipes against that data.

Upstream recipes these follow (reference/trtllm-triton.md §1.2):
- quantize: ``examples/quantization/quantize.py`` writes a TRT-LLM checkpoint directly, sharded
  for the given TP/PP (NVIDIA's draft-target blog route); Medusa heads ride along (FP8 base,
  FP16 heads). EAGLE FP8 goes through ``examples/eagle/quantize.py`` (one ModelOpt unified
  checkpoint: base + ``eagle_module`` + ``hf_quant_config.json``).
- convert: one ``convert_checkpoint.py`` per model family; EAGLE and Medusa have their own.
- build: ``trtllm-build`` with ``--speculative_decoding_mode`` and ``--max_draft_len`` on the
  target, ``--use_paged_context_fmha enable`` (KV-cache reuse: the draft-target loop resubmits the
  context every iteration) and ``--gather_generation_logits`` when draft logits are compared.
"""

from __future__ import annotations

from dataclasses import dataclass

PYTHON = "python3"

# model family → convert_checkpoint.py under examples/ (Mistral and Mixtral use Llama's)
CONVERT_SCRIPTS = {
    "llama": "models/core/llama/convert_checkpoint.py",
    "mistral": "models/core/llama/convert_checkpoint.py",
    "mixtral": "models/core/llama/convert_checkpoint.py",
    "qwen": "models/core/qwen/convert_checkpoint.py",
}
# HF config.json model_type → family
MODEL_TYPE_FAMILY = {
    "llama": "llama",
    "mistral": "mistral",
    "mixtral": "mixtral",
    "qwen": "qwen",
    "qwen2": "qwen",
}
# family → examples/medusa/convert_checkpoint.py --model_type
MEDUSA_MODEL_TYPE = {"llama": "llama", "mistral": "llama", "mixtral": "mixtral", "qwen": "qwen2"}

QUANTIZE_SCRIPT = "quantization/quantize.py"
EAGLE_QUANTIZE_SCRIPT = "eagle/quantize.py"
EAGLE_CONVERT_SCRIPT = "eagle/convert_checkpoint.py"
MEDUSA_CONVERT_SCRIPT = "medusa/convert_checkpoint.py"

# recipe quantization format → quantize.py --qformat ("none" with a quantized KV cache = full_prec)
QFORMAT = {
    "none": "full_prec",
    "fp8": "fp8",
    "int8_sq": "int8_sq",
    "int8_wo": "int8_wo",
    "int4_wo": "int4_wo",
    "int4_awq": "int4_awq",
    "w4a8_awq": "w4a8_awq",
    "nvfp4": "nvfp4",
}

# speculation method → trtllm-build --speculative_decoding_mode of the target engine.
# NGram on the engine flow is V1: the target verifies externally proposed tokens.
SPECULATIVE_DECODING_MODE = {
    "none": None,
    "draft_target": "draft_tokens_external",
    "ngram": "draft_tokens_external",
    "eagle": "eagle",
    "medusa": "medusa",
    "lookahead": "lookahead_decoding",
}


@dataclass(frozen=True)
class Calibration:
    """Calibration data as the TRT-LLM quantize scripts take it: a dataset name they know
    (``cnn_dailymail``) or a local dataset folder (``train`` split, ``text`` column)."""

    dataset: str
    size: int
    seq_len: int


def _script(examples_dir: str, rel: str) -> str:
    return f"{examples_dir.rstrip('/')}/{rel}"


def quantize_argv(
    examples_dir: str,
    *,
    model_dir: str,
    output_dir: str,
    qformat: str,
    kv_cache_dtype: str | None,
    dtype: str,
    calib: Calibration,
    tp_size: int,
    pp_size: int,
    medusa_model_dir: str | None = None,
    num_medusa_heads: int | None = None,
    max_draft_len: int | None = None,
    python: str = PYTHON,
) -> list[str]:
    """``examples/quantization/quantize.py``: ModelOpt PTQ → TRT-LLM checkpoint (rank{i}.safetensors)."""
    argv = [
        python, _script(examples_dir, QUANTIZE_SCRIPT),
        "--model_dir", model_dir,
        "--output_dir", output_dir,
        "--dtype", dtype,
        "--qformat", qformat,
    ]
    if kv_cache_dtype:
        argv += ["--kv_cache_dtype", kv_cache_dtype]
    argv += [
        "--calib_dataset", calib.dataset,
        "--calib_size", str(calib.size),
        "--calib_max_seq_length", str(calib.seq_len),
        "--tp_size", str(tp_size),
        "--pp_size", str(pp_size),
    ]
    if medusa_model_dir is not None:
        # FP8 base + FP16 Medusa heads (examples/medusa/README.md)
        argv += [
            "--medusa_model_dir", medusa_model_dir,
            "--num_medusa_heads", str(num_medusa_heads),
            "--max_draft_len", str(max_draft_len),
        ]
    return argv


def eagle_quantize_argv(
    examples_dir: str,
    *,
    model_dir: str,
    eagle_model_dir: str,
    output_dir: str,
    kv_cache_dtype: str | None,
    calib: Calibration,
    python: str = PYTHON,
) -> list[str]:
    """``examples/eagle/quantize.py``: FP8 base + EAGLE head → one ModelOpt unified HF checkpoint.

    ``--eagle_num_layers`` (decoder layers inside the head) keeps its default of 1, which is
    what EAGLE-1/2 heads have."""
    argv = [
        python, _script(examples_dir, EAGLE_QUANTIZE_SCRIPT),
        "--model_dir", model_dir,
        "--eagle_model_dir", eagle_model_dir,
        "--output_dir", output_dir,
        "--qformat", "fp8",
    ]
    if kv_cache_dtype:
        argv += ["--kv_cache_dtype", kv_cache_dtype]
    argv += [
        "--calib_dataset", calib.dataset,
        "--calib_size", str(calib.size),
        "--calib_max_seq_length", str(calib.seq_len),
    ]
    return argv


def convert_argv(
    examples_dir: str,
    family: str,
    *,
    model_dir: str,
    output_dir: str,
    dtype: str,
    tp_size: int,
    pp_size: int,
    python: str = PYTHON,
) -> list[str]:
    """The family's ``convert_checkpoint.py``: HF folder → TRT-LLM checkpoint, unquantized."""
    world = tp_size * pp_size
    argv = [
        python, _script(examples_dir, CONVERT_SCRIPTS[family]),
        "--model_dir", model_dir,
        "--output_dir", output_dir,
        "--dtype", dtype,
        "--tp_size", str(tp_size),
        "--pp_size", str(pp_size),
    ]
    if world > 1:
        argv += ["--workers", str(world)]
    return argv


def eagle_convert_argv(
    examples_dir: str,
    *,
    model_dir: str,
    eagle_model_dir: str | None,
    output_dir: str,
    dtype: str,
    tp_size: int,
    max_draft_len: int,
    num_eagle_layers: int,
    max_non_leaves_per_layer: int,
    python: str = PYTHON,
) -> list[str]:
    """``examples/eagle/convert_checkpoint.py``. With ``eagle_model_dir=None`` it takes the
    "single checkpoint for ModelOpt" path: base and ``eagle_module`` from ``model_dir``, and its
    ``hf_quant_config.json`` merged into both configs (the only way to an FP8 EAGLE engine)."""
    argv = [python, _script(examples_dir, EAGLE_CONVERT_SCRIPT), "--model_dir", model_dir]
    if eagle_model_dir is not None:
        argv += ["--eagle_model_dir", eagle_model_dir]
    argv += [
        "--output_dir", output_dir,
        "--dtype", dtype,
        "--tp_size", str(tp_size),
        "--max_draft_len", str(max_draft_len),
        "--num_eagle_layers", str(num_eagle_layers),
        "--max_non_leaves_per_layer", str(max_non_leaves_per_layer),
    ]
    if tp_size > 1:
        argv += ["--workers", str(tp_size)]
    return argv


def medusa_convert_argv(
    examples_dir: str,
    *,
    model_dir: str,
    medusa_model_dir: str,
    output_dir: str,
    dtype: str,
    model_type: str,
    tp_size: int,
    pp_size: int,
    num_medusa_heads: int,
    max_draft_len: int,
    python: str = PYTHON,
) -> list[str]:
    """``examples/medusa/convert_checkpoint.py`` (its draft length flag is ``--max_medusa_token_len``)."""
    world = tp_size * pp_size
    argv = [
        python, _script(examples_dir, MEDUSA_CONVERT_SCRIPT),
        "--model_dir", model_dir,
        "--medusa_model_dir", medusa_model_dir,
        "--output_dir", output_dir,
        "--dtype", dtype,
        "--model_type", model_type,
        "--tp_size", str(tp_size),
        "--pp_size", str(pp_size),
        "--num_medusa_heads", str(num_medusa_heads),
        "--max_medusa_token_len", str(max_draft_len),
    ]
    if world > 1:
        argv += ["--workers", str(world)]
    return argv


def build_argv(
    *,
    checkpoint_dir: str,
    output_dir: str,
    gemm_plugin: str,
    max_batch_size: int,
    max_input_len: int,
    max_seq_len: int,
    max_num_tokens: int | None,
    speculative_decoding_mode: str | None,
    max_draft_len: int,
    gather_generation_logits: bool,
    world_size: int,
) -> list[str]:
    """``trtllm-build``: TRT-LLM checkpoint → engine (rank{i}.engine). TP/PP come from the checkpoint.

    The builder adds ``max_draft_len`` to ``max_seq_len`` by itself ("Increasing max_seq_len …
    to account for speculative decoding"), so ``max_seq_len`` is passed as the recipe states it.
    """
    argv = [
        "trtllm-build",
        "--checkpoint_dir", checkpoint_dir,
        "--output_dir", output_dir,
        "--gemm_plugin", gemm_plugin,
        "--kv_cache_type", "paged",
        # KV-cache reuse and chunked context need it; draft-target depends on reuse
        "--use_paged_context_fmha", "enable",
        "--max_batch_size", str(max_batch_size),
        "--max_input_len", str(max_input_len),
        "--max_seq_len", str(max_seq_len),
    ]
    if max_num_tokens is not None:
        argv += ["--max_num_tokens", str(max_num_tokens)]
    if speculative_decoding_mode is not None:
        argv += ["--speculative_decoding_mode", speculative_decoding_mode, "--max_draft_len", str(max_draft_len)]
    if gather_generation_logits:
        argv += ["--gather_generation_logits"]
    if world_size > 1:
        argv += ["--workers", str(world_size)]
    return argv


def trtspec_quantize_argv(
    *,
    model: str,
    fmt: str,
    kv_cache: str,
    calib_file: str | None,
    calib_size: int,
    calib_split: str | None = None,
    calib_column: str | None = None,
    calib_seq_len: int,
    output_dir: str,
) -> list[str]:
    """``trtspec quantize`` (this project's ModelOpt stage) exporting the unified HF checkpoint
    that the TRT-LLM PyTorch flow loads (``hf_quant_config.json``)."""
    argv = ["trtspec", "quantize", "--model", model, "--format", fmt]
    if kv_cache != "none":
        argv += ["--kv-cache", kv_cache]
    if calib_file is not None:
        argv += ["--calib", calib_file]
    if calib_split:
        argv += ["--calib-split", calib_split]
    if calib_column:
        argv += ["--calib-column", calib_column]
    argv += ["--calib-size", str(calib_size), "--calib-seq-len", str(calib_seq_len), "--export", "hf", "-o", output_dir]
    return argv


def serve_argv(model: str, *, extra_options: str, tokenizer: str | None, host: str, port: int) -> list[str]:
    """``trtllm-serve`` for the PyTorch flow (OpenAI-compatible server), options from the YAML."""
    argv = ["trtllm-serve", model, "--backend", "pytorch"]
    if tokenizer:
        argv += ["--tokenizer", tokenizer]
    return argv + ["--host", host, "--port", str(port), "--extra_llm_api_options", extra_options]
