"""``trtspec check`` lines for what a recipe hands to ModelOpt, TRT-LLM and Triton: where each
quantized model's calibration text comes from, how big it is, what the quality report will
measure; the passthroughs (runtime.trtllm.llm_api_options, build_args,
serving.tritonserver_args) with their warnings; which TRT-LLM LLM-API names could not be confirmed
against the pinned release, and whether the launch mode keeps fast draft logits. Pure data in,
(name, status, detail, fix) out.
"""

from __future__ import annotations

from dataclasses import dataclass

from trtspec import calib_sources
from trtspec.config import ModelSpec, Recipe
from trtspec.errors import ConfigError
from trtspec.passthrough import recipe_warnings
from trtspec.trtllm import accepted_names as A
from trtspec.trtllm import llmapi


@dataclass(frozen=True)
class Line:
    name: str
    status: str  # ok | warn | fail | skip
    detail: str
    fix: str | None = None


def _models(recipe: Recipe) -> list[tuple[str, str, ModelSpec]]:
    out = [("target", "target", recipe.target)]
    spec = recipe.draft_spec
    if spec is not None:
        key = "draft" if recipe.speculation.method == "draft_target" else "head"
        out.append((key, f"speculation.{key}", spec))
    return out


# builtin calibration text is Python source; what the recipe says its traffic is, by its own
# validation prompts (a prompt file: the recipe's own data, of a kind not named here)
TRAFFIC = {"builtin:code": "code", "builtin:stdlib": "code", "builtin:chat": "chat", "builtin:mixed": "code and chat"}


def declared_traffic(recipe: Recipe) -> str | None:
    """The kind of text the recipe says it serves (``validation.prompts``), or None for a file.

    The calibration warning is decided by this, not by the model's name or its chat template: a
    code model calibrated on code (qwen-coder-cpu) is right whatever its name says."""
    return TRAFFIC.get(recipe.validation.prompts)


def _quality_line(recipe: Recipe, src: calib_sources.Source) -> str:
    held = ("the stdlib corpus's held-out files" if src.kind == "builtin" else
            f"held-out rows of the same source (every {calib_sources.HELDOUT_EVERY}th, never calibrated on)")
    what = (f"top-1 agreement, KL divergence and perplexity change against the unquantized model on {held}; "
            "the draft's acceptance before/after on held-out prompts of the same source")
    if recipe.runtime.backend == "trtllm-engine":
        return ("TRT-LLM's quantize.py writes no quality report; `trtspec quantize --calib "
                f"{src.value} --export trtllm` measures {what}")
    return f"quality.json measures {what}"


def calibration_lines(recipe: Recipe) -> list[Line]:
    """One line per quantized model: source, sizes, what the quality report measures; a
    warning when a recipe that says it serves chat (validation.prompts) calibrates on builtin
    (Python code)."""
    lines: list[Line] = []
    local = recipe.runtime.backend == "torch"
    for role, field, spec in _models(recipe):
        q = spec.quantization
        if q.format == "none" and q.kv_cache == "none":
            continue
        cal = q.calibration
        name = f"calibration:{role}"
        dfield = f"{field}.quantization.calibration.dataset"
        try:
            src = calib_sources.resolve(cal.dataset, cal.split, cal.column)
        except ConfigError as e:
            if not local and cal.dataset.startswith("/") and e.field == calib_sources.FIELD:
                lines.append(Line(name, "skip", f"{cal.dataset} is not on this machine; it is read where the build "
                                                f"runs ({cal.size} x {cal.seq_len} tokens)"))
                continue
            lines.append(Line(name, "fail", f"{dfield.rsplit('.', 1)[0]}.{e.field.rsplit('.', 1)[-1]}={e.value!r}: "
                                            f"{e.problem}", e.fix))
            continue
        sizes = f"{cal.size} x {cal.seq_len} tokens"
        if (cal.size, cal.seq_len) == calib_sources.MODELOPT_SIZES:
            sizes += " (ModelOpt's default)"
        elif src.kind != "builtin" and cal.size * cal.seq_len < 512 * 512 // 4:
            sizes += f" (ModelOpt's default is {calib_sources.MODELOPT_SIZES[0]} x {calib_sources.MODELOPT_SIZES[1]})"
        how = ""
        if recipe.runtime.backend == "trtllm-engine":
            named = calib_sources.NAMED.get(cal.dataset)
            how = ("; quantize.py --calib_dataset reads it by name" if named and named.trtllm_native
                   else "; the calib stage writes it as a train.jsonl folder for quantize.py --calib_dataset")
        detail = f"{src.describe()}, {sizes}{how}. {_quality_line(recipe, src)}"
        if src.kind in ("file", "folder"):
            try:
                if next(calib_sources.iter_texts(src), None) is None:
                    raise ConfigError(calib_sources.FIELD, cal.dataset, "no text", fix="name a source with text")
            except ConfigError as e:
                lines.append(Line(name, "fail", f"{dfield.rsplit('.', 1)[0]}.{e.field.rsplit('.', 1)[-1]}="
                                                f"{e.value!r}: {e.problem}", e.fix))
                continue
        traffic = declared_traffic(recipe)
        if src.kind == "builtin" and traffic not in (None, "code"):
            lines.append(Line(name, "warn", f"the recipe serves {traffic} (validation.prompts: "
                                            f"{recipe.validation.prompts}) but the {role} calibrates on builtin, Python "
                                            f"source code: its scales would be set on code and its quality report would "
                                            f"measure code. {detail}",
                              fix=f"set {dfield}: cnn_dailymail (news, ModelOpt's default) or your own chat traffic "
                                  "(a .jsonl, a saved dataset folder, or org/name with split/column); or, if the "
                                  "traffic is code, validation.prompts: builtin:code"))
            continue
        if src.kind == "builtin" and traffic == "code":
            detail += f"; builtin is code, as the recipe's traffic is (validation.prompts: {recipe.validation.prompts})"
        lines.append(Line(name, "ok", detail))
    return lines


def passthrough_lines(recipe: Recipe) -> list[Line]:
    t, s = recipe.runtime.trtllm, recipe.serving
    given = [(f, v) for f, v in (("runtime.trtllm.llm_api_options", t.llm_api_options),
                                 ("runtime.trtllm.build_args", t.build_args),
                                 ("serving.tritonserver_args", s.tritonserver_args)) if v]
    if not given:
        return []
    warnings = recipe_warnings(t.llm_api_options, t.build_args, s.tritonserver_args, backend=recipe.runtime.backend)
    lines = [Line("passthrough", "warn", w, fix="check the name against your TRT-LLM / Triton version") for w in warnings]
    if not warnings:
        lines.append(Line("passthrough", "ok", "; ".join(f"{f}: {v}" for f, v in given)
                          + " (names known; owned keys refused at load)"))
    return lines


def trtllm_name_lines(recipe: Recipe) -> list[Line]:
    """``trtllm-names``: the LLM-API names the PyTorch flow's YAML writes that could not be
    confirmed against runtime.trtllm.version (accepted_names.LLM_API_NAMES: TRT-LLM 1.2.1's own
    llm_args.py was not readable, so a name counts as confirmed when 1.2.1's quoted text has it or
    the 1.1/1.2.0rc-era and the pre-1.3 copies both accept it). ``fast-logits``: an engine-flow draft-target recipe with
    use_draft_logits whose launch mode leaves speculative_decoding_fast_logits off."""
    lines: list[Line] = []
    t = recipe.runtime.trtllm
    if recipe.runtime.backend == "trtllm-pytorch":
        try:
            opts = llmapi.llm_api_options(recipe, model="<target>", speculative_model="<draft>")
        except ValueError:
            opts = None  # a method the PyTorch flow does not run: the build says so
        if opts is not None:
            written = llmapi.triton_model_yaml(opts, decoupled=False)
            unconfirmed = A.unconfirmed_llm_api_names(written)
            if unconfirmed:
                lines.append(Line(
                    "trtllm-names", "warn",
                    f"not confirmed against TensorRT-LLM {t.version} (its llm_args.py was not readable, and the "
                    f"copies read around it disagree): " + "; ".join(unconfirmed),
                    fix="if TensorRT-LLM refuses the name at load (\"Invalid decoding type\" / \"Input tag ... does "
                        "not match\"), write the other copy's spelling (DraftTarget <-> Draft_Target) into OUT/llmapi/*.yaml "
                        "(docs/trtllm.md, 'LLM-API names')"))
            else:
                lines.append(Line(
                    "trtllm-names", "ok",
                    f"{len(A._yaml_names(written))} LLM-API names, each in 1.2.1's quoted llm_args.py text or accepted by "
                    f"both the 1.1/1.2.0rc-era and the pre-1.3 copies (TensorRT-LLM {t.version}'s own file was not "
                    f"readable; accepted_names.LLM_API_NAMES)"))
    s = recipe.speculation
    if recipe.runtime.backend == "trtllm-engine" and s.method == "draft_target" and getattr(s, "use_draft_logits", False):
        mode = t.launch_mode
        if mode in ("auto", "orchestrator_prespawn"):
            lines.append(Line(
                "fast-logits", "ok",
                f"launch_mode {mode}: orchestrator with process spawning off, so the repository's "
                "speculative_decoding_fast_logits=1 holds when `trtspec serve` starts it (TRTLLM_ORCHESTRATOR=1, "
                "TRTLLM_ORCHESTRATOR_SPAWN_PROCESSES=0, every rank under mpirun); started any other way, the "
                "tensorrtllm backend turns fast logits off with only a warning in the server log"))
        else:
            lines.append(Line(
                "fast-logits", "warn",
                f"speculation.use_draft_logits with launch_mode {mode}: speculative_decoding_fast_logits needs "
                "orchestrator mode with process spawning off, so the repository is written without it (the tensorrtllm "
                "backend would turn it off, with only a warning in the server log) and draft logits take the slow path",
                fix="set runtime.trtllm.launch_mode: orchestrator_prespawn (or auto)"))
    return lines
