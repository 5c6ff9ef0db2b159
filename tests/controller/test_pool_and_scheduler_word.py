"""Issue 21, parts 4 and 5, as pure rules and real parsing: SLURM's answers that carry errors are
an outage (never an empty queue), UNKNOWN is not an end, a node SLURM downs is not blamed, a short
pool is a critical alert once (release_oldest releases the oldest probation), stalls count.
The expected values are written from SLURM's documented answers and the issue's rules, not from
the code."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "slurm"))
from fakes import make_config  # noqa: E402
from test_slurm_backend_parsing import fake_tools  # noqa: E402

from orchestrator.contract import Exclusion, JobState  # noqa: E402
from orchestrator.contract.severity import Severity, severity_of  # noqa: E402
from orchestrator.contract.state import ControllerState, JobRecord  # noqa: E402
from orchestrator.controller import jobs, pool  # noqa: E402
from orchestrator.controller.actions import ChangeState, Exclude, Notify, Record, ReleaseExclusions, UpdateJob  # noqa: E402
from orchestrator.controller.recovery import Incident  # noqa: E402
from orchestrator.controller.stalls import StallWatch  # noqa: E402
from orchestrator.controller.submission import with_spares  # noqa: E402
from orchestrator.errors import SchedulerError  # noqa: E402
from orchestrator.plan.config.schema import ExclusionsConfig  # noqa: E402
from orchestrator.slurm.base import JobInfo, NodeInfo  # noqa: E402
from orchestrator.slurm.node_query import nodes_from_json, nodes_from_text  # noqa: E402
from orchestrator.slurm.real import SlurmScheduler  # noqa: E402
from orchestrator.slurm.render import render_sbatch  # noqa: E402
from tests.pass_views import job_view  # noqa: E402

# What Slurm 22.05's `squeue --json` printed, exit 0, with slurmctld SIGSTOPped.
SQUEUE_OUTAGE = {"meta": {"Slurm": {"version": {"major": 22, "micro": 8, "minor": 5}}},
                 "errors": [{"error": "Unable to contact slurm controller (connect failure)", "errno": 1007,
                             "source": "slurm_load_jobs"}], "jobs": []}  # fmt: skip


def test_squeue_errors_with_an_empty_list_are_an_outage_not_an_empty_queue(tmp_path):
    env = fake_tools(tmp_path, squeue=(0, json.dumps(SQUEUE_OUTAGE), ""), sacct=(1, "", "accounting storage is disabled"))
    with pytest.raises(SchedulerError, match="slurm_load_jobs"):
        SlurmScheduler(env=env).jobs(["4242"])


def test_scontrol_show_node_text_is_read_hostile_safe():
    text = (
        "NodeName=node01 Arch=x86_64 CoresPerSocket=1 State=IDLE+DRAIN ThreadsPerCore=1 Partitions=gpu_p5 "
        "Reason=bad DIMM; ssh me\x1b[31m [root@2026-01-01T10:00:00]\n"
        "NodeName=node02 State=DOWN* Partitions=gpu_p5 Reason=Not responding [slurm@2026-01-01T10:00:00]\n"
        "NodeName=node03 State=ALLOCATED+RESERVED Partitions=gpu_p5,debug\n"
        "NodeName=node04 State=MIXED Partitions=gpu_p5\n"
        "NodeName=../etc State=IDLE\n"
        "garbage without pairs\n"
    )
    nodes = nodes_from_text(text)
    assert sorted(nodes) == ["node01", "node02", "node03", "node04"]
    assert nodes["node01"].drained and nodes["node01"].slurm_took_it and not nodes["node01"].down
    assert nodes["node01"].reason.startswith("bad DIMM; ssh me?[31m") and "\x1b" not in nodes["node01"].reason
    assert nodes["node02"].down and nodes["node02"].reason.startswith("Not responding")
    assert nodes["node03"].reserved and not nodes["node03"].slurm_took_it and not nodes["node03"].schedulable
    assert nodes["node04"].schedulable and nodes["node04"].partitions == ("gpu_p5",)


def test_scontrol_show_node_json_of_22_05_and_newer():
    old = {"nodes": [{"name": "node01", "state": "idle", "state_flags": ["DRAIN"], "reason": "x", "partitions": ["p"]},
                     {"name": 7, "state": "idle"}, "junk"]}  # fmt: skip
    new = {"nodes": [{"name": "node02", "state": ["DOWN", "NOT_RESPONDING"], "reason": None}]}
    assert nodes_from_json(json.dumps(old), str)["node01"].drained
    assert list(nodes_from_json(json.dumps(old), str)) == ["node01"]
    assert nodes_from_json(json.dumps(new), str)["node02"].down
    with pytest.raises(SchedulerError):
        nodes_from_json(json.dumps({"errors": [{"error": "down"}], "nodes": []}), str)


def _running(job_id: str = "7") -> JobRecord:
    return JobRecord(job_id=job_id, submitted_at=0.0, state=JobState.RUNNING.value, nodes=["node01"], started_at=10.0)


@pytest.mark.parametrize("passes,beating,ends", [(1, True, False), (5, True, False), (2, False, False), (3, False, True)])
def test_unknown_is_not_an_end_until_missing_three_passes_with_silent_ranks(passes, beating, ends):
    unknown = JobInfo("7", "", JobState.UNKNOWN)
    actions = jobs.job_update(_running(), unknown, wall_now=1000.0, cached_end=None,
                              missing=jobs.Missing(passes, beating, seconds=5.0 * passes))  # fmt: skip
    updates = [a for a in actions if isinstance(a, UpdateJob)]
    assert bool(updates and updates[0].ended_at) is ends, actions
    said = [a.event.KIND for a in actions if isinstance(a, Record)]
    assert said == (["job_not_listed"] if passes == 1 else [])


@pytest.mark.parametrize("passes,seconds,ends", [(3, 15.0, False), (24, 120.0, False), (48, 240.0, False),
                                                 (180, 900.0, True)])  # fmt: skip
def test_a_queued_job_has_no_ranks_to_confirm_it_gone_so_a_lagging_queue_does_not_end_it(passes, seconds, ends):
    """Soak x10 seed 18: after a 2-minute slurmctld outage the queue lagged 2 more minutes, and
    a queued job (silent: it never ran) and its resubmission were ended after 3 passes."""
    queued = JobRecord(job_id="7", submitted_at=0.0, state=JobState.PENDING.value)
    actions = jobs.job_update(queued, JobInfo("7", "", JobState.UNKNOWN), wall_now=5000.0, cached_end=None,
                              missing=jobs.Missing(passes, False, seconds))  # fmt: skip
    updates = [a for a in actions if isinstance(a, UpdateJob)]
    assert bool(updates and updates[0].ended_at) is ends, actions


def test_an_outage_answer_ends_nothing():
    state = ControllerState(jobs=[_running()])
    view = jobs.SchedulerView({}, error="squeue answered with errors", outage_began=True)
    actions = jobs.refresh(state, view, wall_now=1000.0, last_seen={})
    assert [a.event.KIND for a in actions if isinstance(a, Record)] == ["scheduler_unreachable"]
    assert not [a for a in actions if isinstance(a, UpdateJob)]


def test_a_node_slurm_already_downs_is_left_to_slurm():
    failure = Incident("7", "dead_rank", 0.0, 5, culprits=("node02", "node04"))
    nodes = nodes_from_text("NodeName=node02 State=DOWN Reason=Not responding\nNodeName=node04 State=ALLOCATED\n")
    kept, actions = pool.leave_to_slurm(failure, nodes)
    assert kept == ("node04",)
    assert [(a.event.node, a.event.slurm_state) for a in actions] == [("node02", "DOWN")]
    assert pool.leave_to_slurm(failure, None) == (("node02", "node04"), [])  # SLURM not asked: blame


def _pool(states: dict[str, set[str]]) -> dict[str, NodeInfo]:
    return {n: NodeInfo(n, frozenset(s)) for n, s in states.items()}


def _judge(state, nodes, exclusions, policy="wait", now=1000.0, need=3, spares=0):
    actions = pool.judge(
        state, nodes, exclusions, nodes=need, spares=spares, partition=None, policy=policy, now=now, run_dir="RUN"
    )
    for a in actions:
        if isinstance(a, ChangeState):
            state.pool = a.pool
    return actions


def test_short_pool_is_one_critical_alert_then_a_recovery():
    nodes = _pool({"n1": {"IDLE"}, "n2": {"DOWN"}, "n3": {"IDLE", "RESERVED"}, "n4": {"ALLOCATED"}, "n5": {"IDLE"}})
    excluded = {"n5": Exclusion("n5", 100.0, 9999.0)}
    state = ControllerState()
    first = _judge(state, nodes, excluded)
    kinds = [a.event.KIND for a in first if isinstance(a, Record)]
    assert kinds == ["pool_short"] and any(isinstance(a, Notify) and a.kind == "pool" for a in first)
    short = next(a.event for a in first if isinstance(a, Record))
    assert (short.usable, short.needed, short.down, short.reserved, short.excluded) == (2, 3, ["n2"], ["n3"], ["n5"])
    assert state.pool.short and "`runctl nodes RUN` lists the probations" in state.pool.message
    assert "n5 failed in the last incident: keep them out" in state.pool.message and "sinfo -R" in state.pool.message
    assert not [a for a in _judge(state, nodes, excluded, now=1100.0) if isinstance(a, (Record, Notify))]
    back = _judge(state, nodes, {}, now=1300.0)
    recovered = [a.event for a in back if isinstance(a, Record)]
    assert [e.KIND for e in recovered] == ["pool_recovered"] and recovered[0].short_for_seconds == 300.0
    assert not state.pool.short


def test_release_oldest_releases_the_oldest_probations_the_job_lacks():
    nodes = _pool({f"n{i}": {"IDLE"} for i in range(1, 5)})
    excluded = {"n2": Exclusion("n2", 300.0, None), "n3": Exclusion("n3", 100.0, None), "n4": Exclusion("n4", 200.0, None)}
    actions = _judge(ControllerState(), nodes, excluded, policy="release_oldest")
    released = [a for a in actions if isinstance(a, ReleaseExclusions)]
    assert [r.nodes for r in released] == [("n3", "n4")]  # 1 usable, 3 needed: the two oldest
    assert not [a for a in actions if isinstance(a, Record)]  # it fits after the release: no alert


def test_only_spares_short_is_a_chat_warning_and_the_next_job_asks_for_fewer_spares(tmp_path):
    """The demo's case: 4 nodes + 1 spare, one node lost: the job trains on its spare, the next job
    asks for 0 spares (chat), nothing critical; one more node lost: critical (a page), and the
    advice never returns the node of the last incident."""
    nodes = _pool({f"n{i}": {"ALLOCATED"} for i in range(1, 6)})
    state = ControllerState()
    assert not [a for a in _judge(state, nodes, {}, need=4, spares=1) if isinstance(a, (Record, Notify))]
    assert pool.spares_for_next_job(state, 1) == 1
    lost = {"n2": Exclusion("n2", 100.0, None, job_id="7")}
    actions = _judge(state, nodes, lost, need=4, spares=1, now=1100.0)
    assert [a.event.KIND for a in actions if isinstance(a, Record)] == ["spares_for_next_job"]
    assert [(a.kind, severity_of(a.kind)) for a in actions if isinstance(a, Notify)] == [("spares", Severity.CHAT)]
    assert not state.pool.short and pool.spares_for_next_job(state, 1) == 0
    cfg = make_config(cluster={"nodes": 4, "spare_nodes": 1})
    assert with_spares(cfg, lambda: pool.spares_for_next_job(state, 1)).cluster.spare_nodes == 0
    script = render_sbatch(with_spares(cfg, lambda: 0), str(tmp_path))
    assert "#SBATCH --nodes=4\n" in script
    again = {**lost, "n4": Exclusion("n4", 200.0, None, job_id="9")}
    critical = _judge(state, nodes, again, need=4, spares=1, now=1200.0)
    assert [a.event.KIND for a in critical if isinstance(a, Record)] == ["pool_short"]
    assert [severity_of(a.kind) for a in critical if isinstance(a, Notify)] == [Severity.PAGE]
    assert state.pool.short and "n4 failed in the last incident: keep them out" in state.pool.message
    assert "older ones (n2) may be healthy again" in state.pool.message
    back = _judge(state, nodes, {}, need=4, spares=1, now=1300.0)
    assert [a.event.KIND for a in back if isinstance(a, Record)] == ["spares_for_next_job", "pool_recovered"]
    assert pool.spares_for_next_job(state, 1) == 1


def test_the_controllers_next_submission_asks_for_the_spares_the_pool_has(mock_slurm_dir, tmp_path):
    """The controller's own submitter (not a test's): with the pool's `spares_next` at 0 the next
    job's script asks SLURM for the job's nodes only."""
    from orchestrator.contract import RunPaths
    from orchestrator.contract.state import PoolStatus
    from orchestrator.controller import Controller
    from orchestrator.operate.runs import prepare_run_dir
    from orchestrator.slurm.mock import MockScheduler

    cfg = make_config(cluster={"nodes": 4, "spare_nodes": 1})
    run = tmp_path / "run"
    prepare_run_dir(cfg, run)
    ctl = Controller(run, cfg, MockScheduler(mock_slurm_dir))
    asked = {}
    for spares_next in (None, 0):
        ctl.state.pool = None if spares_next is None else PoolStatus(usable=4, needed=4, spares_next=0)
        job = ctl.submitter([], "restart")
        script = (RunPaths.of(run).job_dir(job) / "job.sbatch").read_text()
        asked[spares_next] = re.search(r"^#SBATCH --nodes=(\d+)$", script, re.M).group(1)
    assert asked == {None: "5", 0: "4"}


def test_expired_probations_are_released_on_the_controllers_clock():
    excluded = {"a": Exclusion("a", 0.0, 500.0), "b": Exclusion("b", 0.0, 2000.0), "c": Exclusion("c", 0.0, None)}
    assert pool.expired(excluded, 1000.0) == [ReleaseExclusions(("a",), "probation expired")]


def test_a_stall_is_recorded_and_only_the_third_in_the_window_excludes():
    watch = StallWatch(ExclusionsConfig(stall_limit=3, stall_window_hours=24), heartbeat_seconds=10.0)
    ages = {f"n{i}": 1.0 for i in range(8)}
    excluded_at = []
    for stall in range(3):
        base = stall * 3600.0
        watch.on_pass(job_view(host_beat_age={**ages, "n3": 45.0}, mono=base + 45, wall=base))
        actions = watch.on_pass(job_view(host_beat_age=ages, mono=base + 50, wall=base + 50))
        events = [a.event for a in actions if isinstance(a, Record)]
        assert [(e.node, e.stalls_in_window) for e in events] == [("n3", stall + 1)]
        excluded_at += [stall for a in actions if isinstance(a, Exclude)]
    assert excluded_at == [2]
    # Most of the job quiet at once is the filesystem's, not n3's: nothing counted.
    quiet = {n: 45.0 for n in ages}
    assert watch.on_pass(job_view(host_beat_age=quiet, mono=20000, wall=20000)) == []


def test_a_restart_right_after_an_exclusion_asks_for_the_spares_left(mock_slurm_dir, tmp_path):
    """The pool is judged at the end of a pass; a failure excludes its node and resubmits in the
    next one, before that. Asking for the spares judged before the exclusion, on a pool of exactly
    nodes + spares, is a job SLURM refuses (`Requested node configuration is not available`):
    the submission judges the pool again first."""
    from orchestrator.contract import RunPaths
    from orchestrator.contract.exclude import add_excluded
    from orchestrator.controller import Controller
    from orchestrator.operate.runs import prepare_run_dir
    from orchestrator.slurm.mock import MockScheduler

    class FiveNodes(MockScheduler):
        def nodes(self) -> dict[str, NodeInfo]:
            return {f"node0{i}": NodeInfo(f"node0{i}", frozenset({"IDLE"})) for i in range(1, 6)}

    cfg = make_config(cluster={"nodes": 4, "spare_nodes": 1})
    run = tmp_path / "run"
    prepare_run_dir(cfg, run)
    ctl = Controller(run, cfg, FiveNodes(mock_slurm_dir))
    ctl.tick()  # a pass: the pool judged at its end
    assert ctl.state.pool.spares_next == 1
    add_excluded(RunPaths.of(run), ["node03"], "launch failed", "controller")  # the failure's exclusion
    job = ctl.submitter(["node03"], "restart after launch_failed")
    script = (RunPaths.of(run).job_dir(job) / "job.sbatch").read_text()
    assert re.search(r"^#SBATCH --nodes=(\d+)$", script, re.M).group(1) == "4", "4 usable: no spare left to ask for"
