"""What each ``trtspec run`` stage depends on besides the recipe, by content, and why it ran.

A stage's cache key covers the recipe, the earlier stages' keys and :func:`stage_inputs`: the
trtspec version and the *contents* of the files the stage reads (an edited prompts file with the
same name must not reuse the old verdict):

=========  ===========================================================================
quantize   the model folders (names, sizes, mtimes), the calibration file of each model
build      the prompts file and the tokenizer (the torch runtime tunes max_draft_len on them)
package    the repository templates (model_repository/) and the tokenizer
validate   the prompts file and the tokenizer
=========  ===========================================================================

:func:`explain` compares a stage's inputs with what its last run recorded and says why it runs
again, or why it was reused (``trtspec run --explain``).
"""

from __future__ import annotations

import hashlib
import os
import pathlib
from typing import Any

from trtspec import __version__
from trtspec.manifest import hash_files, hash_json
from trtspec.triton.render import TEMPLATES

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "vocab.json", "vocab.txt", "merges.txt", "tokenizer.model", "spiece.model", "chat_template.jinja",
                   "generation_config.json")


def file_hash(path: str | os.PathLike | None) -> str | None:
    """sha256 of a file's content; ``missing:<path>`` when absent; None for no file (builtin:)."""
    if path is None or str(path).startswith("builtin"):
        return None
    p = pathlib.Path(path)
    if not p.is_file():
        return f"missing:{p}"
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def tokenizer_hash(folder: str | os.PathLike | None) -> str | None:
    """sha256 over the tokenizer files of a model folder (not the weights)."""
    if folder is None:
        return None
    p = pathlib.Path(folder)
    if not p.is_dir():
        return f"missing:{p}"
    return hash_files([p / n for n in TOKENIZER_FILES if (p / n).is_file()], base=p)


def templates_hash() -> str:

    root = pathlib.Path(TEMPLATES)
    return hash_files([f for f in root.rglob("*") if f.is_file() and "__pycache__" not in f.parts], base=root)


def stage_inputs(recipe, stage: str, model_fingerprints: dict[str, Any] | None = None) -> dict[str, Any]:
    """{input name: identity} for ``stage`` of ``recipe`` (see the module table)."""
    tok = tokenizer_hash(recipe.target.tokenizer or recipe.target.model)
    prompts = file_hash(recipe.validation.prompts)
    out: dict[str, Any] = {"trtspec_version": __version__}
    if stage == "quantize":
        out["models"] = model_fingerprints or {}
        models = [("target", recipe.target)] + ([("draft", recipe.draft_spec)] if recipe.draft_spec else [])
        out["calibration"] = {role: file_hash(m.quantization.calibration.dataset) for role, m in models}
    elif stage == "build":
        out.update(prompts=prompts, tokenizer=tok)
    elif stage == "package":
        out.update(templates=templates_hash(), tokenizer=tok)
    elif stage == "validate":
        out.update(prompts=prompts, tokenizer=tok)
    return out


def recipe_hash(recipe_dict: dict) -> str:
    return hash_json(recipe_dict)[:20]


def explain(stage: str, old: dict | None, *, inputs: dict, recipe: str, prev: list, forced_by: str | None,
            stages: tuple[str, ...]) -> str:
    """Why ``stage`` runs (``old``: its last manifest, or None), in one line."""
    if forced_by:
        return f"forced by --from {forced_by}"
    if old is None:
        return "no finished earlier run of this stage in the work folder"
    reasons = []
    if old.get("recipe_hash") not in (None, recipe):
        reasons.append("the recipe changed")
    old_inputs = old.get("inputs")
    if isinstance(old_inputs, dict):
        changed = sorted(k for k in set(inputs) | set(old_inputs) if inputs.get(k) != old_inputs.get(k))
        if changed:
            reasons.append("changed: " + ", ".join(changed))
    old_prev = old.get("prev")
    if isinstance(old_prev, list) and old_prev != prev:
        earlier = [s for s, a, b in zip(stages, old_prev, prev) if a != b]
        reasons.append("an earlier stage ran again: " + ", ".join(earlier))
    if not reasons:
        reasons.append("its record predates input tracking" if old_inputs is None else "its key changed")
    return "; ".join(reasons)
