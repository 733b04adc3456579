"""``trtspec run CONFIG``: check → quantize → build → package → serve → validate → report.

Every finished stage leaves ``WORKDIR/<stage>/trtspec.json`` with a key over its inputs (the
recipe, the previous stages' keys, the trtspec version and the contents of the files it reads:
``trtspec.run_inputs``), and those inputs, so ``--explain`` can say why a stage ran. A re-run reuses
every stage whose key is unchanged, so after a failure it resumes from the stage that failed;
``--from STAGE`` forces a stage and everything after it, ``--until STAGE`` stops after one.
Stages write into temp folders renamed on success. The server is started only for the
validate stage, inside a context manager: it is stopped (process group killed, shared memory
removed) on success, on failure and on Ctrl-C alike. One run at a time holds the work folder
(``trtspec.outputs.work_lock``).
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from trtspec.config import Recipe, recipe_to_dict
from trtspec.errors import PreflightError, StageError, TrtspecError
from trtspec.manifest import atomic_dir, hash_json, maybe_manifest, write_manifest
from trtspec.preflight import run_checks
from trtspec.quantize.stage import quantize_model
from trtspec.prompts import load_prompts
from trtspec.speculative.runtime import RuntimeSpec, build_engine
from trtspec.speculative.tune import tune
from trtspec.triton.render import package
from trtspec.triton.launch.server import server_for_repository
from trtspec.validate.report import write_validation_report
from trtspec.validate.run import run_validation
from trtspec.run_report import write_run_report
from trtspec.trtllm.build import build
from trtspec.hub import resolve_recipe
from trtspec.client.prom import scrape
from trtspec.run_inputs import explain, recipe_hash, stage_inputs
from trtspec.outputs import work_lock

STAGES = ("check", "quantize", "build", "package", "serve", "validate", "report")
STAGE_KIND = "pipeline-stage"

OnEvent = Callable[[str, str, dict], None]  # (stage, "start"|"done"|"reused"|"skipped"|"failed", info)


@dataclass
class StageRecord:
    stage: str
    status: str  # done | reused | skipped | failed
    seconds: float = 0.0
    info: dict = field(default_factory=dict)
    why: str = ""  # why it ran, or why it was reused (trtspec run --explain)


@dataclass
class RunResult:
    recipe: str
    workdir: pathlib.Path
    stages: list[StageRecord]
    verdict: dict | None = None  # {"decision", "deploy_speculative", "gates"} when validated
    report_dir: pathlib.Path | None = None

    @property
    def exit_code(self) -> int:
        if self.verdict is None:
            return 0
        return 0 if self.verdict.get("deploy_speculative") else 1


def fingerprint(folder: str | os.PathLike | None) -> str | None:
    """Cheap identity of a model folder: names, sizes and mtimes (not contents)."""
    if folder is None:
        return None
    p = pathlib.Path(folder)
    if not p.exists():
        return f"missing:{p}"
    items = sorted((str(f.relative_to(p)), f.stat().st_size, int(f.stat().st_mtime)) for f in p.rglob("*") if f.is_file())
    return hash_json([str(p), items])


class Pipeline:
    def __init__(self, recipe: Recipe, workdir: str | os.PathLike, *, source: str = "", on_event: OnEvent | None = None,
                 ready_timeout_s: float | None = None):

        # hub ids (org/name) become their snapshot folders: every stage reads local folders
        self.recipe, _resolved, _ = resolve_recipe(recipe, download=True)
        self.source = source
        self.workdir = pathlib.Path(workdir).resolve()
        self.on_event = on_event or (lambda *a: None)
        self.ready_timeout_s = ready_timeout_s
        self.keys: dict[str, str] = {}
        self.inputs: dict[str, Any] = {}  # stage → what its key covers besides the recipe (run_inputs)
        self.outputs: dict[str, dict] = {}
        self.stage_log: list[dict] = []  # {stage, status, seconds}, in order (the report's table)
        self.server = None  # the TritonServer while the validate stage runs

    # ------------------------------------------------------------------ bookkeeping

    def stage_dir(self, stage: str) -> pathlib.Path:
        return self.workdir / stage

    def _prev(self, stage: str) -> list:
        return [self.keys.get(s) for s in STAGES[: STAGES.index(stage)]]

    def _key(self, stage: str, extra: Any = None) -> str:
        return hash_json({"stage": stage, "recipe": recipe_to_dict(self.recipe), "prev": self._prev(stage),
                          "extra": extra})[:20]

    def _reusable(self, stage: str, key: str) -> dict | None:
        m = maybe_manifest(self.stage_dir(stage))
        if m and m.get("kind") == STAGE_KIND and m.get("stage") == stage and m.get("key") == key:
            return m
        return None

    def run(self, *, start: str | None = None, until: str | None = None) -> RunResult:

        for name, value in (("--from", start), ("--until", until)):
            if value is not None and value not in STAGES:
                raise TrtspecError(f"{name} {value!r} is not a stage", fix=f"use one of: {', '.join(STAGES)}")
        with work_lock(self.workdir):  # two runs of one recipe must not interleave their stages
            return self._run(start=start, until=until)

    def _run(self, *, start: str | None, until: str | None) -> RunResult:
        for name, value in (("--from", start), ("--until", until)):
            if value is not None and value not in STAGES:
                raise TrtspecError(f"{name} {value!r} is not a stage", fix=f"use one of: {', '.join(STAGES)}")
        first_forced = STAGES.index(start) if start else len(STAGES)
        last = STAGES.index(until) if until else len(STAGES) - 1
        self.workdir.mkdir(parents=True, exist_ok=True)
        records: list[StageRecord] = []
        result = RunResult(self.recipe.name, self.workdir, records)
        # serve + validate run together: the server lives only as long as validation needs it
        for i, stage in enumerate(STAGES):
            if i > last:
                break
            if stage == "serve":
                continue  # started inside validate; recorded there
            fn = getattr(self, f"_stage_{stage}")
            inputs = self._extra(stage)
            key = self._key(stage, inputs)
            self.keys[stage] = key
            self.inputs[stage] = inputs
            reuse = None if i >= first_forced else self._reusable(stage, key)
            if reuse is not None:
                self.outputs[stage] = reuse.get("outputs", {})
                why = f"reused: same recipe, earlier stages and inputs as its run of {reuse.get('created', '?')}"
                records.append(StageRecord(stage, "reused", 0.0, self.outputs[stage], why))
                self.stage_log.append({"stage": stage, "status": "reused", "seconds": 0.0,
                                       "ran_seconds": reuse.get("seconds", 0.0)})
                self.on_event(stage, "reused", {**self.outputs[stage], "why": why})
                if stage == "validate":
                    result.verdict = self.outputs[stage].get("verdict")
                continue
            why = explain(stage, maybe_manifest(self.stage_dir(stage)) if self.stage_dir(stage).is_dir() else None,
                          inputs=inputs, recipe=recipe_hash(recipe_to_dict(self.recipe)), prev=self._prev(stage),
                          forced_by=start if i >= first_forced else None, stages=STAGES)
            self.on_event(stage, "start", {"why": why})
            t0 = time.perf_counter()
            try:
                outputs = fn()
            except BaseException as e:
                records.append(StageRecord(stage, "failed", time.perf_counter() - t0, {"error": str(e)}))
                self.stage_log.append({"stage": stage, "status": "failed", "seconds": round(time.perf_counter() - t0, 3)})
                self.on_event(stage, "failed", {"error": str(e)})
                self._invalidate_from(stage)
                raise
            dt = time.perf_counter() - t0
            status = "skipped" if outputs.pop("_skipped", False) else "done"
            self.outputs[stage] = outputs
            self.stage_log.append({"stage": stage, "status": status, "seconds": round(dt, 3)})
            self._record(stage, key, outputs, dt)
            records.append(StageRecord(stage, status, dt, outputs, why))
            self.on_event(stage, status, {**outputs, "seconds": dt, "why": why})
            if stage == "validate":
                result.verdict = outputs.get("verdict")
        if "report" in self.outputs:
            result.report_dir = pathlib.Path(self.outputs["report"]["dir"])
        return result

    def _extra(self, stage: str) -> Any:
        fingerprints = {r: fingerprint(m.model) for r, m in self._models()} if stage == "quantize" else None
        return stage_inputs(self.recipe, stage, fingerprints)

    def _record(self, stage: str, key: str, outputs: dict, seconds: float) -> None:
        d = self.stage_dir(stage)
        d.mkdir(parents=True, exist_ok=True)
        write_manifest(d, STAGE_KIND, stage=stage, key=key, recipe=self.recipe.name, seconds=round(seconds, 3),
                       outputs=outputs, inputs=self.inputs.get(stage),
                       recipe_hash=recipe_hash(recipe_to_dict(self.recipe)), prev=self._prev(stage))

    def _invalidate_from(self, stage: str) -> None:
        """A failed stage, and everything after it, must run again next time."""
        for s in STAGES[STAGES.index(stage):]:
            (self.stage_dir(s) / "trtspec.json").unlink(missing_ok=True)

    def _models(self) -> list[tuple[str, Any]]:
        out = [("target", self.recipe.target)]
        if self.recipe.draft_spec is not None:
            out.append(("draft", self.recipe.draft_spec))
        return out

    # ------------------------------------------------------------------ stages

    def _stage_check(self) -> dict:

        report = run_checks(self.recipe, self.source)
        (self.workdir / "check.json").write_text(json.dumps(report.to_dict(), indent=2) + "\n")
        if not report.ok:
            failed = [c for c in report.checks if c.status == "fail"]
            lines = "\n".join(f"  - {c.name}: {c.detail}" + (f" (fix: {c.fix})" if c.fix else "") for c in failed)
            raise PreflightError(f"preflight failed ({len(failed)} check(s)):\n{lines}",
                                 fix=f"see {self.workdir / 'check.json'}; re-run after fixing (finished stages are reused)")
        return {"checks": len(report.checks), "warnings": sum(c.status == "warn" for c in report.checks),
                "plan": report.plan}

    def _stage_quantize(self) -> dict:
        if self.recipe.runtime.backend != "torch":
            # TRT-LLM flows quantize inside their build plan (TRT-LLM's quantize.py / ModelOpt HF export)
            return {"_skipped": True, "note": "quantization runs inside the TRT-LLM build plan"}

        outputs: dict[str, Any] = {}
        pair = {"target": self.recipe.draft_spec, "draft": self.recipe.target}
        for role, spec in self._models():
            q = spec.quantization
            if q.format == "none" and q.kv_cache == "none":
                continue
            if q.format == "none":
                raise StageError(f"{role}: kv_cache={q.kv_cache!r} without a weight format is exported for TRT-LLM only",
                                 fix="set quantization.format too, or kv_cache: none for the torch runtime")
            out = self.stage_dir("quantize") / role
            other = pair.get(role)
            def progress(phase: str, step: int, total: int, metrics: dict, role=role) -> None:
                self.on_event("quantize", "progress", {"label": f"quantize: {role} {phase}", "done": step, "total": total})

            res = quantize_model(spec.model, q, "torch", out, role=role, progress=progress,
                                 pair=other.model if other is not None and self.recipe.speculation.method == "draft_target" else None,
                                 gpu_arch=self.recipe.runtime.gpu_arch, threads=self.recipe.runtime.torch_threads)
            outputs[role] = {"dir": str(res.out_dir), "format": res.format, "kv_cache": res.kv_cache,
                             "quality": res.quality}
        if not outputs:
            return {"_skipped": True, "note": "no model is quantized in this recipe"}
        return outputs

    def _model_dirs(self) -> tuple[str, str | None]:
        q = self.outputs.get("quantize", {})
        target = q.get("target", {}).get("dir") or self.recipe.target.model
        draft_spec = self.recipe.draft_spec
        draft = q.get("draft", {}).get("dir") or (draft_spec.model if draft_spec else None)
        return target, draft

    def _stage_build(self) -> dict:
        backend = self.recipe.runtime.backend
        if backend != "torch":

            res = build(self.recipe, self.stage_dir("build") / "trtllm")
            return {"trtllm_manifest": res.manifest, "ran": len(res.ran), "cached": len(res.cached)}
        if self.recipe.speculation.method == "none":
            return {"_skipped": True, "note": "ordinary decoding: nothing to tune"}
        # torch runtime: nothing to compile; measure what the draft length should be

        target, draft = self._model_dirs()
        spec = RuntimeSpec.from_recipe(self.recipe, target=target, draft=draft)
        spec.max_batch_size, spec.adaptive = 1, False
        k_max = max(self.recipe.max_draft_len, 6)
        spec.max_draft_len = k_max
        engine = build_engine(spec)
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(self.recipe.target.tokenizer or self.recipe.target.model)
        v = self.recipe.validation
        texts = load_prompts(v.prompts, min(v.num_prompts, 6))
        ids = [tok(t, add_special_tokens=False)["input_ids"][: self.recipe.limits.max_input_len] for t in texts]
        res = tune(engine, ids, max_new_tokens=min(v.max_tokens, 48), k_max=k_max, timing_repeats=5)
        out = self.stage_dir("build")
        out.mkdir(parents=True, exist_ok=True)
        (out / "tune.json").write_text(json.dumps(res.to_dict(), indent=2) + "\n")
        return {"tune": str(out / "tune.json"), "recommended_max_draft_len": res.recommended_k,
                "configured_max_draft_len": self.recipe.max_draft_len,
                "expected_speedup_at_configured": round(res.rows[self.recipe.max_draft_len].expected_speedup, 3),
                "expected_speedup_at_recommended": round(res.rows[res.recommended_k].expected_speedup, 3),
                "per_position_acceptance": [round(a, 3) for a in res.per_position_acceptance],
                "cost_ratio": round(res.cost_ratio, 4)}

    def _stage_package(self) -> dict:

        target, draft = self._model_dirs()
        build_dir = None
        if self.recipe.runtime.backend != "torch":
            build_dir = self.stage_dir("build") / "trtllm"
        repo = self.stage_dir("package") / "repository"
        rendered = package(self.recipe, repo, target=target, draft=draft, build_dir=build_dir, overwrite=True)
        models = getattr(rendered, "models", None)
        return {"repository": str(repo), "models": [getattr(m, "name", str(m)) for m in (models or [])]}

    def _stage_validate(self) -> dict:
        if self.recipe.runtime.backend != "torch":
            raise StageError(
                f"runtime '{self.recipe.runtime.backend}' serves with TensorRT-LLM, which is not installed here",
                fix="run `trtspec run CONFIG --until package` here, then serve and validate inside NVIDIA's "
                    "Triton TRT-LLM container (docs/trtllm.md)")

        repo = self.outputs["package"]["repository"]
        out = self.stage_dir("validate")
        self.on_event("serve", "start", {"repository": repo})
        t0 = time.perf_counter()
        with server_for_repository(repo, workdir=self.workdir / "server", on_progress=self._progress("serve"), **(
                {"ready_timeout": self.ready_timeout_s} if self.ready_timeout_s else {})) as server:
            self.server = server
            ready_s = time.perf_counter() - t0
            self.stage_log.append({"stage": "serve", "status": "done", "seconds": round(ready_s, 3)})
            self.on_event("serve", "done", {**server.endpoints.to_dict(), "seconds": ready_s})
            try:
                url, client_options = server.client_target()  # TLS and the required header, as served
                result = run_validation(url, self.recipe, progress=self._progress("validate"),
                                        client_options=client_options)
            except TrtspecError as e:
                self._check_alive(server, e)
                raise
            self._check_alive(server)
            metrics = scrape_metrics(server.endpoints.metrics)
        out.mkdir(parents=True, exist_ok=True)
        files = write_validation_report(result, out, max_draft_len=self.recipe.max_draft_len,
                                        min_speedup=self.recipe.validation.gates.min_speedup)
        (out / "server_metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
        v = result.verdict
        return {"report": str(out / "report.md"), "report_json": str(out / "report.json"), "files": files,
                "verdict": {"decision": v.decision, "deploy_speculative": v.deploy_speculative,
                            "gates": [g.to_dict() if hasattr(g, "to_dict") else str(g) for g in v.gates]},
                "speedup": result.speedup, "acceptance": result.acceptance}

    def _progress(self, stage: str):
        """A library ``(done, total, label)`` callback turned into this stage's progress events."""
        def progress(done: int, total: int | None, label: str) -> None:
            self.on_event(stage, "progress", {"label": f"{stage}: {label}", "done": done, "total": total})
        return progress

    def _check_alive(self, server, cause: BaseException | None = None) -> None:
        """A validation that ran against a server which died is no verdict: fail the stage."""
        if server.proc is None:
            return
        rc = server.proc.poll()
        if rc is None and cause is not None:  # the client saw the connection drop: give the exit a moment
            try:
                rc = server.proc.wait(timeout=3)
            except subprocess.TimeoutExpired:
                rc = None
        if rc is not None:
            raise StageError(
                f"tritonserver died during validation (exit code {rc}); no verdict"
                + (f"\n  client saw: {str(cause).splitlines()[0]}" if cause else "")
                + f"\n  server log: {server.log_path}\n  log tail:\n    " + server.log_tail(8).replace("\n", "\n    "),
                fix="fix the cause in the log, then re-run: finished stages are reused and validation starts again",
            ) from cause

    def _stage_report(self) -> dict:

        out = self.stage_dir("report")
        with atomic_dir(out) as tmp:
            path = write_run_report(self, tmp)
        return {"dir": str(out), "report": str(out / pathlib.Path(path).name)}


def scrape_metrics(url: str) -> dict[str, float]:
    """The server's Prometheus text as {series: value}: trtspec's, Triton's and TensorRT-LLM's
    families (``trtspec.client.prom.KEEP``), parsed by ``prometheus_client``."""

    return scrape(url)
