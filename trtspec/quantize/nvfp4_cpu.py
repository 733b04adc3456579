"""NVFP4 fake-quant on CPU: a torch port of ModelOpt's Triton kernel.

ModelOpt 0.47 fake-quantizes NVFP4 with ``fp4_fake_quant_block`` (Triton, CUDA only; on CPU it
asserts ``amax must be a CUDA tensor``). The kernel, per block of 16 along the last dimension:

  global_scale = amax / (6 * 448)                    (amax: the quantizer's calibrated max)
  scale        = fp8_e4m3(min(block_max / (6 * global_scale), 448)) * global_scale
  scale        = 1 where scale < 1e-5
  y            = sign(x) * round_e2m1(|x| / scale) * scale

with E2M1 magnitudes {0, .5, 1, 1.5, 2, 3, 4, 6} and ties as in the kernel (<= at .25, 1.25,
2.5, 5; < at .75, 1.75, 3.5: round half to even). ModelOpt lets a quantizer rule name a custom
``backend``; ``formats.modelopt_config(..., nvfp4_cpu=True)`` routes the NVFP4 rules here.
"""

from __future__ import annotations

import torch

# the backend name trtspec registers for NVFP4 fake-quant on CPU (formats.modelopt_config writes it
# into the NVFP4 rules; defined here so that this module imports nothing of formats)
NVFP4_CPU_BACKEND = "trtspec_nvfp4_cpu"
E2M1_MAX = 6.0
E4M3_MAX = 448.0


def round_e2m1(a: torch.Tensor) -> torch.Tensor:
    """Round non-negative ``a`` to the nearest E2M1 magnitude (ties to even, as the kernel)."""
    out = torch.full_like(a, 6.0)
    # walk the thresholds from the top so each ``where`` overrides the coarser choice
    for bound, value, inclusive in ((5.0, 4.0, True), (3.5, 3.0, False), (2.5, 2.0, True), (1.75, 1.5, False),
                                    (1.25, 1.0, True), (0.75, 0.5, False), (0.25, 0.0, True)):
        out = torch.where(a <= bound if inclusive else a < bound, torch.full_like(a, value), out)
    return out


def nvfp4_fake_quant(x: torch.Tensor, amax: torch.Tensor, block_size: int = 16) -> torch.Tensor:
    """Quantize-dequantize ``x`` to NVFP4 (blocks of ``block_size`` along the last dim)."""
    shape, dtype = x.shape, x.dtype
    if shape[-1] % block_size:
        raise ValueError(f"NVFP4: last dimension {shape[-1]} is not a multiple of the block size {block_size}")
    xf = x.float().reshape(-1, shape[-1] // block_size, block_size)  # [rows, blocks, 16]
    global_scale = amax.float().amax() / (E2M1_MAX * E4M3_MAX)
    global_scale = torch.where(global_scale > 0, global_scale, torch.full_like(global_scale, 1e-12))
    block_max = xf.abs().amax(-1, keepdim=True)
    scale = (block_max / (E2M1_MAX * global_scale)).clamp(max=E4M3_MAX)
    scale = scale.to(torch.float8_e4m3fn).float() * global_scale
    scale = torch.where(scale >= 1e-5, scale, torch.ones_like(scale))
    q = round_e2m1(xf.abs() / scale) * scale
    y = torch.where(xf >= 0, q, -q)
    return y.reshape(shape).to(dtype)


def _backend(inputs: torch.Tensor, quantizer) -> torch.Tensor:
    # exactly what TensorQuantizer._fake_quantize passes its kernels: the calibrated amax, or the
    # input's own max before calibration
    amax = quantizer._get_amax(inputs)
    block = (quantizer.block_sizes or {}).get(-1) or 16
    return nvfp4_fake_quant(inputs, amax.to(inputs.device), block)


def register() -> bool:
    """Make the backend known to ModelOpt (idempotent); False where this ModelOpt has no custom
    quantization backends (0.37, the TRT-LLM 1.2 container's: NVFP4 then needs a GPU)."""
    try:
        from modelopt.torch.quantization.nn.modules.tensor_quantizer import (  # lazy: ModelOpt's own API
            is_registered_quant_backend,
            register_quant_backend,
        )
    except ImportError:
        return False
    if not is_registered_quant_backend(NVFP4_CPU_BACKEND):
        register_quant_backend(NVFP4_CPU_BACKEND, _backend)
    return True
