"""`runctl status` warns while the controller waits out a storage stall: the newest probe of the
running job's silent node said its ranks are blocked on the filesystem, and nothing has happened
to the job since (a failure, a restart or its end clears it)."""

from __future__ import annotations

from orchestrator.contract import events as ev
from orchestrator.contract import failure_events as fev
from orchestrator.contract import pool_events as pev
from orchestrator.views.dashboard import _storage_stall, warnings
from orchestrator.views.status_view import StatusView, StorageStall
from tests.status_views import status_view


def probed(verdict: str, job_id: str = "7", time: float = 100.0, early: bool = False) -> fev.NodeProbed:
    return fev.NodeProbed(job_id=job_id, node="node02", verdict=verdict, why="rank 3 in D (disk wait)", time=time,
                          early=early)  # fmt: skip


def screen(stall) -> StatusView:
    return status_view(storage_stall=stall)


def test_a_stall_verdict_of_the_running_job_is_a_warning():
    stall = _storage_stall([ev.JobSubmitted(job_id="7", reason="x"), probed("stall")], "7")
    assert stall == StorageStall(node="node02", why="rank 3 in D (disk wait)", time=100.0)
    [warning] = warnings(screen(stall))
    assert warning.startswith("node02 is in a storage stall (rank 3 in D (disk wait)), found 0 s ago")
    assert "stall_tolerance_seconds" in warning


def test_the_warning_gives_the_stall_age_and_the_tolerance():
    stall = _storage_stall([probed("stall")], "7", now=142.0, tolerance=900.0)
    assert (stall.age_seconds, stall.tolerance_seconds) == (42.0, 900.0)
    [warning] = warnings(screen(stall))
    assert "found 42 s ago" in warning and "waits too up to 900 s" in warning, warning


def test_the_age_counts_from_the_incidents_early_answer():
    early, again = probed("stall", time=100.0, early=True), probed("stall", time=112.0)
    assert _storage_stall([early, again], "7", now=142.0).age_seconds == 42.0
    older = probed("stall", time=10.0)  # an earlier incident's, ended by the early answer's
    assert _storage_stall([older, early, again], "7", now=142.0).age_seconds == 42.0
    back = pev.NodeStalled(node="node02", job_id="7", seconds=12.0, stalls_in_window=1, window_hours=24.0)
    assert _storage_stall([early, back, again], "7", now=142.0).age_seconds == 30.0, "a new incident after it"


def test_no_warning_once_the_node_beats_again():
    back = pev.NodeStalled(node="node02", job_id="7", seconds=12.0, stalls_in_window=1, window_hours=24.0)
    assert _storage_stall([probed("stall"), back], "7") is None
    assert _storage_stall([back, probed("stall")], "7") is not None, "a new stall after the last one"


def test_no_warning_once_the_job_failed_or_for_another_verdict_or_job():
    failed = fev.Failure(job_id="7", cause="dead_rank", failure_time=1.0, detection_time=2.0)
    assert _storage_stall([probed("stall"), failed], "7") is None
    assert _storage_stall([probed("dead")], "7") is None
    assert _storage_stall([probed("stall", job_id="6")], "7") is None
    assert _storage_stall([probed("stall")], None) is None
    assert warnings(screen(None)) == []
