"""tensorrt_llm (TRT-LLM LLM API): LLM(**model.yaml) behind the tensorrtllm backend's tensors.
The logic lives in trtspec.triton.backend.llmapi."""

import triton_python_backend_utils as pb_utils

from trtspec.triton.backend.llmapi import LlmApiModel


class TritonPythonModel(LlmApiModel):
    pb = pb_utils
