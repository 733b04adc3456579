"""postprocessing: token ids → text. The logic lives in trtspec.triton.backend.tokenizer."""

import triton_python_backend_utils as pb_utils

from trtspec.triton.backend.tokenizer import Postprocessing


class TritonPythonModel(Postprocessing):
    pb = pb_utils
