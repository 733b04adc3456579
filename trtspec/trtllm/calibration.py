"""Calibration data for TRT-LLM's quantize scripts, from the recipe's ``calibration`` block.

TRT-LLM 1.2's ``quantize.py --calib_dataset`` (``tensorrt_llm/quantization/quantize_by_modelopt.py``
``get_calib_dataloader``, read at NVIDIA/TensorRT-LLM@585c756579dc) takes ``cnn_dailymail``
(``load_dataset(name, "3.0.0", split="train")``, column ``article``), ``pileval`` (from a URL
that no longer serves it) or a local folder read as ``load_dataset(DIR, split="train")["text"]``,
and cuts each row at ``--calib_max_seq_length`` tokens. The plan passes ``cnn_dailymail`` by name;
every other source (``builtin``, ``pileval``, a Hugging Face id, a local dataset folder, a file)
goes through this module, which writes ``<out>/train.jsonl`` from the source's *calibration* rows
(:mod:`trtspec.calib_sources`: the held-out rows stay out, as in ``trtspec quantize``), cut into
``size`` rows long enough to fill ``seq_len`` tokens.

Run as a build stage inside the container: ``python3 -m trtspec.trtllm.calibration``.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

from trtspec import calib_sources
from trtspec.errors import ConfigError

FIELD = calib_sources.FIELD
# characters per row: generous for ~3-4 characters per token, so truncation, not padding, ends a row
CHARS_PER_TOKEN = calib_sources.CHARS_PER_TOKEN


def _read(source: str, size: int, seq_len: int, split: str | None = None, column: str | None = None) -> list[str]:
    src = calib_sources.resolve(source, split, column)
    train, _held = calib_sources.split_texts(src, calib_tokens=size * seq_len)
    return train


def calibration_rows(source: str, size: int, seq_len: int, *, split: str | None = None,
                     column: str | None = None) -> list[str]:
    """Up to ``size`` rows of about ``seq_len`` tokens each, cut from the source text in order."""
    texts = _read(source, size, seq_len, split, column)
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


def write_dataset(source: str, size: int, seq_len: int, out_dir: str | pathlib.Path, *, split: str | None = None,
                  column: str | None = None) -> pathlib.Path:
    """Write ``out_dir/train.jsonl`` (one ``{"text": ...}`` per row); returns its path."""
    rows = calibration_rows(source, size, seq_len, split=split, column=column)
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
    p.add_argument("--source", required=True,
                   help="builtin, pileval, a Hugging Face dataset id, a local dataset folder, or a .jsonl/.txt file")
    p.add_argument("--split", default=None, help="dataset split (default: the named dataset's, else train)")
    p.add_argument("--column", default=None, help="text column (default: the named dataset's, else text)")
    p.add_argument("--size", required=True, type=int, help="number of rows (calibration samples)")
    p.add_argument("--seq-len", required=True, type=int, help="tokens per row (quantize.py --calib_max_seq_length)")
    p.add_argument("--output", required=True, help="folder to write train.jsonl into")
    a = p.parse_args(argv)
    try:
        write_dataset(a.source, a.size, a.seq_len, a.output, split=a.split, column=a.column)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
