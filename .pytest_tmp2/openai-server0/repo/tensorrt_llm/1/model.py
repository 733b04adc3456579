"""tensorrt_llm (torch runtime): trtspec's engine behind the tensorrtllm backend's tensors.
The logic lives in trtspec.triton.backend.engine."""

import triton_python_backend_utils as pb_utils

from trtspec.triton.backend.engine import EngineModel


class TritonPythonModel(EngineModel):
    pb = pb_utils
