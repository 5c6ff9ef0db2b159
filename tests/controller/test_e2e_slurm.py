"""The controller on the real local SLURM cluster with the real trainer (`python -m trainer`).

The demo model (tp=2, pp=2) as 2 nodes x 2 ranks, so that the 4-node test cluster has spare
nodes for the exclude list. Every run is 12 steps with checkpoints every 4 (TRAINER_MAX_STEPS).
- a rank SIGKILLed (2 nodes + 1 spare), relaunched on the spare inside the same job and restored
  from node-local and buddy copies: on the 24.11 cluster, in test_e2e_slurm_2411.py, against this
  module's reference losses (the job-level restart without the node is the SIGSTOP case's; srun's
  report is parsed by the same launcher code with or without spares);
- a job-level restart without the bad node, as SLURM itself shows it, with the stacks dumped and
  the same losses: in test_hang_blame_slurm.py's hang (its helpers are here);
- `runctl kill` by an operator who is another Unix user: the trainer saves and exits 17, no
  restart; `runctl resume` continues from the kill checkpoint; same losses. The same run applies
  the learned checkpoint interval (`checkpoint.adaptive_interval: apply`): the controller writes
  the directive, rank 0 takes it up and saves on it.
Timings printed (failure -> detection -> first step after restart) are the real-cluster
counterpart of bench/controller_latency.py.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml
from fakes import REPO

from orchestrator.contract import JobState, RunPaths, read_heartbeats, read_jsonl
from orchestrator.contract.state import RunStatus
from orchestrator.controller import Controller
from orchestrator.errors import SchedulerError
from orchestrator.plan.config import parse_config
from orchestrator.plan.config.load import resolve_paths
from tests.run_records import event_dicts

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
STEPS = 12


def e2e_config(
    operators: dict | None = None, spare_nodes: int = 0, checkpoint: dict | None = None, notifications: dict | None = None
):
    data = yaml.safe_load((REPO / "configs" / "demo-cpu-4node.yaml").read_text())
    data["cluster"].update(nodes=2, gpus_per_node=2, python=sys.executable, spare_nodes=spare_nodes)
    corpus = REPO / "data" / "corpus"
    if not (REPO / "data" / "corpus.idx").exists() and (REPO / "data" / "corpus" / "multilingual_text_document.idx").exists():
        corpus = REPO / "data" / "corpus" / "multilingual_text_document"
    data["data"]["datasets"] = [{"path": str(corpus), "weight": 1.0}]
    data["checkpoint"].update({"interval_steps": 4, **(checkpoint or {})})
    data["watchdog"].update(heartbeat_seconds=0.5, poll_seconds=0.5, dead_after_seconds=8, step_timeout_seconds=20)
    data["operators"] = operators or {"group": None, "users": []}
    data["notifications"] = {**(notifications or {})}
    return resolve_paths(parse_config(data, source="e2e"), REPO / "configs")


@pytest.fixture
def e2e_run(local_cluster):
    """Factory: a run directory (0755 under /tmp, readable by other users) + controller."""
    from orchestrator.operate.runs import prepare_run_dir
    from orchestrator.slurm.real import SlurmScheduler

    made = []

    def build(
        operators: dict | None = None,
        spare_nodes: int = 0,
        env_extra: dict | None = None,
        notifications: dict | None = None,
        checkpoint: dict | None = None,
    ):
        root = Path(tempfile.mkdtemp(prefix="rc-e2e-", dir="/tmp"))
        checkpoint = {k: str(root / v) if k == "local_dir" else v for k, v in (checkpoint or {}).items()}
        cfg = e2e_config(operators, spare_nodes, checkpoint=checkpoint, notifications=notifications)
        os.chmod(root, 0o755)
        prepare_run_dir(cfg, root / "run")
        os.chmod(root / "run", 0o755)
        env = {**local_cluster.slurm_env(), "TRAINER_MAX_STEPS": str(STEPS), "TRAINER_TENSORBOARD": "0",
               "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", **(env_extra or {})}
        scheduler = SlurmScheduler(env=env)
        ctl = Controller(root / "run", cfg, scheduler, stack_wait_seconds=4.0)
        made.append((root, ctl))
        return cfg, ctl

    yield build
    for root, ctl in made:
        live = [j.job_id for j in ctl.state.live_jobs()]
        if live:
            ctl.scheduler.cancel(live)
        ctl.stop()
        shutil.rmtree(root, ignore_errors=True)


def drive(ctl: Controller, seconds: float, act=None, until=None) -> str:
    """Supervise; `act(ctl)` runs after every pass (fault injection); stop when the run stops
    or `until(ctl)` holds."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        status = ctl.tick().status
        if act:
            act(ctl)
        if (until and until(ctl)) or (not until and status in RunStatus.STOPPED):
            return status
        time.sleep(ctl.cfg.watchdog.poll_seconds)
    tail = "".join(p.read_text()[-3000:] for p in sorted(ctl.paths.jobs.glob("slurm-*.out"))[-1:])
    raise AssertionError(f"not settled in {seconds} s: {ctl.state.status}\n{tail}")


def beats_of_running_job(ctl: Controller) -> list[dict]:
    running = [j.job_id for j in ctl.state.jobs if j.state == JobState.RUNNING and j.outcome is None]
    # Node files (2 ranks per node) or rank files, read the way the controller reads them.
    beats = [b.to_dict() for b in read_heartbeats(ctl.paths.heartbeats)]
    return [b for b in beats if running and str(b["job_id"]) == running[0]]


def job_outputs(paths: RunPaths, tail: int = 2500) -> str:
    """The end of every job's output, for assertion messages."""
    return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-tail:]}" for p in sorted(paths.jobs.glob("slurm-*.out")))


def final_losses(paths: RunPaths) -> dict[int, float]:
    return {m["step"]: m["loss"] for m in read_jsonl(paths.metrics) if m.get("loss") is not None}


def inject_once(step: int, rank: int, sig: signal.Signals, when=None, kill=os.kill):
    """After `step` is reached (and `when(ctl)` holds, if given), send `sig` to the trainer process
    of `rank` (its pid is in its heartbeat: the emulated nodes are all this machine; `kill` sends
    it, for a cluster whose PID namespace numbers it)."""
    done = {}

    def act(ctl: Controller) -> None:
        if done or (when is not None and not when(ctl)):
            return
        beats = {b["rank"]: b for b in beats_of_running_job(ctl)}
        if rank in beats and beats[rank]["step"] >= step:
            try:
                kill(beats[rank]["pid"], sig)
            except ProcessLookupError:  # a beat of a launch that has just ended: try the next pass
                print(f"rank {rank}'s pid {beats[rank]['pid']} (step {beats[rank]['step']}) is gone; trying again")
                return
            done.update(time=time.time(), job=beats[rank]["job_id"], pid=beats[rank]["pid"])
            print(f"sent {sig.name} to rank {rank} (pid {beats[rank]['pid']}) at step {beats[rank]['step']}")

    return act, done


def reference_run(local_cluster, tmp_path_factory) -> dict[int, float]:
    """The same 12 steps, uninterrupted: the `reference_losses` fixture of conftest.py (once a
    session, on 22.05; the 24.11 drill compares with it too: the trainer is the same)."""
    from orchestrator.operate.runs import prepare_run_dir, submit_job
    from orchestrator.slurm.real import SlurmScheduler

    cfg = e2e_config()
    run = tmp_path_factory.mktemp("reference") / "run"
    prepare_run_dir(cfg, run)
    env = {**local_cluster.slurm_env(), "TRAINER_MAX_STEPS": str(STEPS), "TRAINER_TENSORBOARD": "0",
           "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    scheduler = SlurmScheduler(env=env)
    submit_job(run, cfg, scheduler, reason="reference")
    ctl = Controller(run, cfg, scheduler)
    ctl.start()
    try:
        t0 = time.monotonic()
        assert drive(ctl, 180) == RunStatus.FINISHED
        print(f"reference run: {time.monotonic() - t0:.1f} s")
    finally:
        ctl.stop()
    losses = final_losses(RunPaths.of(run))
    assert sorted(losses) == list(range(1, STEPS + 1))
    return losses


def standby_warm(job_id: str):
    """A `when` for inject_once: the launcher has the warm standby of the next launch ready."""
    from orchestrator.contract import read_allocation

    def ready(ctl: Controller) -> bool:
        try:
            return bool(read_allocation(ctl.paths.allocation(job_id)).standby_ready)
        except (OSError, ValueError, AttributeError):
            return False

    return ready


def assert_same_losses(paths: RunPaths, reference: dict[int, float]) -> None:
    losses = final_losses(paths)
    assert sorted(losses) == sorted(reference)
    err = max(abs(losses[s] - reference[s]) for s in reference)
    print(f"max |loss - uninterrupted loss| over {len(reference)} steps: {err:.3e}")
    assert err == 0.0, "resume must be exact"


def print_incident(paths: RunPaths) -> dict:
    events = event_dicts(paths)
    failure = next(e for e in events if e["event"] == "failure")
    first = next(e for e in events if e["event"] == "first_step_after_restart")
    print(f"{failure['cause']}: detected {failure['detection_time'] - failure['failure_time']:.1f} s after the failure; "
          f"first step after the restart {first['seconds_since_failure']:.1f} s after the failure")
    return failure


def assert_exclusion_seen_by_slurm(ctl: Controller, failed_job_id: str, bad_node: str) -> None:
    """Ask SLURM itself, not the controller's records, where the jobs ran (`scontrol show job`
    and `squeue --json`; finished jobs stay visible for MinJobAge=600 s, and the local cluster has
    no accounting database for sacct), and check that the restarted job excluded the bad node:
    in slurmctld's ExcNodeList and in its batch script."""
    from orchestrator.slurm.hostlist import expand_hostlist

    restart = next(e for e in event_dicts(ctl.paths) if e["event"] == "restart")
    new_job = str(restart["job_id"])
    failed = ctl.scheduler.show_job(failed_job_id)
    assert bad_node in expand_hostlist(failed["NodeList"]), failed
    record = ctl.scheduler.show_job(new_job)
    ran_on = expand_hostlist(record["NodeList"])
    squeue_nodes = ctl.scheduler.jobs([new_job])[new_job].nodes
    print(f"SLURM: job {failed_job_id} ran on {failed['NodeList']}; restarted job {new_job} ran on "
          f"{record['NodeList']} (squeue: {','.join(squeue_nodes)}), ExcNodeList={record.get('ExcNodeList')}")
    assert len(ran_on) == ctl.cfg.cluster.nodes and bad_node not in ran_on, record
    assert squeue_nodes == ran_on
    assert expand_hostlist(record.get("ExcNodeList") or "") == [bad_node], record
    script = (ctl.paths.job_dir(new_job) / "job.sbatch").read_text().splitlines()
    assert f"#SBATCH --exclude={bad_node}" in script


LEARNED_HOURS = 0.0005


def assert_saves_at_the_learned_interval(paths: RunPaths) -> None:
    """The controller wrote the interval directive; rank 0 took it up, and each save it made on
    time came no sooner than that interval after the save (or the start) before it."""
    fits = [e for e in event_dicts(paths) if e["event"] == "checkpoint_interval_fit"]
    assert fits and fits[0]["adaptive_mode"] == "apply" and fits[0]["interval_hours"] == LEARNED_HOURS, fits
    assert json.loads((paths.root / "accepted" / "checkpoint_interval").read_text())["interval_hours"] == LEARNED_HOURS
    output = "".join(p.read_text(errors="replace") for p in sorted(paths.jobs.glob("slurm-*.out")))
    assert f"checkpoint interval now {LEARNED_HOURS:g} h" in output, output[-3000:]
    # "saved step_0000005 (time interval) in 0.4s, 1.93 s after the last save (or the start)"
    after = [float(line.split(", ")[-1].split(" s after")[0]) for line in output.splitlines()
             if "[trainer] saved step_" in line and "(time interval)" in line]
    print(f"saves on the learned interval ({LEARNED_HOURS * 3600:.1f} s), seconds after the save before: {after}")
    assert after, "no save came from the learned interval"
    assert all(seconds >= LEARNED_HOURS * 3600 for seconds in after), after


def test_kill_by_another_operator_then_resume(e2e_run, reference_losses):
    if not shutil.which("useradd"):
        pytest.skip("needs useradd")
    from test_operators import run_as

    from orchestrator.operate.runs import submit_job

    tag = os.urandom(3).hex()
    group, oncall = f"ops{tag}", f"oncall{tag}"
    subprocess.run(["groupadd", group], check=True)
    subprocess.run(["useradd", "-M", "-N", "-G", group, oncall], check=True)
    try:
        # The learned interval, applied: bounds of 1.8 s make the controller's first fit a directive
        # (the config's 1 h is out of them); saves come only from it (and the kill), not every 4 steps.
        learned = {"interval_steps": 1000, "interval_hours": 1.0, "adaptive_interval": "apply",
                   "min_interval_hours": LEARNED_HOURS, "max_interval_hours": LEARNED_HOURS}
        # Steps of at least 0.4 s: the 9 steps after the resume outlast the 1.8 s interval however fast
        # the machine is (on an idle one the 12 steps took less than 1.8 s, and no save was on time).
        cfg, ctl = e2e_run(operators={"group": group, "users": []}, checkpoint=learned,
                           env_extra={"TRAINER_STEP_DELAY_SECONDS": "0.4"})
        submit_job(ctl.paths.root, cfg, ctl.scheduler, reason="initial")
        ctl.start()  # sets control/ to the operators' group
        killed = {}

        def kill_at_step_3(c: Controller) -> None:
            if killed:
                return
            if any(b["step"] >= 3 for b in beats_of_running_job(c)):
                rc, out = run_as(oncall, ["kill", str(c.paths.root), "--reason", "e2e: loss spike"])
                assert rc == 0, out
                killed["time"] = time.time()

        assert drive(ctl, 150, act=kill_at_step_3) == RunStatus.KILLED
        ended = [e for e in event_dicts(ctl.paths) if e["event"] == "job_ended"]
        assert ended[-1]["exit_code"] == 17 and ended[-1]["outcome"] == "killed"
        events = event_dicts(ctl.paths)
        asked = next(i for i, e in enumerate(events) if e["event"] == "kill_requested")
        restarts = [e for e in events[asked:] if e["event"] == "restart"]
        assert not restarts, f"restarted after the kill: {restarts}\n{job_outputs(ctl.paths)}"
        if any(e["event"] == "restart" for e in events[:asked]):  # e.g. a port clash with another local cluster
            print("note: the job failed and was restarted before the kill:\n" + job_outputs(ctl.paths, 1500))
        kill_step = max(int(p.name.split("_")[1]) for p in ctl.paths.checkpoints.glob("step_*"))
        assert 3 <= kill_step < STEPS
        audit = [json.loads(line) for line in ctl.paths.audit.read_text().splitlines()]
        assert audit[-1]["user"] == oncall and audit[-1]["action"] == "kill" and audit[-1]["allowed"]

        rc, out = run_as(oncall, ["resume", str(ctl.paths.root), "--reason", "e2e: spike understood"])
        assert rc == 0, out
        assert drive(ctl, 150) == RunStatus.FINISHED
        assert any(e["event"] == "resumed" and e["by"] == oncall for e in event_dicts(ctl.paths))
        assert_same_losses(ctl.paths, reference_losses)
        assert_saves_at_the_learned_interval(ctl.paths)
    finally:
        subprocess.run(["userdel", oncall], check=False)
        subprocess.run(["groupdel", group], check=False)


def test_slurmctld_stopped_75s_mid_run_is_an_outage_not_an_end(e2e_run, local_cluster):
    """slurmctld SIGSTOPped for 75 s mid-run. Slurm 22.05's squeue then answers after ~30 s
    (MessageTimeout) with errors and no jobs; the controller must read that as an outage: no
    failure, no resubmission, and the run finishes in its first job. 75 s, not less: a pass asks
    more than once, and a 40 s stop ended before the pass gave up (nothing to see)."""
    import threading

    from orchestrator.operate.runs import submit_job

    cfg, ctl = e2e_run(env_extra={"TRAINER_MAX_STEPS": "6", "TRAINER_STEP_DELAY_SECONDS": "12"})
    ctl.scheduler.timeout = 45.0  # longer than squeue's own 30 s wait: its answer is the one read
    job_id = str(submit_job(ctl.paths.root, cfg, ctl.scheduler, reason="initial"))
    ctl.start()
    ctld = local_cluster._record()["pids"]["slurmctld"]
    stopped = {}

    def resume_ctld() -> None:
        os.kill(ctld, signal.SIGCONT)
        stopped["resumed"] = time.monotonic()

    def probe_in_the_outage(node: str) -> None:
        """A silent node asked now: srun cannot make the step, and that must not read as the
        node lost (the probe raises, nothing is judged)."""
        try:
            stopped["probe"] = ctl.scheduler.probe_node(job_id, node, "echo fs ok", 5.0)
        except SchedulerError as error:
            stopped["probe"] = error

    def stop_ctld(c: Controller) -> None:
        if not stopped and any(b["step"] >= 1 for b in beats_of_running_job(c)):
            os.kill(ctld, signal.SIGSTOP)
            stopped["at"] = time.monotonic()
            threading.Timer(75.0, resume_ctld).start()  # on time, whatever a pass is waiting for
            threading.Timer(2.0, probe_in_the_outage, [c.state.job(job_id).nodes[0]]).start()

    try:
        assert drive(ctl, 240, act=stop_ctld) == RunStatus.FINISHED, job_outputs(ctl.paths)
    finally:
        os.kill(ctld, signal.SIGCONT)
    events = event_dicts(ctl.paths)
    kinds = [e["event"] for e in events]
    print(f"slurmctld stopped {stopped.get('resumed', 0) - stopped.get('at', 0):.0f} s; events: {kinds}")
    # Seen both ways on 22.05: squeue answering `errors` (an outage), or, right after SIGCONT, a
    # list without the job (not listed while its ranks beat): neither may end the job.
    said = [e for e in events if e["event"] in ("scheduler_unreachable", "job_not_listed")]
    print(f"the outage as the controller read it: {said}")
    assert "resumed" in stopped and said
    print(f"a probe step asked during the outage: {stopped.get('probe')!r}")
    assert isinstance(stopped.get("probe"), SchedulerError), "a probe in the outage must say the controller, not the node"
    assert "failure" not in kinds and "restart" not in kinds, kinds
    assert [j.job_id for j in ctl.state.jobs] == [job_id], "the run finished in its first job"
    assert kinds.count("job_submitted") == 0, "nothing was resubmitted"
