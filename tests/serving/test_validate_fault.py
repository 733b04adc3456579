"""A deliberately wrong deployment is caught: the speculative engine is served with a verifier
that accepts every draft token (``RuntimeSpec.extra["fault_injection"] = "accept_all"``, the
fault-injection switch of trtspec.speculative.faults). `trtspec validate` must see the greedy
outputs diverge from ordinary decoding, show where, and exit 1 (keep the baseline)."""

from __future__ import annotations

import json

import pytest
import yaml
from click.testing import CliRunner
from tests.serving.test_triton_serving import render_with_fault
from tests.serving.test_validate_server import tiny_recipe

from trtspec.cli import main
from trtspec.config import parse_recipe
from trtspec.triton.launch.server import TritonServer


@pytest.fixture(scope="module")
def faulty_url(tiny_models, tmp_path_factory):
    root = tmp_path_factory.mktemp("validate-fault")
    render_with_fault(parse_recipe(tiny_recipe(*tiny_models)), root / "repo", "accept_all")
    with TritonServer(root / "repo", workdir=root / "server", ready_timeout=240) as s:
        yield s.endpoints.grpc


def test_validate_catches_a_verifier_bug(faulty_url, tiny_models, tmp_path):
    # gates that a healthy deployment passes easily: only equivalence can fail it
    recipe = tiny_recipe(*tiny_models, gates={"min_speedup": 0.05, "max_mismatch_rate": 0.0,
                                              "min_acceptance_rate": 0.0, "latency_tolerance": 10.0})
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    out = tmp_path / "validate"
    r = CliRunner().invoke(main, ["validate", "--url", faulty_url, str(path), "-o", str(out)])
    assert r.exit_code == 1, r.output
    assert "keep baseline" in r.output and "Traceback" not in r.output
    d = json.loads((out / "report.json").read_text())
    # the verifier bug decides the verdict (the first gate); the speed and tail gates judge 4 one-request
    # blocks on a shared box, which a neighbour's burst can widen past any bound, so they are not asserted
    assert d["verdict"]["decided_by"] == "greedy equivalence" and "greedy equivalence" in d["verdict"]["failed"]
    assert d["verdict"]["reason"].startswith("greedy equivalence failed: mismatch rate")
    eq = d["equivalence"]
    assert eq["mismatch_rate"] > 0.5
    bad = [p for p in eq["per_prompt"] if not p["passed"]]
    assert all(p["first_divergence"] is not None and p["context"]["speculative"] for p in bad)
    assert d["acceptance"]["acceptance_rate"] == pytest.approx(1.0)  # the bug's signature: everything accepted
    md = (out / "report.md").read_text()
    assert "## Verdict: **keep baseline** (exit 1)" in md and "**differs**" in md
