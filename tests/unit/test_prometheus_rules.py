"""The shipped Prometheus rules (trtspec/data/prometheus/rules.yml) with Prometheus's own tool:
``promtool check rules`` (syntax, PromQL) and ``promtool test rules`` (rules_test.yml: each alert
fires on recorded series of a sick deployment and stays quiet on a healthy one); a weakened rule
fails its unit test; every series the rules read is one trtspec exports.

promtool comes from Debian's ``prometheus`` package (``make prometheus-tools``); without it these
tests skip.
"""

from __future__ import annotations

import pathlib
import re
import shutil
import subprocess

import pytest
import yaml

REPO = pathlib.Path(__file__).resolve().parents[2]
RULES = REPO / "trtspec" / "data" / "prometheus" / "rules.yml"
RULES_TEST = RULES.with_name("rules_test.yml")
PROMTOOL = shutil.which("promtool")

needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool not on PATH: make prometheus-tools "
                                                             "(apt-get install prometheus)")


def _promtool(*args: str, cwd: pathlib.Path) -> subprocess.CompletedProcess:
    return subprocess.run([PROMTOOL, *args], cwd=cwd, capture_output=True, text=True, timeout=60)


def _alerts() -> list[str]:
    return [r["alert"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"] if "alert" in r]


@needs_promtool
def test_promtool_checks_the_rules():
    r = _promtool("check", "rules", str(RULES), cwd=RULES.parent)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS: 12 rules found" in r.stdout


@needs_promtool
def test_promtool_unit_tests_fire_each_alert_and_not_on_a_healthy_deployment():
    r = _promtool("test", "rules", RULES_TEST.name, cwd=RULES.parent)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS" in r.stdout


def test_every_alert_has_a_firing_and_a_quiet_case():
    tests = yaml.safe_load(RULES_TEST.read_text())["tests"]
    cases = [c for t in tests for c in t.get("alert_rule_test", [])]
    for alert in _alerts():
        mine = [c for c in cases if c["alertname"] == alert]
        assert any(c.get("exp_alerts") for c in mine), f"{alert} is never shown firing"
        assert any(not c.get("exp_alerts") for c in mine), f"{alert} is never shown quiet"
    assert len(_alerts()) == 7


# rules.yml text → a weaker (or wrong) version; its unit test must then fail on that alert
WEAKENED = {
    "fallback threshold raised": ("> 0.25", "> 0.95", "TrtspecRouterFallingBack"),
    "acceptance compared the wrong way": ("trtspec_router_rolling_acceptance_rate < ", "trtspec_router_rolling_acceptance_rate > ",
                                          "TrtspecAcceptanceBelowBreakEven"),
    "speed margin dropped": ("group_left 0.9 *", "group_left 0.7 *", "TrtspecSpeculativeSlowerThanBaseline"),
    "ITL compared with the wrong quantile": ("histogram_quantile(0.95, sum by (namespace, app, model, le) "
                                             "(rate(trtspec_inter_token_latency",
                                             "histogram_quantile(0.5, sum by (namespace, app, model, le) "
                                             "(rate(trtspec_inter_token_latency", "TrtspecP95LatencyRegression"),
    "watchdog alert on the wrong counter": ("increase(trtspec_watchdog_reloads_total[15m])",
                                            "increase(trtspec_watchdog_probe_failures_total[15m])", "TrtspecWatchdogReloads"),
}


@needs_promtool
@pytest.mark.parametrize("case", sorted(WEAKENED))
def test_a_weakened_rule_fails_its_unit_test(case, tmp_path):
    old, new, alert = WEAKENED[case]
    text = RULES.read_text()
    assert text.count(old) == 1, old
    (tmp_path / "rules.yml").write_text(text.replace(old, new))
    shutil.copy(RULES_TEST, tmp_path / RULES_TEST.name)
    r = _promtool("test", "rules", RULES_TEST.name, cwd=tmp_path)
    assert r.returncode != 0
    assert f"alertname: {alert}" in r.stdout + r.stderr, r.stdout + r.stderr


def test_every_series_the_rules_read_is_exported_by_trtspec():
    """A renamed metric would leave an alert that can never fire: each trtspec_* name in the rules
    (histograms less their _bucket/_sum/_count) is declared by a backend model."""
    code = "".join(p.read_text() for p in (REPO / "trtspec" / "triton" / "backend").glob("*.py"))
    exported = set(re.findall(r'"(trtspec_[a-z_]+)"', code))
    rules = yaml.safe_load(RULES.read_text())
    exprs = " ".join(r["expr"] for g in rules["groups"] for r in g["rules"])
    read = {re.sub(r"_(bucket|sum|count)$", "", n) for n in re.findall(r"(?<![:\w])(trtspec_\w+)", exprs)}
    assert read and read <= exported, sorted(read - exported)
    assert {"trtspec_router_rolling_acceptance_rate", "trtspec_watchdog_reloads_total",
            "trtspec_inter_token_latency_seconds"} <= read
