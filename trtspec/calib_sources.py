"""Calibration sources: where ``quantization.calibration.dataset`` text comes from.

One recipe value, five kinds (docs/quantization.md has the table of when to use which):

* ``builtin``: the Python standard-library corpus the tiny CPU pair was trained on (its train
  split calibrates, its held-out split is evaluated); nothing to download. Right for recipes
  that serve code (the tiny ones, qwen-coder-cpu): it is code, so a chat deployment's FP8 scales
  would be set on code (``trtspec check`` warns by the recipe's ``validation.prompts``).
* a named dataset: ``cnn_dailymail`` (news articles, ModelOpt's and TRT-LLM's default) or
  ``pileval`` (the Pile's validation set, AWQ's usual set), read with ``datasets`` from the
  Hugging Face cache;
* any Hugging Face dataset id ``org/name`` (or ``hf://org/name``) with ``split`` / ``column``;
* a local dataset folder: written by ``datasets``' ``save_to_disk`` (a ``Dataset`` or a
  ``DatasetDict``) or a folder of data files with a ``train`` split (what TRT-LLM's
  ``quantize.py --calib_dataset DIR`` reads);
* a ``.jsonl`` file (``text``/``prompt`` per line) or any other text file.

Calibration and evaluation never share text: of the rows read, every ``HELDOUT_EVERY``-th row is
held out for the quality report and the rest calibrate; a source with fewer rows than that is
joined and its last tenth held out. ``builtin`` keeps its own train/held-out file split.

Nothing here downloads on its own account: the ``datasets`` library honours ``HF_HUB_OFFLINE``
/ ``HF_DATASETS_OFFLINE``; offline, a dataset missing from the cache is an error naming what to
download.
"""

from __future__ import annotations

import os
import pathlib
import re
from dataclasses import dataclass
from typing import Iterator

from trtspec.corpus import corpus_split
from trtspec.errors import ConfigError
from trtspec.prompts import parse_text_jsonl

FIELD = "quantization.calibration.dataset"
SPLIT_FIELD = "quantization.calibration.split"
COLUMN_FIELD = "quantization.calibration.column"
HELDOUT_EVERY = 10
CHARS_PER_TOKEN = 6  # generous: rows are read until this many characters per wanted token


@dataclass(frozen=True)
class Named:
    """A dataset known by a short name (as ModelOpt's and TRT-LLM's calibration loaders know it)."""

    hf_id: str
    config: str | None
    split: str
    column: str
    text: str  # what kind of text it is, for `trtspec check` and the quality report
    trtllm_native: bool  # TRT-LLM 1.2's quantize.py --calib_dataset loads it by this name itself


NAMED: dict[str, Named] = {
    "cnn_dailymail": Named("abisee/cnn_dailymail", "3.0.0", "train", "article",
                           "English news articles (CNN / Daily Mail)", trtllm_native=True),
    # TRT-LLM's loader fetches pileval from a URL that no longer serves it, so trtspec reads
    # the mirror AWQ and ModelOpt use and hands quantize.py a local folder instead
    "pileval": Named("mit-han-lab/pile-val-backup", None, "validation", "text",
                     "general English web text (the Pile, validation split)", trtllm_native=False),
}
DEFAULT_SIZES = {"builtin": (64, 128)}  # CPU tiny recipes; everything else: ModelOpt's 512 x 512
MODELOPT_SIZES = (512, 512)
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")


def default_sizes(dataset: str) -> tuple[int, int]:
    """(size, seq_len) when the recipe does not say: ModelOpt's 512 x 512, 64 x 128 for builtin."""
    return DEFAULT_SIZES.get(dataset, MODELOPT_SIZES)


FILE_SUFFIXES = (".jsonl", ".json", ".txt", ".csv", ".parquet", ".arrow")


def is_hub_id(value: str) -> bool:
    """``hf://org/name``, or ``org/name`` that does not end like a data file (``data/calib.jsonl``
    is a missing file, not a dataset id)."""
    return value.startswith("hf://") or (bool(_HUB_ID.match(value)) and not value.lower().endswith(FILE_SUFFIXES))


def bare_word_problem(value: str) -> str | None:
    """Why ``value`` cannot be a dataset without looking at the disk (None when it may be one):
    a word that is neither ``builtin``, a named dataset, an ``org/name`` id nor a path."""
    if value == "builtin" or value in NAMED or "/" in value or "\\" in value or "." in value:
        return None
    return (f"unknown dataset {value!r}: not builtin, not a named dataset ({', '.join(NAMED)}), not a Hugging Face "
            "dataset id (org/name) and not a path")


@dataclass(frozen=True)
class Source:
    """A resolved calibration source."""

    kind: str  # builtin | named | hub | folder | file
    value: str  # what the recipe says (paths absolute)
    hf_id: str | None = None
    config: str | None = None
    split: str | None = None
    column: str | None = None
    text: str = ""

    def describe(self) -> str:
        if self.kind == "builtin":
            return "builtin (Python standard-library source code: the tiny pair's training corpus)"
        if self.kind == "named":
            cfg = f" {self.config}" if self.config else ""
            return f"{self.value} ({self.hf_id}{cfg}, split {self.split}, column {self.column}: {self.text})"
        if self.kind == "hub":
            return f"Hugging Face dataset {self.hf_id} (split {self.split}, column {self.column})"
        if self.kind == "folder":
            return f"local dataset folder {self.value} (split {self.split}, column {self.column})"
        return f"file {self.value}"


def resolve(dataset: str, split: str | None = None, column: str | None = None) -> Source:
    """What ``dataset`` names (reads nothing but the file system's idea of what exists)."""
    if dataset == "builtin":
        if split or column:
            raise ConfigError(SPLIT_FIELD if split else COLUMN_FIELD, split or column,
                              "builtin has no splits or columns", fix="remove split/column, or name a dataset")
        return Source("builtin", "builtin", text="Python standard-library source code")
    if dataset in NAMED:
        n = NAMED[dataset]
        return Source("named", dataset, n.hf_id, n.config, split or n.split, column or n.column, n.text)
    path = pathlib.Path(dataset).expanduser()
    if path.is_dir():
        return Source("folder", str(path.resolve()), split=split or "train", column=column or "text",
                      text="rows of a local dataset")
    if path.is_file():
        if split or column:
            raise ConfigError(SPLIT_FIELD if split else COLUMN_FIELD, split or column,
                              "a .jsonl/.txt file has no splits or columns (JSONL rows use 'text' or 'prompt')",
                              fix="remove split/column, or save the data as a dataset folder")
        return Source("file", str(path.resolve()), text=f"user file ({path.suffix or 'text'})")
    if is_hub_id(dataset) and not path.is_absolute():
        hf_id = dataset.removeprefix("hf://")
        return Source("hub", dataset, hf_id, None, split or "train", column or "text", f"rows of {hf_id}")
    if path.suffix:
        raise ConfigError(FIELD, dataset, f"calibration file not found: {path}",
                          fix="pass an existing .jsonl/.txt file, a dataset folder, a dataset name, or builtin")
    problem = bare_word_problem(dataset) or (
        f"unknown dataset: not builtin, not a named dataset ({', '.join(NAMED)}), not a Hugging Face dataset id "
        f"(org/name), and no file or folder at {path}")
    raise ConfigError(FIELD, dataset, problem,
                      fix=f"use builtin, one of {', '.join(NAMED)}, a Hugging Face id such as org/name, a folder "
                          "written by datasets' save_to_disk, or an existing .jsonl/.txt file")


# --------------------------------------------------------------------------------------------
# reading


def _offline() -> bool:
    return any(os.environ.get(k, "").strip().lower() in ("1", "true", "yes", "on")
               for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))


def _download_hint(src: Source) -> str:
    args = [repr(src.hf_id)] + ([repr(src.config)] if src.config else []) + [f"split={src.split!r}"]
    return (f"on a machine with network (same HF_HOME), run python -c \"import datasets; "
            f"datasets.load_dataset({', '.join(args)})\" to fill the cache, or save it with save_to_disk and set "
            "dataset to that folder")


def _open_dataset(src: Source):
    """The ``datasets`` split (a ``Dataset``) for a named/hub/folder source."""
    try:
        import datasets
    except ImportError:  # pragma: no cover - a dependency of trtspec
        raise ConfigError(FIELD, src.value, "reading a dataset needs the 'datasets' package",
                          fix="pip install datasets") from None
    if src.kind == "folder":
        folder = pathlib.Path(src.value)
        if (folder / "dataset_dict.json").is_file() or (folder / "state.json").is_file():
            ds = datasets.load_from_disk(str(folder))
            if isinstance(ds, datasets.DatasetDict):
                if src.split not in ds:
                    raise ConfigError(SPLIT_FIELD, src.split, f"no such split in {folder} (splits: {', '.join(ds)})",
                                      fix=f"set split: one of {', '.join(ds)}")
                ds = ds[src.split]
            return ds
        try:
            return datasets.load_dataset(str(folder), split=src.split)
        except ValueError as e:
            if "split" in str(e).lower():
                raise ConfigError(SPLIT_FIELD, src.split, f"no such split in {folder}: {e}",
                                  fix="name an existing split, or put the data in a train split") from None
            raise ConfigError(FIELD, src.value, f"not a dataset folder datasets can read: {e}",
                              fix="write it with datasets' save_to_disk, or put train.jsonl (a 'text' per row) "
                                  "in it") from None
    try:
        return datasets.load_dataset(src.hf_id, src.config, split=src.split)
    except (ConnectionError, FileNotFoundError) as e:
        if _offline():
            raise ConfigError(FIELD, src.value,
                              f"{src.hf_id}{' ' + src.config if src.config else ''} (split {src.split}) is not in the "
                              "Hugging Face cache and HF_HUB_OFFLINE=1 forbids downloading it",
                              fix=_download_hint(src)) from None
        raise ConfigError(FIELD, src.value, f"cannot load {src.hf_id}: {type(e).__name__}: {e}",
                          fix="check the dataset id and the network, or " + _download_hint(src)) from None
    except ValueError as e:
        if "split" in str(e).lower():
            raise ConfigError(SPLIT_FIELD, src.split, f"{src.hf_id} has no such split: {e}",
                              fix="name an existing split (train, validation, test, ...)") from None
        raise


def _cell_text(value) -> str | None:
    """A text cell, or a chat conversation (a list of {role, content} messages) joined."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and value and all(isinstance(m, dict) and isinstance(m.get("content"), str)
                                                 for m in value):
        return "\n".join(m["content"] for m in value)
    return None


def iter_texts(src: Source) -> Iterator[str]:
    """The source's texts in order (rows of a dataset, lines of a JSONL, a text file whole)."""
    if src.kind == "file":

        yield from read_text_file(pathlib.Path(src.value))
        return
    ds = _open_dataset(src)
    columns = list(ds.column_names)
    if src.column not in columns:
        raise ConfigError(COLUMN_FIELD, src.column, f"not a column of {src.describe().split(' (')[0]} "
                          f"(columns: {', '.join(columns)})", fix=f"set column: one of {', '.join(columns)}")
    for row in ds.select_columns([src.column]):
        text = _cell_text(row[src.column])
        if text is None:
            raise ConfigError(COLUMN_FIELD, src.column,
                              f"holds {type(row[src.column]).__name__} values, not text or chat messages",
                              fix="name a column of strings")
        if text.strip():
            yield text


def split_texts(src: Source, *, calib_tokens: int, heldout_tokens: int = 0) -> tuple[list[str], list[str]]:
    """(calibration texts, held-out texts) from ``src``: rows are read until both sides have
    about the characters they need; every ``HELDOUT_EVERY``-th row is held out."""
    if src.kind == "builtin":
        return corpus_split()
    need_calib, need_held = calib_tokens * CHARS_PER_TOKEN, heldout_tokens * CHARS_PER_TOKEN
    calib: list[str] = []
    held: list[str] = []
    got_calib = got_held = 0
    rows: list[str] = []
    for i, text in enumerate(iter_texts(src)):
        rows.append(text)
        if i % HELDOUT_EVERY == HELDOUT_EVERY - 1:
            held.append(text)
            got_held += len(text)
        else:
            calib.append(text)
            got_calib += len(text)
        if got_calib >= need_calib and got_held >= need_held:
            break
    if len(rows) < HELDOUT_EVERY:  # too few rows to hold some out: hold out the last tenth of the text
        joined = "\n\n".join(rows)
        cut = len(joined) - len(joined) // HELDOUT_EVERY
        return [joined[:cut]], [joined[cut:]] if joined[cut:].strip() else []
    return calib, held


def heldout_description(src: Source) -> str:
    if src.kind == "builtin":
        return "python stdlib *.py, held-out split (never used for calibration)"
    return (f"held-out text of {src.describe()}: every {HELDOUT_EVERY}th row (the last tenth of a source with fewer "
            "rows), never used for calibration")


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
