"""Where the tritonserver that nvidia-pytriton ships lives (no import of pytriton itself)."""

from __future__ import annotations

import importlib.util
import pathlib


def pytriton_dist() -> pathlib.Path | None:
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        return None
    d = pathlib.Path(list(spec.submodule_search_locations)[0]) / "tritonserver"
    return d if d.is_dir() else None


def bundled_tritonserver() -> pathlib.Path | None:
    d = pytriton_dist()
    if d is None:
        return None
    b = d / "bin" / "tritonserver"
    return b if b.is_file() else None
