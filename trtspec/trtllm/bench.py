"""``trtspec tune --trtllm``: tune ``max_draft_len`` on the TRT-LLM engine that will serve it.

The torch runtime's ``trtspec tune`` predicts S(k) from measured per-position acceptance and
costs. On a TRT-LLM deployment the only honest number is the engine's own throughput, so this
plans one ``trtllm-bench throughput`` run per draft length (LLM-API / PyTorch flow: the
speculative config, not the engine, carries ``max_draft_len``) plus one without speculation,
and reads their ``--report_json`` reports into the same recommendation table:

    E[tokens/pass] = acceptance length (the report's decoding_stats), 1 for k = 0
    speedup(k)     = output tokens/s at k / output tokens/s at k = 0
    cost/pass      = E[tokens/pass] / speedup(k)   (in ordinary decoding steps)

Plan (:func:`bench_plan`) is pure and golden-tested; :func:`read_report` parses one report.
The report format follows ``tensorrt_llm/bench/dataclasses/reporting.py``
(``ReportUtility.get_statistics_dict``, read at NVIDIA/TensorRT-LLM@024997657505, a 1.x copy):
``performance.system_output_throughput_tok_s``, ``decoding_stats.acceptance_length_percentiles``
and ``draft_acceptance_rate_percentiles`` (each ``{minimum, maximum, average, p50, p90, p95, p99}``),
``request_info.num_requests``, ``engine.version``. The dataset is the JSONL trtllm-bench reads
(``{"task_id", "prompt", "output_tokens"}`` per line), written from the recipe's validation prompts.
Flags: ``trtspec.trtllm.accepted_names.TRTLLM_BENCH_FLAGS`` (``throughput.py``); ``--eos_id -1``
disables EOS, so every run generates the same number of tokens per request, and the YAML given
to ``--extra_llm_api_options`` overrides trtllm-bench's own settings (its KV-cache fraction, batch
size), so each run serves as the recipe's deployment would.
"""

from __future__ import annotations

import copy
import json
import pathlib
from dataclasses import dataclass, field
from typing import Any

from trtspec.config import MTP, Eagle3, Recipe
from trtspec.errors import ConfigError, StageError
from trtspec.acceptance import TuneRow
from trtspec.trtllm import llmapi
from trtspec.trtllm.plan import make_plan
from trtspec.trtllm.runner import run_command

TUNE_DIR = "tune"
DATASET = "dataset.jsonl"
DEFAULT_DRAFT_LENS = (1, 2, 3, 4, 6, 8)
METHODS = ("draft_target", "eagle3", "ngram", "mtp")


@dataclass(frozen=True)
class BenchRun:
    k: int  # max_draft_len; 0 = no speculation (the baseline)
    options_path: str
    report_path: str
    argv: tuple[str, ...]


@dataclass(frozen=True)
class BenchPlan:
    recipe_name: str
    out_dir: str
    files: dict[str, str]  # path → text (dataset, one extra_llm_api_options YAML per run)
    runs: tuple[BenchRun, ...]
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"recipe": self.recipe_name, "out_dir": self.out_dir, "files": dict(self.files),
                "runs": [{"k": r.k, "options": r.options_path, "report": r.report_path, "argv": list(r.argv)}
                         for r in self.runs], "notes": list(self.notes)}

    def describe(self) -> str:
        import shlex

        lines = [f"trtllm-bench plan: {self.recipe_name}  ({len(self.runs)} runs: max_draft_len "
                 f"{', '.join(str(r.k) for r in self.runs)}; 0 = no speculation)", f"output: {self.out_dir}", ""]
        for r in self.runs:
            lines += [f"run k={r.k}  report {r.report_path}", f"  $ {shlex.join(r.argv)}", ""]
        lines.append("files:")
        for path, text in self.files.items():
            body = text.rstrip("\n").splitlines()
            lines.append(f"  {path}  ({len(body)} lines)")
            if path.endswith(".yaml"):
                lines += [f"    | {ln}" for ln in body]
        if self.notes:
            lines += ["", "notes:"] + [f"  - {n}" for n in self.notes]
        return "\n".join(lines) + "\n"


def _with_draft_len(options: dict[str, Any], recipe: Recipe, k: int) -> dict[str, Any]:
    opts = copy.deepcopy(options)
    if k == 0:
        opts.pop("speculative_config", None)
        opts.pop("disable_overlap_scheduler", None)
        return opts
    sc = opts["speculative_config"]
    s = recipe.speculation
    if isinstance(s, MTP):
        sc["num_nextn_predict_layers"] = k
    else:
        sc["max_draft_len"] = k
    if isinstance(s, Eagle3) and s.use_dynamic_tree:
        sc["max_total_draft_tokens"] = s.dynamic_tree_max_top_k * k  # the tree's upper bound at this depth
    return opts


def bench_plan(
    recipe: Recipe,
    out_dir: str | pathlib.Path,
    *,
    build_dir: str | pathlib.Path,
    prompts: list[str],
    draft_lens: tuple[int, ...] | list[int] | None = None,
    num_requests: int | None = None,
    concurrency: int | None = None,
) -> BenchPlan:
    """trtllm-bench runs over ``draft_lens`` (and 0) for a ``trtllm-pytorch`` recipe. Pure.

    ``build_dir``: where ``trtspec build`` writes (the quantized exports the runs load);
    ``prompts``: the request texts (the recipe's validation prompts); ``num_requests`` /
    ``concurrency`` default to the recipe's ``validation.requests_per_level`` and its first
    concurrency level (the one the rollout gate is measured at)."""

    s = recipe.speculation
    if recipe.runtime.backend != "trtllm-pytorch":
        raise ConfigError("runtime.backend", recipe.runtime.backend,
                          "tune --trtllm varies max_draft_len in the LLM-API speculative_config (PyTorch flow); an "
                          "engine-flow engine has max_draft_len built in",
                          fix="use a runtime.backend: trtllm-pytorch recipe, or rebuild engines per max_draft_len")
    if s.method not in METHODS:
        raise ConfigError("speculation.method", s.method, "has no max_draft_len to tune on the PyTorch flow",
                          fix=f"use one of: {', '.join(METHODS)}")
    if not prompts:
        raise ConfigError("validation.prompts", recipe.validation.prompts, "no prompts", fix="name a prompt set")
    ks = sorted(set(draft_lens or (*DEFAULT_DRAFT_LENS, recipe.max_draft_len)))
    if any(k < 1 or k > 32 for k in ks):
        raise ConfigError("--k-values", ",".join(map(str, ks)), "draft lengths must be 1..32", fix="e.g. 1,2,3,4,6,8")
    if isinstance(s, MTP) and max(ks) > 8:
        raise ConfigError("--k-values", ",".join(map(str, ks)), "MTP has at most 8 next-token layers here",
                          fix="use values 1..8")
    out = pathlib.Path(out_dir)
    plan = make_plan(recipe, pathlib.Path(build_dir))
    options = plan.handoff.llm_api
    model_path = options["model"]
    model_name = recipe.target.model  # the hub id or folder: trtllm-bench's name for tokenizer and config
    n = num_requests or recipe.validation.requests_per_level
    conc = concurrency or recipe.validation.concurrency[0]
    ds_path = str(out / DATASET)
    dataset = "".join(json.dumps({"task_id": i, "prompt": prompts[i % len(prompts)],
                                  "output_tokens": recipe.validation.max_tokens}) + "\n" for i in range(n))
    files = {ds_path: dataset}
    runs = []
    for k in [0, *ks]:
        opts = llmapi.extra_options(_with_draft_len(options, recipe, k))
        opts_path = str(out / f"k{k}_llm_api_options.yaml")
        report = str(out / f"k{k}_report.json")
        files[opts_path] = llmapi.to_yaml(opts)
        argv = ["trtllm-bench", "--model", model_name, "--model_path", model_path, "throughput",
                "--dataset", ds_path, "--backend", "pytorch", "--extra_llm_api_options", opts_path,
                "--num_requests", str(n), "--concurrency", str(conc),
                # every request generates output_tokens: the runs do the same work
                "--eos_id", "-1"]
        if recipe.limits.tensor_parallel_size > 1:
            argv += ["--tp", str(recipe.limits.tensor_parallel_size)]
        if recipe.limits.pipeline_parallel_size > 1:
            argv += ["--pp", str(recipe.limits.pipeline_parallel_size)]
        argv += ["--report_json", report]
        runs.append(BenchRun(k, opts_path, report, tuple(argv)))
    notes = [f"model {model_path}: the export `trtspec build` writes under {build_dir} (run it first)"
             if model_path != recipe.target.model else f"model {model_path}",
             f"{n} requests at concurrency {conc}, {recipe.validation.max_tokens} output tokens each, prompts "
             f"{recipe.validation.prompts}"]
    return BenchPlan(recipe.name, str(out), files, tuple(runs), tuple(notes))


# --------------------------------------------------------------------------------------------
# reports


@dataclass(frozen=True)
class BenchPoint:
    k: int
    output_tok_s: float
    acceptance_length: float | None  # tokens per target pass (decoding_stats), None without speculation
    draft_acceptance_rate: float | None
    num_requests: int | None
    version: str | None


def _number(d: dict, *keys: str, where: str) -> float:
    node: Any = d
    for key in keys:
        if not isinstance(node, dict) or key not in node:
            raise StageError(f"{where}: no {'.'.join(keys)} (not a trtllm-bench --report_json report?)",
                             fix="point at the file trtllm-bench wrote with --report_json")
        node = node[key]
    if not isinstance(node, (int, float)) or isinstance(node, bool):
        raise StageError(f"{where}: {'.'.join(keys)} is {node!r}, not a number",
                         fix="point at the file trtllm-bench wrote with --report_json")
    return float(node)


def read_report(path: str | pathlib.Path, k: int) -> BenchPoint:
    """One trtllm-bench ``--report_json`` report (see the module docstring for the fields)."""
    p = pathlib.Path(path)
    if not p.is_file():
        raise StageError(f"trtllm-bench report {p} not found (run k={k} has not run?)",
                         fix="run the planned trtllm-bench commands (trtspec tune --trtllm RECIPE), or pass the "
                             "folder they wrote with --bench-dir")
    try:
        data = json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise StageError(f"{p}: not JSON ({e.msg})", fix="point at trtllm-bench's --report_json file") from None
    tok_s = _number(data, "performance", "system_output_throughput_tok_s", where=str(p))
    al = rate = None
    dec = data.get("decoding_stats")
    if k > 0:
        if not isinstance(dec, dict) or not dec.get("acceptance_length_percentiles"):
            raise StageError(f"{p}: run k={k} has no decoding_stats.acceptance_length_percentiles: speculation "
                             "was not on", fix="check that the run's extra_llm_api_options has speculative_config")
        al = _number(dec, "acceptance_length_percentiles", "average", where=str(p))
        if dec.get("draft_acceptance_rate_percentiles"):
            rate = _number(dec, "draft_acceptance_rate_percentiles", "average", where=str(p))
    info = data.get("request_info") or {}
    return BenchPoint(k, tok_s, al, rate, info.get("num_requests"), (data.get("engine") or {}).get("version"))


@dataclass
class TrtllmTuneResult:
    points: list[BenchPoint]
    rows: list[TuneRow] = field(default_factory=list)
    recommended_k: int = 0
    baseline_tok_s: float = 0.0

    def to_dict(self) -> dict:
        from dataclasses import asdict

        return asdict(self)


def recommend(points: list[BenchPoint]) -> TrtllmTuneResult:
    """The recommendation table from measured runs (k = 0 is the baseline)."""
    base = [p for p in points if p.k == 0]
    if not base:
        raise StageError("no k=0 (no speculation) report: speedup needs the baseline run",
                         fix="keep the k=0 run of the plan")
    b = base[0].output_tok_s
    if b <= 0:
        raise StageError(f"the baseline run measured {b} output tokens/s", fix="re-run it")
    rows = []
    for p in sorted(points, key=lambda p: p.k):
        tokens = 1.0 if p.k == 0 else p.acceptance_length
        speedup = p.output_tok_s / b
        rows.append(TuneRow(p.k, tokens, tokens / speedup if speedup > 0 else float("inf"), speedup))
    best = max(rows, key=lambda r: r.expected_speedup)
    return TrtllmTuneResult(sorted(points, key=lambda p: p.k), rows, best.k, b)


def read_reports(plan: BenchPlan) -> TrtllmTuneResult:
    return recommend([read_report(r.report_path, r.k) for r in plan.runs])


def run_bench(plan: BenchPlan, *, env=None, on_command=None) -> None:
    """Write the plan's files and run each trtllm-bench command whose report is not there yet
    (checked runner: a failure raises ``CommandError`` with the stderr tail)."""
    import shutil


    todo = [r for r in plan.runs if not pathlib.Path(r.report_path).is_file()]
    if todo and shutil.which("trtllm-bench", path=(env or {}).get("PATH")) is None:
        raise StageError("trtllm-bench is not on PATH: the runs need TensorRT-LLM and a GPU",
                         fix="run inside the TensorRT-LLM container (docs/trtllm.md), or print the plan with "
                             "trtspec tune --trtllm RECIPE --dry-run")
    out = pathlib.Path(plan.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for path, text in plan.files.items():
        pathlib.Path(path).write_text(text)
    for r in todo:
        if on_command:
            on_command(r.argv)
        run_command(r.argv, log_path=out / f"k{r.k}.log", env=env)
