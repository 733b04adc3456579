"""The local text corpus: this interpreter's standard-library sources, split into train and
held-out files. Torch-free: the tiny-model trainer, the built-in prompts, quantization
calibration and the TRT-LLM calibration script all read it.
"""

from __future__ import annotations

import pathlib
import random
import re
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


_DOC_END = re.compile(r'^[ \t]*(?:async[ \t]+)?(?:def|class)[ \t]+\w+[^\n]*:[ \t]*\n[ \t]+[rbuRBU]?("""|\'\'\')', re.M)


def code_request_prompts(texts: list[str], n: int, *, seed: int = 0, min_chars: int = 120,
                         max_chars: int = 900) -> list[str]:
    """``n`` code prompts cut from ``texts`` the way a code request reads: some lines of context,
    then a ``def``/``class`` line and its docstring, ending where the body begins (the model writes
    the body). Deterministic for a seed; every prompt ends with a newline. For the EAGLE-3 head's
    self-distillation data (the target's own continuations), so cut from the *train* split."""
    cuts: list[tuple[int, int]] = []
    for fi, text in enumerate(texts):
        for m in _DOC_END.finditer(text):
            close = text.find(m.group(1), m.end())
            if close < 0:
                continue
            end = text.find("\n", close + 3)
            if end < 0 or end - m.start() > max_chars:
                continue
            cuts.append((fi, end + 1))
    rng = random.Random(seed)
    rng.shuffle(cuts)
    out: list[str] = []
    for fi, end in cuts[:n]:
        text = texts[fi]
        want = rng.randint(min_chars, max_chars)
        start = text.rfind("\n", 0, max(end - want, 0)) + 1 if end > want else 0
        out.append(text[start:end])
    return out
