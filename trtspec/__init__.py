"""trtspec: ship speculative-decoding LLM deployments.

quantize (ModelOpt) → build (TensorRT-LLM engine / LLM-API config, or the built-in torch runtime)
→ package (Triton model repository) → serve → validate (gRPC latency, acceptance, equivalence).
"""

__version__ = "0.1.0"
