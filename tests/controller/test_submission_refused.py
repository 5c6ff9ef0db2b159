"""A job SLURM refuses because the controller's own exclusions leave too few nodes
("Requested node configuration is not available") is the controller's mistake to undo: it ends
the probations with the weakest evidence and submits again on the next pass, never the same
refused sbatch twice. The expected values are written from the rule (weakest evidence first,
newest first within one kind, operators' exclusions never), not from the code."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "slurm"))
from fakes import make_config  # noqa: E402
from test_slurm_backend_parsing import fake_tools  # noqa: E402

from orchestrator.contract import Exclusion, RunPaths  # noqa: E402
from orchestrator.contract.events import read_events  # noqa: E402
from orchestrator.contract.exclude import add_excluded, read_exclusions  # noqa: E402
from orchestrator.controller.refusal import after_refusal, before_sbatch  # noqa: E402
from orchestrator.errors import SchedulerError  # noqa: E402
from orchestrator.slurm.base import NodeConfigUnavailable, NodeInfo, SubmitRequest  # noqa: E402
from orchestrator.slurm.real import SlurmScheduler  # noqa: E402

# What sbatch of Slurm 22.05 printed on the local cluster (5 nodes, a 4-node job, 2 excluded);
# 24.11's libslurmfull carries the same words.
REFUSED = "sbatch: error: Batch job submission failed: Requested node configuration is not available\n"


def _idle(*names: str, down: tuple[str, ...] = ()) -> dict[str, NodeInfo]:
    return {n: NodeInfo(n, frozenset({"DOWN"} if n in down else {"IDLE"})) for n in names}


def _out(node: str, since: float, cause: str, job: str = "1", by: str = "controller") -> Exclusion:
    return Exclusion(node, since, since + 72 * 3600, f"{cause} in job {job}", by, cause, job)


FIVE = tuple(f"node0{i}" for i in range(1, 6))


def test_the_reported_case_returns_the_newest_death_alone():
    """node02 died, the job went on on its spare node05, node05 died: 3 usable of 4."""
    excl = {"node02": _out("node02", 100.0, "dead_rank"), "node05": _out("node05", 200.0, "dead_rank")}
    back = after_refusal(excl, ["node02", "node05"], _idle(*FIVE), needed=4, partition=None)
    assert (back.nodes, back.left, back.needed) == (("node05",), 4, 4)
    assert (
        "node05: dead_rank in job 1" in back.why
        and "4 node(s) of the partition not excluded, 4 needed" in back.why
    )


def test_before_the_sbatch_only_what_slurm_would_refuse_it_for():
    excl = {"node02": _out("node02", 100.0, "dead_rank"), "node05": _out("node05", 200.0, "dead_rank")}
    assert before_sbatch(excl, _idle(*FIVE), needed=4, partition=None).nodes == ("node05",)
    # node03 down: SLURM counts it (the job would queue for it), so node05 alone lets SLURM take the job
    assert before_sbatch(excl, _idle(*FIVE, down=("node03",)), needed=4, partition=None).nodes == ("node05",)
    # node02 down: its return costs nothing (SLURM holds the job off it), so it comes back first
    assert before_sbatch(excl, _idle(*FIVE, down=("node02",)), needed=4, partition=None).nodes == ("node02",)
    assert before_sbatch(excl, _idle(*FIVE), needed=3, partition=None) is None
    assert (
        before_sbatch({"node02": _out("node02", 1.0, "", by="alice")}, _idle(*FIVE), needed=5, partition=None)
        is None
    )
    assert before_sbatch(excl, None, needed=4, partition=None) is None  # not known: nothing guessed


def test_weakest_evidence_first_and_an_operators_exclusion_never():
    nodes = _idle(*(f"n{i}" for i in range(1, 9)))
    excl = {
        "n1": _out("n1", 900.0, "", by="alice"),  # by hand: never returned
        "n2": _out("n2", 500.0, "dead_rank"),
        "n3": _out("n3", 400.0, "hang", job="8"),  # a hang's single suspect
        "n4": _out("n4", 50.0, "straggler"),
        "n5": _out("n5", 10.0, "hang", job="9"),  # n5 and n6: one hang, two nodes
        "n6": _out("n6", 10.0, "hang", job="9"),
        "n7": _out("n7", 300.0, "straggler"),
    }
    every = sorted(excl)
    assert after_refusal(excl, every, nodes, needed=4, partition=None).nodes == ("n5", "n6", "n7")
    assert after_refusal(excl, every, nodes, needed=7, partition=None).nodes == (
        "n5",
        "n6",
        "n7",
        "n4",
        "n3",
        "n2",
    )
    assert after_refusal({"n1": excl["n1"]}, ["n1"], nodes, needed=8, partition=None) is None


def test_a_node_slurm_keeps_out_comes_back_first_and_one_it_does_not_list_last():
    excl = {n: _out(n, 300.0 - i, "dead_rank") for i, n in enumerate(("node04", "node05", "node09"))}
    back = after_refusal(excl, sorted(excl), _idle(*FIVE, down=("node04",)), needed=4, partition=None)
    assert back.nodes == ("node04",)  # SLURM holds the job off it while it is down: its return costs nothing
    assert after_refusal(excl, sorted(excl), _idle(*FIVE), needed=5, partition=None).nodes == (
        "node04",
        "node05",
    )


def test_slurms_word_wins_over_the_count_and_an_unknown_pool_returns_one_a_refusal():
    excl = {"node02": _out("node02", 100.0, "hang"), "node05": _out("node05", 200.0, "dead_rank")}
    assert after_refusal(excl, ["node02", "node05"], _idle(*FIVE), needed=3, partition=None).nodes == (
        "node02",
    )
    unknown = after_refusal(excl, ["node02", "node05"], None, needed=4, partition=None)
    assert (unknown.nodes, unknown.left) == (("node02",), None)


@pytest.mark.parametrize(
    ("err", "refused"),
    [(REFUSED, True), ("sbatch: error: Invalid account or account/partition combination\n", False)],
)
def test_sbatchs_refusal_for_nodes_is_its_own_error(tmp_path, err, refused):
    env = fake_tools(tmp_path, "22.05.8", sbatch=(1, "", err))
    with pytest.raises(SchedulerError) as caught:
        SlurmScheduler(env=env).submit(SubmitRequest(tmp_path / "job.sbatch", "run", exclude=["node02"]))
    assert isinstance(caught.value, NodeConfigUnavailable) is refused
    assert err.strip() in str(caught.value)


def _five_node_run(mock_slurm_dir, tmp_path, node_list_known: bool):
    """The reported case: node01 excluded by hand, node02 and then node05 (its spare) by the
    controller for deaths; a 4-node job with 1 spare on 5 nodes."""
    from orchestrator.controller import Controller
    from orchestrator.operate.runs import prepare_run_dir
    from orchestrator.slurm.mock import MockScheduler

    class FiveNodes(MockScheduler):
        asked = 0  # scontrol show node, as slurmctld counts it

        def nodes(self) -> dict[str, NodeInfo]:
            FiveNodes.asked += 1
            if not node_list_known:
                raise SchedulerError("scontrol show node: slurm_load_node error: Socket timed out")
            return _idle(*FIVE)

    cfg = make_config(cluster={"nodes": 4, "spare_nodes": 1})
    run = tmp_path / "run"
    prepare_run_dir(cfg, run)
    paths = RunPaths.of(run)
    add_excluded(paths, ["node01"], "bad DIMM", "alice")  # by hand, older than all
    add_excluded(
        paths, ["node02"], "dead_rank in job 1", "controller", now=100.0, cause="dead_rank", job_id="1"
    )
    add_excluded(
        paths, ["node05"], "dead_rank in job 1", "controller", now=200.0, cause="dead_rank", job_id="1"
    )
    sbatches: list[list[str]] = []

    def submitter(exclude: list[str], reason: str) -> str:
        sbatches.append(list(exclude))
        if len(sbatches) == 1 and len(exclude) > 1:
            raise NodeConfigUnavailable(f"sbatch --exclude={','.join(exclude)} ... exit 1\n{REFUSED}")
        return "4242"

    return Controller(run, cfg, FiveNodes(mock_slurm_dir), submitter=submitter), paths, sbatches


def test_the_pool_check_gives_back_the_newest_deaths_before_an_sbatch_slurm_would_refuse(
    mock_slurm_dir, tmp_path
):
    ctl, paths, sbatches = _five_node_run(mock_slurm_dir, tmp_path, node_list_known=True)
    ctl.start()
    try:
        before = type(ctl.scheduler).asked
        assert ctl.safe_tick().error is None
        # The pool is judged before the sbatch and at the pass's end: one question to slurmctld.
        assert type(ctl.scheduler).asked - before == 1
        assert ctl.safe_tick().error is None and type(ctl.scheduler).asked - before == 2
    finally:
        ctl.stop()
    assert sbatches == [["node01"]]  # never the refused one
    events = list(read_events(paths.events))
    ended = [e for e in events if e.KIND == "probation_ended"]
    assert [e.nodes for e in ended] == [["node05", "node02"]] and "SLURM would refuse the job" in ended[0].why
    assert not [e for e in events if e.KIND in ("submission_refused", "pass_failed", "pool_short")]


@pytest.mark.parametrize("refused_in", ["a job-level restart", "the pass's own submission"])
def test_a_refused_submission_gives_back_the_weakest_and_submits_again_at_once(
    mock_slurm_dir, tmp_path, refused_in
):
    """SLURM's node list not known at that moment: the pool check cannot count, SLURM refuses.
    The controller returns its weakest exclusion and submits again in the same pass, so that a
    job-level restart keeps its bookkeeping (the restart event, the crash-loop count)."""
    from orchestrator.controller.actions import RestartRun

    ctl, paths, sbatches = _five_node_run(mock_slurm_dir, tmp_path, node_list_known=False)
    ctl.start()
    try:
        if (
            refused_in == "a job-level restart"
        ):  # as recovery.plan_restart makes it for a job without spares left
            done: list[str] = []
            ctl._apply([RestartRun("1", "dead_rank", 250.0, 40, 20, 30.0, 1)], done)
            assert done == ["restart: resubmitted as job 4242"]
            assert ctl.state.restarts == 1 and ctl.state.restarts_without_progress == 1
        first, second = ctl.safe_tick(), ctl.safe_tick()
    finally:
        ctl.stop()
    assert first.error is None and second.error is None
    assert sbatches == [["node01", "node02", "node05"], ["node01", "node02"]]
    events = list(read_events(paths.events))
    refused = [e for e in events if e.KIND == "submission_refused"]
    assert [(e.exclude, e.returned) for e in refused] == [(["node01", "node02", "node05"], ["node05"])]
    assert "node05: dead_rank in job 1" in refused[0].why
    assert not [e for e in events if e.KIND == "pass_failed"]
    restarts = [e for e in events if e.KIND == "restart"]
    assert len(restarts) == (refused_in == "a job-level restart")
    assert sorted(read_exclusions(paths)) == ["node01", "node02"]  # the operator's stays
    assert ctl.state.pending_submit is None and [j.job_id for j in ctl.state.jobs] == ["4242"]
