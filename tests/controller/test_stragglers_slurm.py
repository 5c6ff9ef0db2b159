"""Straggler detection on the real local SLURM cluster with the real trainer (`python -m trainer`).

3 nodes x 1 rank, pure data parallelism (tp=1, pp=1, dp=3): every rank does the same work, so the
median of the three is the healthy pace. Rank 1 (the job's second node) burns 1 s of extra CPU
before every step from step 5 on (TRAINER_FAULT=slow@step5:rank1). The controller must flag that
node, and only it (steps 1-4 are healthy: init, warm-up, then scored rounds; the final save too):
a `straggler` event, one webhook notification, `runctl status` showing it, and (straggler_exclude)
the node on the exclude list with the reason.
The heartbeats also show what the measure is for: the healthy ranks' step time (wall) rises with
the straggler's, their compute time does not.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml
from fakes import REPO, WebhookServer, kind_of

from orchestrator.cli.main import main
from orchestrator.contract import read_heartbeats
from orchestrator.contract.exclude import read_excluded
from orchestrator.contract.state import RunStatus
from orchestrator.controller import Controller
from orchestrator.plan.config import parse_config
from orchestrator.plan.config.load import resolve_paths
from tests.run_records import event_dicts

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
STEPS = 12


def straggler_config(webhook_url: str):
    data = yaml.safe_load((REPO / "configs" / "demo-cpu-4node.yaml").read_text())
    data["cluster"].update(nodes=3, gpus_per_node=1, python=sys.executable)
    data["parallel"].update(tp=1, pp=1, micro_batch_size=2, global_batch_size=6)
    corpus = REPO / "data" / "corpus" / "multilingual_text_document"
    data["data"]["datasets"] = [{"path": str(corpus), "weight": 1.0}]
    data["checkpoint"].update(interval_steps=100)  # only the final save: this test is about steps
    data["watchdog"].update(heartbeat_seconds=0.5, poll_seconds=0.5, dead_after_seconds=8, step_timeout_seconds=30,
                            straggler_threshold=1.2, straggler_seconds=3, straggler_exclude=True)  # fmt: skip
    data["operators"] = {"group": None, "users": []}
    data["notifications"] = {"urls": [webhook_url], "events": ["straggler"]}
    return resolve_paths(parse_config(data, source="stragglers-e2e"), REPO / "configs")


def test_slow_rank_flagged_with_event_notification_and_status(local_cluster, monkeypatch, capsys):
    from orchestrator.operate.runs import prepare_run_dir, submit_job
    from orchestrator.slurm.real import SlurmScheduler

    hook = WebhookServer()
    root = Path(tempfile.mkdtemp(prefix="rc-straggler-", dir="/tmp"))
    cfg = straggler_config(hook.url)
    run = root / "run"
    prepare_run_dir(cfg, run)
    env = {**local_cluster.slurm_env(), "TRAINER_MAX_STEPS": str(STEPS), "TRAINER_TENSORBOARD": "0",
           "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "TRAINER_FAULT": "slow@step5:rank1"}  # fmt: skip
    scheduler = SlurmScheduler(env=env)
    submit_job(run, cfg, scheduler, reason="initial")
    ctl = Controller(run, cfg, scheduler)
    ctl.start()
    try:
        t0 = time.monotonic()
        deadline = t0 + 300
        while ctl.tick().status not in RunStatus.STOPPED:
            assert time.monotonic() < deadline, "".join(p.read_text()[-3000:] for p in ctl.paths.jobs.glob("slurm-*.out"))
            time.sleep(cfg.watchdog.poll_seconds)
        print(f"run with a slow rank: {time.monotonic() - t0:.1f} s, {ctl.state.status}")
        assert ctl.state.status == RunStatus.FINISHED
        slow_node = ctl.state.jobs[0].nodes[1]  # block distribution, one rank per node: rank 1

        events = event_dicts(ctl.paths)
        flagged = [e for e in events if e["event"] == "straggler"]
        print("straggler events:", json.dumps(flagged))
        assert [e["node"] for e in flagged] == [slow_node], "the slow rank's node, once, and no healthy node"
        assert flagged[0]["score"] >= 1.2 and flagged[0]["slow_for_seconds"] >= 3
        assert flagged[0]["step"] >= 7, "slow from step 5, and a straggler needs 3 slow rounds: step 7 at the earliest"
        notes = [r for r in hook.received if kind_of(r) == "straggler"]
        assert len(notes) == 1 and f"node: {slow_node}" in notes[0]["message"], notes  # apprise's JSON, our body
        # straggler_exclude: on the run's exclude list (for the next restart or submission), with why.
        excluded = next(e for e in events if e["event"] == "nodes_excluded")
        assert excluded["nodes"] == [slow_node] and excluded["cause"] == "straggler"
        assert read_excluded(ctl.paths)[slow_node]["reason"].startswith(f"straggler in job {flagged[0]['job_id']}")

        beats = {b.rank: b for b in read_heartbeats(ctl.paths.heartbeats)}
        for rank, beat in sorted(beats.items()):
            print(f"rank {rank}: last step {beat.step_seconds:.3f} s wall, {beat.compute_seconds:.3f} s compute")
        assert beats[1].compute_seconds >= 1.0  # the fault's busy second is its compute
        assert beats[0].step_seconds >= 1.0, "rank 0 waited for rank 1 in the collectives"
        assert beats[0].compute_seconds * 1.2 < beats[1].compute_seconds, "waiting is not computing"

        for name, value in {**local_cluster.env(), "PATH": local_cluster.slurm_env()["PATH"]}.items():
            monkeypatch.setenv(name, value)
        monkeypatch.setenv("RUNCTL_SCHEDULER", "slurm")
        with capsys.disabled():
            print(capsys.readouterr().out)  # what the test printed so far, before the command's output
        assert main(["status", str(run), "--json"]) == 0
        shown = json.loads(capsys.readouterr().out)["stragglers"]
        assert shown["nodes"][slow_node]["straggler"] is True
        assert [n for n, v in shown["nodes"].items() if v["straggler"]] == [slow_node]
        assert main(["status", str(run)]) == 0
        table = capsys.readouterr().out
        print(table)
        assert f"stragglers (job {ctl.state.jobs[0].job_id}" in table
        assert any(line.split()[:1] == [slow_node] and line.endswith("STRAGGLER") for line in table.splitlines())
    finally:
        live = [j.job_id for j in ctl.state.live_jobs()]
        if live:
            ctl.scheduler.cancel(live)
        ctl.stop()
        hook.close()
        shutil.rmtree(root, ignore_errors=True)
