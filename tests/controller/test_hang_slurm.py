"""Issue 20 on the real local SLURM cluster: hangs are silence of the progress below the step.

The demo model (tp=2, pp=2) as 2 nodes x 2 ranks, the real trainer (`python -m trainer`), driven by
the real Controller with its real SlurmScheduler, faults from trainer/faults.py (TEST-ONLY):
- hang run: rank 1 sleeps for ever at the start of step 4; its peers block in the step's
  collectives. Every step is preceded by a 2 s sleep (TRAINER_STEP_DELAY_SECONDS): an honest gap
  without a mark, so that the step limit is LEARNED (3 x ~2 s) and above its 4 s floor. Detected
  within limit + heartbeat + 2 polls of rank 1's last mark (docs/oncall.md's bound), not before
  the limit.
- slow run (global batch 32: 16 micro-batches a step): rank 1 burns CPU before each forward and
  backward of steps 5-7 (~5x the step time), and the save of step 8 sleeps 20 ms after every
  chunk (well over 10x its time, and longer than the checkpoint limit): neither is a hang; the run
  finishes in its first job.
- hangsave run: rank 1's writer blocks after the first chunk of step 8's save: a hang (phase
  checkpoint); the run restarts from the step-4 checkpoint and finishes.
The watchdog: heartbeat 1 s, poll 1 s, progress floors of 4 s (init 90 s: the model build is an
honest ~10 s without a mark on a quiet machine, 30 s and more on a loaded one), factor 3, cap 90 s.
The numbers are printed.
"""

from __future__ import annotations

import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml
from fakes import REPO
from test_e2e_slurm import drive, job_outputs

from orchestrator.contract import Heartbeat, RunPaths, read_heartbeats, read_jsonl
from orchestrator.contract.state import RunStatus
from orchestrator.controller import Controller
from orchestrator.plan.config import parse_config
from orchestrator.plan.config.load import resolve_paths
from tests.run_records import event_dicts

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

HEARTBEAT, POLL, FLOOR, INIT_FLOOR, FACTOR = 1.0, 1.0, 4.0, 90.0, 3.0
# Slack on the detection bound for a pass that runs late (4 ranks and the controller on 2 cores).
LATE_PASS = 2.0
STEP_DELAY = 2.0  # the hang run's honest gap before every step
SLOW_SAVE_CHUNK = 0.02  # the slow run's sleep after each chunk of step 8's save (~400 chunks: ~8 s)
HUNG_RANK = 1


def hang_config(global_batch: int = 8):
    data = yaml.safe_load((REPO / "configs" / "demo-cpu-4node.yaml").read_text())
    data["cluster"].update(nodes=2, gpus_per_node=2, python=sys.executable)
    corpus = REPO / "data" / "corpus"
    if not (REPO / "data" / "corpus.idx").exists() and (corpus / "multilingual_text_document.idx").exists():
        corpus = corpus / "multilingual_text_document"
    data["data"]["datasets"] = [{"path": str(corpus), "weight": 1.0}]
    data["parallel"]["global_batch_size"] = global_batch
    data["checkpoint"].update(interval_steps=4)
    data["watchdog"].update(
        heartbeat_seconds=HEARTBEAT, poll_seconds=POLL, dead_after_seconds=8, step_timeout_seconds=20,
        progress_floor_seconds={"init": INIT_FLOOR, "step": FLOOR, "checkpoint": FLOOR, "eval": FLOOR},
        progress_factor=FACTOR, progress_cap_seconds=INIT_FLOOR,
    )
    data["operators"] = {"group": None, "users": []}
    data["notifications"] = {}
    return resolve_paths(parse_config(data, source="hang-slurm"), REPO / "configs")


class Run:
    """One run directory, its controller on the real cluster, and what the test saw of it."""

    def __init__(self, local_cluster, cfg, env: dict[str, str]):
        from orchestrator.operate.runs import prepare_run_dir, submit_job
        from orchestrator.slurm.real import SlurmScheduler

        self.root = Path(tempfile.mkdtemp(prefix="rc-hang-", dir="/tmp"))
        prepare_run_dir(cfg, self.root / "run")
        scheduler = SlurmScheduler(env={**local_cluster.slurm_env(), "TRAINER_TENSORBOARD": "0",
                                        "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", **env})
        submit_job(self.root / "run", cfg, scheduler, reason="initial")
        self.ctl = Controller(self.root / "run", cfg, scheduler, stack_wait_seconds=2.0)
        self.paths = self.ctl.paths
        self.beats: dict[int, Heartbeat] = {}  # per rank: its newest beat seen by the test
        self.limits_seen: list[tuple[int, dict]] = []  # per pass: rank 1's last step done, the limits
        self.first_save: float | None = None  # rank 0's first save (its beat's longest checkpoint phase)
        self.status = ""

    def watch(self, ctl: Controller) -> None:
        if failures(ctl.paths):
            return  # keep the beats as they were when the hang was found
        for beat in read_heartbeats(ctl.paths.heartbeats):
            self.beats[beat.rank] = beat
            if beat.rank == 0 and self.first_save is None and "checkpoint" in beat.durations:
                self.first_save = beat.durations["checkpoint"]
        if HUNG_RANK in self.beats:
            self.limits_seen.append((self.beats[HUNG_RANK].step, ctl.timeouts.as_dict()["timeouts"]))

    def cancel_jobs(self) -> None:
        """Once a run has shown what its tests read: its restart would hang again (the fault is in
        the job's environment) and hold 2 of the 4 nodes and 4 busy ranks while the next run goes on
        (seen: a save of the slow run past its 4 s floor at that load, a false hang, node03 excluded,
        and its restart pending for the full 300 s)."""
        live = [j.job_id for j in self.ctl.state.live_jobs()]
        if live:
            self.ctl.scheduler.cancel(live)

    def close(self) -> None:
        self.cancel_jobs()
        self.ctl.stop()
        shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture(scope="module")
def runs(local_cluster):
    made: list[Run] = []

    def start(cfg, env: dict[str, str]) -> Run:
        made.append(Run(local_cluster, cfg, env))
        made[-1].ctl.start()
        return made[-1]

    yield start
    for run in made:
        run.close()


def which_limit(limit: float, floor: float) -> str:
    return "the floor" if limit <= floor else "learned"


def failures(paths: RunPaths) -> list[dict]:
    return [e for e in event_dicts(paths) if e["event"] == "failure"]


@pytest.fixture(scope="module")
def hang_run(runs):
    run = runs(hang_config(), {"TRAINER_MAX_STEPS": "12", "TRAINER_STEP_DELAY_SECONDS": str(STEP_DELAY),
                               "TRAINER_FAULT": f"hang@step4:rank{HUNG_RANK}"})
    t0 = time.monotonic()
    drive(run.ctl, 240, act=run.watch, until=lambda c: bool(failures(c.paths)))
    print(f"hang run: {time.monotonic() - t0:.1f} s")
    run.cancel_jobs()
    return run


@pytest.fixture(scope="module")
def slow_run(runs):
    run = runs(hang_config(global_batch=32),
               {"TRAINER_MAX_STEPS": "9", "TRAINER_FAULT": f"slowmicro@step5:rank{HUNG_RANK},slowsave@step8",
                "TRAINER_SLOW_SAVE_CHUNK_SECONDS": str(SLOW_SAVE_CHUNK)})
    t0 = time.monotonic()
    status = drive(run.ctl, 300, act=run.watch)
    print(f"slow run: {time.monotonic() - t0:.1f} s, {status}")
    run.status = status
    return run


def test_rank_hung_mid_step_detected_within_learned_limit_plus_a_poll(hang_run):
    failure = failures(hang_run.paths)[0]
    # The ranks found hung: rank 1 itself, or, when its last mark was the wait of the step's
    # agreement, the peers stuck behind it (the everyone-stuck rule). Either way one hang, at step 3.
    assert failure["cause"] == "hang" and {r["step"] for r in failure["ranks"]} == {3}, failures(hang_run.paths)
    hung = next((r for r in failure["ranks"] if r["rank"] == HUNG_RANK), failure["ranks"][0])
    print(f"ranks found hung: {sorted(r['rank'] for r in failure['ranks'])}")
    limit = hung["limit_seconds"]
    # When the hang began: the hung rank's last mark (its beat's progress_time; the emulated nodes
    # are this machine, one clock), read by the test from the node files, not from the controller.
    last_mark = hang_run.beats[HUNG_RANK].progress_time
    detected_after = failure["detection_time"] - last_mark
    gaps = {phase: round(g, 3) for phase, g in hang_run.beats[HUNG_RANK].mark_gaps.items()}
    bound = limit + HEARTBEAT + 2 * POLL
    print(f"controller: no progress seen for {hung['age_seconds']:.2f} s when it declared the hang")
    print(f"hang of rank {HUNG_RANK} at step {hung['step']} ({hung['phase']}): step limit {limit:.2f} s "
          f"({which_limit(limit, FLOOR)}; floor {FLOOR:g} s, factor {FACTOR:g} x the longest gap; rank "
          f"{HUNG_RANK}'s gaps {gaps}); detected {detected_after:.2f} s after its last mark "
          f"(limit + one poll = {limit + POLL:.2f} s; limit + heartbeat + 2 polls = {bound:.2f} s)")
    assert hung["phase"] == "step", failure
    # Learned from the gaps between marks, not the floor: the 2 s sleep before each step is the
    # longest honest gap, so the limit is about 3 x 2 s.
    assert FACTOR * STEP_DELAY <= limit < FACTOR * (STEP_DELAY + 1.0), failure
    # Never before the limit; at most one beat (to report the last mark) and two passes (to see it,
    # then to find the limit passed) after it.
    assert limit <= detected_after <= bound + LATE_PASS, (detected_after, limit)


def step_seconds(run: Run) -> dict[int, float]:
    return {m["step"]: m["step_seconds"] for m in read_jsonl(run.paths.metrics) if m.get("step_seconds")}


def assert_no_failure(run: Run) -> None:
    assert not failures(run.paths), f"declared failed (a false hang?): {failures(run.paths)}"
    assert run.status == RunStatus.FINISHED and len(run.ctl.state.jobs) == 1, job_outputs(run.paths)


def test_rank_five_times_slower_for_three_steps_is_not_a_hang(slow_run):
    assert_no_failure(slow_run)
    seconds = step_seconds(slow_run)
    usual = statistics.median(s for step, s in seconds.items() if step not in (5, 6, 7))
    factors = [round(seconds[step] / usual, 1) for step in (5, 6, 7)]
    # The step limits in force while steps 5-7 ran (rank 1's beat says step 4, 5 or 6 done).
    step_limits = sorted({limits["step"] for done, limits in slow_run.limits_seen if done in (4, 5, 6)})
    print(f"steps 5-7 at {factors} x the usual {usual:.2f} s; step limits the controller used {step_limits} s")
    assert sorted(seconds) == list(range(1, 10)), seconds
    # "5x": the fault adds a fixed sleep to each micro-batch, so the factor falls as the usual step
    # grows with the machine's load (5x at a 1.0 s step; 2.3x seen at 2.54 s on a slower machine).
    assert all(2.0 <= f <= 9.0 for f in factors), factors
    # The slow steps take longer than the step limit: only the micro-batches moving keep it alive.
    assert min(seconds[step] for step in (5, 6, 7)) > max(step_limits), (seconds, step_limits)


def test_save_ten_times_slower_and_past_its_limit_with_bytes_moving_is_not_a_hang(slow_run):
    assert_no_failure(slow_run)
    # Rank 0's beats: the longest save so far, after step 4's (usual) and at the end (step 8's).
    usual, slowed = slow_run.first_save, slow_run.beats[0].durations["checkpoint"]
    factor = slowed / usual
    checkpoint_limits = sorted({limits["checkpoint"] for done, limits in slow_run.limits_seen if done == 8})
    print(f"save of step 4 {usual:.3f} s, of step 8 {slowed:.3f} s: {factor:.1f} x; checkpoint limits used "
          f"{checkpoint_limits} s")
    # "10x" at least: the fault sleeps a fixed time per chunk, so the factor rises as the usual save
    # shrinks on a quieter machine (CI under load: 0.09 s usual; a 4.5 ms sleep gave 20x).
    assert factor >= 10.0, (usual, slowed)
    # However long it takes: longer than the checkpoint limit in force, alive only by its bytes moving.
    assert slowed > max(checkpoint_limits), (slowed, checkpoint_limits)


@pytest.fixture(scope="module")
def hangsave_run(runs):
    run = runs(hang_config(), {"TRAINER_MAX_STEPS": "10", "TRAINER_FAULT": f"hangsave@step8:rank{HUNG_RANK}"})

    def act(ctl: Controller) -> None:
        run.watch(ctl)
        beat = run.beats.get(HUNG_RANK)
        if beat is not None and beat.step == 8 and beat.phase.value == "checkpoint":
            # The faulty save has begun (the ranks have their environment): the restart runs clean.
            ctl.scheduler.env.pop("TRAINER_FAULT", None)

    t0 = time.monotonic()
    run.status = drive(run.ctl, 300, act=act)
    print(f"hangsave run: {time.monotonic() - t0:.1f} s, {run.status}")
    return run


def test_save_whose_writer_blocks_is_a_hang_and_the_run_recovers(hangsave_run):
    run = hangsave_run
    failure = failures(run.paths)[0]
    hung = next(r for r in failure["ranks"] if r["rank"] == HUNG_RANK)
    limit = hung["limit_seconds"]
    detected_after = failure["detection_time"] - run.beats[HUNG_RANK].progress_time
    print(f"blocked save of step {hung['step']}: checkpoint limit {limit:.2f} s ({which_limit(limit, FLOOR)}); "
          f"detected {detected_after:.2f} s after rank {HUNG_RANK}'s last mark; findings {failure['ranks']}")
    assert failure["cause"] == "hang" and hung["phase"] == "checkpoint" and hung["step"] == 8, failure
    assert limit <= detected_after <= limit + HEARTBEAT + 2 * POLL + 0.5, (detected_after, limit)
    restart = next(e for e in event_dicts(run.paths) if e["event"] == "restart")
    assert restart["resume_step"] == 4, restart  # step 8's checkpoint never got its manifest
    assert run.status == RunStatus.FINISHED and len(failures(run.paths)) == 1, job_outputs(run.paths)
    steps = sorted({m["step"] for m in read_jsonl(run.paths.metrics) if m.get("loss") is not None})
    assert steps == list(range(1, 11)), steps
