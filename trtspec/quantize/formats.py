"""Quantization formats: which ModelOpt config each trtspec format means, and which combinations
are refused because they fail upstream (reference/trtllm-triton.md §0.7, §1.6).

Pure data and checks: nothing here imports ModelOpt, so the CLI and preflight can use it cheaply.
``modelopt_config`` builds the actual ``mtq`` config (a fresh deep copy each call; ModelOpt 0.47's
``quant_cfg`` is a *list* of rules where later rules win, so KV-cache rules are appended).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from trtspec.errors import ConfigError

EXPORTS = ("hf", "trtllm", "torch")
ROLES = ("target", "draft", "eagle3_head")
GPU_ARCHS = ("any", "ampere", "ada", "hopper", "blackwell")
# GPU families that have FP8 tensor cores (Ada = sm89, Hopper = sm90, Blackwell = sm100+)
FP8_ARCHS = ("ada", "hopper", "blackwell")



@dataclass(frozen=True)
class Format:
    name: str
    modelopt_cfg: str  # attribute of modelopt.torch.quantization
    weights: str
    activations: str
    quant_algo: str  # what ModelOpt writes as hf_quant_config "quant_algo"
    slow_on_cpu: bool = False  # AWQ's search runs the calibration loop many times
    needs_fp8: bool = False  # FP8 math at run time: Ada / Hopper / Blackwell


FORMATS: dict[str, Format] = {
    f.name: f
    for f in (
        Format("fp8", "FP8_DEFAULT_CFG", "FP8 E4M3 per-tensor", "FP8 E4M3 per-tensor (static)", "FP8", needs_fp8=True),
        Format("int8_sq", "INT8_SMOOTHQUANT_CFG", "INT8 per-channel", "INT8 per-tensor (SmoothQuant)", "W8A8_SQ_PER_CHANNEL"),
        Format("int8_wo", "INT8_WEIGHT_ONLY_CFG", "INT8 per-channel", "unquantized", "W8A16"),
        # ModelOpt labels plain INT4 blockwise W4A16_AWQ too (no pre_quant_scale): TRT-LLM runs it the same way
        Format("int4_wo", "INT4_BLOCKWISE_WEIGHT_ONLY_CFG", "INT4 blocks of 128", "unquantized", "W4A16_AWQ"),
        Format("int4_awq", "INT4_AWQ_CFG", "INT4 blocks of 128, AWQ scales", "unquantized", "W4A16_AWQ", slow_on_cpu=True),
        Format("w4a8_awq", "W4A8_AWQ_BETA_CFG", "INT4 blocks of 128, AWQ scales", "FP8 E4M3 per-tensor (static)", "W4A8_AWQ",
               slow_on_cpu=True, needs_fp8=True),
        Format("nvfp4", "NVFP4_DEFAULT_CFG", "FP4 E2M1, blocks of 16 with FP8 scales", "FP4 E2M1 (dynamic blocks of 16)", "NVFP4"),
    )
}

KV_CACHE: dict[str, list[dict[str, Any]]] = {
    # ModelOpt's FP8_KV_CFG: per-tensor E4M3 on the K and V inputs of attention (after RoPE)
    "fp8": [{"quantizer_name": "*[kv]_bmm_quantizer", "cfg": {"num_bits": (4, 3), "axis": None}}],
    # ModelOpt 0.47 has no INT8 KV preset; num_bits 8 on the same quantizers is what its exporter
    # recognises as kv_cache_quant_algo "INT8" (modelopt.torch.export.quant_utils.get_kv_cache_dtype)
    "int8": [{"quantizer_name": "*[kv]_bmm_quantizer", "cfg": {"num_bits": 8, "axis": None}}],
}

# quantization.lm_head: rules appended after the format's (which disable "*lm_head*"); weights only,
# the head's input stays unquantized. int8_wo: ModelOpt's INT8_WEIGHT_ONLY_CFG weight rule
LM_HEAD: dict[str, list[dict[str, Any]]] = {
    "int8_wo": [{"quantizer_name": "*lm_head*weight_quantizer", "cfg": {"num_bits": 8, "axis": 0}}],
}


def check_lm_head(lm_head: str, *, field: str = "quantization.lm_head") -> str:
    if lm_head not in ("none", *LM_HEAD):
        raise ConfigError(field, lm_head, "unknown LM-head format", fix=f"use one of: none, {', '.join(LM_HEAD)}")
    return lm_head


def check_format(fmt: str, *, field: str = "quantization.format") -> Format:
    if fmt not in FORMATS:
        raise ConfigError(field, fmt, "unknown quantization format", fix=f"use one of: {', '.join(FORMATS)}")
    return FORMATS[fmt]


def check_kv_cache(kv: str, *, field: str = "quantization.kv_cache") -> str:
    if kv not in ("none", *KV_CACHE):
        raise ConfigError(field, kv, "unknown KV-cache format", fix=f"use one of: none, {', '.join(KV_CACHE)}")
    return kv


def modelopt_config(fmt: str, kv_cache: str = "none", *, nvfp4_cpu: bool = False, lm_head: str = "none") -> dict[str, Any]:
    """A fresh ModelOpt quantization config for ``fmt`` (+ KV cache and LM head rules)."""
    import modelopt.torch.quantization as mtq

    f = check_format(fmt)
    cfg = copy.deepcopy(getattr(mtq, f.modelopt_cfg))
    if nvfp4_cpu and fmt == "nvfp4":
        from trtspec.quantize import nvfp4_cpu as backend  # lazy: imports torch

        if not backend.register():
            import modelopt

            raise ConfigError("quantization.format", fmt, f"NVFP4 on CPU needs ModelOpt's custom quantization "
                              f"backends, which ModelOpt {modelopt.__version__} does not have",
                              fix="calibrate on a GPU, or install nvidia-modelopt 0.47 (pip install 'trtspec[quantize]')")
        # ModelOpt's NVFP4 fake-quant kernel is CUDA-only; route the dynamic-block rules to the
        # pure-torch port of that kernel (same numerics, see nvfp4_cpu.py)
        for rule in cfg["quant_cfg"]:
            c = rule.get("cfg")
            if isinstance(c, dict) and (c.get("block_sizes") or {}).get("type") == "dynamic":
                c["backend"] = backend.NVFP4_CPU_BACKEND
    if check_kv_cache(kv_cache) != "none":
        cfg["quant_cfg"] = list(cfg["quant_cfg"]) + copy.deepcopy(KV_CACHE[kv_cache])
    if check_lm_head(lm_head) != "none":
        cfg["quant_cfg"] = list(cfg["quant_cfg"]) + copy.deepcopy(LM_HEAD[lm_head])
    return cfg


class Refused(ConfigError):
    """A combination that is known to fail upstream; ``force`` turns it into a warning."""


def check_combination(
    fmt: str,
    kv_cache: str = "none",
    *,
    role: str = "target",
    export: str = "torch",
    gpu_arch: str = "any",
    force: bool = False,
    lm_head: str = "none",
) -> list[str]:
    """Refuse combinations known to fail upstream; return warnings for the rest.

    Raises :class:`Refused` (unless ``force``) or :class:`ConfigError` (never forceable: the
    artifact cannot be produced at all).
    """
    f = check_format(fmt)
    check_kv_cache(kv_cache)
    if export not in EXPORTS:
        raise ConfigError("export", export, "unknown export", fix=f"use one of: {', '.join(EXPORTS)}")
    if role not in ROLES:
        raise ConfigError("role", role, "unknown role", fix=f"use one of: {', '.join(ROLES)}")
    if gpu_arch not in GPU_ARCHS:
        raise ConfigError("gpu_arch", gpu_arch, "unknown GPU family", fix=f"use one of: {', '.join(GPU_ARCHS)}")
    if check_lm_head(lm_head) != "none" and (export != "torch" or role == "eagle3_head"):
        raise ConfigError(
            "quantization.lm_head", lm_head,
            "a quantized LM head is run by trtspec's torch runtime only (a torch export of a target or draft); "
            "TRT-LLM quantizes its LM head in the body's format (quantize.py --quantize_lm_head)",
            fix="set quantization.lm_head: none for this export, or use --export torch",
        )
    if role == "eagle3_head" and export == "trtllm":
        raise ConfigError(
            "export", export,
            "ModelOpt has no exporter that writes an EAGLE head as a legacy TRT-LLM checkpoint "
            "(the EAGLE path is unified-HF only)",
            fix="use --export hf (TRT-LLM PyTorch flow / EAGLE convert path) or --export torch",
        )

    warnings: list[str] = []
    problems: list[tuple[str, str, object, str, str]] = []  # (kind, field, value, problem, fix)

    if fmt == "nvfp4":
        if gpu_arch in ("ampere", "ada", "hopper"):
            problems.append((
                "refuse", "quantization.format", fmt,
                f"NVFP4 inference needs Blackwell GPUs; the deployment GPU is {gpu_arch!r}",
                "use fp8 or int4_awq (or w4a8_awq) on Hopper, or pass --force to quantize anyway",
            ))
        elif gpu_arch != "blackwell":
            warnings.append("nvfp4 needs Blackwell GPUs for TRT-LLM (set --gpu-arch blackwell to confirm the target)")
        warnings.append("nvfp4 fake-quant on CPU uses trtspec's torch port of ModelOpt's NVFP4 kernel: an accuracy estimate, not a speed-up")
    needs_fp8 = f.needs_fp8 or kv_cache == "fp8"
    if needs_fp8 and gpu_arch == "ampere":
        what = f"format {fmt!r}" if f.needs_fp8 else "kv_cache 'fp8'"
        problems.append((
            "refuse", "quantization.format" if f.needs_fp8 else "quantization.kv_cache", fmt if f.needs_fp8 else kv_cache,
            f"{what} needs FP8 tensor cores (Ada, Hopper or Blackwell); the deployment GPU is 'ampere'",
            "use int8_sq, int8_wo or int4_awq (kv_cache int8) on Ampere, or pass --force",
        ))
    if fmt == "int8_sq" and role == "eagle3_head":
        problems.append((
            "refuse", "quantization.format", fmt,
            "INT8 SmoothQuant with EAGLE fails upstream (TRT-LLM#3207: --smoothquant crashes the EAGLE convert)",
            "use fp8 or leave the head unquantized, or pass --force",
        ))
    if fmt == "int8_sq" and export == "hf":
        problems.append((
            "refuse", "quantization.format", fmt,
            "the TRT-LLM PyTorch flow does not load INT8 SmoothQuant unified checkpoints (ModelOpt's hf_ptq "
            "still writes legacy TRT-LLM checkpoints for int8_sq)",
            "use --export trtllm (engine flow) or --export torch, or fp8/int4_awq for the PyTorch flow, or pass --force",
        ))
    if role == "eagle3_head" and fmt not in ("fp8",):
        warnings.append(f"only FP8 EAGLE heads are documented for TRT-LLM; {fmt!r} is untested upstream")
    if kv_cache != "none" and export == "trtllm" and fmt in ("int8_wo", "int4_wo", "int4_awq"):
        warnings.append(f"kv_cache {kv_cache!r} with weight-only {fmt!r}: check your TRT-LLM version builds it")

    for _, field, value, problem, fix in problems:
        if not force:
            raise Refused(field, value, problem + " (known to fail upstream)", fix=fix)
        warnings.append(f"forced: {problem}")
    return warnings


def export_for_runtime(backend: str) -> str:
    """The export a recipe's ``runtime.backend`` consumes."""
    table = {"torch": "torch", "trtllm-pytorch": "hf", "trtllm-engine": "trtllm"}
    if backend not in table:
        raise ConfigError("runtime.backend", backend, "no quantized export for this runtime", fix=f"one of {sorted(table)}")
    return table[backend]
