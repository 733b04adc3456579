"""Reports are relocatable: every link a report writes is relative to the report's folder, so a
report folder moved, copied off the machine or committed still opens its plots and its sub-reports."""

from __future__ import annotations

import pathlib
import re
import shutil
from types import SimpleNamespace
from urllib.parse import unquote, urlparse

import pytest

from trtspec.config import Gates, load_recipe
from trtspec.run_report import write_run_report
from trtspec.validate.equivalence import EquivalenceResult, compare
from trtspec.client.intervals import ratio_interval
from trtspec.validate.gates import evaluate
from trtspec.validate.report import write_bench_report, write_validation_report
from trtspec.validate.run import ValidationResult, acceptance_from

REPO = pathlib.Path(__file__).resolve().parents[2]
MD_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HTML_LINK = re.compile(r"""(?:href|src)\s*=\s*["']([^"']+)["']""", re.IGNORECASE)


def links(folder: pathlib.Path) -> list[tuple[pathlib.Path, str]]:
    """(file, target) for every local link in the folder's markdown and HTML files."""
    out = []
    for f in sorted(folder.rglob("*")):
        if f.suffix.lower() not in (".md", ".html", ".htm"):
            continue
        text = f.read_text(encoding="utf-8")
        for target in MD_LINK.findall(text) + HTML_LINK.findall(text):
            u = urlparse(target)
            if u.scheme in ("http", "https", "mailto") or target.startswith("#"):
                continue
            out.append((f, target))
    return out


def broken(folder: pathlib.Path) -> list[str]:
    bad = []
    for f, target in links(folder):
        path = unquote(urlparse(target).path)
        if pathlib.PurePath(path).is_absolute():
            bad.append(f"{f.relative_to(folder)}: absolute link {target}")
        elif not (f.parent / path).resolve().is_file():
            bad.append(f"{f.relative_to(folder)}: {target} does not resolve")
        elif not (f.parent / path).resolve().is_relative_to(folder.resolve()):
            bad.append(f"{f.relative_to(folder)}: {target} leaves the report folder")
    return bad


def _validation_result() -> ValidationResult:
    from tests.serving.test_bench import synthetic_bench
    from trtspec.client.types import Chunk, GenerationResult

    def gen(ids):
        return GenerationResult(model="m", request_id="r", text=" ".join(map(str, ids)), token_ids=list(ids),
                                chunks=[Chunk(0.1, "x", len(ids))], sent_at=0.0, end_s=0.1)

    bench = synthetic_bench(levels=(1, 2))
    eq = EquivalenceResult(tolerance=0, max_tokens=6, concurrency=1, unit="tokens")
    base = gen([1, 2, 3, 4, 5, 6])
    eq.prompts = [compare(0, "p", base, gen([1, 2, 3, 4, 5, 6]), 0), compare(1, "q", base, gen([1, 2, 7]), 0)]
    acc = acceptance_from(bench.records("speculative"), 4)
    verdict = evaluate(Gates(min_speedup=0.5, min_acceptance_rate=0.1), mismatch_rate=eq.mismatch_rate,
                       exact_match_rate=eq.exact_match_rate, tolerance=0,
                       speedup=ratio_interval([bench.speedup(1)] * 2),
                       acceptance_rate=acc["gate_value"], acceptance_source=acc["source"], sampled=None)
    return ValidationResult(recipe="tiny", url="h:1", models={"speculative": "ensemble", "baseline": "ensemble_baseline"},
                            equivalence=eq, sampled=None, sampled_note="not run", bench=bench, acceptance=acc,
                            speedup=bench.speedup(1), at_concurrency=1, verdict=verdict, started="t", wall_s=1.0)


@pytest.fixture(scope="module")
def validation_folder(tmp_path_factory) -> tuple[ValidationResult, pathlib.Path]:
    """The validation stage's folder, written once by the library's writer (plots take seconds)."""
    res = _validation_result()
    out = tmp_path_factory.mktemp("validate")
    write_validation_report(res, out, max_draft_len=4, min_speedup=1.1)
    (out / "server_metrics.json").write_text("{}\n")
    return res, out


def test_run_report_folder_moved_elsewhere_keeps_every_link(tmp_path, validation_folder):
    """`trtspec run`'s layout (workdir/validate, workdir/report), the report folder moved alone."""
    work = tmp_path / "run"
    val_dir = work / "validate"
    shutil.copytree(validation_folder[1], val_dir)
    pipeline = SimpleNamespace(
        recipe=load_recipe(REPO / "build_configs" / "tiny-cpu-draft-target.yaml"), source="tiny.yaml",
        outputs={"validate": {"report_json": str(val_dir / "report.json")}}, stage_log=[],
        stage_dir=lambda stage: work / stage)
    md = write_run_report(pipeline, work / "report")
    assert "## Output equivalence" in md.read_text() and "](validate/report.md)" in md.read_text()

    moved = tmp_path / "elsewhere" / "committed-run"
    moved.parent.mkdir()
    shutil.move(str(work / "report"), moved)
    shutil.rmtree(work)  # nothing of the machine that ran it is left
    found = links(moved)
    assert {t for _, t in found} >= {"validate/report.md", "validate/equivalence.png", "validate/latency_cdf.png"}
    assert not broken(moved), broken(moved)


def test_bench_and_validation_report_folders_moved_keep_every_link(tmp_path, validation_folder):
    res, written = validation_folder
    for name, write in (("validate", lambda d: shutil.copytree(written, d)),
                        ("bench", lambda d: write_bench_report(res.bench, d))):
        write(tmp_path / name)
        moved = tmp_path / "moved" / name
        moved.parent.mkdir(exist_ok=True)
        shutil.move(str(tmp_path / name), moved)
        assert len(links(moved)) >= 3, name
        assert not broken(moved), broken(moved)


def test_the_link_checker_sees_absolute_and_dangling_links(tmp_path):
    (tmp_path / "a.png").write_bytes(b"x")
    (tmp_path / "report.md").write_text("![ok](a.png) [abs](/work/main/runs/x/validate/report.md) [gone](b.md) "
                                        "[web](https://example.com) <img src=\"c.png\">\n")
    assert broken(tmp_path) == ["report.md: absolute link /work/main/runs/x/validate/report.md",
                                "report.md: b.md does not resolve", "report.md: c.png does not resolve"]


# committed reports whose absolute link stays: the file it named was never committed
NOT_IN_REPO = {
    # the re-run overwrote /tmp/qwen-run/validate; the 2026-12-04/validate/ folder is the first run's
    "qwen-coder-cpu-run/2026-12-04/rerun-from-serve/report.md",
    # tiny-cpu-demo-run/2026-12-04/validate/ is an earlier run's (58a7bbf) than this report (8280995)
    "tiny-cpu-demo-run/2026-12-04/report.md",
}


def test_committed_run_reports_link_nothing_absolute():
    results = REPO / "bench" / "results"
    bad = [f"{f.relative_to(results)}: {t}" for f, t in links(results)
           if pathlib.PurePath(unquote(urlparse(t).path)).is_absolute()
           and f.relative_to(results).as_posix() not in NOT_IN_REPO]
    assert not bad, bad
