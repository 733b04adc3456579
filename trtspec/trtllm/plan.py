"""The build plan: the stage graph quantize → convert → build, as data.

:func:`make_plan` is pure: recipe in, :class:`Plan` out (every argv, every folder and file, and
the hand-off manifest the build will write). Nothing is read or run; ``trtspec build --dry-run``
prints it and the golden tests compare it. :mod:`trtspec.trtllm.build` executes it.

Layout under the output folder (the Triton packager expects the engine names)::

    calib/              calibration text for TRT-LLM's quantize scripts (train.jsonl); none for
                        cnn_dailymail, which quantize.py reads by name
    target-ckpt/        TRT-LLM checkpoint of the target (quantize.py, or convert_checkpoint.py)
    target-engine/      trtllm-build output; drafts by itself for eagle/medusa/lookahead
    draft-ckpt/ draft-engine/          draft-target
    eagle-quant/        EAGLE FP8: one ModelOpt unified checkpoint (base + eagle_module)
    baseline-ckpt/ baseline-engine/    plain engine for the non-speculative path (eagle/medusa/lookahead)
    target-quant/ draft-quant/ head-quant/   PyTorch flow: unified HF exports (trtspec quantize)
    llmapi/             PyTorch flow: extra_llm_api_options.yaml (speculative and baseline)
    logs/               one log per stage (stdout + stderr of its commands)
    trtspec.json        the hand-off manifest (kind trtllm-build), written last
"""

from __future__ import annotations

import pathlib
from dataclasses import dataclass, field
from typing import Any

from trtspec.config import Eagle, Lookahead, Medusa, ModelSpec, NGram, Recipe, recipe_to_dict
from trtspec.errors import ConfigError
from trtspec.manifest import hash_json
from trtspec.passthrough import build_argv_tail, merge_llm_api_options, recipe_warnings
from trtspec.trtllm import commands as C
from trtspec.trtllm import llmapi
from trtspec.trtllm.handoff import TrtllmBuild
from trtspec.calib_sources import NAMED

LLMAPI_DIR = "llmapi"
EXTRA_OPTIONS = "extra_llm_api_options.yaml"
EXTRA_OPTIONS_BASELINE = "baseline_llm_api_options.yaml"
SERVE_PORT = 8000


@dataclass(frozen=True)
class Stage:
    """One node of the stage graph: commands that together write one folder.

    ``output`` appears in ``commands`` only as a whole argument or as its prefix (``output/...``);
    the build runs the commands with a fresh temporary folder in its place and renames it on success.
    """

    id: str  # also the folder name under the output folder
    title: str
    role: str  # target | draft | head | baseline | calibration
    output: str
    commands: tuple[tuple[str, ...], ...]
    inputs: tuple[str, ...] = ()  # folders/files outside the build that the commands read
    after: tuple[str, ...] = ()  # stages whose output the commands read
    expect: tuple[str, ...] = ()  # files the output must hold when the commands succeed

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id, "title": self.title, "role": self.role, "output": self.output,
            "commands": [list(c) for c in self.commands], "inputs": list(self.inputs),
            "after": list(self.after), "expect": list(self.expect),
        }


@dataclass(frozen=True)
class Plan:
    recipe_name: str
    runtime: str
    method: str
    trtllm_version: str
    out_dir: str
    stages: tuple[Stage, ...]
    files: dict[str, str]  # absolute path → text the build writes (LLM-API YAML)
    handoff: TrtllmBuild  # the manifest the build writes last (stages filled in then)
    notes: tuple[str, ...] = field(default_factory=tuple)

    def commands(self) -> list[list[str]]:
        return [list(c) for s in self.stages for c in s.commands]

    def to_dict(self) -> dict[str, Any]:
        return {
            "recipe": self.recipe_name, "runtime": self.runtime, "method": self.method,
            "trtllm_version": self.trtllm_version, "out_dir": self.out_dir,
            "stages": [s.to_dict() for s in self.stages], "files": dict(self.files),
            "manifest": str(pathlib.Path(self.out_dir) / "trtspec.json"),
            "handoff": self.handoff.to_dict(), "notes": list(self.notes),
        }


# --------------------------------------------------------------------------------------------


def _ckpt_expect(world: int) -> tuple[str, ...]:
    return ("config.json", *(f"rank{r}.safetensors" for r in range(world)))


def _engine_expect(world: int) -> tuple[str, ...]:
    return ("config.json", *(f"rank{r}.engine" for r in range(world)))


class _Builder:
    """Accumulates stages; one per recipe. Keeps the per-method logic below flat."""

    def __init__(self, recipe: Recipe, out: pathlib.Path, family: str | None):
        self.r = recipe
        self.out = out
        self.t = recipe.runtime.trtllm
        self.lim = recipe.limits
        self.family_hint = family
        self.stages: list[Stage] = []
        self.notes: list[str] = []
        self._calib: dict[tuple, str] = {}

    def path(self, name: str) -> str:
        return str(self.out / name)

    def add(self, stage: Stage) -> Stage:
        assert stage.id not in {s.id for s in self.stages}, stage.id
        self.stages.append(stage)
        return stage

    # ---- facts the plan needs

    @property
    def family(self) -> str:
        fam = self.t.model_family if self.t.model_family != "auto" else self.family_hint
        if fam is None:
            raise ConfigError(
                "runtime.trtllm.model_family", "auto",
                f"cannot tell which convert_checkpoint.py to use: {self.r.target.model}/config.json is not readable here",
                fix="set runtime.trtllm.model_family: llama | mistral | mixtral | qwen",
            )
        if fam not in C.CONVERT_SCRIPTS:
            raise ConfigError(
                "runtime.trtllm.model_family", fam,
                "the TRT-LLM engine flow has no convert_checkpoint.py for this model family in trtspec",
                fix="use llama, mistral, mixtral or qwen, or runtime.backend: trtllm-pytorch",
            )
        return fam

    def calibration(self, spec: ModelSpec) -> tuple[C.Calibration, str | None]:
        """(what quantize.py gets, the calibration stage id or None). ``cnn_dailymail`` goes to
        quantize.py by name (its own loader reads it); every other source becomes a local folder
        with a train split and a text column, one stage per (source, split, column, sizes)."""

        cal = spec.quantization.calibration
        named = NAMED.get(cal.dataset)
        if named is not None and named.trtllm_native and cal.split in (None, named.split) \
                and cal.column in (None, named.column):
            return C.Calibration(cal.dataset, cal.size, cal.seq_len), None
        key = (cal.dataset, cal.split, cal.column, cal.size, cal.seq_len)
        if key not in self._calib:
            sid = "calib" if not self._calib else f"calib-{len(self._calib) + 1}"
            out = self.path(sid)
            extra: tuple[str, ...] = ()
            if cal.split:
                extra += ("--split", cal.split)
            if cal.column:
                extra += ("--column", cal.column)
            local = cal.dataset.startswith("/")
            self.add(Stage(
                id=sid,
                title=f"calibration text ({cal.dataset}, {cal.size} samples x {cal.seq_len} tokens)",
                role="calibration",
                output=out,
                commands=((C.PYTHON, "-m", "trtspec.trtllm.calibration", "--source", cal.dataset, *extra,
                           "--size", str(cal.size), "--seq-len", str(cal.seq_len), "--output", out),),
                inputs=(cal.dataset,) if local else (),
                expect=("train.jsonl",),
            ))
            self._calib[key] = sid
        sid = self._calib[key]
        return C.Calibration(self.path(sid), cal.size, cal.seq_len), sid

    # ---- engine-flow building blocks

    def checkpoint(self, role: str, spec: ModelSpec, *, tp: int, pp: int, sid: str | None = None) -> Stage:
        """TRT-LLM checkpoint of a plain model: quantize.py when anything is quantized, else the
        family's convert_checkpoint.py."""
        sid = sid or f"{role}-ckpt"
        out = self.path(sid)
        q = spec.quantization
        if q.format != "none" or q.kv_cache != "none":
            calib, cid = self.calibration(spec)
            argv = C.quantize_argv(
                self.t.examples_dir, model_dir=spec.model, output_dir=out, qformat=C.QFORMAT[q.format],
                kv_cache_dtype=None if q.kv_cache == "none" else q.kv_cache, dtype=self.t.checkpoint_dtype,
                calib=calib, tp_size=tp, pp_size=pp,
            )
            kv = "" if q.kv_cache == "none" else f", KV {q.kv_cache}"
            return self.add(Stage(sid, f"quantize {role} ({q.format}{kv}) → TRT-LLM checkpoint", role, out,
                                  (tuple(argv),), inputs=(spec.model,), after=_ids(cid), expect=_ckpt_expect(tp * pp)))
        argv = C.convert_argv(self.t.examples_dir, self.family, model_dir=spec.model, output_dir=out,
                              dtype=self.t.checkpoint_dtype, tp_size=tp, pp_size=pp)
        return self.add(Stage(sid, f"convert {role} ({self.family}, {self.t.checkpoint_dtype}) → TRT-LLM checkpoint",
                              role, out, (tuple(argv),), inputs=(spec.model,), expect=_ckpt_expect(tp * pp)))

    def engine(self, role: str, ckpt: Stage, *, world: int, mode: str | None, gather_logits: bool = False) -> Stage:
        sid = f"{role}-engine"
        out = self.path(sid)
        argv = C.build_argv(
            checkpoint_dir=ckpt.output, output_dir=out, gemm_plugin=self.t.gemm_plugin,
            max_batch_size=self.lim.max_batch_size, max_input_len=self.lim.max_input_len,
            max_seq_len=self.lim.max_seq_len, max_num_tokens=self.t.max_num_tokens,
            speculative_decoding_mode=mode, max_draft_len=self.r.max_draft_len,
            gather_generation_logits=gather_logits, world_size=world,
        ) + build_argv_tail(self.t.build_args)
        what = f"speculative_decoding_mode {mode}, max_draft_len {self.r.max_draft_len}" if mode else "plain"
        return self.add(Stage(sid, f"trtllm-build {role} engine ({what})", role, out, (tuple(argv),),
                              after=(ckpt.id,), expect=_engine_expect(world)))


def _ids(*ids: str | None) -> tuple[str, ...]:
    return tuple(i for i in ids if i)


def _gpu_ids(recipe: Recipe, world: int, draft_tp: int | None) -> tuple[list[int], list[int] | None]:
    t = recipe.runtime.trtllm
    ids = list(t.gpu_device_ids) if t.gpu_device_ids is not None else list(range(world))
    if len(ids) != world:
        raise ConfigError("runtime.trtllm.gpu_device_ids", t.gpu_device_ids,
                          f"needs one GPU per target rank: tensor_parallel_size x pipeline_parallel_size = {world}",
                          fix=f"list {world} device ids, e.g. {list(range(world))}")
    if draft_tp is None:
        return ids, None
    # by default the draft shares the target's first GPUs (the KV-cache fractions split them)
    dids = list(t.draft_gpu_device_ids) if t.draft_gpu_device_ids is not None else ids[:draft_tp]
    if len(dids) != draft_tp:
        raise ConfigError("runtime.trtllm.draft_gpu_device_ids", t.draft_gpu_device_ids,
                          f"needs one GPU per draft rank: draft_tensor_parallel_size = {draft_tp}",
                          fix=f"list {draft_tp} device id(s)")
    return ids, dids


def _engine_flow(b: _Builder) -> dict[str, Any]:
    r, s, t, lim = b.r, b.r.speculation, b.t, b.lim
    tp, pp = lim.tensor_parallel_size, lim.pipeline_parallel_size
    world = tp * pp
    engines: dict[str, str] = {}
    ckpts: dict[str, str] = {}
    mode = C.SPECULATIVE_DECODING_MODE[s.method]
    facts: dict[str, Any] = {"speculative_decoding_mode": mode}

    if s.method in ("none", "draft_target", "ngram", "lookahead"):
        target_ckpt = b.checkpoint("target", r.target, tp=tp, pp=pp)
        gather = s.method == "draft_target" and s.use_draft_logits
        engines["target"] = b.engine("target", target_ckpt, world=world, mode=mode, gather_logits=gather).output
        ckpts["target"] = target_ckpt.output
        if s.method == "draft_target":
            dtp = lim.draft_tensor_parallel_size or 1
            draft_ckpt = b.checkpoint("draft", s.draft, tp=dtp, pp=1)
            engines["draft"] = b.engine("draft", draft_ckpt, world=dtp, mode=None, gather_logits=gather).output
            ckpts["draft"] = draft_ckpt.output
        if s.method == "lookahead":
            # the same checkpoint, built without lookahead: the non-speculative path
            engines["baseline"] = b.engine("baseline", target_ckpt, world=world, mode=None).output
        return {**facts, "engines": engines, "checkpoints": ckpts}

    if isinstance(s, Eagle):
        q, hq = r.target.quantization, s.head.quantization
        if hq.format != "none" or hq.kv_cache != "none":
            raise ConfigError("speculation.head.quantization.format", hq.format,
                              "the EAGLE engine flow quantizes base and head together, from target.quantization",
                              fix="set the head's format and kv_cache to none; quantize through target.quantization")
        if q.format not in ("none", "fp8"):
            raise ConfigError("target.quantization.format", q.format,
                              "the TRT-LLM EAGLE engine takes FP16/BF16, or FP8 through the ModelOpt unified "
                              "checkpoint (examples/eagle/quantize.py)", fix="use fp8 or none")
        quantized = q.format != "none" or q.kv_cache != "none"
        if s.modelopt_checkpoint and quantized:
            raise ConfigError("target.quantization.format", q.format,
                              "with speculation.modelopt_checkpoint the EAGLE engine comes from that checkpoint as "
                              "it is (its hf_quant_config.json says how it is quantized)",
                              fix="quantize the ModelOpt checkpoint with ModelOpt first and set target.quantization "
                                  "to none, or set modelopt_checkpoint: false")
        out = b.path("target-ckpt")
        eagle_args = dict(output_dir=out, dtype=t.checkpoint_dtype, tp_size=tp, max_draft_len=s.max_draft_len,
                          num_eagle_layers=s.num_eagle_layers, max_non_leaves_per_layer=s.max_non_leaves_per_layer)
        if quantized:
            calib, cid = b.calibration(r.target)
            uq = b.add(Stage(
                "eagle-quant", "quantize target + EAGLE head (fp8) → one ModelOpt unified checkpoint", "target",
                b.path("eagle-quant"),
                (tuple(C.eagle_quantize_argv(t.examples_dir, model_dir=r.target.model, eagle_model_dir=s.head.model,
                                             output_dir=b.path("eagle-quant"),
                                             kv_cache_dtype=None if q.kv_cache == "none" else q.kv_cache,
                                             calib=calib)),),
                inputs=(r.target.model, s.head.model), after=_ids(cid), expect=("config.json", "hf_quant_config.json"),
            ))
            argv = C.eagle_convert_argv(t.examples_dir, model_dir=uq.output, eagle_model_dir=None, **eagle_args)
            ckpt = b.add(Stage("target-ckpt", "convert the ModelOpt EAGLE checkpoint (single-checkpoint path)",
                               "target", out, (tuple(argv),), after=(uq.id,), expect=_ckpt_expect(world)))
        elif s.modelopt_checkpoint:
            argv = C.eagle_convert_argv(t.examples_dir, model_dir=s.head.model, eagle_model_dir=None, **eagle_args)
            ckpt = b.add(Stage("target-ckpt", "convert the ModelOpt EAGLE checkpoint (single-checkpoint path)",
                               "target", out, (tuple(argv),), inputs=(s.head.model,), expect=_ckpt_expect(world)))
        else:
            argv = C.eagle_convert_argv(t.examples_dir, model_dir=r.target.model, eagle_model_dir=s.head.model,
                                        **eagle_args)
            ckpt = b.add(Stage("target-ckpt", "convert target + EAGLE head → EAGLE TRT-LLM checkpoint", "target", out,
                               (tuple(argv),), inputs=(r.target.model, s.head.model), expect=_ckpt_expect(world)))
        engines["target"] = b.engine("target", ckpt, world=world, mode=mode).output
        ckpts["target"] = ckpt.output
    elif isinstance(s, Medusa):
        q, hq = r.target.quantization, s.head.quantization
        if hq.format != "none" or hq.kv_cache != "none":
            raise ConfigError("speculation.head.quantization.format", hq.format,
                              "Medusa heads stay FP16/BF16 in the TRT-LLM flow", fix="set the head's format to none")
        if q.format not in ("none", "fp8"):
            raise ConfigError("target.quantization.format", q.format, "Medusa supports an FP8 base model only",
                              fix="use fp8 or none")
        out = b.path("target-ckpt")
        if q.format != "none" or q.kv_cache != "none":
            calib, cid = b.calibration(r.target)
            argv = C.quantize_argv(
                t.examples_dir, model_dir=r.target.model, output_dir=out, qformat=C.QFORMAT[q.format],
                kv_cache_dtype=None if q.kv_cache == "none" else q.kv_cache, dtype=t.checkpoint_dtype, calib=calib,
                tp_size=tp, pp_size=pp, medusa_model_dir=s.head.model, num_medusa_heads=s.num_medusa_heads,
                max_draft_len=s.max_draft_len,
            )
            kv = "" if q.kv_cache == "none" else f", KV {q.kv_cache}"
            ckpt = b.add(Stage("target-ckpt", f"quantize target ({q.format}{kv}) + Medusa heads → TRT-LLM checkpoint",
                               "target", out, (tuple(argv),), inputs=(r.target.model, s.head.model), after=_ids(cid),
                               expect=_ckpt_expect(world)))
        else:
            if t.checkpoint_dtype == "auto":
                raise ConfigError("runtime.trtllm.checkpoint_dtype", "auto",
                                  "examples/medusa/convert_checkpoint.py takes float16, bfloat16 or float32",
                                  fix="set checkpoint_dtype: float16 (or bfloat16)")
            argv = C.medusa_convert_argv(
                t.examples_dir, model_dir=r.target.model, medusa_model_dir=s.head.model, output_dir=out,
                dtype=t.checkpoint_dtype, model_type=C.MEDUSA_MODEL_TYPE[b.family], tp_size=tp, pp_size=pp,
                num_medusa_heads=s.num_medusa_heads, max_draft_len=s.max_draft_len,
            )
            ckpt = b.add(Stage("target-ckpt", "convert target + Medusa heads → Medusa TRT-LLM checkpoint", "target",
                               out, (tuple(argv),), inputs=(r.target.model, s.head.model), expect=_ckpt_expect(world)))
        engines["target"] = b.engine("target", ckpt, world=world, mode=mode).output
        ckpts["target"] = ckpt.output
    else:  # the schema keeps eagle3 / mtp off this runtime
        raise ConfigError("runtime.backend", r.runtime.backend,
                          f"speculation method '{s.method}' has no TRT-LLM engine flow",
                          fix="use runtime.backend: trtllm-pytorch")
    # EAGLE and Medusa engines draft by themselves: the baseline needs its own plain engine
    base_ckpt = b.checkpoint("baseline", r.target, tp=tp, pp=pp)
    engines["baseline"] = b.engine("baseline", base_ckpt, world=world, mode=None).output
    ckpts["baseline"] = base_ckpt.output
    return {**facts, "engines": engines, "checkpoints": ckpts}


def _pytorch_flow(b: _Builder) -> dict[str, Any]:
    r, s, t = b.r, b.r.speculation, b.t
    quantized: dict[str, str] = {}

    def export(role: str, spec: ModelSpec) -> str:
        q = spec.quantization
        if q.format == "none" and q.kv_cache == "none":
            return spec.model
        sid = f"{role}-quant"
        out = b.path(sid)
        cal = q.calibration
        argv = C.trtspec_quantize_argv(model=spec.model, fmt=q.format, kv_cache=q.kv_cache,
                                       calib_file=None if cal.dataset == "builtin" else cal.dataset,
                                       calib_split=cal.split, calib_column=cal.column,
                                       calib_size=cal.size, calib_seq_len=cal.seq_len, output_dir=out)
        kv = "" if q.kv_cache == "none" else f", KV {q.kv_cache}"
        b.add(Stage(sid, f"quantize {role} ({q.format}{kv}) → unified HF checkpoint", role, out, (tuple(argv),),
                    inputs=(spec.model,) + ((cal.dataset,) if cal.dataset.startswith("/") else ()),
                    expect=("config.json",)))
        quantized[role] = out
        return out

    model = export("target", r.target)
    spec_model = None
    if r.draft_spec is not None:
        spec_model = export("draft" if s.method == "draft_target" else "head", r.draft_spec)
    # runtime.trtllm.llm_api_options: the recipe's passthrough, into both deployments
    spec_opts = merge_llm_api_options(llmapi.llm_api_options(r, model=model, speculative_model=spec_model),
                                      t.llm_api_options)
    base_opts = merge_llm_api_options(llmapi.llm_api_baseline(r, model=model), t.llm_api_options)
    yaml_path = str(b.out / LLMAPI_DIR / EXTRA_OPTIONS)
    base_yaml_path = str(b.out / LLMAPI_DIR / EXTRA_OPTIONS_BASELINE)
    files = {
        yaml_path: llmapi.to_yaml(llmapi.extra_options(spec_opts)),
        base_yaml_path: llmapi.to_yaml(llmapi.extra_options(base_opts)),
    }
    serve = C.serve_argv(model, extra_options=yaml_path, tokenizer=r.target.tokenizer,
                         host=r.serving.host, port=SERVE_PORT)
    b.notes.append(f"{EXTRA_OPTIONS_BASELINE} gets draft_kv_cache_free_gpu_mem_fraction "
                   f"({t.draft_kv_cache_free_gpu_mem_fraction}): Triton serves the baseline beside the speculative "
                   "model on the same GPUs")
    return {"quantized": quantized, "llm_api": spec_opts, "llm_api_baseline": base_opts, "files": files,
            "llm_api_yaml": yaml_path, "llm_api_baseline_yaml": base_yaml_path, "serve_command": serve}


def _decoding(recipe: Recipe) -> dict[str, Any]:
    """Triton tensorrtllm backend decoding settings of the target model (engine flow)."""
    s = recipe.speculation
    d: dict[str, Any] = {"decoding_mode": "top_k_top_p"}
    if isinstance(s, Eagle):
        d.update(decoding_mode="eagle", eagle_choices=s.eagle_choices, eagle_use_dynamic_tree=s.use_dynamic_tree,
                 eagle_dynamic_tree_max_top_k=s.dynamic_tree_max_top_k if s.use_dynamic_tree else None,
                 eagle_posterior_threshold=s.posterior_threshold)
    elif isinstance(s, Medusa):
        d.update(decoding_mode="medusa", medusa_choices=s.medusa_choices)
    elif isinstance(s, Lookahead):
        d.update(decoding_mode="lookahead", lookahead=(s.window_size, s.ngram_size, s.verification_set_size))
    elif isinstance(s, NGram):
        d.update(ngram_max_matching_size=s.max_matching_ngram_size)
    return d


def make_plan(recipe: Recipe, out_dir: str | pathlib.Path, *, family: str | None = None) -> Plan:
    """The complete build plan for a TRT-LLM recipe. Pure.

    ``out_dir`` should be absolute (the argv name it). ``family`` is the target's model family
    when ``runtime.trtllm.model_family`` is ``auto`` (see :func:`trtspec.trtllm.build.detect_family`);
    it is only needed for unquantized engine-flow checkpoints.
    """
    backend = recipe.runtime.backend
    if backend not in ("trtllm-engine", "trtllm-pytorch"):
        raise ConfigError("runtime.backend", backend,
                          "trtspec build makes TensorRT-LLM engines or LLM-API configs; the torch runtime loads "
                          "the checkpoints as they are", fix="set runtime.backend: trtllm-engine or trtllm-pytorch, "
                          "or package the recipe directly (trtspec package)")
    out = pathlib.Path(out_dir)
    b = _Builder(recipe, out, family)
    lim, t, s = recipe.limits, recipe.runtime.trtllm, recipe.speculation
    world = lim.world_size
    draft_tp = (lim.draft_tensor_parallel_size or 1) if s.method == "draft_target" else None
    gpu_ids, draft_ids = _gpu_ids(recipe, world, draft_tp)

    hf = {"target": recipe.target.model}
    if recipe.draft_spec is not None:
        hf["draft" if s.method == "draft_target" else "head"] = recipe.draft_spec.model
    common: dict[str, Any] = dict(
        recipe_name=recipe.name, recipe_sha256=hash_json(recipe_to_dict(recipe)), runtime=backend,
        method=s.method, trtllm_version=t.version, container_image=t.container_image, out_dir=str(out),
        tokenizer_dir=recipe.target.tokenizer or recipe.target.model, hf_model_dirs=hf,
        max_draft_len=recipe.max_draft_len, tp_size=lim.tensor_parallel_size, pp_size=lim.pipeline_parallel_size,
        world_size=world, draft_tp_size=draft_tp, gpu_device_ids=gpu_ids, draft_gpu_device_ids=draft_ids,
        kv_cache_free_gpu_mem_fraction=t.kv_cache_free_gpu_mem_fraction,
        draft_kv_cache_free_gpu_mem_fraction=t.draft_kv_cache_free_gpu_mem_fraction,
        enable_kv_cache_reuse=t.enable_kv_cache_reuse, max_batch_size=lim.max_batch_size,
        max_input_len=lim.max_input_len, max_seq_len=lim.max_seq_len, max_num_tokens=t.max_num_tokens,
    )
    b.notes += recipe_warnings(t.llm_api_options, t.build_args, recipe.serving.tritonserver_args, backend=backend)
    if recipe.serving.tritonserver_args:
        b.notes.append("serving.tritonserver_args go to tritonserver when the repository is served: "
                       + " ".join(recipe.serving.tritonserver_args))
    files: dict[str, str] = {}
    if backend == "trtllm-engine":
        e = _engine_flow(b)
        handoff = TrtllmBuild(
            **common, **_decoding(recipe), checkpoint_dirs=e["checkpoints"], engines=e["engines"],
            speculative_decoding_mode=e["speculative_decoding_mode"],
            use_draft_logits=bool(getattr(s, "use_draft_logits", False)),
        )
        if s.method in ("draft_target", "ngram") and t.enable_kv_cache_reuse is False:
            raise ConfigError("runtime.trtllm.enable_kv_cache_reuse", False,
                              f"{s.method} on the engine flow resubmits the context every iteration and relies on "
                              "KV-cache reuse", fix="set enable_kv_cache_reuse: true")
        if s.method == "ngram":
            b.notes.append("NGram on the engine flow is V1: the target engine verifies draft tokens proposed outside "
                           "it (client or BLS), as draft_tokens_external")
    else:
        p = _pytorch_flow(b)
        files = p["files"]
        handoff = TrtllmBuild(
            **common, quantized_model_dirs=p["quantized"], llm_api=p["llm_api"],
            llm_api_baseline=p["llm_api_baseline"], llm_api_yaml=p["llm_api_yaml"],
            llm_api_baseline_yaml=p["llm_api_baseline_yaml"], serve_command=p["serve_command"],
        )
    return Plan(
        recipe_name=recipe.name, runtime=backend, method=s.method, trtllm_version=t.version, out_dir=str(out),
        stages=tuple(b.stages), files=files, handoff=handoff, notes=tuple(b.notes),
    )


def describe(plan: Plan) -> str:
    """The plan as text: every stage with its commands (copy-pastable), every folder and file."""
    import shlex

    h = plan.handoff
    lines = [
        f"plan: {plan.recipe_name}  runtime {plan.runtime}  method {plan.method}  TensorRT-LLM {plan.trtllm_version}",
        f"output: {plan.out_dir}",
        f"container: {h.container_image}",
        "",
    ]
    n = len(plan.stages)
    for i, s in enumerate(plan.stages, 1):
        lines.append(f"stage {i}/{n}  {s.id}: {s.title}")
        lines.append(f"  writes {s.output}/  ({', '.join(s.expect)})")
        if s.inputs:
            lines.append(f"  reads  {', '.join(s.inputs)}")
        for argv in s.commands:
            lines.append(f"  $ {shlex.join(argv)}")
        lines.append("")
    if not plan.stages:
        lines += ["no stages: nothing to quantize or build", ""]
    lines.append("files:")
    for path, text in plan.files.items():
        lines.append(f"  {path}")
        lines += [f"    | {ln}" for ln in text.rstrip("\n").splitlines()]
    lines.append(f"  {plan.out_dir}/logs/<stage>.log  (stdout + stderr of each stage)")
    lines.append(f"  {plan.out_dir}/trtspec.json  (hand-off manifest, kind trtllm-build, written last)")
    lines.append("")
    lines.append("hand-off to packaging:")
    for role, path in h.engines.items():
        lines.append(f"  engine {role}: {path}")
    for role, path in h.quantized_model_dirs.items():
        lines.append(f"  model {role}: {path} (quantized export)")
    lines.append(f"  tokenizer: {h.tokenizer_dir}")
    if h.runtime == "trtllm-engine":
        spec = f"  max_draft_len {h.max_draft_len}, Triton decoding_mode {h.decoding_mode}"
        if h.speculative_decoding_mode:
            spec += f", trtllm-build --speculative_decoding_mode {h.speculative_decoding_mode}"
    else:
        sc = (h.llm_api or {}).get("speculative_config")
        spec = f"  max_draft_len {h.max_draft_len}, speculative_config.decoding_type {sc['decoding_type'] if sc else None}"
    lines.append(spec)
    if h.lookahead:
        lines.append(f"  lookahead (W, N, G) = {tuple(h.lookahead)}")
    lines.append(f"  parallel: tp {h.tp_size} x pp {h.pp_size} = {h.world_size} GPU(s) {h.gpu_device_ids}"
                 + (f"; draft tp {h.draft_tp_size} on {h.draft_gpu_device_ids}" if h.draft_tp_size else ""))
    lines.append(f"  kv cache: {h.kv_cache_free_gpu_mem_fraction} (target), {h.draft_kv_cache_free_gpu_mem_fraction} "
                 f"({'draft' if h.draft_tp_size else 'baseline'}), reuse {h.enable_kv_cache_reuse}")
    lines.append(f"  limits: batch {h.max_batch_size}, input {h.max_input_len}, sequence {h.max_seq_len}"
                 + (f", tokens {h.max_num_tokens}" if h.max_num_tokens else ""))
    if h.serve_command:
        lines += ["", "serve (OpenAI-compatible, for a quick check):", f"  $ {shlex.join(h.serve_command)}"]
    if plan.notes:
        lines += ["", "notes:"] + [f"  - {note}" for note in plan.notes]
    return "\n".join(lines) + "\n"
