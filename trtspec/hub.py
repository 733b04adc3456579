"""Models by Hugging Face hub id: ``model: meta-llama/Llama-3.1-8B-Instruct`` or
``hf://meta-llama/Llama-3.1-8B-Instruct``, ``revision`` pinnable (a branch, tag or commit).

An id resolves to its snapshot folder in ``huggingface_hub``'s cache (``snapshot_download``),
so every later stage (preflight, quantize, the torch runtime, Triton packaging) reads an ordinary
local folder. ``HF_TOKEN`` is read from the environment by ``huggingface_hub`` itself when a
download needs it: trtspec never reads, writes or logs it. With ``HF_HUB_OFFLINE=1`` (or
``download=False``) only the cache is consulted, and a model missing from it is an error naming
what to download. The cache is where ``huggingface_hub`` keeps it: ``HF_HUB_CACHE``, else
``HF_HOME/hub``, else ``~/.cache/huggingface/hub``, read when a model is resolved.
"""

from __future__ import annotations

import os
import pathlib
import re

from trtspec.errors import ConfigError

PREFIX = "hf://"
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")


def is_hub_id(value: str | None) -> bool:
    """``hf://org/name`` always; a bare ``org/name`` when it is not a local path (the caller
    resolves relative paths first: a folder that exists wins)."""
    if not value:
        return False
    if value.startswith(PREFIX):
        return True
    return bool(_ID.match(value)) and not pathlib.Path(value).exists()


def repo_id(value: str) -> str:
    return value.removeprefix(PREFIX)


def cache_dir() -> pathlib.Path:
    """The hub cache this process uses, from the environment at call time."""
    if os.environ.get("HF_HUB_CACHE"):
        return pathlib.Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return pathlib.Path(os.environ["HF_HOME"]).expanduser() / "hub"
    return pathlib.Path("~/.cache/huggingface/hub").expanduser()


def offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def _download_fix(rid: str, revision: str | None, field: str) -> str:
    rev = f" --revision {revision}" if revision else ""
    return (f"on a machine with network, with the same HF_HOME / HF_HUB_CACHE, run `huggingface-cli download {rid}{rev}` "
            f"(gated models: export HF_TOKEN first), or set {field} to a local folder")


def resolve_model(value: str, revision: str | None = None, *, field: str = "target.model",
                  download: bool = True) -> pathlib.Path:
    """The local snapshot folder of hub id ``value`` at ``revision`` (default: main).
    ``download=False`` or ``HF_HUB_OFFLINE=1``: the cache only."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    rid = repo_id(value)
    local_only = offline() or not download
    try:
        # token=None: huggingface_hub reads HF_TOKEN (or its stored login) itself
        path = snapshot_download(rid, revision=revision, cache_dir=str(cache_dir()), local_files_only=local_only)
    except LocalEntryNotFoundError:
        why = "HF_HUB_OFFLINE=1 forbids downloading it" if offline() else "this step does not download"
        raise ConfigError(field, value, f"{rid}{'@' + revision if revision else ''} is not in the Hugging Face cache "
                                        f"({cache_dir()}) and {why}",
                          fix=_download_fix(rid, revision, field)) from None
    except GatedRepoError:
        raise ConfigError(field, value, f"{rid} is gated and the download was refused",
                          fix="accept the model's license on its hub page and export HF_TOKEN "
                              "(a read token of that account); trtspec never stores it") from None
    except RevisionNotFoundError:
        raise ConfigError(f"{field.rsplit('.', 1)[0]}.revision", revision, f"{rid} has no such revision",
                          fix="pin an existing branch, tag or commit hash") from None
    except RepositoryNotFoundError:
        raise ConfigError(field, value, f"no model {rid} on the hub (or it is private)",
                          fix="check the id, or export HF_TOKEN for a private model") from None
    return pathlib.Path(path)


def resolve_recipe(recipe, *, download: bool = True, keep_missing: bool = False):
    """``recipe`` with every hub-id model and tokenizer (target, draft / head) replaced by its
    snapshot folder. Returns (recipe, {field: (hub id, folder)}, {field: ConfigError}): with
    ``keep_missing`` an id that cannot be resolved stays as it is and its error is returned,
    else the error is raised."""
    resolved: dict[str, tuple[str, str]] = {}
    missing: dict[str, ConfigError] = {}

    def spec_update(spec, prefix: str):
        update = {}
        for key in ("model", "tokenizer"):
            value = getattr(spec, key)
            if not is_hub_id(value):
                continue
            try:
                folder = str(resolve_model(value, spec.revision, field=f"{prefix}.{key}", download=download))
            except ConfigError as e:
                if not keep_missing:
                    raise
                missing[f"{prefix}.{key}"] = e
                continue
            update[key] = folder
            resolved[f"{prefix}.{key}"] = (value, folder)
        return spec.model_copy(update=update) if update else spec

    update = {"target": spec_update(recipe.target, "target")}
    s = recipe.speculation
    for key in ("draft", "head"):
        if hasattr(s, key):
            update["speculation"] = s.model_copy(update={key: spec_update(getattr(s, key), f"speculation.{key}")})
    return recipe.model_copy(update=update), resolved, missing


def check_lines(recipe):
    """(recipe with cached hub ids resolved, [(name, status, detail, fix)]) for ``trtspec check``:
    never downloads. Missing offline: fail; missing online: warn (downloaded when the recipe runs)."""
    resolved_recipe, resolved, missing = resolve_recipe(recipe, download=False, keep_missing=True)
    lines = [(f"hub:{f}", "ok", f"{hub_id} → {folder} (Hugging Face cache)", None)
             for f, (hub_id, folder) in resolved.items()]
    for f, e in missing.items():
        if offline():
            lines.append((f"hub:{f}", "fail", f"{f}={e.value!r}: {e.problem}", e.fix))
        else:
            lines.append((f"hub:{f}", "warn", f"{e.value} is not in the Hugging Face cache yet ({cache_dir()}); "
                                             "trtspec run / build download it (HF_TOKEN from the environment)", e.fix))
    return resolved_recipe, lines
