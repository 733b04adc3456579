"""Render a Triton model repository from the read-only templates in ``trtspec/triton/templates/`` (package data).

Recipe → :class:`ServingInputs` (typed, every value resolved) → a list of :class:`ModelPlan`
(which template becomes which model, with which values) → files in a *fresh* folder.

Strict templates: a template placeholder is ``${name}``; a placeholder without a value and a value
without a placeholder are both errors, so a template and its renderer cannot drift apart silently.
The repository is rendered into a temporary sibling folder, every ``config.pbtxt`` is parsed with
Triton's own protobuf schema, and only then is the folder renamed into place.

Layout (names as in NVIDIA's tensorrtllm backend, so its clients work unchanged)::

    ensemble            preprocessing → router → postprocessing      the speculative path
    ensemble_baseline   preprocessing → router_baseline → postprocessing   ordinary decoding
    preprocessing       text → token ids (HF tokenizer)
    postprocessing      token ids → text (streaming-safe deltas)
    router              BLS: sends serving.speculative_fraction of traffic to speculation and falls
                        back to the baseline while rolling acceptance is below break-even
    router_baseline     the same model pinned to the baseline
    tensorrt_llm        the speculative model; tensorrt_llm_baseline the plain one
                        (torch: our engine in a python model; trtllm-engine: the tensorrtllm
                        C++ backend; trtllm-pytorch: the LLM API with model.yaml)
    tensorrt_llm_draft  draft-target recipes: the draft decoding by itself (NVIDIA's name), what
                        external-draft clients (NVIDIA's e2e_grpc_speculative_decoding_client.py)
                        and tensorrt_llm_bls ask for draft tokens
    tensorrt_llm_bls    draft-target recipes: NVIDIA's text-level BLS (num_draft_tokens rounds over
                        tensorrt_llm_draft and the plain target)
    trtspec_draft_target  TRT-LLM engine flow: the token-level draft-target rounds the router calls
"""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import re
import shutil
from dataclasses import dataclass, field
from typing import Any

import yaml

from trtspec.errors import StageError
from trtspec.manifest import MANIFEST, atomic_dir, write_manifest
from trtspec.resources import templates_dir
from trtspec.triton.placement import placement_parameters
from trtspec.manifest import maybe_manifest
from trtspec.trtllm.build import plan_build
from trtspec.trtllm.handoff import KIND, TrtllmBuild
from trtspec.config import recipe_to_dict
from trtspec.speculative.spec import RuntimeSpec
from trtspec.limits import RequestLimits
from trtspec.hub import resolve_recipe
from trtspec.outputs import check_replaceable

TEMPLATES = templates_dir()
RUNTIME_SPEC_FILE = "runtime_spec.json"
REPOSITORY_KIND = "triton-repository"
# Bumped when the client-visible tensor contract (docs/serving.md) changes.
# 2: NVIDIA's full inflight_batcher_llm contract (trtspec/triton/contract.py), serving.decoupled
CONTRACT_VERSION = 2

_PLACEHOLDER = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


class RenderError(StageError):
    """A template and its values disagree, or a rendered config does not parse."""


# --------------------------------------------------------------------------------------------
# strict template filling


def placeholders(text: str) -> set[str]:
    return set(_PLACEHOLDER.findall(text))


def fill(text: str, values: dict[str, Any], *, source: str = "<template>") -> str:
    """Replace every ``${name}``; missing and unused values are errors.

    Values are written as protobuf text-format safe strings (quotes and backslashes escaped);
    booleans become ``true``/``false``. Blocks that must stay verbatim are passed as :class:`Raw`.
    """
    wanted = placeholders(text)
    missing = sorted(wanted - values.keys())
    unknown = sorted(values.keys() - wanted)
    if missing or unknown:
        parts = []
        if missing:
            parts.append(f"no value for placeholder(s) {', '.join('${' + m + '}' for m in missing)}")
        if unknown:
            parts.append(f"value(s) {', '.join(unknown)} match no placeholder")
        raise RenderError(
            f"{source}: " + "; ".join(parts),
            fix="the template and trtspec/triton/render.py must agree: add the placeholder or the value",
        )
    return _PLACEHOLDER.sub(lambda m: _format(values[m.group(1)]), text)


class Raw(str):
    """A value inserted verbatim (a rendered block of pbtxt), not escaped."""


def _format(v: Any) -> str:
    if isinstance(v, Raw):
        return str(v)
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        raise RenderError("a template value is None", fix="resolve every value before rendering")
    return str(v).replace("\\", "\\\\").replace('"', '\\"')


def pbtxt_parameters(params: dict[str, Any]) -> Raw:
    """``parameters`` entries (string values, as Triton wants) for the keys whose value is set."""
    lines = []
    for k, v in params.items():
        if v is None:
            continue
        lines.append(f'parameters {{ key: "{k}" value: {{ string_value: "{_format(v)}" }} }}')
    return Raw("\n".join(lines))


def schema_available() -> bool:
    """Triton's ``ModelConfig`` schema ships with tritonclient ([client], [serve]); the bare core
    renders without it and says so in the repository's notes."""
    try:
        return importlib.util.find_spec("tritonclient") is not None
    except (ImportError, ValueError):
        return False


def parse_model_config(text: str, *, source: str = "config.pbtxt"):
    """Parse with Triton's ``ModelConfig`` protobuf (the schema tritonserver itself uses)."""
    from google.protobuf import text_format  # lazy: [client]/[serve] only (see schema_available)
    from tritonclient.grpc import model_config_pb2  # lazy: as above

    try:
        return text_format.Parse(text, model_config_pb2.ModelConfig())
    except text_format.ParseError as e:
        raise RenderError(f"{source}: not a valid Triton model config: {e}") from None


# --------------------------------------------------------------------------------------------
# typed inputs


@dataclass(frozen=True)
class ServingInputs:
    """Everything the templates need, resolved and typed."""

    name: str
    runtime: str  # torch | trtllm-engine | trtllm-pytorch
    method: str
    tokenizer_dir: str
    max_batch_size: int
    max_input_len: int
    max_seq_len: int
    default_max_tokens: int
    max_queue_size: int
    instances: int
    speculative_fraction: float
    min_acceptance_rate: float | None  # None: break-even from measured costs
    acceptance_window: int  # draft tokens in the router's rolling window
    probe_every: int  # while fallen back, every n-th speculative-bound request still speculates
    max_draft_len: int
    add_special_tokens: bool = False
    decoupled: bool = True  # serving.decoupled (NVIDIA's decoupled_mode)
    engine_process: str = "worker"  # serving.engine_process (torch runtime)
    stream_interval: int = 1  # serving.stream_interval (torch runtime)
    end_id: int = -1  # the target's EOS, as the engine uses it; -1 = unknown (the model's own applies)
    pad_id: int = -1
    max_prompt_bytes: int = 1_048_576  # preprocessing refuses a longer text_input before tokenizing
    request_limits: Any = None  # trtspec.triton.backend.requests.RequestLimits: every python model checks them
    runtime_spec: Any = None  # trtspec.speculative.runtime.RuntimeSpec (torch)
    trtllm: Any = None  # trtspec.trtllm.handoff.TrtllmBuild (trtllm-engine, trtllm-pytorch)
    recipe: dict = field(default_factory=dict)

    @property
    def speculative(self) -> bool:
        return self.method != "none"


def trtllm_build_for(recipe, build_dir: str | os.PathLike):
    """The TRT-LLM build hand-off for ``recipe`` (a :class:`trtspec.trtllm.handoff.TrtllmBuild`).

    ``build_dir/trtspec.json`` (kind ``trtllm-build``) when ``trtspec build`` has run there; else
    the hand-off the build *will* write there (its plan, which reads only the recipe and the
    target's config.json), so a repository can be packaged before, or apart from, the build.
    """

    m = maybe_manifest(build_dir)
    if m is not None and m.get("kind") == KIND:
        build = TrtllmBuild.from_dict(m)
        if build.recipe_name != recipe.name:
            raise RenderError(f"{build_dir} holds the build of recipe '{build.recipe_name}', not '{recipe.name}'",
                              fix="pass the --build-dir of this recipe's build")
        return build
    return plan_build(recipe, build_dir).handoff


def inputs_from_recipe(
    recipe,
    *,
    target: str | None = None,
    draft: str | None = None,
    build_dir: str | os.PathLike | None = None,
    trtllm=None,
) -> ServingInputs:
    """Resolve a validated recipe into :class:`ServingInputs`.

    torch runtime: ``target``/``draft`` override the model folders (e.g. the quantize stage's
    exports). TRT-LLM runtimes: ``trtllm`` (a ``TrtllmBuild``), else the build hand-off in
    ``build_dir`` (:func:`trtllm_build_for`), gives engines, decoding settings, LLM-API options.
    """

    runtime = recipe.runtime.backend
    spec = None
    if runtime == "torch":
        spec = RuntimeSpec.from_recipe(recipe, target=target, draft=draft)
        tokenizer = recipe.target.tokenizer or target or recipe.target.model
        end_id, pad_id = special_ids(target or recipe.target.model)
    else:
        if trtllm is None:
            if build_dir is None:
                raise RenderError(
                    f"runtime {runtime} serves what `trtspec build` makes; packaging needs its folder",
                    fix="pass --build-dir (the folder trtspec build wrote, or will write)",
                )
            trtllm = trtllm_build_for(recipe, build_dir)
        tokenizer = trtllm.tokenizer_dir
        end_id, pad_id = special_ids(trtllm.hf_model_dirs.get("target", recipe.target.model))
    target_dir = (target or recipe.target.model) if runtime == "torch" else \
        trtllm.hf_model_dirs.get("target", recipe.target.model)
    return ServingInputs(
        name=recipe.name,
        runtime=runtime,
        method=recipe.speculation.method,
        tokenizer_dir=str(tokenizer),
        max_batch_size=recipe.limits.max_batch_size,
        max_input_len=recipe.limits.max_input_len,
        max_seq_len=recipe.limits.max_seq_len,
        max_prompt_bytes=recipe.limits.max_prompt_bytes,
        request_limits=RequestLimits.from_recipe(recipe.limits, vocab_size=vocab_size(target_dir)),
        default_max_tokens=recipe.validation.max_tokens,
        max_queue_size=recipe.serving.max_queue_size,
        instances=recipe.serving.instances,
        speculative_fraction=recipe.serving.speculative_fraction,
        min_acceptance_rate=recipe.runtime.adaptive.min_acceptance_rate,
        acceptance_window=recipe.runtime.adaptive.window,
        probe_every=8,
        max_draft_len=recipe.max_draft_len,
        decoupled=recipe.serving.decoupled,
        engine_process=recipe.serving.engine_process,
        stream_interval=recipe.serving.stream_interval,
        end_id=end_id,
        pad_id=pad_id,
        runtime_spec=spec,
        trtllm=trtllm,
        recipe=recipe_to_dict(recipe),
    )


def vocab_size(model_dir: str) -> int | None:
    """The model's ``vocab_size`` (config.json; the bound of its token ids), None when the folder
    is not readable here (a container path): token ids are then checked for sign only."""
    try:
        v = json.loads((pathlib.Path(model_dir) / "config.json").read_text()).get("vocab_size")
    except (OSError, json.JSONDecodeError, AttributeError):
        return None
    return v if isinstance(v, int) and v > 0 else None


def special_ids(model_dir: str) -> tuple[int, int]:
    """(eos, pad) of a checkpoint folder by the engine's rule (generation_config.json wins over
    config.json; a list means its first id); (-1, -1) when the folder is not readable here (a
    container path): the runtime then uses the model's own."""
    def first(v):
        return v[0] if isinstance(v, list) and v else (v if isinstance(v, int) else None)

    folder = pathlib.Path(model_dir)
    cfg, gen = {}, {}
    try:
        if (folder / "config.json").is_file():
            cfg = json.loads((folder / "config.json").read_text())
        if (folder / "generation_config.json").is_file():
            gen = json.loads((folder / "generation_config.json").read_text())
    except (OSError, json.JSONDecodeError):
        return -1, -1
    eos = first(gen.get("eos_token_id"))
    eos = eos if eos is not None else first(cfg.get("eos_token_id"))
    pad = first(gen.get("pad_token_id"))
    pad = pad if pad is not None else first(cfg.get("pad_token_id"))
    return (-1 if eos is None else eos), (-1 if pad is None else pad)


# --------------------------------------------------------------------------------------------
# the plan: which template becomes which model


@dataclass
class ModelPlan:
    name: str
    template: str  # folder under templates/
    values: dict[str, Any]
    files: dict[str, str] = field(default_factory=dict)  # generated files, relative to the model folder
    role: str = ""


def plan_repository(inp: ServingInputs) -> list[ModelPlan]:
    """The models of the repository, their templates and values (pure; no file is touched)."""
    if inp.runtime == "torch":
        spec_model, base_model, engines = _plan_torch(inp)
    elif inp.runtime == "trtllm-engine":
        spec_model, base_model, engines = _plan_trtllm_engine(inp)
    elif inp.runtime == "trtllm-pytorch":
        spec_model, base_model, engines = _plan_llmapi(inp)
    else:
        raise RenderError(f"runtime.backend: no repository layout for runtime '{inp.runtime}'")
    B = inp.max_batch_size
    plans = [
        ModelPlan("preprocessing", "preprocessing", {
            "max_batch_size": B,
            "instances": inp.instances,
            "tokenizer_dir": inp.tokenizer_dir,
            "add_special_tokens": inp.add_special_tokens,
            "max_input_len": inp.max_input_len,
            "max_seq_len": inp.max_seq_len,
            "max_prompt_bytes": inp.max_prompt_bytes,
            "default_max_tokens": inp.default_max_tokens,
            "end_id": inp.end_id,
            "pad_id": inp.pad_id,
        }, role="tokenizer"),
        ModelPlan("postprocessing", "postprocessing", {
            "max_batch_size": B,
            "tokenizer_dir": inp.tokenizer_dir,
        }, role="detokenizer"),
        _router("router", inp, spec_model if inp.speculative else None, base_model, engines),
        _router("router_baseline", inp, None, base_model, engines),
        _ensemble("ensemble", inp, "router"),
        _ensemble("ensemble_baseline", inp, "router_baseline"),
        *engines,
    ]
    for plan in plans:  # every python model checks each request against the deployment's limits
        if plan.template in PYTHON_TEMPLATES:
            plan.values.setdefault("request_limits", limits_json(inp))
    return plans


def limits_json(inp: ServingInputs) -> str:
    """The ``request_limits`` parameter of a python model (trtspec.limits.RequestLimits as JSON)."""
    return (inp.request_limits or RequestLimits(max_input_len=inp.max_input_len, max_seq_len=inp.max_seq_len,
                                                max_prompt_bytes=inp.max_prompt_bytes)).to_json()


# the templates whose model is trtspec's python code (the others: Triton's ensemble, NVIDIA's C++ backend)
PYTHON_TEMPLATES = ("preprocessing", "postprocessing", "router", "tensorrt_llm/torch", "tensorrt_llm/llmapi",
                    "trtspec_draft_target", "tensorrt_llm_bls")


def _kind(model: str | None, engines: list[ModelPlan]) -> str:
    """Which outputs ``model`` has: trtspec's (served_by, perf_json) or the tensorrtllm backend's."""
    plan = next((p for p in engines if p.name == model), None)
    return "tensorrtllm" if plan is not None and plan.template == "tensorrt_llm/tensorrtllm" else "trtspec"


def _router(name: str, inp: ServingInputs, spec_model: str | None, base_model: str,
            engines: list[ModelPlan]) -> ModelPlan:
    return ModelPlan(name, "router", {
        "model_name": name,
        "max_batch_size": inp.max_batch_size,
        "speculative_model": spec_model or "",
        "baseline_model": base_model,
        "speculative_model_kind": _kind(spec_model, engines),
        "baseline_model_kind": _kind(base_model, engines),
        "speculative_fraction": inp.speculative_fraction if spec_model else 0.0,
        "min_acceptance_rate": "auto" if inp.min_acceptance_rate is None else inp.min_acceptance_rate,
        "acceptance_window": inp.acceptance_window,
        "probe_every": inp.probe_every,
        "max_draft_len": inp.max_draft_len,
        "decoupled": inp.decoupled,
    }, role="router" if spec_model else "router (baseline only)")


def _ensemble(name: str, inp: ServingInputs, router: str) -> ModelPlan:
    return ModelPlan(name, "ensemble", {
        "model_name": name,
        "max_batch_size": inp.max_batch_size,
        "router_model": router,
    }, role="speculative path" if router == "router" else "baseline path")


def torch_engine_plan(name: str, inp: ServingInputs, spec, served_by: str) -> ModelPlan:
    """A torch-runtime generation model serving ``spec`` (a RuntimeSpec) under ``name``."""
    return ModelPlan(name, "tensorrt_llm/torch", {
        "request_limits": limits_json(inp),
        "model_name": name,
        "max_batch_size": inp.max_batch_size,
        "served_by": served_by,
        "runtime_spec": RUNTIME_SPEC_FILE,
        "max_queue_size": inp.max_queue_size,
        "decoupled": inp.decoupled,
        "exclude_input_in_output": False,
        "engine_process": inp.engine_process,
        "stream_interval": inp.stream_interval,
    }, files={f"1/{RUNTIME_SPEC_FILE}": spec.to_json() + "\n"}, role=f"{served_by} engine (torch runtime)")


def _plan_torch(inp: ServingInputs):
    spec = inp.runtime_spec
    if spec is None:
        raise RenderError("runtime torch needs a RuntimeSpec", fix="build ServingInputs with inputs_from_recipe()")
    plain = spec.baseline()
    if not inp.speculative:
        return None, "tensorrt_llm", [torch_engine_plan("tensorrt_llm", inp, plain, "baseline")]
    engines = [
        torch_engine_plan("tensorrt_llm", inp, spec, "speculative"),
        torch_engine_plan("tensorrt_llm_baseline", inp, plain, "baseline"),
    ]
    if spec.method == "draft_target":
        # NVIDIA's external-draft layout beside our own speculation: the draft alone, and the text
        # BLS that drafts with it and verifies on the plain target
        engines += [
            torch_engine_plan("tensorrt_llm_draft", inp, spec.draft_alone(), "draft"),
            text_bls_plan(inp, "tensorrt_llm_baseline", "tensorrt_llm_draft", "ensemble_baseline", spec.max_draft_len),
        ]
    return "tensorrt_llm", "tensorrt_llm_baseline", engines


def _tensorrtllm(name: str, inp: ServingInputs, role: str) -> ModelPlan:
    """A tensorrtllm-backend model for the build's ``role`` engine (target | draft | baseline)."""

    params = dict(inp.trtllm.triton_parameters(role))
    # GPUs and MPI ranks come from the launch layout, the same one `trtspec serve` runs (mpi.py)
    params.update(placement_parameters(inp.trtllm, inp.recipe, role))
    engine_dir = params.pop("gpt_model_path")
    return ModelPlan(name, "tensorrt_llm/tensorrtllm", {
        "model_name": name,
        "max_batch_size": inp.max_batch_size,
        "max_queue_size": inp.max_queue_size,
        "engine_dir": engine_dir,
        "engine_parameters": pbtxt_parameters(params),
        "decoupled": inp.decoupled,
    }, role=f"{role} engine (tensorrtllm backend)")


def rounds_plan(inp: ServingInputs, target: str, draft: str, num_draft_tokens: int) -> ModelPlan:
    """``trtspec_draft_target``: token-level draft-target rounds over the generation models
    ``draft`` and ``target`` (the engine flow's speculative model, behind the router)."""
    return ModelPlan("trtspec_draft_target", "trtspec_draft_target", {
        "request_limits": limits_json(inp),
        "max_batch_size": inp.max_batch_size,
        "tensorrt_llm_model_name": target,
        "tensorrt_llm_draft_model_name": draft,
        "num_draft_tokens": num_draft_tokens,
        "decoupled": inp.decoupled,
    }, role=f"draft-target rounds (BLS over {draft} + {target})")


def text_bls_plan(inp: ServingInputs, target: str, draft: str, plain_model: str, max_draft_len: int) -> ModelPlan:
    """``tensorrt_llm_bls``: NVIDIA's text-level BLS; ``num_draft_tokens`` rounds over ``draft`` and
    ``target``, other requests relayed to the text ensemble ``plain_model`` (over ``target``)."""
    return ModelPlan("tensorrt_llm_bls", "tensorrt_llm_bls", {
        "request_limits": limits_json(inp),
        "max_batch_size": inp.max_batch_size,
        "tensorrt_llm_model_name": target,
        "tensorrt_llm_draft_model_name": draft,
        "plain_model": plain_model,
        "max_draft_len": max_draft_len,
        "decoupled": inp.decoupled,
    }, role=f"NVIDIA's text BLS (num_draft_tokens rounds over {draft} + {target})")


def _plan_trtllm_engine(inp: ServingInputs):
    b = inp.trtllm
    if b is None or "target" not in b.engines:
        raise RenderError("runtime trtllm-engine needs the build's target engine",
                          fix="pass the --build-dir of `trtspec build`")
    if inp.method in ("none", "draft_target"):
        target = _tensorrtllm("tensorrt_llm", inp, "target")
        if inp.method == "none":
            return None, "tensorrt_llm", [target]
        draft = _tensorrtllm("tensorrt_llm_draft", inp, "draft")
        k = b.max_draft_len or inp.max_draft_len
        rounds = rounds_plan(inp, "tensorrt_llm", "tensorrt_llm_draft", k)
        bls = text_bls_plan(inp, "tensorrt_llm", "tensorrt_llm_draft", "ensemble_baseline", k)
        # without draft tokens the target engine decodes plainly: it is the baseline
        return "trtspec_draft_target", "tensorrt_llm", [target, draft, rounds, bls]
    if inp.method not in ("eagle", "medusa", "lookahead"):
        raise RenderError(
            f"speculation.method '{inp.method}' has no TRT-LLM engine-flow serving layout here",
            fix="use runtime.backend: trtllm-pytorch (LLM API) or torch for this method",
        )
    if "baseline" not in b.engines:
        raise RenderError(
            f"a {inp.method} engine drafts by itself; the baseline path needs the build's plain engine",
            fix="rebuild with `trtspec build` (it builds baseline-engine/ for this method)",
        )
    return "tensorrt_llm", "tensorrt_llm_baseline", [
        _tensorrtllm("tensorrt_llm", inp, "target"),
        _tensorrtllm("tensorrt_llm_baseline", inp, "baseline"),
    ]


def _llmapi(name: str, inp: ServingInputs, *, baseline: bool) -> ModelPlan:
    doc = inp.trtllm.triton_model_yaml(decoupled=True, baseline=baseline)
    # our llmapi model takes [1, ...] tensors from the router (a batch of one), as its config.pbtxt says
    doc["triton_config"] = {**doc.get("triton_config", {}), "max_batch_size": inp.max_batch_size,
                            "decoupled": inp.decoupled}
    served_by = "baseline" if baseline else "speculative"
    return ModelPlan(name, "tensorrt_llm/llmapi", {
        "model_name": name,
        "max_batch_size": inp.max_batch_size,
        "served_by": served_by,
        "decoupled": inp.decoupled,
    }, files={"1/model.yaml": yaml.safe_dump(doc, sort_keys=False)}, role=f"{served_by} (TRT-LLM LLM API)")


def _plan_llmapi(inp: ServingInputs):
    b = inp.trtllm
    if b is None or b.llm_api is None:
        raise RenderError("runtime trtllm-pytorch needs the build's LLM-API options",
                          fix="pass the --build-dir of `trtspec build`")
    if not inp.speculative:
        return None, "tensorrt_llm", [_llmapi("tensorrt_llm", inp, baseline=False)]
    if "speculative_config" not in b.llm_api:
        raise RenderError("the build's LLM-API options have no speculative_config for a speculative recipe",
                          fix="rebuild with `trtspec build`")
    if b.llm_api_baseline is None:
        raise RenderError("the build has no baseline LLM-API options", fix="rebuild with `trtspec build`")
    return "tensorrt_llm", "tensorrt_llm_baseline", [
        _llmapi("tensorrt_llm", inp, baseline=False),
        _llmapi("tensorrt_llm_baseline", inp, baseline=True),
    ]


# --------------------------------------------------------------------------------------------
# writing


@dataclass
class RenderedRepository:
    path: pathlib.Path
    models: dict[str, str]  # name → role
    manifest: dict[str, Any]

    @property
    def notes(self) -> list[str]:
        return self.manifest.get("notes", [])


def render_repository(
    inp: ServingInputs,
    out: str | os.PathLike,
    *,
    overwrite: bool = False,
    templates: str | os.PathLike = TEMPLATES,
) -> RenderedRepository:
    """Render the repository for ``inp`` into the fresh folder ``out``."""
    out = pathlib.Path(out)
    templates = pathlib.Path(templates)
    if out.exists() and not overwrite:
        raise RenderError(f"output folder {out} already exists",
                          fix="choose a new folder, or pass --force to replace it")

    check_replaceable(out, REPOSITORY_KIND, overwrite)  # --force replaces only a repository trtspec rendered
    plans = plan_repository(inp)
    names = [p.name for p in plans]
    if len(set(names)) != len(names):
        raise RenderError(f"two models share a name: {names}")
    with atomic_dir(out, overwrite=overwrite) as tmp:
        for plan in plans:
            render_model(plan, templates, tmp)
        manifest = write_manifest(tmp, REPOSITORY_KIND, **_manifest_fields(inp, plans), notes=notes(inp),
                                  schema_checked=schema_available())
    return RenderedRepository(out, {p.name: p.role for p in plans}, manifest)


def render_model(plan: ModelPlan, templates: pathlib.Path, root: pathlib.Path) -> None:
    """Render one model folder ``root/plan.name`` (strict; its config.pbtxt parsed first)."""
    src = templates / plan.template
    if not (src / "config.pbtxt").is_file():
        raise RenderError(f"template {src}/config.pbtxt not found", fix="reinstall trtspec (its package data trtspec/triton/templates/ is missing)")
    dst = root / plan.name
    dst.mkdir()
    source = f"templates/{plan.template}/config.pbtxt"
    text = fill((src / "config.pbtxt").read_text(), plan.values, source=source)
    cfg = parse_model_config(text, source=f"{plan.name}/config.pbtxt (from {source})") if schema_available() else None
    if cfg is not None and cfg.name and cfg.name != plan.name:
        raise RenderError(f"{source}: renders name '{cfg.name}' into folder '{plan.name}'")
    (dst / "config.pbtxt").write_text(text)
    # everything else in the template folder (model.py) is copied verbatim; a version folder always exists
    for f in sorted(src.rglob("*")):
        rel = f.relative_to(src)
        if f.is_dir() or rel.name == "config.pbtxt" or "__pycache__" in rel.parts:
            continue
        if placeholders(f.read_text(errors="replace")):
            raise RenderError(f"templates/{plan.template}/{rel} has ${{...}} placeholders; "
                              "only config.pbtxt is a template")
        (dst / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(f, dst / rel)
    (dst / "1").mkdir(exist_ok=True)
    for rel, content in plan.files.items():
        p = dst / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(content)


def _manifest_fields(inp: ServingInputs, plans: list[ModelPlan]) -> dict[str, Any]:
    router = next(p for p in plans if p.name == "router")
    return {
        "contract_version": CONTRACT_VERSION,
        "runtime": inp.runtime,
        "method": inp.method,
        "models": {p.name: p.role for p in plans},
        "entry_points": {"speculative": "ensemble", "baseline": "ensemble_baseline"},
        "speculative_model": router.values["speculative_model"] or None,
        "baseline_model": router.values["baseline_model"],
        "tokenizer_dir": inp.tokenizer_dir,
        "defaults": {"max_tokens": inp.default_max_tokens},
        "limits": {"max_batch_size": inp.max_batch_size, "max_input_len": inp.max_input_len,
                   "max_seq_len": inp.max_seq_len},
        "routing": {"speculative_fraction": router.values["speculative_fraction"],
                    "min_acceptance_rate": inp.min_acceptance_rate,
                    "acceptance_window": inp.acceptance_window, "probe_every": inp.probe_every},
        "runtime_spec": inp.runtime_spec.to_dict() if inp.runtime_spec is not None else None,
        "trtllm_build": inp.trtllm.to_dict() if inp.trtllm is not None else None,
        "recipe": inp.recipe,
    }


def notes(inp: ServingInputs) -> list[str]:
    out = _notes(inp)
    if not schema_available():
        out.append("config.pbtxt files were not checked against Triton's ModelConfig schema (it ships with "
                   "tritonclient): pip install 'trtspec[client]' to check them when packaging")
    return out


def _notes(inp: ServingInputs) -> list[str]:
    """What the user should know about this repository (e.g. quantization not applied)."""
    out = []
    spec, recipe = inp.runtime_spec, inp.recipe
    if spec is not None:
        for role, key, folder in (("target", ("target",), spec.target),
                                  ("draft", ("speculation", "draft"), spec.draft)):
            node = recipe
            for k in key:
                node = (node or {}).get(k) or {}
            fmt = (node.get("quantization") or {}).get("format", "none")
            if fmt != "none" and folder == node.get("model"):
                out.append(f"the recipe quantizes the {role} ({fmt}) but this repository serves the unquantized "
                           f"folder {folder}; to serve the quantized one, package with --{role} <quantize export>")
    return out


def read_repository_manifest(repo: str | os.PathLike) -> dict[str, Any] | None:
    """The repository's ``trtspec.json``, or None for a repository trtspec did not render."""
    p = pathlib.Path(repo) / MANIFEST
    if not p.is_file():
        return None
    data = json.loads(p.read_text())
    return data if data.get("kind") == REPOSITORY_KIND else None


def package(
    recipe,
    out: str | os.PathLike,
    *,
    target: str | None = None,
    draft: str | None = None,
    build_dir: str | os.PathLike | None = None,
    overwrite: bool = False,
) -> RenderedRepository:
    """``trtspec package``: recipe → rendered, self-describing Triton model repository.
    Hub-id models (trtspec.hub) are packaged from their snapshot folders."""

    recipe, _resolved, _ = resolve_recipe(recipe, download=True)
    inp = inputs_from_recipe(recipe, target=target, draft=draft, build_dir=build_dir)
    return render_repository(inp, out, overwrite=overwrite)
