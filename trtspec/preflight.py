"""``trtspec check``: the checks that must fail fast, before any expensive work.

The schema (``trtspec.config``) already rejects values that are wrong on their own (bounds, the
lookahead formula, EAGLE tree shape, beam search with speculation). This module adds what needs
the models on disk or upstream knowledge: tokenizer/vocabulary agreement between draft and
target, special tokens, head/target shape agreement, position limits, and quantization
combinations known to fail upstream (reference/trtllm-triton.md §1.6).
"""

from __future__ import annotations

import json
import pathlib
from dataclasses import asdict, dataclass, field
from typing import Literal

from trtspec.config import Eagle, Eagle3, Medusa, Recipe, quantized_kernels_for
from trtspec.speculative.kernels import variant
from trtspec.versions import engine_flow_supported
from trtspec.hub import check_lines, is_hub_id
from trtspec.model_makers import elsewhere_fix, missing_model_fix
from trtspec.recipe_checks import calibration_lines, passthrough_lines, trtllm_name_lines

Status = Literal["ok", "warn", "fail", "skip", "info"]


@dataclass
class Check:
    name: str
    status: Status
    detail: str
    fix: str | None = None


@dataclass
class CheckReport:
    recipe: str
    checks: list[Check] = field(default_factory=list)
    plan: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not any(c.status == "fail" for c in self.checks)

    def add(self, name: str, status: Status, detail: str, fix: str | None = None) -> None:
        self.checks.append(Check(name, status, detail, fix))

    def to_dict(self) -> dict:
        return {"recipe": self.recipe, "ok": self.ok, "checks": [asdict(c) for c in self.checks], "plan": self.plan}


# --------------------------------------------------------------------------------------------
# tokenizer / vocabulary


def _local(recipe: Recipe) -> bool:
    """Models must be on this machine for the torch runtime; TRT-LLM recipes build elsewhere."""
    return recipe.runtime.backend == "torch"


def _read_json(p: pathlib.Path) -> dict | None:
    try:
        return json.loads(p.read_text())
    except (OSError, json.JSONDecodeError):
        return None


@dataclass
class _ModelInfo:
    folder: pathlib.Path
    config: dict
    vocab: dict[str, int] | None  # token string -> id
    special: dict[str, str | None]


def _tokenizer_folder(model: str, tokenizer: str | None) -> pathlib.Path:
    return pathlib.Path(tokenizer or model)


def _model_info(model: str, tokenizer: str | None) -> _ModelInfo | None:
    folder = pathlib.Path(model)
    cfg = _read_json(folder / "config.json")
    if cfg is None:
        return None
    tdir = _tokenizer_folder(model, tokenizer)
    tok = _read_json(tdir / "tokenizer.json")
    vocab = None
    if tok is not None:
        vocab = dict(tok.get("model", {}).get("vocab", {}) or {})
        for added in tok.get("added_tokens", []):
            vocab[added["content"]] = added["id"]
    tcfg = _read_json(tdir / "tokenizer_config.json") or {}
    special = {}
    for k in ("eos_token", "pad_token", "bos_token"):
        v = tcfg.get(k)
        special[k] = v.get("content") if isinstance(v, dict) else v
    return _ModelInfo(folder, cfg, vocab, special)


def check_vocab(target: _ModelInfo, draft: _ModelInfo, report: CheckReport, *, backend: str, what: str = "draft") -> None:
    tv, dv = target.config.get("vocab_size"), draft.config.get("vocab_size")
    if target.vocab is None or draft.vocab is None:
        report.add("tokenizer", "skip", "tokenizer.json missing in one folder; token-level comparison skipped")
    else:
        if target.vocab == draft.vocab:
            report.add("tokenizer", "ok", f"{what} and target share one tokenizer ({len(target.vocab)} tokens)")
        else:
            t_ids = {i: s for s, i in target.vocab.items()}
            d_ids = {i: s for s, i in draft.vocab.items()}
            differ = sorted(i for i in set(t_ids) & set(d_ids) if t_ids[i] != d_ids[i])
            only_t = len(set(t_ids) - set(d_ids))
            only_d = len(set(d_ids) - set(t_ids))
            example = ""
            if differ:
                i = differ[0]
                example = f"; first difference: id {i} is {t_ids[i]!r} in the target but {d_ids[i]!r} in the {what}"
            report.add(
                "tokenizer",
                "fail",
                f"{what} and target tokenizers differ: {len(differ)} ids mean different strings, "
                f"{only_t} ids only in the target, {only_d} only in the {what}{example}",
                fix=f"use a {what} trained with the target's tokenizer (same family, e.g. Qwen2.5 0.5B for Qwen2.5 1.5B); "
                "acceptance is near zero otherwise",
            )
    if tv is not None and dv is not None:
        if tv == dv:
            report.add("vocab_size", "ok", f"embedding rows agree ({tv})")
        else:
            ntok = len(target.vocab) if target.vocab else None
            pad_note = (
                f"; both tokenizers have {ntok} tokens, so the difference is embedding padding"
                if ntok and target.vocab == draft.vocab
                else ""
            )
            report.add(
                "vocab_size",
                "fail" if backend != "torch" else "warn",
                f"target vocab_size {tv} != {what} vocab_size {dv}{pad_note}. TRT-LLM draft-target compares "
                f"logits row for row and fails with 'Incompatible buffer sizes' (TRT-LLM#2789)",
                fix=f"pad the smaller model's embedding and lm_head to {max(tv, dv)} rows "
                "(transformers: model.resize_token_embeddings(N)) and re-export"
                + ("; the torch runtime compares token ids and tolerates it" if backend == "torch" else ""),
            )
    bad = [
        f"{k}: target {target.special.get(k)!r} vs {what} {draft.special.get(k)!r}"
        for k in ("eos_token", "pad_token")
        if target.special.get(k) != draft.special.get(k)
    ]
    if bad:
        report.add(
            "special_tokens", "fail", "special tokens disagree: " + "; ".join(bad),
            fix="give both models the same eos/pad tokens (tokenizer_config.json)",
        )
    else:
        report.add("special_tokens", "ok", f"eos={target.special.get('eos_token')!r} pad={target.special.get('pad_token')!r} agree")


# --------------------------------------------------------------------------------------------
# quantization combinations (reference/trtllm-triton.md §1.6, §0.7)


def check_quantization(recipe: Recipe, report: CheckReport) -> None:
    spec = recipe.speculation
    backend = recipe.runtime.backend
    arch = recipe.runtime.gpu_arch
    models = [("target", recipe.target)]
    if recipe.draft_spec is not None:
        models.append(("draft" if spec.method == "draft_target" else "head", recipe.draft_spec))
    problems = 0
    for role, m in models:
        q = m.quantization
        fmt = q.format
        force = q.force
        field_name = "target.quantization.format" if role == "target" else f"speculation.{'draft' if role == 'draft' else 'head'}.quantization.format"

        def refuse(detail: str, fix: str) -> None:
            nonlocal problems
            problems += 1
            report.add(
                f"quantization:{role}", "warn" if force else "fail",
                f"{field_name}={fmt!r}: {detail}" + (" (forced)" if force else ""), fix=None if force else fix,
            )

        if fmt == "nvfp4" and arch in ("ampere", "ada", "hopper"):
            refuse(f"NVFP4 inference needs Blackwell GPUs; runtime.gpu_arch is {arch!r}", "use fp8 or int4_awq on Hopper, or set force: true")
        elif fmt == "nvfp4" and backend != "torch":
            report.add(f"quantization:{role}", "warn", "nvfp4 runs on Blackwell GPUs only (TRT-LLM); set runtime.gpu_arch: blackwell to confirm")
        elif fmt == "nvfp4":
            report.add(f"quantization:{role}", "warn", "nvfp4 on the torch runtime is a CPU emulation for accuracy estimates, not a speedup")
        if spec.method in ("eagle", "eagle3") and fmt == "int8_sq":
            refuse("INT8 SmoothQuant with EAGLE fails upstream (TRT-LLM#3207)", "use fp8 (ModelOpt unified checkpoint) or none")
        elif isinstance(spec, Eagle) and fmt not in ("none", "fp8"):
            refuse("the TRT-LLM EAGLE engine supports FP16/BF16, and FP8 through the ModelOpt unified checkpoint only", "use fp8 or none")
        if isinstance(spec, Medusa) and role == "target" and fmt not in ("none", "fp8"):
            refuse("Medusa supports an FP8 base model only (FP16/BF16/FP8)", "use fp8 or none")
        if isinstance(spec, Medusa) and role == "head" and fmt != "none":
            refuse("Medusa heads stay FP16/BF16 in the TRT-LLM flow", "set the head's format to none")
        if backend == "trtllm-pytorch" and fmt == "int8_sq":
            refuse("the TRT-LLM PyTorch flow does not load INT8 SmoothQuant checkpoints (ModelOpt still exports them as legacy TRT-LLM checkpoints)", "use fp8/int4_awq, or runtime.backend: trtllm-engine")
        if isinstance(spec, Eagle3) and backend == "trtllm-pytorch" and spec.eagle3_one_model and role == "target" and fmt == "fp8":
            report.add("quantization:target", "warn", "EAGLE-3 one-model with an FP8 target crashed in TRT-LLM 1.0.0rc6 (TRT-LLM#7842); test on your version or set eagle3_one_model: false")
        if fmt != "none" and backend == "torch":
            kernels = quantized_kernels_for(fmt, recipe.runtime.device, recipe.runtime.quantized_kernels)
            if q.kv_cache != "none" and "fake-quant" not in kernels:  # the KV quantizers need the fake-quant model
                kernels = quantized_kernels_for(fmt, recipe.runtime.device, "emulated") + " (the KV-cache format needs it)"
            if q.lm_head != "none":
                kernels += f"; LM head {q.lm_head}" + ("" if "fake-quant" in kernels else " on INT8 weights (Int8Linear)")
            if "wo_cpu" in kernels:  # which this machine gets (kernels.variant: by the CPU's flags)
                build = variant()
                kernels += {"bf16": "; this CPU has avx512_bf16: wo_cpu, bf16 build",
                            "fma": "; this CPU has AVX512 without avx512_bf16: wo_cpu, fma build"}.get(
                                build, "; this CPU has no AVX512: torch's kernel")
            report.add(f"kernels:{role}", "info", f"{fmt} in the torch runtime runs on {kernels}")
        if q.lm_head != "none" and backend != "torch":  # not forceable: the quantize stage cannot export it
            problems += 1
            report.add(f"quantization:{role}", "fail",
                       f"{field_name.replace('.format', '.lm_head')}={q.lm_head!r}: a quantized LM head is run by "
                       f"trtspec's torch runtime only; runtime.backend is {backend!r}",
                       fix="set quantization.lm_head: none for a TRT-LLM runtime (TRT-LLM quantizes its LM head in "
                           "the body's format: --quantize_lm_head)")
        if q.kv_cache != "none" and backend == "torch":
            report.add(f"quantization:{role}", "warn", f"kv_cache={q.kv_cache!r}: the torch runtime rounds K/V to {q.kv_cache} with the calibrated scales (fake-quant) but stores them in {recipe.runtime.dtype}, so the cache takes no less memory here")
    if not problems:
        report.add("quantization", "ok", "no combination known to fail upstream")


# --------------------------------------------------------------------------------------------


def stage_plan(recipe: Recipe) -> list[str]:
    """The stages ``trtspec run`` executes for this recipe, in order."""
    plan = ["check"]
    quant = [r for r, m in (("target", recipe.target), ("draft", recipe.draft_spec)) if m and m.quantization.format != "none"]
    kv = [r for r, m in (("target", recipe.target), ("draft", recipe.draft_spec)) if m and m.quantization.kv_cache != "none"]
    if quant or kv:
        plan.append("quantize (" + ", ".join(sorted(set(quant + kv))) + ")")
    backend = recipe.runtime.backend
    if backend == "trtllm-engine":
        plan += ["convert checkpoints", "trtllm-build engines"]
    elif backend == "trtllm-pytorch":
        plan += ["LLM-API config (speculative_config YAML)"]
    else:
        plan += ["load into the torch runtime"]
    plan += ["package (Triton model repository: ensemble + ensemble_baseline)", "serve (tritonserver)",
             "validate (greedy equivalence, gates)", "bench (concurrency " + ",".join(map(str, recipe.validation.concurrency)) + ")",
             "report + verdict"]
    return plan


def run_checks(recipe: Recipe, source: str = "") -> CheckReport:
    report = CheckReport(recipe=source or recipe.name)
    report.add("schema", "ok", f"recipe '{recipe.name}': method={recipe.speculation.method} runtime={recipe.runtime.backend}")
    spec = recipe.speculation

    # versions of the engine flow
    if recipe.runtime.backend == "trtllm-engine":

        ok, why = engine_flow_supported(recipe.runtime.trtllm.version)
        report.add("trtllm_version", "ok" if ok else "fail", why,
                   fix=None if ok else "pin runtime.trtllm.version to 1.2.x, or use runtime.backend: trtllm-pytorch")

    # models by hub id: read from the Hugging Face cache (trtspec.hub), never downloaded here

    recipe, hub_lines = check_lines(recipe)
    for line in hub_lines:
        report.add(*line)

    # models on disk
    local = _local(recipe)
    target = _model_info(recipe.target.model, recipe.target.tokenizer)
    draft_spec = recipe.draft_spec
    draft = _model_info(draft_spec.model, draft_spec.tokenizer) if draft_spec else None
    for role, spec_m, info in (("target", recipe.target, target), ("draft" if spec.method == "draft_target" else "head", draft_spec, draft)):
        if spec_m is None:
            continue
        if info is None and is_hub_id(spec_m.model):
            continue  # reported above (hub:...)
        if info is None:
            if local:
                # the fix names the command that makes this folder (an EAGLE-3 head: trained for the target)
                head_for = recipe.target.model if role == "head" and isinstance(spec, Eagle3) else None
                report.add(f"model:{role}", "fail", f"{role} checkpoint not found or has no config.json: {spec_m.model}",
                           fix=missing_model_fix(spec_m.model, head_for=head_for, target_missing=target is None))
            else:
                report.add(f"model:{role}", "skip", f"{spec_m.model} is not on this machine; model checks run where the build runs",
                           fix=elsewhere_fix(spec_m.model))
        else:
            report.add(f"model:{role}", "ok", f"{info.folder} ({(info.config.get('architectures') or ['?'])[0]}, vocab {info.config.get('vocab_size')})")

    if target is not None and draft is not None:
        if spec.method == "draft_target":
            check_vocab(target, draft, report, backend=recipe.runtime.backend)
        elif isinstance(spec, Eagle3):
            _check_eagle3_head(target, draft, report)

    # positions
    if target is not None:
        mpe = target.config.get("max_position_embeddings")
        need = recipe.limits.max_seq_len + recipe.max_draft_len
        if mpe is not None and need > mpe:
            report.add("max_seq_len", "fail",
                       f"limits.max_seq_len ({recipe.limits.max_seq_len}) + max_draft_len ({recipe.max_draft_len}) = {need} "
                       f"exceeds the target's max_position_embeddings ({mpe}); engines silently add max_draft_len",
                       fix=f"set limits.max_seq_len <= {mpe - recipe.max_draft_len}")
        else:
            report.add("max_seq_len", "ok", f"max_seq_len + max_draft_len = {need} fits max_position_embeddings={mpe}")

    check_quantization(recipe, report)

    for line in calibration_lines(recipe) + passthrough_lines(recipe) + trtllm_name_lines(recipe):
        report.add(line.name, line.status, line.detail, line.fix)

    if recipe.runtime.backend == "torch" and recipe.runtime.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            report.add("device", "fail", "runtime.device is 'cuda' but torch sees no CUDA device",
                       fix="use device: auto (CPU here) or run on a GPU machine")
    report.plan = stage_plan(recipe)
    return report


def _check_eagle3_head(target: _ModelInfo, head: _ModelInfo, report: CheckReport) -> None:
    th, hh = target.config.get("hidden_size"), head.config.get("hidden_size")
    tv, hv = target.config.get("vocab_size"), head.config.get("vocab_size")
    dv = head.config.get("draft_vocab_size") or hv
    if th != hh:
        report.add("eagle3_head", "fail", f"head hidden_size {hh} != target hidden_size {th}: the head reads the target's hidden states",
                   fix="train the head on this target (trtspec models eagle3)")
    elif hv != tv:
        report.add("eagle3_head", "fail", f"head vocab_size {hv} != target vocab_size {tv}: its d2t map and embedding "
                   "index another vocabulary", fix="train the head on this target (trtspec models eagle3)")
    elif dv != tv:
        report.add("eagle3_head", "ok", f"head matches the target (hidden {th}); it drafts over {dv} of the target's "
                   f"{tv} tokens (EAGLE-3's draft vocabulary, d2t)")
    else:
        report.add("eagle3_head", "ok", f"head matches the target (hidden {th}, vocab {tv})")
