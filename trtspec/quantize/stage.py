"""The quantize stage: ModelOpt PTQ of one model (target, draft or EAGLE-3 head), one export, a
quality report.

``quantize_model`` is what ``trtspec quantize`` and the pipeline call. Order of work:

  1. validate everything cheap first (folder, architecture, format, refused combinations,
     calibration file, pair, output folder) so a bad input fails in milliseconds;
  2. calibrate: the HF model (or the EAGLE-3 head module, fed by its target) under ModelOpt
     (``mtq.quantize`` with the format's config);
  3. into a temporary folder beside OUT: the export (hf | trtllm | torch), ``quality.json``,
     ``trtspec.json``; renamed to OUT only when all of it succeeded (``atomic_dir``).

Exports (reference/modelopt-cpu.md §2, reference/trtllm-triton.md §1.5):

* ``hf``: the unified HF checkpoint (``export_hf_checkpoint``: ``config.json`` with
  ``quantization_config``, ``hf_quant_config.json``, safetensors) for TRT-LLM's PyTorch flow
  (``LLM(model=...)``, ``speculative_model``) and the EAGLE convert path;
* ``trtllm``: the legacy TRT-LLM checkpoint (``export_tensorrt_llm_checkpoint``, TP=PP=1:
  ``config.json`` + ``rank0.safetensors``) for ``trtllm-build`` (engine flow);
* ``torch``: ModelOpt's restorable state (``modelopt_state.pth``) + config + tokenizer, which the
  torch runtime loads as a fake-quantized model (:func:`trtspec.quantize.runtime.load_quantized`).

Every export gets the tokenizer files next to it, so each folder is self-contained.
"""

from __future__ import annotations

import copy
import json
import os
import pathlib
import shutil
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from trtspec.config import Calibration, ModelSpec, Quantization
from trtspec.errors import ConfigError, ModelError, StageError
from trtspec.manifest import atomic_dir, hash_folder, hash_json, maybe_manifest, write_manifest
from trtspec.quantize import eagle3_head
from trtspec.quantize.calib import calibration_windows, heldout_prompts, heldout_windows
from trtspec.quantize.formats import (
    EXPORTS,
    FORMATS,
    check_combination,
    check_format,
    check_kv_cache,
    check_lm_head,
    export_for_runtime,
    modelopt_config,
)
from trtspec.quantize.quality import QualitySettings, acceptance, compare_logits
from trtspec.quantize.runtime import causal_lm_from_quantized, prepare_modelopt, quiet, save_state
from trtspec.speculative.model import SUPPORTED_ARCHS, ModelArgs, load_causal_lm, read_hf_config
from trtspec import calib_sources as sources

EAGLE3_ARCH = "LlamaForCausalLMEagle3"  # trtspec.speculative.eagle3.ARCHITECTURE (not imported: cheap validation)

Progress = Callable[[str, int, int, dict], None]  # (phase, step, total, info)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# TRT-LLM checkpoint decoder families (modelopt.torch.export decoder_type)
DECODER_TYPES = {"LlamaForCausalLM": "llama", "MistralForCausalLM": "llama", "Qwen2ForCausalLM": "qwen"}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json",
                   "merges.txt", "tokenizer.model", "added_tokens.json", "chat_template.jinja")
CALIB_BATCH = 4


@dataclass
class QuantizeResult:
    out_dir: pathlib.Path
    export: str
    format: str
    kv_cache: str
    role: str
    manifest: dict
    quality: dict | None
    warnings: list[str] = field(default_factory=list)
    timings: dict = field(default_factory=dict)
    log: list[str] = field(default_factory=list)  # ModelOpt's own output (stdout, warnings)
    cached: bool = False  # reused an up-to-date export (``reuse=True``)


# --------------------------------------------------------------------------------------------
# validation (cheap, before any ModelOpt import)


def _check_model_dir(model_dir: pathlib.Path, what: str = "model", *, allow_head: bool = False) -> dict:
    if not model_dir.is_dir():
        raise ModelError(f"{what} folder not found: {model_dir}",
                         fix="pass an HF checkpoint folder (config.json + *.safetensors + tokenizer), e.g. models/tiny-target")
    cfg = read_hf_config(model_dir)
    archs = cfg.get("architectures") or []
    arch = archs[0] if archs else None
    if arch not in SUPPORTED_ARCHS and not (allow_head and arch == EAGLE3_ARCH):
        handled = sorted(SUPPORTED_ARCHS) + ([EAGLE3_ARCH] if allow_head else [])
        raise ModelError(
            f"{model_dir / 'config.json'}: architectures={archs or cfg.get('model_type')!r} cannot be quantized by "
            "trtspec: its quality report and torch export run the model in trtspec's runtime, which handles "
            f"{', '.join(handled)}",
            fix="use a Llama/Mistral/Qwen2 checkpoint (or ModelOpt's own hf_ptq.py for other architectures)",
        )
    if not list(model_dir.glob("*.safetensors")):
        raise ModelError(f"{model_dir}: no *.safetensors weights", fix="save the model with safetensors (save_pretrained)")
    return cfg


def _resolve_role(role: str, model_dir: pathlib.Path, pair: pathlib.Path | None) -> str:
    if role != "auto":
        if role not in ("target", "draft"):
            raise ConfigError("role", role, "unknown role", fix="use target, draft or auto")
        return role
    m = maybe_manifest(model_dir) or {}
    if m.get("role") in ("target", "draft"):
        return m["role"]
    if pair is not None:  # the smaller model of a pair is the draft
        size = lambda d: sum(f.stat().st_size for f in d.glob("*.safetensors"))  # noqa: E731
        return "draft" if size(model_dir) < size(pair) else "target"
    return "target"


def _check_out_dir(out: pathlib.Path, model_dir: pathlib.Path, pair: pathlib.Path | None) -> None:
    for other, name in ((model_dir, "--model"), (pair, "--pair")):
        if other is not None and out.resolve() == other.resolve():
            raise ConfigError("out_dir", str(out), f"the output folder is the {name} folder",
                              fix="write the export to a new folder, e.g. -o out/tiny-target-fp8")
    if out.exists():
        m = maybe_manifest(out)
        if not out.is_dir() or (any(out.iterdir()) and (m is None or m.get("kind") != "quantized")):
            raise ConfigError("out_dir", str(out),
                              "exists and is not a trtspec quantized export: refusing to replace it",
                              fix="choose a new folder, or remove this one yourself")


def _resolve_dtype(dtype: str, cfg: dict) -> str:
    if dtype == "auto":
        d = cfg.get("dtype") or cfg.get("torch_dtype") or "float32"
        return d if d in DTYPES else "float32"
    if dtype not in DTYPES:
        raise ConfigError("dtype", dtype, "unknown dtype", fix=f"use auto or one of {', '.join(DTYPES)}")
    return dtype


def _check_calibration(cal: Calibration) -> None:
    """An unknown source, a missing file, split or column, bad JSONL or an uncached dataset
    offline fail here, before any model is loaded."""

    src = sources.resolve(cal.dataset, cal.split, cal.column)
    if src.kind != "builtin" and next(sources.iter_texts(src), None) is None:
        raise ConfigError(sources.FIELD, cal.dataset, "the calibration source has no text",
                          fix="name a source with text rows")


# --------------------------------------------------------------------------------------------
# calibration, export


def _calibrate(hf_model, cfg: dict, ids: torch.Tensor, progress: Progress | None):
    import modelopt.torch.quantization as mtq

    n = ids.shape[0]

    def forward_loop(model) -> None:
        # AWQ calls this several times (cache inputs, then search); each pass reports 1..n
        for i in range(0, n, CALIB_BATCH):
            model(input_ids=ids[i : i + CALIB_BATCH])
            if progress:
                progress("calibrate", min(i + CALIB_BATCH, n), n, {})

    with torch.inference_mode(False), torch.no_grad():
        return mtq.quantize(hf_model, cfg, forward_loop)


def _copy_tokenizer(src: pathlib.Path, dest: pathlib.Path) -> list[str]:
    copied = []
    for name in TOKENIZER_FILES:
        if (src / name).is_file() and not (dest / name).exists():
            shutil.copy2(src / name, dest / name)
            copied.append(name)
    return copied


def _export(qmodel, export: str, tmp: pathlib.Path, *, model_dir: pathlib.Path, arch: str, dtype: str) -> dict:
    """Write ``export`` into ``tmp``; returns what the manifest records about it."""
    info: dict = {}
    if export == "hf":
        from modelopt.torch.export import export_hf_checkpoint

        # export real-quantizes the weights in place: always export a copy
        with torch.inference_mode():
            export_hf_checkpoint(copy.deepcopy(qmodel), export_dir=str(tmp))
        hq = json.loads((tmp / "hf_quant_config.json").read_text())
        info["quant_algo"] = hq["quantization"].get("quant_algo")
        info["kv_cache_quant_algo"] = hq["quantization"].get("kv_cache_quant_algo")
        info["checkpoint_dtype"] = dtype
        info["consumers"] = ["trtllm-pytorch (LLM(model=...), speculative_model)", "EAGLE convert path", "vLLM/SGLang quantization=modelopt"]
    elif export == "trtllm":
        from modelopt.torch.export import export_tensorrt_llm_checkpoint

        # TRT-LLM builds fp16/bf16 engines; an fp32 checkpoint is exported as fp16
        ckpt_dtype = dtype if dtype in ("float16", "bfloat16") else "float16"
        with torch.inference_mode():
            export_tensorrt_llm_checkpoint(
                copy.deepcopy(qmodel), decoder_type=DECODER_TYPES[arch], dtype=DTYPES[ckpt_dtype],
                export_dir=str(tmp), inference_tensor_parallel=1, inference_pipeline_parallel=1,
            )
        cfg = json.loads((tmp / "config.json").read_text())
        info["quant_algo"] = cfg["quantization"].get("quant_algo")
        info["kv_cache_quant_algo"] = cfg["quantization"].get("kv_cache_quant_algo")
        info["checkpoint_dtype"] = ckpt_dtype
        info["tensor_parallel"] = info["pipeline_parallel"] = 1
        info["consumers"] = ["trtllm-build --checkpoint_dir (TRT-LLM <= 1.2 engine flow)"]
    else:
        save_state(qmodel, tmp)
        for name in ("config.json", "generation_config.json"):
            if (model_dir / name).is_file():
                shutil.copy2(model_dir / name, tmp / name)
        info["checkpoint_dtype"] = dtype
        info["consumers"] = ["trtspec torch runtime (fake-quant; trtspec.quantize.runtime.load_quantized)"]
    return info


# --------------------------------------------------------------------------------------------
# the stage


def make_quantization(
    format: str, kv_cache: str = "none", *, calib: str = "builtin", calib_size: int | None = None,
    calib_seq_len: int | None = None, calib_split: str | None = None, calib_column: str | None = None,
    force: bool = False, lm_head: str = "none",
) -> Quantization:
    """A validated :class:`trtspec.config.Quantization` from plain values (CLI, scripts);
    problems raise ``ConfigError`` naming the recipe field. Sizes left ``None`` take the
    source's default (ModelOpt's 512 x 512; 64 x 128 for builtin)."""
    from pydantic import ValidationError

    check_format(format)
    check_kv_cache(kv_cache)
    check_lm_head(lm_head)
    given = {"dataset": calib, "size": calib_size, "seq_len": calib_seq_len, "split": calib_split,
             "column": calib_column}
    try:
        return Quantization(format=format, kv_cache=kv_cache, force=force, lm_head=lm_head,
                            calibration=Calibration(**{k: v for k, v in given.items() if v is not None}))
    except ValidationError as e:
        err = e.errors(include_url=False)[0]
        name = {"size": "calib_size", "seq_len": "calib_seq_len", "dataset": "calib", "split": "calib_split",
                "column": "calib_column"}.get(str(err["loc"][-1]) if err["loc"] else "dataset", "calib")
        if not err["loc"]:  # a model-level check (the dataset value)
            raise ConfigError("quantization.calibration.dataset", calib, err["msg"].removeprefix("Value error, "),
                              fix="check --calib") from None
        raise ConfigError(f"quantization.calibration.{err['loc'][-1]}", err.get("input"),
                          err["msg"].removeprefix("Value error, "), fix=f"check --{name.replace('_', '-')}") from None


def quantize_model(
    model_dir: str | os.PathLike,
    quantization: Quantization,
    export: str,
    out_dir: str | os.PathLike,
    *,
    role: str = "auto",
    pair: str | os.PathLike | None = None,
    gpu_arch: str = "any",
    dtype: str = "auto",
    device: str = "auto",
    tokenizer: str | os.PathLike | None = None,
    quality: QualitySettings | None = QualitySettings(),
    threads: int | None = None,
    progress: Progress | None = None,
    reuse: bool = False,
) -> QuantizeResult:
    """Quantize ``model_dir`` with ``quantization`` and write ``export`` to ``out_dir``.

    ``model_dir``: a target or draft (Llama/Mistral/Qwen2) or an EAGLE-3 head
    (``LlamaForCausalLMEagle3``; then ``pair`` must be its target: the head is calibrated on the
    target's features). ``role``: target | draft | auto (an EAGLE-3 head is always
    ``eagle3_head``; else the folder's manifest role, else the larger of the model and ``pair``
    is the target). ``pair``: the counterpart for the acceptance measurement (the draft when
    quantizing the target and vice versa; the target for a head). ``gpu_arch``: the deployment
    GPU family, for the refusals (e.g. nvfp4 on hopper). ``quality=None`` skips the report.
    ``reuse``: return ``out_dir`` as it is when it was made by the same request from the same
    inputs (the manifest's ``key``: source and pair hashes, format, export, calibration, ...).
    """
    t_start = time.perf_counter()
    model_dir = pathlib.Path(model_dir)
    out = pathlib.Path(out_dir)
    pair_dir = pathlib.Path(pair) if pair is not None else None
    fmt, kv = quantization.format, quantization.kv_cache
    if fmt == "none":
        raise ConfigError("quantization.format", fmt, "nothing to quantize",
                          fix=f"use one of: {', '.join(FORMATS)}")
    check_format(fmt)
    if export not in EXPORTS:
        raise ConfigError("export", export, "unknown export", fix=f"use one of: {', '.join(EXPORTS)}")
    cfg = _check_model_dir(model_dir, allow_head=True)
    arch = cfg["architectures"][0]
    is_head = arch == EAGLE3_ARCH
    if is_head and pair_dir is None:
        raise ConfigError("pair", None, "an EAGLE-3 head is calibrated and measured on its target's hidden states",
                          fix="pass the head's target: --pair TARGET_DIR")
    if pair_dir is not None:
        pair_cfg = _check_model_dir(pair_dir, "--pair model")
        if pair_cfg.get("vocab_size") != cfg.get("vocab_size"):
            raise ConfigError("pair", str(pair_dir),
                              f"vocab_size {pair_cfg.get('vocab_size')} differs from the model's {cfg.get('vocab_size')}: "
                              "draft and target must share a tokenizer", fix="pass the model's draft/target counterpart")
    if is_head:
        if role not in ("auto", "eagle3_head"):
            raise ConfigError("role", role, f"{model_dir} is an EAGLE-3 head", fix="use --role auto")
        role = "eagle3_head"
    else:
        role = _resolve_role(role, model_dir, pair_dir)
    lm_head = quantization.lm_head
    warnings = check_combination(fmt, kv, role=role, export=export, gpu_arch=gpu_arch, force=quantization.force,
                                 lm_head=lm_head)
    _check_calibration(quantization.calibration)
    _check_out_dir(out, model_dir, pair_dir)
    dtype = _resolve_dtype(dtype, pair_cfg if is_head else cfg)
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device", device, "CUDA requested but torch sees no GPU", fix="use --device cpu")
    # what determines the artifact: an unchanged request on unchanged inputs may reuse it
    request = {
        "source_sha256": hash_folder(model_dir),
        "pair_sha256": hash_folder(pair_dir) if pair_dir is not None else None,
        "format": fmt, "kv_cache": kv, "export": export, "role": role, "dtype": dtype, "device": dev.type,
        "calibration": quantization.calibration.model_dump(), "force": quantization.force,
        "quality": quality.to_dict() if quality is not None else None,
    }
    if lm_head != "none":  # only when set: artifacts made before the field existed keep their key
        request["lm_head"] = lm_head
    key = hash_json(request)[:16]
    if reuse:
        old = maybe_manifest(out)
        if old and old.get("kind") == "quantized" and old.get("key") == key:
            report = json.loads((out / "quality.json").read_text()) if (out / "quality.json").is_file() else None
            return QuantizeResult(out, export, fmt, kv, role, old, report, old.get("warnings", []),
                                  old.get("timings", {}), cached=True)

    prev_threads = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    log: list[str] = []
    timings: dict[str, float] = {}
    tok_dir = pathlib.Path(tokenizer) if tokenizer else (pair_dir if is_head else model_dir)
    work = (_HeadWork if is_head else _ModelWork)(model_dir, pair_dir, tok_dir, DTYPES[dtype], dev, log)
    work.cal = quantization.calibration  # the quality report evaluates on the same source's held-out text
    try:
        def phase(name: str, t0: float) -> None:
            timings[name] = round(time.perf_counter() - t0, 2)

        t0 = time.perf_counter()
        if progress:
            progress("load", 0, 1, {"model": str(model_dir)})
        prepare_modelopt()
        with quiet(log):
            import modelopt

            work.load()
            cal = quantization.calibration
            calib = calibration_windows(cal.dataset, work.tok, cal.size, cal.seq_len, split=cal.split,
                                        column=cal.column)
        if progress:
            progress("load", 1, 1, {})
        phase("load_s", t0)

        t0 = time.perf_counter()
        with quiet(log):
            qcfg = modelopt_config(fmt, kv, nvfp4_cpu=dev.type == "cpu", lm_head=lm_head)
            work.calibrate(qcfg, calib.ids.to(dev), progress)
        phase("calibrate_s", t0)
        if calib.ids.shape[0] < cal.size:
            warnings.append(f"calibration text gave {calib.ids.shape[0]} windows of {cal.seq_len} tokens, "
                            f"fewer than calib_size={cal.size}")

        with atomic_dir(out) as tmp:
            t0 = time.perf_counter()
            if progress:
                progress("export", 0, 1, {"export": export})
            with quiet(log):
                info = work.export(export, tmp, arch=arch, dtype=dtype)
            info["tokenizer_files"] = _copy_tokenizer(tok_dir, tmp)
            if progress:
                progress("export", 1, 1, {})
            phase("export_s", t0)

            report = None
            if quality is not None:
                t0 = time.perf_counter()
                report = work.quality(role, quality, progress)
                report.update({"model": str(model_dir.resolve()), "format": fmt, "kv_cache": kv, "export": export,
                               "role": role, "dtype": dtype, "calibration": calib.description})
                (tmp / "quality.json").write_text(json.dumps(report, indent=2) + "\n")
                phase("quality_s", t0)

            timings["total_s"] = round(time.perf_counter() - t_start, 2)
            manifest = write_manifest(
                tmp, "quantized",
                export=export, format=fmt, kv_cache=kv, lm_head=lm_head, role=role, key=key,
                source={"path": str(model_dir.resolve()), "sha256": request["source_sha256"], "architecture": arch},
                modelopt_version=modelopt.__version__,
                modelopt_config=qcfg,
                calibration=calib.description,
                dtype=dtype, device=str(dev), gpu_arch=gpu_arch, forced=quantization.force,
                **info,
                quality=_summary(report),
                warnings=warnings,
                timings=timings,
            )
        return QuantizeResult(out, export, fmt, kv, role, manifest, report, warnings, timings, log)
    except (ModelError, ConfigError, StageError):
        raise
    except Exception as e:  # noqa: BLE001 - ModelOpt/transformers failures become one stage error
        raise StageError(
            f"quantize {model_dir} → {fmt} ({export}) failed: {type(e).__name__}: {e}",
            fix="re-run with --debug for the traceback; no output folder was written",
        ) from e
    finally:
        torch.set_num_threads(prev_threads)


def quantize_spec(
    spec: ModelSpec,
    out_dir: str | os.PathLike,
    *,
    backend: str,
    role: str = "auto",
    pair: str | os.PathLike | None = None,
    gpu_arch: str = "any",
    **kwargs,
) -> QuantizeResult:
    """The pipeline's quantize stage for one recipe model (``recipe.target``, the draft or the
    head): the export its ``runtime.backend`` consumes, reused when already up to date."""
    kwargs.setdefault("reuse", True)
    return quantize_model(spec.model, spec.quantization, export_for_runtime(backend), out_dir, role=role, pair=pair,
                          gpu_arch=gpu_arch, tokenizer=spec.tokenizer, **kwargs)


def _source(cal: Calibration) -> dict:
    return {"dataset": cal.dataset, "split": cal.split, "column": cal.column}


def _prompts(tok, s: QualitySettings, cal: Calibration) -> tuple[list[list[int]], str]:
    texts, what = heldout_prompts(s.prompts, **_source(cal))
    return [tok(p, add_special_tokens=False)["input_ids"][: s.prompt_tokens] for p in texts], what


class _ModelWork:
    """A target or draft: calibrated as the HF model (ModelOpt's exporters need it), measured
    as our CausalLM with the same quantizers."""

    def __init__(self, model_dir, pair_dir, tok_dir, dtype, dev, log):
        self.model_dir, self.pair_dir, self.tok_dir = model_dir, pair_dir, tok_dir
        self.dtype, self.dev, self.log = dtype, dev, log

    def load(self) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.tok = AutoTokenizer.from_pretrained(str(self.tok_dir))
        self.hf = AutoModelForCausalLM.from_pretrained(str(self.model_dir), dtype=self.dtype).to(self.dev).eval()

    def calibrate(self, qcfg: dict, ids: torch.Tensor, progress) -> None:
        self.q = _calibrate(self.hf, qcfg, ids, progress)

    def export(self, export: str, tmp: pathlib.Path, *, arch: str, dtype: str) -> dict:
        return _export(self.q, export, tmp, model_dir=self.model_dir, arch=arch, dtype=dtype)

    def quality(self, role: str, s: QualitySettings, progress) -> dict:
        cfg = read_hf_config(self.model_dir)
        base = load_causal_lm(self.model_dir, dtype=self.dtype, device=self.dev)
        quant = causal_lm_from_quantized(self.q, ModelArgs.from_hf_config(cfg)).to(self.dev)
        with quiet(self.log):
            held = heldout_windows(self.tok, s.eval_windows, s.eval_seq_len, **_source(self.cal))
        report: dict = {"heldout": held.description, "settings": s.to_dict()}
        report.update(compare_logits(base, quant, held.ids.to(self.dev), batch_size=s.batch_size, progress=progress))
        # our runtime's fake-quant against ModelOpt's own (the HF model it calibrated), same input
        with torch.inference_mode():
            x = held.ids[:1].to(self.dev)
            ref = self.q(input_ids=x).logits.float()
            ours = quant(x, None).float()
        report["runtime_vs_modelopt_max_abs_diff"] = float((ref - ours).abs().max())
        if self.pair_dir is not None:
            pair = load_causal_lm(self.pair_dir, dtype=self.dtype, device=self.dev)
            with quiet(self.log):
                prompts, what = _prompts(self.tok, s, self.cal)
            report["acceptance"] = {"pair": str(self.pair_dir.resolve()), "prompts": what,
                                    **acceptance(quantized_role=role, base=base, quant=quant, pair=pair,
                                                 prompts=prompts, settings=s, windows=held.ids.to(self.dev),
                                                 progress=progress)}
        return report


class _HeadWork:
    """An EAGLE-3 head: quantized as trtspec's head module, fed by the unquantized target."""

    def __init__(self, model_dir, pair_dir, tok_dir, dtype, dev, log):
        self.model_dir, self.pair_dir, self.tok_dir = model_dir, pair_dir, tok_dir
        self.dtype, self.dev, self.log = dtype, dev, log

    def load(self) -> None:
        from transformers import AutoTokenizer

        self.tok = AutoTokenizer.from_pretrained(str(self.tok_dir))
        self.target = load_causal_lm(self.pair_dir, dtype=self.dtype, device=self.dev)
        self.head = eagle3_head.load_head(self.model_dir, self.target, self.dtype, self.dev)

    def calibrate(self, qcfg: dict, ids: torch.Tensor, progress) -> None:
        self.q = eagle3_head.calibrate(self.head, self.target, qcfg, ids, CALIB_BATCH, progress)

    def export(self, export: str, tmp: pathlib.Path, *, arch: str, dtype: str) -> dict:
        fn = {"hf": eagle3_head.export_hf, "torch": eagle3_head.export_torch}[export]
        info = fn(self.q, tmp, self.model_dir)
        src = maybe_manifest(self.model_dir) or {}
        info.update({"checkpoint_dtype": dtype, "feature_norm": src.get("feature_norm", "standard"),
                     "target": {"path": str(self.pair_dir.resolve()), "sha256": hash_folder(self.pair_dir)}})
        return info

    def quality(self, role: str, s: QualitySettings, progress) -> dict:
        base = eagle3_head.load_head(self.model_dir, self.target, self.dtype, self.dev)
        quant = eagle3_head.head_from_quantized(self.q, self.target, self.model_dir)
        with quiet(self.log):
            held = heldout_windows(self.tok, s.eval_windows, s.eval_seq_len, **_source(self.cal))
            prompts, what = _prompts(self.tok, s, self.cal)
        report: dict = {"heldout": held.description, "settings": s.to_dict(),
                        "metrics_of": "the head's step-0 draft distribution, teacher-forced on target features"}
        ids = held.ids.to(self.dev)
        report.update(eagle3_head.compare_head_logits(self.target, base, quant, ids, batch_size=s.batch_size))
        with torch.inference_mode():  # the restored, folded head against the ModelOpt-quantized one
            x = ids[:1]
            ref = eagle3_head.teacher_forced_logits(self.target, self.q, x).float()
            ours = eagle3_head.teacher_forced_logits(self.target, quant, x).float()
        report["runtime_vs_modelopt_max_abs_diff"] = float((ref - ours).abs().max())
        if progress:
            progress("acceptance", 0, 1, {})
        report["acceptance"] = {"pair": str(self.pair_dir.resolve()), "prompts": what,
                                **eagle3_head.head_acceptance(self.target, base, quant, prompts, s)}
        if progress:
            progress("acceptance", 1, 1, {})
        return report


def _summary(report: dict | None) -> dict | None:
    if report is None:
        return None
    keys = ("top1_agreement", "kl_divergence", "perplexity_change_pct")
    out = {k: round(report[k], 6) for k in keys}
    acc = report.get("acceptance")
    if acc:
        out["acceptance_before"] = acc["before"]["acceptance_rate"]
        out["acceptance_after"] = acc["after"]["acceptance_rate"]
    return out
