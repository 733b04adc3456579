"""trtspec_watchdog: the launcher's watchdog counters. Logic: trtspec.triton.backend.watchdog_model."""

import triton_python_backend_utils as pb_utils

from trtspec.triton.backend.watchdog_model import WatchdogModel


class TritonPythonModel(WatchdogModel):
    pb = pb_utils
