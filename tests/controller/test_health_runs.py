"""Training health without SLURM: the real trainer (`python -m trainer`, one rank, the tiny model)
started by an in-process scheduler, the real controller, and `runctl sdc-check` as a local aux job.

One run, shared (~10 s): the poisoned run of test_health_slurm.py (`poison@samples56-64`: the loss
of steps 15-16 x8) with the loss-spike policy `notify`, 20 steps. It is also the untouched run the
SDC replay checks: the steps it replays (5-7, from checkpoint 4) come before the poison, so they
compute exactly what the run recorded.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from fakes import REPO, FakeScheduler, WebhookServer, fake_submitter, kind_of, supervise
from test_health_slurm import health_config

from orchestrator.cli.main import main
from orchestrator.contract import RunPaths, read_jsonl
from orchestrator.contract.state import RunStatus
from orchestrator.controller import Controller
from orchestrator.slurm.base import JobState
from orchestrator.slurm.render import run_job_name
from tests.run_records import event_dicts
from tests.trainer.launch_local import free_port

pytest.importorskip("deepspeed")
pytestmark = pytest.mark.slow
STEPS = 20


class TrainerScheduler(FakeScheduler):
    """FakeScheduler's queue, running `python -m trainer RUN_DIR` (one rank) as each job."""

    def _start(self, job) -> None:
        job.nodes, job.state, job.start_time = ["node01"], JobState.RUNNING, time.time()
        env = {**os.environ, **self.env, "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0",
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "TRAINER_JOB_ID": job.job_id,
               "PYTHONPATH": str(REPO), "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"}
        log = open(self.run_dir / "logs" / f"job-{job.job_id}.log", "ab")  # noqa: SIM115 (the process owns it)
        job.procs.append(subprocess.Popen([sys.executable, "-m", "trainer", str(self.run_dir)], env=env,
                                          stdout=log, stderr=subprocess.STDOUT))


@pytest.fixture(scope="module")
def notify_run(tmp_path_factory):
    from orchestrator.operate.runs import prepare_run_dir

    webhook = WebhookServer()
    cfg = health_config(webhook.url)  # every policy the default: notify
    run = tmp_path_factory.mktemp("health-notify") / "run"
    prepare_run_dir(cfg, run)
    (run / "logs").mkdir()
    scheduler = TrainerScheduler(run, 1, env={"TRAINER_MAX_STEPS": str(STEPS), "TRAINER_TENSORBOARD": "0",
                                              "TRAINER_FAULT": "poison@samples56-64"})
    ctl = Controller(run, cfg, scheduler, submitter=fake_submitter(scheduler, run_job_name(cfg.name, run.resolve())))
    ctl.start()
    try:
        status = supervise(ctl, 120)
    finally:
        scheduler.shutdown()
        ctl.stop()
        webhook.close()
    return run, status, list(webhook.received)


def test_with_policy_notify_a_spike_is_only_notified(notify_run):
    run, status, notified = notify_run
    paths = RunPaths.of(run)
    assert status == RunStatus.FINISHED
    findings = [e for e in event_dicts(paths) if e["event"] == "health_finding"]
    assert [(e["finding"], e["onset_step"], e["met_step"], e["policy"]) for e in findings] == [
        ("loss_spike", 15, 16, "notify")
    ]
    acted = {"kill_requested", "health_pause_requested", "rollback_planned", "rollback_refused", "rollback_started"}
    assert not [e["event"] for e in event_dicts(paths) if e["event"] in acted]
    assert [kind_of(r) for r in notified] == ["health", "finish"]
    assert "loss spike: loss" in notified[0]["message"] and "policy notify" in notified[0]["message"]
    assert [r["step"] for r in read_jsonl(paths.metrics)] == list(range(1, STEPS + 1)), "every step once"
    assert not paths.rollback_directive.exists() and not paths.accepted_request("kill").exists()


def sdc_check(run, *more: str) -> int:
    return main(["sdc-check", str(run), "--step", "4", "--steps", "3", "--local", *more])


def test_sdc_check_matches_an_untouched_run_bitwise_and_names_an_altered_step(notify_run, capsys):
    run, _, _ = notify_run
    paths = RunPaths.of(run)
    rc = sdc_check(run, "--json")
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    print(result)
    assert rc == 0 and result["match"] and result["comparison"] == "bitwise"
    assert result["steps_replayed"] == [5, 6, 7] and result["mismatched_steps"] == []
    report = json.loads(paths.replay_report(4, 3).read_text())
    assert [row["replayed_loss"] == row["recorded_loss"] for row in report["per_step"]] == [True] * 3
    # Step 6's recorded loss altered in metrics.jsonl, as a bit flip on the node would have made it.
    lines = paths.metrics.read_text().splitlines()
    index = next(i for i, line in enumerate(lines) if json.loads(line)["step"] == 6)
    record = json.loads(lines[index])
    record["loss"] += 1e-3
    lines[index] = json.dumps(record)
    paths.metrics.write_text("\n".join(lines) + "\n")
    rc = sdc_check(run, "--reason", "loss of step 6 looks odd")
    said = capsys.readouterr().out
    print(said)
    assert rc == 1 and "MISMATCH" in said and "first differing step: 6 (loss)" in said
    ended = [e for e in event_dicts(paths) if e["event"] in ("aux_submitted", "aux_finished")]
    assert [e["kind"] for e in ended] == ["sdc-check"] * 4
    result = ended[-1]["result"]
    assert not result["match"] and result["mismatched_steps"] == [6]
    assert result["first_mismatch"] == {"step": 6, "differ": ["loss"], "dp_replicas": []}
    audit = [json.loads(line) for line in paths.audit.read_text().splitlines()]
    assert audit[-1]["action"] == "sdc-check" and audit[-1]["reason"] == "loss of step 6 looks odd"
