"""`runctl status` in words, through the real CLI: a stopped run plans nothing more, warnings are
never cut at 80 columns, the heartbeat view says what is late and by how much, and
`status --follow` redraws from the run directory until Ctrl-C, which exits 0.
The screens themselves are compared with recorded ones in test_screens_golden.py."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest

from orchestrator.cli.main import main
from orchestrator.contract import RunPaths
from orchestrator.contract import events as ev
from orchestrator.contract import failure_events as fev
from orchestrator.contract.state import RunStatus, load_state, save_state
from orchestrator.views.status_screen import heartbeat_lines
from orchestrator.views.status_view import Dashboard
from tests.screens_run import NOW, REPO, at, build_run
from tests.status_views import node_beats, status_view


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The run of tests/screens_run.py, running, with no controller (nobody holds its lock)."""
    root = tmp_path_factory.mktemp("screens")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(time, "time", lambda: NOW)
        return build_run(root)


@pytest.fixture
def status(monkeypatch, capsys, tmp_path):
    """status(run_dir, *options) -> what `runctl status` printed at 80 columns, at the fixed time."""
    monkeypatch.setattr(time, "time", lambda: NOW)
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    monkeypatch.setenv("RUNCTL_SCHEDULER", "mock")
    monkeypatch.setenv("RUNCTL_MOCK_SLURM_DIR", str(tmp_path / "mock"))
    monkeypatch.setenv("COLUMNS", "80")

    def show(run_dir, *options: str) -> str:
        assert main(["status", str(run_dir), *options]) == 0
        out, err = capsys.readouterr()
        assert err == ""
        return out

    yield show
    monkeypatch.undo()
    time.tzset()


def test_a_finished_run_plans_nothing_more(built, status, tmp_path):
    run = RunPaths.of(shutil.copytree(built.root, tmp_path / "run"))
    state = load_state(run)
    state.status = RunStatus.FINISHED
    state.jobs[1].state, state.jobs[1].ended_at, state.jobs[1].exit_code = "completed", NOW - 600, 0
    state.jobs[1].outcome = "finished"
    state.jobs[2].state, state.jobs[2].outcome = "cancelled", "cancelled (run finished)"
    save_state(run, state)
    ev.write_event(run.events, fev.RunStopped(status="finished", message="training finished (job 1001)"),
                   now=NOW - 600)  # fmt: skip
    text = status(run.root)
    print(text)
    assert "FINISHED" in text and "controller: not running" in text
    assert "next by time" not in text and "next at step" not in text and "done in about" not in text
    assert "watching this run" not in text, "a finished run needs no controller"
    assert "job 1001 is not running; its last beats are" in text
    assert re.search(r"1001 +chain +completed .* finished training", text)
    assert re.search(r"1002 +chain +cancelled .* cancelled \(run", text)


def test_warnings_are_never_cut(built, status):
    text = status(built.root)
    assert max(len(line) for line in text.splitlines()) <= 80
    panel = text[text.index("╭─ warnings") : text.index("╰")]
    words = " ".join(line.strip("│ ") for line in panel.splitlines()[1:])
    shown = " ".join(words.split())
    raw = status(built.root, "--json")
    data = json.loads(raw)
    print(text)
    # The JSON scripts read, byte for byte (re-record: copy the shown text into the file, then review)
    recorded = (REPO / "tests" / "golden" / "screens" / "status.json").read_text()
    assert raw.replace(str(built.root), "RUN_DIR") == recorded, "`runctl status --json` changed its shape"
    assert len(data["warnings"]) == 2 and "no controller is watching this run" in data["warnings"][0]
    for warning in data["warnings"]:
        assert f"- {warning}" in shown, f"cut or lost: {warning!r}\n{panel}"


def test_without_slurm_on_path_status_says_so_and_shows_what_it_knows(built, status, monkeypatch, tmp_path):
    monkeypatch.delenv("RUNCTL_SCHEDULER")
    monkeypatch.setenv("PATH", str(tmp_path))  # a login node without SLURM's module loaded
    text = " ".join(status(built.root).split())
    assert "the scheduler was not asked (`sbatch` is not on PATH" in text
    assert "1001 chain running node[01-52]" in text, "the controller's records of the jobs"


def beats(ages: dict[str, float], ranks_in_job: int | None = None) -> Dashboard:
    return status_view(heartbeat_job="4207", heartbeat_job_running=True, nodes=node_beats(ages), dead_after=210.0,
                       late_after=90.0, ranks_in_job=ranks_in_job or 8 * len(ages),
                       ranks_beating=8 * len(ages)).dashboard  # fmt: skip


def test_heartbeats_say_what_is_late_and_by_how_much():
    fine = {f"node{i:02d}": float(i % 20 + 2) for i in range(1, 49)}
    fine["node03"] = 31.0
    assert heartbeat_lines(beats(fine)) == [("", "all 48 nodes beating; slowest node03, 31 s ago")]

    one_dead = {**fine, "node17": 212.0}
    assert [text for _, text in heartbeat_lines(beats(one_dead))] == [
        "47 of 48 nodes beating on time",
        "node17: no beat for 212 s (dead after 210 s)",
    ]
    # Most of the job silent at once: one line with their host list, not forty
    stalled = {**fine, **{f"node{i:02d}": 195.0 + i % 13 for i in range(1, 41)}}
    lines = heartbeat_lines(beats(stalled, ranks_in_job=400))
    print(lines)
    assert lines == [
        ("yellow", "8 of 48 nodes beating on time; 16 of 400 ranks have not beaten yet"),
        ("yellow", "40 nodes, node[01-40]: no beat for 195 s to 207 s (late after 90 s, dead after 210 s)"),
    ]


def test_status_follow_redraws_until_ctrl_c(built, tmp_path):
    """A read-only live view for anyone who can read the run: no controller runs; what the run
    directory gains meanwhile shows on the next redraw; Ctrl-C ends it with exit 0."""
    run = RunPaths.of(shutil.copytree(built.root, tmp_path / "run"))
    mock = tmp_path / "mock"
    env = {**os.environ, "PYTHONPATH": str(REPO), "RUNCTL_SCHEDULER": "mock", "COLUMNS": "100",
           "RUNCTL_MOCK_SLURM_DIR": str(mock)}  # fmt: skip

    def redraws() -> int:  # each redraw asks the (mock) scheduler once
        commands = mock / "commands.jsonl"
        return len(commands.read_text().splitlines()) if commands.exists() else 0

    def wait_for(count: int) -> None:
        deadline = time.monotonic() + 30
        while redraws() < count and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        assert redraws() >= count, f"{redraws()} redraws, expected {count}: {proc.poll()}"

    def as_from_a_terminal() -> None:
        # A shell starts runctl with SIGINT deliverable and at its default; the test process may
        # have it blocked or ignored by then (both are inherited), and Ctrl-C would never arrive.
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        signal.signal(signal.SIGINT, signal.SIG_DFL)

    proc = subprocess.Popen(
        [sys.executable, "-m", "orchestrator.cli.main", "status", str(run.root), "--follow", "--every", "0.5"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=as_from_a_terminal,
    )  # fmt: skip
    try:
        wait_for(1)  # the first screen is drawn
        ev.write_event(run.events, ev.KillRequested(by="follower", reason="seen live", time=at(30, 14, 6)))
        wait_for(redraws() + 2)  # a whole redraw after the event
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    print(out[-3000:], err)
    assert proc.returncode == 0 and "Traceback" not in err
    assert "kill (checkpoint, then stop) requested by follower: seen live" in out
    assert len(re.findall(r"^tr11-176B-ml +RUNNING", out, re.M)) == 1, "a non-terminal gets the last screen only"
