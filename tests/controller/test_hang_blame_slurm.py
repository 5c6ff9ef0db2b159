"""Blame in a hang on the real local SLURM cluster, in the demo's layout: tp=2 x pp=2 on 4 nodes of
1 GPU each, a 5-node cluster, no spare.

One node's rank hangs at the start of step 6, after the first save (step 4): its TP peer blocks in
the forward's all-reduce, the next stage in the receive of its activations. Every collective is a
wait (orchestrator/contract/client/progress.waited), so the hung rank is the one rank not waiting: exactly its node is
excluded, the next job runs on the other 4 (`sbatch --exclude` of one node leaves 4 of 5) and the
run finishes. The fault is aimed at the node (`hang@step6:node02`): the restarted job, without
node02, trains through step 6. Before every collective was a wait, rank 0 (blocked in the TP
all-reduce) was named too: node01 and node02 excluded, 3 usable nodes of 4, and the run sat
"running" with no job. The same run also shows the job-level restart as SLURM itself sees it
(`scontrol show job`, `squeue --json`: the new job elsewhere, node02 in its ExcNodeList and
`#SBATCH --exclude` in its script), every rank's stack dumped before the cancel, and losses equal
to the uninterrupted run's (`reference_losses`: the same model and data at 2 nodes x 2 ranks).

The frozen node's run first stalls that node's storage (its run dir served to it alone by a FUSE
daemon that the test stops, tests/stallable_mount.py): a stall, waited for and warned about, and
the same launch trains on when the writes return. Then it runs `make demo`'s scenario (4 nodes +
its 1 spare, the whole partition): a node lost while a spare is left pages nobody. Notifications
go to two local apprise JSON endpoints, one per severity (`page:` and `chat:`); while the job
trains on its spare, `runctl status` has no CRITICAL line, the pager has received nothing, and the
next job would ask for no spare (the four usable nodes are the job's): a warning in chat, not a
page.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path

import pytest
import yaml
from fakes import REPO, WebhookServer
from test_e2e_slurm import assert_exclusion_seen_by_slurm, assert_same_losses, drive, job_outputs

from orchestrator.contract.exclude import excluded_nodes
from orchestrator.contract.state import RunStatus
from orchestrator.controller import Controller
from orchestrator.plan.config import parse_config
from orchestrator.plan.config.load import resolve_paths
from orchestrator.views.dashboard import status_data
from tests.run_records import event_dicts
from tests.stallable_mount import StallableMount, usable

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

HUNG_NODE, HUNG_STEP, STEPS = "node02", 6, 8
# Rank 1's node in the frozen-node drill: its slurmd has a mount namespace of its own, where the
# run dir's storage can be stalled for it alone (tests/stallable_mount.py).
STALL_NODE, STALL_SECONDS = "node02", 13.0


@pytest.fixture(scope="module")
def five_nodes(local_cluster, tmp_path_factory):
    """A 5-node cluster of 1 GPU each beside the session's (the demo's shape: one node more than
    the job). `local_cluster` first: it installs SLURM or skips with the reason."""
    from orchestrator.slurm.local_cluster import ClusterSpec, LocalCluster
    from tests.fixtures_slurm import _free_port_base

    directory = Path(tmp_path_factory.mktemp("five", numbered=True))
    ctld, slurmd = _free_port_base(5)
    cluster = LocalCluster(directory)
    try:
        spec = ClusterSpec(nodes=5, gpus_per_node=1, ctld_port=ctld, slurmd_base_port=slurmd)
        cluster.up(spec, timeout=120, own_mounts=() if usable() else (STALL_NODE,))
        yield cluster
    finally:
        cluster.down()


def demo_config(spare_nodes: int = 0, notifications: dict | None = None):
    data = yaml.safe_load((REPO / "configs" / "demo-cpu-4node.yaml").read_text())
    # The demo's 4 nodes x 1 GPU, tp=2 x pp=2 (no spare unless asked).
    data["cluster"].update(python=sys.executable, spare_nodes=spare_nodes)
    corpus = REPO / "data" / "corpus"
    if not (REPO / "data" / "corpus.idx").exists() and (corpus / "multilingual_text_document.idx").exists():
        corpus = corpus / "multilingual_text_document"
    data["data"]["datasets"] = [{"path": str(corpus), "weight": 1.0}]
    data["checkpoint"].update(interval_steps=4)
    data["watchdog"].update(
        heartbeat_seconds=1.0, poll_seconds=1.0, dead_after_seconds=8, step_timeout_seconds=20,
        stall_tolerance_seconds=300,
        progress_floor_seconds={"init": 90.0, "step": 4.0, "checkpoint": 4.0, "eval": 4.0},
        progress_factor=3.0, progress_cap_seconds=90.0,
    )  # fmt: skip
    data["operators"] = {"group": None, "users": []}
    data["notifications"] = {**(notifications or {})}
    return resolve_paths(parse_config(data, source="hang-blame-slurm"), REPO / "configs")


def test_a_rank_hung_mid_step_excludes_exactly_its_node_and_the_run_finishes(five_nodes, reference_losses):
    from orchestrator.operate.runs import prepare_run_dir, submit_job
    from orchestrator.slurm.real import SlurmScheduler

    cfg = demo_config()
    root = Path(tempfile.mkdtemp(prefix="rc-blame-", dir="/tmp"))
    env = {**five_nodes.slurm_env(), "TRAINER_TENSORBOARD": "0", "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1",
           "TRAINER_MAX_STEPS": str(STEPS), "TRAINER_FAULT": f"hang@step{HUNG_STEP}:{HUNG_NODE}"}  # fmt: skip
    scheduler = SlurmScheduler(env=env)
    prepare_run_dir(cfg, root / "run")
    submit_job(root / "run", cfg, scheduler, reason="initial")
    ctl = Controller(root / "run", cfg, scheduler, stack_wait_seconds=2.0)
    ctl.start()
    try:
        t0 = time.monotonic()
        status = drive(ctl, 600)
        print(f"run: {time.monotonic() - t0:.1f} s, {status}")
        events = event_dicts(ctl.paths)
        failures = [e for e in events if e["event"] == "failure"]
        assert status == RunStatus.FINISHED, f"{status}: {failures}\n{job_outputs(ctl.paths)}"
        assert len(failures) == 1 and failures[0]["cause"] == "hang", failures
        hang = failures[0]
        print(f"suspects: {[(s['rank'], s['host']) for s in hang['suspects']]} ({hang['suspects_why']}); "
              f"detected {hang['detection_time'] - hang['failure_time']:.1f} s after the last mark")
        assert [s["rank"] for s in hang["suspects"]] == [1], hang
        assert excluded_nodes(ctl.paths) == [HUNG_NODE], "exactly the hung rank's node is left out"
        assert not [e for e in events if e["event"] == "exclusion_capped"], "the pool could spare it"
        second = ctl.state.jobs[-1]
        assert HUNG_NODE not in second.nodes and len(second.nodes) == 4, second
        stacks = next(e for e in events if e["event"] == "stacks_dumped")
        assert stacks["ranks_answered"] >= 3, stacks
        assert "thread" in (ctl.paths.stacks / "rank-00000.txt").read_text().lower()
        assert_exclusion_seen_by_slurm(ctl, hang["job_id"], HUNG_NODE)
        assert_same_losses(ctl.paths, {s: loss for s, loss in reference_losses.items() if s <= STEPS})
    finally:
        live = [j.job_id for j in ctl.state.live_jobs()]
        if live:
            ctl.scheduler.cancel(live)
        ctl.stop()
        shutil.rmtree(root, ignore_errors=True)


def test_a_node_whose_storage_stalls_is_waited_for_then_a_frozen_node_is_dead_and_the_spare_trains(
    five_nodes,
):
    """Two faults on rank 1's node (node02, rank 1 alone there), one run, one job.

    First its run-dir storage stops answering (the FUSE daemon that serves the run dir to node02
    alone is SIGSTOPped for STALL_SECONDS, past dead_after): its ranks block in D, its beats stop.
    The controller asks the node (one `srun --overlap` step, in node02's mount namespace): a rank
    in D, the run dir's stat unanswered: a storage stall, waited for, with a warning in `runctl
    status`; no failure, no relaunch; the writes return and the same launch trains on.

    Then rank 1 is SIGSTOPped in the last save (step 8's, slowed to seconds on node02 alone, so
    that the stall may come at any step before it): its whole node is silent in a save,
    which the silence rule alone waits out as a storage stall (up to stall_tolerance_seconds).
    The controller asks again: stopped (T), its filesystem answers: dead at dead_after, and the
    job relaunches on its spare."""
    import os
    import signal

    from storage_stall_drill import StorageStallDrill

    from orchestrator.contract import read_heartbeats
    from orchestrator.operate.runs import prepare_run_dir, submit_job
    from orchestrator.slurm.real import SlurmScheduler

    pager, chat = WebhookServer(), WebhookServer()
    cfg = demo_config(spare_nodes=1, notifications={"page": [pager.url], "chat": [chat.url]})
    root = Path(tempfile.mkdtemp(prefix="rc-probe-", dir="/tmp"))
    env = {**five_nodes.slurm_env(), "TRAINER_TENSORBOARD": "0", "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1",
           "TRAINER_MAX_STEPS": str(STEPS), "TRAINER_FAULT": f"slowsave@step{STEPS}:{STALL_NODE}",
           "TRAINER_SLOW_SAVE_CHUNK_SECONDS": "0.05"}  # fmt: skip
    scheduler = SlurmScheduler(env=env)
    prepare_run_dir(cfg, root / "run")
    no_fuse = usable()
    if no_fuse:
        warnings.warn(f"the storage-stall half of this drill did not run: {no_fuse}", stacklevel=1)
    mount = (
        None
        if no_fuse
        else StallableMount(root / "run", five_nodes.status()["daemons"][f"slurmd-{STALL_NODE}"]["pid"])
    )
    job_id = submit_job(root / "run", cfg, scheduler, reason="initial")
    ctl = Controller(root / "run", cfg, scheduler, stack_wait_seconds=2.0)
    stall = StorageStallDrill(mount, str(job_id), rank=1, node=STALL_NODE, seconds=STALL_SECONDS, before_step=STEPS)
    done: dict = {}
    on_the_spare: dict = {}

    def stall_then_freeze_in_save(c: Controller) -> None:
        if mount is not None and not stall.over:
            stall.on_pass(c)
            return
        if done:
            if (
                not on_the_spare
                and c.state.status == RunStatus.RUNNING
                and any(e["event"] == "first_step_after_restart" for e in event_dicts(c.paths))
            ):
                c.tick()  # one more pass: the pool judged after the relaunch
                on_the_spare.update(
                    warnings=status_data(c.paths.root, c.scheduler).warnings,
                    pool=c.state.pool,
                    pager=list(pager.received),
                    chat=[m["title"] for m in chat.received],
                )
            return
        for b in read_heartbeats(c.paths.heartbeats):
            if b.rank == 1 and b.job_id == str(job_id) and b.phase.value == "checkpoint" and b.step == STEPS:
                os.kill(b.pid, signal.SIGSTOP)
                done.update(time=time.time(), pid=b.pid, node=b.host)
                print(f"SIGSTOP rank 1 (pid {b.pid}) on {b.host} in the save of step {b.step}")

    if mount is not None:
        mount.__enter__()
    ctl.start()
    try:
        status = drive(ctl, 600, act=stall_then_freeze_in_save)
        events = event_dicts(ctl.paths)
        probed = [e for e in events if e["event"] == "node_probed"]
        failures = [e for e in events if e["event"] == "failure"]
        print(
            f"probed: {probed}\nfailures: {[(f['cause'], f['detection_time'] - done.get('time', 0)) for f in failures]}"
        )
        assert done, f"never saw rank 1 in its save: {status}\n{job_outputs(ctl.paths)[-3000:]}"
        if mount is not None:
            assert_stall_waited_for(stall, [e for e in probed if e["time"] < done["time"]], events)
        probed = [e for e in probed if e["time"] > done["time"]]
        assert status == RunStatus.FINISHED, f"{status}: {failures}\n{job_outputs(ctl.paths)}"
        assert probed and probed[0]["node"] == done["node"] and probed[0]["verdict"] == "dead", probed
        assert failures[0]["cause"] == "dead_rank" and [r["rank"] for r in failures[0]["ranks"]] == [1], (
            failures
        )
        took = failures[0]["detection_time"] - done["time"]
        assert took <= cfg.watchdog.dead_after_seconds + 6, f"dead {took:.1f} s after the SIGSTOP"
        restart = next(e for e in events if e["event"] == "restart")
        assert restart["in_allocation"], restart
        print(f"while training on the spare: {on_the_spare}")
        assert on_the_spare, "never saw the job train on its spare"
        assert not [w for w in on_the_spare["warnings"] if "CRITICAL" in w], on_the_spare["warnings"]
        assert on_the_spare["pager"] == [], "nobody is paged while the job trains on its spare"
        kinds = [title.split()[1] for title in on_the_spare["chat"]]
        assert "restart:" in kinds and "spares:" in kinds, kinds
        assert not on_the_spare["pool"].short and on_the_spare["pool"].spares_next == 0, on_the_spare["pool"]
        assert [e for e in events if e["event"] == "spares_for_next_job"][0]["spares_next"] == 0
        assert not [e for e in events if e["event"] == "pool_short"]
    finally:
        pager.close(), chat.close()
        if done:
            try:
                os.kill(done["pid"], signal.SIGCONT)
            except ProcessLookupError:
                pass
        if mount is not None:
            mount.__exit__(None, None, None)
        live = [j.job_id for j in ctl.state.live_jobs()]
        if live:
            ctl.scheduler.cancel(live)
        ctl.stop()
        shutil.rmtree(root, ignore_errors=True)


def assert_stall_waited_for(stall, probed: list[dict], events: list[dict]) -> None:
    """The storage stall: real D state, asked (early, then again once silent) and found a stall
    each time, warned, no failure or relaunch while it lasted, the same launch training again
    after it."""
    assert stall.resumed is not None, "the storage stall never began (rank 1 never seen training)"
    assert any("request_wait_answer" in t for t in stall.in_d), f"rank 1 never waited in D on its storage: {stall.in_d}"
    first = probed[0] if probed else {}
    print(
        f"stall probe: {first}\nstatus during the stall: {stall.warnings[-1:]}\nafter: {stall.warnings_back}"
    )
    assert first.get("node") == STALL_NODE and first.get("verdict") == "stall", probed
    assert 1 <= len(probed) <= 2 and {e["verdict"] for e in probed} == {"stall"}, probed
    assert first["fs_answers"] is False and "disk" in first["ranks"].values(), first
    early = [e for e in events if e["event"] in ("failure", "restart") and (not stall.over or e["time"] < stall.back_time)]
    assert not early, f"declared or relaunched during the storage stall: {early}"
    assert stall.over, "rank 1 never trained again in the same launch after its storage came back"
    assert any(STALL_NODE in w and "300 s" in w for w in stall.warnings), stall.warnings
    assert not stall.warnings_back, f"status still warns after the writes came back: {stall.warnings_back}"
