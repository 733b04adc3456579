"""genai-perf 0.0.16 (a client trtspec did not write) reads the same speedup trtspec's gate reads.

The tiny pair served by the real tritonserver; trtspec's closed-loop bench measures output
tokens/s of ``ensemble`` against ``ensemble_baseline`` at concurrency 1 in paired ABBA blocks and
gives the ratio's 95 % interval (what ``validation.gates.min_speedup`` reads). genai-perf then
profiles both models on the same server, the same prompts (``--input-file``) and the same
``max_tokens``, in ABBA order too; its speedup (the median of its rounds' output token throughput,
speculative over baseline) must lie inside trtspec's interval, widened by nothing.

Needs genai-perf's own venv (``make test-thirdparty`` makes it: ``.venv-perf``); skipped without it.
"""

from __future__ import annotations

import importlib.util
import pathlib
import statistics

import pytest

from trtspec.client.loadgen import BenchSettings, run_bench
from trtspec.client.types import Sampling
from trtspec.config import parse_recipe
from trtspec.prompts import load_prompts
from trtspec.triton.launch.server import TritonServer
from trtspec.triton.render import package
from tests.conftest import worker_threads

ROOT = pathlib.Path(__file__).resolve().parents[2]
VENV = ROOT / ".venv-perf"
PROMPTS, MAX_TOKENS, REQUESTS, ROUNDS = 8, 48, 16, 4

pytestmark = pytest.mark.skipif(not (VENV / "bin" / "genai-perf").is_file(),
                                reason="genai-perf's venv (.venv-perf) is missing: make test-thirdparty makes it")


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def server(tiny_models, tmp_path_factory):
    target, draft = tiny_models
    recipe = parse_recipe({
        "name": "tiny-genai-perf", "target": {"model": str(target)},
        "speculation": {"method": "draft_target", "draft": {"model": str(draft)}, "max_draft_len": 4},
        "runtime": {"backend": "torch", "dtype": "float32", "device": "cpu", "torch_threads": worker_threads(),
                    "draft_weight_only": "int8"},
        "limits": {"max_batch_size": 4, "max_input_len": 512, "max_seq_len": 1024},
        "serving": {"speculative_fraction": 1.0},
        "validation": {"max_tokens": MAX_TOKENS},
    })
    root = tmp_path_factory.mktemp("genai-perf")
    package(recipe, root / "repo")
    with TritonServer(root / "repo", workdir=root / "server", ready_timeout=240) as s:
        yield s, root


def test_genai_perfs_speedup_lies_inside_trtspecs_interval(server, tiny_target):
    s, root = server
    url = s.endpoints.grpc
    prompts = load_prompts("builtin:code", PROMPTS)
    # trtspec: ABBA blocks of 4 requests per model, 16 per model in all
    settings = BenchSettings(concurrency=(1,), requests=REQUESTS, warmup=2, output_lens=(MAX_TOKENS,),
                             sampling=Sampling(max_tokens=MAX_TOKENS), speculative_model="ensemble",
                             baseline_model="ensemble_baseline", block=4)
    res = run_bench(url, prompts, settings, tokenizer=str(tiny_target))
    iv = res.levels[0].intervals()["output_token_throughput"]
    assert iv.blocks >= 2 and iv.low is not None and iv.low > 0

    gp = _script("bench_genai_perf_export")
    _, env = _script("bench_metric_agreement").perf_analyzer_env(VENV)
    env["PATH"] = f"{VENV / 'bin'}:{env.get('PATH', '')}"
    tok_s: dict[str, list[float]] = {"ensemble": [], "ensemble_baseline": []}
    for i in range(ROUNDS):
        for model in (("ensemble", "ensemble_baseline") if i % 2 == 0 else ("ensemble_baseline", "ensemble")):
            out = gp.run_genai_perf(VENV, env, url, model, str(tiny_target), 1, REQUESTS // ROUNDS * 2, prompts,
                                    MAX_TOKENS, root, f"{model}_r{i}")["json"]
            assert out["output_sequence_length"]["avg"] > 1
            tok_s[model].append(out["output_token_throughput"]["avg"])
    theirs = statistics.median(tok_s["ensemble"]) / statistics.median(tok_s["ensemble_baseline"])
    assert iv.low <= theirs <= iv.high, (
        f"genai-perf's speedup {theirs:.3f} (speculative {tok_s['ensemble']}, baseline {tok_s['ensemble_baseline']} "
        f"tok/s) is outside trtspec's interval {iv.text()}")
