"""Which ``trtspec models ...`` command makes which model folder, so that a missing model's fix
names the command that makes it (``trtspec check``, model loading, the EAGLE-3 trainer).

The folder names are the ones the makers write (:mod:`trtspec.checkpoints.tiny` and
:mod:`trtspec.checkpoints.qwen` take them from here); an EAGLE-3 head is trained for any target
(``trtspec models eagle3 --target T --out H``). Folders no command here makes (the TRT-LLM
recipes' ``/workspace/models/...``, a user's own checkpoint) are said to come from elsewhere.
Torch-free: ``trtspec check`` imports it.
"""

from __future__ import annotations

import os
import pathlib

TINY_TARGET = "tiny-target"
TINY_DRAFT = "tiny-draft"
TINY_EAGLE3 = "tiny-eagle3"
QWEN_TARGET = "qwen2.5-coder-1.5b-instruct"
QWEN_DRAFT = "qwen2.5-coder-0.5b-instruct"
MODELS_OUT = "models"  # `trtspec models tiny|qwen --out`'s default, relative to the working folder

# the command → the folders it writes into its --out folder
PAIRS: dict[str, tuple[str, ...]] = {
    "trtspec models tiny": (TINY_TARGET, TINY_DRAFT),
    "trtspec models qwen": (QWEN_TARGET, QWEN_DRAFT),
}
EAGLE3 = "trtspec models eagle3"
EAGLE3_DEFAULTS = (f"{MODELS_OUT}/{TINY_TARGET}", f"{MODELS_OUT}/{TINY_EAGLE3}")  # its --target, --out


def eagle3_out(target: str | os.PathLike) -> str:
    """``trtspec models eagle3``'s default ``--out`` for a target: beside it, ``<target>-eagle3``
    (``tiny-eagle3`` for the tiny target)."""
    t = pathlib.Path(target)
    return str(t.parent / (TINY_EAGLE3 if t.name == TINY_TARGET else f"{t.name}-eagle3"))


def _shown(path: pathlib.Path, cwd: pathlib.Path) -> str:
    """``path`` as the user would type it from ``cwd``: relative below it, else absolute."""
    path, cwd = pathlib.Path(os.path.abspath(path)), pathlib.Path(os.path.abspath(cwd))
    return path.relative_to(cwd).as_posix() if path.is_relative_to(cwd) else path.as_posix()


def pair_command(model: str | os.PathLike, cwd: str | os.PathLike | None = None) -> str | None:
    """The command that writes the folder ``model`` (``--out`` only where not the default), or None."""
    path = pathlib.Path(model)
    cwd = pathlib.Path(cwd or os.getcwd())
    for command, folders in PAIRS.items():
        if path.name in folders:
            out = _shown(path.parent, cwd)
            return command if out == MODELS_OUT else f"{command} --out {out}"
    return None


def eagle3_command(target: str | os.PathLike, head: str | os.PathLike, cwd: str | os.PathLike | None = None) -> str:
    """The command that trains the head ``head`` for ``target`` (options only where not the default)."""
    cwd = pathlib.Path(cwd or os.getcwd())
    t, h = _shown(pathlib.Path(target), cwd), _shown(pathlib.Path(head), cwd)
    opts = "".join(f" {flag} {v}" for flag, v, default in (("--target", t, EAGLE3_DEFAULTS[0]),
                                                            ("--out", h, _shown(pathlib.Path(eagle3_out(target)), cwd)))
                   if v != default)
    return EAGLE3 + opts


def missing_model_fix(model: str, *, head_for: str | None = None, target_missing: bool = False,
                      cwd: str | os.PathLike | None = None) -> str:
    """The fix for a local model folder that is not there.

    ``head_for``: the target when ``model`` is an EAGLE-3 head (trained by ``trtspec models
    eagle3``); ``target_missing``: that target is missing too, so it is made first.
    """
    if head_for is not None:
        train = f"`{eagle3_command(head_for, model, cwd)}`"
        if not target_missing:
            return f"run {train}"
        first = pair_command(head_for, cwd)
        return f"run `{first}`, then {train}" if first else f"put the target at {head_for}, then run {train}"
    command = pair_command(model, cwd)
    if command:
        return f"run `{command}` (it writes {pathlib.Path(model).name}/)"
    return (f"no `trtspec models` command makes {pathlib.Path(model).name}: put the checkpoint (an HF folder "
            "with config.json) there, or fix the path (relative paths resolve against the recipe's folder)")


def elsewhere_fix(model: str) -> str:
    """The fix for a model that lives where the build runs (TRT-LLM recipes): no command here makes it."""
    return (f"no `trtspec models` command makes this model: download the checkpoint to {model} on the machine "
            "(or in the container) where the build runs")
