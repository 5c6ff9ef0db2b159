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
from tests.screens_run import NOW, REPO, build_run, build_variants, events, hold_controller_lock
from tests.status_views import job_row

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
        build_variants(paths)
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

    def show(width: int, *argv: str, exit_code: int = 0) -> str:
        """stdout of a command that succeeds; stderr of one that exits `exit_code` (a refusal)."""
        monkeypatch.setenv("COLUMNS", str(width))
        capsys.readouterr()
        assert main(list(argv)) == exit_code
        out, err = capsys.readouterr()
        if exit_code == 0:
            assert err == "", err
        else:
            assert out == "", out
            out = err
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


def test_a_killed_run_says_why_on_its_top_line_and_shows_squeue_failing_as_lines(screen, run, monkeypatch):
    """The kill reads as killed, with its reason, on the line people read first, and job 1001
    (exit 17, FAILED to SLURM) as killed; squeue's stdout and stderr are lines of the warning."""
    monkeypatch.setenv("RUNCTL_SCHEDULER", "slurm")
    monkeypatch.setenv("PATH", f"{run.root.parent / 'bin'}{os.pathsep}{os.environ['PATH']}")
    text = screen(80, "status", str(run.root.parent / "killed"))
    print(text)
    fits(text, 80)
    lines = text.splitlines()
    assert lines[0].startswith("tr11-176B-ml  KILLED: run stopped by the kill switch: maintenance window")
    assert [line.split()[2] for line in lines if line.startswith("1001 ")] == ["killed"]
    assert "\\n" not in text and any(line.strip(" │").startswith("stderr: slurm_load_jobs error") for line in lines)
    matches_recorded("status-killed-80.txt", text)


def test_a_run_submitted_but_never_supervised(screen, run, monkeypatch):
    """`ls` counts the jobs `status` lists (a queued job nobody supervised yet is live), and the
    heartbeats are shown as their job's before any controller has seen it."""
    listing = screen(120, "ls", str(run.root.parent))
    print(listing)
    rows = {line.split()[-1]: line for line in listing.splitlines()[1:]}
    assert "1 live / 1" in rows[f"{PLACEHOLDER}/queued"] and "2 live / 3" in rows[f"{PLACEHOLDER}/run"]
    matches_recorded("ls.txt", listing)
    monkeypatch.setenv("RUNCTL_MOCK_SLURM_DIR", str(run.root.parent / "mock-queued"))  # job 1001 runs
    text = screen(80, "status", str(run.root.parent / "queued"))
    print(text)
    assert "heartbeats (job 1001)" in text and "job -" not in text and "is not running" not in text
    matches_recorded("status-queued-80.txt", text)


def test_plan_refuses_a_layout_with_one_sentence_per_problem(screen, run):
    """tp: 3 on BLOOM's 48 x 8 GPUs: the layout, heads, MLP and vocabulary each said once, the
    job's size named once."""
    text = screen(80, "plan", str(run.root.parent / "tp3.yaml"), exit_code=2)
    print(text)
    assert "tp*pp*dp = 3*12*8 = 288, but the job has 48 nodes x 8 GPUs = 384\n" in text
    matches_recorded("plan-refused.txt", text)


def test_a_warning_of_several_lines_shows_them_as_lines():
    """A control character inside a line of a warning of several lines is still made inert."""
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
