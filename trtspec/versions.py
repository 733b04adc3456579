"""Version gates for TensorRT-LLM.

The TensorRT *engine* flow (convert_checkpoint.py → trtllm-build → tensorrtllm backend) was
removed upstream after 1.2.x (TRT-LLM PRs #15763, #15907, #15918; mid-2026). The PyTorch/LLM-API
flow is what upstream keeps.
"""

from __future__ import annotations

import re

ENGINE_FLOW_MAX = (1, 2)  # last minor release with trtllm-build


def parse_version(v: str) -> tuple[int, int, int, str]:
    m = re.match(r"^\s*v?(\d+)\.(\d+)(?:\.(\d+))?(.*)$", v)
    if not m:
        raise ValueError(f"not a version: {v!r}")
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0), m.group(4).strip()


def engine_flow_supported(version: str) -> tuple[bool, str]:
    try:
        major, minor, patch, tail = parse_version(version)
    except ValueError:
        return False, f"TensorRT-LLM version {version!r} is not a version number"
    if (major, minor) <= ENGINE_FLOW_MAX:
        return True, f"TensorRT-LLM {version}: the engine flow (trtllm-build) is available"
    return False, (
        f"TensorRT-LLM {version} has no engine flow: trtllm-build and convert_checkpoint.py were removed after 1.2.x"
    )


def installed_trtllm_version() -> str | None:
    """Version of an importable ``tensorrt_llm`` without importing it (importing loads CUDA)."""
    from importlib import metadata

    for dist in ("tensorrt_llm", "tensorrt-llm"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


PYTORCH_FLOW_MIN = (1, 0)  # PyTorch became TRT-LLM's default backend, with the LLM-API YAML flow, in 1.0


def release_line(version: str) -> tuple[int, int]:
    """(major, minor) of a version string; ValueError if it is not one."""
    major, minor, _, _ = parse_version(version)
    return major, minor


def pytorch_flow_supported(version: str) -> tuple[bool, str]:
    try:
        line = release_line(version)
    except ValueError:
        return False, f"TensorRT-LLM version {version!r} is not a version number"
    if line >= PYTORCH_FLOW_MIN:
        return True, f"TensorRT-LLM {version}: the PyTorch LLM-API flow (speculative_config YAML) is available"
    return False, f"TensorRT-LLM {version} predates the PyTorch LLM-API flow (1.0)"
