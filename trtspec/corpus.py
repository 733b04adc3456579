"""The local text corpus: this interpreter's standard-library sources, split into train and
held-out files. Torch-free: the tiny-model trainer, the built-in prompts, quantization
calibration and the TRT-LLM calibration script all read it.
"""

from __future__ import annotations

import pathlib
import sysconfig


def stdlib_files() -> list[pathlib.Path]:
    """Top-level ``*.py`` files of this interpreter's standard library, sorted."""
    root = pathlib.Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.glob("*.py") if p.is_file())
    if len(files) < 50:
        raise RuntimeError(f"standard library sources not found under {root}")
    return files


def corpus_split(heldout_every: int = 16) -> tuple[list[str], list[str]]:
    train, held = [], []
    for i, p in enumerate(stdlib_files()):
        text = p.read_text(encoding="utf-8", errors="replace")
        (held if i % heldout_every == heldout_every // 2 else train).append(text)
    return train, held
