"""Under CI (env CI set), a test dependency that does not import fails the run (tests/conftest.py);
locally it is a skip. Checked on probe test files in a child pytest that loads our conftest."""

from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ET

from tests.conftest import REPO_ROOT, _fail_import_skip

MISSING = "no_such_oracle_package_for_this_test"
PROBES = {
    "test_module_level.py": f"import pytest\npytest.importorskip({MISSING!r})\n\ndef test_never_runs():\n    pass\n",
    "test_inside_test.py": (f"import pytest\n\ndef test_needs_it():\n    pytest.importorskip({MISSING!r})\n\n"
                            "def test_ordinary_skip():\n    pytest.skip('not an import')\n"),
}


def test_missing_oracle_package_fails_under_ci(tmp_path):
    for name, text in PROBES.items():
        (tmp_path / name).write_text(text)
    junit = tmp_path / "junit.xml"
    env = {"PATH": "/usr/bin:/bin", "CI": "true", "DS_ACCELERATOR": "cpu", "PYTHONPATH": str(REPO_ROOT)}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "tests.conftest", "-p", "no:cacheprovider",
                           "--continue-on-collection-errors", "--rootdir", str(tmp_path), f"--junitxml={junit}",
                           str(tmp_path)], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300)
    print(proc.stdout[-3000:])
    assert proc.returncode != 0, "a missing oracle package must fail a CI run"
    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite is not None
    counts = {k: int(suite.get(k, 0)) for k in ("errors", "failures", "skipped", "tests")}
    # module-level importorskip -> a collection error; inside a test -> a failure; a plain skip stays one
    assert counts["errors"] == 1 and counts["failures"] == 1 and counts["skipped"] == 1, counts
    assert "CI is set, so a missing test dependency fails instead of skipping" in proc.stdout
    assert MISSING in proc.stdout


class _Report:
    def __init__(self, reason: str):
        self.outcome, self.longrepr = "skipped", ("x.py", 1, reason)

    @property
    def skipped(self) -> bool:
        return self.outcome == "skipped"


def test_outside_ci_an_import_skip_stays_a_skip(monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    report = _Report(f"Skipped: could not import {MISSING!r}")
    _fail_import_skip(report)
    assert report.outcome == "skipped"
    monkeypatch.setenv("CI", "1")
    _fail_import_skip(report)
    assert report.outcome == "failed"
    ordinary = _Report("Skipped: needs a CUDA GPU")
    _fail_import_skip(ordinary)
    assert ordinary.outcome == "skipped"
