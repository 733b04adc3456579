"""The loader of a quantized checkpoint folder, chosen by its manifest's ``kind``.

A ``trtspec quantize`` export of a model or an EAGLE-3 head restores ModelOpt state, so its
loader lives in :mod:`trtspec.quantize` and needs ModelOpt. The torch runtime does not depend on
that layer: it names the loader here and imports it only when such a folder is opened.
"""

from __future__ import annotations

import importlib
from typing import Callable

# (manifest kind, what is loaded) → "module:function"
LOADERS: dict[tuple[str, str], str] = {
    ("quantized", "causal_lm"): "trtspec.quantize.runtime:load_quantized",
    ("quantized", "eagle3_head"): "trtspec.quantize.eagle3_head:load_quantized_head",
}


def loader_for(kind: str | None, what: str) -> Callable | None:
    """The function that loads a ``what`` from a folder whose manifest kind is ``kind``;
    None when the folder is a plain checkpoint (the caller loads it itself)."""
    ref = LOADERS.get((kind or "", what))
    if ref is None:
        return None
    module, func = ref.split(":")
    return getattr(importlib.import_module(module), func)
