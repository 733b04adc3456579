"""trtspec_draft_target: token-level draft-target rounds (the engine flow's speculative model) over two models. The logic lives in trtspec.triton.backend.bls."""

import triton_python_backend_utils as pb_utils

from trtspec.triton.backend.bls import DraftTargetBls


class TritonPythonModel(DraftTargetBls):
    pb = pb_utils
