"""Calibration data for TRT-LLM's quantize scripts, from the recipe's ``calibration`` block.

The scripts take an HF dataset name or a local dataset folder (``train`` split, ``text`` column;
``quantize_by_modelopt.get_calib_dataloader``) and cut each row at ``--calib_max_seq_length``
tokens. This writes ``<out>/train.jsonl`` so the engine flow calibrates on the same text as
``trtspec quantize``: ``builtin`` is the train split of the Python stdlib corpus
(``trtspec.checkpoints.tiny.corpus_split``; nothing is downloaded), a file is ``.jsonl`` (``text`` or
``prompt`` per line) or plain text. The text is cut into ``size`` rows long enough to fill
``seq_len`` tokens, the way ``trtspec quantize`` cuts token windows.

Run as a build stage inside the container: ``python3 -m trtspec.trtllm.calibration``.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

from trtspec.errors import ConfigError
from trtspec.prompts import parse_text_jsonl
from trtspec.corpus import corpus_split

FIELD = "quantization.calibration.dataset"
# characters per row: generous for ~3-4 characters per token, so truncation, not padding, ends a row
CHARS_PER_TOKEN = 6


def _read(source: str) -> list[str]:
    if source == "builtin":

        train, _held = corpus_split()
        return train
    path = pathlib.Path(source)
    if not path.is_file():
        raise ConfigError(FIELD, source, "calibration file not found", fix="pass an existing .jsonl/.txt file, or builtin")
    raw = path.read_text(encoding="utf-8", errors="replace")
    if not raw.strip():
        return []
    if path.suffix != ".jsonl":
        return [raw]

    return parse_text_jsonl(raw, str(path), what="calibration texts")


def calibration_rows(source: str, size: int, seq_len: int) -> list[str]:
    """Up to ``size`` rows of about ``seq_len`` tokens each, cut from the source text in order."""
    texts = _read(source)
    if not texts:
        raise ConfigError(FIELD, source, "no calibration text", fix="use builtin or a non-empty file")
    width = seq_len * CHARS_PER_TOKEN
    rows: list[str] = []
    # spread over the corpus (every k-th text first), as trtspec quantize does
    k = max(1, len(texts) // max(size, 1))
    order = list(range(0, len(texts), k)) + [i for i in range(len(texts)) if i % k]
    for i in order:
        t = texts[i]
        for start in range(0, len(t), width):
            piece = t[start:start + width]
            if piece.strip():
                rows.append(piece)
            if len(rows) >= size:
                return rows
    return rows


def write_dataset(source: str, size: int, seq_len: int, out_dir: str | pathlib.Path) -> pathlib.Path:
    """Write ``out_dir/train.jsonl`` (one ``{"text": ...}`` per row); returns its path."""
    rows = calibration_rows(source, size, seq_len)
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "train.jsonl"
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps({"text": row}, ensure_ascii=False) + "\n")
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m trtspec.trtllm.calibration",
                                description="Write TRT-LLM calibration data (train.jsonl) from a trtspec recipe source.")
    p.add_argument("--source", required=True, help="builtin, or a .jsonl/.txt file")
    p.add_argument("--size", required=True, type=int, help="number of rows (calibration samples)")
    p.add_argument("--seq-len", required=True, type=int, help="tokens per row (quantize.py --calib_max_seq_length)")
    p.add_argument("--output", required=True, help="folder to write train.jsonl into")
    a = p.parse_args(argv)
    try:
        write_dataset(a.source, a.size, a.seq_len, a.output)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
