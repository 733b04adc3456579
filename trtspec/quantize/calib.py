"""Calibration and evaluation text, tokenized into fixed-length windows.

* calibration ``builtin``: the *train* split of the Python stdlib corpus the tiny pair was trained
  on (``trtspec.checkpoints.tiny.corpus_split``), files spread evenly over the corpus;
* calibration from a file: ``.jsonl`` (objects with ``text``/``prompt``, or strings) or any other
  text file (used whole);
* evaluation (quality report): the *held-out* split, never used for calibration.
"""

from __future__ import annotations

import hashlib
import pathlib
from dataclasses import dataclass

import torch

from trtspec.errors import ConfigError
from trtspec.prompts import parse_text_jsonl
from trtspec.corpus import corpus_split

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


def read_text_file(path: pathlib.Path, *, field: str = FIELD) -> list[str]:
    """Texts from ``.jsonl`` (``text``/``prompt`` fields or strings) or a plain text file."""
    if not path.is_file():
        raise ConfigError(field, str(path), "calibration file not found",
                          fix="pass an existing .jsonl/.txt file, or 'builtin'")
    raw = path.read_text(encoding="utf-8", errors="replace")
    if not raw.strip():
        raise ConfigError(field, str(path), "calibration file is empty",
                          fix='add text: one JSON object per line ({"text": "..."}) or plain text')
    if path.suffix != ".jsonl":
        return [raw]

    return parse_text_jsonl(raw, str(path), what="calibration texts")


def calibration_windows(dataset: str, tokenizer, size: int, seq_len: int) -> TextWindows:
    """``size`` windows of ``seq_len`` tokens from ``dataset`` ('builtin' or a file path)."""
    if dataset == "builtin":

        train, _held = corpus_split()
        ids = _windows(_spread(train, size), tokenizer, size, seq_len)
        source = {"dataset": "builtin", "text": "python stdlib *.py, train split (the held-out split is never used)"}
    else:
        path = pathlib.Path(dataset)
        ids = _windows(read_text_file(path), tokenizer, size, seq_len)
        source = {"dataset": str(path.resolve()), "text": f"user file ({path.suffix or 'text'})"}
    if ids.shape[0] == 0:
        raise ConfigError(FIELD, dataset, f"the calibration text has fewer than seq_len={seq_len} tokens",
                          fix="add more text, or lower --calib-seq-len")
    desc = {**source, "requested_size": size, "size": int(ids.shape[0]), "seq_len": seq_len,
            "tokens": int(ids.numel()), "sha256_16": _digest(ids)}
    return TextWindows(ids, desc)


def heldout_windows(tokenizer, n: int, seq_len: int) -> TextWindows:
    """Evaluation windows from the held-out stdlib files (disjoint from calibration)."""

    _train, held = corpus_split()
    ids = _windows(_spread(held, n), tokenizer, n, seq_len)
    desc = {"text": "python stdlib *.py, held-out split", "size": int(ids.shape[0]), "seq_len": seq_len,
            "tokens": int(ids.numel()), "sha256_16": _digest(ids)}
    return TextWindows(ids, desc)
