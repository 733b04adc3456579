"""preprocessing: text → token ids. The logic lives in trtspec.triton.backend.tokenizer."""

import triton_python_backend_utils as pb_utils

from trtspec.triton.backend.tokenizer import Preprocessing


class TritonPythonModel(Preprocessing):
    pb = pb_utils
