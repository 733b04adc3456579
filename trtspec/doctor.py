"""``trtspec doctor``: one table of what this environment can run."""

from __future__ import annotations

import platform
import shutil
import sys
from dataclasses import asdict, dataclass
from importlib import metadata
from trtspec.versions import engine_flow_supported, installed_trtllm_version
from trtspec.triton.launch.paths import bundled_tritonserver

# nvidia-pytriton bundles one tritonserver build; the wheel carries no version file.
PYTRITON_TRITON = {"0.7.0": "2.51.0", "0.5.7": "2.45.0"}


@dataclass
class Row:
    component: str
    status: str  # "ok" | "missing" | "warn" | "info"
    detail: str


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def collect() -> list[Row]:
    rows: list[Row] = []
    py = sys.version.split()[0]
    rows.append(Row("python", "ok" if sys.version_info >= (3, 11) else "warn", f"{py} ({sys.executable})"))
    rows.append(Row("platform", "info", f"{platform.system()} {platform.machine()}"))

    tv = _version("torch")
    if tv:
        import torch

        cuda = torch.cuda.is_available()
        gpu = torch.cuda.get_device_name(0) if cuda else "none"
        rows.append(Row("torch", "ok", f"{tv}, CUDA {'yes (' + str(torch.version.cuda) + ')' if cuda else 'no'}, threads {torch.get_num_threads()}"))
        rows.append(Row("gpu", "ok" if cuda else "info", gpu))
    else:
        rows.append(Row("torch", "missing", "pip install torch==2.13.0"))

    for dist, why in (
        ("transformers", "checkpoints and tokenizers"),
        ("nvidia-modelopt", "quantization (trtspec quantize)"),
        ("tritonclient", "gRPC client (validate, bench)"),
        ("numpy", "must be <2 where Triton's python backend runs"),
    ):
        v = _version(dist)
        status = "ok" if v else "missing"
        if dist == "numpy" and v and int(v.split(".")[0]) >= 2:
            status = "warn"
        rows.append(Row(dist, status, f"{v or 'not installed'} — {why}"))


    trt = installed_trtllm_version()
    if trt:
        ok, why = engine_flow_supported(trt)
        rows.append(Row("tensorrt_llm", "ok", f"{trt} — {'engine + PyTorch flows' if ok else 'PyTorch flow only (' + why + ')'}"))
    else:
        rows.append(Row("tensorrt_llm", "info", "not installed — TRT-LLM runtimes: plans only (--dry-run); torch runtime runs here"))

    on_path = shutil.which("tritonserver")
    pv = _version("nvidia-pytriton")
    if on_path:
        rows.append(Row("tritonserver", "ok", f"on PATH: {on_path}"))
    if pv:

        binary = bundled_tritonserver()
        rows.append(Row("tritonserver (bundled)", "ok" if binary else "missing",
                        f"Triton {PYTRITON_TRITON.get(pv, '?')} from nvidia-pytriton {pv}: {binary or 'binary not found'}"))
    elif not on_path:
        rows.append(Row("tritonserver", "missing", "pip install nvidia-pytriton==0.7.0, or run inside NVIDIA's Triton container"))
    return rows


def as_dicts(rows: list[Row]) -> list[dict]:
    return [asdict(r) for r in rows]
