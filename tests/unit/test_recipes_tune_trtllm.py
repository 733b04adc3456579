"""`trtspec tune --trtllm` (issue 22): the trtllm-bench plan over max_draft_len (golden), the report
parser on report files written here in trtllm-bench's documented --report_json format
(tensorrt_llm/bench/dataclasses/reporting.py, ReportUtility.get_statistics_dict), and the
recommendation table. Regenerate the goldens with TRTSPEC_UPDATE_GOLDEN=1 and review the diff.
"""

from __future__ import annotations

import copy
import json
import os
import pathlib

import pytest
import yaml
from click.testing import CliRunner

from trtspec.config import load_recipe, parse_recipe
from trtspec.errors import ConfigError, StageError
from trtspec.trtllm import accepted_names as A
from trtspec.trtllm.bench import bench_plan, read_report, read_reports, recommend, run_bench
from tests.goldens import check_golden

REPO = pathlib.Path(__file__).resolve().parents[2]
GOLDEN = REPO / "tests" / "golden" / "recipes"
R8B = REPO / "build_configs" / "llama3.1-8b-eagle3-fp8-trtllm.yaml"


def _golden(name: str, text: str) -> None:
    check_golden(GOLDEN / name, text)


def _plan(recipe=None, **kw):
    recipe = recipe or load_recipe(R8B)
    kw.setdefault("prompts", ["Tell me about the sea.", "Write a haiku about GPUs."])
    return bench_plan(recipe, "/build/r/tune", build_dir="/build/r", draft_lens=kw.pop("draft_lens", [1, 2, 4]), **kw)


def test_plan_for_the_eagle3_recipe_matches_golden_and_uses_only_trtllm_bench_flags():
    plan = _plan()
    assert [r.k for r in plan.runs] == [0, 1, 2, 4]
    _golden("llama3.1-8b-eagle3-tune-trtllm.json", json.dumps(plan.to_dict(), indent=2) + "\n")
    for r in plan.runs:
        argv = list(r.argv)
        sub = argv.index("throughput")
        assert argv[0] == "trtllm-bench"
        assert {a for a in argv[1:sub] if a.startswith("--")} <= A.TRTLLM_BENCH_GLOBAL_FLAGS
        assert {a for a in argv[sub + 1:] if a.startswith("--")} <= A.TRTLLM_BENCH_THROUGHPUT_FLAGS
        opts = yaml.safe_load(plan.files[r.options_path])
        assert A.check_llm_api(opts) == []
        assert opts["cuda_graph_config"] == {"enable_padding": True, "max_batch_size": 32}  # the passthrough too
        sc = opts.get("speculative_config")
        if r.k == 0:
            assert sc is None and "disable_overlap_scheduler" not in opts
        else:
            assert sc["decoding_type"] == "Eagle" and sc["max_draft_len"] == r.k
            assert sc["speculative_model_dir"] == "/workspace/models/EAGLE3-LLaMA3.1-Instruct-8B"
    # the quantized export the build writes, with the deployment's KV-cache share
    assert plan.runs[0].argv[plan.runs[0].argv.index("--model_path") + 1] == "/build/r/target-quant"
    rows = [json.loads(x) for x in plan.files["/build/r/tune/dataset.jsonl"].splitlines()]
    assert len(rows) == 64 and rows[0] == {"task_id": 0, "prompt": "Tell me about the sea.", "output_tokens": 256}


def test_mtp_varies_num_nextn_predict_layers_and_tp_reaches_trtllm_bench():
    d = {"name": "mtp", "target": {"model": "org/DeepSeek-V3-Lite"}, "speculation": {"method": "mtp"},
         "runtime": {"backend": "trtllm-pytorch", "device": "cuda"},
         "limits": {"tensor_parallel_size": 2}}
    plan = _plan(parse_recipe(d), draft_lens=[1, 3])
    opts = yaml.safe_load(plan.files[plan.runs[2].options_path])
    assert opts["speculative_config"]["num_nextn_predict_layers"] == 3
    argv = list(plan.runs[1].argv)
    assert argv[argv.index("--tp") + 1] == "2" and argv[argv.index("--model") + 1] == "org/DeepSeek-V3-Lite"


@pytest.mark.parametrize("over,field", [
    ({"runtime": {"backend": "trtllm-engine", "device": "cuda", "trtllm": {"model_family": "llama"}},
      "speculation": {"method": "draft_target", "draft": {"model": "/m/d"}}}, "runtime.backend"),
    ({"speculation": {"method": "none"}}, "speculation.method"),
])
def test_what_cannot_be_tuned_on_the_pytorch_flow_is_refused_naming_the_field(over, field):
    d = {"name": "x", "target": {"model": "/m/t"}, "speculation": {"method": "ngram"},
         "runtime": {"backend": "trtllm-pytorch", "device": "cuda"}}
    d.update(copy.deepcopy(over))
    with pytest.raises(ConfigError) as e:
        _plan(parse_recipe(d))
    assert e.value.field == field


# --------------------------------------------------------------------------------------------
# reports


def _percentiles(avg: float) -> dict:
    return {"p50": avg, "p90": avg * 1.1, "p95": avg * 1.15, "p99": avg * 1.2, "minimum": avg * 0.5,
            "maximum": avg * 1.3, "average": avg}


def _report(path: pathlib.Path, *, tok_s: float, k: int, al: float | None = None, mode: str = "Eagle3") -> None:
    """A report laid out as trtllm-bench's ReportUtility.get_statistics_dict writes it."""
    data = {
        "engine": {"model": "meta-llama/Llama-3.1-8B-Instruct", "model_path": "/build/r/target-quant",
                   "engine_dir": "None", "version": "1.2.1", "backend": "Pytorch", "dtype": "bfloat16",
                   "kv_cache_dtype": "FP8", "quantization": "FP8"},
        "machine": {"name": "NVIDIA H200", "memory.total": 139.8, "clocks.mem": 3.2},
        "world_info": {"tp_size": 1, "pp_size": 1, "ep_size": 1, "world_size": 1, "max_batch_size": 32,
                       "max_num_tokens": 8192, "scheduling_policy": "GUARANTEED_NO_EVICT",
                       "kv_cache_percentage": 0.85, "issue_rate": 1.0e9},
        "request_info": {"num_requests": 64, "avg_num_concurrent_requests": 1.0, "avg_input_length": 40.0,
                         "avg_output_length": 256.0},
        "performance": {"total_latency_ms": 64 * 256 / tok_s * 1e3, "avg_request_latency_ms": 256 / tok_s * 1e3,
                        "request_throughput_req_s": tok_s / 256, "system_output_throughput_tok_s": tok_s,
                        "system_total_throughput_tok_s": tok_s * 1.15, "output_throughput_per_user_tok_s": tok_s,
                        "output_throughput_per_gpu_tok_s": tok_s,
                        "request_latency_percentiles_ms": _percentiles(256 / tok_s * 1e3)},
        "dataset": {"avg_isl": 40, "avg_osl": 256, "max_isl": 60, "max_osl": 256, "num_requests": 64},
    }
    if k > 0:
        data["decoding_stats"] = {
            "mode": mode,
            "num_draft_tokens_percentiles": _percentiles(k * 256 / al),
            "num_accepted_draft_tokens_percentiles": _percentiles(256 - 256 / al),
            "draft_acceptance_rate_percentiles": _percentiles((al - 1) / k),
            "acceptance_length_percentiles": _percentiles(al),
        }
    path.write_text(json.dumps(data, indent=2))


def test_reports_become_the_recommendation_table(tmp_path):
    # throughput and acceptance length per k, as a GPU run might report them (not measured here)
    measured = {0: (100.0, None), 1: (150.0, 1.8), 2: (190.0, 2.5), 4: (170.0, 3.1)}
    for k, (tok_s, al) in measured.items():
        _report(tmp_path / f"k{k}_report.json", tok_s=tok_s, k=k, al=al)
    points = [read_report(tmp_path / f"k{k}_report.json", k) for k in measured]
    assert points[2].acceptance_length == 2.5 and points[2].draft_acceptance_rate == pytest.approx(0.75)
    assert points[0].acceptance_length is None and points[0].version == "1.2.1"
    res = recommend(points)
    assert res.recommended_k == 2 and res.baseline_tok_s == 100.0
    by_k = {r.k: r for r in res.rows}
    assert by_k[0].expected_speedup == 1.0 and by_k[0].expected_tokens_per_pass == 1.0
    assert by_k[4].expected_speedup == pytest.approx(1.7) and by_k[4].expected_tokens_per_pass == 3.1
    assert by_k[2].cost_per_pass == pytest.approx(2.5 / 1.9)  # tokens per pass / speedup


def test_report_problems_are_clear(tmp_path):
    with pytest.raises(StageError, match="not found"):
        read_report(tmp_path / "k1_report.json", 1)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"performance": {"output_tokens": 3}}))
    with pytest.raises(StageError, match=r"no performance\.system_output_throughput_tok_s"):
        read_report(bad, 0)
    _report(bad, tok_s=120.0, k=0)  # a run without speculation given as k=3
    with pytest.raises(StageError, match="speculation was not on"):
        read_report(bad, 3)
    _report(tmp_path / "k1.json", tok_s=150.0, k=1, al=1.8)
    with pytest.raises(StageError, match="no k=0"):
        recommend([read_report(tmp_path / "k1.json", 1)])


def test_cli_dry_run_prints_the_plan_and_writes_nothing(tmp_path):
    from trtspec.cli import main

    bench = tmp_path / "tune"
    res = CliRunner().invoke(main, ["tune", "--trtllm", str(R8B), "--dry-run", "--k-values", "1,3",
                                    "--build-dir", str(tmp_path / "b"), "--bench-dir", str(bench)])
    assert res.exit_code == 0, res.output
    assert "trtllm-bench plan: llama3.1-8b-eagle3-fp8  (3 runs: max_draft_len 0, 1, 3" in res.output
    assert f"--report_json {bench}/k3_report.json" in res.output and not bench.exists()
    res = CliRunner().invoke(main, ["tune", "--dry-run"])
    assert res.exit_code == 2 and "--trtllm" in res.output


def test_cli_reads_reports_into_the_table_when_they_are_there(tmp_path):
    """With every report present nothing is run (no trtllm-bench here): the table is printed."""
    from trtspec.cli import main

    bench = tmp_path / "tune"
    bench.mkdir()
    for k, tok_s, al in ((0, 80.0, None), (1, 120.0, 1.7), (3, 110.0, 2.2)):
        _report(bench / f"k{k}_report.json", tok_s=tok_s, k=k, al=al)
    res = CliRunner().invoke(main, ["tune", "--trtllm", str(R8B), "--k-values", "1,3", "--build-dir",
                                    str(tmp_path / "b"), "--bench-dir", str(bench)], env={"COLUMNS": "160"})
    assert res.exit_code == 0, res.output
    assert "recommended max_draft_len: 1" in res.output and "1.50×" in res.output
    assert (bench / "k1_llm_api_options.yaml").is_file()  # the files the runs used are written beside them
    (bench / "k3_report.json").unlink()
    res = CliRunner().invoke(main, ["tune", "--trtllm", str(R8B), "--k-values", "1,3", "--build-dir",
                                    str(tmp_path / "b"), "--bench-dir", str(bench)], env={"PATH": str(tmp_path)})
    assert res.exit_code != 0 and "trtllm-bench is not on PATH" in res.output


def test_run_bench_runs_only_missing_reports_through_the_checked_runner(tmp_path):
    """A stand-in trtllm-bench on PATH (a script writing a report): the runner passes it the
    planned argv and a failing run is an error with its stderr."""
    plan = bench_plan(load_recipe(R8B), tmp_path / "tune", build_dir=tmp_path / "b", prompts=["hi"], draft_lens=[2])
    tool = tmp_path / "bin" / "trtllm-bench"
    tool.parent.mkdir()
    tool.write_text("#!/usr/bin/env python3\nimport json, sys\nargs = sys.argv\n"
                    "out = args[args.index('--report_json') + 1]\n"
                    "k = 0 if 'k0_' in out else 2\n"
                    "d = {'performance': {'system_output_throughput_tok_s': 100.0 + 20 * k}}\n"
                    "if k: d['decoding_stats'] = {'acceptance_length_percentiles': {'average': 2.0}}\n"
                    "json.dump(d, open(out, 'w'))\n")
    tool.chmod(0o755)
    env = {**os.environ, "PATH": f"{tool.parent}:{os.environ['PATH']}"}
    seen = []
    run_bench(plan, env=env, on_command=seen.append)
    assert [a[a.index("--report_json") + 1] for a in seen] == [r.report_path for r in plan.runs]
    res = read_reports(plan)
    assert res.recommended_k == 2 and res.rows[1].expected_speedup == pytest.approx(1.4)
    seen.clear()
    run_bench(plan, env=env, on_command=seen.append)
    assert seen == []  # reports there: nothing runs again
    tool.write_text("#!/usr/bin/env python3\nimport sys\nprint('CUDA out of memory', file=sys.stderr)\nsys.exit(3)\n")
    (tmp_path / "tune" / "k2_report.json").unlink()
    from trtspec.errors import CommandError

    with pytest.raises(CommandError, match="CUDA out of memory"):
        run_bench(plan, env=env)
