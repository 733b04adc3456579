"""`trtspec check` on every shipped recipe before its models exist: each fix names the command
that makes that recipe's models (or says no trtspec command does), and no recipe gets a warning
its own configuration contradicts."""

from __future__ import annotations

import json
import pathlib
import re

import pytest
import yaml
from click.testing import CliRunner

from trtspec import model_makers
from trtspec.cli import main
from trtspec.config import load_recipe
from trtspec.recipe_checks import calibration_lines, declared_traffic

REPO = pathlib.Path(__file__).resolve().parents[2]
SHIPPED = sorted((REPO / "build_configs").glob("*.yaml"))

# what each shipped recipe's missing models are fixed by: (role, a phrase the fix must hold)
WANT = {
    "qwen-coder-cpu": {"target": "run `trtspec models qwen`", "draft": "run `trtspec models qwen`"},
    "qwen-coder-cpu-eagle3": {"target": "run `trtspec models qwen`",
                              "head": "run `trtspec models qwen`, then `trtspec models eagle3 --target "
                                      "models/qwen2.5-coder-1.5b-instruct`"},
    "tiny-cpu-draft-target": {"target": "run `trtspec models tiny`", "draft": "run `trtspec models tiny`"},
    "tiny-cpu-ngram": {"target": "run `trtspec models tiny`"},
    "tiny-cpu-eagle3": {"target": "run `trtspec models tiny`",
                        "head": "run `trtspec models tiny`, then `trtspec models eagle3`"},
}


def _check(recipe_file: pathlib.Path, root: pathlib.Path) -> dict[str, dict]:
    """`trtspec check --json` on a copy of the recipe in ``root/recipes/`` (its ../models is empty),
    run from the working folder the test chose."""
    (root / "recipes").mkdir(exist_ok=True)
    copy = root / "recipes" / recipe_file.name
    copy.write_text(recipe_file.read_text())
    res = CliRunner().invoke(main, ["check", str(copy), "--json"], catch_exceptions=False)
    assert res.exit_code in (0, 1), res.output
    return {c["name"]: c for c in json.loads(res.output)["checks"]}


def test_every_shipped_recipe_is_covered():
    stems = {p.stem for p in SHIPPED}
    local = {s for s in stems if load_recipe(REPO / "build_configs" / f"{s}.yaml").runtime.backend == "torch"}
    assert local == set(WANT), "a shipped torch recipe without an expected fix in WANT"


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_missing_models_name_the_command_that_makes_them(path, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a checkout's root: recipes/ beside models/, as build_configs/ is
    models = _model_checks(_check(path, tmp_path))
    if path.stem in WANT:
        assert {r for r, c in models.items() if c["status"] == "fail"} == set(WANT[path.stem]), models
        for role, phrase in WANT[path.stem].items():
            fix = models[role]["fix"]
            assert phrase in fix and "--out" not in fix, (role, fix)  # models/ is the command's default
            other = {"qwen": "tiny", "tiny": "qwen"}[re.search(r"trtspec models (qwen|tiny)", fix).group(1)]
            assert f"trtspec models {other}" not in fix
    else:  # TRT-LLM recipes: the models are in the container where the build runs
        for role, c in models.items():
            assert c["status"] == "skip" and c["detail"].startswith("/workspace/models/"), c
            assert c["fix"].startswith("no `trtspec models` command makes this model")
            assert c["detail"].split()[0] in c["fix"]


@pytest.mark.parametrize("path", [p for p in SHIPPED if p.stem in WANT], ids=lambda p: p.stem)
def test_from_another_folder_the_command_names_where_to_write(path, tmp_path, monkeypatch):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    models = _model_checks(_check(path, tmp_path))
    for role in WANT[path.stem]:
        assert f"--out {tmp_path / 'models'}" in models[role]["fix"], models[role]


def _model_checks(checks: dict[str, dict]) -> dict[str, dict]:
    out = {name.split(":", 1)[1]: c for name, c in checks.items() if name.startswith("model:")}
    assert out, checks.keys()
    return out


def test_the_fix_is_the_plain_command_from_the_folder_it_defaults_to(tmp_path):
    models = tmp_path / "models"
    assert model_makers.pair_command(models / model_makers.QWEN_TARGET, cwd=tmp_path) == "trtspec models qwen"
    assert model_makers.pair_command(models / model_makers.TINY_DRAFT, cwd=tmp_path) == "trtspec models tiny"
    assert model_makers.pair_command(tmp_path / "w" / "tiny-target", cwd=tmp_path) == "trtspec models tiny --out w"
    assert model_makers.pair_command(tmp_path / "mine", cwd=tmp_path) is None
    assert model_makers.eagle3_command(models / "tiny-target", models / "tiny-eagle3", cwd=tmp_path) == "trtspec models eagle3"
    assert "no `trtspec models` command makes mine" in model_makers.missing_model_fix(str(tmp_path / "mine"))


def test_the_makers_write_the_folders_the_fixes_name():
    from trtspec.checkpoints import qwen

    assert (qwen.QWEN_TARGET.folder, qwen.QWEN_DRAFT.folder) == model_makers.PAIRS["trtspec models qwen"]
    src = (REPO / "trtspec" / "checkpoints" / "tiny.py").read_text()
    assert "out / TINY_TARGET, out / TINY_DRAFT" in src
    from trtspec.cli.models import models_eagle3, models_qwen, models_tiny

    defaults = {p.name: p.default for p in models_eagle3.params}
    assert defaults["target_dir"] == model_makers.EAGLE3_DEFAULTS[0] and defaults["out_dir"] is None  # → eagle3_out
    assert model_makers.eagle3_out(model_makers.EAGLE3_DEFAULTS[0]) == model_makers.EAGLE3_DEFAULTS[1]
    assert model_makers.eagle3_out("models/qwen2.5-coder-1.5b-instruct") == "models/qwen2.5-coder-1.5b-instruct-eagle3"
    assert {p.name: p.default for p in models_tiny.params}["out_dir"] == model_makers.MODELS_OUT
    assert {p.name: p.default for p in models_qwen.params}["out_dir"] == model_makers.MODELS_OUT


def _comments(path: pathlib.Path) -> str:
    return "\n".join(line.split("#", 1)[1] for line in path.read_text().splitlines() if "#" in line)


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_no_shipped_recipe_gets_a_warning_its_configuration_contradicts(path, tmp_path, monkeypatch):
    """The calibration warning follows what the recipe says about its data: a recipe serving code
    and calibrating on builtin (Python source) is not warned; one serving chat on builtin would be.
    `trtspec check` itself, its models absent, warns about no shipped recipe's data."""
    monkeypatch.chdir(tmp_path)
    warned = {n: c["detail"] for n, c in _check(path, tmp_path).items()
              if c["status"] == "warn" and n.startswith("calibration:")}
    assert not warned, warned
    recipe = load_recipe(path)
    raw = yaml.safe_load(path.read_text())
    for ln in calibration_lines(recipe):
        assert ln.status == "ok", ln
        if "builtin (" in ln.detail:
            assert declared_traffic(recipe) == "code" and raw["validation"]["prompts"] == "builtin:code"
            assert "builtin is code, as the recipe's traffic is" in ln.detail
    if recipe.name == "qwen-coder-cpu":  # the case issue 32 found: a code model, code traffic, code calibration
        assert "code" in _comments(path) and recipe.validation.prompts == "builtin:code"
