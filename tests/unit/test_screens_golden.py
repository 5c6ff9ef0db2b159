"""`runctl status`, `events`, `plan` and `report` as people see them, at 80 and 120 columns,
compared with the recorded screens in tests/golden/screens/. Through the real CLI entry
(orchestrator.cli.main.main), with COLUMNS set as a terminal would, on a run directory the test
writes through the contract's writers (tests/screens_run.py) with the clock fixed and TZ=UTC.

`events` and `report` print one line per record (a record never spans two lines, so grep works
and a reason cannot forge a line): their output does not depend on the width, and one recorded
file serves both widths. The screens' lines are compared without trailing spaces; the run's
directory (a fresh /tmp/screens-XXXXXXXX) is replaced by that placeholder, of the same length.

Re-record after an intended change of a screen, then review the diff:
    RECORD_GOLDEN=1 python -m pytest tests/unit/test_screens_golden.py
"""

from __future__ import annotations

import difflib
import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest

from orchestrator.cli.main import main
from tests.screens_run import NOW, REPO, build_run, events, hold_controller_lock
from tests.status_views import job_row, status_view

GOLDEN = REPO / "tests" / "golden" / "screens"
PLACEHOLDER = "/tmp/screens-XXXXXXXX"
RECORD = os.environ.get("RECORD_GOLDEN") == "1"


@pytest.fixture(scope="module")
def run():
    """The run directory, written once at the fixed time, its controller's lock held."""
    root = Path(tempfile.mkdtemp(prefix="screens-", dir="/tmp"))
    assert len(str(root)) == len(PLACEHOLDER)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(time, "time", lambda: NOW)
        paths = build_run(root)
        lock = hold_controller_lock(paths)
    yield paths
    os.close(lock)
    shutil.rmtree(root)


@pytest.fixture
def screen(run, monkeypatch, capsys):
    """screen(width, *argv) -> what `runctl ARGV` printed at that width, at the fixed time."""
    monkeypatch.setattr(time, "time", lambda: NOW)
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    monkeypatch.setenv("RUNCTL_SCHEDULER", "mock")  # an empty mock: SLURM forgot every job
    monkeypatch.setenv("RUNCTL_MOCK_SLURM_DIR", str(run.root.parent / "mock"))
    for name in ("FORCE_COLOR", "NO_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE"):
        monkeypatch.delenv(name, raising=False)

    def show(width: int, *argv: str) -> str:
        monkeypatch.setenv("COLUMNS", str(width))
        capsys.readouterr()
        assert main(list(argv)) == 0
        out, err = capsys.readouterr()
        assert err == "", err
        text = out.replace(str(run.root.parent), PLACEHOLDER)
        return "".join(line.rstrip() + "\n" for line in text.splitlines())

    yield show
    monkeypatch.undo()
    time.tzset()


def matches_recorded(name: str, text: str) -> None:
    path = GOLDEN / name
    if RECORD:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return
    assert path.exists(), f"no recorded {name}: RECORD_GOLDEN=1 pytest {__file__}"
    recorded = path.read_text()
    if text != recorded:
        diff = "".join(difflib.unified_diff(recorded.splitlines(True), text.splitlines(True), "recorded", "shown"))
        pytest.fail(f"{name} changed; if intended: RECORD_GOLDEN=1 pytest {__file__}\n{diff}")


def fits(text: str, width: int) -> None:
    widest = max(len(line) for line in text.splitlines())
    assert widest <= width, f"a line of {widest} columns on a {width}-column terminal"


@pytest.mark.parametrize("width", [80, 120])
def test_status(screen, run, width):
    text = screen(width, "status", str(run.root))
    print(text)
    fits(text, width)
    headers = [line for line in text.splitlines() if line.split()[:3] == ["job", "why", "state"]]
    assert len(headers) == 1, "one job table"
    assert "node17: no beat for 212 s (dead after 120 s)" in text
    assert "12:30 restarting inside job 1001 from step 3419 after a lost node" in text
    matches_recorded(f"status-{width}.txt", text)


@pytest.mark.parametrize("width", [80, 120])
def test_events(screen, run, width):
    text = screen(width, "events", str(run.root), "--last", "0")
    print(text)
    assert len(text.splitlines()) == len(events()) and "{" not in text, "one sentence per event, no raw record"
    matches_recorded("events.txt", text)


@pytest.mark.parametrize("width", [80, 120])
def test_plan(screen, width):
    text = screen(width, "plan", str(REPO / "configs" / "bloom-176b.yaml"))
    print(text)
    fits(text, width)
    assert "…" not in text, "nothing cut"
    matches_recorded(f"plan-{width}.txt", text)


@pytest.mark.parametrize("width", [80, 120])
def test_report(screen, run, width, tmp_path):
    text = screen(width, "report", str(run.root), "--out", str(run.root / "reports"))
    print(text)
    assert text.startswith("run tr11-176B-ml: 3466 steps, final loss 2.1359, status running\n")
    assert text.count("goodput (whole run)") == 1 and text.count("goodput (last 24 h)") == 1
    matches_recorded("report.txt", text)


def test_a_stopped_run_says_why_on_its_top_line():
    """A kill reads as killed, with its reason, on the line people read first (not only in events)."""
    from orchestrator.views.status_screen import _header

    data = status_view(name="tr11", run_dir="/runs/tr11", status="killed", restarts=1, controller=None,
                       stop_message="run stopped by the kill switch: maintenance window (by oncall)")  # fmt: skip
    title = _header(data)[0].plain
    assert title == "tr11  KILLED: run stopped by the kill switch: maintenance window (by oncall)  restarts so far: 1"


def test_a_warning_of_several_lines_shows_them_as_lines():
    """squeue's stdout and stderr in a warning: real lines on the screen, not a literal \\n; a
    control character inside a line is still made inert."""
    from rich.console import Console

    from orchestrator.views.status_screen import _warnings

    problem = "`squeue --json` exited 1\n  stdout: (empty)\n  stderr: slurm_load_jobs error: Socket timed out\x1b[2J"
    console = Console(width=100, record=True, color_system=None)
    console.print(_warnings([f"the scheduler was not asked ({problem})"]))
    text = console.export_text()
    print(text)
    assert "\\n" not in text and "\x1b" not in text and "\\x1b[2J" in text
    assert [line.strip(" │") for line in text.splitlines()[2:4]] == [
        "stdout: (empty)", "stderr: slurm_load_jobs error: Socket timed out\\x1b[2J)"]


def test_a_job_the_kill_switch_stopped_reads_as_killed_not_failed():
    from orchestrator.views.status_screen import shown_state

    killed = job_row(state="failed", exit_code=17)
    assert shown_state(killed) == "killed"
    assert shown_state(job_row(state="failed", exit_code=1)) == "failed"
    assert shown_state(job_row(state="running", exit_code=None)) == "running"
