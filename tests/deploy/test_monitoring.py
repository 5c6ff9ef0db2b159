"""The drop-in monitoring of deploy/: Prometheus' own checker and unit tester on the alert rules
(`promtool check rules`, `promtool test rules` with runctl-alerts.test.yml: every alert fires on
a series in its state and stays quiet on another). That the Grafana dashboard queries only
metrics a real scrape has is tests/controller/test_oncall.py (test_metrics_are_scraped_...).

promtool comes with Debian's `prometheus` package; `make test` installs it (the Makefile's
`tools` target). Without it the tests skip, and under CI they fail: a missing tool must not turn
the check into a silent skip.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

RULES_DIR = Path(__file__).resolve().parents[2] / "deploy" / "prometheus"


def promtool() -> str:
    found = shutil.which("promtool")
    if found:
        return found
    why = "promtool not found: `make tools` (or `apt-get install prometheus`) installs it"
    if os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no"):
        pytest.fail(f"CI is set: {why}")
    pytest.skip(why)


@pytest.mark.parametrize("command", [["check", "rules", "runctl-alerts.yml"], ["test", "rules", "runctl-alerts.test.yml"]],
                         ids=["check", "test"])  # fmt: skip
def test_promtool_accepts_the_alert_rules(command):
    proc = subprocess.run([promtool(), *command], cwd=RULES_DIR, capture_output=True, text=True, timeout=120)
    print(proc.stdout, proc.stderr)
    assert proc.returncode == 0 and "SUCCESS" in proc.stdout


def test_every_alert_has_a_firing_and_a_quiet_case():
    import yaml

    rules = yaml.safe_load((RULES_DIR / "runctl-alerts.yml").read_text())
    alerts = {r["alert"] for g in rules["groups"] for r in g["rules"]}
    tests = yaml.safe_load((RULES_DIR / "runctl-alerts.test.yml").read_text())["tests"]
    fired = {c["alertname"] for t in tests for c in t["alert_rule_test"] if c["exp_alerts"]}
    assert fired == alerts, f"alerts with no firing case: {alerts - fired}"
    for test in tests:  # each case also has a run ("b") that must stay quiet
        runs = {s["series"].split('run="')[1].split('"')[0] for s in test["input_series"]}
        expected = {a["exp_labels"]["run"] for c in test["alert_rule_test"] for a in c["exp_alerts"]}
        assert runs - expected, f"{[c['alertname'] for c in test['alert_rule_test']]}: no run stays quiet"


def _statuses(expr: str) -> set[str]:
    import re

    found = re.findall(r'runctl_run_status\{status(=~|=)"([^"]+)"\}', expr)
    return {name for _, alternatives in found for name in alternatives.split("|")}


def test_each_status_that_needs_a_person_has_its_rule():
    """Each rule's status list is the contract's set it is about, so that a new status (or a
    status moved between sets) fails here until the rules say who hears of it."""
    import yaml

    from orchestrator.contract.severity import NEEDS_A_PERSON
    from orchestrator.contract.state import ACTIVE, STOPPED, STOPPING, RunStatus

    rules = yaml.safe_load((RULES_DIR / "runctl-alerts.yml").read_text())
    exprs = {r["alert"]: r["expr"] for g in rules["groups"] for r in g["rules"]}
    names = lambda statuses: {s.value for s in statuses}  # noqa: E731
    supervised = names(ACTIVE | STOPPING)
    assert _statuses(exprs["RunctlControllerDown"]) == supervised
    assert _statuses(exprs["RunctlControllerStalled"]) == supervised
    assert _statuses(exprs["RunctlNoJob"]) == supervised - {RunStatus.DISK_FULL.value}
    assert _statuses(exprs["RunctlRunStoppedOnItsOwn"]) == names(NEEDS_A_PERSON)
    assert _statuses(exprs["RunctlPoolShort"]) == names(ACTIVE)
    quiet = names(STOPPED - NEEDS_A_PERSON)
    assert quiet == {"killed", "finished"}, "a stop nobody is paged for: killed (as asked) and finished"
    covered = set().union(*(_statuses(e) for e in exprs.values()))
    assert covered | quiet == names(RunStatus), f"statuses no rule covers: {names(RunStatus) - covered - quiet}"
