"""Calibration and evaluation text, tokenized into fixed-length windows.

* calibration ``builtin``: the *train* split of the Python stdlib corpus the tiny pair was trained
  on (``trtspec.corpus.corpus_split``), files spread evenly over the corpus;
* calibration from any other source of :mod:`trtspec.calib_sources` (a named or Hugging Face
  dataset, a local dataset folder, a ``.jsonl``/text file): its calibration rows;
* evaluation (quality report): the *held-out* part of the same source, never used for calibration.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch

from trtspec.errors import ConfigError
from trtspec.prompts import stdlib_snippets
from trtspec import calib_sources as sources

FIELD = "quantization.calibration.dataset"


@dataclass
class TextWindows:
    ids: torch.Tensor  # [N, L] token ids
    description: dict  # what went in (for manifests and reports)

    @property
    def tokens(self) -> int:
        return int(self.ids.numel())


def _windows(texts: list[str], tokenizer, n: int, length: int) -> torch.Tensor:
    """Concatenate ``texts`` (EOS between them) and cut up to ``n`` consecutive windows."""
    need = n * length
    ids: list[int] = []
    eos = tokenizer.eos_token_id
    for t in texts:
        ids.extend(tokenizer(t, add_special_tokens=False)["input_ids"])
        if eos is not None:
            ids.append(eos)
        if len(ids) >= need:
            break
    got = min(n, len(ids) // length)
    return torch.tensor(ids[: got * length], dtype=torch.long).view(got, length)


def _spread(texts: list[str], n: int) -> list[str]:
    """Every k-th text, so a small set still samples the whole corpus; then the rest."""
    k = max(1, len(texts) // max(n, 1))
    order = list(range(0, len(texts), k))
    picked = set(order)
    order += [i for i in range(len(texts)) if i not in picked]
    return [texts[i] for i in order]


def _digest(ids: torch.Tensor) -> str:
    return hashlib.sha256(ids.numpy().tobytes()).hexdigest()[:16]


def calibration_windows(dataset: str, tokenizer, size: int, seq_len: int, *, split: str | None = None,
                        column: str | None = None) -> TextWindows:
    """``size`` windows of ``seq_len`` tokens from the calibration part of ``dataset`` (any
    source of :mod:`trtspec.calib_sources`; its held-out part is never used here)."""

    src = sources.resolve(dataset, split, column)
    train, _held = sources.split_texts(src, calib_tokens=size * seq_len)
    ids = _windows(_spread(train, size), tokenizer, size, seq_len)
    if src.kind == "builtin":
        source = {"dataset": "builtin", "text": "python stdlib *.py, train split (the held-out split is never used)"}
    else:
        source = {"dataset": src.value, "kind": src.kind, "text": f"{src.describe()}, calibration rows"}
        if src.kind in ("named", "hub", "folder"):
            source.update(split=src.split, column=src.column)
    if ids.shape[0] == 0:
        raise ConfigError(FIELD, dataset, f"the calibration text has fewer than seq_len={seq_len} tokens",
                          fix="add more text, or lower --calib-seq-len")
    desc = {**source, "requested_size": size, "size": int(ids.shape[0]), "seq_len": seq_len,
            "tokens": int(ids.numel()), "sha256_16": _digest(ids)}
    return TextWindows(ids, desc)


def heldout_windows(tokenizer, n: int, seq_len: int, *, dataset: str = "builtin", split: str | None = None,
                    column: str | None = None) -> TextWindows:
    """Evaluation windows from the held-out part of the calibration source (disjoint from it)."""

    src = sources.resolve(dataset, split, column)
    _train, held = sources.split_texts(src, calib_tokens=0, heldout_tokens=n * seq_len)
    ids = _windows(_spread(held, n), tokenizer, n, seq_len)
    if ids.shape[0] == 0:
        raise ConfigError(FIELD, dataset, f"the held-out text has fewer than eval_seq_len={seq_len} tokens",
                          fix="use a larger calibration source, or lower --eval-seq-len")
    desc = {"text": sources.heldout_description(src), "size": int(ids.shape[0]), "seq_len": seq_len,
            "tokens": int(ids.numel()), "sha256_16": _digest(ids)}
    return TextWindows(ids, desc)


def heldout_prompts(n: int, *, dataset: str = "builtin", split: str | None = None,
                    column: str | None = None) -> tuple[list[str], str]:
    """``n`` prompt texts for the acceptance measurement, from the held-out part of the source,
    and what they are."""

    src = sources.resolve(dataset, split, column)
    if src.kind == "builtin":

        return stdlib_snippets(n), "builtin:stdlib (held-out)"
    _train, held = sources.split_texts(src, calib_tokens=0, heldout_tokens=n * 256)
    if not held:
        raise ConfigError(FIELD, dataset, "no held-out text for the acceptance prompts",
                          fix="use a larger calibration source")
    return [held[i % len(held)] for i in range(n)], f"held-out rows of {src.describe()}"
