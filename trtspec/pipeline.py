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

Each stage is a :class:`Stage` object (:data:`PIPELINE`, in order): its ``name`` (folder, CLI
name, cache-key order), what it ``does`` on the torch and the TRT-LLM runtimes, and ``run``,
which returns a typed output (:class:`Checked`, :class:`Quantized`, :class:`Tuned` or
:class:`EnginesBuilt`, :class:`Packaged`, :class:`Validated`, :class:`Reported`, or
:class:`Skipped`). Later stages read earlier ones' outputs typed (:meth:`Pipeline.result`); the
manifests, events and the run report hold their ``to_dict()``, the same keys as before.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import time
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Callable, ClassVar

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


# ---------------------------------------------------------------------------------- stage outputs
# Each stage returns one of these; ``to_dict`` is what its manifest, its events and the run report
# hold (the same keys as before the stages were typed), ``from_dict`` reads a reused stage's back.


class Output:
    """Base of the stage outputs: ``to_dict`` the fields as they are (the manifest's form),
    ``from_dict`` back."""

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}  # type: ignore[arg-type]

    @classmethod
    def from_dict(cls, d: dict):
        return cls(**d)


@dataclass(frozen=True)
class Skipped(Output):
    """The stage had nothing to do for this recipe (recorded as skipped, reused like any other)."""

    note: str


@dataclass(frozen=True)
class Checked(Output):
    checks: int
    warnings: int
    plan: Any  # the preflight's launch plan (dict), or None


@dataclass(frozen=True)
class QuantizedModel:
    dir: str
    format: str
    kv_cache: str
    quality: dict | None


@dataclass(frozen=True)
class Quantized(Output):
    """role (target | draft) → its ModelOpt export for the torch runtime."""

    models: dict[str, QuantizedModel]

    def to_dict(self) -> dict:
        return {role: asdict(m) for role, m in self.models.items()}

    @classmethod
    def from_dict(cls, d: dict) -> "Quantized":
        return cls({role: QuantizedModel(**m) for role, m in d.items()})


@dataclass(frozen=True)
class Tuned(Output):
    """The torch runtime's build: the measured acceptance per draft position and the max_draft_len
    that maximises the expected speedup (trtspec.speculative.tune)."""

    tune: str  # tune.json
    recommended_max_draft_len: int
    configured_max_draft_len: int
    expected_speedup_at_configured: float
    expected_speedup_at_recommended: float
    per_position_acceptance: list[float]
    cost_ratio: float


@dataclass(frozen=True)
class EnginesBuilt(Output):
    """A TensorRT-LLM runtime's build: the plan's manifest and how many steps ran or were cached."""

    trtllm_manifest: dict
    ran: int
    cached: int


@dataclass(frozen=True)
class Packaged(Output):
    repository: str
    models: list[str]


@dataclass(frozen=True)
class Validated(Output):
    report: str
    report_json: str
    files: Any
    verdict: dict  # {"decision", "deploy_speculative", "decided_by", "reason", "gates"}
    speedup: Any
    acceptance: Any


@dataclass(frozen=True)
class Reported(Output):
    dir: str
    report: str


@dataclass(frozen=True)
class ModelFolders:
    """The input of build and package: the folders they serve (the quantize stage's exports where
    it made them, else the recipe's)."""

    target: str
    draft: str | None


StageOutput = Skipped | Checked | Quantized | Tuned | EnginesBuilt | Packaged | Validated | Reported


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
        self.results: dict[str, StageOutput] = {}  # stage → its typed output, this run's or reused
        self.stage_log: list[dict] = []  # {stage, status, seconds}, in order (the report's table)
        self.server = None  # the TritonServer while the validate stage runs

    # ------------------------------------------------------------------ bookkeeping

    @property
    def outputs(self) -> dict[str, dict]:
        """stage → its output as its manifest holds it (the run report reads these)."""
        return {name: r.to_dict() for name, r in self.results.items()}

    def result(self, stage: type[Stage]):
        """The typed output of an earlier ``stage`` of this run (one of ``stage.output``, or Skipped)."""
        return self.results.get(stage.name)

    def stage_dir(self, stage: str) -> pathlib.Path:
        return self.workdir / stage

    def _prev(self, stage: str) -> list:
        return [self.keys.get(s) for s in STAGES[: STAGES.index(stage)]]

    def _key(self, stage: str, extra: Any = None) -> str:
        return hash_json({"stage": stage, "recipe": recipe_to_dict(self.recipe), "prev": self._prev(stage),
                          "extra": extra})[:20]

    def _reusable(self, stage: Stage, key: str) -> tuple[dict, StageOutput] | None:
        """(manifest, output) of the stage's finished run with this key, else None (also when its
        recorded output no longer reads as the stage's output type: it runs again)."""
        m = maybe_manifest(self.stage_dir(stage.name))
        if m and m.get("kind") == STAGE_KIND and m.get("stage") == stage.name and m.get("key") == key:
            try:
                return m, stage.read(m.get("outputs", {}))
            except (TypeError, KeyError, AttributeError):
                return None
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
        for i, st in enumerate(PIPELINE):
            stage = st.name
            if i > last:
                break
            if isinstance(st, ServeForValidation):
                continue  # started inside validate; recorded there
            inputs = self._extra(stage)
            key = self._key(stage, inputs)
            self.keys[stage] = key
            self.inputs[stage] = inputs
            reuse = None if i >= first_forced else self._reusable(st, key)
            if reuse is not None:
                manifest, output = reuse
                self.results[stage] = output
                why = f"reused: same recipe, earlier stages and inputs as its run of {manifest.get('created', '?')}"
                records.append(StageRecord(stage, "reused", 0.0, output.to_dict(), why))
                self.stage_log.append({"stage": stage, "status": "reused", "seconds": 0.0,
                                       "ran_seconds": manifest.get("seconds", 0.0)})
                self.on_event(stage, "reused", {**output.to_dict(), "why": why})
                if isinstance(output, Validated):
                    result.verdict = output.verdict
                continue
            why = explain(stage, maybe_manifest(self.stage_dir(stage)) if self.stage_dir(stage).is_dir() else None,
                          inputs=inputs, recipe=recipe_hash(recipe_to_dict(self.recipe)), prev=self._prev(stage),
                          forced_by=start if i >= first_forced else None, stages=STAGES)
            self.on_event(stage, "start", {"why": why, "does": st.describe(self.recipe)})
            t0 = time.perf_counter()
            try:
                output = st.run(self)
            except BaseException as e:
                records.append(StageRecord(stage, "failed", time.perf_counter() - t0, {"error": str(e)}))
                self.stage_log.append({"stage": stage, "status": "failed", "seconds": round(time.perf_counter() - t0, 3)})
                self.on_event(stage, "failed", {"error": str(e)})
                self._invalidate_from(stage)
                raise
            dt = time.perf_counter() - t0
            status = "skipped" if isinstance(output, Skipped) else "done"
            self.results[stage] = output
            outputs = output.to_dict()
            self.stage_log.append({"stage": stage, "status": status, "seconds": round(dt, 3)})
            self._record(stage, key, outputs, dt)
            records.append(StageRecord(stage, status, dt, outputs, why))
            self.on_event(stage, status, {**outputs, "seconds": dt, "why": why})
            if isinstance(output, Validated):
                result.verdict = output.verdict
        reported = self.result(Report)
        if isinstance(reported, Reported):
            result.report_dir = pathlib.Path(reported.dir)
        return result

    def _extra(self, stage: str) -> Any:
        fingerprints = {r: fingerprint(m.model) for r, m in self.models()} if stage == Quantize.name else None
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

    def models(self) -> list[tuple[str, Any]]:
        """(role, the recipe's model section) of the target and the draft, if any."""
        out = [("target", self.recipe.target)]
        if self.recipe.draft_spec is not None:
            out.append(("draft", self.recipe.draft_spec))
        return out

    def model_folders(self) -> "ModelFolders":
        """The target and draft folders later stages use: the quantize stage's exports, else the recipe's."""
        q = self.result(Quantize)
        exports = q.models if isinstance(q, Quantized) else {}
        draft_spec = self.recipe.draft_spec
        return ModelFolders(
            target=exports["target"].dir if "target" in exports else self.recipe.target.model,
            draft=exports["draft"].dir if "draft" in exports else (draft_spec.model if draft_spec else None))

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

# ---------------------------------------------------------------------------------- the stages


def runtime_family(recipe: Recipe) -> str:
    """``torch`` for the torch runtime, ``trtllm`` for every TensorRT-LLM runtime."""
    return "torch" if recipe.runtime.backend == "torch" else "trtllm"


class Stage:
    """One step of ``trtspec run``. ``name`` is its folder under WORKDIR, its ``--from``/``--until``
    name and part of every later stage's cache key (unchanged since the stages were functions);
    ``does`` says what it does on each runtime family (:func:`runtime_family`); ``run`` returns
    its typed output, ``read`` reads a reused stage's output back from its manifest."""

    name: ClassVar[str]
    does: ClassVar[dict[str, str]]
    output: ClassVar[type]

    def __init_subclass__(cls, *, name: str, output: type, does: dict[str, str], **kw):
        super().__init_subclass__(**kw)
        cls.name, cls.output, cls.does = name, output, does

    def describe(self, recipe: Recipe) -> str:
        return self.does[runtime_family(recipe)]

    def run(self, p: "Pipeline") -> StageOutput:
        raise NotImplementedError

    def read(self, d: dict) -> StageOutput:
        if set(d) == {"note"}:
            return Skipped(d["note"])
        return self.output.from_dict(d)


class Check(Stage, name="check", output=Checked,
            does={"torch": "preflight checks of the recipe, models and machine (check.json)",
                  "trtllm": "preflight checks of the recipe, models, machine and TRT-LLM launch plan (check.json)"}):
    def run(self, p: "Pipeline") -> Checked:
        report = run_checks(p.recipe, p.source)
        (p.workdir / "check.json").write_text(json.dumps(report.to_dict(), indent=2) + "\n")
        if not report.ok:
            failed = [c for c in report.checks if c.status == "fail"]
            lines = "\n".join(f"  - {c.name}: {c.detail}" + (f" (fix: {c.fix})" if c.fix else "") for c in failed)
            raise PreflightError(f"preflight failed ({len(failed)} check(s)):\n{lines}",
                                 fix=f"see {p.workdir / 'check.json'}; re-run after fixing (finished stages are reused)")
        return Checked(len(report.checks), sum(c.status == "warn" for c in report.checks), report.plan)


class Quantize(Stage, name="quantize", output=Quantized,
               does={"torch": "ModelOpt post-training quantization of the target / draft the recipe quantizes (torch export)",
                     "trtllm": "nothing: TRT-LLM flows quantize inside their build plan (skipped)"}):
    def run(self, p: "Pipeline") -> Quantized | Skipped:
        if runtime_family(p.recipe) != "torch":
            # TRT-LLM flows quantize inside their build plan (TRT-LLM's quantize.py / ModelOpt HF export)
            return Skipped("quantization runs inside the TRT-LLM build plan")
        models: dict[str, QuantizedModel] = {}
        pair = {"target": p.recipe.draft_spec, "draft": p.recipe.target}
        for role, spec in p.models():
            q = spec.quantization
            if q.format == "none" and q.kv_cache == "none":
                continue
            if q.format == "none":
                raise StageError(f"{role}: kv_cache={q.kv_cache!r} without a weight format is exported for TRT-LLM only",
                                 fix="set quantization.format too, or kv_cache: none for the torch runtime")
            out = p.stage_dir(self.name) / role
            other = pair.get(role)

            def progress(phase: str, step: int, total: int, metrics: dict, role=role) -> None:
                p.on_event(self.name, "progress", {"label": f"quantize: {role} {phase}", "done": step, "total": total})

            res = quantize_model(spec.model, q, "torch", out, role=role, progress=progress,
                                 pair=other.model if other is not None and p.recipe.speculation.method == "draft_target" else None,
                                 gpu_arch=p.recipe.runtime.gpu_arch, threads=p.recipe.runtime.torch_threads)
            models[role] = QuantizedModel(str(res.out_dir), res.format, res.kv_cache, res.quality)
        if not models:
            return Skipped("no model is quantized in this recipe")
        return Quantized(models)


class BuildOrTune(Stage, name="build", output=Tuned,
                  does={"torch": "tune: measure acceptance per draft position on the torch engine, recommend "
                                 "max_draft_len (nothing to compile; skipped for ordinary decoding)",
                        "trtllm": "build the TensorRT-LLM engines / LLM-API plan (trtspec.trtllm.build)"}):
    """``build``: TensorRT-LLM engines for a TRT-LLM runtime; on the torch runtime there is nothing
    to compile, so it measures the draft's acceptance on the torch engine and recommends max_draft_len."""


    def read(self, d: dict) -> StageOutput:
        if "trtllm_manifest" in d:
            return EnginesBuilt.from_dict(d)
        return super().read(d)

    def run(self, p: "Pipeline") -> Tuned | EnginesBuilt | Skipped:
        if runtime_family(p.recipe) != "torch":
            res = build(p.recipe, p.stage_dir(self.name) / "trtllm")
            return EnginesBuilt(res.manifest, len(res.ran), len(res.cached))
        if p.recipe.speculation.method == "none":
            return Skipped("ordinary decoding: nothing to tune")
        models = p.model_folders()
        k_max = max(p.recipe.max_draft_len, 6)
        spec = replace(RuntimeSpec.from_recipe(p.recipe, target=models.target, draft=models.draft), max_draft_len=k_max)
        spec = spec.with_limits(max_batch_size=1).with_runtime(adaptive={"enabled": False})
        engine = build_engine(spec)
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(p.recipe.target.tokenizer or p.recipe.target.model)
        v = p.recipe.validation
        texts = load_prompts(v.prompts, min(v.num_prompts, 6))
        ids = [tok(t, add_special_tokens=False)["input_ids"][: p.recipe.limits.max_input_len] for t in texts]
        res = tune(engine, ids, max_new_tokens=min(v.max_tokens, 48), k_max=k_max, timing_repeats=5)
        out = p.stage_dir(self.name)
        out.mkdir(parents=True, exist_ok=True)
        (out / "tune.json").write_text(json.dumps(res.to_dict(), indent=2) + "\n")
        configured = p.recipe.max_draft_len
        return Tuned(tune=str(out / "tune.json"), recommended_max_draft_len=res.recommended_k,
                     configured_max_draft_len=configured,
                     expected_speedup_at_configured=round(res.rows[configured].expected_speedup, 3),
                     expected_speedup_at_recommended=round(res.rows[res.recommended_k].expected_speedup, 3),
                     per_position_acceptance=[round(a, 3) for a in res.per_position_acceptance],
                     cost_ratio=round(res.cost_ratio, 4))


class Package(Stage, name="package", output=Packaged,
              does={"torch": "render the Triton model repository (torch engine behind the tensorrtllm contract)",
                    "trtllm": "render the Triton model repository around the built engines"}):
    def run(self, p: "Pipeline") -> Packaged:
        models = p.model_folders()
        build_dir = p.stage_dir(BuildOrTune.name) / "trtllm" if runtime_family(p.recipe) != "torch" else None
        repo = p.stage_dir(self.name) / "repository"
        rendered = package(p.recipe, repo, target=models.target, draft=models.draft, build_dir=build_dir, overwrite=True)
        models = getattr(rendered, "models", None)
        return Packaged(str(repo), [getattr(m, "name", str(m)) for m in (models or [])])


class ServeForValidation(Stage, name="serve", output=Skipped,
                         does={"torch": "start tritonserver on the repository, inside validate (recorded there)",
                               "trtllm": "not here: serve inside NVIDIA's Triton TRT-LLM container"}):
    """``serve`` has no run of its own: :class:`Validate` starts tritonserver on the packaged
    repository and stops it when validation ends, so the server lives only as long as it is needed.
    It stays a stage name (--from/--until, the report's stage table, the cache keys' order)."""



class Validate(Stage, name="validate", output=Validated,
               does={"torch": "serve the repository and validate it against the recipe's gates (equivalence, speed, acceptance)",
                     "trtllm": "refused here: validate inside NVIDIA's Triton TRT-LLM container"}):
    def run(self, p: "Pipeline") -> Validated:
        if runtime_family(p.recipe) != "torch":
            raise StageError(
                f"runtime '{p.recipe.runtime.backend}' serves with TensorRT-LLM, which is not installed here",
                fix="run `trtspec run CONFIG --until package` here, then serve and validate inside NVIDIA's "
                    "Triton TRT-LLM container (docs/trtllm.md)")
        repo = p.result(Package).repository
        out = p.stage_dir(self.name)
        p.on_event(ServeForValidation.name, "start", {"repository": repo})
        t0 = time.perf_counter()
        with server_for_repository(repo, workdir=p.workdir / "server", on_progress=p._progress(ServeForValidation.name), **(
                {"ready_timeout": p.ready_timeout_s} if p.ready_timeout_s else {})) as server:
            p.server = server
            ready_s = time.perf_counter() - t0
            p.stage_log.append({"stage": ServeForValidation.name, "status": "done", "seconds": round(ready_s, 3)})
            p.on_event(ServeForValidation.name, "done", {**server.endpoints.to_dict(), "seconds": ready_s})
            try:
                url, client_options = server.client_target()  # TLS and the required header, as served
                result = run_validation(url, p.recipe, progress=p._progress(self.name),
                                        client_options=client_options)
            except TrtspecError as e:
                p._check_alive(server, e)
                raise
            p._check_alive(server)
            metrics = scrape_metrics(server.endpoints.metrics)
        out.mkdir(parents=True, exist_ok=True)
        files = write_validation_report(result, out, max_draft_len=p.recipe.max_draft_len,
                                        min_speedup=p.recipe.validation.gates.min_speedup)
        (out / "server_metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
        v = result.verdict
        return Validated(report=str(out / "report.md"), report_json=str(out / "report.json"), files=files,
                         verdict={"decision": v.decision, "deploy_speculative": v.deploy_speculative,
                                  "decided_by": v.decided_by.name if v.decided_by else None, "reason": v.reason,
                                  "gates": [g.to_dict() for g in v.gates]},
                         speedup=result.speedup, acceptance=result.acceptance)


class Report(Stage, name="report", output=Reported,
             does={"torch": "write the run report (report.md / report.json) from the stages' outputs",
                   "trtllm": "write the run report (report.md / report.json) from the stages' outputs"}):
    def run(self, p: "Pipeline") -> Reported:
        out = p.stage_dir(self.name)
        with atomic_dir(out) as tmp:
            path = write_run_report(p, tmp)
        return Reported(str(out), str(out / pathlib.Path(path).name))


PIPELINE: tuple[Stage, ...] = (Check(), Quantize(), BuildOrTune(), Package(), ServeForValidation(), Validate(), Report())
STAGES = tuple(s.name for s in PIPELINE)
BY_NAME = {s.name: s for s in PIPELINE}


def scrape_metrics(url: str) -> dict[str, float]:
    """The server's Prometheus text as {series: value}: trtspec's, Triton's and TensorRT-LLM's
    families (``trtspec.client.prom.KEEP``), parsed by ``prometheus_client``."""

    return scrape(url)
