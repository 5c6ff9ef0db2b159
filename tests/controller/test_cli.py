"""The controller's commands end to end through `runctl`, against the mocked SLURM (scenario
mode: jobs move PENDING -> RUNNING -> COMPLETED as they are polled): watch --once/--detach,
events, nodes, kill/resume, report, and the dashboard."""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fakes import REPO, supervise

from orchestrator.contract import RunPaths
from orchestrator.contract.exclude import add_excluded, excluded_nodes
from orchestrator.views.dashboard import dashboard_data, status_data
from orchestrator.views.report import write_report
from orchestrator.views.status_screen import render_status


def runctl(*args: str, env: dict, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "orchestrator.cli.main", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60)
    if check and proc.returncode != 0:
        raise AssertionError(f"runctl {' '.join(args)} -> {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


@pytest.fixture
def mock_run(tmp_path):
    env = {**os.environ, "RUNCTL_SCHEDULER": "mock", "RUNCTL_MOCK_SLURM_DIR": str(tmp_path / "mock"),
           "PYTHONPATH": str(REPO), "COLUMNS": "120"}
    run_dir = tmp_path / "run"
    runctl("submit", str(REPO / "configs" / "demo-cpu-4node.yaml"), "--run-dir", str(run_dir), env=env)
    return run_dir, env


@pytest.mark.parametrize("release", ["22.05", "24.11"])  # squeue's text; --json with lists and objects
def test_watch_once_follows_a_mock_job_to_the_end(mock_run, release):
    run_dir, env = mock_run
    env = {**env, "RUNCTL_MOCK_SLURM_RELEASE": release}
    statuses = [json.loads(runctl("watch", str(run_dir), "--once", "--json", env=env).stdout)["status"] for _ in range(5)]
    print(statuses)
    assert statuses[0] in ("waiting", "running") and statuses[-1] == "finished"
    events = runctl("events", str(run_dir), "--json", env=env).stdout.splitlines()
    names = [json.loads(line)["event"] for line in events]
    assert "job_adopted" in names and "job_ended" in names and names[-2] == "run_stopped"
    state = json.loads((run_dir / "state.json").read_text())
    assert state["status"] == "finished" and [j["job_id"] for j in state["jobs"]] == ["1000"]
    text = runctl("watch", str(run_dir), "--once", env=env).stdout
    assert "FINISHED" in text and "excluded nodes: none" in text


def test_watch_detach_runs_in_background_with_pid_and_log(mock_run):
    run_dir, env = mock_run
    out = runctl("watch", str(run_dir), "--detach", env=env).stdout
    assert "running as pid" in out
    second = runctl("watch", str(run_dir), "--once", env=env, check=False)
    deadline = time.monotonic() + 30
    while (run_dir / "controller.pid").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    log = (run_dir / "controller.log").read_text()
    print(log[-600:])
    assert "run demo-cpu-4node: finished" in log
    assert second.returncode in (0, 6), "either the daemon had already finished, or the lock refused (EXIT_BUSY)"
    if second.returncode == 6:
        assert "another controller" in second.stderr


def test_nodes_kill_resume_and_audit_through_the_cli(mock_run):
    run_dir, env = mock_run
    paths = RunPaths.of(run_dir)
    add_excluded(paths, ["node03", "node07"], reason="dead_rank in job 1", by="controller")
    listing = runctl("nodes", str(run_dir), env=env).stdout
    assert "node03" in listing and "dead_rank" in listing
    # A request: the controller checks who asked, audits it and clears the node at its next pass.
    asked = runctl("nodes", str(run_dir), "--clear", "node03", "--reason", "GPU swapped", env=env).stdout
    assert "no controller is running" in asked and excluded_nodes(paths) == ["node03", "node07"]
    runctl("kill", str(run_dir), "--reason", "bad data shard", env=env)
    runctl("watch", str(run_dir), "--once", env=env)
    assert excluded_nodes(paths) == ["node07"]
    state = json.loads(paths.state.read_text())
    assert state["status"] == "killed"
    runctl("nodes", str(run_dir), "--all", env=env)
    runctl("watch", str(run_dir), "--once", env=env)  # a stopped run still takes requests
    assert excluded_nodes(paths) == []
    resumed = runctl("resume", str(run_dir), "--reason", "shard fixed", env=env).stdout
    assert "(resume) as job 1001" in resumed
    state = json.loads(paths.state.read_text())
    assert state["status"] == "waiting" and state["jobs"][-1]["reason"] == "resume"
    audit = [json.loads(line) for line in runctl("events", str(run_dir), "--audit", "--json", env=env).stdout.splitlines()]
    assert [a["action"] for a in audit] == ["kill", "nodes --clear", "nodes --clear", "resume"]
    assert all(a["allowed"] for a in audit) and audit[0]["reason"] == "bad data shard"
    assert [a["details"]["nodes"] for a in audit[1:3]] == [["node03"], "all"]


def test_rollback_through_the_cli_checks_its_arguments_then_goes_on_from_a_killed_run(mock_run, capsys):
    from orchestrator.cli.main import main

    run_dir, env = mock_run
    paths = RunPaths.of(run_dir)
    for args, named in ((["--to-step", "0", "--skip-samples", "9:2"], "--skip-samples: rollback.skip_samples[0]"),
                        (["--to-step", "0", "--skip-samples", "9"], "--skip-samples '9': give A:B"),
                        (["--to-step", "0", "--lr-scale", "0.5"], "--for-steps: rollback.lr_scale_steps: 0"),
                        (["--to-step", "8"], "--to-step 8: no complete checkpoint at or before step 8")):
        assert main(["rollback", str(run_dir), *args, "--reason", "spike"]) == 2
        said = capsys.readouterr().err
        assert named in said, said
    assert not paths.control_request("rollback").exists()
    runctl("kill", str(run_dir), "--reason", "spike at 12", env=env)
    runctl("watch", str(run_dir), "--once", env=env)
    said = runctl("rollback", str(run_dir), "--to-step", "0", "--skip-samples", "0:16", "--reason", "bad first shard",
                  env=env).stdout
    assert "submitted (rollback rb-" in said, said
    state = json.loads(paths.state.read_text())
    assert state["status"] == "waiting" and state["jobs"][-1]["reason"].startswith("rollback rb-")
    directive = json.loads(paths.rollback_directive.read_text())
    assert (directive["to_step"], directive["skip_samples"]) == (0, [[0, 16]])
    me = pwd.getpwuid(os.geteuid()).pw_name
    assert directive["reason"] == f"bad first shard; withdrew the pending kill request of {me} (reason: spike at 12)"
    assert not paths.accepted_request("kill").exists() and not paths.control_request("kill").exists()
    audit = [json.loads(line) for line in runctl("events", str(run_dir), "--audit", "--json", env=env).stdout.splitlines()]
    assert [a["action"] for a in audit] == ["kill", "rollback"] and audit[1]["details"]["skip_samples"] == [[0, 16]]


def test_report_and_dashboard_after_a_restart(run_env):
    cfg, scheduler, ctl = run_env()
    scheduler.env_for_job = [{"FAKE_CRASH_AT": "14:1"}]
    ctl.start()
    supervise(ctl)
    summary = write_report(ctl.paths.root)
    print(json.dumps({k: summary[k] for k in ("steps", "goodput", "wall_seconds", "useful_compute_seconds")}))
    png = Path(summary["loss_png"])
    assert png.stat().st_size > 10_000 and png.read_bytes()[:4] == b"\x89PNG"
    assert summary["steps"] == 20 and summary["restarts"] == 1
    assert 0 < summary["goodput"] < 1
    assert summary["spent_compute_seconds"] > summary["useful_compute_seconds"]  # redone steps
    incident = summary["incidents"][0]
    assert incident["resume_step"] == 10 and incident["failure_to_first_step_s"] > 0
    data = dashboard_data(ctl.paths.root)
    assert data.status == "finished" and data.checkpoint.last_step == 20
    assert data.training.step == 20 and data.restarts == 1
    from rich.console import Console

    console = Console(record=True, width=120)
    console.print(render_status(status_data(ctl.paths.root)))
    text = console.export_text()
    print(text)
    assert "FINISHED" in text and "restarts so far: 1" in text and "loss" in text
    assert "next by time" not in text and "done in about" not in text, "a finished run plans nothing more"


def test_sigkilled_controller_restarted_submits_nothing_twice(mock_run):
    """`runctl watch` killed with SIGKILL mid-run, then started again: it picks up from
    state.json and the ledger; the run still has exactly one job."""
    import signal

    run_dir, env = mock_run
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator.cli.main", "watch", str(run_dir), "--plain"],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not (run_dir / "state.json").exists():
        time.sleep(0.1)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    for _ in range(6):
        status = json.loads(runctl("watch", str(run_dir), "--once", "--json", env=env).stdout)["status"]
        if status == "finished":
            break
    assert status == "finished"
    ledger = (run_dir / "jobs" / "submissions.jsonl").read_text().splitlines()
    assert len(ledger) == 1, ledger
    commands = [json.loads(line)["argv"][0] for line in (Path(env["RUNCTL_MOCK_SLURM_DIR"]) / "commands.jsonl").read_text().splitlines()]
    assert commands.count("sbatch") == 1
