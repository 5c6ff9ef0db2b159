"""Sentences of checkpoints, the disk, and what operators ask (requests, kill, resume, nodes --clear)."""

from __future__ import annotations

from orchestrator.contract import events as ev
from orchestrator.views.event_text.disk_words import pause_words
from orchestrator.views.event_text.registry import says
from orchestrator.views.event_text.words import _by, _n, _reason, _step, duration, size

# A sentence is one line of a screen and a notification's text: the rest stays in the record.
TRUST_PROBLEMS_SHOWN = 3


# -- checkpoints and disk ---------------------------------------------------------------------------
@says(ev.CheckpointCorrupt)
def _(e: ev.CheckpointCorrupt) -> str:
    by = f", reported by job {e.reported_by_job}" if e.reported_by_job else ""
    return f"checkpoint at {_step(e.step)} is damaged ({e.problem}{by}): {e.action}; {e.path}"


@says(ev.CheckpointComplete)
def _(e: ev.CheckpointComplete) -> str:
    return f"checkpoint at {_step(e.step)} complete ({size(e.size_bytes)})"


@says(ev.Disk)
def _(e: ev.Disk) -> str:
    if e.message:  # says the free and the needed bytes, and where
        return f"checkpoint disk {e.level}: {e.message}"
    return f"checkpoint disk {e.level}: {size(e.free_bytes)} free, {size(e.expected_bytes)} needed"


@says(ev.DiskFullPaused)
def _(e: ev.DiskFullPaused) -> str:
    return pause_words(e.mount, e.free_bytes, e.needed_bytes, e.job_id, e.cause, e.to_delete)


@says(ev.DiskFullResumed)
def _(e: ev.DiskFullResumed) -> str:
    how = f": {e.how}" if e.how else ""
    return (
        f"space is back on {e.mount} ({size(e.free_bytes)} free, {size(e.needed_bytes)} needed) after "
        f"{duration(e.paused_seconds)} paused; the run resumes from its newest good checkpoint{how}"
    )


# -- operators ----------------------------------------------------------------------------------------
@says(ev.RequestAccepted)
def _(e: ev.RequestAccepted) -> str:
    now = " (now)" if e.now else ""
    return f"{e.request}{now} requested by {e.user} accepted{_reason(e.reason)}"


@says(ev.RequestRefused)
def _(e: ev.RequestRefused) -> str:
    return f"{e.request} requested by {e.user} (uid {_n(e.uid)}) refused: {e.why}"


@says(ev.Quarantined)
def _(e: ev.Quarantined) -> str:
    if e.moved_to:
        done = f"moved to {e.moved_to}"
    else:
        done = f"deleted ({e.deleted})" if e.deleted else f"left in place ({e.left_in_place})"
    return f"quarantined {e.file} ({e.kind}, {_n(e.size)} bytes, from {e.user}): {e.why}; {done}"


@says(ev.QuarantineSkipped)
def _(e: ev.QuarantineSkipped) -> str:
    return f"left {e.file} alone: {e.why}"


@says(ev.NodesCleared)
def _(e: ev.NodesCleared) -> str:
    asked = "every node" if e.all_nodes else ", ".join(e.asked) or "no node"
    removed = ", ".join(e.removed) or "none of them was excluded"
    left = ", ".join(e.excluded) or "nothing"
    return f"nodes cleared{_by(e.by)} ({asked}){_reason(e.reason)}: removed {removed}; still excluded: {left}"


@says(ev.NodesClearFailed)
def _(e: ev.NodesClearFailed) -> str:
    return f"could not clear nodes{_by(e.by)}: {e.error}; the request stays and is tried again"


@says(ev.TrustProblem)
def _(e: ev.TrustProblem) -> str:
    where = f" (seen when job {', '.join(e.job_ids)} appeared)" if e.job_ids else ""
    more = len(e.problems) - TRUST_PROBLEMS_SHOWN
    listed = "; ".join(e.problems[:TRUST_PROBLEMS_SHOWN]) + (
        f"; and {more} more (events.jsonl)" if more > 0 else ""
    )
    return f"a file the controller trusts is writable by others{where}: {listed}"


@says(ev.KillRequested)
def _(e: ev.KillRequested) -> str:
    how = "kill now (no checkpoint)" if e.now else "kill (checkpoint, then stop)"
    return f"{how} requested{_by(e.by)}{_reason(e.reason)}"


@says(ev.KillWithdrawn)
def _(e: ev.KillWithdrawn) -> str:
    return "kill request withdrawn: supervision goes on"


@says(ev.Resumed)
def _(e: ev.Resumed) -> str:
    return f"resumed{_by(e.by)} (the run was {e.previous}){_reason(e.reason)}"


@says(ev.ResumeIgnored)
def _(e: ev.ResumeIgnored) -> str:
    return f"resume{_by(e.by)} ignored: {e.why}"
