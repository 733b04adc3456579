"""Files shipped inside the package: the Triton templates and the recipes.

Found with :mod:`importlib.resources`, so a wheel installed anywhere has them; in a source
checkout ``trtspec/recipes`` is a link to ``build_configs/``, where the recipes are edited.
"""

from __future__ import annotations

import importlib.resources
import pathlib

from trtspec.errors import ConfigError


def _package_dir(*parts: str) -> pathlib.Path:
    # trtspec is always installed as plain files (never zipped): the Traversable is a Path
    return pathlib.Path(str(importlib.resources.files("trtspec").joinpath(*parts)))


def templates_dir() -> pathlib.Path:
    """The read-only Triton model-repository templates (``trtspec/triton/templates``)."""
    return _package_dir("triton", "templates")


def recipes_dir() -> pathlib.Path:
    return _package_dir("recipes")


def shipped_recipes() -> dict[str, pathlib.Path]:
    """name (file stem) → path of every recipe shipped with trtspec."""
    d = recipes_dir()
    return {p.stem: p for p in sorted(d.glob("*.yaml"))} if d.is_dir() else {}


def shipped_recipe(name: str) -> pathlib.Path:
    recipes = shipped_recipes()
    if name.removesuffix(".yaml") not in recipes:
        raise ConfigError("recipe", name, "no recipe of that name is shipped with trtspec",
                          fix=f"one of: {', '.join(recipes) or '(none: reinstall trtspec)'}; `trtspec recipes list`")
    return recipes[name.removesuffix(".yaml")]
