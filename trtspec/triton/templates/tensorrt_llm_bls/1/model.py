"""tensorrt_llm_bls: NVIDIA's text-level BLS contract. The logic lives in trtspec.triton.backend.nvidia_bls."""

import triton_python_backend_utils as pb_utils

from trtspec.triton.backend.nvidia_bls import TextBls


class TritonPythonModel(TextBls):
    pb = pb_utils
