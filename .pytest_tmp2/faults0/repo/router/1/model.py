"""router: speculative or baseline, with fallback. The logic lives in trtspec.triton.backend.router."""

import triton_python_backend_utils as pb_utils

from trtspec.triton.backend.router import Router


class TritonPythonModel(Router):
    pb = pb_utils
