"""Training health end to end on the real local SLURM cluster: the real controller, the real
trainer (`python -m trainer`, one rank, the tiny model), real jobs, `runctl` for the operator.

One run, shared by the tests of this module (~60 s), with two TEST-ONLY faults (trainer/faults.py)
and the sample log on. Global batch 4, a checkpoint every 4 steps, 40 steps; health rules with a
10-step window, 2 steps in a row, rollback margin 0 steps and 1 batch, budget 2 rollbacks:
1. `poison@samples56-64`: the samples of steps 15-16 make their loss x8 (a spike caused by data).
   Rollback 1: back to step 12 (the newest checkpoint at or before 15 - 1), skipping from its
   consumed samples (12 x 4 = 48) to the onset's (15 x 4 = 60) + 1 batch: [48, 64).
2. `spike@step22,spike@step23`: those steps' loss x8 whenever they are trained (not data).
   Rollback 2: the new history read 64.. from step 13, so step 20 ended at 64 + 8 x 4 = 96 and step
   22 at 104: back to step 20, skipping [96, 108). Steps 22-23 spike again: the budget (2) is
   spent, the controller refuses a third rollback, notifies and pauses the run.
3. The on-call operator rolls back by hand with `runctl rollback --to-step 24 --skip-samples
   124:132`: the history after rollback 2 read 108.. from step 21, so step 24 ended at 124; the
   run resumes from step 24 and finishes at step 40.
Expected final sample order, by hand: 0..47 (steps 1-12), 64..95 (13-20), 108..123 (21-24),
132..195 (25-40).
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from fakes import REPO, WebhookServer, kind_of
from rollback_runs import drive, final_order, job_outputs, of_kind, sample_lines

from orchestrator.cli.main import main
from orchestrator.contract import RunPaths, read_jsonl
from orchestrator.contract.state import RunStatus
from orchestrator.controller import Controller
from orchestrator.plan.config import parse_config
from orchestrator.plan.config.load import resolve_paths
from tests.run_records import event_dicts
from tests.trainer.runs import ensure_corpus, tiny_config_dict

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
STEPS, GBS = 40, 4  # steps enough after each spike for the stop to reach a loaded machine's trainer
FAULTS = "poison@samples56-64,spike@step22,spike@step23"
EXPECTED_ORDER = [*range(0, 48), *range(64, 96), *range(108, 124), *range(132, 196)]


def health_config(webhook: str, **health):
    ensure_corpus()
    data = tiny_config_dict(
        cluster={"nodes": 1, "gpus_per_node": 1, "python": sys.executable, "cpus_per_task": 1,
                 "env": {"DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"}},
        optimizer={"lr": 3e-3, "min_lr": 1e-4, "warmup_samples": 16},
        data={"eval_iters": 0, "eval_interval": 1000},
        checkpoint={"interval_steps": 4, "keep_last": 20},
        watchdog={"heartbeat_seconds": 0.5, "poll_seconds": 0.5, "dead_after_seconds": 8, "step_timeout_seconds": 20},
        operators={"group": None, "users": []},
        notifications={"urls": [webhook]},
        health={"spike_window": 10, "grad_norm_window": 10, "spike_consecutive": 2, "rollback_margin_steps": 0,
                "rollback_skip_margin_batches": 1, "rollback_budget": 2, **health},
    )
    return resolve_paths(parse_config(data, source="tests"), REPO / "configs")


@dataclass
class Scenario:
    paths: RunPaths
    paused: str  # the status after the budget stopped the run
    finished: str
    notified: list[dict]
    seconds: float


@pytest.fixture(scope="module")
def scenario(local_cluster):
    from orchestrator.operate.runs import prepare_run_dir, submit_job
    from orchestrator.slurm.real import SlurmScheduler

    webhook = WebhookServer()
    root = Path(tempfile.mkdtemp(prefix="rc-health-", dir="/tmp"))
    cfg = health_config(webhook.url, policy={"loss_spike": "rollback"})
    run = root / "run"
    prepare_run_dir(cfg, run)
    env = {**local_cluster.slurm_env(), "TRAINER_MAX_STEPS": str(STEPS), "TRAINER_TENSORBOARD": "0",
           "TRAINER_SAMPLE_LOG": "1", "TRAINER_FAULT": FAULTS, "TRAINER_STEP_DELAY_SECONDS": "0.25",
           "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    scheduler = SlurmScheduler(env=env)
    submit_job(run, cfg, scheduler, reason="initial")
    ctl = Controller(run, cfg, scheduler)
    ctl.start()
    began = time.monotonic()
    try:
        paused = drive(ctl, 240)
        rc = main(["rollback", str(run), "--to-step", "24", "--skip-samples", "124:132",
                   "--reason", "spike at 22-23 is not data; skip the next 2 batches anyway"])
        assert rc == 0
        finished = drive(ctl, 120)
        seconds = time.monotonic() - began
        print(f"health scenario: {seconds:.1f} s, {len(ctl.state.jobs)} jobs")
        yield Scenario(ctl.paths, paused, finished, list(webhook.received), seconds)
    finally:
        live = [j.job_id for j in ctl.state.live_jobs()]
        if live:
            ctl.scheduler.cancel(live)
        ctl.stop()
        webhook.close()
        shutil.rmtree(root, ignore_errors=True)


def test_a_data_spike_is_rolled_back_and_its_samples_never_come_again(scenario):
    paths = scenario.paths
    first = of_kind(paths, "health_finding")[0]
    assert (first["finding"], first["onset_step"], first["met_step"], first["policy"]) == ("loss_spike", 15, 16, "rollback")
    plans = of_kind(paths, "rollback_planned")
    assert (plans[0]["to_step"], plans[0]["skip_samples"], plans[0]["automatic"]) == (12, [[48, 64]], True)
    applied = of_kind(paths, "rollback_applied")
    assert applied, f"no job applied the rollback:\n{job_outputs(paths)}"
    assert applied[0]["directive_id"] == plans[0]["directive_id"] and applied[0]["resumed_from"] == 12
    kinds = [e["event"] for e in event_dicts(paths)]
    order = [kinds.index(k) for k in ("health_finding", "rollback_planned", "job_ended", "rollback_started",
                                      "rollback_applied")]
    assert order == sorted(order), kinds
    ended = of_kind(paths, "job_ended")[0]
    assert ended["exit_code"] == 17, "the trainer saved and stopped through the kill path"
    # The data index order, every other sample in order; the skipped ones never read again.
    lines = sample_lines(paths)
    back = next(i for i in range(1, len(lines)) if lines[i]["step"] <= lines[i - 1]["step"])
    after_first_rollback = {p for line in lines[back:] for p in line["positions"]}
    assert not after_first_rollback & set(range(48, 64))
    order = final_order(paths)
    print(f"final order: {len(order)} samples; skipped {sorted(set(range(196)) - set(order))}")
    assert order == EXPECTED_ORDER


def test_a_spike_that_comes_back_stops_at_the_budget_and_notifies(scenario):
    paths = scenario.paths
    assert scenario.paused == RunStatus.PAUSED
    plans = of_kind(paths, "rollback_planned")
    assert (plans[1]["to_step"], plans[1]["skip_samples"], plans[1]["rollbacks_in_window"]) == (20, [[96, 108]], 1)
    spikes = [(e["onset_step"], e["met_step"]) for e in of_kind(paths, "health_finding")]
    assert spikes[:3] == [(15, 16), (22, 23), (22, 23)], spikes
    [refused] = of_kind(paths, "rollback_refused")
    assert refused["rollbacks_in_window"] == 2 and "budget" in refused["why"]
    stopped = [e for e in of_kind(paths, "run_stopped") if e["status"] == "paused_for_health"]
    assert len(stopped) == 1 and of_kind(paths, "health_pause_requested")
    said = [r["message"] for r in scenario.notified if kind_of(r) == "health"]
    print("\n".join(said))
    assert any("no automatic rollback" in text and "budget" in text for text in said)
    assert sum("rollback planned" in text for text in said) == 2
    assert len(of_kind(paths, "rollback_applied")) >= 2


def test_the_operators_rollback_is_audited_and_the_run_finishes_on_the_trend(scenario):
    paths = scenario.paths
    assert scenario.finished == RunStatus.FINISHED
    audit = [json.loads(line) for line in paths.audit.read_text().splitlines()]
    [asked] = [a for a in audit if a["action"] == "rollback"]
    assert asked["allowed"] and asked["via"] == "control/rollback"
    assert asked["details"] == {"to_step": 24, "skip_samples": [[124, 132]], "lr_scale": 1.0, "lr_scale_steps": 0}
    manual = of_kind(paths, "rollback_planned")[-1]
    assert not manual["automatic"] and manual["by"] == asked["user"] and manual["to_step"] == 24
    assert of_kind(paths, "rollback_applied")[-1]["resumed_from"] == 24
    assert not paths.control_request("rollback").exists(), "the request is consumed"
    # Back on the pre-spike trend: a straight line through the losses of steps 1-14 (before the
    # first onset); no later loss of the final history (bar steps 22-23, spiked on purpose) lies
    # above it by more than three times the largest distance of those 14 points from it.
    history: dict[int, float] = {}
    for record in read_jsonl(paths.metrics):
        history[record["step"]] = record["loss"]  # the last record of a step is the kept history's
    assert sorted(history) == list(range(1, STEPS + 1))
    pre = [(s, history[s]) for s in range(1, 15)]
    mean_s, mean_l = sum(s for s, _ in pre) / len(pre), sum(v for _, v in pre) / len(pre)
    slope = sum((s - mean_s) * (v - mean_l) for s, v in pre) / sum((s - mean_s) ** 2 for s, _ in pre)
    line = lambda s: mean_l + slope * (s - mean_s)  # noqa: E731
    band = 3 * max(abs(v - line(s)) for s, v in pre)
    above = {s: round(history[s] - line(s), 4) for s in range(15, STEPS + 1) if s not in (22, 23)}
    print(f"pre-spike line: {mean_l:.4f} {slope:+.5f}/step, band {band:.4f}; above it after: {above}")
    assert max(above.values()) <= band
    assert history[22] > line(22) + 10 * band, "the spike of step 22 must be in the final history (budget)"


def test_runctl_health_shows_the_findings_and_draws_the_curve(scenario, tmp_path, capsys):
    png = tmp_path / "health.png"
    assert main(["health", str(scenario.paths.root), "--png", str(png), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["status"] == "finished" and shown["last_step"] == STEPS
    assert [(f["kind"], f["onset_step"]) for f in shown["findings"]] == [("loss_spike", 22)]
    kinds = [e["event"] for e in shown["controller_events"]]
    assert kinds.count("rollback_planned") == 3 and "rollback_refused" in kinds
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    assert main(["health", str(scenario.paths.root), "--no-png"]) == 0
    text = capsys.readouterr().out
    print(text)
    assert "finding (rollback): loss spike: loss" in text and "rollback_refused" in text
