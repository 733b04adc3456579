"""ModelOpt post-training quantization of target and draft models: formats, calibration data,
exports for each runtime (unified HF, legacy TRT-LLM, torch fake-quant) and a quality report
that speaks in acceptance rate.

Importing this package does not import ModelOpt; the stage imports it when it runs.
"""

from trtspec.quantize.formats import EXPORTS, FORMATS, KV_CACHE, Refused, check_combination, export_for_runtime
from trtspec.quantize.quality import QualitySettings
from trtspec.quantize.stage import QuantizeResult, make_quantization, quantize_model, quantize_spec

__all__ = [
    "EXPORTS",
    "FORMATS",
    "KV_CACHE",
    "QualitySettings",
    "QuantizeResult",
    "Refused",
    "check_combination",
    "export_for_runtime",
    "make_quantization",
    "quantize_model",
    "quantize_spec",
]
