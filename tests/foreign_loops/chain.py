"""One run of a foreign loop on the real local cluster with five faults in a row, driven by the
real Controller, and what the test saw of it. Three nodes of one rank each, one spare node (the
4-node test cluster); after each restart the on-call returns the nodes the controller excluded
(`runctl nodes --all`), or the 4 nodes could not hold the next job:

1. node loss: rank 1 SIGSTOPs itself at step 3 (its node goes silent; the other two wait for it)
   -> dead rank -> relaunch on the spare inside the job, from the step-2 checkpoint;
2. rank 0 SIGKILLed at step 5 of that launch, no spare left -> a new job from the loop's own
   step-4 checkpoint;
3. rank 1 blocks inside its backward at step 7 -> a hang below the step, within the learned
   limit -> a new job from step 6;
4. once step 8 is trained, the owner asks a rollback to step 6 skipping step 8's samples -> the
   loop saves and stops through the kill path, the next job resumes at 6 and never reads them;
5. once that job trained step 9, another operator kills the run -> checkpoint, exit 17, no restart.

A chain of the node-level faults only (`NODE_FAULTS`: 1, 2 and 5, the kill once the third job
trained step 6) is what a start mode changes: how a lost node, a killed rank and the kill switch
reach the loop. The hang and the rollback are the loop's own marks and files, the same however
it was started.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.cli.main import main
from orchestrator.contract import Heartbeat, RunPaths, read_heartbeats, read_jsonl
from orchestrator.contract.state import RunStatus
from orchestrator.controller import Controller
from tests.run_records import event_dicts

from .config import REPO, loop_config

FAULTS = "stop@3:1,sigkill@5:0,hang@7:1"
NODE_FAULTS = "stop@3:1,sigkill@5:0"
KILL_AFTER_NODE_FAULTS = 6  # the step the third job trains before the kill (it resumes at 4)
HEARTBEAT, POLL, FLOOR = 0.5, 0.5, 2.0
STEP_SECONDS = 0.8  # an honest pause before each step: the learned step limit is about 3 x this
NODES, PER_RANK = 3, 4  # plain_ddp.py: each rank reads 4 samples a step
ROLLBACK_TO = 6
SKIPPED = (8 * NODES * PER_RANK - NODES * PER_RANK, 8 * NODES * PER_RANK)  # step 8's, read after step 6
WATCHDOG = {"progress_floor_seconds": {"init": 60, "step": FLOOR, "checkpoint": FLOOR, "eval": FLOOR},
            "progress_factor": 3.0, "progress_cap_seconds": 60, "relaunch_decision_seconds": 15}


@dataclass
class Chain:
    paths: RunPaths
    log_dir: Path
    status: str = ""
    seconds: float = 0.0
    beats: dict[int, Heartbeat] = field(default_factory=dict)  # newest beat per rank, until the hang is found
    rollback_job: str = ""  # the job that was running when the rollback was asked
    killed_by: str = ""
    kill_asked_step: int = 0
    cleared: int = 0  # restarts after which the excluded nodes were returned
    faults: str = FAULTS

    def events(self, kind: str) -> list[dict]:
        return [e for e in event_dicts(self.paths) if e["event"] == kind]

    def samples(self, rank: int) -> list[dict]:
        return read_jsonl(self.log_dir / f"samples-rank{rank}.jsonl")

    def outputs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-2500:]}"
                         for p in sorted(self.paths.jobs.glob("slurm-*.out")))


def running_step(ctl: Controller) -> int:
    live = {j.job_id for j in ctl.state.live_jobs()}
    steps = [b.step for b in read_heartbeats(ctl.paths.heartbeats) if b.job_id in live and b.phase.value != "exiting"]
    return min(steps) if len(steps) == ctl.cfg.cluster.gpus else -1


def run_chain(local_cluster, command: list[str], operator: str, group: str, *, command_per: str = "rank",
              health_check: bool = False, seconds: float = 300, faults: str = FAULTS) -> Chain:
    from orchestrator.operate.runs import prepare_run_dir, submit_job
    from orchestrator.slurm.real import SlurmScheduler

    cfg = loop_config(command, nodes=NODES, gpus_per_node=1, spare_nodes=1, command_per=command_per,
                      watchdog=WATCHDOG, operators={"group": group, "users": []})
    cfg = cfg.model_copy(update={
        "exclusions": cfg.exclusions.model_copy(update={"on_pool_short": "release_oldest"}),
        "health_check": cfg.health_check.model_copy(update={"enabled": health_check}),
    })
    root = Path(tempfile.mkdtemp(prefix="rc-loop-", dir="/tmp"))
    os.chmod(root, 0o755)
    prepare_run_dir(cfg, root / "run")
    os.chmod(root / "run", 0o755)
    chain = Chain(RunPaths.of(root / "run"), root / "loop-log", faults=faults)
    chain.log_dir.mkdir()
    env = {**local_cluster.slurm_env(), "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "LOOP_STEPS": "20",
           "LOOP_FAULTS": faults, "LOOP_STEP_SECONDS": str(STEP_SECONDS), "LOOP_LOG_DIR": str(chain.log_dir)}
    scheduler = SlurmScheduler(env=env)
    submit_job(root / "run", cfg, scheduler, reason="initial")
    ctl = Controller(root / "run", cfg, scheduler, stack_wait_seconds=1.0)
    ctl.start()
    began = time.monotonic()
    try:
        deadline = began + seconds
        while time.monotonic() < deadline:
            chain.status = ctl.tick().status
            act(ctl, chain, operator)
            if chain.status in RunStatus.STOPPED:
                break
            time.sleep(POLL)
        chain.seconds = time.monotonic() - began
    finally:  # a rank stopped by SIGSTOP dies with its step: SIGKILL needs no SIGCONT
        live = [j.job_id for j in ctl.state.live_jobs()]
        if live:
            ctl.scheduler.cancel(live)
        ctl.stop()
    said = [(e["event"], e.get("cause", ""), e.get("job_id", "")) for e in event_dicts(chain.paths)
            if e["event"] in ("failure", "restart", "job_ended", "rollback_applied")]
    print(f"{' '.join(command[-2:])}: {chain.seconds:.1f} s, {len(ctl.state.jobs)} jobs, status {chain.status}: {said}")
    return chain


def act(ctl: Controller, chain: Chain, operator: str) -> None:
    """After each pass: return the excluded nodes after each restart; keep the beats until
    the hang is found; ask the rollback, then the kill (after the node faults alone: the kill once
    the third job trained KILL_AFTER_NODE_FAULTS)."""
    restarts = sum(e["event"] == "restart" for e in event_dicts(ctl.paths))
    if chain.cleared < restarts:
        assert main(["nodes", str(ctl.paths.root), "--all", "--reason", "test: the node is back"]) == 0
        chain.cleared = restarts
    step = running_step(ctl)
    if chain.faults == NODE_FAULTS:
        if restarts >= 2 and not chain.killed_by and step >= KILL_AFTER_NODE_FAULTS:
            kill_as(operator, ctl, chain, step)
        return
    hangs = [e for e in event_dicts(ctl.paths) if e["event"] == "failure" and e["cause"] == "hang"]
    if not hangs:
        for beat in read_heartbeats(ctl.paths.heartbeats):
            chain.beats[beat.rank] = beat
        return
    if not chain.rollback_job and step >= 8:
        chain.rollback_job = ctl.state.live_jobs()[0].job_id
        rc = main(["rollback", str(ctl.paths.root), "--to-step", str(ROLLBACK_TO), "--skip-samples",
                   f"{SKIPPED[0]}:{SKIPPED[1]}", "--reason", "test: bad data at 56-63"])
        assert rc == 0
    applied = [e for e in event_dicts(ctl.paths) if e["event"] == "rollback_applied"]
    if applied and not chain.killed_by and step >= 9:
        kill_as(operator, ctl, chain, step)


def kill_as(operator: str, ctl: Controller, chain: Chain, step: int) -> None:
    from test_operators import run_as  # tests/controller, on the path through conftest

    rc, out = run_as(operator, ["kill", str(ctl.paths.root), "--reason", "test: another operator stops it"])
    assert rc == 0, out
    chain.killed_by, chain.kill_asked_step = operator, step


def operator_account():
    """(user, group): a fresh operator who is not the run's owner; removed by the caller."""
    tag = os.urandom(3).hex()
    group, user = f"ops{tag}", f"oncall{tag}"
    subprocess.run(["groupadd", group], check=True)
    subprocess.run(["useradd", "-M", "-N", "-G", group, user], check=True)
    return user, group


def remove_account(user: str, group: str) -> None:
    subprocess.run(["userdel", user], check=False)
    subprocess.run(["groupdel", group], check=False)


def cleanup(chain: Chain) -> None:
    shutil.rmtree(chain.paths.root.parent, ignore_errors=True)
