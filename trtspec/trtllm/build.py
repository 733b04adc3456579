"""``trtspec build``: plan, gate, run, hand off.

:func:`plan_build` makes the plan (no TensorRT-LLM needed: ``--dry-run`` stops there).
:func:`build` checks, before any work, that this machine can run it (the installed TRT-LLM
release, the tools on PATH, the example scripts, the input folders, and that every generated flag
is one TRT-LLM accepts), runs the stages (cached, atomic), writes the LLM-API YAML files, and
writes the hand-off manifest last.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import tempfile
from dataclasses import dataclass, replace
from typing import Any, Mapping

from trtspec.config import Recipe
from trtspec.errors import PreflightError
from trtspec.manifest import MANIFEST, atomic_dir, maybe_manifest, write_manifest
from trtspec.trtllm import accepted_names
from trtspec.trtllm.commands import MODEL_TYPE_FAMILY
from trtspec.trtllm.handoff import KIND, TrtllmBuild
from trtspec.trtllm.plan import Plan, make_plan
from trtspec.trtllm.runner import OnEvent, is_cached, run_stages, stage_keys
from trtspec.versions import (
    ENGINE_FLOW_MAX,
    engine_flow_supported,
    installed_trtllm_version,
    pytorch_flow_supported,
    release_line,
)
from trtspec.hub import resolve_recipe

_DETECT = object()
CONTAINER_HINT = "nvcr.io/nvidia/tritonserver:25.12-trtllm-python-py3 (TensorRT-LLM 1.2.1)"


def detect_family(recipe: Recipe) -> str | None:
    """The target's model family from its ``config.json`` ``model_type`` (None if unreadable).
    An unmapped model_type is returned as is, so the plan's error can name it."""
    try:
        cfg = json.loads((pathlib.Path(recipe.target.model) / "config.json").read_text())
    except (OSError, json.JSONDecodeError):
        return None
    mt = cfg.get("model_type")
    return MODEL_TYPE_FAMILY.get(mt, mt) if isinstance(mt, str) else None


def with_examples_dir(recipe: Recipe, examples_dir: str | os.PathLike) -> Recipe:
    t = recipe.runtime.trtllm.model_copy(update={"examples_dir": str(examples_dir)})
    return recipe.model_copy(update={"runtime": recipe.runtime.model_copy(update={"trtllm": t})})


def plan_build(recipe: Recipe, out_dir: str | os.PathLike, *, download: bool = False) -> Plan:
    """The plan for ``recipe`` writing under ``out_dir`` (made absolute). Reads at most the
    target's config.json (model family); never needs TensorRT-LLM. Hub-id models become their
    snapshot folders in the Hugging Face cache (trtspec.hub); ``download=False`` (--dry-run)
    leaves one that is not cached as its id, with a note."""
    from dataclasses import replace


    recipe, _resolved, missing = resolve_recipe(recipe, download=download, keep_missing=not download)
    family = detect_family(recipe) if recipe.runtime.trtllm.model_family == "auto" else None
    plan = make_plan(recipe, pathlib.Path(out_dir).resolve(), family=family)
    notes = tuple(f"{f}: {e.value} is not in the Hugging Face cache; `trtspec build` without --dry-run downloads it "
                  "(HF_TOKEN from the environment)" for f, e in missing.items())
    return replace(plan, notes=plan.notes + notes) if notes else plan


# --------------------------------------------------------------------------------------------
# the gate: everything that must hold before the first command runs


def version_gate(runtime: str, planned: str, installed: str | None) -> None:
    """Raise ``PreflightError`` when the installed TensorRT-LLM cannot run this plan.

    The engine flow (convert_checkpoint.py → trtllm-build) exists up to 1.2.x only (removed
    upstream in 1.3, reference/trtllm-triton.md §0.1), and the plan's flags are those of the
    release line it was generated for. The PyTorch flow needs 1.0 or newer where it runs; its
    build step (quantize + YAML) does not import TensorRT-LLM."""
    max_line = ".".join(map(str, ENGINE_FLOW_MAX))
    if runtime == "trtllm-engine":
        if installed is None:
            raise PreflightError(
                f"tensorrt_llm is not installed here: the engine flow (convert_checkpoint.py → trtllm-build) "
                f"needs TensorRT-LLM {max_line}.x",
                fix=f"run inside {CONTAINER_HINT}, or pip install 'tensorrt_llm>={max_line},<1.3' "
                    "(trtspec's optional trtllm extra); `trtspec build CONFIG --dry-run` prints the plan without "
                    "it; or set runtime.backend: trtllm-pytorch",
            )
        ok, why = engine_flow_supported(installed)
        if not ok:
            raise PreflightError(
                why,
                fix=f"install TensorRT-LLM {max_line}.x (e.g. {CONTAINER_HINT}), "
                    "or use the PyTorch flow: runtime.backend: trtllm-pytorch",
            )
        if release_line(installed) != release_line(planned):
            raise PreflightError(
                f"TensorRT-LLM {installed} is installed but the plan was generated for {planned} "
                "(runtime.trtllm.version); engines must be built and served by the same release line",
                fix=f"run inside the container for {planned}, or set runtime.trtllm.version: {installed}",
            )
    elif installed is not None:
        ok, why = pytorch_flow_supported(installed)
        if not ok:
            raise PreflightError(why, fix="install TensorRT-LLM 1.0 or newer, or use runtime.backend: trtllm-engine")


def preflight(plan: Plan, *, env: Mapping[str, str] | None = None) -> None:
    """Tools on PATH, example scripts present, inputs present, every flag and key accepted.
    Collects every problem, then raises one ``PreflightError``."""
    problems: list[str] = []
    path = (env or os.environ).get("PATH", os.defpath)
    produced = {s.output for s in plan.stages}
    seen_tools: set[str] = set()
    for stage in plan.stages:
        for argv in stage.commands:
            exe = argv[0]
            if exe not in seen_tools:
                seen_tools.add(exe)
                if shutil.which(exe, path=path) is None:
                    problems.append(f"'{exe}' is not on PATH (stage {stage.id})")
            if len(argv) > 1 and argv[1].endswith(".py") and not pathlib.Path(argv[1]).is_file():
                problems.append(f"{argv[1]} does not exist (runtime.trtllm.examples_dir: the examples/ folder of "
                                f"TensorRT-LLM {plan.trtllm_version})")
            if accepted_names.tool_for(argv) is not None:
                problems += [f"stage {stage.id}: {p}" for p in accepted_names.check_argv(argv)]
        for inp in stage.inputs:
            if inp not in produced and not pathlib.Path(inp).exists():
                problems.append(f"input {inp} does not exist (stage {stage.id})")
    h = plan.handoff
    for opts, name in ((h.llm_api, "llm_api"), (h.llm_api_baseline, "llm_api_baseline")):
        if opts is not None:
            problems += [f"{name}: {p}" for p in accepted_names.check_llm_api(opts)]
    if problems:
        raise PreflightError(
            f"cannot build {plan.recipe_name}: " + "; ".join(problems),
            fix="run inside the TensorRT-LLM container with the models mounted (docs/trtllm.md); "
                "--examples-dir points at TensorRT-LLM's examples/ folder",
        )


# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BuildResult:
    plan: Plan
    handoff: TrtllmBuild  # what trtspec.json says (stages filled in)
    manifest: str
    ran: list[str]  # stage ids executed now
    cached: list[str]  # stage ids reused
    files_written: list[str]
    manifest_written: bool


def _write_files_atomically(files: Mapping[str, str]) -> list[str]:
    """Write the LLM-API YAML files, folder by folder, only when their content changed."""
    by_dir: dict[pathlib.Path, dict[str, str]] = {}
    for p, text in files.items():
        path = pathlib.Path(p)
        by_dir.setdefault(path.parent, {})[path.name] = text
    written: list[str] = []
    for folder, entries in by_dir.items():
        same = folder.is_dir() and all((folder / n).is_file() and (folder / n).read_text() == t
                                       for n, t in entries.items())
        if same:
            continue
        with atomic_dir(folder) as tmp:
            for name, text in entries.items():
                (tmp / name).write_text(text)
        written += [str(folder / n) for n in entries]
    return written


def _write_manifest(out_dir: pathlib.Path, handoff: TrtllmBuild) -> bool:
    """Write ``trtspec.json`` atomically; skip when the same content is there already."""
    body = handoff.to_dict()
    old = maybe_manifest(out_dir)
    if old is not None and old.get("kind") == KIND:
        if {k: v for k, v in old.items() if k not in ("created", "trtspec_version", "kind")} == json.loads(
                json.dumps(body, default=str)):
            return False
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=".manifest-", dir=out_dir))
    try:
        write_manifest(tmp, KIND, **body)
        os.replace(tmp / MANIFEST, out_dir / MANIFEST)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return True


def build(
    recipe: Recipe,
    out_dir: str | os.PathLike,
    *,
    installed_version: Any = _DETECT,
    env: Mapping[str, str] | None = None,
    on_event: OnEvent | None = None,
) -> BuildResult:
    """Run the build. ``installed_version``: the TensorRT-LLM release to gate on (default: the one
    importable here, None when there is none)."""
    plan = plan_build(recipe, out_dir, download=True)
    installed = installed_trtllm_version() if installed_version is _DETECT else installed_version
    version_gate(plan.runtime, plan.trtllm_version, installed)
    preflight(plan, env=env)

    out = pathlib.Path(plan.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    extra = {"trtllm": installed}
    planned = stage_keys(plan.stages, extra_key=extra)
    if not all(is_cached(s, planned[s.id]) for s in plan.stages):
        # the old manifest would describe folders this run replaces: it goes first, the new one last
        (out / MANIFEST).unlink(missing_ok=True)
    keys, ran, cached = run_stages(plan.stages, log_dir=out / "logs", env=env, on_event=on_event, extra_key=extra)
    files = _write_files_atomically(plan.files)
    handoff = replace(plan.handoff, stages=keys)
    wrote = _write_manifest(out, handoff)
    return BuildResult(plan=plan, handoff=handoff, manifest=str(out / MANIFEST), ran=ran, cached=cached,
                       files_written=files, manifest_written=wrote)
