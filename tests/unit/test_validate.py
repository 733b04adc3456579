"""Equivalence, the sampled check's statistics, gates → verdict, the validation report (no server)."""

from __future__ import annotations

import collections
import json
import random

import pytest
from click.testing import CliRunner

from trtspec.cli import main
from trtspec.client.types import Chunk, GenerationResult
from trtspec.config import Gates
from trtspec.validate.distribution import chi2_sf, chi_square_homogeneity, pool_rare, pooled_total_variation, total_variation
from trtspec.validate.equivalence import (
    EquivalenceResult,
    PositionTest,
    SampledResult,
    compare,
    edit_distance,
    first_divergence,
)
from trtspec.client.intervals import ratio_interval
from trtspec.validate.gates import DEPLOY, KEEP, evaluate


@pytest.mark.parametrize("a, b, want", [
    ([1, 2, 3], [1, 2, 3], None), ([1, 2, 3], [1, 9, 3], 1), ([5], [6], 0),
    ([1, 2], [1, 2, 3], 2),  # one stopped early: they diverge where it stopped
    ([], [], None), ([], [4], 0),
])
def test_first_divergence(a, b, want):
    assert first_divergence(a, b) == want


@pytest.mark.parametrize("a, b, want", [
    ("kitten", "sitting", 3), ([1, 2, 3], [1, 2, 3], 0), ([], [1, 2], 2), ([1, 2, 3, 4], [1, 3, 4], 1),
])
def test_edit_distance(a, b, want):
    assert edit_distance(list(a), list(b)) == want


def _gen(ids, text=None):
    return GenerationResult(model="m", request_id="r", text=text if text is not None else " ".join(map(str, ids)),
                            token_ids=ids, chunks=[Chunk(0.1, "x", len(ids) if ids else None)], sent_at=0.0, end_s=0.1)


def test_compare_tolerance_semantics():
    base = _gen([1, 2, 3, 4, 5, 6])
    assert compare(0, "p", base, _gen([1, 2, 3, 4, 5, 6]), 0).passed
    late = _gen([1, 2, 3, 4, 9, 9])
    assert not compare(0, "p", base, late, 0).passed  # exact: any difference fails
    assert compare(0, "p", base, late, 4).passed  # the first 4 tokens agree
    assert not compare(0, "p", base, late, 5).passed
    c = compare(3, "p", base, late, 4)
    assert c.first_divergence == 4 and c.edit_distance == 2 and not c.exact
    d = c.to_dict()
    assert d["first_divergence"] == 4 and d["context"]["baseline"] and d["context"]["speculative"]
    # no ids from the server and no tokenizer: compared as characters
    t = compare(0, "p", _gen(None, "hello world"), _gen(None, "hello there"), 0)
    assert t.first_divergence == 6 and t.context()["common_tail"] == "hello "


def test_equivalence_rates():
    eq = EquivalenceResult(tolerance=0, max_tokens=6, concurrency=2, unit="tokens")
    base = _gen([1, 2, 3])
    eq.prompts = [compare(i, "p", base, _gen(ids), 0) for i, ids in enumerate([[1, 2, 3], [1, 2, 3], [1, 5, 3], [1, 2, 3]])]
    assert eq.exact_match_rate == 0.75 and eq.mismatch_rate == 0.25
    assert eq.to_dict()["earliest_divergence"] == 1


def test_chi2_sf_known_values():
    # values of scipy.stats.chi2.sf
    assert chi2_sf(3.84, 1) == pytest.approx(0.0500435212, rel=1e-8)
    assert chi2_sf(10, 3) == pytest.approx(0.0185661355, rel=1e-8)
    assert chi2_sf(50, 20) == pytest.approx(2.2147663825e-4, rel=1e-8)
    assert chi2_sf(200, 5) == pytest.approx(2.8406228986e-41, rel=1e-6)
    assert chi2_sf(0, 3) == 1.0 and chi2_sf(5, 0) == 1.0


def _draw(rng, probs, n):
    return collections.Counter(rng.choices(range(len(probs)), weights=probs, k=n))


def test_homogeneity_test_is_calibrated_and_has_power():
    rng = random.Random(0)
    p = [0.4, 0.25, 0.15, 0.1, 0.05, 0.05]
    q = [0.25, 0.25, 0.2, 0.15, 0.1, 0.05]  # total variation 0.15 from p
    same = [chi_square_homogeneity(_draw(rng, p, 300), _draw(rng, p, 300))[2] for _ in range(200)]
    assert 0.02 <= sum(x < 0.05 for x in same) / len(same) <= 0.09  # false alarms ≈ 5 % at alpha 0.05
    diff = [chi_square_homogeneity(_draw(rng, p, 300), _draw(rng, q, 300))[2] for _ in range(50)]
    assert sum(x < 1e-3 for x in diff) / len(diff) >= 0.8


def test_rare_categories_are_pooled():
    a = collections.Counter({0: 50, 1: 40, 2: 1, 3: 1})
    b = collections.Counter({0: 45, 1: 45, 4: 2})
    ra, rb = pool_rare(a, b)
    assert len(ra) == 3 and ra[-1] == 2 and rb[-1] == 2  # "other" holds 2, 3 and 4
    assert total_variation(a, b) > pooled_total_variation(a, b)
    x2, dof, pv, k = chi_square_homogeneity(collections.Counter({7: 30}), collections.Counter({7: 30}))
    assert (dof, pv, k) == (0, 1.0, 1)


def _sampled(ps, positions=(1,)):
    s = SampledResult(samples=100, length=3, alpha=1e-3, sampling={"temperature": 1.0})
    s.tests = [PositionTest(0, pos, 100, 100, 4, 1.0, 3, p, 0.05, [], []) for p in ps for pos in positions]
    return s


def test_sampled_result_bonferroni_and_inconclusive():
    assert _sampled([0.5, 0.01]).passed  # 0.01 > 1e-3 / 2
    assert not _sampled([0.5, 1e-4]).passed
    only_prefill = _sampled([0.9], positions=(0,))
    assert not only_prefill.conclusive and not only_prefill.passed  # nothing speculated was tested


def test_gates_verdict():
    g = Gates(min_speedup=1.1, at_concurrency=1, max_mismatch_rate=0.0, min_acceptance_rate=0.3)
    ok = dict(mismatch_rate=0.0, exact_match_rate=1.0, tolerance=0, speedup=ratio_interval([1.5, 1.5]),
              acceptance_rate=0.6, acceptance_source="server counters")
    v = evaluate(g, **ok)
    assert v.deploy_speculative and v.decision == DEPLOY and [x.name for x in v.gates] == [
        "greedy equivalence", "speedup", "acceptance"]
    for change, failed in [({"mismatch_rate": 0.1}, "greedy equivalence"),
                           ({"speedup": ratio_interval([1.05, 1.06])}, "speedup"),
                           ({"speedup": ratio_interval([1.0, 1.4])}, "speedup"),  # 1.18x, its lower bound 0.14
                           ({"acceptance_rate": 0.2}, "acceptance"), ({"speedup": None}, "speedup"),
                           ({"acceptance_rate": None}, "acceptance")]:
        v = evaluate(g, **{**ok, **change})
        assert v.decision == KEEP and [x.name for x in v.failed] == [failed]
    v = evaluate(g, **ok, sampled=_sampled([1e-6]))
    assert [x.name for x in v.failed] == ["sampled distribution"] and "alpha" in v.failed[0].detail
    assert json.dumps(v.to_dict())


def test_validation_report(tmp_path):
    from tests.serving.test_bench import synthetic_bench

    from trtspec.validate.report import write_validation_report
    from trtspec.validate.run import ValidationResult, acceptance_from

    bench = synthetic_bench(levels=(1, 2))
    eq = EquivalenceResult(tolerance=2, max_tokens=6, concurrency=2, unit="tokens")
    base = _gen([1, 2, 3, 4, 5, 6])
    eq.prompts = [compare(0, "p", base, _gen([1, 2, 3, 4, 5, 6]), 2), compare(1, "q", base, _gen([1, 2, 3, 7, 7, 7]), 2),
                  compare(2, "r", base, _gen([9, 2, 3]), 2)]
    acc = acceptance_from(bench.records("speculative"), 4)
    g = Gates(min_speedup=0.5, min_acceptance_rate=0.1)
    verdict = evaluate(g, mismatch_rate=eq.mismatch_rate, exact_match_rate=eq.exact_match_rate, tolerance=2,
                       speedup=ratio_interval([bench.speedup(1)] * 2), acceptance_rate=acc["gate_value"],
                       acceptance_source=acc["source"],
                       sampled=_sampled([0.4]))
    res = ValidationResult(recipe="tiny", url="h:1", models={"speculative": "ensemble", "baseline": "ensemble_baseline"},
                           equivalence=eq, sampled=_sampled([0.4]), sampled_note=None, bench=bench, acceptance=acc,
                           speedup=bench.speedup(1), at_concurrency=1, verdict=verdict, started="t", wall_s=1.0)
    assert res.exit_code == 1  # prompt 2 diverges at token 0, before the tolerance
    files = write_validation_report(res, tmp_path, max_draft_len=4, min_speedup=1.1)
    assert "equivalence.png" in files.values() and (tmp_path / "equivalence.png").stat().st_size > 5000
    d = json.loads((tmp_path / "report.json").read_text())
    assert d["verdict"]["decision"] == KEEP and d["verdict"]["failed"] == ["greedy equivalence"]
    assert [p["first_divergence"] for p in d["equivalence"]["per_prompt"]] == [None, 3, 0]
    md = (tmp_path / "report.md").read_text()
    assert "## Verdict: **keep baseline** (exit 1)" in md
    assert "| 1 | pass (within tolerance) | 3 |" in md and "| 2 | **differs** | 0 |" in md
    assert "### Summary by concurrency" in md and "![Speedup by output length](speedup_by_output_len.png)" in md


def test_acceptance_falls_back_to_the_chunk_proxy():
    from tests.serving.test_bench import rec

    from trtspec.validate.run import acceptance_from

    records = [rec([0.1, 0.2, 0.3], [1, 3, 3])]  # no server counters
    a = acceptance_from(records, 4)
    assert a["gate_value"] == pytest.approx((3 - 1) / 4) and "chunk proxy" in a["source"]
    assert acceptance_from(records, None)["gate_value"] is None


def test_validate_cli_bad_recipe_and_unreachable(tmp_path, repo_root):
    bad = tmp_path / "r.yaml"
    bad.write_text("name: x\nvalidation: {gates: {min_speedup: fast}}\n")
    r = CliRunner().invoke(main, ["validate", "--url", "127.0.0.1:1", str(bad), "-o", str(tmp_path / "o")])
    assert r.exit_code == 2 and "Traceback" not in r.output
    from trtspec.triton.launch.server import free_port

    recipe = repo_root / "build_configs" / "tiny-cpu-draft-target.yaml"
    r = CliRunner().invoke(main, ["validate", "--url", f"127.0.0.1:{free_port()}", "--ready-timeout", "0.3",
                                  str(recipe), "-o", str(tmp_path / "o")])
    assert r.exit_code == 4 and "no Triton server is reachable" in r.output and "Traceback" not in r.output
