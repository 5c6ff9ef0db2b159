"""The on-call commands through the real CLI (orchestrator.cli.main.main) on the mocked SLURM:
`ls`, `logs`, `events` (--type, --since, --follow, an empty audit trail), kill and resume as a
person expects them (a stopped run cannot be killed; a withdrawn kill is audited; a kill's
cancelled chain shows as cancelled), `report`, and `doctor` on a controller that has exited."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fakes import REPO

from orchestrator.cli.main import main
from orchestrator.contract import RunPaths, append_jsonl
from orchestrator.errors import EXIT_FAILURE, EXIT_OK, EXIT_USAGE

DEMO = REPO / "configs" / "demo-cpu-4node.yaml"


def cli(capsys, *argv: str) -> tuple[int, str]:
    """(exit code, stdout + stderr) of one command."""
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    with capsys.disabled():  # shown with -s; printed inside the capture it would leak into the next call
        if os.environ.get("RUNCTL_TEST_VERBOSE"):
            print(out[-2000:], err[-2000:])
    return code, out + err


@pytest.fixture
def chain_run(mock_slurm_dir, tmp_path, capsys):
    """A demo run of a chain of 3 on the mocked SLURM, seen once by a controller pass."""
    run_dir = tmp_path / "runs" / "demo"
    assert cli(capsys, "submit", DEMO, "--run-dir", run_dir, "--chain", "3")[0] == EXIT_OK
    assert cli(capsys, "watch", run_dir, "--once")[0] == EXIT_OK
    return run_dir


def test_kill_cancels_the_chain_as_cancelled_and_a_stopped_run_cannot_be_killed(chain_run, capsys):
    assert cli(capsys, "kill", chain_run, "--reason", "bad data shard")[0] == EXIT_OK
    for _ in range(6):  # the mock's running job ends as it is polled; the controller then stops
        cli(capsys, "watch", chain_run, "--once")
        if json.loads(RunPaths.of(chain_run).state.read_text())["status"] == "killed":
            break
    code, out = cli(capsys, "status", chain_run, "--json")
    jobs = json.loads(out)["jobs"]
    queued = [j for j in jobs if j["submit_reason"] == "chain" and j["state"] == "cancelled"]
    assert queued and all(j["outcome"] == "cancelled (kill switch)" for j in queued), jobs
    request = RunPaths.of(chain_run).control_request("kill")
    before = request.read_text()  # the accepted kill's request stays until `runctl resume`
    code, text = cli(capsys, "kill", chain_run, "--reason", "again")
    assert code == EXIT_USAGE and "already stopped (killed" in text and "runctl resume" in text
    assert request.read_text() == before, "a refused kill writes no request"


def test_resume_records_the_kill_request_it_withdraws(mock_slurm_dir, tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert cli(capsys, "submit", DEMO, "--run-dir", run_dir)[0] == EXIT_OK
    # no controller runs: the kill waits in control/ ...
    assert cli(capsys, "kill", run_dir, "--reason", "loss spike")[0] == EXIT_OK
    # ... and the resume withdraws it; the owner's resume runs a pass, which audits the resume
    code, text = cli(capsys, "resume", run_dir, "--reason", "spike understood")
    assert code == EXIT_OK and "withdrew the pending kill request of" in text
    code, out = cli(capsys, "events", run_dir, "--audit", "--json")
    audit = [json.loads(line) for line in out.splitlines()]
    print(audit)
    assert [a["action"] for a in audit] == ["resume"]
    assert "spike understood; withdrew the pending kill request of" in audit[0]["reason"]
    assert "(reason: loss spike)" in audit[0]["reason"]


def test_an_empty_audit_trail_says_so(chain_run, capsys):
    code, text = cli(capsys, "events", chain_run, "--audit")
    assert code == EXIT_OK and "no operator actions recorded" in text


def test_events_filtered_by_type_and_time(chain_run, capsys):
    paths = RunPaths.of(chain_run)
    now = time.time()
    append_jsonl(paths.events, {"time": now - 7200, "event": "failure", "cause": "old"})
    append_jsonl(paths.events, {"time": now - 60, "event": "failure", "cause": "recent"})
    append_jsonl(paths.events, {"time": now - 30, "event": "restart", "job_id": "1001"})
    code, out = cli(capsys, "events", chain_run, "--type", "failure,restart", "--since", "1h", "--json")
    shown = [json.loads(line) for line in out.splitlines()]
    assert code == EXIT_OK and [(e["event"], e.get("cause")) for e in shown] == [("failure", "recent"), ("restart", None)]
    code, out = cli(capsys, "events", chain_run, "--type", "failure", "--json")
    assert [json.loads(line)["cause"] for line in out.splitlines()] == ["old", "recent"]
    code, text = cli(capsys, "events", chain_run, "--type", "hang")
    assert "no events of type hang" in text and "failure" in text, "it names the types there are"
    code, text = cli(capsys, "events", chain_run, "--since", "yesterday")
    assert code == EXIT_USAGE and "--since 'yesterday'" in text and "30m" in text


def test_events_follow_prints_what_the_controller_appends(chain_run):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator.cli.main", "events", str(chain_run), "--follow",
                             "--type", "restart", "--json"], env=env, stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        time.sleep(1.0)  # it has printed what there was (no restart) and follows
        paths = RunPaths.of(chain_run)
        append_jsonl(paths.events, {"time": time.time(), "event": "job_ended", "job_id": "1000"})
        append_jsonl(paths.events, {"time": time.time(), "event": "restart", "job_id": "1001"})
        ready, _, _ = select.select([proc.stdout], [], [], 15)
        assert ready, "--follow printed nothing after a new event"
        line = proc.stdout.readline()
        assert json.loads(line)["job_id"] == "1001"
    finally:
        proc.terminate()
        proc.wait(10)


def test_ls_lists_the_runs_under_a_folder_with_their_state(chain_run, mock_slurm_dir, tmp_path, capsys):
    other = tmp_path / "runs" / "team-b" / "second"
    assert cli(capsys, "submit", DEMO, "--run-dir", other)[0] == EXIT_OK
    code, out = cli(capsys, "ls", tmp_path / "runs", "--json")
    rows = {Path(r["run_dir"]).name: r for r in json.loads(out)}
    assert code == EXIT_OK and set(rows) == {"demo", "second"}
    assert rows["demo"]["status"] in ("running", "waiting") and rows["demo"]["jobs"] == 3
    assert rows["second"]["status"] == "submitted, never supervised" and rows["second"]["name"] == "demo-cpu-4node"
    # the jobs `runctl status` shows: a queued job of a run never supervised is live
    assert (rows["second"]["jobs"], rows["second"]["live_jobs"]) == (1, 1)
    status = json.loads(cli(capsys, "status", other, "--json")[1])
    assert len(status["jobs"]) == rows["second"]["jobs"]
    # its heartbeats are its job's, not "job -": the ledger names the job before a controller does
    assert status["dashboard"]["heartbeat_job"] == status["jobs"][0]["job_id"]
    code, out = cli(capsys, "ls", tmp_path / "runs")
    assert "NAME" in out and str(other) in out
    assert cli(capsys, "ls", tmp_path / "nowhere")[0] == EXIT_USAGE


def test_logs_prints_one_ranks_lines_all_of_them_or_the_first_error(chain_run, capsys):
    # srun --label output of the demo's 4 tasks, and lines of no rank
    output = ("runctl: job 1001 on node[01-04]\n0: step 1 loss 9.1\n3: step 1 loss 9.2\n1: hello\nsrun: error: x\n"
              "3: step 2\n2: Traceback (most recent call last):\n2:   File \"train.py\", line 7, in step\n"
              "2: RuntimeError: CUDA error: an illegal memory access\n")  # fmt: skip
    (RunPaths.of(chain_run).jobs / "slurm-1001.out").write_text(output)
    code, out = cli(capsys, "logs", chain_run, "--rank", "3")
    assert code == EXIT_OK and out.splitlines() == ["step 1 loss 9.2", "step 2"]
    code, out = cli(capsys, "logs", chain_run, "--rank", "0", "--job", "1001")
    assert out.splitlines() == ["step 1 loss 9.1"]
    code, text = cli(capsys, "logs", chain_run, "--rank", "0", "--job", "4711")
    assert code == EXIT_USAGE and "no output" in text
    code, text = cli(capsys, "logs", chain_run, "--rank", "4")
    assert code == EXIT_USAGE and "--rank 4: the run has 4 ranks, 0 to 3" in text
    code, out = cli(capsys, "logs", chain_run, "--all")
    assert code == EXIT_OK and out.splitlines()[:3] == ["0: step 1 loss 9.1", "3: step 1 loss 9.2", "1: hello"]
    assert "srun: error: x" not in out and len(out.splitlines()) == 7
    code, out = cli(capsys, "logs", chain_run, "--errors")
    assert code == EXIT_OK and out.splitlines()[0] == "rank 2: RuntimeError: CUDA error: an illegal memory access"
    assert '  File "train.py", line 7, in step' in out


def test_report_names_the_run_rounds_the_loss_and_prints_each_breakdown_once(chain_run, capsys):
    paths = RunPaths.of(chain_run)
    append_jsonl(paths.metrics, {"step": 1, "loss": 9.123456789, "step_seconds": 0.5, "time": time.time()})
    code, out = cli(capsys, "report", chain_run, "--out", chain_run.parent / "reports")
    assert code == EXIT_OK and out.startswith(f"run demo-cpu-4node: 1 steps, final loss 9.1235, status waiting\nrun directory: {chain_run}\n")
    assert out.count("goodput (") == 1, "a run younger than 24 h has one breakdown, printed once"


def test_doctor_says_a_controller_whose_pid_exited_is_not_running(chain_run, tmp_path, capsys):
    paths = RunPaths.of(chain_run)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    beat = json.loads(paths.controller_heartbeat.read_text())
    beat["pid"] = int(dead.stdout)
    paths.controller_heartbeat.write_text(json.dumps(beat))  # fresh: its mtime is now
    code, out = cli(capsys, "doctor", chain_run, "--state-dir", tmp_path / "doctor", "--json")
    controller = json.loads(out.strip().splitlines()[-1])["findings"][0]
    assert code == EXIT_FAILURE and not controller["ok"]
    assert f"its pid {dead.stdout.strip()} on this host" in controller["message"] and "has exited" in controller["message"]
