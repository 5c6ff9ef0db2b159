"""A dataset that vanishes after `runctl submit`, on the real local SLURM cluster with the real
trainer: the trainer refuses the config (exit 19, trainer/loop.py build_datasets) and the run
stops once, as a config error: no crash counted, no restart, no node excluded. Everything goes
through the CLI (submit, watch --once, events), as an operator would drive it.

The smallest run there is: one rank on one node (tp = pp = dp = 1)."""

from __future__ import annotations

import json
import time

import pytest
from one_rank_run import one_rank_config, submit_environment, write_config

from orchestrator.cli.main import main
from orchestrator.contract import RunPaths, read_jsonl
from orchestrator.contract.exclude import excluded_nodes

pytestmark = pytest.mark.slurm


def test_a_dataset_gone_after_submit_stops_the_run_once_as_a_config_error(local_cluster, tmp_path, monkeypatch, capsys):
    submit_environment(local_cluster, monkeypatch)
    config, data_dir = one_rank_config(tmp_path)
    path = write_config(tmp_path, config)
    run_dir = tmp_path / "run"

    assert main(["submit", path, "--run-dir", str(run_dir)]) == 0, capsys.readouterr().err
    for suffix in (".bin", ".idx"):  # the dataset goes away before the job starts
        (data_dir / f"corpus{suffix}").unlink()
    paths = RunPaths.of(run_dir)
    deadline = time.monotonic() + 150
    status = None
    while time.monotonic() < deadline:
        assert main(["watch", str(run_dir), "--once", "--json"]) == 0
        status = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["status"]
        if status in ("config_error", "finished", "crash_loop", "killed"):
            break
        time.sleep(1)
    output = "".join(p.read_text(errors="replace")[-3000:] for p in paths.jobs.glob("slurm-*.out"))
    print(output)
    assert status == "config_error", output

    state = json.loads(paths.state.read_text())
    events = [e["event"] for e in read_jsonl(paths.events)]
    print(events)
    assert len(state["jobs"]) == 1 and state["jobs"][0]["exit_code"] == 19
    assert state["restarts"] == 0 and state["restarts_without_progress"] == 0, "a config error is not a crash"
    assert events.count("run_stopped") == 1 and "restart" not in events and "job_submitted" not in events
    assert excluded_nodes(paths) == [] and "nodes_excluded" not in events
    assert "data.datasets[0].path" in output and "corpus.idx not found" in output, "the job's output says what is missing"
    assert main(["events", str(run_dir), "--type", "run_stopped"]) == 0
    stopped = capsys.readouterr().out
    assert "config_error" in stopped and "refused the config" in stopped
