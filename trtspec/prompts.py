"""Prompt sets: built-in (shipped as package data, or cut from held-out stdlib sources) or a
user's JSONL/text file."""

from __future__ import annotations

import json
import pathlib
from importlib import resources

from trtspec.errors import ConfigError
from trtspec.corpus import corpus_split

BUILTIN = ("code", "chat", "mixed", "stdlib")


def stdlib_snippets(n: int, *, min_chars: int = 40, max_chars: int = 400) -> list[str]:
    """Deterministic code prefixes from the *held-out* stdlib files (never trained on)."""

    _, held = corpus_split()
    out: list[str] = []
    sizes = [min_chars, (min_chars + max_chars) // 2, max_chars, min_chars * 2, max_chars * 3 // 4]
    i = 0
    for text in held:
        lines = text.splitlines(keepends=True)
        pos = 0
        while pos < len(lines) and len(out) < n:
            chunk, want = "", sizes[i % len(sizes)]
            j = pos
            while j < len(lines) and len(chunk) < want:
                chunk += lines[j]
                j += 1
            if chunk.strip():
                out.append(chunk)
                i += 1
            pos = j + 7  # skip ahead so prompts don't overlap
        if len(out) >= n:
            break
    return out[:n]


def _data_file(kind: str) -> list[str] | None:
    try:
        f = resources.files("trtspec") / "data" / f"prompts_{kind}.jsonl"
        if not f.is_file():
            return None
        return parse_text_jsonl(f.read_text(), f"builtin:{kind}")
    except (FileNotFoundError, ModuleNotFoundError):
        return None


def parse_text_jsonl(text: str, where: str, *, what: str = "prompts") -> list[str]:
    """Texts from JSONL: one object per line with a ``text`` (or ``prompt``) string, or a bare
    JSON string. Prompt sets and calibration files share this format; ``where`` names the file
    in errors."""
    out = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise ConfigError(f"{where}:{lineno}", line[:60], f"not valid JSON ({e.msg})",
                              fix='one JSON object per line, e.g. {"text": "def fib(n):"}') from None
        text_value = obj.get("text", obj.get("prompt")) if isinstance(obj, dict) else obj if isinstance(obj, str) else None
        if not isinstance(text_value, str) or not text_value.strip():
            raise ConfigError(f"{where}:{lineno}", obj, "needs a non-empty string field 'text' (or 'prompt')",
                              fix='e.g. {"text": "def fib(n):"}')
        out.append(text_value)
    if not out:
        raise ConfigError(where, "", f"no {what} in the file", fix="add one JSON object per line")
    return out


def load_prompts(source: str, n: int | None = None) -> list[str]:
    """``builtin:code|chat|mixed|stdlib`` or a path to ``.jsonl`` (objects with ``text``) / ``.txt``
    (prompts separated by blank lines). Cycles the set when ``n`` exceeds it."""
    if source.startswith("builtin:"):
        kind = source.split(":", 1)[1]
        if kind not in BUILTIN:
            raise ConfigError("prompts", source, "unknown built-in prompt set", fix=f"use builtin:{'|'.join(BUILTIN)}")
        if kind == "stdlib":
            prompts = stdlib_snippets(n or 64)
        elif kind == "mixed":
            prompts = [p for pair in zip(load_prompts("builtin:code"), load_prompts("builtin:chat")) for p in pair]
        else:
            prompts = _data_file(kind) or stdlib_snippets(n or 64)
    else:
        path = pathlib.Path(source)
        if not path.is_file():
            raise ConfigError("prompts", source, "prompt file not found", fix="pass builtin:code or a .jsonl path")
        text = path.read_text(encoding="utf-8")
        if path.suffix == ".jsonl":
            prompts = parse_text_jsonl(text, str(path))
        else:
            prompts = [p.strip("\n") for p in text.split("\n\n") if p.strip()]
            if not prompts:
                raise ConfigError("prompts", source, "no prompts in the file", fix="separate prompts by blank lines")
    if n is None:
        return prompts
    return [prompts[i % len(prompts)] for i in range(n)]
